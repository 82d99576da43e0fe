#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# hst_truncated.sh - a .hst file truncated while producers read it: every
# producer stops with an error naming the file (exit 2, not killed by
# SIGBUS), the consumer keeps running and its status line says that no
# producer is connected and what to do; it then stops cleanly on SIGTERM.
. "$(dirname "$0")/lib.sh"

jsonl=$SCRATCH/d.jsonl
hst=$SCRATCH/d.hst
synth "$jsonl" --sequences 400 --min-len 16 --max-len 2000 --seed 5
"$DATA" import "$jsonl" "$hst" >/dev/null 2>"$SCRATCH/import.err" || fail "import: $(cat "$SCRATCH/import.err")"
popts=(--data "$hst" --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic
    --gpus cpu:1 --connect-timeout 60)

port=$(free_port)
for i in 1 2; do start p$i "$PRODUCER" --to 127.0.0.1:$port --name p$i "${popts[@]}"; done
wait_connecting p1 p2
start consumer "$CONSUMER" --listen 127.0.0.1:$port --cache-gb 0.25 --no-producer-warn 1 \
    --epochs 50 --train-ms 5 --status-interval 0.2
wait_delivered consumer 3 60
truncate -s $(($(stat -c %s "$hst") / 3)) "$hst"

for i in 1 2; do
    wait_exit p$i 60
    rc=${RC_OF[p$i]}
    [ "$rc" -ne 135 ] || fail "p$i was killed by SIGBUS"
    [ "$rc" -eq 2 ] || fail "p$i exited with $rc, expected 2"
    log_has p$i 'd\.hst: the file was (truncated|modified) while in use .*Restore it and restart'
done
running consumer || fail "the consumer ended with its producers"
wait_log consumer 'producers 0 .*no producer connected for [0-9]+ s: waiting; start producers or stop with Ctrl-C' 30
kill -TERM "$(pid_of consumer)"
expect_exit consumer 130 30
pass "producers stopped on the truncated .hst; the consumer said it waits for producers"
