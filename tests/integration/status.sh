#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# status.sh - the consumer's status line says what start-up waits for, then
# epoch e/E, the share of the run, ETAs for the epoch and the run and, from
# the measured rates, which side is the limit: a slow trainer (--train-ms)
# behind fast producers is named as the limit in the status lines of both
# sides, the summary line and the summary JSON.
. "$(dirname "$0")/lib.sh"

data=$SCRATCH/d.jsonl
synth "$data" --sequences 150 --min-len 16 --max-len 400 --seed 4
reserve_port port
start consumer "$CONSUMER" --listen 127.0.0.1:$port --epochs 2 --cache-gb 0.015 --train-ms 150 \
    --transport tcp --status-interval 0.2 --summary-json "$SCRATCH/summary.json"
wait_log consumer 'waiting for the first producer' 30
start p1 env HS_STATUS_INTERVAL=0.2 "$PRODUCER" --to 127.0.0.1:$port --transport tcp \
    --data "$data" --token-budget 1024 --hidden-size 512 --layers 1,2 --source synthetic --gpus cpu:1
expect_exit consumer 0 120
expect_exit p1 0 30
# the ETAs once the recent window is stable (5 s), unknown before
log_has consumer 'epoch 1/2 \| [0-9]+/[0-9]+ batches \([0-9.]+%\) \| .* ETA epoch \?, run \? \| cache'
log_has consumer 'epoch [12]/2 \| [0-9]+/[0-9]+ batches \([0-9.]+%\) \| .* ETA epoch [0-9hms]+, run [0-9hms]+ \| cache'
log_has consumer 'epoch 2/2 \| '
# rates and starve over the last 30 s with the run's in brackets
log_has consumer '\| [0-9]+ tok/s \(run [0-9]+\) \| .* \| starve [0-9]+% \(run [0-9]+%\) \| verify [0-9]+% \|'
log_has consumer 'the trainer is the limit: it takes [0-9.e+]+ batch/s, producers wait for tickets'
log_has consumer 'hsflow summary: epoch 2/2, 100.0% of the run; .*the trainer is the limit'
# the summary's figures are the last status line's (not 0 batch/s after 13.3)
python3 - "$SCRATCH/consumer.log" <<'PY' || fail "the summary's trainer rate differs from the status"
import re, sys
rates = [(l.startswith("hsflow summary"), float(m.group(1))) for l in open(sys.argv[1])
         for m in [re.search(r"the trainer is the limit: it takes ([0-9.e+]+) batch/s", l)] if m]
status = [r for summary, r in rates if not summary]
summary = [r for s, r in rates if s]
assert status and summary, rates
assert 0.7 * status[-1] <= summary[-1] <= 1.3 * status[-1], (status[-3:], summary)
PY
log_has p1 'epoch [12]/2 \| [0-9]+ batches .* the consumer is the limit: workers wait for tickets'
expect_json "$SCRATCH/summary.json" \
    'd["complete"] is True' \
    'd["epoch"] == 2 and d["run_pct"] == 100' \
    'd["eta_run_s"] == 0 and d["eta_epoch_s"] == 0' \
    'd["bottleneck"] == "trainer"' \
    'd["bottleneck_text"].startswith("the trainer is the limit")' \
    '0 < d["supply_batches_per_s"] <= d["trainer_batches_per_s"] < 1000 / 150 * 1.2'
pass
