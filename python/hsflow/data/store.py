# SPDX-License-Identifier: Apache-2.0
"""hsflow-data store info|verify|export DIR: the consumer's --store from Python.

    info     the run the store is bound to, coverage, bytes and dtype
    verify   every stored region read back and checksummed again
             (hs_checksum64 of libhsflow, the very function the consumer uses)
    export   per-sample files in speculators' offline layout (hs_connectors'
             FileTransfer cache: hidden_states/hs_<sample>.safetensors with
             hidden_states [T, k, H] bf16 and token_ids [T] int64, plus
             loss_mask [T] uint8; or --format pt: data_<sample>.pt, the v1
             dict speculators' SampleFileDataset loads), sample_lengths.json

The formats are those store_int.h describes; every length read from a file
is checked against the store's plan before use. fp8 runs are exported as
bf16, dequantised exactly as the consumer does (e4m3 * scale, rounded to
bf16 nearest even).
"""
import argparse
import ctypes
import hashlib
import json
import os
import struct
import sys

import numpy as np

REC = struct.Struct("<6I5Q")  # hs_store_rec_t: 64 bytes
REC_MAGIC = 0x31495348
PLAN_MAGIC = 0x31505348
STORE_VERSION = 2
BATCH_MAGIC = 0x31425348
ALIGN = 256
HEADER = 256


class StoreError(Exception):
    """A store that cannot be read as one: the message says what and what to do."""


def _lib():
    from .. import _lib as L
    lib = L.load()
    lib.hs_checksum64.restype = ctypes.c_uint64
    lib.hs_checksum64.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return lib


def _checksum64(lib, buf):
    arr = np.frombuffer(buf, dtype=np.uint8)
    return lib.hs_checksum64(arr.ctypes.data, arr.size)


def _seal(lib, rec_bytes):
    return _checksum64(lib, rec_bytes[:56])


