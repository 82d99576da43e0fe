#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# resume.sh - a consumer killed with SIGKILL mid-run restarts with the same
# --journal and delivers only what the trainer had not released: across the
# two runs every batch of every epoch is released exactly once (the journal
# holds each (epoch, batch) once and all of them). A third start finds the run
# complete and ends at once. A journal of another plan is refused by name.
. "$(dirname "$0")/lib.sh"
# An optional argument names the transport of every process (default: none
# given, so auto: shared memory on one host).
tp=()
[ -z "${1:-}" ] || tp=(--transport "$1")

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 11
per_epoch=$(plan_batches "$data" 4096)
journal=$SCRATCH/run.journal
popts=(--data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1 "${tp[@]}")

# run 1: killed after some batches were released
start c1 "$CONSUMER" "${tp[@]}" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --train-ms 20 --status-interval 0.1 -- "${popts[@]}"
wait_delivered c1 $((per_epoch / 2)) 60
kill -9 "$(pid_of c1)"
wait_exit c1 10
pkill -f -- "--data $data" 2>/dev/null || true
released1=$(($(wc -l <"$journal") - 1))
[ "$released1" -ge $((per_epoch / 2 - 1)) ] || fail "only $released1 batches journaled"

# run 2: resumes and finishes
start c2 "$CONSUMER" "${tp[@]}" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --summary-json "$SCRATCH/s2.json" -- "${popts[@]}"
expect_exit c2 0 120
log_has c2 "resuming from the journal"
[ "${1:-}" != shm ] || expect_json "$SCRATCH/s2.json" \
    "d['producer_transports']['shm'] == d['producers_seen'] > 0"
expect_json "$SCRATCH/s2.json" "d['complete']" "d['duplicates'] == 0" \
    "d['batches_resumed'] == $released1" \
    "d['batches_planned'] + d['batches_resumed'] == 2 * $per_epoch"
python3 - "$journal" "$per_epoch" <<'PY' || fail "journal contents"
import sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("hsflow-journal 1 plan="), lines[0]
pairs = [tuple(map(int, l.split())) for l in lines[1:]]
n = int(sys.argv[2])
assert len(pairs) == len(set(pairs)) == 2 * n, (len(pairs), len(set(pairs)), 2 * n)
assert set(pairs) == {(e, b) for e in range(2) for b in range(n)}
PY

# run 3: nothing left
start c3 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --summary-json "$SCRATCH/s3.json" -- "${popts[@]}"
expect_exit c3 0 60
log_has c3 "nothing left to do"
expect_json "$SCRATCH/s3.json" "d['complete']" "d['batches_planned'] == 0" \
    "d['batches_resumed'] == 2 * $per_epoch"

# another plan: refused, naming both plans
start c4 "$CONSUMER" "${tp[@]}" --loopback 1 --cache-gb 0.25 --epochs 2 --journal "$journal" -- \
    "${popts[@]}" --seed 99
wait_exit c4 60
log_has c4 "journal .* was written for plan [0-9a-f]{16}"
pass "resume from the journal"
