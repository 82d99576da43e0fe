#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# overflow.sh - sequences longer than --max-seq-len are truncated or dropped
# as --overflow says, and counted: in `hs-data plan`, in the producer's plan
# log line ("N truncated, M dropped"), and in the tokens the consumer
# delivers end to end.
. "$(dirname "$0")/lib.sh"

# Lengths 10 50 99 100 101 150 200 300; with --max-seq-len 100 the last four
# are too long: truncate keeps 10+50+99+100+4*100 = 659 tokens, drop keeps
# 10+50+99+100 = 259.
data=$SCRATCH/lens.jsonl
python3 - "$data" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i, n in enumerate([10, 50, 99, 100, 101, 150, 200, 300]):
        f.write(json.dumps({"input_ids": [(i * 1000 + t) % 32000 for t in range(n)]}) + "\n")
PY

# plan_field OUT KEY: the number after KEY at the start of a line of OUT.
plan_field() { awk -v k="$2" '$1 == k {print $2}' "$SCRATCH/$1.log"; }

run_plan() { # NAME ARGS...
    local name=$1
    shift
    "$DATA" plan "$data" --token-budget 256 "$@" >"$SCRATCH/$name.log" 2>&1 || fail "hs-data plan $* failed"
}
run_plan plan_trunc --max-seq-len 100 --overflow truncate
run_plan plan_drop --max-seq-len 100 --overflow drop
run_plan plan_default
[ "$(plan_field plan_trunc truncated)" = 4 ] || fail "truncate: expected 4 truncated"
[ "$(plan_field plan_trunc dropped)" = 0 ] || fail "truncate: expected 0 dropped"
log_has plan_trunc '^kept +8 sequences, 659 tokens'
[ "$(plan_field plan_drop truncated)" = 0 ] || fail "drop: expected 0 truncated"
[ "$(plan_field plan_drop dropped)" = 4 ] || fail "drop: expected 4 dropped"
log_has plan_drop '^kept +4 sequences, 259 tokens'
# without --max-seq-len the budget is the limit: only 300 is too long
[ "$(plan_field plan_default truncated)" = 1 ] || fail "default: expected 1 truncated (the 300-token sequence)"

# End to end, one epoch pair per policy; tokens delivered = kept tokens x 2.
for policy in truncate drop; do
    start c_$policy "$CONSUMER" --loopback 1 --transport tcp --cache-gb 0.0625 --epochs 2 \
        --verify-synthetic --summary-json "$SCRATCH/$policy.json" -- \
        --transport tcp --data "$data" --token-budget 256 --max-seq-len 100 --overflow $policy \
        --hidden-size 64 --layers 0,3 --source synthetic --gpus cpu:1
done
expect_exit c_truncate 0 60
expect_exit c_drop 0 60
log_has c_truncate 'plan [0-9a-f]{16}: 8 sequences \(4 truncated, 0 dropped\), 659 tokens'
log_has c_drop 'plan [0-9a-f]{16}: 4 sequences \(0 truncated, 4 dropped\), 259 tokens'
expect_json "$SCRATCH/truncate.json" 'd["complete"] is True' 'd["tokens"] == 2 * 659' 'd["checksum_failures"] == 0'
expect_json "$SCRATCH/drop.json" 'd["complete"] is True' 'd["tokens"] == 2 * 259' 'd["checksum_failures"] == 0'

# Dropping everything leaves no plan: a clear error, not an empty run.
start c_empty "$PRODUCER" --to 127.0.0.1:1 --connect-timeout 1 --data "$data" --token-budget 256 \
    --max-seq-len 5 --overflow drop --hidden-size 64 --layers 0,3 --source synthetic
wait_exit c_empty 30
[ "${RC_OF[c_empty]}" -eq 2 ] || fail "a plan with every sequence dropped exited ${RC_OF[c_empty]}, expected 2"
log_has c_empty 'max-seq-len|no sequence|dropped'
pass "truncate 659 tokens/epoch, drop 259 tokens/epoch"