def plan_hash_of(basis, shapes, n):
    """hs_plan_hash_of() (hs_common.h): BLAKE2b of "HSPLAN02", the basis, n and the
    shapes (n_seqs[n] then n_tokens[n], u32 little-endian), its first 8 bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"HSPLAN02" + struct.pack("<QI", basis, n))
    h.update(shapes)
    return struct.unpack_from("<Q", h.digest())[0]


def _align(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def parse_layout(spec):
    """'H=256,layers=2,16,29,dtype=bf16' -> (H, [layers], dtype)."""
    h, layers, dtype, key = None, [], "bf16", None
    for tok in spec.split(","):
        if "=" in tok:
            key, val = tok.split("=", 1)
        else:
            val = tok
        if key == "H":
            h = int(val)
        elif key == "layers":
            layers.append(int(val))
        elif key == "dtype":
            dtype = val
    if not h or not layers or dtype not in ("bf16", "fp8"):
        raise StoreError("layout %r in store.json is not H=..,layers=..,dtype=bf16|fp8" % spec)
    return h, layers, dtype


def offsets(n, t, h, k, dtype):
    """The parts of a batch region (hs_batch_offsets)."""
    o = {"cu_seqlens": HEADER}
    o["sample_ids"] = _align(o["cu_seqlens"] + 4 * (n + 1))
    o["input_ids"] = _align(o["sample_ids"] + 8 * n)
    o["loss_mask"] = _align(o["input_ids"] + 4 * t)
    o["hidden"] = _align(o["loss_mask"] + t)
    if dtype == "fp8":
        o["scales"] = _align(o["hidden"] + t * k * h)
        o["total"] = _align(o["scales"] + 4 * t)
    else:
        o["total"] = o["scales"] = _align(o["hidden"] + 2 * t * k * h)
    return o


class Store:
    """A store folder, read only: its run, plan and the records that check."""

    def __init__(self, path):
        self.path = path
        try:
            with open(os.path.join(path, "store.json"), "rb") as f:
                man = json.loads(f.read(1 << 20))
        except FileNotFoundError:
            raise StoreError("%s: no store.json; not a store an hsflow consumer wrote (or it "
                             "has not defined its run yet)" % path) from None
        except (OSError, ValueError) as e:
            raise StoreError("%s/store.json: %s" % (path, e)) from None
        if man.get("format") == "hsflow-store" and man.get("version") == 1:
            raise StoreError("%s/store.json: version 1, written by an earlier hsflow whose plan "
                             "hash did not cover the batch shapes nor name the target; move the "
                             "store away and start a new one" % path)
        if man.get("format") != "hsflow-store" or man.get("version") != STORE_VERSION:
            raise StoreError("%s/store.json: not an hsflow store record (format "
                             "hsflow-store, version %d)" % (path, STORE_VERSION))
        self.manifest = man
        self.n_batches = int(man["n_batches"])
        if not 0 < self.n_batches <= 1 << 24:
            raise StoreError("%s/store.json: n_batches %d out of range" % (path, self.n_batches))
        self.hidden_size, self.layers, self.dtype = parse_layout(man["layout"])
        self.plan_hash = int(man["plan_hash"], 16)
        want = 8 + 8 * self.n_batches + 8
        with open(os.path.join(path, "plan.bin"), "rb") as f:
            plan = f.read(want + 1)
        lib = _lib()
        if (len(plan) != want or struct.unpack_from("<2I", plan) != (PLAN_MAGIC, self.n_batches)
                or struct.unpack_from("<Q", plan, want - 8)[0] != _checksum64(lib, plan[:-8])):
            raise StoreError("%s/plan.bin: not the plan of store.json (length, count or "
                             "checksum wrong)" % path)
        self.n_seqs = np.frombuffer(plan, "<u4", self.n_batches, 8)
        self.n_tokens = np.frombuffer(plan, "<u4", self.n_batches, 8 + 4 * self.n_batches)
        got = plan_hash_of(int(man["plan_basis"], 16), plan[8:-8], self.n_batches)
        if got != self.plan_hash:
            raise StoreError("%s/plan.bin: its batch shapes hash to %016x, not to the plan %s of "
                             "store.json; move the store away and start a new one"
                             % (path, got, man["plan_hash"]))
        self.loc, self.dropped = {}, 0
        try:
            with open(os.path.join(path, "index.hsi"), "rb") as f:
                index = f.read()
        except FileNotFoundError:
            index = b""
        self.dropped += 1 if len(index) % 64 else 0
        k = len(self.layers)
        sizes = {}
        for i in range(len(index) // 64):
            raw = index[64 * i:64 * i + 64]
            magic, batch, shard, n, t, _, off, nbytes, csum, plan_hash, seal = REC.unpack(raw)
            ok = (magic == REC_MAGIC and seal == _seal(lib, raw) and plan_hash == self.plan_hash
                  and batch < self.n_batches and n == self.n_seqs[batch]
                  and t == self.n_tokens[batch] and off % 4096 == 0
                  and nbytes == offsets(n, t, self.hidden_size, k, self.dtype)["total"])
            if ok:
                if shard not in sizes:
                    try:
                        sizes[shard] = os.path.getsize(self.shard_path(shard))
                    except OSError:
                        sizes[shard] = -1
                ok = off + nbytes <= sizes[shard]
            if ok:
                self.loc[batch] = (shard, off, nbytes, csum)
            else:
                self.dropped += 1

    def shard_path(self, shard):
        return os.path.join(self.path, "shard-%05u.hsd" % shard)

    def read(self, batch):
        """The region of `batch` as bytes (header checked against its record)."""
        shard, off, nbytes, csum = self.loc[batch]
        with open(self.shard_path(shard), "rb") as f:
            f.seek(off)
            region = f.read(nbytes)
        if len(region) != nbytes:
            raise StoreError("%s: batch %d cut short" % (self.shard_path(shard), batch))
        magic, = struct.unpack_from("<I", region, 0)
        index, = struct.unpack_from("<I", region, 12)
        checksum, = struct.unpack_from("<Q", region, 48)
        if magic != BATCH_MAGIC or index != batch or checksum != csum:
            raise StoreError("%s at %d: not the region of batch %d the index recorded"
                             % (self.shard_path(shard), off, batch))
        return region

    def verify(self, batch, lib):
        region = self.read(batch)
        body = _checksum64(lib, region[HEADER:])
        return body == self.loc[batch][3]

    def samples(self, batch, region):
        """(sample_id, input_ids, loss_mask, hidden bf16 bits [T, k, H]) of each sequence."""
        n, t = int(self.n_seqs[batch]), int(self.n_tokens[batch])
        h, k = self.hidden_size, len(self.layers)
        o = offsets(n, t, h, k, self.dtype)
        cu = np.frombuffer(region, "<i4", n + 1, o["cu_seqlens"])
        ids = np.frombuffer(region, "<u8", n, o["sample_ids"])
        tok = np.frombuffer(region, "<i4", t, o["input_ids"])
        mask = np.frombuffer(region, "u1", t, o["loss_mask"])
        if self.dtype == "fp8":
            q = np.frombuffer(region, "u1", t * k * h, o["hidden"]).reshape(t, k * h)
            scales = np.frombuffer(region, "<f4", t, o["scales"])
            check_fp8_rows(batch, q, scales)
            hidden = _fp8_to_bf16_bits(q, scales)
        else:
            hidden = np.frombuffer(region, "<u2", t * k * h, o["hidden"]).reshape(t, k * h)
        if cu[0] != 0 or cu[-1] != t or np.any(np.diff(cu) <= 0):
            raise StoreError("batch %d: cu_seqlens are not increasing from 0 to %d" % (batch, t))
        for i in range(n):
            a, b = int(cu[i]), int(cu[i + 1])
            yield int(ids[i]), tok[a:b], mask[a:b], hidden[a:b].reshape(b - a, k, h)


def _e4m3_table():
    v = np.zeros(256, np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            x = np.nan
        elif e == 0:
            x = m / 8.0 * 2.0 ** -6
        else:
            x = (1 + m / 8.0) * 2.0 ** (e - 7)
        v[c] = -x if s else x
    return v


def check_fp8_rows(batch, q, scales):
    """Refuses fp8 rows that mean no number, as the consumer's hs_fp8_row_check
    does: a scale that is NaN, infinite, negative (-0 included) or so large
    that code 448 overflows bf16; a scale of 0 over non-zero codes; a NaN code
    (0x7f, 0xff). q is [T, k*H] uint8, scales [T] float32."""
    bits = scales.view(np.uint32)
    mag = q & 0x7F
    with np.errstate(over="ignore", invalid="ignore"):
        top = _bf16_bits(np.float32(448.0) * scales.astype(np.float32))
    bad = (~np.isfinite(scales)) | ((bits >> 31) == 1) | ((top & 0x7FFF) >= 0x7F80)
    bad |= (scales == 0) & mag.any(axis=1)
    bad |= (mag == 0x7F).any(axis=1)
    if bad.any():
        t = int(np.argmax(bad))
        raise StoreError("batch %d token %d: fp8 scale %r over codes that mean no number (a "
                         "scale must be finite and positive, 0 only for a row of zeros; codes "
                         "0x7f/0xff are NaN): nothing is exported from a row its producer got "
                         "wrong; the consumer refuses it too and computes the batch again at "
                         "its next run with this --store"
                         % (batch, t, float(scales[t])))


def _bf16_bits(x):
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even


def _fp8_to_bf16_bits(q, scales):
    x = _e4m3_table()[q] * scales[:, None].astype(np.float32)
    bits = x.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # nearest even
    return (rounded >> 16).astype(np.uint16)


def _write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype name, shape, bytes). Written whole, then renamed."""
    header, off = {"__metadata__": metadata}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, (_, _, data) in tensors.items():
            f.write(data)
    os.replace(tmp, path)


