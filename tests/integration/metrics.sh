#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# metrics.sh - the consumer's Prometheus endpoint serves its figures during
# a run (GET /metrics, with the epoch, progress and hsflow_bottleneck), and
# GET /healthz its state as JSON, refuses other paths, and --stats-jsonl writes one
# parseable JSON object per line whose counters only grow.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 200 --min-len 16 --max-len 2000 --seed 5
reserve_port mport
start consumer "$CONSUMER" --loopback 2 --cache-gb 0.25 --epochs 3 --train-ms 25 \
    --status-interval 0.2 --metrics 127.0.0.1:$mport --stats-jsonl "$SCRATCH/stats.jsonl" \
    --summary-json "$SCRATCH/summary.json" -- \
    --data "$data" --token-budget 4096 --hidden-size 256 --layers 2,16,29 \
    --source synthetic --gpus cpu:1
wait_delivered consumer 5 60
python3 - "$mport" <<'PY' || fail "metrics endpoint"
import sys, urllib.request, urllib.error
base = "http://127.0.0.1:%s" % sys.argv[1]
text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
values = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and l[0] != "#"}
assert values["hsflow_batches_delivered_total"] >= 5, values
assert values["hsflow_batches_planned"] > 0, values
assert values["hsflow_checksum_failures_total"] == 0, values
assert "# TYPE hsflow_cache_used_bytes gauge" in text
# The limit as an enum: one series per value, exactly one of them 1.
limits = {k: v for k, v in values.items() if k.startswith("hsflow_bottleneck{")}
assert sorted(limits) == ['hsflow_bottleneck{limit="%s"}' % n for n in
                          ("balanced", "network", "producers", "trainer", "unknown",
                                    "verify")], limits
assert sum(limits.values()) == 1, limits
assert 1 <= values["hsflow_epoch"] <= values["hsflow_epochs"] == 3, values
assert 0 < values["hsflow_run_ratio"] <= 1, values
import json
health = urllib.request.urlopen(base + "/healthz", timeout=10)
h = json.loads(health.read().decode())
assert health.headers["Content-Type"] == "application/json", health.headers
assert h["status"] == "ok" and h["epochs"] == 3 and h["version"], h
assert h["bottleneck"] in ("unknown", "producers", "trainer", "network", "verify", "balanced"), h
# the recent window beside the run's averages
assert 0 < values["hsflow_window_seconds"] <= 30.5, values
assert values["hsflow_recent_tokens_per_second"] > 0, values
assert 0 <= values["hsflow_recent_verify_busy_ratio"] <= 1.01, values
try:
    urllib.request.urlopen(base + "/other", timeout=10)
    raise SystemExit("a path other than /metrics was served")
except urllib.error.HTTPError as e:
    assert e.code == 404, e.code
PY
expect_exit consumer 0 120
python3 - "$SCRATCH/stats.jsonl" <<'PY' || fail "stats jsonl"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) >= 2, len(rows)
delivered = [r["batches_delivered"] for r in rows]
assert delivered == sorted(delivered), delivered
assert rows[-1]["complete"] is True, rows[-1]
assert all("cache_used" in r and "time" in r for r in rows)
import time
# "time" is wall-clock Unix seconds (within a day of now), the monotonic
# clock is kept as "monotonic_s"; both increase.
assert all(abs(r["time"] - time.time()) < 86400 for r in rows), rows[0]["time"]
walls = [r["time"] for r in rows]
monos = [r["monotonic_s"] for r in rows]
assert walls == sorted(walls) and monos == sorted(monos), (walls, monos)
PY
pass "metrics endpoint and stats JSON lines"
