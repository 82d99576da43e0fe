#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bad_input.sh - bad input to hs-producer, hs-consumer and hs-data: each case
# must end with the documented exit code (2 for usage errors and bad input
# files, 1 for hs-data operations that failed) and a message that names what
# was wrong (the file and line for a bad JSONL line). Every case runs; all
# failures are listed at the end.
. "$(dirname "$0")/lib.sh"

d=$SCRATCH
printf '{"input_ids":[1,2,3]}\n{"input_ids":[4,5]}\n{"loss_mask":[1,1]}\n' >"$d/noids.jsonl"
printf '{"input_ids":[1,2,3]}\n{"input_ids":[1,"x",3]}\n' >"$d/nonint.jsonl"
printf '{"input_ids":[1,2,3]}\n\n{"input_ids":[1,2.5,3]}\n' >"$d/float.jsonl"
printf '{"input_ids":[1,2,3]}\n{"input_ids":[1,2,3]\n' >"$d/notjson.jsonl"
printf '{"input_ids":[1,2,3],"loss_mask":[1,1]}\n' >"$d/masklen.jsonl"
printf '{"input_ids":[1,-2,3]}\n' >"$d/negative.jsonl"
printf '{"input_ids":[1,2,3],"loss_mask":[0,0,0],"loss_mask":[1,1,1]}\n' >"$d/dupkey.jsonl"
: >"$d/empty.jsonl"
mkdir "$d/adir"
mkfifo "$d/afifo"
synth "$d/ok.jsonl" --sequences 20 --min-len 8 --max-len 64 --seed 1
if [ "$(id -u)" -ne 0 ]; then
    cp "$d/ok.jsonl" "$d/noread.jsonl"
    chmod 000 "$d/noread.jsonl"
fi

# A producer that would be valid apart from the one thing each case breaks;
# the port is never reached, since every case fails before connecting.
P=("$PRODUCER" --to 127.0.0.1:1 --connect-timeout 1 --token-budget 4096 --hidden-size 64
    --layers 1,2 --source synthetic)
C=("$CONSUMER" --listen 127.0.0.1:1)

