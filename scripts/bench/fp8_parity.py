#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""fp8_parity.py - hsflow's FP8 forward against transformers' own FP8 path,
layer by layer, on tiny random models (a Llama and a Qwen3.5 hybrid).

For each model: a random bf16 model is built with transformers and saved;
transformers' fine-grained FP8 quantiser (FineGrainedFP8Config: e4m3
weights with one factor per 128x128 block, activations quantised per token
and 128 columns at run time) loads it quantised and saves the FP8
checkpoint (F8_E4M3 weights + weight_scale_inv, quantization_config).
Then, on a small packed batch, per output_hidden_states index:
  hs     = hs-forward --device cuda:0 on the FP8 checkpoint
  tf     = transformers running that FP8 checkpoint (each sequence alone)
  ref32  = transformers fp32 with the dequantised weights (w_fp8 * scale_inv)
and prints ||hs - ref32|| / ||ref32||, ||tf - ref32|| / ||ref32|| and
||hs - tf|| / ||tf||. A layer passes when hsflow's error is within 2x
transformers' own (plus 1e-3 for layers where both are ~0). Also
hs-forward --dtype fp8 on the bf16 folder, which must give the checkpoint's
hidden states (the same quantisation at load).

When transformers' FP8 path cannot run here (its fine-grained FP8 kernels
come from the `kernels` package and the hub, an unsupported GPU, an older
transformers), the script says so and emulates transformers' FP8Linear in
torch instead: each FP8 Linear's input quantised per token and 128 columns
(amax / 448, e4m3 nearest even) and multiplied in fp32 by the dequantised
weight. hsflow's error against ref32 must stay within 2x the emulation's
own, per layer; exits 3 when all pass that way (1 on a failure). Exits 77
without CUDA or torch.

Run on the GPU machine from the project root after building with CUDA:
    HSFLOW_BIN_DIR=build/bin python3 scripts/bench/fp8_parity.py [--keep DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def log(*a):
    print(*a, flush=True)


def bin_env():
    env = dict(os.environ)
    extra = os.environ.get("HS_LD_LIBRARY_PATH")
    if extra:
        env["LD_LIBRARY_PATH"] = extra + ":" + env.get("LD_LIBRARY_PATH", "")
    return env


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=1000,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=4096)
    return LlamaForCausalLM, cfg, ["lm_head"]


def tiny_qwen35():
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(
        hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=128, vocab_size=1000, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                             partial_rotary_factor=0.25, mrope_section=[6, 5, 5],
                             mrope_interleaved=True))
    # as Qwen's FP8 checkpoints: the tiny Gated DeltaNet gate projections stay bf16
    return Qwen3_5ForCausalLM, cfg, ["lm_head", "in_proj_a", "in_proj_b"]


def hidden(model, seqs, N):
    import torch
    out = [[] for _ in range(N + 1)]
    with torch.inference_mode():
        for s in seqs:
            hs = model.model(input_ids=s[None].cuda(), output_hidden_states=True,
                             use_cache=False).hidden_states
            for l in range(N + 1):
                out[l].append(hs[l][0].float())
    return [torch.cat(x) for x in out]


def dequantized_state(fp8_dir):
    """The FP8 checkpoint's tensors with every F8_E4M3 weight as fp32
    w * scale_inv (128x128 blocks); other tensors as stored."""
    import torch
    from safetensors.torch import load_file
    sd = {}
    for f in sorted(os.listdir(fp8_dir)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(fp8_dir, f)))
    out = {}
    for k, v in sd.items():
        if k.endswith("_scale_inv"):
            continue
        s = sd.get(k + "_scale_inv")
        if v.dtype == torch.float8_e4m3fn and s is not None:
            N, K = v.shape
            s = s.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[:N, :K]
            out[k] = v.float() * s
        else:
            out[k] = v.float()
    return out


