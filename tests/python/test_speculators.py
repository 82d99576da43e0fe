# SPDX-License-Identifier: Apache-2.0
"""hsflow.integrations.speculators against speculators 0.9 itself.

Runs in .venv-engines (scripts/install-engine-venv: speculators
pins torch <= 2.14.1 and transformers <= 5.19), through engine_venv.sh,
which reports the test skipped (77) when that venv is absent. The target is
a tiny Llama with random weights (its norms' weights random too, so that a
norm applied twice shows), written to a temporary folder."""
import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

speculators = pytest.importorskip(
    "speculators", reason="speculators is not installed here; run scripts/install-engine-"
    "venv and these tests through tests/python/engine_venv.sh")
torch = pytest.importorskip("torch")

from conftest import ROOT, write_dataset  # noqa: E402

import hsflow  # noqa: E402
from hsflow import _hf  # noqa: E402
from hsflow.integrations import speculators as hs_spec  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "examples"))
import train_speculators  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "train_speculators.py")
N_LAYERS, HIDDEN, VOCAB = 8, 64, 96


def write_config(path, n_layers, hidden=HIDDEN):
    os.makedirs(path, exist_ok=True)
    from transformers import LlamaConfig
    LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                num_hidden_layers=n_layers, num_attention_heads=4, num_key_value_heads=2,
                head_dim=hidden // 4, max_position_embeddings=512,
                tie_word_embeddings=False).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def target(tmp_path_factory):
    """A tiny random Llama target folder: 8 layers, H=64, vocab 96."""
    from transformers import LlamaConfig, LlamaForCausalLM
    path = str(tmp_path_factory.mktemp("target"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=N_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, initializer_range=0.1,
                      tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # norms of random weight: a norm applied twice differs
        for p in m.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) * 1.5 + 0.25)
    m.save_pretrained(path)
    return path


