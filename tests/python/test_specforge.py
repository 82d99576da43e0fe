# SPDX-License-Identifier: Apache-2.0
"""hsflow.integrations.specforge against SpecForge 0.2 itself.

Runs in .venv-engines (scripts/install-engine-venv: SpecForge's training code
beside vLLM's torch 2.13.0 and transformers 5.19), through engine_venv.sh, which reports the
test skipped (77) when that venv is absent. The same samples go through
SpecForge's own offline path (its feature files, load_feature_file,
normalize_offline_sample / normalize_dspark_offline_sample and the
algorithm's collator) and through hsflow's, and every key must match."""
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace as NS

import numpy as np
import pytest

specforge = pytest.importorskip(
    "specforge", reason="specforge is not installed here; run scripts/install-engine-venv "
    "and these tests through tests/python/engine_venv.sh")
torch = pytest.importorskip("torch")

from conftest import ROOT, write_dataset  # noqa: E402

from hsflow.integrations import specforge as hs_sf  # noqa: E402

EXAMPLE = os.path.join(ROOT, "examples", "train_specforge.py")
N_LAYERS, HIDDEN, VOCAB = 8, 64, 96


# -- the dict -----------------------------------------------------------------

class FakeBatch:
    """What hsflow.Batch holds, for one packed batch of `lens` samples;
    masks[i] (a list) replaces sample i's random loss mask."""

    def __init__(self, lens, k, H, seed=0, masks=None):
        g = torch.Generator().manual_seed(seed)
        T = sum(lens)
        self.n_tokens, self.n_seqs, self.hidden_size, self.n_layers = T, len(lens), H, k
        self.layers = tuple(range(1, k + 1))
        self.epoch, self.batch = 0, 0
        self.hidden_states = torch.randn(T, k * H, generator=g).to(torch.bfloat16)
        self.input_ids = torch.randint(0, VOCAB, (T,), generator=g, dtype=torch.int32)
        self.loss_mask = (torch.rand(T, generator=g) < 0.8).to(torch.uint8)
        cu = np.concatenate([[0], np.cumsum(lens)])
        for i, m in (masks or {}).items():
            self.loss_mask[cu[i]:cu[i + 1]] = torch.tensor(m, dtype=torch.uint8)
        self.cu_seqlens = torch.tensor(cu, dtype=torch.int32)
        self.sample_ids = np.arange(100, 100 + len(lens), dtype=np.uint64)


def specforge_batch(b, alg, tmp_path, max_len=2048):
    """The same samples through SpecForge's own offline path: one feature file
    per sample as its capture writes it (torch.save of input_ids and loss_mask
    [seq] int64 and hidden_states [1, seq, k*H] in the target's dtype; DSpark
    adds target_last_hidden_states [1, seq, H]), read back by its
    load_feature_file, normalized by the algorithm's normalizer (samples it
    refuses left out, as its data preparation leaves them out) and collated
    by the algorithm's collator. Returns (dict or None, kept sample indices)."""
    from specforge.algorithms.builtin import builtin_algorithm_registry
    from specforge.runtime.data_plane.feature_store import load_feature_file
    reg = _registration(builtin_algorithm_registry(), alg)
    offline = reg.providers.offline[0]
    normalize = offline.build_normalizer(max_len)
    collate = offline.build_collator()
    H, k = b.hidden_size, b.n_layers
    ctx = k - 1 if alg == "dspark" else k
    cu = b.cu_seqlens.tolist()
    feats, kept = [], []
    for i, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        raw = {"input_ids": b.input_ids[s:e].long().clone(),
               "loss_mask": b.loss_mask[s:e].long().clone(),
               "hidden_states": b.hidden_states[s:e, :ctx * H].clone().unsqueeze(0)}
        if alg == "dspark":
            raw["target_last_hidden_states"] = b.hidden_states[s:e, ctx * H:].clone().unsqueeze(0)
        path = str(tmp_path / ("data_%d.ckpt" % i))
        torch.save(raw, path)
        try:
            feats.append(normalize(load_feature_file(path)))
        except ValueError as err:
            assert "two consecutive supervised tokens" in str(err)
            continue
        kept.append(i)
    return (collate(feats) if feats else None), kept


