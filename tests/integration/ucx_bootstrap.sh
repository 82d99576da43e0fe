#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx_bootstrap.sh - hostile peers on a UCX consumer's bootstrap port, which
# is where UCX worker addresses are swapped. UCX trusts a worker address
# completely (13 malformed bytes make it abort the process), so with a shared
# secret no peer may get an address to UCX before it proved it holds the
# secret: each raw peer below (an old-version hello carrying a 13-byte
# address, no secret, a wrong proof with a 13-byte address, absurd lengths,
# truncation, noise) must be refused or cut off, the consumer must live on
# and log no bootstrap as passed, a producer with the wrong secret must fail
# with a clear error on both sides, and the real producers must then
# complete the run (and be the only bootstraps that passed).
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 120 --min-len 16 --max-len 1500 --seed 9
umask 077
head -c 48 /dev/urandom | base64 >"$SCRATCH/secret"
head -c 48 /dev/urandom | base64 >"$SCRATCH/other-secret"
per_epoch=$(plan_batches "$data" 4096)

reserve_port port
HS_LOG_LEVEL=debug start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport ucx \
    --cache-gb 0.25 --epochs 2 --verify-synthetic --secret-file "$SCRATCH/secret" \
    --summary-json "$SCRATCH/summary.json"
wait_log consumer 'listening on .*HMAC auth' 30

python3 - "$port" >"$SCRATCH/raw.log" 2>&1 <<'PY' || fail "raw peers: $(cat "$SCRATCH/raw.log")"
import os, socket, struct, sys
port = int(sys.argv[1])
MAGIC, HELLO, CHALLENGE, AUTH, REFUSE = 0x58555348, 1, 2, 3, 5

def rec(typ, body, version=2):
    return struct.pack("<IHHI", MAGIC, version, typ, len(body)) + body

def read_all(s):
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        sys.exit("the consumer neither answered nor closed within 10 s")
    except OSError:
        pass  # reset: cut off
    return got

def records(got):
    out, off = [], 0
    while len(got) - off >= 12:
        magic, ver, typ, blen = struct.unpack_from("<IHHI", got, off)
        if magic != MAGIC:
            sys.exit("the consumer answered with a bad record")
        out.append((typ, got[off + 12:off + 12 + blen]))
        off += 12 + blen
    return out

def talk(name, first, then=None, want=None):
    """Sends `first`; when `then` is given, waits for the CHALLENGE and sends
    then(challenge). `want`: a text the REFUSE must contain (None: cut off
    is enough)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as e:
        sys.exit("%s: cannot connect (%s): the consumer is gone" % (name, e))
    got = b""
    try:
        s.sendall(first)
        if then is not None:
            head = b""
            while len(head) < 48:
                chunk = s.recv(48 - len(head))
                if not chunk:
                    break
                head += chunk
            got += head
            if len(head) == 48 and struct.unpack_from("<H", head, 6)[0] == CHALLENGE:
                s.sendall(then(head))
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    got += read_all(s)
    s.close()
    rs = records(got)
    refusals = [body[4:].decode("ascii", "replace") for typ, body in rs if typ == REFUSE]
    if any(typ not in (CHALLENGE, REFUSE) for typ, _ in rs):
        sys.exit("%s: the consumer sent %s" % (name, [t for t, _ in rs]))
    if want and not any(want in r for r in refusals):
        sys.exit("%s: no REFUSE saying '%s' (got %s)" % (name, want, refusals or "nothing"))
    print("%s: %s" % (name, refusals[0] if refusals else "cut off"))

nonce = lambda: os.urandom(32)
hello_key = rec(HELLO, struct.pack("<I", 1) + nonce())
hello_nokey = rec(HELLO, struct.pack("<I", 0) + nonce())
addr13 = os.urandom(13)
# the version-1 hello: magic | version 1 | reserved | addr_len | addr
talk("v1 hello, 13-byte address", struct.pack("<IHHI", MAGIC, 1, 0, 13) + addr13, want="version 1")
talk("no secret", hello_nokey, want="requires a shared secret")
talk("wrong proof, 13-byte address", hello_key, lambda ch: rec(AUTH, bytes(32) + addr13),
     want="authentication failed")
talk("wrong proof, 64 KiB address", hello_key,
     lambda ch: rec(AUTH, os.urandom(32) + os.urandom(64 << 10)), want="authentication failed")
talk("AUTH body_len 2^32-1", hello_key,
     lambda ch: struct.pack("<IHHI", MAGIC, 2, AUTH, 0xFFFFFFFF), want="body")
talk("AUTH without an address", hello_key, lambda ch: rec(AUTH, bytes(32)), want="body")
talk("address before the hello", rec(AUTH, bytes(32) + addr13), want="instead of a HELLO")
talk("unknown record type", rec(77, bytes(36)), want="unknown")
talk("HELLO with unknown flags", rec(HELLO, struct.pack("<I", 0xFF) + nonce()), want="flags")
talk("truncated HELLO", hello_key[:20])
talk("random bytes", os.urandom(4096))
talk("tcp-framed garbage", struct.pack("<QIHHII", 0, 0x46534848, 1, 1, 0, 0), want="magic")
PY
running consumer || fail "the consumer died facing the raw peers"
n=$(grep -c 'ucx bootstrap: .* passed' "$SCRATCH/consumer.log")
[ "$n" -eq 0 ] || fail "$n unauthenticated peer(s) got their worker address to UCX"

# A producer with the wrong secret: a clear error on both sides.
base=(--to 127.0.0.1:$port --transport ucx --data "$data" --token-budget 4096 --hidden-size 256
    --layers 2,16,29 --source synthetic --gpus cpu:1 --connect-timeout 30)
start wrong "$PRODUCER" "${base[@]}" --secret-file "$SCRATCH/other-secret" --name wrong
expect_exit wrong 2 30
log_has wrong "refused: the consumer refused the connection: authentication failed: the producer's --secret-file differs"
log_has consumer "refused in the UCX bootstrap: authentication failed"
start nosecret "$PRODUCER" "${base[@]}" --name nosecret
expect_exit nosecret 2 30
log_has nosecret 'refused: .*requires a shared secret: start the producer with --secret-file'
running consumer || fail "the consumer died after the refused producers"

for i in 1 2; do
    start good$i "$PRODUCER" "${base[@]}" --secret-file "$SCRATCH/secret" --name good$i
done
expect_exit consumer 0 120
for i in 1 2; do expect_exit good$i 0 30; done
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == 2 * $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["duplicates"] == 0' \
    'd["checksum_failures"] == 0'
n=$(grep -c 'ucx bootstrap: .* passed (shared secret)' "$SCRATCH/consumer.log")
[ "$n" -eq 2 ] || fail "$n bootstraps passed, expected the 2 real producers'"
pass "$(tr '\n' ';' <"$SCRATCH/raw.log")"