def run_hs(bindir, model_dir, data, N, out, dtype=None):
    from safetensors.torch import load_file
    cmd = [os.path.join(bindir, "hs-forward"), "--model", model_dir, "--data", data, "--layers",
           ",".join(str(l) for l in range(N + 1)), "--device", "cuda:0", "--out", out]
    if dtype:
        cmd += ["--dtype", dtype]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=bin_env())
    if r.returncode:
        log(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return None
    o = load_file(out)
    return [o[f"hidden_states.{l}"].cuda().float() for l in range(N + 1)]


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def one_model(name, make, bindir, work):
    import torch
    cls, cfg, keep = make()
    N = cfg.num_hidden_layers
    bf16_dir, fp8_dir = os.path.join(work, name + "-bf16"), os.path.join(work, name + "-fp8")
    torch.manual_seed(0)
    model = cls(cfg).to(torch.bfloat16)
    # larger weights than the init's 0.02 so the FP8 rounding shows
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in n:
                p.normal_(0, 0.05)
    model.save_pretrained(bf16_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in (300, 77, 1)]
    data = os.path.join(work, name + ".jsonl")
    with open(data, "w") as f:
        for s in seqs:
            f.write(json.dumps({"input_ids": s.tolist()}) + "\n")
    outdir = os.path.join(work, "out")
    os.makedirs(outdir, exist_ok=True)
    # the bf16 model's own states (fp32 arithmetic on its bf16 weights) and
    # hsflow's bf16 forward of it: what FP8 states are compared with
    bf16_ref = hidden(model.float().cuda().eval(), seqs, N)
    del model
    hs_bf16 = run_hs(bindir, bf16_dir, data, N, os.path.join(outdir, name + "-bf16.safetensors"))
    if hs_bf16 is None:
        return 1

    tf_ok, why = True, ""
    try:
        from transformers import AutoModelForCausalLM, FineGrainedFP8Config
        q = AutoModelForCausalLM.from_pretrained(
            bf16_dir, quantization_config=FineGrainedFP8Config(modules_to_not_convert=keep),
            dtype=torch.bfloat16, device_map="cuda")
        q.save_pretrained(fp8_dir, safe_serialization=True)
        tf = hidden(q.eval(), seqs, N)
        del q
    except Exception as e:  # noqa: BLE001
        tf_ok, why = False, f"{type(e).__name__}: {e}"
        log(f"{name}: transformers' FP8 path cannot run here ({why[:400]}); comparing hsflow's "
            f"--dtype fp8 against its own dequantised fp32 reference only")
    rc = 0
    if tf_ok:
        ref_model = cls(cfg).float().cuda().eval()
        missing, unexpected = ref_model.load_state_dict(dequantized_state(fp8_dir), strict=False)
        if [k for k in missing if "rotary" not in k] or unexpected:
            log(f"{name}: fp32 reference: missing {missing[:4]}, unexpected {unexpected[:4]}")
        ref32 = hidden(ref_model, seqs, N)
        del ref_model
        hs = run_hs(bindir, fp8_dir, data, N, os.path.join(outdir, name + "-fp8.safetensors"))
        hsq = run_hs(bindir, bf16_dir, data, N, os.path.join(outdir, name + "-q.safetensors"), "fp8")
        if hs is None or hsq is None:
            return 1
        bf16_distance(name, N, hs, hs_bf16, bf16_ref)
        log(f"{name} | layer | hsflow~fp32 | transformers~fp32 | hsflow~transformers | "
            f"--dtype fp8~checkpoint | verdict")
        for l in range(N + 1):
            e_hs, e_tf = rel(hs[l], ref32[l]), rel(tf[l], ref32[l])
            ok = e_hs <= 2 * e_tf + 1e-3 and rel(hsq[l], hs[l]) <= 1e-2
            rc |= not ok
            log(f"{name} | {l} | {e_hs:.3e} | {e_tf:.3e} | {rel(hs[l], tf[l]):.3e} | "
                f"{rel(hsq[l], hs[l]):.3e} | {'ok' if ok else 'FAIL'}")
        return rc
    # Without transformers' FP8 kernels: its FP8Linear emulated in torch
    # (each FP8 Linear's input quantised per token and 128 columns, amax /
    # 448, e4m3 nearest even, then multiplied in fp32 by the dequantised
    # weight), against the fp32 run of the dequantised weights; hsflow must
    # stay within 2x the emulation's own error, layer by layer.
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "model"))
    import make_fp8_checkpoint as mk
    mk_dir, deq_dir = os.path.join(work, name + "-np-fp8"), os.path.join(work, name + "-np-deq")
    subprocess.run([sys.executable, mk.__file__, bf16_dir, mk_dir, deq_dir], check=True)
    ref_model = cls(cfg).float().cuda().eval()
    ref_model.load_state_dict(dequantized_state(mk_dir), strict=False)
    ref32 = hidden(ref_model, seqs, N)
    hooks = [m.register_forward_pre_hook(lambda mod, a: (act_qdq(a[0]),) + tuple(a[1:]))
             for n, m in ref_model.named_modules()
             if isinstance(m, torch.nn.Linear) and n + ".weight" in fp8_names(mk_dir)]
    emu = hidden(ref_model, seqs, N)
    for h in hooks:
        h.remove()
    del ref_model
    hs = run_hs(bindir, mk_dir, data, N, os.path.join(outdir, name + "-np.safetensors"))
    if hs is None:
        return 1
    bf16_distance(name, N, hs, hs_bf16, bf16_ref)
    log(f"{name}: {len(hooks)} FP8 Linears emulated")
    log(f"{name} | layer | hsflow~fp32 | emulated W8A8~fp32 | hsflow~emulated | verdict")
    for l in range(N + 1):
        e_hs, e_emu = rel(hs[l], ref32[l]), rel(emu[l], ref32[l])
        ok = e_hs <= 2 * e_emu + 1e-3
        rc |= not ok
        log(f"{name} | {l} | {e_hs:.3e} | {e_emu:.3e} | {rel(hs[l], emu[l]):.3e} | "
            f"{'ok' if ok else 'FAIL'}")
    return 1 if rc else 3


