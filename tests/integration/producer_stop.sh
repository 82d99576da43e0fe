#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# producer_stop.sh - SIGTERM stops a producer cleanly mid-run: it exits 0,
# the consumer logs its goodbye and hands the tickets it held to the other
# producers, and the run completes with every batch delivered exactly once.
# A second signal exits at once (shown on a producer still waiting to
# connect, where the first one cannot finish anything).
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 300 --min-len 16 --max-len 2000 --seed 3
per_epoch=$(plan_batches "$data" 4096)
popts=(--data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic
    --gpus cpu:1 --prefetch 4 --connect-timeout 60)

reserve_port port
for i in 1 2 3; do start p$i "$PRODUCER" --to 127.0.0.1:$port --name p$i "${popts[@]}"; done
wait_connecting p1 p2 p3
start consumer "$CONSUMER" --listen 127.0.0.1:$port --cache-gb 0.25 --epochs 3 --prefetch 4 \
    --train-ms 10 --status-interval 0.1 --summary-json "$SCRATCH/summary.json" --verify-synthetic
wait_delivered consumer 10 60

# Frozen, p1 keeps the tickets the consumer tops it up with while the others
# deliver; the SIGTERM waits for SIGCONT.
kill -STOP "$(pid_of p1)"
n=$(delivered consumer)
wait_delivered consumer $((n + 6)) 60
kill -TERM "$(pid_of p1)"
kill -CONT "$(pid_of p1)"
expect_exit p1 0 60
log_has p1 'stop requested: finishing [0-9]+ batch\(es\) in progress, leaving [0-9]+ queued'
# What p1 counts as returned are the tickets it had read; tickets still in
# its socket when it stopped are returned by the consumer all the same.
log_has p1 'stopped on request: told the consumer BYE \([0-9]+ ticket\(s\) returned\)'
wait_log consumer 'producer p1 .* says goodbye: producer stopped on request; [0-9]+ ticket' 30
# The tickets it had queued (not begun) go back to the others; when every one
# it held was in progress and finished, there is none to give back.
returned=$(grep -Eo 'told the consumer BYE \([0-9]+ ticket' "$SCRATCH/p1.log" | grep -Eo '[0-9]+' | head -n 1)
if [ "${returned:-0}" -gt 0 ]; then
    wait_log consumer 'producer p1 .* gone: [1-9][0-9]* ticket\(s\) back to the front of the queue' 30
fi

expect_exit consumer 0 120
expect_json "$SCRATCH/summary.json" "d['complete']" "d['duplicates'] == 0" \
    "d['checksum_failures'] == 0" "d['batches_delivered'] == 3 * $per_epoch" \
    "d['leases_returned'] >= $([ "${returned:-0}" -gt 0 ] && echo 1 || echo 0)"
for i in 2 3; do expect_exit p$i 0 30; done

# A second signal: no consumer to reach, so the first cannot finish.
reserve_port lport
start lonely "$PRODUCER" --to 127.0.0.1:$lport --name lonely "${popts[@]}"
wait_connecting lonely
kill -TERM "$(pid_of lonely)"
wait_log lonely 'stopping: finishing the batches in progress' 30
kill -TERM "$(pid_of lonely)"
expect_exit lonely 143 10
log_has lonely 'second signal: exiting at once'
pass "a SIGTERMed producer said BYE, its tickets went to the others, the run completed once"
