# SPDX-License-Identifier: Apache-2.0
"""hsflow-produce's model side on the CPU, without a consumer: tiny random
models of every kind of layer transformers has (full attention, sliding
windows, Gated DeltaNet linear attention, Mamba-2 state-space mixers,
mixture-of-experts, attention sinks), built here and saved to a temporary
folder, loaded the way the workers load them. A batch of sequences of
different lengths is run packed and padded and each sequence's captured
states are compared with transformers' output_hidden_states of that
sequence alone: packing is exact or refused by the load-time probe naming
the layer type, and padded is always exact."""
import os

import numpy as np
import pytest

from conftest import asan_runtime_loaded

pytestmark = pytest.mark.skipif(asan_runtime_loaded(),
                                reason="torch does not run under the preloaded ASan runtime")

if os.environ.get("CI"):
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

from hsflow import _hf  # noqa: E402

VOCAB = 300
LENS = [9, 23, 4, 17, 30]  # longer than the sliding windows and the Mamba chunk


def _config(kind):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, tie_word_embeddings=False)
    if kind == "llama":  # full attention
        return "Llama", transformers.LlamaConfig(intermediate_size=96, num_hidden_layers=3,
                                                 **common)
    if kind == "mistral_sliding":  # every layer a sliding window of 8
        return "Mistral", transformers.MistralConfig(intermediate_size=96, num_hidden_layers=3,
                                                     sliding_window=8, **common)
    if kind == "qwen3_next":  # Gated DeltaNet + gated full attention, MoE MLPs
        return "Qwen3Next", transformers.Qwen3NextConfig(
            intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            num_experts=4, num_experts_per_tok=2, head_dim=16, num_hidden_layers=4,
            linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
            linear_value_head_dim=16, full_attention_interval=2, **common)
    if kind == "bamba":  # Mamba-2 mixers with attention every other layer
        return "Bamba", transformers.BambaConfig(
            intermediate_size=96, num_hidden_layers=4, mamba_n_heads=8, mamba_d_head=16,
            mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=16, mamba_expand=2,
            attn_layer_indices=[1, 3], **common)
    if kind == "gpt_oss":  # sliding/full alternating, attention sinks, MoE
        return "GptOss", transformers.GptOssConfig(
            intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
            num_hidden_layers=2, sliding_window=8, **common)
    raise ValueError(kind)


