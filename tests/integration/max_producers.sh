#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# max_producers.sh - --max-producers 1 (an option that only the consumer's
# option table names, set here from its HS_MAX_PRODUCERS spelling too): a
# second producer is refused at its HELLO, the consumer's log naming the
# flag, while the first completes the run.
. "$(dirname "$0")/lib.sh"

jsonl=$SCRATCH/d.jsonl
synth "$jsonl" --sequences 200 --min-len 16 --max-len 600 --seed 7
popts=(--data "$jsonl" --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic
    --gpus cpu:1 --connect-timeout 60)

reserve_port port
start consumer env HS_MAX_PRODUCERS=1 "$CONSUMER" --listen 127.0.0.1:$port --cache-gb 0.05 \
    --epochs 2 --train-ms 30 --status-interval 0.2
start p1 "$PRODUCER" --to 127.0.0.1:$port --name p1 "${popts[@]}"
wait_delivered consumer 2 60
start p2 "$PRODUCER" --to 127.0.0.1:$port --name p2 "${popts[@]}"
wait_log consumer 'p2.*producer refused: this consumer takes at most 1 at once \(--max-producers\)' 60
expect_exit consumer 0 120
log_has consumer 'hsflow summary: .* \(complete\)'
"$CONSUMER" --help | grep -q -- '--max-producers N' || fail "--help lacks --max-producers"
pass "a second producer is refused under --max-producers 1, naming the flag; the run completes"
