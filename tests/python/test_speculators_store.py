# SPDX-License-Identifier: Apache-2.0
"""An hsflow store as speculators' own loaders read it, in .venv-engines.

hs-producer --source model (the built-in CPU forward of a tiny random Llama
whose norm weights are random, so a norm applied twice shows) fills a store
through hs-consumer --store; `hsflow-data store export --normed-final-state`
writes speculators' offline layout. speculators' own ArrowDataset over its
own file backend then sees exactly the dataset's samples and the store's
states, row by row; and the verifier's top token recomputed from the exported
targets as speculators' drafter computes it (verifier_lm_head(verifier_norm(
last layer)), with verifier_norm an identity, as use_normed_targets
makes it for such files) equals the verifier's own on every token, where the
norm applied again misses most of them."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

speculators = pytest.importorskip(
    "speculators", reason="speculators is not installed here; run scripts/install-engine-"
    "venv and these tests through tests/python/engine_venv.sh")
torch = pytest.importorskip("torch")

from test_speculators import N_LAYERS, VOCAB, build, target  # noqa: E402,F401 (a fixture)

import hsflow  # noqa: E402
from hsflow.data.store import Store  # noqa: E402
from hsflow.integrations import speculators as hs_spec  # noqa: E402

LAYERS = hs_spec.eagle3_layers(N_LAYERS)  # 2,4,5,8: the drafter's default ids, then N


def fill_store(target, data, store, budget=384):
    consumer = hsflow.find_tool("hs-consumer")
    cmd = [consumer, "--loopback", "1", "--cache-gb", "0.05", "--epochs", "1", "--store", store,
           "--status-interval", "0", "--", "--data", data, "--token-budget", str(budget),
           "--source", "model", "--model", target, "--gpus", "cpu:1",
           "--layers", ",".join(map(str, LAYERS))]
    for _ in range(4):  # a batch the writer skipped is stored by the next run
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        with Store(store) as st:
            if not st.missing():
                return st.n_batches
    pytest.fail("the store is still incomplete after 4 runs")


MARGIN = 0.08  # > 4x the largest logit difference bf16 states and the CPU forward make (0.018)


def verifier_model(target):  # noqa: F811
    """The verifier as the producer runs it: its weights in bf16, computed in fp32."""
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(target).to(torch.bfloat16).float().eval()


def clear_samples(target, n, seed):  # noqa: F811
    """n random samples (8..24 tokens) on each token of which the verifier's
    top token leads the next by more than MARGIN, so that rounding the states
    to bf16 cannot move it: equality on every token is then the claim."""
    verifier, g, rows = verifier_model(target), torch.Generator().manual_seed(seed), []
    for _ in range(4000):
        ids = torch.randint(0, VOCAB, (int(torch.randint(8, 25, (1,), generator=g)),),
                            generator=g)
        with torch.no_grad():
            top2 = verifier(input_ids=ids[None]).logits[0].topk(2, dim=-1).values
        if float((top2[:, 0] - top2[:, 1]).min()) > MARGIN:
            cut = int(torch.randint(1, 4, (1,), generator=g))
            rows.append((ids.tolist(), [0] * cut + [1] * (len(ids) - cut)))
            if len(rows) == n:
                return rows
    pytest.fail("fewer than %d clear samples in 4000 drawn" % n)


@pytest.fixture(scope="module")
def exported(target, tmp_path_factory):  # noqa: F811
    import json
    tmp = tmp_path_factory.mktemp("export")
    data = str(tmp / "d.jsonl")
    rows = clear_samples(target, 24, seed=11)
    with open(data, "w") as f:
        for ids, mask in rows:
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    store = str(tmp / "store")
    fill_store(target, data, store)
    out = str(tmp / "offline")
    r = subprocess.run([sys.executable, "-m", "hsflow.data", "store", "export", store, out,
                        "--verifier", target, "--normed-final-state"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return rows, store, out


def test_speculators_file_backend_sees_the_same_samples_and_states(exported):
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset
    from pathlib import Path
    rows, store, out = exported
    ds = ArrowDataset(max_len=4096, datapath=out, on_missing="raise", train_ratio=1.0,
                      transfer=FileTransfer(Path(out) / "hidden_states"))
    assert len(ds) == len(rows)
    with Store(store) as st:
        states = {}
        for b in sorted(st.loc):
            for sid, tok, mask, hid in st.samples(b, st.read(b)):
                states[sid] = hid.copy()
    sids = ds.data.with_format(None)["sample_id"]
    assert sorted(sids) == list(range(len(rows)))
    for i in range(len(ds)):
        item = ds[i]
        sid = sids[i]
        ids, mask = rows[sid]
        assert not isinstance(item, speculators.train.recovery.SampleUnavailable), i
        assert item["input_ids"].tolist() == ids
        assert item["loss_mask"].tolist() == mask
        assert ds.approx_lengths[i] == len(ids)
        want = torch.from_numpy(states[sid].astype(np.int16)).view(torch.bfloat16)
        T = len(ids)
        assert torch.equal(item["hidden_states"], want[:, :-1].reshape(T, -1))
        assert torch.equal(item["verifier_last_hidden_states"], want[:, -1])


def test_verifier_top_token_from_the_exported_targets_is_the_verifiers_own(exported, target):  # noqa: F811,E501
    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset
    from pathlib import Path
    rows, _, out = exported
    verifier = verifier_model(target)
    ds = ArrowDataset(max_len=4096, datapath=out, on_missing="raise", train_ratio=1.0,
                      transfer=FileTransfer(Path(out) / "hidden_states"))
    plain = build("eagle3", target)              # the norm applied again
    m = hs_spec.use_normed_targets(build("eagle3", target))
    tokens = same = twice_same = 0
    worst_margin, worst_diff = float("inf"), 0.0
    with torch.no_grad():
        for i in range(len(ds)):
            item = ds[i]
            own = verifier(input_ids=item["input_ids"][None]).logits[0]
            top2 = own.topk(2, dim=-1).values
            worst_margin = min(worst_margin, float((top2[:, 0] - top2[:, 1]).min()))
            last = item["verifier_last_hidden_states"].float()
            twice = plain.verifier_lm_head(plain.verifier_norm(last)).argmax(-1)
            logits = m.verifier_lm_head(m.verifier_norm(last))
            got = logits.argmax(-1)
            worst_diff = max(worst_diff, float((logits - own).abs().max()))
            tokens += len(got)
            same += int((got == own.argmax(-1)).sum())
            twice_same += int((twice == own.argmax(-1)).sum())
    print("top token: %d of %d tokens equal; norm applied twice: %d; worst top-2 margin %.4f, worst |logit diff| %.5f"
          % (same, tokens, twice_same, worst_margin, worst_diff))
    assert same == tokens
    assert twice_same < 0.9 * tokens, "the norm applied twice went unseen"


# -- speculators' own train CLI on the store: hsflow-speculators-train ---------

CPU_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "speculators_cpu.py")


@pytest.fixture(scope="module")
def rows_only(exported, target, tmp_path_factory):  # noqa: F811
    rows, store, _ = exported
    out = str(tmp_path_factory.mktemp("rows") / "rows")
    r = subprocess.run([sys.executable, "-m", "hsflow.data", "store", "export", store, out,
                        "--format", "rows", "--verifier", target], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.join(out, "hidden_states"))
    return rows, store, out


def test_the_hsflow_backend_serves_each_row_as_the_file_backend_does(exported, rows_only):
    from hs_connectors import FileTransfer, HiddenStatesBackend
    from pathlib import Path
    from types import SimpleNamespace as NS
    from hsflow.integrations import speculators_train  # noqa: F401 (registers "hsflow")
    rows, store, files = exported
    _, _, out = rows_only
    hs = HiddenStatesBackend.registry["hsflow"].from_train_args(NS(hsflow_store=None), out)
    assert hs.store_path == os.path.abspath(store)  # from hsflow_export.json
    fs = FileTransfer(Path(files) / "hidden_states")
    import pickle
    hs2 = pickle.loads(pickle.dumps(hs))  # as speculators' spawned loader workers get it
    for i in range(len(rows)):
        a, b, c = hs.get_cached(i), fs.get_cached(i), hs2.get_cached(i)
        for key in ("hidden_states", "token_ids"):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), (i, key)
            assert torch.equal(c[key], b[key])
    with pytest.raises(Exception, match="outside the %d rows" % len(rows)):
        hs.get_cached(len(rows))


def run_train(args, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, CPU_LAUNCHER] + args, capture_output=True, text=True,
                       env=env, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("alg", ["eagle3", "dflash"])
def test_hsflow_speculators_train_trains_an_epoch_with_its_scheduler_and_validation(
        rows_only, target, tmp_path, alg):  # noqa: F811
    _, _, out = rows_only
    save = str(tmp_path / "ckpt")
    extra = ["--block-size", "4", "--max-anchors", "16"] if alg == "dflash" else []
    rc, log = run_train([
        "--data-path", out, "--hidden-states-backend", "hsflow", "--verifier-name-or-path",
        target, "--speculator-type", alg, "--num-layers", "1", "--epochs", "1",
        "--total-seq-len", "128", "--num-workers", "0", "--draft-attn-impl", "sdpa",
        "--loss-implementation", "eager", "--save-path", save, "--log-dir", str(tmp_path / "logs"),
        "--mask-token-id", str(VOCAB - 1), "--scheduler-type", "cosine",
        "--scheduler-warmup-steps", "2", "--train-data-ratio", "0.75", "--lr", "1e-3"] + extra)
    assert rc == 0, log[-6000:]
    assert "verifier_norm passes them through" in log, log[-3000:]
    assert "Training epoch 1/1 completed" in log and "Validation epoch 1/1 completed" in log, \
        log[-3000:]
    lrs = [float(x) for x in re.findall(r"lr/\w+=([\d.e+-]+)", log)]
    assert lrs and lrs[0] < 1e-3, lrs  # warm-up: the first step's rate is below --lr
    losses = [float(x) for x in re.findall(r"val/loss_epoch=([\d.]+)", log)]
    assert len(losses) == 1 and losses[0] > 0, log[-3000:]
    # speculators' own checkpoint: its save_pretrained, the drafter vLLM loads
    assert os.path.isfile(os.path.join(save, "0", "config.json"))
    assert any(f.endswith(".safetensors") for f in os.listdir(os.path.join(save, "0")))
