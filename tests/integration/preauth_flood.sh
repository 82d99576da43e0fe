#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# preauth_flood.sh tcp|ucx - 200 unauthenticated connections (50 from one
# address, 150 from as many others) each send as much of a maximal frame as
# they may, never completing it, and stay connected. What they cost the
# consumer (VmRSS after the flood minus before) must stay under 64 MiB, and
# real producers arriving in the middle of them must complete the run.
#   tcp  frames on the TCP framing: half announce the protocol's 4 MiB body,
#        half the 64 KiB a peer may send before it is admitted;
#   ucx  the bootstrap with a secret: each sends a HELLO, then an AUTH
#        announcing the largest worker address (64 KiB).
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: preauth_flood.sh tcp|ucx}
budget_mib=64

data=$SCRATCH/d.jsonl
synth "$data" --sequences 120 --min-len 16 --max-len 1500 --seed 8
per_epoch=$(plan_batches "$data" 4096)
umask 077
head -c 48 /dev/urandom | base64 >"$SCRATCH/secret"
reserve_port port
# a handshake timeout longer than the test keeps the flood connected
start consumer "$CONSUMER" --listen 127.0.0.1:$port --handshake-timeout 120 \
    --transport "$mode" --cache-gb 0.25 --epochs 2 --verify-synthetic \
    --secret-file "$SCRATCH/secret" --summary-json "$SCRATCH/summary.json"
wait_log consumer "listening on" 30
pid=$(pid_of consumer)

mkfifo "$SCRATCH/flood.ctl"
python3 - "$port" "$pid" "$mode" "$budget_mib" "$SCRATCH/flood.ctl" >"$SCRATCH/flood.log" 2>&1 <<'PY' &
import os, socket, struct, sys, time
port, pid, mode, budget, ctl = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]

def rss_kib():
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def message(i):
    if mode == "tcp":  # prefix (no payload) | header | body, all but the last byte
        body = (4 << 20) - 64 if i % 2 else 64 << 10
        head = struct.pack("<QIHHII", 0, 0x46534848, 1, 1, body, 0)
    else:  # HELLO with the secret flag, then an AUTH with the largest address
        body = 32 + (64 << 10)
        head = struct.pack("<IHHI", 0x58555348, 2, 1, 36) + struct.pack("<I", 1) + os.urandom(32)
        head += struct.pack("<IHHI", 0x58555348, 2, 3, body)
    return memoryview(head + os.urandom(body - 1))

before = rss_kib()
conns = []
for i in range(200):
    s = socket.socket()
    s.bind(("127.0.0.2" if i < 50 else "127.0.%d.%d" % (1 + (i - 50) // 200, 3 + (i - 50) % 200), 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    conns.append([s, message(i), 0])
deadline = time.time() + 40
idle_since = None
while time.time() < deadline:  # until nobody could send for 2 s
    busy = False
    for c in conns:
        s, msg, off = c
        if s is None or off >= len(msg):
            continue
        try:
            n = s.send(msg[off:off + (1 << 20)])
            c[2] += n
            busy = busy or n > 0
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # cut off by the consumer
            s.close()
            c[0] = None
    if busy:
        idle_since = None
        continue
    idle_since = idle_since or time.time()
    if time.time() - idle_since > 2:
        break
    time.sleep(0.1)
time.sleep(1.0)
after = rss_kib()
sent = sum(c[2] for c in conns)
alive = sum(1 for c in conns if c[0] is not None)
print("flood: %d connections, %.1f MiB sent, %d still open; consumer VmRSS %.1f -> %.1f MiB "
      "(+%.1f MiB)" % (len(conns), sent / 2**20, alive, before / 1024, after / 1024,
                       (after - before) / 1024))
sys.stdout.flush()
with open(ctl, "w") as f:  # measured: the real producers may come
    f.write("%d\n" % (after - before))
time.sleep(100)  # the script kills us once the run is over
PY
flood_pid=$!
PID_OF[flood]=$flood_pid
read -r -t 120 grew_kib <"$SCRATCH/flood.ctl" || fail "the flood did not finish: $(cat "$SCRATCH/flood.log")"
running consumer || fail "the consumer died under the flood"
[ "$grew_kib" -le $((budget_mib * 1024)) ] ||
    fail "unauthenticated connections cost the consumer more than $budget_mib MiB: $(cat "$SCRATCH/flood.log")"

for i in 1 2; do
    start p$i "$PRODUCER" --to 127.0.0.1:$port --transport "$mode" --data "$data" \
        --token-budget 4096 --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 \
        --secret-file "$SCRATCH/secret" --name p$i --connect-timeout 60
done
expect_exit consumer 0 120
for i in 1 2; do expect_exit p$i 0 30; done
expect_json "$SCRATCH/summary.json" 'd["complete"] is True' \
    "d['batches_delivered'] == 2 * $per_epoch" 'd["duplicates"] == 0'
pass "$(head -n 1 "$SCRATCH/flood.log")"
