# SPDX-License-Identifier: Apache-2.0
"""The file formats Python writes or reads beside the C library, held to it.

- .hst (docs/hst-format.md): hsflow.data.HstWriter writes the very bytes
  `hs-data import` writes for the same sequences; hsflow.data.read_hst reads
  a file the library wrote, every header field and every token checked
  against hs-data info and the source.
- the consumer's store (docs/store.md): hsflow.data.store reads store.json,
  plan.bin, index.hsi and the shards a consumer wrote; every field it reads
  is checked against what the library says of the same run (hs-data info and
  plan, the batches the consumer delivered), bf16 and fp8 (its dequantising
  twin against the consumer's own bf16 delivery).

Python writes no store file, and reads no other format of the library's
(the producer and consumer go through libhsflow.so)."""
import json
import os
import re
import struct
import subprocess

import numpy as np
import pytest

import hsflow
from conftest import write_dataset
from test_consumer import BUDGET, H, LAYERS, start_producers, stop


def hs_data(*args):
    tool = hsflow.find_tool("hs-data")
    if not tool:
        pytest.fail("hs-data not found: build it (cmake --build BUILD --target hs-data) and set "
                    "HSFLOW_BIN_DIR=BUILD/bin")
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def field(text, name):
    """The value after `name` on its line of hs-data's output."""
    m = re.search(r"^%s\s+(\S+)" % re.escape(name), text, re.M)
    assert m, "%r not in:\n%s" % (name, text)
    return m.group(1)


# ---- .hst ------------------------------------------------------------------

def sequences():
    """Odd lengths, the extreme ids, masks of every kind."""
    rng = np.random.default_rng(11)
    out = [([0], [1]), ([0x7FFFFFFF, 0, 5], [0, 0, 0]), ([7] * 4097, [1] * 4097)]
    for n in (1, 2, 31, 33, 257, 1000):
        out.append((rng.integers(0, 1 << 31, n).tolist(), rng.integers(0, 2, n).tolist()))
    return out


def write_jsonl(path, seqs):
    with open(path, "w") as f:
        for ids, mask in seqs:
            f.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
    return str(path)


def test_hst_writer_writes_the_bytes_hs_data_import_writes(tmp_path):
    pytest.importorskip("xxhash", reason="xxhash is not installed (python/requirements-dev.txt)")
    from hsflow.data import HstWriter
    seqs = sequences()
    hs_data("import", write_jsonl(tmp_path / "in.jsonl", seqs), str(tmp_path / "c.hst"))
    with HstWriter(str(tmp_path / "py.hst")) as w:
        for ids, mask in seqs:
            w.add(ids, mask)
    c, py = (tmp_path / "c.hst").read_bytes(), (tmp_path / "py.hst").read_bytes()
    assert len(py) == len(c)
    first = next((i for i in range(len(c)) if c[i] != py[i]), None)
    assert first is None, "the files differ first at byte %d" % first
    assert w.fingerprint == int(field(hs_data("info", str(tmp_path / "c.hst")), "fingerprint"), 16)
    assert (w.n_sequences, w.n_tokens) == (len(seqs), sum(len(i) for i, _ in seqs))


def test_read_hst_reads_every_field_of_a_file_the_library_wrote(tmp_path):
    pytest.importorskip("xxhash", reason="xxhash is not installed (python/requirements-dev.txt)")
    from hsflow.data.hst import HEADER_BYTES, read_hst, read_hst_header
    seqs = sequences()
    src = write_jsonl(tmp_path / "in.jsonl", seqs)
    path = str(tmp_path / "c.hst")
    hs_data("import", src, path)
    info = hs_data("info", path)
    with open(path, "rb") as f:
        head = read_hst_header(f.read(HEADER_BYTES), path)
    assert head["version"] == 1 and head["header_bytes"] == HEADER_BYTES == 64
    assert head["n_sequences"] == int(field(info, "sequences")) == len(seqs)
    assert head["n_tokens"] == int(field(info, "tokens")) == sum(len(i) for i, _ in seqs)
    assert head["fingerprint"] == int(field(info, "fingerprint"), 16)
    offsets, ids, mask = read_hst(path)
    assert offsets.tolist() == np.cumsum([0] + [len(i) for i, _ in seqs]).tolist()
    for k, (want_ids, want_mask) in enumerate(seqs):
        a, b = int(offsets[k]), int(offsets[k + 1])
        assert ids[a:b].tolist() == want_ids and mask[a:b].tolist() == want_mask, k


# ---- the store ---------------------------------------------------------------

def fill_store(producer_bin, data, store, hs_dtype):
    """One epoch from one hs-producer into `store`; returns what the consumer
    delivered of each batch (bf16 states; an fp8 run's dequantised by the
    library), by batch id, copied out of the views."""
    got = {}
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, verify_synthetic=True,
                         arrays="numpy", store=store, deliver="bf16") as c:
        procs = start_producers(producer_bin, c.port, data, n=1, workers=1,
                                extra=["--hs-dtype", hs_dtype, "--fault", "delay_ms=20"])
        try:
            for b in c:
                got[b.batch] = {k: np.array(getattr(b, k)) for k in (
                    "cu_seqlens", "sample_ids", "input_ids", "loss_mask", "hidden_states")}
                got[b.batch].update(n_seqs=b.n_seqs, n_tokens=b.n_tokens)
        finally:
            stop(procs)
        s = c.stats()
    assert s["complete"] and s["store_misses"] == len(got) and s["store_skipped"] == 0
    return got


