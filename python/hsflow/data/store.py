# SPDX-License-Identifier: Apache-2.0
"""hsflow-data store info|verify|export DIR: the consumer's --store from Python.

    info     the run the store is bound to, coverage, bytes and dtype
    verify   every stored region read back and checksummed again
             (hs_checksum64 of libhsflow, the very function the consumer uses)
    export   speculators' offline layout, read by its own loaders unchanged:
             the dataset rows its ArrowDataset reads (datasets' save_to_disk:
             input_ids, loss_mask, seq_len, plus sample_id) and, row i beside
             it, hidden_states/hs_<i>.safetensors as hs_connectors' file
             backend holds them (hidden_states [T, k, H] bf16, token_ids [T]
             int64, loss_mask [T] uint8); or --format pt: data_<i>.pt, the v1
             dict of speculators' older SampleFileDataset

Files are opened inside the store's folder without following links
(O_NOFOLLOW), regular files only (a FIFO is refused, never waited on), and
every size is bounded before anything is read; every length read from a file
is checked against the store's plan before use. fp8 runs are exported as
bf16, dequantised exactly as the consumer does (e4m3 * scale, rounded to
bf16 nearest even).

Export is exact or refused (docs/store.md): only a complete store is
exported; speculators reads the last layer of each file as the verifier's
final state *before* its final norm (vLLM's id N) and applies the norm
itself, while hsflow's layer N is after it, so a store whose layers end with
N is exported only with --normed-final-state (marked so in
hsflow_export.json), for a trainer that makes the drafter's verifier_norm an
identity (hsflow.integrations.speculators.use_normed_targets). Everything is written into a
private temporary folder beside OUT and renamed to OUT at the end: a failed
export (a full disk, a bad region) leaves nothing under OUT.
"""
import argparse
import ctypes
import errno
import hashlib
import json
import os
import shutil
import stat
import struct
import sys
import tempfile

import numpy as np

from .. import _dtypes

