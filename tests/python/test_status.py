# SPDX-License-Identifier: Apache-2.0
"""Consumer.stats() and status_line() name the epoch, the share of the run,
the ETAs and, from the measured rates, the side that limits the run: a
producer slower than the trainer makes "producers are the limit"; a trainer
slower than the producer makes "the trainer is the limit"."""
import time

import hsflow
from conftest import ConsumerThread

H, LAYERS, BUDGET = 32, [0, 2], 256


def run(data, produce_s, train_s):
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, arrays="numpy") as c:
        lines = []

        def train(b):
            time.sleep(train_s)
            if len(lines) < 1000:
                lines.append(c.status_line())

        ct = ConsumerThread(c, train, deadline_s=90)
        with hsflow.Producer(to="127.0.0.1:%d" % c.port, data=data, token_budget=BUDGET,
                             hidden_size=H, layers=LAYERS, connect_timeout_s=20,
                             arrays="numpy") as p:
            for t in p.tickets():
                time.sleep(produce_s)
                t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens,
                                                             t.layers, H))
        ct.join(90)
        return c.stats(), c.status_line(), lines


def test_a_slow_producer_is_named_the_limit(dataset):
    data, _ = dataset
    s, line, lines = run(data, produce_s=0.05, train_s=0)
    assert s["finished"] and s["epoch"] == 2 and s["run_pct"] == 100
    assert s["bottleneck"] == "producers", s
    assert s["bottleneck_text"].startswith("producers are the limit: "), s["bottleneck_text"]
    assert s["supply_batches_per_s"] < s["trainer_batches_per_s"]
    assert "epoch 2/2 |" in line and "(100.0%)" in line and "ETA epoch 0s, run 0s" in line, line
    assert any(l.startswith("epoch 1/2 |") for l in lines), lines[:3]


def test_a_slow_trainer_is_named_the_limit(dataset):
    data, _ = dataset
    s, line, _ = run(data, produce_s=0, train_s=0.05)
    assert s["bottleneck"] == "trainer", s
    assert s["bottleneck_text"].startswith("the trainer is the limit: it takes "), s
    assert "the trainer is the limit" in line, line
    assert s["eta_run_s"] == 0