@pytest.mark.parametrize("hs_dtype", ["bf16", "fp8"])
def test_store_reader_reads_every_field_of_a_store_the_consumer_wrote(producer_bin, tmp_path,
                                                                      hs_dtype):
    from hsflow import _dtypes
    from hsflow.data import store as S
    data = str(tmp_path / "data.jsonl")
    write_dataset(data, 40, 5, 200, 1000, seed=3)
    store = str(tmp_path / "store")
    delivered = fill_store(producer_bin, data, store, hs_dtype)
    info = hs_data("info", data)
    plan = hs_data("plan", data, "--token-budget", str(BUDGET))
    layout = re.search(r"--expect-layout (\S+)", hs_data(
        "plan", data, "--token-budget", str(BUDGET), "--hidden-size", str(H),
        "--layers", ",".join(map(str, LAYERS)))).group(1).replace("dtype=bf16", "dtype=" + hs_dtype)
    with S.Store(store) as st:
        # store.json: every field against the library's own account of the run
        m = st.manifest
        assert sorted(m) == sorted([
            "format", "version", "dataset_fingerprint", "layout", "dtype", "plan_hash",
            "plan_basis", "seed", "n_batches", "token_budget", "target_fingerprint", "model"])
        assert (m["format"], m["version"]) == ("hsflow-store", S.STORE_VERSION)
        assert m["layout"] == layout
        assert (st.hidden_size, st.layers, st.dtype) == (H, LAYERS, hs_dtype)
        assert m["dataset_fingerprint"] == field(info, "fingerprint")
        assert m["plan_hash"] == field(plan, "plan hash")
        assert st.plan_hash == int(m["plan_hash"], 16)
        assert st.n_batches == int(field(plan, "batches")) == len(delivered)
        assert (m["token_budget"], int(m["seed"], 16)) == (BUDGET, 0)
        assert m["dtype"] == hs_dtype and m["model"] == "synthetic"
        assert m["target_fingerprint"] == "%016x" % hsflow.synthetic_target_fingerprint()
        # plan.bin: the shapes the consumer delivered, hashing to store.json's plan
        for b, d in delivered.items():
            assert (st.n_seqs[b], st.n_tokens[b]) == (d["n_seqs"], d["n_tokens"]), b
        shapes = st.n_seqs.astype("<u4").tobytes() + st.n_tokens.astype("<u4").tobytes()
        assert S.plan_hash_of(int(m["plan_basis"], 16), shapes, st.n_batches) == st.plan_hash
        # index.hsi: one sealed record per batch, each naming its whole region
        assert st.dropped == 0 and st.missing() == []
        raw = open(os.path.join(store, "index.hsi"), "rb").read()
        assert len(raw) == S.REC.size * st.n_batches
        lib = S._lib()
        for i in range(st.n_batches):
            rec = raw[S.REC.size * i:S.REC.size * (i + 1)]
            magic, batch, shard, n, t, _, off, nbytes, csum, plan_hash, seal = S.REC.unpack(rec)
            assert (magic, plan_hash, seal) == (S.REC_MAGIC, st.plan_hash, S._seal(lib, rec))
            assert (n, t) == (delivered[batch]["n_seqs"], delivered[batch]["n_tokens"])
            assert st.loc[batch] == (shard, off, nbytes, csum) and off % 4096 == 0
            # the region: its header, sizes and checksum as the library made them
            region = st.read(batch)
            o = S.offsets(n, t, H, len(LAYERS), hs_dtype)
            assert len(region) == nbytes == o["total"]
            head = struct.unpack_from("<IHHIIIIIIQQQ", region)  # hs_batch_header_t
            assert head[0] == S.BATCH_MAGIC and head[2] == _dtypes.BY_NAME[hs_dtype].id
            assert head[4:9] == (batch, n, t, H, len(LAYERS)) and head[10:] == (nbytes, csum)
            assert S._checksum64(lib, region[S.HEADER:]) == csum and st.verify(batch, lib)
            d, hidden = delivered[batch], []
            for row, (sid, ids, mask, hs) in enumerate(st.samples(batch, region)):
                a, b = int(d["cu_seqlens"][row]), int(d["cu_seqlens"][row + 1])
                assert sid == d["sample_ids"][row]
                assert np.array_equal(ids, d["input_ids"][a:b])
                assert np.array_equal(mask, d["loss_mask"][a:b])
                hidden.append(hs.reshape(b - a, len(LAYERS) * H))
            assert np.array_equal(np.frombuffer(region, "<i4", n + 1, o["cu_seqlens"]),
                                  d["cu_seqlens"])
            # bf16 as stored; fp8 dequantised by Python as the consumer does it
            assert np.array_equal(np.concatenate(hidden), d["hidden_states"]), batch
