#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gen_golden.py - golden hidden states for the built-in forward's tests.

Builds tiny random-initialised models of each supported family with
transformers (fixed seed), rounds every weight to bf16, runs them in fp32
with output_hidden_states=True on a few sequences of different lengths (each
sequence on its own: transformers does not pack; the results are
concatenated as hsflow packs them), and writes for each family:

  tests/data/<family>/config.json, model.safetensors (or shards + index)
  tests/data/<family>/golden.safetensors
      hidden_states.<i>  F32 [T, H] for every output_hidden_states index i
      input_ids          I32 [T]
      cu_seqlens         I32 [n + 1]
      __metadata__       format=hsflow-golden, version=1, family, layers

Deterministic and re-runnable: the same torch/transformers give the same
files. Needs torch and transformers (CPU is enough):
    pip install torch transformers
    python3 scripts/gen_golden.py [--out tests/data]
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

try:  # the Qwen3.5 hybrid (transformers >= 5.17)
    from transformers import (Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration,
                              Qwen3_5TextConfig)
except ImportError:
    Qwen3_5Config = Qwen3_5TextConfig = Qwen3_5ForCausalLM = None
    Qwen3_5ForConditionalGeneration = None

SEED = 1234


def plain_rope(theta):
    return dict(rope_type="default", rope_theta=theta)


def qwen3_5_rope(mrope_section):
    """Qwen3.5/3.6's RoPE: theta 1e7 on a quarter of each head's dims,
    interleaved multimodal sections."""
    return dict(plain_rope(10000000.0), partial_rotary_factor=0.25,
                mrope_section=mrope_section, mrope_interleaved=True)


def qwen3_5_text(mrope_section, **kw):
    """A Qwen3.5 text config's kwargs: what the text-only goldens share, then kw."""
    return dict(rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=False,
                rope_parameters=qwen3_5_rope(mrope_section), **kw)


# Each family: config kwargs, sequence lengths, storage dtype, shard size.
FAMILIES = {
    # odd width 1000, GQA 4:1, explicit head_dim, llama3 rope scaling whose
    # three wavelength bands all occur at head_dim 16, sharded bf16 weights
    "llama3": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        cfg=dict(hidden_size=1000, intermediate_size=40, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=64,
                 rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
                 rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                      low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64)),
        seqs=[7, 1, 13, 5], dtype=torch.bfloat16, shard="300KB"),
    # GQA 8:1, qkv bias, tied embeddings, head_dim derived (96 / 8 = 12)
    "qwen2": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM),
        cfg=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                 num_attention_heads=8, num_key_value_heads=1, vocab_size=128,
                 rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=True,
                 use_sliding_window=False, rope_parameters=plain_rope(1000000.0)),
        seqs=[9, 17, 3], dtype=torch.bfloat16, shard=None),
    # q/k RMSNorm, head_dim given (24, not 64 / 4), GQA 2:1, F32 storage
    "qwen3": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM),
        cfg=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=128,
                 rms_norm_eps=1e-6, max_position_embeddings=256, tie_word_embeddings=False,
                 use_sliding_window=False, rope_parameters=plain_rope(1000000.0)),
        seqs=[12, 6, 19], dtype=torch.float32, shard=None),
    # Mistral: plain MHA, sliding window 6 shorter than two of the sequences,
    # F16 storage
    "mistral": dict(
        cls=(MistralConfig, MistralForCausalLM),
        cfg=dict(hidden_size=80, intermediate_size=136, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
                 rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
                 sliding_window=6, rope_parameters=plain_rope(10000.0)),
        seqs=[11, 4, 9], dtype=torch.float16, shard=None),
    # Qwen3.5 hybrid, every 4th layer gated full attention (head_dim 64, RoPE
    # on its first 16 dims), Gated DeltaNet with as many value as key heads
    # and dk != dv; sequences of 1, < 64, exactly 64, > 64 tokens and one of
    # several hundred; BF16 weights with A_log and dt_bias kept in F32
    "qwen3_5_i4": dict(
        cls=(Qwen3_5TextConfig, Qwen3_5ForCausalLM),
        cfg=qwen3_5_text([3, 3, 2], hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         vocab_size=96, full_attention_interval=4, linear_num_key_heads=2,
                         linear_num_value_heads=2, linear_key_head_dim=16,
                         linear_value_head_dim=24, linear_conv_kernel_dim=4),
        seqs=[1, 23, 64, 65, 290], dtype=torch.bfloat16, shard=None, fp32_params=True),
    # Qwen3.5 hybrid alternating linear / full (full_attention_interval 2),
    # full attention of head_dim 256 (RoPE on 64 dims, the real model's
    # shape), three value heads per key head, conv kernel 3, untouched
    # default mrope section
    "qwen3_5_i2": dict(
        cls=(Qwen3_5TextConfig, Qwen3_5ForCausalLM),
        cfg=qwen3_5_text([11, 11, 10], hidden_size=32, intermediate_size=40,
                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=256, vocab_size=64, full_attention_interval=2,
                         linear_num_key_heads=1, linear_num_value_heads=3,
                         linear_key_head_dim=16, linear_value_head_dim=12,
                         linear_conv_kernel_dim=3),
        seqs=[64, 1, 70, 9], dtype=torch.bfloat16, shard=None),
    # the vision-language wrapper (Qwen3_5ForConditionalGeneration): decoder
    # under text_config and model.language_model.*, a tiny vision tower
    # (model.visual.*) and mtp.* tensors the loader must leave unread
    "qwen3_5_vl": dict(
        cls=(Qwen3_5Config, Qwen3_5ForConditionalGeneration),
        cfg=dict(
            text_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=3,
                             num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                             vocab_size=80, rms_norm_eps=1e-6, max_position_embeddings=512,
                             full_attention_interval=2, linear_num_key_heads=1,
                             linear_num_value_heads=3, linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_conv_kernel_dim=4,
                             rope_parameters=qwen3_5_rope([3, 3, 2])),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                               patch_size=4, spatial_merge_size=2, temporal_patch_size=2,
                               out_hidden_size=24, num_position_embeddings=16),
            tie_word_embeddings=False),
        seqs=[3, 17, 1], dtype=torch.bfloat16, shard=None, mtp=True),
}


