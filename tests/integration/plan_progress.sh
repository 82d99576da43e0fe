#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# plan_progress.sh - building the plan of a large dataset tells its progress
# (sequences measured and packed of the total, then the time it took) at
# every --status-interval; a plan that is quick says nothing of it.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 140000 --min-len 4 --max-len 24 --seed 2
start plan "$DATA" plan "$data" --token-budget 4096 --status-interval 1e-6
expect_exit plan 0 120
log_has plan 'plan: measured 65536 of 140000 sequences \(47%'
log_has plan 'plan: sorting 140000 sequences by length'
log_has plan 'plan: packed 131072 of 140000 sequences \(94%'
log_has plan 'plan: 140000 sequences in [0-9]+ batches, built in [0-9.]+ s'
start quick "$DATA" plan "$data" --token-budget 4096
expect_exit quick 0 120
if grep -q 'plan: packed' "$SCRATCH/quick.log"; then fail "a plan built in under 5 s told its progress"; fi
pass