def _registration(registry, alg):
    for name in ("get", "resolve", "__getitem__"):
        fn = getattr(registry, name, None)
        if fn is not None:
            try:
                return fn(alg)
            except (KeyError, TypeError):
                pass
    raise AssertionError("no %s in SpecForge's registry" % alg)


def assert_same_dict(ours, theirs):
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for key, want in theirs.items():
        got = ours[key]
        assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
        assert got.shape == want.shape, (key, got.shape, want.shape)
        assert torch.equal(got, want), key


LENS = [[5, 2, 9, 3], [17], [2, 2, 3], [7, 40, 1, 12], [64, 64]]


@pytest.mark.parametrize("alg", ["dflash", "domino", "dspark"])
@pytest.mark.parametrize("lens", LENS)
def test_the_dict_equals_specforges_offline_path_of_the_same_samples(alg, lens, tmp_path):
    k = 4
    b = FakeBatch(lens, k=k, H=8, seed=len(lens) * 7 + sum(lens))
    ours, kept = hs_sf.collate(b, with_last=hs_sf.ALGORITHMS[alg])
    theirs, theirs_kept = specforge_batch(b, alg, tmp_path)
    assert np.flatnonzero(kept).tolist() == theirs_kept
    if theirs is None:
        assert ours is None
        return
    assert_same_dict(ours, theirs)
    assert ours["hidden_states"].shape[-1] == (k - 1 if alg == "dspark" else k) * 8


@pytest.mark.parametrize("alg", ["dflash", "dspark"])
def test_the_max_len_cut_is_specforges_normalizer_cut(alg, tmp_path):
    # sample 1 has its only two consecutive supervised tokens past the cut: refused
    masks = {1: [1, 0, 1, 0, 1, 0, 0, 0, 1, 1, 1]}
    b = FakeBatch([12, 11, 30, 5], k=3, H=8, seed=11, masks=masks)
    ours, kept = hs_sf.collate(b, with_last=hs_sf.ALGORITHMS[alg], max_len=8)
    theirs, theirs_kept = specforge_batch(b, alg, tmp_path, max_len=8)
    assert 1 not in theirs_kept and np.flatnonzero(kept).tolist() == theirs_kept
    assert_same_dict(ours, theirs)
    assert ours["input_ids"].shape == (len(theirs_kept), 8)


def test_samples_without_anchors_are_refused_as_specforge_refuses_them(tmp_path):
    masks = {0: [0, 1, 0, 1, 0], 2: [0, 0, 0], 3: [1], 4: [1, 1, 0, 0]}
    b = FakeBatch([5, 6, 3, 1, 4], k=2, H=8, seed=3, masks=masks)
    b.loss_mask[5:11] = 1  # sample 1: all supervised
    ours, kept = hs_sf.collate(b)
    theirs, theirs_kept = specforge_batch(b, "dflash", tmp_path)
    assert theirs_kept == [1, 4] == np.flatnonzero(kept).tolist()
    assert_same_dict(ours, theirs)
    # a batch of no anchored sample at all gives no dict
    none = FakeBatch([3, 4], k=2, H=8, masks={0: [1, 0, 1], 1: [0, 0, 0, 1]})
    d, kept = hs_sf.collate(none)
    assert d is None and not kept.any()
    # and SpecForge's own normalizer refuses each of them
    assert specforge_batch(none, "dflash", tmp_path)[1] == []


class FakeConsumer:
    def __init__(self, batches):
        self._b = list(batches)

    def next_batch(self, timeout=None):
        if not self._b:
            raise StopIteration
        return self._b.pop(0)


def _online(alg, layers=(1, 3, 5), n_target=N_LAYERS):
    """A stand-in with SpecForge's class names and draft attributes."""
    draft_cls = type({"dflash": "DFlashDraftModel", "domino": "DominoDraftModel",
                      "dspark": "DSparkDraftModel"}[alg], (), {})
    draft = draft_cls()
    draft.target_layer_ids = list(layers)
    draft.config = NS(num_target_layers=n_target)
    online = type({"dflash": "OnlineDFlashModel", "domino": "OnlineDominoModel",
                   "dspark": "OnlineDSparkModel"}[alg], (), {})()
    online.draft_model = draft
    return online