def make(kind, path):
    torch.manual_seed(7)
    name, cfg = _config(kind)
    model = getattr(transformers, name + "ForCausalLM")(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
    model.eval()
    model.save_pretrained(path)
    return model


def reference(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return [h[0].float() for h in out.hidden_states]


def run(decoder, n_layers, ids, cu, packed):
    """Every index 0..N of the batch through the producer's own capture,
    fp32 [T, (N+1)*H]."""
    H = decoder.config.hidden_size
    layers = list(range(n_layers + 1))
    cap = _hf.Capture(decoder, layers, n_layers, H)
    out = torch.zeros((int(cu[-1]), len(layers) * H))
    try:
        with torch.inference_mode():
            for c in _hf.batch_chunks(ids, cu, packed, 64, "cpu"):
                cap.begin(out, c)
                c.run(decoder)
    finally:
        cap.remove()
    return out


def check(out, model, ids, cu, what):
    H = model.config.hidden_size
    for s in range(len(cu) - 1):
        ref = reference(model, ids[cu[s]:cu[s + 1]].tolist())
        for i, r in enumerate(ref):
            got = out[cu[s]:cu[s + 1], i * H:(i + 1) * H]
            err = float((got - r).abs().max() / r.abs().max())
            assert err < 1e-4, "%s: sequence %d index %d: max error %.3g of the scale" % (
                what, s, i, err)


def batch():
    rng = np.random.default_rng(3)
    cu = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int64)
    return rng.integers(0, VOCAB, int(cu[-1])), cu


@pytest.mark.parametrize("kind,attn,packs", [
    ("llama", "sdpa", True),
    ("mistral_sliding", "sdpa", True),
    ("mistral_sliding", "eager", True),
    ("qwen3_next", "sdpa", True),     # DeltaNet run per sequence inside the row
    ("bamba", "sdpa", True),          # Mamba-2 likewise
    ("gpt_oss", "eager", False),      # its masks ignore the position ids: refused
])
def test_each_layer_kind_packed_is_exact_or_refused_and_padded_is_exact(tmp_path, kind, attn,
                                                                       packs):
    model = make(kind, str(tmp_path))
    n = model.config.num_hidden_layers
    decoder, _ = _hf.load_decoder(str(tmp_path), n, "fp32", attn, "cpu")
    ids, cu = batch()
    check(run(decoder, n, ids, cu, False), model, ids, cu, "%s padded" % kind)
    wrapped = _hf.per_sequence_mixers(decoder)
    why = _hf.probe_packing(decoder, "cpu")
    if packs:
        assert why is None, why
        check(run(decoder, n, ids, cu, True), model, ids, cu, "%s packed" % kind)
    else:
        assert why and "decoder layer 0 (GptOssDecoderLayer: self_attn GptOssAttention " \
            "(attention)" in why and "relative error" in why, why
    if kind in ("qwen3_next", "bamba"):
        assert {c for _, _, c in wrapped} == {"Qwen3NextGatedDeltaNet" if kind == "qwen3_next"
                                              else "BambaMixer"}, wrapped


@pytest.mark.parametrize("kind", ["llama", "qwen3_next"])
def test_padded_calls_skip_transformers_packed_check_and_stay_exact(tmp_path, kind, monkeypatch):
    """transformers' packed-sequence check reads a GPU value on the host
    (a stream synchronisation per forward call: on the H200 it kept the
    host from queueing ahead, 116 ms a call against 12). A padded call's
    rows are each one sequence, so hsflow answers it without the read; a
    packed call still asks transformers, whose answer it needs."""
    from transformers import masking_utils
    calls = []
    orig = masking_utils.find_packed_sequence_indices

    def counting(position_ids):
        calls.append(position_ids.shape)
        return orig(position_ids)
    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", counting)
    model = make(kind, str(tmp_path))
    n = model.config.num_hidden_layers
    decoder, _ = _hf.load_decoder(str(tmp_path), n, "fp32", "sdpa", "cpu")
    ids, cu = batch()
    padded = run(decoder, n, ids, cu, False)
    assert calls == [], calls
    assert masking_utils.find_packed_sequence_indices is counting  # put back after each call
    _hf.per_sequence_mixers(decoder)
    packed = run(decoder, n, ids, cu, True)
    assert calls, "a packed call no longer asks transformers"
    check(padded, model, ids, cu, "%s padded" % kind)
    check(packed, model, ids, cu, "%s packed" % kind)


def test_the_probe_names_a_linear_attention_layer_that_leaks_across_sequences(tmp_path):
    """Without the per-sequence mixers, transformers' Gated DeltaNet carries
    its state from one packed sequence into the next: the probe refuses
    packing, naming the layer and its type."""
    make("qwen3_next", str(tmp_path))
    decoder, _ = _hf.load_decoder(str(tmp_path), 4, "fp32", "sdpa", "cpu")
    why = _hf.probe_packing(decoder, "cpu")
    assert why and why.startswith("decoder layer 0 (Qwen3NextDecoderLayer: linear_attn "
                                  "Qwen3NextGatedDeltaNet (stateful)"), why


def test_layer_kinds_name_each_mixer(tmp_path):
    make("bamba", str(tmp_path))
    decoder, _ = _hf.load_decoder(str(tmp_path), 4, "fp32", "sdpa", "cpu")
    kinds = _hf.layer_kinds(decoder)
    assert ("mamba", "BambaMixer", "stateful") in kinds[0]
    assert ("self_attn", "BambaAttention", "attention") in kinds[1]
    assert all(k != "other" for row in kinds for _, _, k in row), kinds


def test_attn_implementation_auto_takes_the_fastest_the_model_supports_and_names_those_that_work(
        tmp_path):
    """Gemma2 and gpt-oss have no sdpa: asking for it is refused naming the
    implementations that work (before any weight is read), and auto takes
    eager there, sdpa for llama; a gpt-oss model loads with auto."""
    gemma2 = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=16)
    for cfg, name in ((gemma2, "Gemma2ForCausalLM"), (_config("gpt_oss")[1], "GptOssForCausalLM")):
        with pytest.raises(_hf.ModelError) as e:
            _hf.resolve_attn_implementation(cfg, "sdpa", "cpu", "/m")
        assert str(e.value) == ("--attn-implementation sdpa: %s (--model /m) cannot run it here; "
                                "the implementations that work: eager, flex_attention (or auto, "
                                "which takes eager)" % name), str(e.value)
        assert _hf.resolve_attn_implementation(cfg, "auto", "cpu", "/m") == "eager"
    assert _hf.resolve_attn_implementation(_config("llama")[1], "auto", "cpu", "/m") == "sdpa"
    assert _hf.resolve_attn_implementation(_config("llama")[1], "eager", "cpu", "/m") == "eager"
    make("gpt_oss", str(tmp_path))
    decoder, _ = _hf.load_decoder(str(tmp_path), 2, "fp32", "auto", "cpu")
    assert decoder.config._attn_implementation == "eager"


