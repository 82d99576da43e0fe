#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# outputs.sh - output files never destroy an input and never appear half
# written: hs-forward --out naming the --data file (by the same name, a
# symlink or a hard link) or a file of the --model folder is refused with
# exit 2 before any work, and the input is byte-for-byte unchanged; a write
# killed half way (file size limit) leaves the previous output intact and
# nothing at a new name. The summaries of hs-consumer and hs-producer are
# refused onto their inputs too, and every output of hs-consumer (summary,
# stats lines, saved state, journal; appended or replaced) onto any of its
# inputs or other outputs. Every case runs; failures are listed.
. "$(dirname "$0")/lib.sh"

FORWARD=$HS_BIN/hs-forward
[ -x "$FORWARD" ] || fail "$FORWARD is missing; build the project first"
MODEL_SRC=$(cd "$(dirname "$0")/../data/qwen2" && pwd)

d=$SCRATCH
cp -r "$MODEL_SRC" "$d/model"
printf '{"input_ids":[1,2,3,4]}\n{"input_ids":[5,6,7]}\n' >"$d/tokens.jsonl"
ln -s tokens.jsonl "$d/tokens-link.jsonl"
ln "$d/tokens.jsonl" "$d/tokens-hard.jsonl"
sum() { sha256sum "$@" | awk '{print $1}' | tr '\n' ' '; }
before=$(sum "$d/tokens.jsonl" "$d"/model/*)

failures=()
n=0
# case_ RC REGEX CMD...: CMD exits with RC and its output matches REGEX.
case_() {
    local want=$1 re=$2
    shift 2
    n=$((n + 1))
    local out=$d/case$n.out rc=0
    timeout 60 "$@" >"$out" 2>&1 </dev/null || rc=$?
    local what="${*:1}"
    what=${what//$HS_BIN\//}
    what=${what//$d\//}
    if [ $rc -ne "$want" ]; then
        failures+=("[$what] exit $rc, expected $want: $(head -c 300 "$out" | tr '\n' ' ')")
    elif ! grep -Eq -- "$re" "$out"; then
        failures+=("[$what] output does not match /$re/: $(head -c 300 "$out" | tr '\n' ' ')")
    fi
}

F=("$FORWARD" --model "$d/model" --layers 1,3 --data "$d/tokens.jsonl")
case_ 2 'tokens\.jsonl: the output is the input .*tokens\.jsonl' "${F[@]}" --out "$d/tokens.jsonl"
case_ 2 'the output is the input .*by another name or link' "${F[@]}" --out "$d/tokens-link.jsonl"
case_ 2 'the output is the input .*by another name or link' "${F[@]}" --out "$d/tokens-hard.jsonl"
case_ 2 'the output is the input' "${F[@]}" --out "$d/./tokens.jsonl"
case_ 2 'inside the input folder' "${F[@]}" --out "$d/model/model.safetensors"
case_ 2 'inside the input folder' "${F[@]}" --out "$d/model/hs.safetensors"
case_ 2 'is a folder' "${F[@]}" --out "$d"
[ "$(sum "$d/tokens.jsonl" "$d"/model/*)" = "$before" ] ||
    failures+=("an input changed: tokens.jsonl or the model folder")
[ -L "$d/tokens-link.jsonl" ] || failures+=("the symlink to the input was replaced")
[ ! -e "$d/model/hs.safetensors" ] || failures+=("hs.safetensors was written into the model folder")

# A good run, then one killed by the file size limit half way through its
# write: the first output stays whole, no temporary file or new name is left.
case_ 0 'wrote 2 layers' "${F[@]}" --out "$d/hs.safetensors"
good=$(sum "$d/hs.safetensors")
size=$(stat -c %s "$d/hs.safetensors")
[ "$size" -gt 4096 ] || failures+=("the output is only $size bytes; the size-limit case needs more")
limit=$((size / 2048)) # ulimit -f counts KiB: stop at about half the file
rc=0
{ (ulimit -f "$limit" && exec "${F[@]}" --out "$d/hs.safetensors") >"$d/xfsz.out" 2>&1; } 2>/dev/null || rc=$?
[ $rc -ne 0 ] || failures+=("hs-forward under 'ulimit -f $limit' succeeded; the case proves nothing")
[ "$(sum "$d/hs.safetensors")" = "$good" ] || failures+=("a killed write changed the previous output")
rc=0
{ (ulimit -f "$limit" && exec "${F[@]}" --out "$d/new.safetensors") >"$d/xfsz2.out" 2>&1; } 2>/dev/null || rc=$?
[ ! -e "$d/new.safetensors" ] || failures+=("a killed write left a half file at new.safetensors")

# The summaries: never onto an input either.
P=("$PRODUCER" --to 127.0.0.1:1 --connect-timeout 1 --token-budget 4096 --hidden-size 64
    --layers 1,2 --source synthetic --data "$d/tokens.jsonl")
case_ 2 'the output is the input' "${P[@]}" --summary-json "$d/tokens-link.jsonl"
printf 'secret-secret-secret-secret-secret\n' >"$d/key"
case_ 2 'the output is the input' "$CONSUMER" --listen 127.0.0.1:0 \
    --secret-file "$d/key" --summary-json "$d/key"
[ "$(head -c 6 "$d/key")" = secret ] || failures+=("the consumer's --summary-json overwrote its secret")

# Every output of hs-consumer, appended ones too, against every input:
# --secret-file, --resume-state, --journal (read, then written) and each other.
printf '{"journal":"keep"}\n' >"$d/journal"
printf '{"state":"keep"}\n' >"$d/state.json"
ln -s key "$d/key-link"
ln -s journal "$d/journal-link"
keep=$(sum "$d/key" "$d/journal" "$d/state.json")
C=("$CONSUMER" --listen 127.0.0.1:0 --secret-file "$d/key" --journal "$d/journal"
    --resume-state "$d/state.json")
case_ 2 'journal: the output is the input .*journal' "${C[@]}" --stats-jsonl "$d/journal"
case_ 2 'key-link: the output is the input .*key \(the same file by another' "${C[@]}" --stats-jsonl "$d/key-link"
case_ 2 'state\.json: the output is the input' "${C[@]}" --stats-jsonl "$d/state.json"
case_ 2 'state\.json: the output is the input' "${C[@]}" --summary-json "$d/state.json"
case_ 2 'journal-link: the output is the input .*journal \(the same file by another' "${C[@]}" --summary-json "$d/journal-link"
case_ 2 'journal: the output is the input' "${C[@]}" --save-state "$d/journal"
case_ 2 'key-link: the output is the input .*key' "$CONSUMER" --listen 127.0.0.1:0 \
    --secret-file "$d/key" --journal "$d/key-link"
case_ 2 'state\.json: the output is the input' "$CONSUMER" --listen 127.0.0.1:0 \
    --resume-state "$d/state.json" --journal "$d/state.json"
printf '{}\n' >"$d/stats.jsonl"
case_ 2 'stats\.jsonl: the output is the input' "${C[@]}" --stats-jsonl "$d/stats.jsonl" \
    --summary-json "$d/stats.jsonl"
[ "$(sum "$d/key" "$d/journal" "$d/state.json")" = "$keep" ] ||
    failures+=("a consumer output changed its secret, journal or resume state")
[ "$(sum "$d/tokens.jsonl" "$d"/model/*)" = "$before" ] ||
    failures+=("an input changed: tokens.jsonl or the model folder")

if [ ${#failures[@]} -gt 0 ]; then
    printf '  %s\n' "${failures[@]}" >&2
    fail "${#failures[@]} of the output-file checks failed"
fi
pass "$n cases"