failures=()
n=0
# case RC REGEX CMD...: CMD exits with RC and its output matches REGEX.
case_() {
    local want=$1 re=$2
    shift 2
    n=$((n + 1))
    local out=$d/case$n.out rc=0
    timeout 30 "$@" >"$out" 2>&1 </dev/null || rc=$?
    local what="${*:1}"
    what=${what//$HS_BIN\//}
    what=${what//$d\//}
    if [ $rc -ne "$want" ]; then
        failures+=("[$what] exit $rc, expected $want: $(head -c 300 "$out" | tr '\n' ' ')")
    elif ! grep -Eq -- "$re" "$out"; then
        failures+=("[$what] output does not match /$re/: $(head -c 300 "$out" | tr '\n' ' ')")
    fi
}

# ---- hs-producer: the dataset
case_ 2 'nonexistent\.jsonl.*(No such file|not found|cannot open)' "${P[@]}" --data "$d/nonexistent.jsonl"
case_ 2 'adir.*(not a regular file|directory)' "${P[@]}" --data "$d/adir"
case_ 2 'afifo.*not a regular file' "${P[@]}" --data "$d/afifo"
[ -f "$d/noread.jsonl" ] && case_ 2 'noread\.jsonl.*(Permission denied|cannot)' "${P[@]}" --data "$d/noread.jsonl"
case_ 2 'noids\.jsonl:3:.*input_ids' "${P[@]}" --data "$d/noids.jsonl"
case_ 2 'nonint\.jsonl:2:.*not an integer' "${P[@]}" --data "$d/nonint.jsonl"
case_ 2 'float\.jsonl:3:.*not an integer' "${P[@]}" --data "$d/float.jsonl"
case_ 2 'negative\.jsonl:1:.*input_ids' "${P[@]}" --data "$d/negative.jsonl"
case_ 2 'notjson\.jsonl:2:.*JSON' "${P[@]}" --data "$d/notjson.jsonl"
case_ 2 'masklen\.jsonl:1:.*loss_mask' "${P[@]}" --data "$d/masklen.jsonl"
case_ 2 'dupkey\.jsonl:1:.*"loss_mask" appears 2 times' "${P[@]}" --data "$d/dupkey.jsonl"
case_ 2 'empty\.jsonl.*no sequences' "${P[@]}" --data "$d/empty.jsonl"
# ---- hs-producer: flags
case_ 2 'max-seq-len 5000 .*token-budget 4096' "${P[@]}" --data "$d/ok.jsonl" --max-seq-len 5000
case_ 2 'frobnicate' "${P[@]}" --data "$d/ok.jsonl" --frobnicate
case_ 2 "layers '3,2'.*increasing" "${P[@]}" --data "$d/ok.jsonl" --layers 3,2
case_ 2 "layers '2,2'.*increasing" "${P[@]}" --data "$d/ok.jsonl" --layers 2,2
case_ 2 "layers.*(expected|indices)" "${P[@]}" --data "$d/ok.jsonl" --layers 1,x
case_ 2 'layers.*dflash-layers.*eagle3-layers.*not several' "${P[@]}" --data "$d/ok.jsonl" --dflash-layers 3
case_ 2 'layers.*dflash-layers.*eagle3-layers.*not several' "${P[@]}" --data "$d/ok.jsonl" --eagle3-layers
# A layer preset is checked against the model's depth before any weight is
# read: a 3-layer config beside unreadable weights names the depth.
mkdir "$d/shallow"
cp "$(dirname "$0")/../data/qwen2/config.json" "$d/shallow/"
printf 'not safetensors' >"$d/shallow/model.safetensors"
M=("$PRODUCER" --to 127.0.0.1:1 --connect-timeout 1 --token-budget 4096 --source model
    --model "$d/shallow" --data "$d/ok.jsonl")
case_ 2 'eagle3 layers: the model has 3 decoder layers, too few .*at least 7' "${M[@]}" --eagle3-layers
case_ 2 'dflash layers: the model has 3 decoder layers, too few .*5 draft layers.*at least 8' \
    "${M[@]}" --dflash-layers 5
case_ 2 "token-budget 'abc'" "${P[@]}" --data "$d/ok.jsonl" --token-budget abc
case_ 2 "hidden-size '0'" "${P[@]}" --data "$d/ok.jsonl" --hidden-size 0
case_ 2 "gpus 'cpu:0'" "${P[@]}" --data "$d/ok.jsonl" --gpus cpu:0
case_ 2 "source 'magic'" "${P[@]}" --data "$d/ok.jsonl" --source magic
case_ 2 "overflow 'squeeze'" "${P[@]}" --data "$d/ok.jsonl" --overflow squeeze
case_ 2 "to 'nowhere'" "${P[@]}" --data "$d/ok.jsonl" --to nowhere
case_ 2 'unexpected argument' "${P[@]}" --data "$d/ok.jsonl" stray
case_ 2 '--to HOST:PORT is required' "$PRODUCER" --data "$d/ok.jsonl" --layers 1 --hidden-size 8
case_ 2 '--data FILE is required' "$PRODUCER" --to 127.0.0.1:1 --layers 1 --hidden-size 8
case_ 2 '--layers .* is required' "$PRODUCER" --to 127.0.0.1:1 --data "$d/ok.jsonl" --hidden-size 8
case_ 2 'model' "${P[@]}" --data "$d/ok.jsonl" --source model
case_ 0 'usage: hs-producer' "$PRODUCER" --help
# ---- hs-consumer: flags
case_ 2 'resume-state .*afifo: not a regular file' "${C[@]}" --resume-state "$d/afifo"
case_ 2 "cache-gb 'abc'" "${C[@]}" --cache-gb abc
case_ 2 "cache-gb '-1'" "${C[@]}" --cache-gb -1
case_ 2 "epochs '0'" "${C[@]}" --epochs 0
case_ 2 "order 'random'" "${C[@]}" --order random
case_ 2 "prefetch '0'" "${C[@]}" --prefetch 0
case_ 2 "listen 'nonsense'" "${C[@]}" --listen nonsense
case_ 2 "listen '127.0.0.1:99999'" "${C[@]}" --listen 127.0.0.1:99999
case_ 2 "transport 'carrier-pigeon'" "${C[@]}" --transport carrier-pigeon
case_ 2 "loopback '0'" "${C[@]}" --loopback 0
case_ 2 'frobnicate' "${C[@]}" --frobnicate
case_ 2 "unexpected argument 'extra'" "${C[@]}" extra
case_ 2 'add --loopback' "${C[@]}" -- --data x
case_ 2 'loopback 2 starts hs-producer processes.*options after --' "${C[@]}" --loopback 2 --cache-gb 0.5
case_ 2 'loopback 2 starts hs-producer processes.*options after --' "${C[@]}" --loopback 2 --
case_ 2 'loopback 3 starts hs-producer processes' env HS_LOOPBACK=3 "${C[@]}" --cache-gb 0.5
case_ 2 "'--to' after --: --loopback sets" "${C[@]}" --loopback 1 -- --data x --to 127.0.0.1:5
case_ 2 "'--name=p' after --: --loopback sets" "${C[@]}" --loopback 1 -- --data x --name=p
case_ 2 "loopback '65'" "${C[@]}" --loopback 65 -- --data x
case_ 0 'usage: hs-consumer' "$CONSUMER" --help
# ---- hs-data
case_ 2 "unknown command 'frob'" "$DATA" frob
case_ 2 'needs --token-budget' "$DATA" plan "$d/ok.jsonl"
case_ 2 'max-seq-len 200 is above --token-budget 100' "$DATA" plan "$d/ok.jsonl" --token-budget 100 --max-seq-len 200
case_ 2 "overflow" "$DATA" plan "$d/ok.jsonl" --token-budget 100 --overflow squeeze
case_ 2 'does not apply' "$DATA" info "$d/ok.jsonl" --token-budget 100
case_ 2 'wrong number of arguments' "$DATA" import "$d/ok.jsonl"
case_ 2 'min-len 100 is above --max-len 10' "$DATA" synth "$d/x.jsonl" --sequences 3 --min-len 100 --max-len 10
case_ 1 'nonexistent\.jsonl.*(No such file|cannot open)' "$DATA" info "$d/nonexistent.jsonl"
case_ 1 'nonint\.jsonl:2:' "$DATA" info "$d/nonint.jsonl"
case_ 1 'noids\.jsonl:3:' "$DATA" import "$d/noids.jsonl" "$d/out.hst"
[ ! -e "$d/out.hst" ] || failures+=("[hs-data import of a bad file] left $d/out.hst behind")
cp "$d/ok.jsonl" "$d/keep.jsonl"
ln "$d/ok.jsonl" "$d/alias.jsonl"
case_ 1 'the output is the input' "$DATA" import "$d/ok.jsonl" "$d/ok.jsonl"
case_ 1 'the same file by another name or link' "$DATA" import "$d/ok.jsonl" "$d/alias.jsonl"
cmp -s "$d/ok.jsonl" "$d/keep.jsonl" || failures+=("[hs-data import X X] changed its input")
case_ 0 'usage: hs-data' "$DATA" --help

if [ ${#failures[@]} -gt 0 ]; then
    printf '  %s\n' "${failures[@]}" >&2
    fail "${#failures[@]} of $n bad-input cases misbehaved"
fi
pass "$n cases"