def build(alg, target, *extra):
    args = train_speculators.parse_args(["--algorithm", alg, "--target", target,
                                         "--mask-token-id", str(VOCAB - 1), "--num-layers",
                                         "1"] + list(extra))
    flat = train_speculators.speculators_config(args, on_gpu=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _ = train_speculators.build_model(args, flat)
    return model


# -- layer ids ----------------------------------------------------------------

# SpecForge's build_target_layer_ids (specforge/modeling/draft/dflash.py, the
# DFlash authors' rule): 0-based decoder layer ids, read as HF
# output_hidden_states[id + 1] (its extract_context_feature, offset 1).
def specforge_build_target_layer_ids(num_target_layers, num_draft_layers):
    if num_draft_layers == 1:
        return [(num_target_layers // 2)]
    start = 1
    end = num_target_layers - 3
    span = end - start
    return [int(round(start + (i * span) / (num_draft_layers - 1)))
            for i in range(num_draft_layers)]


TARGET_DEPTHS = (7, 8, 16, 24, 28, 32, 36, 40, 48, 61, 64, 80)


def test_eagle3_layers_are_speculators_default_target_layer_ids_then_L(tmp_path):
    from speculators.models.utils import resolve_target_layer_ids
    for n in TARGET_DEPTHS:
        cfg = write_config(str(tmp_path / str(n)), n)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # speculators warns that it picked defaults
            ids = resolve_target_layer_ids(None, cfg)
        assert hs_spec.speculators_default_layer_ids(n) == ids
        assert hs_spec.eagle3_layers(n) == ids + [n], n
    for n in (4, 5, 6):  # [2, N//2, N-3] repeats a layer: both refuse
        cfg = write_config(str(tmp_path / str(n)), n)
        with pytest.raises(ValueError, match="invalid"):
            resolve_target_layer_ids(None, cfg)
        with pytest.raises(ValueError, match="not distinct layers of a %d-layer target" % n):
            hs_spec.eagle3_layers(n)


def test_hsflow_eagle3_layers_flag_is_speculators_default_then_L():
    if not hasattr(_hf, "eagle3_layers"):
        pytest.skip("hsflow._hf.eagle3_layers (the producers' --eagle3-layers) is not in this "
                    "tree yet; hsflow.integrations.speculators.eagle3_layers is the set it must "
                    "give")
    for n in TARGET_DEPTHS:
        assert list(_hf.eagle3_layers(n)) == hs_spec.eagle3_layers(n), n


def test_dflash_layers_flag_is_specforge_build_target_layer_ids_plus_one():
    for n in range(4, 81):
        for k in range(1, min(8, n - 3) + 1):  # where DFlash's spread repeats no layer
            want = [i + 1 for i in specforge_build_target_layer_ids(n, k)]
            assert _hf.dflash_layers(n, k) == want, (n, k)


def test_speculators_dflash_default_is_its_eagle3_set_not_the_dflash_rule(target):
    """speculators' DFlash drafter built without target_layer_ids reads
    [2, N//2, N-3] (resolve_target_layer_ids, shared with EAGLE-3), not the
    DFlash authors' rule that --dflash-layers K follows; the example and
    batches() use the drafter's own ids, whatever they are."""
    m = build("dflash", target)
    assert hs_spec.target_layers(m) == hs_spec.speculators_default_layer_ids(N_LAYERS) == \
        [2, 4, 5]
    assert _hf.dflash_layers(N_LAYERS, 3) == [2, 4, 6]
    m = build("dflash", target, "--target-layer-ids", "2,4,6")
    assert hs_spec.producer_layers(m) == _hf.dflash_layers(N_LAYERS, 3) + [N_LAYERS]


def test_normed_targets_make_the_drafter_targets_the_verifier_logits(target):
    """hsflow's L is output_hidden_states[N], after the final norm;
    speculators applies the verifier's final norm to its last state (vLLM's
    capture before that norm). use_normed_targets makes the targets
    lm_head(L), the verifier's own logits; without it the norm would be
    applied twice."""
    from transformers import LlamaForCausalLM
    verifier = LlamaForCausalLM.from_pretrained(target).eval()
    ids = torch.randint(0, VOCAB, (1, 23), generator=torch.Generator().manual_seed(1))
    pre = {}
    verifier.model.layers[-1].register_forward_hook(
        lambda mod, a, out: pre.setdefault("x", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        out = verifier(input_ids=ids, output_hidden_states=True)
    L = out.hidden_states[N_LAYERS]
    assert len(out.hidden_states) == N_LAYERS + 1
    for alg in ("eagle3", "dflash"):
        m = build(alg, target)
        with torch.no_grad():
            # speculators' own data (vLLM's id N: before the norm) gives the logits
            torch.testing.assert_close(m.verifier_lm_head(m.verifier_norm(pre["x"])), out.logits,
                                       rtol=1e-4, atol=1e-4)
            twice = m.verifier_lm_head(m.verifier_norm(L))
            assert (twice - out.logits).abs().max() > 1e-2, "the norm applied twice went unseen"
            hs_spec.use_normed_targets(m)
            hs_spec.use_normed_targets(m)  # idempotent
            torch.testing.assert_close(m.verifier_lm_head(m.verifier_norm(L)), out.logits,
                                       rtol=1e-5, atol=1e-5)
        assert "verifier_norm.weight" in m.state_dict()  # checkpoints keep their keys


# -- the dict -----------------------------------------------------------------

class FakeBatch:
    """What hsflow.Batch holds, for one packed batch of `lens` samples."""

    def __init__(self, lens, k, H, seed=0):
        g = torch.Generator().manual_seed(seed)
        T = sum(lens)
        self.n_tokens, self.n_seqs, self.hidden_size, self.n_layers = T, len(lens), H, k
        self.layers = tuple(range(k))
        self.epoch, self.batch = 0, 0
        self.hidden_states = torch.randn(T, k * H, generator=g).to(torch.bfloat16)
        self.input_ids = torch.randint(0, VOCAB, (T,), generator=g, dtype=torch.int32)
        self.loss_mask = torch.randint(0, 2, (T,), generator=g, dtype=torch.uint8)
        self.cu_seqlens = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)
        self.sample_ids = np.arange(100, 100 + len(lens), dtype=np.uint64)


def speculators_collate(b, shift, pad_to=1):
    """The same samples through speculators' own path: ArrowDataset's
    per-sample dict (file layout [seq, layers, H]), BaseDataset's lengths and
    position ids, its eagle3 preprocess, CollateFn with max_len = the tokens
    rounded up to a multiple of pad_to."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import CollateFn
    T, k, H = b.n_tokens, b.n_layers, b.hidden_size
    hs = b.hidden_states.view(T, k, H)
    cu = b.cu_seqlens.tolist()
    samples = []
    for s, e in zip(cu[:-1], cu[1:]):
        d = {"hidden_states": hs[s:e, :-1].flatten(1),
             "input_ids": b.input_ids[s:e].long(),
             "verifier_last_hidden_states": hs[s:e, -1],
             "loss_mask": b.loss_mask[s:e].long()}
        d["lengths"] = torch.tensor([e - s], dtype=torch.long)
        d["position_ids"] = torch.arange(e - s, dtype=torch.long)
        samples.append(d)
    pre = shift_batch if shift else None
    max_len = sum(len((pre(dict(x)) if pre else x)["input_ids"]) for x in samples)
    if pad_to > 1:
        max_len = max(pad_to, -(-max_len // pad_to) * pad_to)
    return CollateFn(max_len, H, k - 1, preprocess=pre)(samples)


def assert_same_dict(ours, theirs):
    assert set(theirs) - {"error_records"} <= set(ours)
    assert ours["error_records"] == theirs["error_records"] == 0
    for key, want in theirs.items():
        if key == "error_records":
            continue
        got = ours[key]
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        assert got.shape == want.shape, (key, got.shape, want.shape)
        assert torch.equal(got, want), key


@pytest.mark.parametrize("alg", ["eagle3", "dflash"])
@pytest.mark.parametrize("lens", [[5, 1, 9, 3], [17], [2, 2, 1], [7, 1]])
def test_collate_equals_speculators_collatefn_of_the_same_samples(alg, lens):
    b = FakeBatch(lens, k=4, H=8, seed=len(lens))
    shift = hs_spec.ALGORITHMS[alg]
    ours = hs_spec.collate(b, shift)
    theirs = speculators_collate(b, shift)
    assert_same_dict(ours, theirs)
    n = ours["lengths"].shape[0]
    assert ours["sample_ids"].tolist() == list(range(100, 100 + n))
    if shift:
        assert ours["input_ids"].shape[1] == sum(lens) - len(lens)
    else:  # the hidden states are views of the delivered batch, no copy
        assert ours["hidden_states"].data_ptr() == b.hidden_states.data_ptr()
        assert ours["verifier_last_hidden_states"].data_ptr() == \
            b.hidden_states.data_ptr() + 3 * 8 * 2
        assert ours["position_ids"][0, :lens[0]].tolist() == list(range(lens[0]))


@pytest.mark.parametrize("alg", ["eagle3", "dflash"])
@pytest.mark.parametrize("lens,pad_to", [([5, 1, 9, 3], 8), ([16], 16), ([1], 4), ([7, 1], 128)])
def test_padded_collate_equals_collatefn_padded_to_the_next_multiple(alg, lens, pad_to):
    b = FakeBatch(lens, k=4, H=8, seed=len(lens))
    shift = hs_spec.ALGORITHMS[alg]
    ours = hs_spec.collate(b, shift, pad_to)
    assert ours["input_ids"].shape[1] % pad_to == 0
    assert_same_dict(ours, speculators_collate(b, shift, pad_to))


def test_eagle3_on_flex_attention_is_padded_to_whole_flex_blocks_and_nothing_else_is(target):
    # speculators' EAGLE-3 extends its flex block mask by whole blocks per
    # draft step; an unpadded row fails in flex_attention on the GPU
    assert hs_spec.flex_block_multiple(build("eagle3", target, "--draft-attn-impl",
                                             "simple_flex_attention")) == 128
    assert hs_spec.flex_block_multiple(build("eagle3", target, "--draft-attn-impl", "sdpa")) == 1
    assert hs_spec.flex_block_multiple(build("dflash", target, "--draft-attn-impl",
                                             "simple_flex_attention")) == 1
    with pytest.raises(ValueError, match="pad_to"):
        hs_spec.batches(None, build("dflash", target), n_target_layers=8, pad_to=0)


@pytest.mark.parametrize("alg", ["eagle3", "dflash"])
def test_the_drafter_called_with_the_dict_as_it_is_returns_a_loss(alg, target):
    m = build(alg, target)
    hs_spec.use_normed_targets(m)
    d = hs_spec.collate(FakeBatch([40, 1, 30], k=4, H=HIDDEN, seed=5), hs_spec.ALGORITHMS[alg])
    # speculators' default loss is its fused (Triton) kernel; the CPU takes its eager one
    args = train_speculators.parse_args(["--algorithm", alg, "--target", target])
    kw, _ = type(m).get_trainer_kwargs(**train_speculators.speculators_config(args, False))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss, metrics = m(**d, loss_config=kw["loss_config"])
    assert torch.isfinite(loss) and loss.item() > 0
    loss.backward()
    assert m.fc.weight.grad is not None


def test_other_drafters_and_models_are_refused_when_batches_is_called():
    from types import SimpleNamespace as NS
    mtp = NS(config=NS(speculators_config=NS(algorithm="mtp")))
    with pytest.raises(TypeError, match="'mtp' drafter is not served .* dflash, eagle3"):
        hs_spec.batches(None, mtp)
    with pytest.raises(TypeError, match="not a speculators drafter"):
        hs_spec.batches(None, torch.nn.Linear(2, 2))


def test_numpy_arrays_are_refused_naming_arrays_torch():
    b = FakeBatch([4, 4], k=2, H=4)
    b.hidden_states = b.hidden_states.view(torch.int16).numpy().view(np.uint16)
    with pytest.raises(TypeError, match="arrays='torch'"):
        hs_spec.collate(b, False)


def test_a_layout_without_L_last_is_refused_naming_the_layers_to_give(target):
    m = build("eagle3", target)
    hs_spec.check_layout([2, 4, 5, 8], HIDDEN, m)
    with pytest.raises(hs_spec.LayoutError, match=r"--layers 2,4,5,8 \(--eagle3-layers"):
        hs_spec.check_layout([2, 4, 5], HIDDEN, m)
    with pytest.raises(hs_spec.LayoutError, match=r"final normed output \(hsflow index 8"):
        hs_spec.check_layout([2, 4, 5, 7], HIDDEN, m)


def test_other_target_layers_or_width_are_refused(target):
    m = build("dflash", target)
    with pytest.raises(hs_spec.LayoutError,
                       match=r"layers \[2, 4, 6\] before L=8, but the drafter was built with "
                             r"target_layer_ids \[2, 4, 5\]: give the producers --layers "
                             r"2,4,5,8, or build the drafter with target_layer_ids=\[2, 4, 6\]"):
        hs_spec.check_layout([2, 4, 6, 8], HIDDEN, m)
    with pytest.raises(hs_spec.LayoutError, match="width 32, the drafter was built for a "
                                                 "verifier of hidden size 64"):
        hs_spec.check_layout([2, 4, 5, 8], 32, m)


# -- training through the example -------------------------------------------

def run_example(*args, timeout=400):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, EXAMPLE] + list(args), capture_output=True, text=True,
                       env=env, timeout=timeout)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    means = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
        r"epoch (\d+) mean loss ([\d.]+) over \d+ batches", out)}
    done = re.search(r"(\d+) batches this run \((\d+) steps in all\).*consumer (\d+)/(\d+) "
                     r"batches delivered", out)
    assert done, out[-3000:]
    return out, means, [int(x) for x in done.groups()]


def producer_args(data, target, budget=384):
    return ["--", "--data", data, "--token-budget", str(budget), "--source", "model", "--model",
            target, "--gpus", "cpu:1"]


def test_eagle3_trains_with_the_loss_falling_fed_by_hs_producer(target, tmp_path, producer_bin):
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=3)
    out, means, (done, steps, delivered, planned) = run_example(
        "--algorithm", "eagle3", "--target", target, "--num-layers", "1", "--epochs", "3",
        "--mask-token-id", str(VOCAB - 1),
        "--lr", "3e-3", "--cache-gb", "0.05", "--loopback", "1", *producer_args(data, target))
    assert "--layers 2,4,5,8" in out
    assert done == steps == delivered == planned > 6
    assert sorted(means) == [0, 1, 2], out[-2000:]
    assert means[2] < means[1] < means[0], means


def test_dflash_checkpoint_resumes_with_the_batches_not_trained_on(target, tmp_path, producer_bin):
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=4)
    ckpt = str(tmp_path / "dflash.pt")
    common = ["--algorithm", "dflash", "--target", target, "--num-layers", "1", "--mask-token-id",
              str(VOCAB - 1), "--block-size", "4", "--max-anchors", "64", "--epochs", "3",
              "--lr", "3e-3", "--cache-gb", "0.05", "--checkpoint", ckpt, "--resume",
              "--loopback", "1"] + producer_args(data, target)
    _, _, (done1, steps1, _, planned) = run_example(*(common[:-len(producer_args(data, target))]
                                                      + ["--max-batches", "7"]
                                                      + producer_args(data, target)))
    assert done1 == steps1 == 7
    state = torch.load(ckpt, weights_only=False)
    assert set(state) >= {"model", "optimizers", "consumer", "step"}
    assert state["step"] == 7
    out, means, (done2, steps2, delivered2, planned2) = run_example(*common)
    assert "resumed from %s at step 7" % ckpt in out
    # this run trained the batches the first did not: the resumed consumer plans and
    # delivers exactly those
    assert (done2, steps2, delivered2, planned2) == (planned - 7, planned, planned - 7,
                                                     planned - 7)
    assert sorted(means) == [0, 1, 2], out[-2000:]
    assert means[2] < means[0], means


def test_two_gloo_ranks_each_with_its_consumer_train_and_checkpoint(target, tmp_path,
                                                                   producer_bin):
    from ports import reserve_port
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=5)
    ckpt = str(tmp_path / "ddp.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", EXAMPLE, "--algorithm", "eagle3", "--target",
                        target, "--mask-token-id", str(VOCAB - 1), "--num-layers", "1",
                        "--epochs", "2", "--cache-gb", "0.05", "--base-port",
                        str(reserve_port(2)), "--checkpoint", ckpt, "--loopback", "1"]
                       + producer_args(data, target), capture_output=True, text=True, env=env,
                       timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    got = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in
           re.finditer(r"train_speculators rank (\d)/2: (\d+) batches this run .*? consumer "
                       r"(\d+)/(\d+) batches delivered", out)}
    assert set(got) == {0, 1}, out[-3000:]
    assert got[0][0] == got[1][0] > 0  # the same number of steps on both ranks
    assert all(done == delivered == planned for done, delivered, planned in got.values())
    for rank in (0, 1):  # one checkpoint per rank, each with its consumer's position
        state = torch.load("%s.rank%d" % (ckpt, rank), weights_only=False)
        assert state["step"] == got[rank][0] and state["consumer"]


def test_the_example_stops_naming_it_when_its_producers_exit(target, tmp_path, producer_bin):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, EXAMPLE, "--algorithm", "eagle3", "--target", target,
                        "--mask-token-id", str(VOCAB - 1), "--cache-gb", "0.05", "--loopback",
                        "1"] + producer_args(str(tmp_path / "missing.jsonl"), target),
                       capture_output=True, text=True, env=env, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "every hs-producer exited (codes [2]) and batches are missing" in out, out[-3000:]


def test_fp8_and_bf16_streams_of_the_same_samples_give_loss_curves_within_2_percent(
        target, tmp_path, producer_bin):
    """speculators' EAGLE-3 trained twice on the same plan, the states
    streamed as bf16 and as fp8 (hs-producer --hs-dtype fp8, dequantised by
    the consumer): every step's loss within 2% of the other run's."""
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=3)
    curves = {}
    for dtype in ("bf16", "fp8"):
        out, _, (done, _, _, _) = run_example(
            "--algorithm", "eagle3", "--target", target, "--num-layers", "1", "--epochs", "3",
            "--mask-token-id", str(VOCAB - 1), "--lr", "3e-3", "--cache-gb", "0.05",
            "--loopback", "1", *producer_args(data, target), "--hs-dtype", dtype)
        curves[dtype] = [float(m.group(1)) for m in re.finditer(r"step \d+ epoch \d+ loss ([\d.]+)",
                                                                out)]
        assert len(curves[dtype]) == done > 6
    rel = [abs(a - b) / b for a, b in zip(curves["fp8"], curves["bf16"])]
    print("bf16 %s\nfp8  %s\nworst relative difference %.4f at step %d"
          % (curves["bf16"], curves["fp8"], max(rel), rel.index(max(rel)) + 1))
    assert len(curves["fp8"]) == len(curves["bf16"])
    assert max(rel) <= 0.02, rel


def test_store_pin_schedule_validation_and_save_pretrained(target, tmp_path, producer_bin):
    """The example as a team runs it: a first run fills --store from a
    producer; a second, pinned with hs-data plan's `pin` line, trains two
    epochs from the store alone with a cosine schedule and warm-up, holds
    out a fixed quarter of the batches for validation, and saves the
    drafter with speculators' save_pretrained, which its from_pretrained
    loads back; a pin of another plan is refused."""
    from ports import reserve_port
    from hsflow.data.store import Store
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=6)
    store = str(tmp_path / "store")
    common = ["--algorithm", "eagle3", "--target", target, "--num-layers", "1",
              "--mask-token-id", str(VOCAB - 1), "--cache-gb", "0.05", "--store", store]
    for _ in range(3):  # a batch the writer skipped is stored by the next run
        run_example(*common, "--lr-schedule", "none", "--loopback", "1",
                    *producer_args(data, target), "--layers", "2,4,5,8")
        with Store(store) as st:
            if not st.missing():
                break
    else:
        pytest.fail("the store is still incomplete after 3 runs")
    plan = subprocess.run([hsflow.find_tool("hs-data"), "plan", data, "--token-budget", "384",
                           "--hidden-size", str(HIDDEN), "--layers", "2,4,5,8"],
                          capture_output=True, text=True, timeout=60)
    pin = re.search(r"^pin\s+(.*)$", plan.stdout, re.M).group(1)
    saved = str(tmp_path / "drafter")
    out, means, (done, steps, delivered, planned) = run_example(
        *common, "--epochs", "2", "--expect", pin, "--base-port", str(reserve_port(1)),
        "--lr", "3e-3", "--lr-schedule", "cosine", "--warmup-steps", "3",
        "--val-fraction", "0.25", "--save-pretrained", saved)
    vals = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
        r"epoch (\d+) validation loss [\d.]+ over (\d+) held-out batches", out)}
    assert sorted(vals) == [0, 1] and vals[0] == vals[1] > 0, out[-3000:]
    assert done == delivered == planned and steps == planned - 2 * vals[0], out[-3000:]
    lrs = [float(x) for x in re.findall(r"step \d+ epoch \d+ loss [\d.]+ lr ([\d.e+-]+)", out)]
    assert len(lrs) == steps and lrs[0] == 0.0 and lrs[1] < lrs[2] < lrs[3] == 3e-3, lrs
    assert lrs[-1] < 0.1 * 3e-3, lrs  # cosine down to ~0 over the run
    assert "cosine schedule over %d steps, 3 of warm-up" % steps in out
    from speculators.models.eagle3 import Eagle3DraftModel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = Eagle3DraftModel.from_pretrained(saved)
    assert os.path.isfile(os.path.join(saved, "config.json"))
    assert back.config.speculators_config.algorithm == "eagle3"
    # a pin of another plan: refused before any step
    other = re.sub(r"--expect-plan \w+", "--expect-plan 0123456789abcdef", pin)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, EXAMPLE, *common, "--expect", other, "--base-port",
                        str(reserve_port(1))], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode != 0 and "0123456789abcdef" in r.stdout + r.stderr, \
        (r.stdout + r.stderr)[-3000:]


def test_a_missing_or_mistyped_target_is_named_without_a_traceback(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    (tmp_path / "empty").mkdir()
    for where, why in ((str(tmp_path / "tagret"), "no such folder"),
                       (str(tmp_path / "empty"), "no config.json there")):
        r = subprocess.run([sys.executable, EXAMPLE, "--algorithm", "eagle3", "--target", where],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "--target %s: %s; give the target (verifier) model's local folder" % (where, why) \
            in r.stderr and "Traceback" not in r.stderr, r.stderr
