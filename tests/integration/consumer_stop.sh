#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# consumer_stop.sh - a consumer that cannot hold its cache says so at start,
# and one that is told to stop keeps its records straight:
#   - --cache-gb beyond MemAvailable (the real machine) is refused with exit
#     2, naming the figure and --force;
#   - on a stand-in system (HS_SYSTEM_ROOT) whose cgroup limit is tighter than
#     MemAvailable, the message names both figures and the cgroup file;
#     --force warns and the run completes;
#   - SIGTERM mid-run: exit 130, a valid summary whose delivered count equals
#     the batches the journal recorded, and a restart with the journal
#     delivers the rest: every batch of every epoch exactly once.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 11
per_epoch=$(plan_batches "$data" 4096)
popts=(--data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1)

# ---- more cache than memory
start huge "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 1000000
expect_exit huge 2 30
log_has huge 'cache-gb 1000000\.00 is more than this machine can give .*MemAvailable [0-9.]+ GiB'
log_has huge 'add --force'

fake=$SCRATCH/system
mkdir -p "$fake/proc/self" "$fake/sys/fs/cgroup/job"
echo 'MemAvailable:    4194304 kB' >"$fake/proc/meminfo" # 4 GiB
echo '0::/job' >"$fake/proc/self/cgroup"
echo $((192 << 20)) >"$fake/sys/fs/cgroup/job/memory.max"    # 192 MiB
echo $((32 << 20)) >"$fake/sys/fs/cgroup/job/memory.current" # 32 MiB in use
start cgroup env HS_SYSTEM_ROOT="$fake" "$CONSUMER" --listen 127.0.0.1:0 --cache-gb 0.25
expect_exit cgroup 2 30
log_has cgroup 'MemAvailable 4\.00 GiB, cgroup limit 0\.19 GiB with 0\.03 GiB in use \(.*job/memory\.max\)'
log_has cgroup 'Give --cache-gb \(cache_gb\) 0\.1 or less'

start forced env HS_SYSTEM_ROOT="$fake" "$CONSUMER" --loopback 2 --cache-gb 0.25 --force \
    --summary-json "$SCRATCH/forced.json" -- "${popts[@]}"
expect_exit forced 0 120
log_has forced 'going on because of --force'
expect_json "$SCRATCH/forced.json" "d['complete']" "d['duplicates'] == 0"

# ---- SIGTERM mid-run, then a restart with the journal
journal=$SCRATCH/run.journal
start c1 "$CONSUMER" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --train-ms 20 --status-interval 0.1 --summary-json "$SCRATCH/s1.json" -- "${popts[@]}"
wait_delivered c1 $((per_epoch / 2)) 60
kill -TERM "$(pid_of c1)"
expect_exit c1 130 60
log_has c1 'interrupted: stopping before the run is complete'
released1=$(($(wc -l <"$journal") - 1))
expect_json "$SCRATCH/s1.json" "d['complete'] is False" "d['duplicates'] == 0" \
    "d['batches_delivered'] == $released1" "0 < d['batches_delivered'] < 2 * $per_epoch"

start c2 "$CONSUMER" --loopback 2 --cache-gb 0.25 --epochs 2 --journal "$journal" \
    --summary-json "$SCRATCH/s2.json" -- "${popts[@]}"
expect_exit c2 0 120
expect_json "$SCRATCH/s2.json" "d['complete']" "d['duplicates'] == 0" \
    "d['batches_resumed'] == $released1" \
    "d['batches_planned'] + d['batches_resumed'] == 2 * $per_epoch"
python3 - "$journal" "$per_epoch" <<'PY' || fail "journal contents"
import sys
lines = open(sys.argv[1]).read().splitlines()
pairs = [tuple(map(int, l.split())) for l in lines[1:]]
n = int(sys.argv[2])
assert len(pairs) == len(set(pairs)) == 2 * n, (len(pairs), len(set(pairs)), 2 * n)
assert set(pairs) == {(e, b) for e in range(2) for b in range(n)}
PY
pass "memory checked at start; SIGTERM kept summary and journal consistent"