def save_safetensors(path, tensors, metadata):
    """safetensors with a byte-stable header (sorted keys; the library's own
    writer orders __metadata__ differently from run to run)."""
    names = {torch.float32: "F32", torch.int32: "I32"}
    header, blobs, off = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for k, t in tensors.items():
        b = t.contiguous().numpy().tobytes()
        header[k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def randomise(model, gen, storage_dtype, fp32_params=False):
    """Every parameter random (norm weights around 1, biases nonzero), then
    rounded to bf16 - and, for F16 storage, to values exact in both.
    Qwen3.5: zero-centred norms (whose scale is 1 + w) around 0, the gated
    DeltaNet norm around 1, A_log for decays per token of 0.99 to 0.7; with
    fp32_params A_log and dt_bias keep their fp32 values."""
    qwen3_5 = model.config.model_type.startswith("qwen3_5")
    with torch.no_grad():
        for name, p in model.named_parameters():
            keep_fp32 = False
            if qwen3_5 and name.endswith("A_log"):
                v = torch.log(0.01 + 0.5 * torch.rand(p.shape, generator=gen))
                keep_fp32 = fp32_params
            elif qwen3_5 and name.endswith("dt_bias"):
                v = 0.5 * torch.randn(p.shape, generator=gen)
                keep_fp32 = fp32_params
            elif qwen3_5 and "norm" in name and "linear_attn.norm" not in name:
                v = 0.2 * torch.randn(p.shape, generator=gen)
            elif "norm" in name:
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith("bias"):
                v = 0.2 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                v = torch.randn(p.shape, generator=gen)
            else:  # nn.Linear [out, in] (or conv [C, 1, K]): keep activations O(1)
                v = torch.randn(p.shape, generator=gen) / (p.shape[-1] ** 0.5)
                if qwen3_5 and "in_proj_qkv" in name:
                    v = 2.0 * v  # delta-rule outputs well above the gated norm's eps
            if keep_fp32:
                p.copy_(v)
                continue
            v = v.to(torch.bfloat16)
            if storage_dtype == torch.float16:
                v = v.to(torch.float16).to(torch.bfloat16)
            p.copy_(v.float())


TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])


def config_kwargs(kw):
    """transformers < 5 takes rope_theta + rope_scaling, not rope_parameters."""
    kw = dict(kw)
    if TRANSFORMERS_MAJOR < 5 and "rope_parameters" in kw:
        rp = dict(kw.pop("rope_parameters"))
        kw["rope_theta"] = rp.pop("rope_theta")
        if rp["rope_type"] != "default":
            kw["rope_scaling"] = rp
    return kw