def test_batches_count_refused_samples_and_fail_past_the_limit(capsys):
    def batch(masks, seed):
        b = FakeBatch([4, 4, 4], k=3, H=8, seed=seed, masks=masks)
        b.layers = (2, 4, 6)
        return b

    ok = {0: [1, 1, 1, 1], 1: [0, 1, 1, 0], 2: [1, 1, 0, 0]}
    bad = {0: [1, 0, 1, 0], 1: [0, 1, 1, 0], 2: [0, 0, 0, 0]}
    feed = hs_sf.batches(FakeConsumer([batch(ok, 1), batch(bad, 2), batch(ok, 3)]),
                         _online("dflash"), max_refused=None)
    got = list(feed)
    assert [d["input_ids"].shape[0] for d in got] == [3, 1, 3]
    assert feed.refused == 2 and feed.samples == 9 and feed.refused_ids == [100, 102]
    assert feed.tokens == 12  # the last dict's, padding not counted
    assert "refused sample(s) [100, 102]" in capsys.readouterr().err
    # past max_refused (2 of 9 > 10%), the iteration fails naming the count
    feed = hs_sf.batches(FakeConsumer([batch(ok, 1), batch(bad, 2), batch(ok, 3)]),
                         _online("dflash"), max_refused=0.1)
    with pytest.raises(hs_sf.RefusedError, match="2 of 9 samples"):
        list(feed)
    # a batch with no sample left gives no dict
    allbad = {0: [1, 0, 1, 0], 1: [0, 0, 0, 0], 2: [0, 0, 0, 1]}
    feed = hs_sf.batches(FakeConsumer([batch(allbad, 4), batch(ok, 5)]), _online("dflash"),
                         max_refused=None, with_batch=True)
    got = list(feed)
    assert len(got) == 1 and got[0][0].batch == 0 and feed.rows == [100, 101, 102]


def test_layouts_are_refused_naming_the_layers_to_give():
    b = FakeBatch([4, 4], k=3, H=8)
    b.layers = (1, 3, 5)
    with pytest.raises(hs_sf.LayoutError, match="give the producers --layers 2,4,6"):
        list(hs_sf.batches(FakeConsumer([b]), _online("dflash")))
    # DSpark reads the final normed state too: L = N last
    assert hs_sf.producer_layers(_online("dspark")) == [2, 4, 6, 8]
    b.layers = (2, 4, 6)
    with pytest.raises(hs_sf.LayoutError, match="final normed state L = 8: give the producers "
                                                "--layers 2,4,6,8"):
        list(hs_sf.batches(FakeConsumer([b]), _online("dspark")))
    # a context layer at SpecForge's id N - 1 (hsflow's N, after the norm) is refused
    with pytest.raises(hs_sf.LayoutError, match="id 7 .hsflow index 8. is after the final norm"):
        hs_sf.batches(FakeConsumer([]), _online("dflash", layers=(1, 7)))
    with pytest.raises(TypeError, match="not one of SpecForge's DFlash-family models"):
        hs_sf.batches(FakeConsumer([]), NS(draft_model=None))


def test_numpy_arrays_are_refused_naming_arrays_torch():
    b = FakeBatch([4, 4], k=2, H=4)
    b.hidden_states = b.hidden_states.float().numpy()
    with pytest.raises(TypeError, match="arrays='torch'"):
        hs_sf.collate(b)


def test_the_real_models_take_the_dict_as_it_is():
    """SpecForge's OnlineDFlashModel and OnlineDSparkModel, built from its
    own draft classes, return a finite loss for the dict that back-propagates."""
    from transformers import Qwen3Config
    from specforge.algorithms.common.dflash_family_model import (OnlineDFlashModel,
                                                                 OnlineDSparkModel)
    from specforge.modeling.draft.dflash import DFlashDraftModel
    from specforge.modeling.draft.dspark import DSparkDraftModel
    for alg, draft_cls, online_cls in (("dflash", DFlashDraftModel, OnlineDFlashModel),
                                       ("dspark", DSparkDraftModel, OnlineDSparkModel)):
        cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=8, max_position_embeddings=256)
        cfg.num_target_layers, cfg.block_size = N_LAYERS, 4
        cfg.dflash_config = {"target_layer_ids": [1, 3, 5], "mask_token_id": VOCAB - 1}
        cfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        draft = draft_cls(cfg)
        model = online_cls(draft, torch.nn.Linear(32, VOCAB, bias=False),
                           torch.nn.Embedding(VOCAB, 32), VOCAB - 1, block_size=4,
                           attention_backend="sdpa", num_anchors=16)
        k = 4 if alg == "dspark" else 3
        b = FakeBatch([20, 9, 14], k=k, H=32, seed=2)
        d, _ = hs_sf.collate(b, with_last=hs_sf.ALGORITHMS[alg])
        d = {key: (v.float() if v.is_floating_point() else v) for key, v in d.items()}
        loss, _, _ = model(**d)
        assert torch.isfinite(loss)
        loss.backward()
        assert draft.fc.weight.grad is not None and torch.isfinite(draft.fc.weight.grad).all()