def cmd_info(st):
    stored = sum(int(os.path.getsize(st.shard_path(s))) for s in {v[0] for v in st.loc.values()})
    nbytes = sum(v[2] for v in st.loc.values())
    m = st.manifest
    print("store       %s" % st.path)
    print("dataset     %s" % m["dataset_fingerprint"])
    print("layout      %s" % m["layout"])
    print("dtype       %s" % st.dtype)
    print("plan        %s (%d batches/epoch, budget %d tokens, seed %s)"
          % (m["plan_hash"], st.n_batches, m["token_budget"], m["seed"]))
    print("target      %s (%s)" % (m["target_fingerprint"], m.get("model") or "unnamed"))
    print("stored      %d of %d batches (%.1f%%)%s" % (
        len(st.loc), st.n_batches, 100.0 * len(st.loc) / st.n_batches,
        ", complete" if len(st.loc) == st.n_batches else ""))
    print("bytes       %d in regions, %d in shards" % (nbytes, stored))
    if st.dropped:
        print("dropped     %d index record(s) (torn or sealed wrong): those batches are computed "
              "again" % st.dropped)
    return 0


def cmd_verify(st):
    lib, bad = _lib(), 0
    for b in sorted(st.loc):
        try:
            ok = st.verify(b, lib)
        except (OSError, StoreError) as e:
            ok = False
            print("batch %d: %s" % (b, e), file=sys.stderr)
        if not ok:
            bad += 1
            print("batch %d: checksum differs: the consumer computes it again" % b,
                  file=sys.stderr)
    print("verified %d region(s): %d good, %d bad" % (len(st.loc), len(st.loc) - bad, bad))
    return 1 if bad else 0


