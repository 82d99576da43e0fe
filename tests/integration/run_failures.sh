#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run_failures.sh - runs that cannot succeed end promptly with a clear
# message and a non-zero exit instead of hanging:
#   - a cache smaller than the largest batch of the plan;
#   - loopback producers that all fail (a missing dataset);
#   - a producer with no consumer to reach (after --connect-timeout);
#   - a consumer interrupted (SIGINT) mid-run writes an incomplete summary.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 2000 --seed 9
popts=(--transport tcp --data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29
    --source synthetic)

# Batches of up to ~6 MiB against a 1 MiB cache.
start small "$CONSUMER" --loopback 2 --transport tcp --cache-gb 0.001 --epochs 1 -- "${popts[@]}"
expect_exit small 1 60
log_has small 'largest batch needs .* --cache-gb gives .*raise --cache-gb'
log_has small 'hsflow summary: 0/0 batches delivered \(INCOMPLETE\)'

start nodata "$CONSUMER" --loopback 2 --transport tcp --cache-gb 0.1 -- \
    --transport tcp --data "$SCRATCH/missing.jsonl" --token-budget 4096 --hidden-size 256 \
    --layers 2,16,29 --source synthetic
expect_exit nodata 1 60
log_has nodata 'missing\.jsonl: cannot open dataset'
log_has nodata 'every local producer has exited and the run is not complete'

reserve_port aport
start alone "$PRODUCER" --to 127.0.0.1:$aport --connect-timeout 1 "${popts[@]}"
wait_exit alone 30
[ "${RC_OF[alone]}" -ne 0 ] || fail "a producer without a consumer exited 0"
log_has alone 'cannot reach the consumer at 127\.0\.0\.1:[0-9]+ within 1 s'

reserve_port port
start p1 "$PRODUCER" --to 127.0.0.1:$port --connect-timeout 60 --name p1 "${popts[@]}"
wait_connecting p1
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport tcp --cache-gb 0.1 --epochs 3 \
    --train-ms 50 --status-interval 0.1 --summary-json "$SCRATCH/int.json"
wait_delivered consumer 2 60
kill -INT "$(pid_of consumer)"
expect_exit consumer 130 30
wait_exit p1 30
expect_json "$SCRATCH/int.json" 'd["complete"] is False' \
    '0 < d["batches_delivered"] < d["batches_planned"]' 'd["duplicates"] == 0'
pass "each failing run ended with a clear message"
