# SPDX-License-Identifier: Apache-2.0
"""Consumer.stats() and status_line() name the epoch, the share of the run,
the ETAs and, from the measured rates, the side that limits the run: a
producer slower than the trainer makes "producers are the limit"; a trainer
slower than the producer makes "the trainer is the limit"."""
import time

import hsflow
from conftest import ConsumerThread

H, LAYERS, BUDGET = 32, [0, 2], 256


def run(data, slow):
    """One run of 2 epochs in which `slow` ("producer" or "trainer") is the
    limit by a margin measured, not assumed: per batch, that side sleeps 3x
    the median of what the other side's own work has taken per batch so
    far, or 50 ms (a trainer 100 ms), whichever is longer (loaded, or under
    a sanitizer, the other side is slower too, and a fixed sleep was no
    margin). A slow trainer gets a cache of a few batches, so the producer
    really waits for it (with room for the whole run it never would: it
    would finish, leave, and its last figures would say nothing of the
    trainer), and a lease that makes the producer report every 1.5 s."""
    work = {"producer": [], "trainer": []}  # seconds per batch

    def pace(side):
        other = sorted(work["trainer" if side == "producer" else "producer"])
        if side == slow:  # the median: a first batch that waits for the link is no pace
            least = 0.1 if side == "trainer" else 0.05  # a slow trainer's run spans heartbeats
            time.sleep(min(1.0, max(least, 3 * (other[len(other) // 2] if other else 0))))

    def worked(side, t0):
        work[side].append(time.monotonic() - t0)

    # a slow trainer: batches of ~0.5 MB (H=512) in a cache of 2 MiB; else the whole run fits
    h, cache_gb = (512, 0.002) if slow == "trainer" else (H, 0.02)
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=cache_gb, epochs=2, arrays="numpy",
                         lease_timeout_s=6) as c:
        lines = []

        def train(b):
            t0 = time.monotonic()
            if len(lines) < 1000:
                lines.append(c.status_line())
            time.sleep(0.005)  # a step: the trainer's rate needs time with data to measure
            worked("trainer", t0)
            pace("trainer")

        ct = ConsumerThread(c, train, deadline_s=120)
        with hsflow.Producer(to="127.0.0.1:%d" % c.port, data=data, token_budget=BUDGET,
                             hidden_size=h, layers=LAYERS, connect_timeout_s=20,
                             arrays="numpy", target="synthetic") as p:
            for t in p.tickets():
                pace("producer")
                t0 = time.monotonic()
                t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens,
                                                             t.layers, h))
                worked("producer", t0)
        ct.join(120)
        return c.stats(), c.status_line(), lines


def test_a_slow_producer_is_named_the_limit(dataset):
    data, _ = dataset
    s, line, lines = run(data, slow="producer")
    assert s["finished"] and s["epoch"] == 2 and s["run_pct"] == 100
    assert s["bottleneck"] == "producers", s
    assert s["bottleneck_text"].startswith("producers are the limit: "), s["bottleneck_text"]
    assert s["supply_batches_per_s"] < s["trainer_batches_per_s"]
    assert "epoch 2/2 |" in line and "(100.0%)" in line and "ETA epoch 0s, run 0s" in line, line
    assert any(l.startswith("epoch 1/2 |") for l in lines), lines[:3]


def test_a_slow_trainer_is_named_the_limit(dataset):
    data, _ = dataset
    s, line, _ = run(data, slow="trainer")
    assert s["bottleneck"] == "trainer", s
    assert s["bottleneck_text"].startswith("the trainer is the limit: it takes "), s
    assert "the trainer is the limit" in line, line
    assert s["eta_run_s"] == 0