# -- training through the example -------------------------------------------

@pytest.fixture(scope="session")
def target(tmp_path_factory):
    """A tiny random Qwen3 target folder: 8 layers, H=64, vocab 96."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    path = str(tmp_path_factory.mktemp("target"))
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=N_LAYERS, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=512, initializer_range=0.1,
                      tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    return path


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


def common_args(alg, target):
    return ["--algorithm", alg, "--target", target, "--mask-token-id", str(VOCAB - 1),
            "--block-size", "4", "--num-anchors", "64", "--lr", "3e-3", "--cache-gb", "0.05"]


def draft_config(path, alg):
    """A tiny DSpark or Domino draft config in the form of SpecForge's
    configs/*-dspark.json and *-domino.json (neither has a generated config:
    SpecForge asks for one)."""
    cfg = {"architectures": ["DSparkDraftModel" if alg == "dspark" else "DominoDraftModel"],
           "model_type": "qwen3", "vocab_size": VOCAB,
           "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000,
           "max_position_embeddings": 512, "layer_types": ["full_attention"],
           "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
           "num_target_layers": N_LAYERS, "block_size": 4,
           "dflash_config": {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, 4, 6],
                             "projector_type": "dspark", "markov_rank": 16,
                             "markov_head_type": "vanilla", "enable_confidence_head": True,
                             "confidence_head_with_markov": True}}
    if alg == "domino":
        cfg["emb_dim"] = 16
        cfg["dflash_config"] = {"mask_token_id": VOCAB - 1, "target_layer_ids": [1, 4, 6],
                                "projector_type": "domino", "pure_draft_prefix_len": 1,
                                "emb_dim": 16, "gru_hidden_dim": 32, "shift_label": True}
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


@pytest.mark.parametrize("alg", ["dflash", "domino", "dspark"])
def test_the_loss_falls_over_three_epochs_fed_by_hs_producer(alg, target, tmp_path,
                                                            producer_bin):
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=3)
    extra = ["--draft-config", draft_config(str(tmp_path / "draft.json"), alg)] \
        if alg != "dflash" else []
    out, means, (done, steps, delivered, planned) = run_example(
        *common_args(alg, target), *extra, "--epochs", "3", "--loopback", "1",
        *producer_args(data, target))
    # SpecForge's generated one-layer DFlash draft reads its target_layer_ids [4]: hsflow's
    # 5; the configs' [1, 4, 6] are hsflow's 2, 5, 7, and DSpark reads L = 8 too
    assert "--layers %s" % {"dflash": "5", "domino": "2,5,7", "dspark": "2,5,7,8"}[alg] in out
    assert done == steps == delivered == planned > 6
    assert sorted(means) == [0, 1, 2], out[-2000:]
    assert means[2] < means[1] < means[0], means
    # SpecForge's cosine schedule over hsflow's plan: the rate ends at 0
    assert re.findall(r"step %d epoch 2 loss [\d.]+ lr (\S+)" % planned, out) == ["0"]


def test_a_stopped_run_resumes_with_the_batches_not_trained_on(target, tmp_path, producer_bin):
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=4)
    ckpt = str(tmp_path / "dflash.pt")
    common = common_args("dflash", target) + ["--epochs", "3", "--checkpoint", ckpt, "--resume",
                                              "--loopback", "1"]
    _, _, (done1, steps1, _, planned) = run_example(*common, "--max-batches", "7",
                                                    *producer_args(data, target))
    assert done1 == steps1 == 7
    state = torch.load(ckpt, weights_only=False)
    assert set(state) >= {"model", "optimizer", "rng", "consumer", "step", "total_steps"}
    assert state["step"] == 7 and state["total_steps"] == planned
    lr7 = state["optimizer"]["scheduler_state_dict"]["_last_lr"]
    out, means, (done2, steps2, delivered2, planned2) = run_example(
        *common, *producer_args(data, target))
    assert "resumed from %s at step 7" % ckpt in out
    # this run trained the batches the first did not: the resumed consumer plans and
    # delivers exactly those, and the schedule goes on from step 7
    assert (done2, steps2, delivered2, planned2) == (planned - 7, planned, planned - 7,
                                                     planned - 7)
    assert re.search(r"step 8 epoch \d loss [\d.]+ lr", out), out[-2000:]
    # the schedule restored with the optimizer: it ends at 0 on the plan's last step
    assert re.findall(r"step %d epoch 2 loss [\d.]+ lr (\S+)" % planned, out) == ["0"]
    assert sorted(means) == [0, 1, 2], out[-2000:]
    assert means[2] < means[0], means
    assert lr7[0] > 0


def test_two_gloo_ranks_each_with_its_consumer_train_and_checkpoint(target, tmp_path,
                                                                   producer_bin):
    from ports import reserve_port
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 20, 100, VOCAB, seed=5)
    ckpt = str(tmp_path / "ddp.pt")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", EXAMPLE, *common_args("dflash", target),
                        "--epochs", "2", "--base-port", str(reserve_port(2)),
                        "--checkpoint", ckpt, "--loopback", "1"]
                       + producer_args(data, target), capture_output=True, text=True, env=env,
                       timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    got = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in
           re.finditer(r"train_specforge rank (\d)/2: (\d+) batches this run .*? consumer "
                       r"(\d+)/(\d+) batches delivered", out)}
    assert set(got) == {0, 1}, out[-3000:]
    assert got[0][0] == got[1][0] > 0  # the same number of steps on both ranks
    assert all(done == delivered == planned for done, delivered, planned in got.values())
    states = [torch.load("%s.rank%d" % (ckpt, rank), weights_only=False) for rank in (0, 1)]
    for rank, state in enumerate(states):  # one checkpoint per rank, its consumer's position
        assert state["step"] == got[rank][0] and state["consumer"]
    # DDP kept the replicas equal
    for key, w in states[0]["model"].items():
        assert torch.equal(w, states[1]["model"][key]), key


def test_the_example_refuses_a_target_folder_without_a_config(target, tmp_path):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, EXAMPLE, "--algorithm", "dflash", "--target",
                        str(tmp_path / "nope")], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2 and "no config.json there" in r.stderr, r.stderr[-2000:]
    # and DSpark or Domino without a draft config, which SpecForge does not generate
    r = subprocess.run([sys.executable, EXAMPLE, "--algorithm", "dspark", "--target", target],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "give --draft-config" in r.stderr, r.stderr[-2000:]


def test_a_complete_store_feeds_the_example_with_no_producer(target, tmp_path, producer_bin):
    import hsflow
    data, store = str(tmp_path / "d.jsonl"), str(tmp_path / "store")
    write_dataset(data, 24, 20, 80, VOCAB, seed=6)
    consumer = hsflow.find_tool("hs-consumer")
    r = subprocess.run([consumer, "--loopback", "1", "--cache-gb", "0.05", "--store", store,
                        "--status-interval", "0", "--", "--data", data, "--token-budget", "384",
                        "--source", "model", "--model", target, "--gpus", "cpu:1",
                        "--layers", "5"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    out, means, (done, steps, delivered, planned) = run_example(
        *common_args("dflash", target), "--epochs", "2", "--store", store)
    assert done == steps == delivered == planned > 2
    assert sorted(means) == [0, 1]
    # the tokens each step printed are the stored batches' samples, all of them
    assert sum(int(t) for t in re.findall(r"^step \d+ epoch 0 .* tokens (\d+) ms", out,
                                          re.M)) == sum(
        len(json.loads(line)["input_ids"]) for line in open(data))
