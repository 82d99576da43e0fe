#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# metrics_flood.sh - the --metrics port asks nothing of its readers, so a
# flood of slow ones must not take the consumer's descriptors from its
# producers. 600 readers from 150 loopback addresses each send a request
# line and then one header byte every 2 s (never idle long enough to be
# closed), and reconnect when closed. While they keep at it, a producer
# connects and the run goes on, and the consumer's open descriptors stay
# under a quarter of its limit of 256 and its log does not fill; once they
# stop, GET /metrics answers again and the run completes with every batch
# once.
. "$(dirname "$0")/lib.sh"
limit=256

data=$SCRATCH/d.jsonl
synth "$data" --sequences 60 --min-len 16 --max-len 1500 --seed 3
per_epoch=$(plan_batches "$data" 4096)
reserve_port port
reserve_port mport
start consumer bash -c "ulimit -n $limit && exec \"\$0\" \"\$@\"" "$CONSUMER" \
    --listen 127.0.0.1:$port --transport tcp --cache-gb 0.25 --epochs 3 --train-ms 400 \
    --verify-synthetic --status-interval 0.2 --metrics 127.0.0.1:$mport \
    --summary-json "$SCRATCH/summary.json"
wait_log consumer "listening on" 30
wait_log consumer "metrics on http" 30
pid=$(pid_of consumer)

# The flood runs until $SCRATCH/stop appears (at most 150 s), sampling the
# consumer's open descriptors every 0.1 s; it says "flooding" once every
# reader has connected at least once and writes the largest count seen.
cat >"$SCRATCH/flood.py" <<'PY'
import json, os, socket, sys, time
port, pid, stop, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]

def fds():
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0

def reader(i):
    s = socket.socket()
    s.bind(("127.0.0.%d" % (2 + i // 4), 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except (BlockingIOError, OSError):
        pass
    return [s, False]  # socket, request line sent

readers = [reader(i) for i in range(600)]
most, reconnects, t_end = 0, 0, time.time() + 150
next_byte, said = 0.0, False
while time.time() < t_end and not os.path.exists(stop):
    most = max(most, fds())
    if time.time() >= next_byte:
        next_byte = time.time() + 2
        for i, r in enumerate(readers):
            try:
                r[0].send(b"X-Slow: a" if r[1] else b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                r[1] = True
            except BlockingIOError:
                pass  # still connecting, or the consumer reads nothing: both fine
            except OSError:
                r[0].close()  # closed by the consumer: come back at once
                readers[i] = reader(i)
                reconnects += 1
        if not said:
            print("flooding: 600 readers", flush=True)
            said = True
    time.sleep(0.1)
for r in readers:
    r[0].close()
json.dump({"most_fds": most, "reconnects": reconnects}, open(out, "w"))
print("most descriptors open in the consumer: %d, reconnects: %d" % (most, reconnects))
PY
start flood python3 "$SCRATCH/flood.py" "$mport" "$pid" "$SCRATCH/stop" "$SCRATCH/flood.json"
wait_log flood "flooding" 30
sleep 3 # the consumer has taken what it takes of the flood

start p0 "$PRODUCER" --to 127.0.0.1:$port --transport tcp --data "$data" --token-budget 4096 \
    --hidden-size 256 --layers 2,16,29 --source synthetic --gpus cpu:1 --name p0 \
    --connect-timeout 60
wait_delivered consumer 3 60
running flood || fail "the flood ended early: $(cat "$SCRATCH/flood.log")"
touch "$SCRATCH/stop"
expect_exit flood 0 30
most=$(json_get "$SCRATCH/flood.json" most_fds)
[ "$most" -lt $((limit / 4)) ] ||
    fail "the metrics flood held the consumer at $most open descriptors (limit $limit)"

python3 - "$mport" <<'PY' || fail "GET /metrics after the flood"
import sys, time, urllib.request
deadline = time.time() + 20
while True:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read()
        break
    except OSError as e:
        if time.time() > deadline:
            raise SystemExit("no answer within 20 s: %s" % e)
        time.sleep(0.2)
assert b"hsflow_batches_delivered_total" in text
PY
expect_exit consumer 0 120
expect_exit p0 0 30
# the readers' hang-ups are the HTTP server's debug lines, not the log's bulk
others=$(grep -cv 'batches (' "$SCRATCH/consumer.log")
[ "$others" -lt 60 ] || fail "the flood filled the consumer's log ($others lines besides status)"
expect_json "$SCRATCH/summary.json" 'd["complete"] is True' \
    "d['batches_delivered'] == 3 * $per_epoch" 'd["duplicates"] == 0'
pass "$(tail -n 1 "$SCRATCH/flood.log")"
