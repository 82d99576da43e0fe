#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# producer_killed.sh - a producer is killed with SIGKILL mid-epoch while it
# holds tickets; its leases go back to the queue, the two others finish its
# work, and every batch of both epochs is still delivered exactly once.
#
# To kill it while it surely holds tickets, the victim is first frozen with
# SIGSTOP: the consumer keeps granting it tickets (round robin, up to its
# prefetch) that it never finishes; once the run has moved on by several
# batches, the frozen victim holds some, and SIGKILL ends it.
. "$(dirname "$0")/lib.sh"
transport=${1:-tcp} # tcp, or ucx

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 3
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
popts=(--to 127.0.0.1:$port --transport "$transport" --data "$data" --token-budget 4096 --hidden-size 256
    --layers 2,16,29 --source synthetic --gpus cpu:1 --prefetch 2 --connect-timeout 60)
start victim "$PRODUCER" "${popts[@]}" --name victim
start p1 "$PRODUCER" "${popts[@]}" --name p1
start p2 "$PRODUCER" "${popts[@]}" --name p2
wait_connecting victim p1 p2
# --train-ms stretches the run over seconds, so the kill lands mid-run.
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport "$transport" --cache-gb 0.25 --epochs 2 \
    --verify-synthetic --train-ms 15 --status-interval 0.1 --summary-json "$SCRATCH/summary.json"
for name in victim p1 p2; do wait_log consumer "producer $name .* ready" 30; done
wait_delivered consumer 3 60

kill -STOP "$(pid_of victim)"
before=$(delivered consumer)
wait_delivered consumer $((before + 8)) 60
now=$(delivered consumer)
[ "$now" -lt $((2 * per_epoch)) ] || fail "the run ended while the victim was frozen"
kill -KILL "$(pid_of victim)"
wait_exit victim 10
[ "${RC_OF[victim]}" -eq 137 ] || fail "victim ended with ${RC_OF[victim]}, not by SIGKILL"

expect_exit consumer 0 90
expect_exit p1 0 30
expect_exit p2 0 30
log_has consumer 'producer victim .* gone: [0-9]+ ticket\(s\) back to the front of the queue'
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0' \
    'd["leases_returned"] >= 1' \
    'd["producers_seen"] == 3'
pass "victim killed at $now/$((2 * per_epoch)) delivered; $(json_get "$SCRATCH/summary.json" leases_returned) ticket(s) re-issued"
