#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# model_source.sh - hs-producer --source model on the CPU path with a
# Qwen3.5 hybrid checkpoint (Gated DeltaNet + gated attention), one epoch
# into a consumer: the run must end complete with every planned batch
# delivered, the producer having loaded the hybrid decoder. Then the VL
# wrapper checkpoint (its text decoder) the same way.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)

data=$SCRATCH/d.jsonl
synth "$data" --sequences 24 --min-len 1 --max-len 150 --vocab 64 --seed 3
budget=512
per_epoch=$(plan_batches "$data" $budget)
[ "${per_epoch:-0}" -gt 0 ] || fail "hs-data plan gave no batch count"

run_model() { # NAME MODEL_DIR LAYERS
    start "c-$1" "$CONSUMER" --loopback 1 --cache-gb 0.05 --epochs 1 --transport tcp \
        --summary-json "$SCRATCH/$1.json" -- --data "$data" --token-budget $budget \
        --source model --model "$2" --layers "$3" --gpus cpu:1 --transport tcp
    expect_exit "c-$1" 0 120
    log_has "c-$1" 'hsflow summary: .* \(complete\)'
    log_has "c-$1" 'Gated DeltaNet layers'
    expect_json "$SCRATCH/$1.json" \
        'd["complete"] is True' \
        "d['batches_planned'] == $per_epoch" \
        'd["batches_delivered"] == d["batches_planned"]' \
        'd["checksum_failures"] == 0' \
        'd["protocol_errors"] == 0' \
        'd["tokens"] > 0'
}

run_model text "$root/tests/data/qwen3_5_i2" 1,2,4
# the wrapper's ids must fit its vocabulary of 80 too: the same data
run_model vl "$root/tests/data/qwen3_5_vl" 0,2,3
log_has c-vl 'vision tower skipped'
pass "text and VL checkpoints: $per_epoch batches each"
