#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mismatch.sh plan|layout - a producer whose plan (other --seed or
# --token-budget) or layout (other --layers or --hidden-size) differs from the
# run's (or its --hs-dtype) is refused with a message naming both values; the first producer is
# unaffected and completes the run.
#
# The first producer is frozen (SIGSTOP) while the others try to join, so
# the run is certainly still going when they arrive, whatever the speed of
# the machine; it resumes (SIGCONT) afterwards and finishes.
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: mismatch.sh plan|layout}

data=$SCRATCH/d.jsonl
synth "$data" --sequences 120 --min-len 16 --max-len 1500 --seed 5
reserve_port port
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport tcp --cache-gb 0.25 --epochs 2 \
    --verify-synthetic --summary-json "$SCRATCH/summary.json"
base=(--to 127.0.0.1:$port --transport tcp --data "$data" --source synthetic --gpus cpu:1
    --connect-timeout 30)
start p1 "$PRODUCER" "${base[@]}" --token-budget 4096 --hidden-size 256 --layers 2,16,29 --seed 1 --name p1
wait_log consumer 'producer p1 .* ready' 30
kill -STOP "$(pid_of p1)"

# refused NAME REGEX...: run a producer that must be refused (exit 2), its
# log matching every regex.
n_refused=0
refused() {
    local name=$1
    shift
    n_refused=$((n_refused + 1))
    start "$name" "$PRODUCER" "${base[@]}" "${ARGS[@]}" --name "$name"
    expect_exit "$name" 2 30
    for re in "$@"; do log_has "$name" "$re"; done
    log_has consumer "producer $name .* dropped"
}

p1_hash=$(grep -Eo 'plan [0-9a-f]{16}' "$SCRATCH/p1.log" | head -n 1 | cut -d' ' -f2)
[ -n "$p1_hash" ] || fail "p1 did not log its plan hash"
if [ "$mode" = plan ]; then
    n=0
    for variant in "--seed 2" "--token-budget 2048 --seed 1"; do
        n=$((n + 1))
        read -r -a extra <<<"$variant"
        ARGS=(--token-budget 4096 --hidden-size 256 --layers 2,16,29 "${extra[@]}")
        start hash$n "$DATA" plan "$data" --token-budget "${ARGS[1]}" "${extra[@]}"
        wait_exit hash$n 30
        mine=$(awk '/^plan hash/{print $3}' "$SCRATCH/hash$n.log")
        [ -n "$mine" ] && [ "$mine" != "$p1_hash" ] || fail "variant '$variant' should change the plan hash"
        refused q$n "plan mismatch" "$p1_hash" "$mine" "--seed"
    done
else
    ARGS=(--token-budget 4096 --hidden-size 256 --layers 2,16 --seed 1)
    refused q1 "layout mismatch" 'layers=\[2,16,29\]' 'layers=\[2,16\]' "--layers"
    ARGS=(--token-budget 4096 --hidden-size 128 --layers 2,16,29 --seed 1)
    refused q2 "layout mismatch" 'H=256' 'H=128' "--hidden-size"
    # an fp8 producer does not join a bf16 run
    ARGS=(--token-budget 4096 --hidden-size 256 --layers 2,16,29 --seed 1 --hs-dtype fp8)
    refused q3 "layout mismatch" 'dtype=bf16' 'dtype=fp8'
fi

kill -CONT "$(pid_of p1)"
expect_exit consumer 0 90
expect_exit p1 0 30
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    'd["batches_delivered"] == d["batches_planned"] > 0' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0' \
    "d['producers_seen'] == $((n_refused + 1))" \
    "d['producers_dropped'] == $n_refused"
pass "$mode mismatch refused $n_refused times; first producer completed the run"
