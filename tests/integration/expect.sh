#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# expect.sh - a consumer pinned to a run (--expect-plan, --expect-dataset,
# --expect-layout, the flags `hs-data plan` prints after "pin") refuses every
# producer that differs, the first to connect included, naming what differs
# and the value expected, and then runs the right producer to completion.
# Without the pins the first wrong producer would define the run and lock
# the right one out. Then a peer whose HELLO matches every pin but whose
# PLAN pages lie about the batch shapes (HS_PLAN_FAULT=lie, a test hook) is
# refused once its pages are in (the plan hash covers the shapes), defines
# nothing and leaves no plan in the store; the honest producer after it runs
# the pinned store to completion, and the store then replays alone.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
other=$SCRATCH/other.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 1000 --seed 5
synth "$other" --sequences 60 --min-len 16 --max-len 1000 --seed 6

# The pin line: all three flags, in the form hs-consumer takes them.
"$DATA" plan "$data" --token-budget 4096 --seed 1 --hidden-size 64 --layers 2,5 \
    >"$SCRATCH/plan.log" 2>&1 || fail "hs-data plan failed: $(cat "$SCRATCH/plan.log")"
pin=$(sed -n 's/^pin  *//p' "$SCRATCH/plan.log")
[[ $pin =~ ^--expect-plan\ [0-9a-f]{16}\ --expect-dataset\ [0-9a-f]{16}\ --expect-layout\ H=64,layers=2,5,dtype=bf16$ ]] ||
    fail "hs-data plan's pin line is '$pin'"
read -r -a PIN <<<"$pin"
plan_hash=${PIN[1]}
dataset_fp=${PIN[3]}
grep -q "^plan hash  *$plan_hash" "$SCRATCH/plan.log" || fail "the pin's plan hash is not the plan hash"
grep -q "fingerprint $dataset_fp" "$SCRATCH/plan.log" || fail "the pin's dataset is not the fingerprint"

reserve_port port
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport tcp --cache-gb 0.25 --epochs 1 \
    --verify-synthetic --summary-json "$SCRATCH/summary.json" "${PIN[@]}"
wait_log consumer 'run pinned to plan '"$plan_hash" 30
base=(--to 127.0.0.1:$port --transport tcp --source synthetic --gpus cpu:1 --connect-timeout 30
    --token-budget 4096)

# refused NAME REGEX... -- ARGS: a producer that must be refused (exit 2),
# the consumer's and its own log naming what differs.
refused() {
    local name=$1
    shift
    local res=()
    while [ "$1" != -- ]; do
        res+=("$1")
        shift
    done
    shift
    start "$name" "$PRODUCER" "${base[@]}" "$@" --name "$name"
    expect_exit "$name" 2 30
    for re in "${res[@]}"; do
        log_has "$name" "$re"
        log_has consumer "$re"
    done
}
# Each one arrives first, before any run exists.
refused wrong_layers 'its layout is H=64,layers=2,6,dtype=bf16, expected H=64,layers=2,5,dtype=bf16' \
    -- --data "$data" --seed 1 --hidden-size 64 --layers 2,6
refused wrong_hidden 'expected H=64,layers=2,5,dtype=bf16 \(--expect-layout\)' \
    -- --data "$data" --seed 1 --hidden-size 32 --layers 2,5
refused wrong_seed "its plan hash is [0-9a-f]{16}, expected $plan_hash \\(--expect-plan\\)" \
    -- --data "$data" --seed 2 --hidden-size 64 --layers 2,5
refused wrong_data "its dataset fingerprint is [0-9a-f]{16}, expected $dataset_fp \\(--expect-dataset\\)" \
    "expected $plan_hash" -- --data "$other" --seed 1 --hidden-size 64 --layers 2,5
if grep -q 'run defined by' "$SCRATCH/consumer.log"; then fail "a refused producer defined the run"; fi

start right "$PRODUCER" "${base[@]}" --data "$data" --seed 1 --hidden-size 64 --layers 2,5 --name right
expect_exit consumer 0 90
expect_exit right 0 30
log_has consumer "run defined by right"
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    'd["batches_delivered"] == d["batches_planned"] > 0' \
    'd["checksum_failures"] == 0' \
    'd["producers_seen"] == 5' \
    'd["producers_dropped"] == 4'

store=$SCRATCH/store
reserve_port port2
copts=(--transport tcp --cache-gb 0.25 --epochs 1 --verify-synthetic --store "$store")
start pinned "$CONSUMER" --listen 127.0.0.1:$port2 "${copts[@]}" \
    --summary-json "$SCRATCH/pinned.json" "${PIN[@]}"
wait_log pinned 'run pinned to plan '"$plan_hash" 30
right=(--to 127.0.0.1:$port2 --transport tcp --source synthetic --gpus cpu:1 --connect-timeout 30
    --token-budget 4096 --data "$data" --seed 1 --hidden-size 64 --layers 2,5)
start liar env HS_PLAN_FAULT=lie "$PRODUCER" "${right[@]}" --name liar
wait_exit liar 30
[ "${RC_OF[liar]}" -ne 0 ] || fail "the lying producer was not refused"
log_has pinned "producer liar .* dropped: its PLAN pages are not the plan of its plan hash $plan_hash"
if grep -q 'run defined by' "$SCRATCH/pinned.log"; then fail "the lying producer defined the run"; fi
[ ! -e "$store/plan.bin" ] || fail "the lying producer's plan reached the store"
# 150 ms a ticket: the store's writer keeps up and stores every batch
start honest "$PRODUCER" "${right[@]}" --name honest --fault delay_ms=150
expect_exit pinned 0 90
expect_exit honest 0 30
log_has pinned "run defined by honest"
expect_json "$SCRATCH/pinned.json" 'd["complete"] is True' 'd["checksum_failures"] == 0' \
    'd["batches_delivered"] == d["batches_planned"] > 0' 'd["store_misses"] == d["batches_planned"]'
start replay "$CONSUMER" --listen 127.0.0.1:0 "${copts[@]}" --summary-json "$SCRATCH/replay.json" \
    "${PIN[@]}"
expect_exit replay 0 60
expect_json "$SCRATCH/replay.json" 'd["complete"] is True' 'd["producers_seen"] == 0' \
    'd["store_hits"] == d["batches_delivered"] > 0'

# A malformed pin is a usage error naming the flag.
for bad in "--expect-plan xyz" "--expect-dataset 12345678901234567" \
    "--expect-layout H=64,layers=5,2" "--expect-layout layers=2,5"; do
    read -r -a B <<<"$bad"
    rc=0
    "$CONSUMER" --listen 127.0.0.1:0 "${B[@]}" >"$SCRATCH/bad.out" 2>&1 || rc=$?
    [ $rc -eq 2 ] || fail "'$bad' exited $rc, expected 2"
    grep -q -- "${B[0]}" "$SCRATCH/bad.out" || fail "'$bad': the message does not name ${B[0]}"
done
pass "four wrong producers and a lying plan refused before the run existed; the right one completed it"