REC = struct.Struct("<6I5Q")  # hs_store_rec_t: 64 bytes
REC_MAGIC = 0x31495348
MANIFEST_MAX = 1 << 20         # store.json, and a verifier's config.json
INDEX_SLACK = 4                # index records a batch may have (rewritten after a bad read)
READ_CHUNK = 64 * 4096         # index records read at a time
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
    """hs_plan_hash_of() (hs_plan_hash.h): BLAKE2b of "HSPLAN02", the basis, n and the
    shapes (n_seqs[n] then n_tokens[n], u32 little-endian), its first 8 bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"HSPLAN02" + struct.pack("<QI", basis, n))
    h.update(shapes)
    return struct.unpack_from("<Q", h.digest())[0]


def _align(x):
    return (x + ALIGN - 1) // ALIGN * ALIGN


def parse_layout(spec):
    """'H=256,layers=2,16,29,dtype=bf16' -> (H, [layers], dtype)."""
    h, layers, dtype, key = None, [], _dtypes.DEFAULT, None
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
    if not h or not layers or dtype not in _dtypes.BY_NAME:
        raise StoreError("layout %r in store.json is not H=..,layers=..,dtype=%s"
                         % (spec, _dtypes.names(sep="|", last_sep="|")))
    return h, layers, dtype


def offsets(n, t, h, k, dtype):
    """The parts of a batch region (hs_batch_offsets)."""
    o = {"cu_seqlens": HEADER}
    o["sample_ids"] = _align(o["cu_seqlens"] + 4 * (n + 1))
    o["input_ids"] = _align(o["sample_ids"] + 8 * n)
    o["loss_mask"] = _align(o["input_ids"] + 4 * t)
    o["hidden"] = _align(o["loss_mask"] + t)
    d = _dtypes.BY_NAME[dtype]  # the values, then (fp8) one scale per token
    o["scales"] = _align(o["hidden"] + d.elem_bytes * t * k * h)
    o["total"] = _align(o["scales"] + d.row_scale_bytes * t) if d.row_scale_bytes else o["scales"]
    return o


def _open_in(dirfd, name, what, limit=None):
    """fd, size of the regular file `name` inside the open folder `dirfd`,
    never through a symbolic link and never blocking on a FIFO; refused when
    larger than `limit`. FileNotFoundError passes through."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dirfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError("%s is a symbolic link: refused (a store's files are read only "
                             "as the regular files the consumer wrote)" % what) from None
        if isinstance(e, FileNotFoundError):
            raise
        raise StoreError("%s: %s" % (what, e.strerror)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError("%s is not a regular file (a FIFO, device or folder): refused"
                             % what)
        if limit is not None and st.st_size > limit:
            raise StoreError("%s is %d bytes, more than %d this store can have: refused"
                             % (what, st.st_size, limit))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def _read_fd(fd, size, what, offset=0):
    """Exactly `size` bytes at `offset` (bounded by the caller)."""
    out, got = bytearray(size), 0
    view = memoryview(out)
    while got < size:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise StoreError("%s: cut short at %d of %d bytes" % (what, got, size))
        got += n
    return bytes(out)


class Store:
    """A store folder, read only: its run, plan and the records that check.
    close() (or a with block) releases its descriptors."""

    def __init__(self, path):
        self.path = path
        self._fds = {}
        try:
            self.dirfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise StoreError("%s: no such folder; give the folder the consumer's --store "
                             "wrote" % path) from None
        except OSError as e:
            raise StoreError("%s: %s (a store is a folder)" % (path, e.strerror)) from None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        if getattr(self, "dirfd", None) is not None:
            os.close(self.dirfd)
            self.dirfd = None

    def _file(self, name, limit):
        what = os.path.join(self.path, name)
        fd, size = _open_in(self.dirfd, name, what, limit)
        try:
            return _read_fd(fd, size, what)
        finally:
            os.close(fd)

    def _open(self):
        path = self.path
        try:
            raw = self._file("store.json", MANIFEST_MAX)
        except FileNotFoundError:
            raise StoreError("%s: no store.json; not a store an hsflow consumer wrote (or it "
                             "has not defined its run yet)" % path) from None
        try:
            man = json.loads(raw)
        except ValueError as e:
            raise StoreError("%s/store.json: %s" % (path, e)) from None
        if not isinstance(man, dict):
            raise StoreError("%s/store.json: not a JSON object" % path)
        if man.get("format") == "hsflow-store" and man.get("version") == 1:
            raise StoreError("%s/store.json: version 1, written by an earlier hsflow whose plan "
                             "hash did not cover the batch shapes nor name the target; move the "
                             "store away and start a new one" % path)
        if man.get("format") != "hsflow-store" or man.get("version") != STORE_VERSION:
            raise StoreError("%s/store.json: not an hsflow store record (format "
                             "hsflow-store, version %d)" % (path, STORE_VERSION))
        self.manifest = man
        try:
            self.n_batches = int(man["n_batches"])
            self.hidden_size, self.layers, self.dtype = parse_layout(str(man["layout"]))
            self.plan_hash = int(man["plan_hash"], 16)
        except (KeyError, TypeError, ValueError) as e:
            raise StoreError("%s/store.json: field %s missing or malformed" % (path, e)) from None
        if not 0 < self.n_batches <= 1 << 24:
            raise StoreError("%s/store.json: n_batches %d out of range" % (path, self.n_batches))
        want = 8 + 8 * self.n_batches + 8
        try:
            plan = self._file("plan.bin", want)
        except FileNotFoundError:
            raise StoreError("%s: no plan.bin beside store.json" % path) from None
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
        limit = 64 * (INDEX_SLACK * self.n_batches + 4096)
        try:
            fd, size = _open_in(self.dirfd, "index.hsi", os.path.join(path, "index.hsi"), limit)
        except FileNotFoundError:
            fd, size = None, 0
        self.dropped += 1 if size % 64 else 0
        k = len(self.layers)
        sizes = {}
        try:
            for chunk_off in range(0, size - size % 64, READ_CHUNK):
                n = min(READ_CHUNK, size - size % 64 - chunk_off)
                chunk = _read_fd(fd, n, os.path.join(path, "index.hsi"), chunk_off)
                for i in range(n // 64):
                    raw = chunk[64 * i:64 * i + 64]
                    self._record(lib, raw, k, sizes)
        finally:
            if fd is not None:
                os.close(fd)

    def _record(self, lib, raw, k, sizes):
        magic, batch, shard, n, t, _, off, nbytes, csum, plan_hash, seal = REC.unpack(raw)
        ok = (magic == REC_MAGIC and seal == _seal(lib, raw) and plan_hash == self.plan_hash
              and batch < self.n_batches and n == self.n_seqs[batch]
              and t == self.n_tokens[batch] and off % 4096 == 0
              and nbytes == offsets(n, t, self.hidden_size, k, self.dtype)["total"])
        if ok:
            if shard not in sizes:
                try:
                    sizes[shard] = self._shard_fd_size(shard)
                except (OSError, StoreError):
                    sizes[shard] = -1
            ok = off + nbytes <= sizes[shard]
        if ok:
            self.loc[batch] = (shard, off, nbytes, csum)
        else:
            self.dropped += 1

    def _shard_fd_size(self, shard):
        name = "shard-%05u.hsd" % shard
        fd, size = _open_in(self.dirfd, name, os.path.join(self.path, name))
        self._fds[shard] = fd
        return size

    def missing(self):
        """The batch ids of the plan the store does not hold (in order)."""
        return [b for b in range(self.n_batches) if b not in self.loc]

    def shard_path(self, shard):
        return os.path.join(self.path, "shard-%05u.hsd" % shard)

    def read(self, batch):
        """The region of `batch` as bytes (header checked against its record)."""
        shard, off, nbytes, csum = self.loc[batch]
        region = _read_fd(self._fds[shard], nbytes, "%s: batch %d" % (self.shard_path(shard),
                                                                       batch), off)
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


def _safetensors_bytes(tensors, metadata):
    """tensors: name -> (dtype name, shape, bytes); the file's bytes in parts."""
    header, off = {"__metadata__": metadata}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return [struct.pack("<Q", len(h)) + h] + [data for _, _, data in tensors.values()]


def _create(dirfd, name, parts):
    """A new file `name` in the folder `dirfd` (export's own private folder:
    O_EXCL and O_NOFOLLOW all the same), written whole."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644, dir_fd=dirfd)
    try:
        for part in parts:
            view = memoryview(part)
            while view:
                view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def read_verifier(path):
    """(decoder layers N, hidden size) from a target folder's config.json
    (the text decoder's, for a vision-language checkpoint), read bounded."""
    what = os.path.join(path, "config.json")
    try:
        with open(what, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise StoreError("%s is not a regular file" % what)
            raw = f.read(MANIFEST_MAX + 1)
    except OSError as e:
        raise StoreError("--verifier %s: %s; give the target's folder (its config.json), as "
                         "speculators' --verifier-name-or-path" % (path, e.strerror)) from None
    try:
        if len(raw) > MANIFEST_MAX:
            raise ValueError("larger than %d bytes" % MANIFEST_MAX)
        cfg = json.loads(raw)
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        n, h = text["num_hidden_layers"], text["hidden_size"]
        if not (isinstance(n, int) and isinstance(h, int) and 0 < n < 1 << 16 and 0 < h < 1 << 20):
            raise ValueError("num_hidden_layers %r, hidden_size %r" % (n, h))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StoreError("--verifier %s: config.json gives no decoder depth and width (%s)"
                         % (path, e)) from None
    return n, h


def final_state(st, verifier, normed):
    """What the last exported layer is to speculators, or StoreError saying
    why it would be wrong. speculators splits each file's last layer off as
    verifier_last_hidden_states: vLLM's id N, the last decoder layer's output
    *before* the final norm, to which its drafter applies the verifier's norm
    (verifier_norm). hsflow's layer N is output_hidden_states[N], *after* it."""
    if verifier is None:
        model = st.manifest.get("model") or ""
        if not (model and os.path.isfile(os.path.join(model, "config.json"))):
            raise StoreError("export needs the target's folder to tell whether this store's last "
                             "layer (%d) is its final state: give --verifier DIR (speculators' "
                             "--verifier-name-or-path; store.json names the target %r)"
                             % (st.layers[-1], model))
        verifier = model
    n, h = read_verifier(verifier)
    if h != st.hidden_size:
        raise StoreError("--verifier %s has hidden size %d, the store's states %d: not the "
                         "target of this store" % (verifier, h, st.hidden_size))
    last = st.layers[-1]
    if last != n:
        raise StoreError(
            "speculators reads the last layer of each file as the verifier's final state (its "
            "verifier_last_hidden_states, vLLM's id N = %d of this %d-layer target); this "
            "store's layers %s end with %d, not N: fill a store with the drafter's "
            "target_layer_ids and then N (--layers ...,%d; --eagle3-layers)"
            % (n, n, ",".join(map(str, st.layers)), last, n))
    if not normed:
        raise StoreError(
            "layer N = %d of this store is hsflow's final state, *after* the target's final norm "
            "(output_hidden_states[N]); speculators' file backend hands it to the drafter as "
            "vLLM's state *before* that norm, and the drafter applies the verifier's norm "
            "(verifier_norm) to it again: every target would be wrong, and the state before "
            "the norm cannot be recovered from the normed one. Train from the store itself "
            "(hsflow.integrations.speculators, examples/train_speculators.py: exact, they make "
            "verifier_norm an identity), or export with --normed-final-state (marked so in "
            "hsflow_export.json) and train these files only with a trainer that makes "
            "verifier_norm an identity (hsflow.integrations.speculators.use_normed_targets), "
            "never with plain `speculators train`"
            % n)
    return {"final_state": "normed", "verifier_layers": n}


def cmd_info(st):
    shards = {v[0] for v in st.loc.values()}
    stored = sum(os.fstat(st._fds[s]).st_size for s in shards)
    nbytes = sum(v[2] for v in st.loc.values())
    m = st.manifest
    print("store       %s" % st.path)
    print("dataset     %s" % m.get("dataset_fingerprint"))
    print("layout      %s" % m["layout"])
    print("dtype       %s" % st.dtype)
    print("plan        %s (%d batches/epoch, budget %s tokens, seed %s)"
          % (m["plan_hash"], st.n_batches, m.get("token_budget"), m.get("seed")))
    print("target      %s (%s)" % (m.get("target_fingerprint"), m.get("model") or "unnamed"))
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


def _ranges(ids, most=8):
    """'3-5, 9, 12-20' of sorted ints, the first `most` runs."""
    runs, start = [], None
    for i, b in enumerate(ids):
        if start is None:
            start = b
        if i + 1 == len(ids) or ids[i + 1] != b + 1:
            runs.append(str(start) if start == b else "%d-%d" % (start, b))
            start = None
    return ", ".join(runs[:most]) + (", ..." if len(runs) > most else "")


def sample_index(st):
    """sample id -> (batch, row) over the whole store, from each region's
    cu_seqlens and sample_ids (checked against the checksummed body when the
    region is read whole); a sample stored twice is refused."""
    index = {}
    k = len(st.layers)
    for b in sorted(st.loc):
        shard, off, _, _ = st.loc[b]
        n, t = int(st.n_seqs[b]), int(st.n_tokens[b])
        o = offsets(n, t, st.hidden_size, k, st.dtype)
        head = _read_fd(st._fds[shard], o["input_ids"], "%s: batch %d" % (st.shard_path(shard), b),
                        off)
        ids = np.frombuffer(head, "<u8", n, o["sample_ids"])
        for row, sid in enumerate(ids.tolist()):
            if sid in index:
                raise StoreError("sample %d is stored twice (batches %d and %d): not the store "
                                 "of one plan" % (sid, index[sid][0], b))
            index[sid] = (b, row)
    return index


def cmd_export(st, out, fmt, verifier=None, normed=False, seed=None):
    missing = st.missing()
    if missing:
        raise StoreError(
            "%s holds %d of %d batches; missing: batch(es) %s (%d in all%s). Run the consumer "
            "with --store %s until `hsflow-data store info` says complete (producers are asked "
            "only for what it lacks); nothing was exported"
            % (st.path, len(st.loc), st.n_batches, _ranges(missing), len(missing),
               ", %d index record(s) dropped as torn or sealed wrong" % st.dropped
               if st.dropped else "", st.path))
    # rows alone carry no state: the hsflow backend serves them from the store
    final = final_state(st, verifier, normed or fmt == "rows")
    out = os.path.abspath(out)
    if os.path.lexists(out):
        if os.path.islink(out) or not os.path.isdir(out) or os.listdir(out):
            raise StoreError("%s exists and is not an empty folder: give a new OUT (export "
                             "writes a whole folder and never merges into one)" % out)
    k, h = len(st.layers), st.hidden_size
    torch = datasets = None
    try:
        if fmt == "pt":
            import torch
        if fmt != "pt":
            import datasets
    except ImportError as e:
        raise StoreError("--format %s needs %s (%s); speculators' environment has it"
                         % (fmt, "torch" if fmt == "pt" else "datasets", e)) from None
    index = sample_index(st)
    order = sorted(index)
    if seed is not None:  # as speculators' prepare-data shuffles its rows
        order = [order[i] for i in np.random.default_rng(seed).permutation(len(order))]
    pos = {sid: i for i, sid in enumerate(order)}
    meta = {"layers": ",".join(map(str, st.layers)), "source": "hsflow store",
            "plan_hash": st.manifest["plan_hash"], "final_state": final["final_state"],
            "dataset_fingerprint": str(st.manifest.get("dataset_fingerprint")),
            "target_fingerprint": str(st.manifest.get("target_fingerprint")),
            "target": str(st.manifest.get("model") or "")}
    parent = os.path.dirname(out)
    tmp = tempfile.mkdtemp(prefix=".%s.export-" % os.path.basename(out), dir=parent)
    written, lib = 0, _lib()
    try:
        files = os.path.join(tmp, "hidden_states") if fmt == "safetensors" else tmp
        os.makedirs(files, exist_ok=True)
        dfd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        rows_ids, rows_mask = [None] * len(order), [None] * len(order)
        try:
            for b in sorted(st.loc):
                region = st.read(b)
                if _checksum64(lib, region[HEADER:]) != st.loc[b][3]:
                    raise StoreError("batch %d fails its checksum: run hsflow-data store verify; "
                                     "the consumer computes it again at its next run" % b)
                for row, (sid, tok, mask, hid) in enumerate(st.samples(b, region)):
                    if index.get(sid) != (b, row):
                        raise StoreError("batch %d changed while it was read; run the export "
                                         "again" % b)
                    i = pos[sid]
                    rows_ids[i], rows_mask[i] = tok.astype(np.int64), mask.astype(np.int64)
                    if fmt == "rows":
                        pass
                    elif fmt == "safetensors":
                        _create(dfd, "hs_%d.safetensors" % i, _safetensors_bytes({
                            "hidden_states": ("BF16", hid.shape,
                                              np.ascontiguousarray(hid).tobytes()),
                            "token_ids": ("I64", tok.shape, tok.astype("<i8").tobytes()),
                            "loss_mask": ("U8", mask.shape, mask.tobytes()),
                        }, dict(meta, sample_id=str(sid))))
                    else:
                        bits = torch.from_numpy(np.ascontiguousarray(hid).astype(np.int16))
                        states = bits.view(torch.bfloat16)
                        torch.save({"input_ids": torch.from_numpy(tok.astype(np.int64)),
                                    "loss_mask": torch.from_numpy(mask.astype(np.int64)),
                                    "hidden_states": [states[:, j].clone() for j in range(k)]},
                                   os.path.join(files, "data_%d.pt" % i))
                    written += 1
            lengths = {str(i): int(len(rows_ids[i])) for i in range(len(order))}
            _create(dfd, "sample_lengths.json", [json.dumps(lengths).encode()])
        finally:
            os.close(dfd)
        if fmt != "pt":
            ds = datasets.Dataset.from_dict({
                "input_ids": rows_ids, "loss_mask": rows_mask,
                "seq_len": [len(r) for r in rows_ids], "sample_id": order},
                features=datasets.Features({
                    "input_ids": datasets.Sequence(datasets.Value("int64")),
                    "loss_mask": datasets.Sequence(datasets.Value("int64")),
                    "seq_len": datasets.Value("int64"), "sample_id": datasets.Value("int64")}))
            ds.set_format(type="torch")  # as speculators' prepare-data saves its rows
            ds.save_to_disk(tmp)
        record = dict(final, format="hsflow-export", version=1, files=fmt,
                      store=os.path.abspath(st.path), plan_hash=st.manifest["plan_hash"],
                      dataset_fingerprint=st.manifest.get("dataset_fingerprint"),
                      target_fingerprint=st.manifest.get("target_fingerprint"),
                      layers=st.layers, hidden_size=h, samples=len(order), seed=seed)
        tfd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _create(tfd, "hsflow_export.json", [json.dumps(record, indent=1).encode()])
            os.fsync(tfd)
        finally:
            os.close(tfd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        os.rename(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (StoreError, KeyboardInterrupt, SystemExit)):
            raise
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise StoreError("writing the export failed after %d of %d sample(s): %s; nothing was "
                         "left under %s" % (written, len(order), why, out)) from None
    print("exported %d sample(s) of %d batch(es) to %s (%s%s, hidden_states [T, %d, %d] bf16, "
          "last layer %d = N %s the final norm)"
          % (len(order), len(st.loc), out, fmt,
             {"safetensors": ": the dataset rows and hidden_states/hs_<row>.safetensors",
              "rows": ": the dataset rows, their states served from the store"}.get(fmt, ""),
             k, h, st.layers[-1],
             "after" if final["final_state"] == "normed" else "before"))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="hsflow-data store", allow_abbrev=False,
        description="Read a consumer's --store folder: its run and coverage (info), every "
                    "region checksummed again (verify), or speculators' offline layout (export: "
                    "the dataset rows its ArrowDataset reads and hidden_states/hs_<row>."
                    "safetensors beside them).",
        epilog="examples:\n  hsflow-data store info /data/hs-store\n"
               "  hsflow-data store verify /data/hs-store\n"
               "  hsflow-data store export /data/hs-store /data/eagle3-train \\\n"
               "      --verifier /models/Llama-3.1-8B --normed-final-state\n\n"
               "export refuses an incomplete store (naming the missing batches) and, without\n"
               "--normed-final-state, a store whose last layer is N: hsflow's N is after the\n"
               "final norm, speculators' before it (docs/store.md).\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    for name in ("info", "verify"):
        p = sub.add_parser(name, allow_abbrev=False)
        p.add_argument("dir")
    p = sub.add_parser("export", allow_abbrev=False,
                       help="speculators' offline layout of a complete store")
    p.add_argument("dir")
    p.add_argument("out", help="a new folder (or an empty one): written whole or not at all")
    p.add_argument("--format", choices=("safetensors", "rows", "pt"), default="safetensors",
                   help="the dataset rows and OUT/hidden_states/hs_<row>.safetensors (default); "
                        "rows: the dataset rows alone, for hsflow-speculators-train "
                        "--hidden-states-backend hsflow, which reads the states from the store; "
                        "pt: speculators' older data_<row>.pt (needs torch)")
    p.add_argument("--verifier", metavar="DIR",
                   help="the target's folder (its config.json gives N), as speculators' "
                        "--verifier-name-or-path; default: the model store.json names, where it "
                        "is a folder here")
    p.add_argument("--normed-final-state", action="store_true",
                   help="export layer N as hsflow holds it, after the final norm, marked so in "
                        "hsflow_export.json; exact only for a trainer that makes speculators' "
                        "verifier_norm an identity (hsflow.integrations.speculators."
                        "use_normed_targets), never plain `speculators train`")
    p.add_argument("--seed", type=int, default=None,
                   help="permute the rows (and their hs_<row> files) with this seed, as "
                        "speculators' prepare-data shuffles; default: the dataset's order")
    args = ap.parse_args(argv)
    if not args.cmd:
        ap.print_help(sys.stderr)
        return 2
    try:
        with Store(args.dir) as st:
            if args.cmd == "info":
                return cmd_info(st)
            if args.cmd == "verify":
                return cmd_verify(st)
            return cmd_export(st, args.out, args.format, args.verifier, args.normed_final_state,
                              args.seed)
    except StoreError as e:
        print("hsflow-data store: %s" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("hsflow-data store: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
