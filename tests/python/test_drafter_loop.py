# SPDX-License-Identifier: Apache-2.0
"""examples/drafter_loop.py runs on the CPU against local hs-producer
processes (--loopback), trains on every batch of the run, and reports
tokens/s and the time it waited for data."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, have_torch

EXAMPLE = os.path.join(ROOT, "examples", "drafter_loop.py")


def run_example(args, timeout=100):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    return subprocess.run([sys.executable, EXAMPLE] + args, capture_output=True, text=True,
                          env=env, timeout=timeout)


def producer_args(data):
    return ["--data", data, "--token-budget", "512", "--hidden-size", "16", "--layers", "1,2",
            "--source", "synthetic", "--gpus", "cpu:1"]


def test_drafter_loop_help_works_without_torch():
    r = run_example(["--help"])
    assert r.returncode == 0, r.stderr
    assert "--loopback" in r.stdout and "--vocab" in r.stdout and "--device" in r.stdout


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_drafter_loop_trains_on_every_batch_on_cpu_and_reports_its_figures(dataset, producer_bin):
    r = run_example(["--device", "cpu", "--vocab", "64", "--epochs", "2", "--log-every", "2",
                     "--cache-gb", "0.02", "--verify-synthetic", "--loopback", "2", "--"]
                    + producer_args(dataset[0]))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = re.search(r"drafter_loop: (\d+) batches, (\d+) tokens .* tokens/s, waited for data "
                  r"[\d.]+ s .*consumer: (\d+)/(\d+) batches.* 0 checksum failures", out)
    assert m, out
    batches, tokens, delivered, planned = map(int, m.groups())
    assert batches == delivered == planned > 2
    assert tokens == 2 * sum(len(ids) for ids, _ in dataset[1])
    assert re.search(r"batch +2 \| epoch \d \| loss [\d.]+ \| \d+ tokens/s", out), out


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_drafter_loop_stops_cleanly_after_max_batches(dataset, producer_bin):
    r = run_example(["--device", "cpu", "--vocab", "64", "--max-batches", "3", "--cache-gb",
                     "0.02", "--loopback", "1", "--"] + producer_args(dataset[0]))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "drafter_loop: 3 batches" in out, out


def test_drafter_loop_loopback_without_producer_arguments_is_a_usage_error():
    r = run_example(["--loopback", "2"])
    assert r.returncode == 2 and "needs hs-producer arguments" in r.stderr
