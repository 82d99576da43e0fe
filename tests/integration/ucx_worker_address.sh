#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx_worker_address.sh - a peer that holds the shared secret (it passes the
# HMAC proof) and then sends malformed UCX worker addresses in its AUTH: one
# byte, random bytes, an unknown address version, a truncated real-looking
# address. UCX would assert on them and abort the process; each must get a
# REFUSE naming the bad address, the consumer must live on, and a real
# producer must then complete the run.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 800 --seed 7
umask 077
head -c 48 /dev/urandom | base64 >"$SCRATCH/secret"
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
HS_LOG_LEVEL=debug start consumer "$CONSUMER" --listen 127.0.0.1:$port --transport ucx \
    --cache-gb 0.25 --epochs 1 --verify-synthetic --secret-file "$SCRATCH/secret" \
    --summary-json "$SCRATCH/summary.json"
wait_log consumer 'listening on .*HMAC auth' 30

python3 - "$port" "$SCRATCH/secret" >"$SCRATCH/raw.log" 2>&1 <<'PY' || fail "raw peers: $(cat "$SCRATCH/raw.log")"
import hashlib, hmac, os, socket, struct, sys
port, secret_path = int(sys.argv[1]), sys.argv[2]
MAGIC, HELLO, CHALLENGE, AUTH, REFUSE = 0x58555348, 1, 2, 3, 5
secret = open(secret_path, "rb").read()
if secret.endswith(b"\n"):
    secret = secret[:-1]
key = hashlib.blake2b(secret, digest_size=32).digest()  # hs_auth_load_secret

def rec(typ, body):
    return struct.pack("<IHHI", MAGIC, 2, typ, len(body)) + body

def recv_n(s, n):
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got

def auth_with(name, addr):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    client_nonce = os.urandom(32)
    hello = rec(HELLO, struct.pack("<I", 1) + client_nonce)
    s.sendall(hello)
    ch = recv_n(s, 48)
    if len(ch) != 48 or struct.unpack_from("<H", ch, 6)[0] != CHALLENGE:
        sys.exit("%s: no CHALLENGE" % name)
    server_nonce = ch[16:48]
    mac = hmac.new(key, b"hsflow-producer" + server_nonce + client_nonce +
                   hashlib.sha256(hello).digest(), hashlib.sha256).digest()
    s.sendall(rec(AUTH, mac + addr))
    head = recv_n(s, 12)
    if len(head) != 12:
        sys.exit("%s: cut off without a REFUSE" % name)
    magic, ver, typ, blen = struct.unpack("<IHHI", head)
    body = recv_n(s, blen)
    s.close()
    if typ != REFUSE:
        sys.exit("%s: the consumer answered record type %d, not a REFUSE" % (name, typ))
    text = body[4:].decode("ascii", "replace")
    if "bad UCX worker address" not in text:
        sys.exit("%s: REFUSE without the reason: %s" % (name, text))
    print("%s: %s" % (name, text))

auth_with("1-byte address", b"\x00")
auth_with("random bytes", os.urandom(200))
auth_with("address version 16", b"\x0f" + os.urandom(100))
# a v1 header, a uuid, then a device whose address claims 31 bytes it lacks
auth_with("truncated device", b"\x20" + os.urandom(8) + b"\x01\x9f" + os.urandom(4))
PY
running consumer || fail "the consumer died facing the malformed addresses"
n=$(grep -c 'refused in the UCX bootstrap: bad UCX worker address in AUTH' "$SCRATCH/consumer.log")
[ "$n" -eq 4 ] || fail "$n of 4 malformed addresses logged as refused"

start producer "$PRODUCER" --to 127.0.0.1:$port --transport ucx --data "$data" --token-budget 4096 \
    --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 --connect-timeout 30 \
    --secret-file "$SCRATCH/secret"
expect_exit consumer 0 120
expect_exit producer 0 30
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    "d['batches_planned'] == $per_epoch" \
    'd["batches_delivered"] == d["batches_planned"]' \
    'd["checksum_failures"] == 0'
pass "$(tr '\n' ';' <"$SCRATCH/raw.log")"