def _config_only(path, n_layers):
    """A model folder whose config says n_layers and whose weights cannot be
    read: what parse() decides there, it decides before any weight."""
    os.makedirs(path, exist_ok=True)
    transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                             num_hidden_layers=n_layers, num_attention_heads=4,
                             num_key_value_heads=2).save_pretrained(path)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(b"not safetensors")
    return path


def _parse(tmp_path, model, *flags):
    from hsflow import produce
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n')
    return produce.parse(["--to", "127.0.0.1:1", "--data", str(data), "--model", model] +
                         list(flags))


def test_layer_presets_are_resolved_from_the_config_and_a_preset_too_deep_names_the_depth(
        tmp_path, capsys):
    deep = _config_only(str(tmp_path / "deep"), 32)
    shallow = _config_only(str(tmp_path / "shallow"), 4)
    args, spec = _parse(tmp_path, deep, "--eagle3-layers")
    assert spec["layers"] == [2, 16, 29, 32] and spec["n_run"] == 32
    args, spec = _parse(tmp_path, deep, "--dflash-layers", "5")
    assert spec["layers"] == [2, 9, 16, 23, 30]
    assert _hf.eagle3_layers(7) == [2, 3, 4, 7]
    cases = [
        (["--dflash-layers", "5"], "--dflash-layers 5: the model has 4 decoder layers, too few "
         "for DFlash's default set of 5 draft layers (spread over decoder layers 1..N-3, it needs "
         "at least 8); give fewer draft layers or --layers explicitly"),
        (["--eagle3-layers"], "--eagle3-layers: the model has 4 decoder layers, too few for "
         "EAGLE-3's default set 2, N/2, N-3, N (it needs at least 7 for four distinct layers in "
         "order); give --layers explicitly"),
        (["--eagle3-layers", "--layers", "1"], "give one of --layers, --dflash-layers and "
         "--eagle3-layers, not several"),
    ]
    for flags, msg in cases:
        capsys.readouterr()
        assert _parse(tmp_path, shallow, *flags) == 2
        assert capsys.readouterr().err.strip() == "hsflow-produce: " + msg


def test_flags_are_not_abbreviated_and_the_status_interval_reaches_the_library(tmp_path,
                                                                              capsys):
    """'--layer 2' was taken as --layers 2; now it is an unknown flag.
    --status-interval goes to the library's status lines too (they came
    every 5 s whatever it said); 0 turns them off (-1 to the library)."""
    deep = _config_only(str(tmp_path / "deep"), 8)
    assert _parse(tmp_path, deep, "--layer", "2") == 2
    assert "unrecognized arguments: --layer 2" in capsys.readouterr().err
    args, spec = _parse(tmp_path, deep, "--layers", "2", "--status-interval", "2")
    assert spec["status_interval"] == 2.0
    from hsflow import _lib
    assert "status_interval_s" in dict(_lib.ProducerClientConfig._fields_)
