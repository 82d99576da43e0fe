#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hst_truncated.sh [truncate|offsets|larger] - a .hst file changed in place
# while producers read it: truncated to a third (truncate, the default), its
# offsets overwritten with random bytes (offsets), or a larger .hst copied
# over it (larger). Every producer stops with an error naming the file (exit
# 2, not killed by SIGBUS or SIGSEGV), the consumer keeps running and its
# status line says that no producer is connected and what to do; it then
# stops cleanly on SIGTERM.
. "$(dirname "$0")/lib.sh"
mode=${1:-truncate}

jsonl=$SCRATCH/d.jsonl
hst=$SCRATCH/d.hst
synth "$jsonl" --sequences 400 --min-len 16 --max-len 2000 --seed 5
"$DATA" import "$jsonl" "$hst" >/dev/null 2>"$SCRATCH/import.err" || fail "import: $(cat "$SCRATCH/import.err")"
popts=(--data "$hst" --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic
    --gpus cpu:1 --connect-timeout 60)

reserve_port port
for i in 1 2; do start p$i "$PRODUCER" --to 127.0.0.1:$port --name p$i "${popts[@]}"; done
wait_connecting p1 p2
start consumer "$CONSUMER" --listen 127.0.0.1:$port --cache-gb 0.25 --no-producer-warn 1 \
    --epochs 50 --train-ms 5 --status-interval 0.2
wait_delivered consumer 3 60
case $mode in
truncate) truncate -s $(($(stat -c %s "$hst") / 3)) "$hst" ;;
offsets) # offsets of sequences 1..200 (the header is 64 bytes, offsets[0] 8 more)
    head -c 1600 /dev/urandom | dd of="$hst" bs=1 seek=72 conv=notrunc status=none ;;
larger)
    synth "$SCRATCH/big.jsonl" --sequences 400 --min-len 4000 --max-len 8000 --seed 6
    "$DATA" import "$SCRATCH/big.jsonl" "$SCRATCH/big.hst" >/dev/null 2>"$SCRATCH/import.err" ||
        fail "import: $(cat "$SCRATCH/import.err")"
    cp "$SCRATCH/big.hst" "$hst" ;;
*) fail "unknown mode $mode (truncate, offsets or larger)" ;;
esac

for i in 1 2; do
    wait_exit p$i 60
    rc=${RC_OF[p$i]}
    [ "$rc" -ne 135 ] || fail "p$i was killed by SIGBUS"
    [ "$rc" -ne 139 ] || fail "p$i was killed by SIGSEGV"
    [ "$rc" -eq 2 ] || fail "p$i exited with $rc, expected 2"
    log_has p$i 'd\.hst: the file was (truncated|modified) while in use .*Restore it and restart'
done
running consumer || fail "the consumer ended with its producers"
wait_log consumer 'producers 0 .*no producer connected for [0-9]+ s: waiting; start producers or stop with Ctrl-C' 30
kill -TERM "$(pid_of consumer)"
expect_exit consumer 130 30
pass "producers stopped on the .hst changed in place ($mode); the consumer said it waits for producers"
