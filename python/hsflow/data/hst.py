# SPDX-License-Identifier: Apache-2.0
"""Writing and reading hsflow's binary token file (.hst), docs/hst-format.md.

    with HstWriter("train.hst") as w:
        w.add(input_ids, loss_mask)      # one sequence; numpy or lists
    # w.fingerprint, w.n_sequences, w.n_tokens

The writer streams: token ids and masks go to two temporary files beside the
target as they come (only the 8-byte offset of each sequence stays in
memory); close() assembles header, offsets, ids and mask into a third
temporary file while hashing it, flushes it and renames it over the target,
so a reader never sees half a file and memory does not grow with the tokens.
"""
import os
import struct
import tempfile
from array import array

import numpy as np

MAGIC = b"HSTK"
VERSION = 1
HEADER_BYTES = 64
_COPY_CHUNK = 8 << 20


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli), as hs_crc32c() computes it (for the 60-byte header)."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _xxh3():
    from .._deps import need
    xxhash = need("xxhash", "hsflow-data prepare", "data",
                  purpose="writing .hst (or write JSONL, OUT ending in .jsonl, and convert it "
                          "with `hs-data import`)")
    return xxhash.xxh3_64()


class HstWriter:
    """Streams sequences into an .hst file; see the module comment."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self._dir = os.path.dirname(self.path)
        self._hash = _xxh3()  # fail before any work when xxhash is missing
        self._ids = tempfile.TemporaryFile(dir=self._dir, prefix=".hst-ids-")
        self._mask = tempfile.TemporaryFile(dir=self._dir, prefix=".hst-mask-")
        self._offsets = array("Q", [0])
        self.fingerprint = None

    @property
    def n_sequences(self):
        return len(self._offsets) - 1

    @property
    def n_tokens(self):
        return self._offsets[-1]

    def add(self, input_ids, loss_mask):
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.asarray(loss_mask, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or mask.shape != ids.shape:
            raise ValueError("a sequence needs >= 1 token and a loss_mask of the same length")
        if ids.min() < 0 or ids.max() > 0x7FFFFFFF or mask.min() < 0 or mask.max() > 1:
            raise ValueError("input_ids must be in 0..2^31-1 and loss_mask 0 or 1")
        self._ids.write(ids.astype("<i4").tobytes())
        self._mask.write(mask.astype(np.uint8).tobytes())
        self._offsets.append(self._offsets[-1] + ids.size)

    def _copy(self, src, dst):
        src.seek(0)
        while True:
            chunk = src.read(_COPY_CHUNK)
            if not chunk:
                return
            self._hash.update(chunk)
            dst.write(chunk)

    def close(self):
        """Writes the file (temporary file, fsync, rename); returns the fingerprint."""
        if self.fingerprint is not None:
            return self.fingerprint
        n = self.n_sequences
        if n == 0:
            self.abort()
            raise ValueError(f"{self.path}: no sequences to write (an .hst file needs at least one)")
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=os.path.basename(self.path) + ".tmp.")
        try:
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), 0o644)
                out.write(b"\0" * HEADER_BYTES)
                offsets = self._offsets.tobytes()  # native order; checked little-endian below
                self._hash.update(offsets)
                out.write(offsets)
                self._ids.flush()
                self._mask.flush()
                self._copy(self._ids, out)
                self._copy(self._mask, out)
                fp = self._hash.intdigest()
                head = MAGIC + struct.pack("<HHQQQ", VERSION, HEADER_BYTES, n, self.n_tokens, fp)
                head += b"\0" * (60 - len(head))
                head += struct.pack("<I", crc32c(head))
                out.seek(0)
                out.write(head)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            self._ids.close()
            self._mask.close()
        self.fingerprint = fp
        return fp

    def abort(self):
        """Drops everything written so far; the target is left as it was."""
        self._ids.close()
        self._mask.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()


if struct.pack("=Q", 1) != struct.pack("<Q", 1):  # offsets are written in native order
    raise ImportError("hsflow.data.hst writes little-endian arrays; big-endian hosts are not "
                      "supported")


def read_hst_header(data, path="<.hst>"):
    """The header fields of an .hst file's first HEADER_BYTES bytes, checked
    (magic, version, header size, CRC-32C): {"version", "header_bytes",
    "n_sequences", "n_tokens", "fingerprint", "crc"}; ValueError otherwise."""
    if len(data) < HEADER_BYTES or data[:4] != MAGIC:
        raise ValueError(f"{path}: not an .hst file")
    version, hbytes, n, total, fp = struct.unpack_from("<HHQQQ", data, 4)
    (crc,) = struct.unpack_from("<I", data, 60)
    if version != VERSION or hbytes != HEADER_BYTES or crc != crc32c(data[:60]):
        raise ValueError(f"{path}: corrupt .hst header")
    return {"version": version, "header_bytes": hbytes, "n_sequences": n, "n_tokens": total,
            "fingerprint": fp, "crc": crc}


def read_hst(path):
    """Reads an .hst file whole: (offsets, input_ids, loss_mask) as numpy arrays.
    For tests and small files; hsflow's C tools map it instead."""
    with open(path, "rb") as f:
        data = f.read()
    head = read_hst_header(data, path)
    n, total, fp = head["n_sequences"], head["n_tokens"], head["fingerprint"]
    if len(data) != HEADER_BYTES + 8 * (n + 1) + 5 * total:
        raise ValueError(f"{path}: .hst size does not match its header")
    offsets = np.frombuffer(data, "<u8", n + 1, HEADER_BYTES)
    ids = np.frombuffer(data, "<i4", total, HEADER_BYTES + 8 * (n + 1))
    mask = np.frombuffer(data, np.uint8, total, HEADER_BYTES + 8 * (n + 1) + 4 * total)
    h = _xxh3()
    h.update(data[HEADER_BYTES:])
    if h.intdigest() != fp:
        raise ValueError(f"{path}: .hst content checksum mismatch")
    return offsets, ids, mask
