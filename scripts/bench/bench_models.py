# SPDX-License-Identifier: Apache-2.0
"""bench_models - the model shapes the forward benches build with random
weights (scripts/bench/forward, forward_fp8, preflight_qwen36, fp8_plan), the
FLOP count of each (hs_model_forward_flops), and which delta rule
transformers' Qwen3.5 runs. Imported by those scripts; runs nothing.

  llama8b     Llama-3.1-8B: hidden 4096, 32 heads, 8 kv heads of 128,
              intermediate 14336, vocab 128256, llama3 rope
  qwen36-27b  Qwen3.6-27B's layer shapes: hidden 5120, intermediate 17408,
              vocab 248320; full attention every 4th layer with 24 query /
              4 kv heads of head_dim 256, rope on 64 dims, theta 1e7; the
              other layers Gated DeltaNet with 16 key / 48 value heads of
              128, conv 4
"""
import importlib
import os


def bin_env():
    """Environment for hsflow's binaries: HS_LD_LIBRARY_PATH (the runtime
    libraries they need, e.g. a bundled sysroot on a host without them) goes
    in front of LD_LIBRARY_PATH for them only, not for torch in this process."""
    env = dict(os.environ)
    extra = os.environ.get("HS_LD_LIBRARY_PATH")
    if extra:
        env["LD_LIBRARY_PATH"] = extra + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def llama8b_config(num_layers):
    from transformers import LlamaConfig
    return LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=num_layers,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192),
        attn_implementation="sdpa")


def llama8b_flops(cfg, n_run, n_seqs, seq_len):
    """2 * linear params * T plus causal attention, over n_run layers."""
    H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    params = H * (q + 2 * kv) + q * H + 3 * H * I
    T = n_seqs * seq_len
    attn = n_seqs * 4.0 * cfg.num_attention_heads * d * seq_len * (seq_len + 1) / 2
    return n_run * (2.0 * params * T + attn)


def qwen36_27b_config(num_layers):
    from transformers import Qwen3_5TextConfig
    return Qwen3_5TextConfig(
        hidden_size=5120, intermediate_size=17408, num_hidden_layers=num_layers,
        num_attention_heads=24, num_key_value_heads=4, head_dim=256, vocab_size=248320,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                     for i in range(num_layers)],
        rms_norm_eps=1e-6, max_position_embeddings=262144, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                             partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                             mrope_interleaved=True),
        attn_implementation="sdpa")


def qwen36_27b_flops(cfg, n_run, n_seqs, seq_len):
    """hs_model_forward_flops for n_seqs sequences of seq_len."""
    H, I, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    T = n_seqs * seq_len
    full = 2.0 * (H * (2 * q + 2 * kv) + q * H + 3 * H * I) * T + \
        n_seqs * 4.0 * cfg.num_attention_heads * d * seq_len * (seq_len + 1) / 2
    nv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    ch = 2 * cfg.linear_num_key_heads * dk + nv * dv
    lin = 2.0 * (H * (ch + nv * dv + 2 * nv) + nv * dv * H + 3 * H * I) * T + \
        (2.0 * cfg.linear_conv_kernel_dim * ch + 6.0 * nv * dk * dv) * T
    return sum(full if cfg.layer_types[l] == "full_attention" else lin for l in range(n_run))


def gdn_backend():
    """Which delta rule transformers' Qwen3.5 runs: fla's kernel when fla
    imports (transformers picks it at import time), else its torch code."""
    try:
        fla = importlib.import_module("fla")
        name = "flash-linear-attention %s" % getattr(fla, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        name = "torch fallback (fla not importable: %s)" % type(e).__name__
    try:
        importlib.import_module("causal_conv1d")
        conv = "causal-conv1d"
    except Exception:  # noqa: BLE001
        conv = "torch F.conv1d"
    # the module of the function transformers' wrapper dispatches to
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    used = set()
    for cell in getattr(mq.torch_chunk_gated_delta_rule, "__closure__", None) or ():
        f = cell.cell_contents
        if callable(f) and getattr(f, "__module__", None):
            used.add(f.__module__)
    return dict(delta_rule=name, conv=conv, chunk_rule_modules=sorted(used))


def model_class(name):
    """transformers' causal-LM class of a model shape."""
    import transformers
    return getattr(transformers, MODELS[name]["cls"])


# Each shape: its config, FLOP count, transformers class, what scripts/bench/forward
# names it in its log, and forward's defaults for it.
MODELS = {
    "llama8b": dict(config=llama8b_config, flops=llama8b_flops, cls="LlamaForCausalLM",
                    title="Llama-3.1-8B shape",
                    defaults=dict(num_layers=32, layers="2,16,29", shapes="64x1024,16x4096,8x8192",
                                  iters=5, workdir="/tmp/hs-bench-llama8b", shard="5GB")),
    "qwen36-27b": dict(config=qwen36_27b_config, flops=qwen36_27b_flops, cls="Qwen3_5ForCausalLM",
                       title="Qwen3.6-27B layer shapes",
                       defaults=dict(num_layers=8, layers="2,5,8",
                                     shapes="64x1024,32x2048,16x4096,8x8192", iters=3,
                                     workdir="/tmp/hs-bench-qwen35", shard="20GB")),
}
