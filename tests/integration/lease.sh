#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# lease.sh - a producer whose batch takes longer than --lease-timeout keeps
# its tickets while its worker computes: the CPU forward of the small test
# model over one 3,600-token sequence takes seconds of CPU, far more than
# the 1 s lease, with no DONE in between; only the producer's heartbeat
# (STATS with progressing set, from the worker's CPU clock) renews the
# lease. The run must complete with no producer dropped and no ticket
# re-issued.
. "$(dirname "$0")/lib.sh"

model=$(cd "$(dirname "$0")/../data/llama3" && pwd)
data=$SCRATCH/long.jsonl
python3 -c '
import json, random, sys
r = random.Random(5)
with open(sys.argv[1], "w") as f:
    for _ in range(2):
        f.write(json.dumps({"input_ids": [r.randrange(64) for _ in range(3600)]}) + "\n")
' "$data" || fail "cannot write the dataset"

reserve_port port
# --lease-min-rate 20: the rate floor (200 tok/s by default) is another rule;
# under a sanitizer on a loaded two-core box this forward ran below it
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport tcp --cache-gb 0.1 --epochs 1 \
    --lease-timeout 1 --lease-min-rate 20 --summary-json "$SCRATCH/summary.json"
wait_log consumer 'listening on' 30
start producer "$PRODUCER" --to 127.0.0.1:$port --transport tcp --data "$data" --token-budget 3600 \
    --source model --model "$model" --layers 1,2 --gpus cpu:1 --name slow --connect-timeout 30
# A producer that lost its tickets is refused and exits at once.
expect_exit producer 0 140
expect_exit consumer 0 30
log_has consumer 'lease-timeout 1 s'
if grep -q 'no progress' "$SCRATCH/consumer.log"; then
    fail "a producer computing a long batch lost its tickets"
fi
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    'd["batches_delivered"] == 2' \
    'd["producers_dropped"] == 0' \
    'd["leases_returned"] == 0'
pass "a computing producer kept its tickets past the lease timeout"
