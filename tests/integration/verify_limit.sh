#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# verify_limit.sh - when the consumer's own checksum work holds the run back
# (one --verify-threads thread against fast producers and a trainer that
# waits), the consumer names its verification as the limit with the flag
# that lifts it, where it used to blame the network while the producers
# blamed the consumer. The checks are real (--verify-synthetic checks every
# byte), and HS_VERIFY_FAULT makes each take 150 ms longer: on a busy
# machine loopback TCP could be slower than one checksum thread, and then
# the network is rightly named instead.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 150 --min-len 32 --max-len 4096 --seed 7
start consumer env HS_VERIFY_FAULT=slow=150 "$CONSUMER" --loopback 2 --transport tcp --cache-gb 0.25 \
    --epochs 2 --verify-synthetic --verify-threads 1 --status-interval 0.5 \
    --summary-json "$SCRATCH/summary.json" -- \
    --transport tcp --data "$data" --token-budget 16384 --hidden-size 256 --layers 2,16,29 \
    --source synthetic --gpus cpu:1
expect_exit consumer 0 180
log_has consumer "this consumer's verification is the limit: its 1 checksum thread is busy [0-9]+% of the time .*raise --verify-threads"
log_has consumer 'hsflow summary: epoch 2/2, .*verification is the limit'
log_has consumer 'producer loopback-[01] .*the consumer is the limit: workers wait for tickets'
expect_json "$SCRATCH/summary.json" 'd["complete"] is True' 'd["bottleneck"] == "verify"' \
    'd["verify_threads"] == 1 and d["recent_verify_pct"] >= 60'
pass
