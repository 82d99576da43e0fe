#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""forward_parity.py - the CUDA forward against transformers (bf16, sdpa, on
the GPU) and against the CPU forward, layer by layer, for every family in
tests/data, on several batch shapes.

For each family folder and each shape (a list of sequence lengths), random
token ids are packed into one JSONL file and run through
  hs-forward --device cuda:0   and   hs-forward --device cpu
with every output_hidden_states index captured; transformers runs each
sequence alone (it does not pack) and the rows are concatenated. Per layer it
prints ||a - b|| / ||b|| for cuda vs transformers, cuda vs cpu and cpu vs
transformers, and fails (exit 1) when cuda is off by more than bf16 allows
(3e-2 against transformers bf16, 2e-2 against the CPU forward).

Run on the GPU machine from the project root after building with CUDA:
    python3 scripts/bench/forward_parity.py --bin build-cuda/bin --data tests/data
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file

SHAPES = {"golden": None, "odd": [1, 33, 64, 65, 130], "long": [300]}



def bin_env():
    """Environment for hsflow's binaries: HS_LD_LIBRARY_PATH (the runtime
    libraries they need, e.g. a bundled sysroot on a host without them) goes in front of
    LD_LIBRARY_PATH for them only, not for torch in this process."""
    env = dict(os.environ)
    extra = os.environ.get("HS_LD_LIBRARY_PATH")
    if extra:
        env["LD_LIBRARY_PATH"] = extra + ":" + env.get("LD_LIBRARY_PATH", "")
    return env

def run_hs(args, model_dir, data, layers, device, out):
    cmd = [os.path.join(args.bin, "hs-forward"), "--model", model_dir, "--data", data, "--layers",
           ",".join(map(str, layers)), "--device", device, "--out", out]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=bin_env())
    if r.returncode:
        print(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}", flush=True)
        return None
    return load_file(out)


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build-cuda/bin")
    ap.add_argument("--data", default="tests/data")
    ap.add_argument("--tol-tf", type=float, default=3e-2)
    ap.add_argument("--tol-cpu", type=float, default=2e-2)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    failures = 0
    tmp = tempfile.mkdtemp(prefix="hs-parity-")
    print(f"{'family':8} {'shape':7} {'layer':>5} {'cuda~tf':>10} {'cuda~cpu':>10} {'cpu~tf':>10}")
    for fam in sorted(os.listdir(args.data)):
        d = os.path.join(args.data, fam)
        if not os.path.exists(os.path.join(d, "config.json")):
            continue
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa").cuda().eval()
        N = model.config.num_hidden_layers
        layers = list(range(N + 1))
        golden = load_file(os.path.join(d, "golden.safetensors"))
        g = torch.Generator().manual_seed(11)
        for shape, lens in SHAPES.items():
            if lens is None:
                cu, ids = golden["cu_seqlens"].tolist(), golden["input_ids"]
                seqs = [ids[cu[i]:cu[i + 1]] for i in range(len(cu) - 1)]
            else:
                seqs = [torch.randint(0, model.config.vocab_size, (n,), generator=g) for n in lens]
            data = os.path.join(tmp, f"{fam}-{shape}.jsonl")
            with open(data, "w") as f:
                for s in seqs:
                    f.write(json.dumps({"input_ids": [int(x) for x in s]}) + "\n")
            cuda = run_hs(args, d, data, layers, "cuda:0", os.path.join(tmp, "cuda.safetensors"))
            cpu = run_hs(args, d, data, layers, "cpu", os.path.join(tmp, "cpu.safetensors"))
            refs = [[] for _ in layers]
            with torch.inference_mode():
                for s in seqs:
                    hs = model.model(input_ids=torch.as_tensor(s)[None].cuda(),
                                     output_hidden_states=True, use_cache=False).hidden_states
                    for l in layers:
                        refs[l].append(hs[l][0].float().cpu())
            if cuda is None or cpu is None:
                failures += 1
                continue
            for l in layers:
                ref = torch.cat(refs[l])
                c = cuda[f"hidden_states.{l}"].float()
                p = cpu[f"hidden_states.{l}"].float()
                a, b, e = rel(c, ref), rel(c, p), rel(p, ref)
                bad = not (a <= args.tol_tf and b <= args.tol_cpu) or torch.isnan(c).any().item()
                failures += bad
                print(f"{fam:8} {shape:7} {l:5d} {a:10.3e} {b:10.3e} {e:10.3e}{'  <-- FAIL' if bad else ''}",
                      flush=True)
        del model
        torch.cuda.empty_cache()
    print(f"parity: {'FAILED ' + str(failures) + ' layer(s)' if failures else 'all families within bounds'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