def bf16_distance(name, N, fp8, hs_bf16, bf16_ref):
    """How far the FP8 model's states are from the bf16 model's, per layer
    (docs/model.md), beside hsflow's own bf16 error for scale."""
    log(f"{name} | layer | FP8 states~bf16 model | hsflow bf16~bf16 model | ratio")
    for l in range(N + 1):
        e8, e16 = rel(fp8[l], bf16_ref[l]), rel(hs_bf16[l], bf16_ref[l])
        log(f"{name} | {l} | {e8:.3e} | {e16:.3e} | {e8 / max(e16, 1e-12):.1f}x")


def fp8_names(ckpt_dir):
    """The tensors of a checkpoint stored as float8_e4m3fn."""
    import torch
    from safetensors import safe_open
    names = set()
    for f in sorted(os.listdir(ckpt_dir)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt_dir, f), "pt") as st:
                for k in st.keys():
                    if st.get_slice(k).get_dtype() in ("F8_E4M3", "float8_e4m3fn") or \
                            str(st.get_slice(k).get_dtype()).lower().startswith("f8"):
                        names.add(k)
    return names


def act_qdq(x):
    """x quantised per token and group of 128 columns to e4m3 (scale = amax
    / 448, 1 for a zero group) and back, in fp32: what an FP8 Linear feeds
    its GEMM."""
    import torch
    shape, K = x.shape, x.shape[-1]
    G = (K + 127) // 128
    xf = torch.nn.functional.pad(x.float().reshape(-1, K), (0, G * 128 - K)).view(-1, G, 128)
    amax = xf.abs().amax(-1, keepdim=True)
    s = torch.where(amax > 0, amax / torch.full_like(amax, 448.0), torch.ones_like(amax))
    q = (xf / s).to(torch.float8_e4m3fn).float() * s
    return q.view(-1, G * 128)[:, :K].reshape(shape).to(x.dtype)
def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.environ.get("HSFLOW_BIN_DIR", "build/bin"))
    ap.add_argument("--keep", default=None, help="work folder to keep (default: a temporary one)")
    ap.add_argument("--models", default="llama,qwen35")
    args = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        log(f"fp8_parity: {e}: skipped")
        return 77
    if not torch.cuda.is_available():
        log("fp8_parity: no CUDA device: skipped")
        return 77
    log(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}")
    work = args.keep or tempfile.mkdtemp(prefix="hs-fp8-parity-")
    os.makedirs(work, exist_ok=True)
    rc = 0
    makers = {"llama": tiny_llama, "qwen35": tiny_qwen35}
    for name in args.models.split(","):
        r = one_model(name, makers[name], args.bin, work)
        log(f"{name}: {'PASS' if r == 0 else 'transformers FP8 unavailable' if r == 3 else 'FAIL'}")
        rc = 1 if 1 in (rc, r) else max(rc, r)  # a failure is never masked by a 3
    return rc


if __name__ == "__main__":
    sys.exit(main())