def cmd_export(st, out, fmt):
    if not st.loc:
        raise StoreError("%s holds no batch to export" % st.path)
    k, h = len(st.layers), st.hidden_size
    torch = None
    if fmt == "pt":
        try:
            import torch
        except ImportError:
            raise StoreError("--format pt needs torch; --format safetensors does not") from None
    target = os.path.join(out, "hidden_states") if fmt == "safetensors" else out
    os.makedirs(target, exist_ok=True)
    lengths, lib = {}, _lib()
    meta = {"layers": ",".join(map(str, st.layers)), "source": "hsflow store",
            "plan_hash": st.manifest["plan_hash"],
            "dataset_fingerprint": st.manifest["dataset_fingerprint"],
            "target_fingerprint": st.manifest["target_fingerprint"],
            "target": st.manifest.get("model", "")}
    for b in sorted(st.loc):
        region = st.read(b)
        if _checksum64(lib, region[HEADER:]) != st.loc[b][3]:
            raise StoreError("batch %d fails its checksum: run hsflow-data store verify; the "
                             "consumer computes it again at its next run" % b)
        for sid, tok, mask, hid in st.samples(b, region):
            lengths[str(sid)] = int(tok.shape[0])
            if fmt == "safetensors":
                _write_safetensors(os.path.join(target, "hs_%d.safetensors" % sid), {
                    "hidden_states": ("BF16", hid.shape, np.ascontiguousarray(hid).tobytes()),
                    "token_ids": ("I64", tok.shape, tok.astype("<i8").tobytes()),
                    "loss_mask": ("U8", mask.shape, mask.tobytes()),
                }, meta)
            else:
                bits = torch.from_numpy(np.ascontiguousarray(hid).astype(np.int16))
                states = bits.view(torch.bfloat16)
                torch.save({"input_ids": torch.from_numpy(tok.astype(np.int64)),
                            "loss_mask": torch.from_numpy(mask.astype(np.int64)),
                            "hidden_states": [states[:, i].clone() for i in range(k)]},
                           os.path.join(target, "data_%d.pt" % sid))
    with open(os.path.join(target, "sample_lengths.json"), "w") as f:
        json.dump(lengths, f)
    print("exported %d sample(s) of %d batch(es) to %s (%s, hidden_states [T, %d, %d] bf16)"
          % (len(lengths), len(st.loc), target, fmt, k, h))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="hsflow-data store", allow_abbrev=False,
        description="Read a consumer's --store folder: its run and coverage (info), every "
                    "region checksummed again (verify), or per-sample files in speculators' "
                    "offline layout (export).",
        epilog="examples:\n  hsflow-data store info /data/hs-store\n"
               "  hsflow-data store verify /data/hs-store\n"
               "  hsflow-data store export /data/hs-store /data/eagle3-train\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    for name in ("info", "verify"):
        p = sub.add_parser(name, allow_abbrev=False)
        p.add_argument("dir")
    p = sub.add_parser("export", allow_abbrev=False)
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--format", choices=("safetensors", "pt"), default="safetensors",
                   help="hs_<sample>.safetensors under OUT/hidden_states (default), or "
                        "speculators' data_<sample>.pt (needs torch)")
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.print_help(sys.stderr)
        return 2
    try:
        st = Store(args.dir)
        if args.cmd == "info":
            return cmd_info(st)
        if args.cmd == "verify":
            return cmd_verify(st)
        return cmd_export(st, args.out, args.format)
    except StoreError as e:
        print("hsflow-data store: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("hsflow-data store: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
