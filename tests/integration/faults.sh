#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# faults.sh MODE TRANSPORT - faults injected into the consumer's transport
# (--fault, see transport/fault.c) while three producers run two epochs:
#   corrupt  one payload has a byte flipped after it landed: the checksum
#            catches it, its producer is dropped, the batch is computed again
#            and the run completes with exactly one checksum failure;
#   cut      one connection is cut mid-run: its tickets go back to the queue
#            and the run completes.
# Either way every batch is delivered exactly once and verified.
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: faults.sh corrupt|cut [tcp|ucx]}
transport=${2:-tcp}

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 4
per_epoch=$(plan_batches "$data" 4096)
case $mode in
corrupt) fault=corrupt=7 ;;
cut) fault=cut=25 ;;
*) fail "unknown mode $mode" ;;
esac
reserve_port port
start consumer "$CONSUMER" --listen 127.0.0.1:$port --fault "$fault" --transport "$transport" \
    --cache-gb 0.25 --epochs 2 --verify-synthetic --status-interval 0.2 \
    --summary-json "$SCRATCH/summary.json"
for i in 1 2 3; do
    start p$i "$PRODUCER" --to 127.0.0.1:$port --transport "$transport" --data "$data" \
        --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 \
        --name p$i
done
expect_exit consumer 0 120
log_has consumer "fault injection active"
expect_json "$SCRATCH/summary.json" "d['complete']" "d['duplicates'] == 0" \
    "d['batches_delivered'] == 2 * $per_epoch"
case $mode in
corrupt)
    log_has consumer "failed verification"
    expect_json "$SCRATCH/summary.json" "d['checksum_failures'] == 1" "d['producers_dropped'] >= 1"
    ;;
cut)
    log_has consumer "fault injection: cutting the connection"
    expect_json "$SCRATCH/summary.json" "d['checksum_failures'] == 0"
    ;;
esac
for i in 1 2 3; do wait_exit p$i 60; done
pass "$mode over $transport"
