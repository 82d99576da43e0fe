#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# verified_run.sh MODE - three producers x two epochs against one consumer
# that checks every hidden-state element (--verify-synthetic): the run must
# end complete, with no duplicate, no checksum failure, no protocol error,
# and every batch computed exactly once over all producers.
#   arrival   hs-consumer --listen + 3 hs-producer processes, TCP
#   plan      the same with --order plan
#   hst       the same from a .hst dataset made by hs-data import
#   loopback  hs-consumer --loopback 3 (one command)
#   auto      the default transport on both sides (no --transport): shared
#             memory on one host, every producer counted under shm
#   shm       --transport shm on both sides
#   shm-fp8   the same with fp8 hidden states (--hs-dtype fp8)
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: verified_run.sh arrival|plan|hst|loopback|auto|shm|shm-fp8}

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 1
budget=4096
per_epoch=$(plan_batches "$data" $budget)
[ "${per_epoch:-0}" -gt 0 ] || fail "hs-data plan gave no batch count"

tp=(--transport tcp)
corder=()
dtype=()
want_tp=tcp
case $mode in
arrival | loopback) ;;
plan) corder=(--order plan) ;;
hst)
    "$DATA" import "$data" "$SCRATCH/d.hst" >"$SCRATCH/import.log" 2>&1 || fail "hs-data import failed"
    "$DATA" info "$SCRATCH/d.hst" >"$SCRATCH/info.log" 2>&1 || fail "hs-data info failed"
    log_has info '^format +hst'
    log_has info '^sequences +200$'
    # same sequences, so the same plan as the JSONL
    [ "$(plan_batches "$SCRATCH/d.hst" $budget)" = "$per_epoch" ] || fail ".hst plan differs from the JSONL plan"
    data=$SCRATCH/d.hst
    ;;
auto) tp=() want_tp=shm ;;
shm) tp=(--transport shm) want_tp=shm ;;
shm-fp8) tp=(--transport shm) want_tp=shm dtype=(--hs-dtype fp8) ;;
*) fail "unknown mode $mode" ;;
esac

popts=(--data "$data" --token-budget $budget --hidden-size 256 --layers 2,16,29
    --source synthetic --gpus cpu:1 "${tp[@]}" "${dtype[@]}")
copts=(--cache-gb 0.25 --epochs 2 --verify-synthetic --summary-json "$SCRATCH/summary.json"
    "${corder[@]}" "${tp[@]}")

if [ "$mode" = loopback ]; then
    start consumer "$CONSUMER" --loopback 3 "${copts[@]}" -- "${popts[@]}"
    expect_exit consumer 0 90
    log_has consumer 'hsflow summary: .* \(complete\)'
else
    reserve_port port
    for i in 0 1 2; do
        start p$i "$PRODUCER" --to 127.0.0.1:$port --name p$i --connect-timeout 60 \
            --summary-json "$SCRATCH/p$i.json" "${popts[@]}"
    done
    wait_connecting p0 p1 p2
    start consumer "$CONSUMER" --listen 127.0.0.1:$port "${copts[@]}"
    expect_exit consumer 0 90
    for i in 0 1 2; do expect_exit p$i 0 30; done
    # Every batch was computed once: no producer did work that was thrown away.
    sum=0
    for i in 0 1 2; do sum=$((sum + $(json_get "$SCRATCH/p$i.json" batches))); done
    [ $sum -eq $((2 * per_epoch)) ] || fail "producers computed $sum batches for a run of $((2 * per_epoch))"
fi

expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0' \
    'd["protocol_errors"] == 0' \
    'd["producers_seen"] == 3' \
    'd["producers_dropped"] == 0' \
    'd["leases_returned"] == 0' \
    'd["epochs"] == 2' \
    'd["bytes"] > 0 and d["tokens"] > 0' \
    'd["cache_high_water"] <= d["cache_capacity"]'
[ "$mode" = loopback ] || expect_json "$SCRATCH/summary.json" \
    "d['producer_transports']['$want_tp'] == 3"
[ ${#dtype[@]} -eq 0 ] || log_has consumer 'dtype=fp8'
pass "$mode: $((2 * per_epoch)) batches, all verified"
