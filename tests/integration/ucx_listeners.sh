#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx_listeners.sh - a UCX consumer told to listen on 127.0.0.1 listens on
# 127.0.0.1 only: its bootstrap socket and UCX's own transport sockets (UCX's
# tcp transport opens one on every network interface it uses). Every
# listening socket of the consumer process is read from /proc (its fds and
# the kernel's tcp tables) and must be bound to 127.0.0.1, on a machine that
# has a non-loopback address too; then a real producer completes a run over
# the narrowed UCX.
. "$(dirname "$0")/lib.sh"

ext=$(ip -4 -o addr show scope global 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n 1)
[ -n "$ext" ] || echo "note: this machine has no global IPv4 address; the check is weaker" >&2

data=$SCRATCH/d.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 800 --seed 5
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport ucx --cache-gb 0.25 --epochs 1 \
    --verify-synthetic --summary-json "$SCRATCH/summary.json"
wait_log consumer 'listening on 127.0.0.1' 30

listeners() { # "addr:port" of every TCP socket of pid $1 in LISTEN state
    python3 - "$1" <<'PY'
import os, socket, struct, sys
pid = sys.argv[1]
inodes = set()
for fd in os.listdir("/proc/%s/fd" % pid):
    try:
        link = os.readlink("/proc/%s/fd/%s" % (pid, fd))
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
for table, fam in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
    with open("/proc/%s/net/%s" % (pid, table)) as f:
        next(f)
        for line in f:
            col = line.split()
            if col[3] != "0A" or col[9] not in inodes:
                continue
            addr, port = col[1].split(":")
            raw = bytes.fromhex(addr)
            if fam == socket.AF_INET:
                ip = socket.inet_ntop(fam, struct.pack("<I", int(addr, 16)))
            else:
                ip = socket.inet_ntop(fam, b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            print("%s:%d" % (ip, int(port, 16)))
PY
}
got=$(listeners "$(pid_of consumer)") || fail "cannot read the consumer's sockets"
n=$(echo "$got" | grep -c .)
[ "$n" -ge 2 ] || fail "expected the bootstrap socket and UCX's own listener, found: $got"
echo "$got" | grep -qx "127.0.0.1:$port" || fail "the bootstrap socket is not among: $got"
others=$(echo "$got" | grep -v '^127\.0\.0\.1:' || true)
[ -z "$others" ] || fail "listening beyond 127.0.0.1 (the machine's address is ${ext:-none}): $others"
log_has consumer 'UCX limited to lo'

start producer "$PRODUCER" --to 127.0.0.1:$port --transport ucx --data "$data" --token-budget 4096 \
    --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 --connect-timeout 30
expect_exit consumer 0 120
expect_exit producer 0 30
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["checksum_failures"] == 0'
pass "$n listeners, all on 127.0.0.1: $(echo "$got" | tr '\n' ' ')"
