#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes an FP8 checkpoint of a tiny bf16 model, as Hugging Face's
fine-grained FP8 checkpoints are, plus its dequantised twin.

    make_fp8_checkpoint.py SRC OUT_FP8 OUT_DEQ [--break KIND]

SRC: a model folder (config.json, model.safetensors or an index and shards).
OUT_FP8: the same model with every decoder Linear weight (q/k/v/o, gate/up/
down, in_proj_qkv, in_proj_z, out_proj; not in_proj_a/b) stored as F8_E4M3
with <name>_scale_inv F32 [ceil(N/128), ceil(K/128)], scale_inv = amax of the
128x128 block / 448 (1 for an all-zero block), q = e4m3(w / scale_inv)
rounded to nearest even and saturated at 448, and config.json's
quantization_config. OUT_DEQ: the same weights as F32 q * scale_inv, with
the plain config. Each computation is IEEE float32, as hsflow's loader does.

--break KIND writes OUT_FP8 malformed: scale_shape (the first factor tensor
has one column too many), no_scale (the first factor tensor missing),
block_size (weight_block_size [64, 64]), quant_method ("awq"), no_config
(F8_E4M3 tensors without quantization_config).

Needs numpy only."""
import argparse
import glob
import json
import os
import struct

import numpy as np

LINEAR = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight", "linear_attn.in_proj_qkv.weight",
          "linear_attn.in_proj_z.weight", "linear_attn.out_proj.weight")
DTYPES = {"BF16": (np.uint16, 2), "F32": (np.float32, 4), "F16": (np.float16, 2),
          "I32": (np.int32, 4), "I64": (np.int64, 8), "U8": (np.uint8, 1),
          "F8_E4M3": (np.uint8, 1)}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], raw[8 + n + b:8 + n + end])
    return out


def write_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def e4m3_table():
    """The 127 non-negative finite e4m3 values, codes 0x00..0x7e."""
    vals = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        vals.append(m / 512.0 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return np.array(vals, dtype=np.float64)


TABLE = e4m3_table()


def to_e4m3(x):
    """float32 array -> e4m3 codes, round to nearest even, saturate at 448."""
    a = np.abs(x.astype(np.float64))
    sign = np.signbit(x).astype(np.uint8) << 7
    code = np.empty(a.shape, dtype=np.uint8)
    sat = a >= 448.0
    lo = np.clip(np.searchsorted(TABLE, a, side="right") - 1, 0, 0x7D)
    dlo, dhi = a - TABLE[lo], TABLE[lo + 1] - a
    up = (dhi < dlo) | ((dhi == dlo) & (lo % 2 == 1))
    code[:] = np.where(sat, 0x7E, lo + up)
    return code | sign


def quantize(w32):
    """w [N, K] float32 (bf16 values) -> codes [N, K], scale_inv [NB, KB]."""
    N, K = w32.shape
    NB, KB = -(-N // 128), -(-K // 128)
    q = np.zeros((N, K), dtype=np.uint8)
    s = np.ones((NB, KB), dtype=np.float32)
    for nb in range(NB):
        for kb in range(KB):
            blk = w32[nb * 128:(nb + 1) * 128, kb * 128:(kb + 1) * 128]
            amax = np.float32(np.max(np.abs(blk)))
            sc = np.float32(amax / np.float32(448.0)) if amax > 0 else np.float32(1.0)
            s[nb, kb] = sc
            q[nb * 128:(nb + 1) * 128, kb * 128:(kb + 1) * 128] = to_e4m3(
                (blk / sc).astype(np.float32))
    return q, s


def dequantize(q, s):
    N, K = q.shape
    mag = TABLE[np.minimum(q & 0x7F, 0x7E)].astype(np.float32)
    v = np.where(q & 0x80, -mag, mag).astype(np.float32)
    rows = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:N, :K]
    return (v * rows).astype(np.float32)


def as_f32(dtype, shape, data):
    np_t, _ = DTYPES[dtype]
    a = np.frombuffer(data, dtype=np_t).reshape(shape)
    if dtype == "BF16":
        return bf16_to_f32(a)
    # loaded as bf16 by hsflow: round first
    return bf16_to_f32(f32_to_bf16_bits(a.astype(np.float32)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("out_fp8")
    ap.add_argument("out_deq")
    ap.add_argument("--break", dest="brk", default="")
    args = ap.parse_args()
    tensors = {}
    for p in sorted(glob.glob(os.path.join(args.src, "model*.safetensors"))):
        tensors.update(read_safetensors(p))
    with open(os.path.join(args.src, "config.json")) as f:
        cfg = json.load(f)
    fp8, deq, first = {}, {}, True
    for name, (dtype, shape, data) in tensors.items():
        decoder = ".layers." in name and not name.startswith(("mtp.", "model.visual."))
        if not (decoder and name.endswith(LINEAR) and len(shape) == 2):
            fp8[name] = deq[name] = (dtype, shape, data)
            continue
        q, s = quantize(as_f32(dtype, shape, data))
        fp8[name] = ("F8_E4M3", shape, q.tobytes())
        if first and args.brk == "scale_shape":
            s = np.concatenate([s, np.ones((s.shape[0], 1), np.float32)], axis=1)
        if not (first and args.brk == "no_scale"):
            fp8[name + "_scale_inv"] = ("F32", s.shape, s.astype(np.float32).tobytes())
        deq[name] = ("F32", shape, dequantize(q, s[:, :-(-shape[1] // 128)]).tobytes())
        first = False
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
          "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
    if args.brk == "block_size":
        qc["weight_block_size"] = [64, 64]
    if args.brk == "quant_method":
        qc["quant_method"] = "awq"
    for out, ts, quant in ((args.out_fp8, fp8, args.brk != "no_config"), (args.out_deq, deq, False)):
        os.makedirs(out, exist_ok=True)
        c = dict(cfg)
        if quant:
            c["quantization_config"] = qc
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f, indent=1)
        write_safetensors(os.path.join(out, "model.safetensors"), ts)


if __name__ == "__main__":
    main()
