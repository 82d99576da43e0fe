#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""attn_torch - torch's scaled_dot_product_attention at the shapes of
`hs-bench-forward --attn-only`, on its flash and cuDNN backends.

Per shape n x L and head layout Hq/Hkv/d: q [n, Hq, L, d], k and v
[n, Hkv, L, d] (every sequence L long, so the batch has no padding), bf16,
causal, enable_gqa. Each backend is forced with torch.nn.attention.sdpa_kernel;
one warm-up, then the best of --iters calls (CUDA events). Prints one JSON
line per (shape, heads, backend): ms and TFLOP/s counted as
4 * n * Hq * d * L (L + 1) / 2, the count hs-bench-forward uses.

    python3 scripts/bench/attn_torch.py --shapes 64x1024,8x8192 --heads 32/8/128,24/4/256
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(n, L, hq, hkv, d, backend, iters):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, hq, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(n, hkv, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(n, hkv, L, d, device="cuda", dtype=torch.bfloat16, generator=g)
    best = None
    with sdpa_kernel([backend]), torch.inference_mode():
        for i in range(iters + 1):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            e1.record()
            torch.cuda.synchronize()
            ms = e0.elapsed_time(e1)
            if i and (best is None or ms < best):
                best = ms
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="64x1024,32x2048,16x4096,8x8192")
    ap.add_argument("--heads", default="32/8/128,24/4/256", help="Hq/Hkv/d, comma-separated")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    heads = [tuple(int(x) for x in h.split("/")) for h in args.heads.split(",")]
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]
    for hq, hkv, d in heads:
        for n, L in shapes:
            for name, be in backends:
                rec = dict(attn_shape=f"{n}x{L}", heads=f"{hq}/{hkv}/{d}", torch_backend=name)
                try:
                    try:
                        ms = bench(n, L, hq, hkv, d, be, args.iters)
                    except RuntimeError:
                        # a backend without grouped kv heads: the same call on kv heads
                        # repeated to Hq (more memory traffic, the same FLOPs)
                        ms = bench(n, L, hq, hq, d, be, args.iters)
                        rec["kv_repeated"] = True
                    fl = 4.0 * n * hq * d * L * (L + 1) / 2
                    rec.update(ms=round(ms, 3), tflops=round(fl / (ms / 1e3) / 1e12, 1))
                except Exception as e:  # a backend that refuses the shape
                    rec.update(error=str(e).splitlines()[0][:200])
                print(json.dumps(rec), flush=True)
                torch.cuda.empty_cache()
    print(f"# torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
