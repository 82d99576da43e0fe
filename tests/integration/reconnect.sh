#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# reconnect.sh [tcp|ucx] [KILLS] - the consumer is killed with SIGKILL
# mid-run and restarted on the same port with the same --journal, KILLS times
# (default 1); producers started with --reconnect connect again each time
# (over UCX the whole bootstrap is retried when a restart resets it), send
# the plan to the new consumer, and the run completes: across all consumers
# every batch of every epoch is released exactly once.
. "$(dirname "$0")/lib.sh"
mode=${1:-tcp}
kills=${2:-1}

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 12
per_epoch=$(plan_batches "$data" 4096)
journal=$SCRATCH/run.journal
reserve_port port
copts=(--listen 127.0.0.1:$port --transport "$mode" --cache-gb 0.25 --epochs 2
    --journal "$journal" --verify-synthetic --status-interval 0.1)
start c1 "$CONSUMER" "${copts[@]}" --train-ms 20
for i in 1 2; do
    start p$i "$PRODUCER" --to 127.0.0.1:$port --transport "$mode" --reconnect --connect-timeout 60 \
        --data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29 \
        --source synthetic --gpus cpu:1 --name p$i --summary-json "$SCRATCH/p$i.json"
done
wait_delivered c1 $((per_epoch / 2)) 60
for k in $(seq 1 "$kills"); do
    kill -9 "$(pid_of c$k)"
    wait_exit c$k 10
    for i in 1 2; do
        deadline=$(($(date +%s) + 30))
        until [ "$(grep -c 'reconnecting' "$SCRATCH/p$i.log")" -ge "$k" ]; do
            running p$i || fail "p$i ended instead of reconnecting (restart $k)"
            [ "$(date +%s)" -lt "$deadline" ] || fail "p$i did not notice restart $k within 30 s"
            sleep 0.05
        done
    done
    next=$((k + 1))
    if [ "$k" -lt "$kills" ]; then
        # killed again as soon as it delivers, while producers come and go
        start c$next "$CONSUMER" "${copts[@]}" --train-ms 20
        wait_delivered c$next 3 60
    else
        sleep 2.5 # longer than a try (1 s): the producers fail at least one, logged at INFO
        start c$next "$CONSUMER" "${copts[@]}" --summary-json "$SCRATCH/s2.json"
    fi
done
expect_exit c$((kills + 1)) 0 120
for i in 1 2; do
    expect_exit p$i 0 60
    [ "$(grep -c 'reconnected to' "$SCRATCH/p$i.log")" -ge "$kills" ] ||
        fail "p$i reconnected fewer than $kills times"
    # the tries while the consumer was away are expected: INFO, never ERROR
    log_has p$i 'INFO\] cannot connect'
    if grep -q ' ERROR\]' "$SCRATCH/p$i.log"; then
        fail "p$i logged an ERROR while reconnecting: $(grep -m 3 ' ERROR\]' "$SCRATCH/p$i.log")"
    fi
done
expect_json "$SCRATCH/s2.json" "d['complete']" "d['duplicates'] == 0" "d['checksum_failures'] == 0" \
    "d['batches_planned'] + d['batches_resumed'] == 2 * $per_epoch" "d['batches_resumed'] > 0"
python3 - "$journal" "$per_epoch" <<'PY' || fail "journal contents"
import sys
pairs = [tuple(map(int, l.split())) for l in open(sys.argv[1]).read().splitlines()[1:]]
n = int(sys.argv[2])
assert len(pairs) == len(set(pairs)) == 2 * n, (len(pairs), len(set(pairs)), 2 * n)
PY
pass "producers reconnect to a consumer restarted $kills time(s) over $mode"
