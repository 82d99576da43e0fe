#!/usr/bin/env bash
# reconnect.sh - the consumer is killed with SIGKILL mid-run and restarted on
# the same port with the same --journal; producers started with --reconnect
# connect again, send the plan to the new consumer, and the run completes:
# across both consumers every batch of every epoch is released exactly once.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 12
per_epoch=$(plan_batches "$data" 4096)
journal=$SCRATCH/run.journal
port=$(free_port)
copts=(--listen 127.0.0.1:$port --transport tcp --cache-gb 0.25 --epochs 2
    --journal "$journal" --verify-synthetic --status-interval 0.1)
start c1 "$CONSUMER" "${copts[@]}" --train-ms 20
for i in 1 2; do
    start p$i "$PRODUCER" --to 127.0.0.1:$port --transport tcp --reconnect --connect-timeout 60 \
        --data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29 \
        --source synthetic --gpus cpu:1 --name p$i --summary-json "$SCRATCH/p$i.json"
done
wait_delivered c1 $((per_epoch / 2)) 60
kill -9 "$(pid_of c1)"
wait_exit c1 10
for i in 1 2; do wait_log p$i "reconnecting" 30; done
start c2 "$CONSUMER" "${copts[@]}" --summary-json "$SCRATCH/s2.json"
expect_exit c2 0 120
for i in 1 2; do
    expect_exit p$i 0 60
    log_has p$i "reconnected to"
done
expect_json "$SCRATCH/s2.json" "d['complete']" "d['duplicates'] == 0" "d['checksum_failures'] == 0" \
    "d['batches_planned'] + d['batches_resumed'] == 2 * $per_epoch" "d['batches_resumed'] > 0"
python3 - "$journal" "$per_epoch" <<'PY' || fail "journal contents"
import sys
pairs = [tuple(map(int, l.split())) for l in open(sys.argv[1]).read().splitlines()[1:]]
n = int(sys.argv[2])
assert len(pairs) == len(set(pairs)) == 2 * n, (len(pairs), len(set(pairs)), 2 * n)
PY
pass "producers reconnect to a restarted consumer"