def write_both_rope_styles(path, kw):
    """config.json readable by transformers 4.x and 5.x alike: the legacy
    rope_theta / rope_scaling keys next to 5.x's rope_parameters."""
    with open(path) as f:
        cfg = json.load(f)
    rp = dict(kw["rope_parameters"])
    cfg["rope_theta"] = rp.pop("rope_theta")
    cfg["rope_scaling"] = rp if rp["rope_type"] != "default" else None
    cfg.setdefault("rope_parameters", dict(kw["rope_parameters"]))
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def add_mtp_tensors(path, gen):
    """Adds mtp.* tensors (the multi-token-prediction head real Qwen3.5
    checkpoints carry) to a safetensors file, in F8_E4M3, a dtype the
    loader cannot read: loading proves they are never touched."""
    from safetensors.torch import load_file, save_file
    t = load_file(path)
    t["mtp.fc.weight"] = torch.randn((8, 8), generator=gen).to(torch.float8_e4m3fn)
    t["mtp.layers.0.mlp.up_proj.weight"] = torch.randn((4, 8), generator=gen).to(
        torch.float8_e4m3fn)
    save_file(t, path, metadata={"format": "pt"})


def build(name, spec, out_dir):
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + sum(map(ord, name)))
    cfg_cls, model_cls = spec["cls"]
    cfg = cfg_cls(**config_kwargs(spec["cfg"]))
    cfg._attn_implementation = "eager"
    text_cfg = getattr(cfg, "text_config", cfg)
    text_cfg._attn_implementation = "eager"
    model = model_cls(cfg).eval()
    randomise(model, gen, spec["dtype"], spec.get("fp32_params", False))
    # the decoder: model.model, or model.model.language_model in a VL wrapper
    decoder = getattr(model.model, "language_model", model.model)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == decoder.embed_tokens.weight.data_ptr()

    n = text_cfg.num_hidden_layers
    lens = spec["seqs"]
    ids = torch.randint(0, text_cfg.vocab_size, (sum(lens),), generator=gen, dtype=torch.int64)
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    per_layer = [[] for _ in range(n + 1)]
    last_layer_out = []
    hook = decoder.layers[-1].register_forward_hook(
        lambda mod, inp, out: last_layer_out.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        for s in range(len(lens)):
            x = ids[cu[s]:cu[s + 1]][None]
            o = model(input_ids=x, output_hidden_states=True, use_cache=False)
            hs = o.hidden_states
            assert len(hs) == n + 1, f"{name}: {len(hs)} hidden states for {n} layers"
            # the indexing hsflow documents: 0 = embeddings, N = final norm
            emb = decoder.embed_tokens(x)
            assert torch.equal(hs[0], emb), f"{name}: hidden_states[0] is not the embedding"
            normed = decoder.norm(last_layer_out[-1])
            assert torch.allclose(hs[n], normed), f"{name}: hidden_states[N] is not normed"
            for i in range(n + 1):
                per_layer[i].append(hs[i][0].float())
    hook.remove()

    d = os.path.join(out_dir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    keep = {k: p.detach().clone() for k, p in model.named_parameters()
            if spec.get("fp32_params") and k.endswith(("A_log", "dt_bias"))}
    save_model = model.to(spec["dtype"])
    with torch.no_grad():  # F32 in the file, as they were computed
        for k, v in keep.items():
            save_model.get_parameter(k).data = v
    kw = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
    save_model.save_pretrained(d, safe_serialization=True, **kw)
    # keep the folder minimal: config + weights
    for f in os.listdir(d):
        if f == "generation_config.json":
            os.remove(os.path.join(d, f))
    if spec.get("mtp"):
        add_mtp_tensors(os.path.join(d, "model.safetensors"), gen)
    if "rope_parameters" in spec["cfg"] and not name.startswith("qwen3_5"):
        write_both_rope_styles(os.path.join(d, "config.json"), spec["cfg"])

    tensors = {f"hidden_states.{i}": torch.cat(per_layer[i]).contiguous() for i in range(n + 1)}
    tensors["input_ids"] = ids.to(torch.int32)
    tensors["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
    meta = {"format": "hsflow-golden", "version": "1", "family": name,
            "num_layers": str(n), "seq_lens": ",".join(map(str, lens)),
            "transformers": transformers.__version__, "torch": torch.__version__}
    save_safetensors(os.path.join(d, "golden.safetensors"), tensors, meta)
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    print(f"{name}: {n} layers, H={text_cfg.hidden_size}, T={cu[-1]}, {size / 1024:.0f} KiB "
          f"in {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"))
    ap.add_argument("--family", action="append", choices=sorted(FAMILIES),
                    help="only these families (default: all)")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # same summation order on every machine
    for name in a.family or FAMILIES:
        if name.startswith("qwen3_5") and Qwen3_5ForCausalLM is None:
            raise SystemExit(f"{name} needs a transformers with Qwen3.5 (5.17 or newer); "
                             f"this one is {transformers.__version__}")
        build(name, FAMILIES[name], os.path.abspath(a.out))


if __name__ == "__main__":
    main()
