# SPDX-License-Identifier: Apache-2.0
"""examples/ddp_drafter.py under torchrun: 2 gloo ranks on the CPU, each with
its own consumer (rank and world from torchrun), fed by local hs-producer
processes that connect to both; the ranks train on the same number of
batches, disjoint, and together cover the kept batches of each epoch."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, have_torch
from ports import reserve_port

EXAMPLE = os.path.join(ROOT, "examples", "ddp_drafter.py")




def test_ddp_drafter_help_works_without_torch():
    r = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--base-port" in r.stdout and "--loopback" in r.stdout


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_two_gloo_ranks_train_on_equal_disjoint_shards(dataset, producer_bin):
    port = reserve_port(2)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", EXAMPLE, "--vocab", "64", "--epochs", "2", "--cache-gb", "0.02",
           "--base-port", str(port), "--verify-synthetic", "--loopback", "2", "--",
           "--data", dataset[0], "--token-budget", "512", "--hidden-size", "16", "--layers",
           "1,2", "--source", "synthetic", "--gpus", "cpu:1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    got = dict((int(m.group(1)), (int(m.group(2)), int(m.group(3)))) for m in re.finditer(
        r"ddp_drafter rank (\d)/2: (\d+) batches, (\d+) tokens, \d+ tokens/s, waited for data "
        r"[\d.]+ s .*?duplicates 0", out))
    assert set(got) == {0, 1}, out
    assert got[0][0] == got[1][0] > 0
    # every batch but at most one per epoch (--uneven drop) is trained on, once
    total = 2 * sum(len(ids) for ids, _ in dataset[1])
    assert got[0][1] + got[1][1] <= total
