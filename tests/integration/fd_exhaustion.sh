#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# fd_exhaustion.sh tcp|ucx - a consumer under a low open-file limit is
# flooded with connections until accept() fails with EMFILE. The listening
# socket stays readable then, so a loop that polls it again at once spins:
# the consumer must instead pause its listener, use (almost) no CPU and log
# a handful of lines over a few seconds of exhaustion, and once the flood is
# gone a real producer must still complete the run.
. "$(dirname "$0")/lib.sh"
mode=${1:?usage: fd_exhaustion.sh tcp|ucx}
limit=40 # the tcp consumer holds 8 descriptors when idle, the ucx one about 21
[ "$mode" = ucx ] && limit=64
window=4 # seconds of exhaustion measured

data=$SCRATCH/d.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 1500 --seed 3
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
start consumer bash -c "ulimit -n $limit && exec \"\$0\" \"\$@\"" "$CONSUMER" \
    --listen 127.0.0.1:$port --transport "$mode" --cache-gb 0.25 --epochs 1 --verify-synthetic \
    --status-interval 1 --summary-json "$SCRATCH/summary.json"
wait_log consumer "listening on" 30
pid=$(pid_of consumer)

# The flood holds its sockets open (from several loopback addresses, so
# that no per-address limit sheds them) while the consumer's CPU time and
# log lines are measured, then closes them all.
python3 - "$port" "$pid" "$SCRATCH/consumer.log" "$window" "$limit" >"$SCRATCH/flood.log" 2>&1 <<'PY' ||
import os, socket, sys, time
port, pid, log, window = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
limit = int(sys.argv[5])
tick = os.sysconf("SC_CLK_TCK")

def cpu_s():
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick  # utime + stime

def fds():
    return len(os.listdir("/proc/%d/fd" % pid))

def lines():
    return sum(1 for _ in open(log, errors="replace"))

socks = []
for i in range(150):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (2 + i // 8), 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    socks.append(s)
deadline = time.time() + 20
while time.time() < deadline and fds() < limit - 2:
    time.sleep(0.05)
if time.time() >= deadline:
    sys.exit("the consumer did not run out of descriptors (%d open)" % fds())
time.sleep(0.5)
c0, l0, t0 = cpu_s(), lines(), time.time()
time.sleep(window)
cpu, n = cpu_s() - c0, lines() - l0
print("%d fds open; over %.1f s of exhaustion: %.2f CPU-seconds, %d log lines"
      % (fds(), time.time() - t0, cpu, n))
for s in socks:
    s.close()
if cpu > 0.5 or n > 10:
    sys.exit("the consumer spins while its descriptors are exhausted")
PY
    fail "$(cat "$SCRATCH/flood.log")"
running consumer || fail "the consumer died under descriptor exhaustion"

start p0 "$PRODUCER" --to 127.0.0.1:$port --transport "$mode" --data "$data" --token-budget 4096 \
    --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 --name p0 \
    --connect-timeout 60
expect_exit consumer 0 90
expect_exit p0 0 30
expect_json "$SCRATCH/summary.json" 'd["complete"] is True' \
    "d['batches_delivered'] == $per_epoch" 'd["duplicates"] == 0'
pass "$(cat "$SCRATCH/flood.log")"
