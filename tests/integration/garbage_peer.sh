#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# garbage_peer.sh tcp|auto - raw sockets send garbage to a consumer in the
# middle of a real run: each garbage connection is answered with an ERROR
# frame or cut off, and the three real producers finish the run untouched
# (complete, verified, no duplicate, none dropped).
#   tcp   both sides --transport tcp: the wrong-magic and oversized peers must
#         get an ERROR frame, and the consumer counts the protocol errors;
#   auto  the default transport (shared memory for these producers on the
#         consumer's host; UCX on a host with an RDMA device): the listening
#         port is whatever the transport listens with, and garbage on it
#         must not hurt the run either (cut off is enough).
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: garbage_peer.sh tcp|auto}
tp=(--transport tcp)
[ "$mode" = tcp ] || tp=()

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 4
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
for i in 0 1 2; do
    start p$i "$PRODUCER" --to 127.0.0.1:$port "${tp[@]}" --data "$data" --token-budget 4096 \
        --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 --name p$i \
        --connect-timeout 60
done
wait_connecting p0 p1 p2
# --train-ms keeps the run going for seconds after the producers are in.
start consumer "$CONSUMER" --listen 127.0.0.1:$port "${tp[@]}" --cache-gb 0.25 --epochs 2 \
    --verify-synthetic --train-ms 100 --status-interval 0.2 --summary-json "$SCRATCH/summary.json"
for i in 0 1 2; do wait_log consumer "producer p$i .* ready" 30; done
wait_delivered consumer 1 60

# Four kinds of garbage; each must get ERROR (type 7) or a closed stream.
# The wrong-magic one must get a real ERROR frame: it proves the consumer
# was still in the run (a finished consumer answers BYE instead).
# the oversized frame speaks this build's protocol, so its size is what is refused
version=$(sed -n 's/^#define HS_PROTO_VERSION \([0-9]*\)u.*/\1/p' \
    "$(dirname "$0")/../../proto/hs_proto.h")
[ -n "$version" ] || fail "HS_PROTO_VERSION not found in proto/hs_proto.h"
python3 - "$port" "$mode" "$version" >"$SCRATCH/garbage.log" 2>&1 <<'PY' || fail "garbage peers: $(cat "$SCRATCH/garbage.log")"
import os, socket, struct, sys
port = int(sys.argv[1])
framed = sys.argv[2] == "tcp"  # the consumer speaks the TCP framing on this port
MAGIC, ERROR, BYE = 0x46534848, 7, 8

def talk(name, data, need_error):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        sys.exit("%s: cannot connect (%s): the consumer is gone" % (name, e))
    try:
        s.sendall(data)
    except OSError:
        pass
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        sys.exit("%s: the consumer neither answered nor closed within 10 s" % name)
    except OSError:
        pass  # reset: cut off
    s.close()
    types = []
    off = 0
    if not framed:
        print("%s: %d bytes back, then closed" % (name, len(got)))
        return
    while len(got) - off >= 24:
        plen, magic, ver, typ, blen, crc = struct.unpack_from("<QIHHII", got, off)
        if magic != MAGIC:
            sys.exit("%s: the consumer answered with a bad frame" % name)
        types.append(typ)
        off += 24 + blen + plen
    if BYE in types:
        sys.exit("%s: the consumer said BYE: the run was over before the garbage arrived" % name)
    if need_error and ERROR not in types:
        sys.exit("%s: closed without an ERROR frame (frames: %s)" % (name, types))
    print("%s: %s" % (name, "ERROR frame" if ERROR in types else "cut off"))

hdr = struct.pack("<QIHHII", 0, 0xDEADBEEF, 1, 1, 0, 0)
talk("wrong magic", hdr, framed)
talk("http request", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", False)
talk("random bytes", os.urandom(4096), False)
big = struct.pack("<QIHHII", 0, MAGIC, int(sys.argv[3]), 1, 0xFFFFFFF0, 0)
talk("oversized body_len", big, framed)
PY

expect_exit consumer 0 90
for i in 0 1 2; do expect_exit p$i 0 30; done
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0' \
    'd["leases_returned"] == 0'
if [ "$mode" = tcp ]; then
    expect_json "$SCRATCH/summary.json" 'd["protocol_errors"] >= 4' 'd["producers_seen"] == 3 + 4'
fi
for i in 0 1 2; do
    grep -q 'consumer says BYE' "$SCRATCH/p$i.log" || fail "p$i did not end with the consumer's BYE"
done
pass "$(tr '\n' ';' <"$SCRATCH/garbage.log")"
