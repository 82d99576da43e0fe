#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# env_vars.sh - every flag can come from an HS_* environment variable: a run
# configured only through the environment behaves like its flags would
# (epochs, cache size, order, verification, layout, budget, workers,
# addresses), the command line wins over the environment, and a bad value
# in the environment is a usage error that says where it came from. The
# library's tuning (handshake timeout, status interval, socket buffers, UCX
# memory handles, faults) comes through those flags, not from its own reads.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 120 --min-len 16 --max-len 1500 --seed 8
n2048=$(plan_batches "$data" 2048)
n4096=$(plan_batches "$data" 4096)
[ "$n2048" -gt "$n4096" ] || fail "expected more batches at a 2048 budget than at 4096"

# 1. Everything from the environment, no flags at all.
reserve_port port
for i in 1 2; do
    start p$i env HS_TO=127.0.0.1:$port HS_DATA="$data" HS_TOKEN_BUDGET=2048 HS_HIDDEN_SIZE=128 \
        HS_LAYERS=1,5 HS_SOURCE=synthetic HS_GPUS=cpu:2 HS_TRANSPORT=tcp HS_NAME=envp$i \
        HS_CONNECT_TIMEOUT=60 HS_STATUS_INTERVAL=0 HS_TCP_SOCKBUF=4M "$PRODUCER"
done
wait_connecting p1 p2
start consumer env HS_LISTEN=127.0.0.1:$port HS_EPOCHS=2 HS_CACHE_GB=0.125 HS_ORDER=plan \
    HS_VERIFY_SYNTHETIC=1 HS_TRANSPORT=tcp HS_LEASE_TIMEOUT=45 HS_SUMMARY_JSON="$SCRATCH/env.json" \
    HS_HANDSHAKE_TIMEOUT=7 HS_NO_PRODUCER_WARN=90 HS_TCP_SOCKBUF=0 HS_UCX_MEMH=0 "$CONSUMER"
expect_exit consumer 0 90
for i in 1 2; do expect_exit p$i 0 30; done
log_has consumer 'config: listen 127\.0\.0\.1:[0-9]+, cache 0\.125 GiB, epochs 2, .*order plan, .*lease-timeout 45 s, verify-synthetic on, transport tcp'
# the library's own settings come from the same variables, through the flags
log_has consumer 'consumer settings: .*handshake timeout 7 s, status every 5 s, no-producer warning after 90 s, tcp socket buffers autotuned, ucx memory handles off, fault none'
log_has p1 'producer settings: .*status every never, tcp socket buffers 4194304 bytes'
log_has consumer 'run defined by envp[12] .*H=128 dtype=bf16 layers=\[1,5\].*budget 2048 tokens'
log_has consumer 'producer envp1 .* ready: 2 worker\(s\)'
expect_json "$SCRATCH/env.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $n2048" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["checksum_failures"] == 0 and d["duplicates"] == 0' \
    'd["epochs"] == 2' \
    '0 < d["cache_capacity"] <= (1 << 27) + (1 << 21) and d["cache_capacity"] >= (1 << 27) - (1 << 21)'

# 2. The command line wins: --epochs 1 over HS_EPOCHS=3, --token-budget 4096
# over HS_TOKEN_BUDGET=2048 (the loopback producers inherit the environment).
start cli env HS_EPOCHS=3 HS_TOKEN_BUDGET=2048 "$CONSUMER" --loopback 1 --epochs 1 --transport tcp \
    --cache-gb 0.125 --verify-synthetic --summary-json "$SCRATCH/cli.json" -- \
    --transport tcp --data "$data" --token-budget 4096 --hidden-size 64 --layers 1,2 --source synthetic
expect_exit cli 0 60
expect_json "$SCRATCH/cli.json" 'd["complete"] is True' "d['batches_planned'] == $n4096" 'd["epochs"] == 1'

# 3. A bad value in the environment is a usage error naming the flag and value.
start badc env HS_CACHE_GB=abc "$CONSUMER" --listen 127.0.0.1:1
expect_exit badc 2 30
log_has badc "cache-gb 'abc' \(environment"
start badp env HS_TOKEN_BUDGET=lots "$PRODUCER" --to 127.0.0.1:1 --data "$data" --hidden-size 8 --layers 1
expect_exit badp 2 30
log_has badp "token-budget 'lots' \(environment"
start badd env HS_TOKEN_BUDGET=0 "$DATA" plan "$data"
expect_exit badd 2 30
log_has badd "HS_TOKEN_BUDGET.*'0'"
start badf env HS_FAULT=corrupt=x "$CONSUMER" --listen 127.0.0.1:0 --transport tcp
expect_exit badf 1 30
log_has badf "fault 'corrupt=x': expected corrupt=N, cut=N and/or delay_ms=MS"
start bads "$PRODUCER" --to 127.0.0.1:1 --data "$data" --hidden-size 8 --layers 1 --tcp-sockbuf 2G
expect_exit bads 2 30
log_has bads "tcp-sockbuf '2G' \(command line\): expected a size up to 1G"
pass "env-only run: $((2 * n2048)) batches; command line wins; bad env values refused"
