# SPDX-License-Identifier: Apache-2.0
"""hsflow.Consumer(store=...): one epoch from hs-producer stores every batch,
two more epochs come from the store alone (no producer), every view checked
against the dataset and the synthetic source; the store's run is pinned
against expect=; `hsflow-data store` reports, re-checksums and exports it as
speculators' per-sample safetensors with the dataset rows beside them, read
back here with safetensors and datasets; an incomplete store, a normed last
layer without --normed-final-state, a failed write, planted links and FIFOs
are refused with nothing left behind."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import hsflow
from conftest import have_torch
from test_consumer import H, LAYERS, check_batch, start_producers, stop


def store_cli(*args):
    return subprocess.run([sys.executable, "-m", "hsflow.data", "store", *args],
                          capture_output=True, text=True, timeout=120)


def fill_store(producer_bin, data, rows, store):
    """One epoch from one producer (its tickets 20 ms late, so the writer
    keeps up and skips none); returns the batches per epoch."""
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, verify_synthetic=True,
                         arrays="numpy", store=store) as c:
        procs = start_producers(producer_bin, c.port, data, n=1, workers=1,
                                extra=["--fault", "delay_ms=20"])
        try:
            n = 0
            for b in c:
                check_batch(b, rows)
                n += 1
        finally:
            stop(procs)
        s = c.stats()
    assert s["store_misses"] == n and s["store_hits"] == 0 and s["complete"]
    return n


def test_one_epoch_online_then_two_from_the_store_with_no_producer(producer_bin, dataset,
                                                                   tmp_path):
    data, rows = dataset
    store = str(tmp_path / "store")
    n = fill_store(producer_bin, data, rows, store)
    info = store_cli("info", store)
    assert info.returncode == 0, info.stderr
    assert "stored      %d of %d batches (100.0%%), complete" % (n, n) in info.stdout, info.stdout
    seen = []
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, verify_synthetic=True,
                         arrays="numpy", store=store) as c:
        for b in c:
            check_batch(b, rows)
            seen.append((b.epoch, b.batch))
        s = c.stats()
    assert sorted(seen) == [(e, i) for e in range(2) for i in range(n)]
    assert s["store_hits"] == 2 * n and s["store_misses"] == 0 and s["store_bad"] == 0
    assert s["producers_seen"] == 0 and s["checksum_failures"] == 0 and s["complete"]


def test_store_of_another_layout_is_refused_at_create_naming_both(producer_bin, dataset,
                                                                  tmp_path):
    data, rows = dataset
    store = str(tmp_path / "store")
    fill_store(producer_bin, data, rows, store)
    with pytest.raises(hsflow.HsflowError):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, store=store,
                        expect={"layout": "H=%d,layers=1,4,dtype=bf16" % H})


def read_safetensors_raw(path):
    """name -> (dtype, shape, bytes), straight from the file's layout."""
    with open(path, "rb") as f:
        blob = f.read()
    n, = struct.unpack_from("<Q", blob)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], blob[8 + n + v["data_offsets"][0]:
                                            8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def write_verifier(path, n_layers=LAYERS[-1], hidden=H):
    """A target folder's config.json: all export reads of it (N and H)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "num_hidden_layers": n_layers, "hidden_size": hidden},
                  f)
    return path


@pytest.fixture
def full_store(producer_bin, dataset, tmp_path):
    data, rows = dataset
    store = str(tmp_path / "store")
    fill_store(producer_bin, data, rows, store)
    return store, rows, write_verifier(str(tmp_path / "target"))


def test_export_writes_speculators_safetensors_read_back_with_safetensors(full_store, tmp_path):
    safetensors = pytest.importorskip("safetensors")
    datasets = pytest.importorskip("datasets")
    store, rows, verifier = full_store
    ver = store_cli("verify", store)
    assert ver.returncode == 0 and " 0 bad" in ver.stdout, ver.stdout + ver.stderr
    out = str(tmp_path / "out")
    ex = store_cli("export", store, out, "--verifier", verifier, "--normed-final-state")
    assert ex.returncode == 0, ex.stderr
    assert "last layer %d = N after the final norm" % LAYERS[-1] in ex.stdout, ex.stdout
    folder = os.path.join(out, "hidden_states")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    assert len(files) == len(rows)
    lengths = json.load(open(os.path.join(folder, "sample_lengths.json")))
    record = json.load(open(os.path.join(out, "hsflow_export.json")))
    assert record["final_state"] == "normed" and record["samples"] == len(rows)
    # the rows speculators' ArrowDataset reads: row i is hs_<i>, in dataset order
    ds = datasets.load_from_disk(out).with_format(None)
    assert ds["sample_id"] == list(range(len(rows)))
    assert ds["seq_len"] == [len(r[0]) for r in rows]
    assert [list(x) for x in ds["input_ids"]] == [r[0] for r in rows]
    assert [list(x) for x in ds["loss_mask"]] == [r[1] for r in rows]
    assert not [f for f in os.listdir(str(tmp_path)) if ".export-" in f]
    for sid in (0, 17, len(rows) - 1):
        path = os.path.join(folder, "hs_%d.safetensors" % sid)
        want_ids, want_mask = rows[sid]
        with safetensors.safe_open(path, framework="numpy") as f:
            assert sorted(f.keys()) == ["hidden_states", "loss_mask", "token_ids"]
            assert f.get_tensor("token_ids").tolist() == want_ids
            assert f.get_tensor("loss_mask").tolist() == want_mask
            hs = f.get_slice("hidden_states")
            assert hs.get_dtype() == "BF16"
            assert hs.get_shape() == [len(want_ids), len(LAYERS), H]
        assert lengths[str(sid)] == len(want_ids)
        T = len(want_ids)
        want = hsflow.synthetic_hidden(np.array([sid], np.uint64), np.array([0, T], np.int32),
                                       tuple(LAYERS), H).reshape(T, len(LAYERS), H)
        if have_torch():
            from safetensors.torch import load_file
            import torch
            got = load_file(path)["hidden_states"]
            assert got.dtype == torch.bfloat16
            assert np.array_equal(got.view(torch.int16).numpy().view(np.uint16), want)
        else:  # numpy has no bfloat16: the bytes safetensors would map
            dtype, shape, raw = read_safetensors_raw(path)["hidden_states"]
            assert np.array_equal(np.frombuffer(raw, "<u2").reshape(shape), want)


def test_export_with_a_seed_permutes_rows_and_files_together(full_store, tmp_path):
    safetensors = pytest.importorskip("safetensors")
    datasets = pytest.importorskip("datasets")
    store, rows, verifier = full_store
    out = str(tmp_path / "out")
    ex = store_cli("export", store, out, "--verifier", verifier, "--normed-final-state",
                   "--seed", "3")
    assert ex.returncode == 0, ex.stderr
    ds = datasets.load_from_disk(out).with_format(None)
    order = ds["sample_id"]
    assert sorted(order) == list(range(len(rows))) and order != sorted(order)
    for i in (0, 5, len(rows) - 1):
        with safetensors.safe_open(os.path.join(out, "hidden_states", "hs_%d.safetensors" % i),
                                   framework="numpy") as f:
            assert f.get_tensor("token_ids").tolist() == rows[order[i]][0] == \
                list(ds[i]["input_ids"])


def test_export_refuses_a_normed_last_layer_or_a_last_layer_that_is_not_n(full_store, tmp_path):
    store, _, verifier = full_store
    out = str(tmp_path / "out")
    r = store_cli("export", store, out, "--verifier", verifier)
    assert r.returncode == 1
    assert "after* the target's final norm" in r.stderr and "--normed-final-state" in r.stderr, \
        r.stderr
    deeper = write_verifier(str(tmp_path / "deeper"), n_layers=LAYERS[-1] + 3)
    r = store_cli("export", store, out, "--verifier", deeper, "--normed-final-state")
    assert r.returncode == 1
    assert "layers 1,4,9 end with 9, not N: fill a store with the drafter's target_layer_ids " \
           "and then N (--layers ...,12" in r.stderr, r.stderr
    r = store_cli("export", store, out, "--normed-final-state")
    assert r.returncode == 1 and "give --verifier DIR" in r.stderr, r.stderr
    wider = write_verifier(str(tmp_path / "wider"), hidden=2 * H)
    r = store_cli("export", store, out, "--verifier", wider, "--normed-final-state")
    assert r.returncode == 1 and "hidden size %d, the store's states %d" % (2 * H, H) in r.stderr
    assert not os.path.exists(out)


def test_export_of_an_incomplete_store_names_the_missing_batches(full_store, tmp_path):
    store, _, verifier = full_store
    with open(os.path.join(store, "index.hsi"), "r+b") as f:
        index = f.read()
        n = len(index) // 64
        f.seek(0)
        f.truncate(64 * (n - 2))  # the last two records lost
        lost = [struct.unpack_from("<I", index, 64 * i + 4)[0] for i in (n - 2, n - 1)]
    out = str(tmp_path / "out")
    r = store_cli("export", store, out, "--verifier", verifier, "--normed-final-state")
    assert r.returncode == 1
    assert "holds %d of %d batches; missing: batch(es)" % (n - 2, n) in r.stderr, r.stderr
    for b in lost:
        assert str(b) in r.stderr.split("missing:")[1]
    assert "nothing was exported" in r.stderr and not os.path.exists(out)


def test_a_failed_write_leaves_nothing_under_out(full_store, tmp_path):
    """A write that fails midway (RLIMIT_FSIZE: a file past 64 KiB fails with
    EFBIG, as a full disk fails with ENOSPC: every hs_<i> file fits, the
    dataset rows' Arrow file, written last, does not) is an error naming it,
    and neither OUT nor the temporary folder is left."""
    import resource
    import signal
    store, rows, verifier = full_store
    out = str(tmp_path / "out")

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
    r = subprocess.run([sys.executable, "-m", "hsflow.data", "store", "export", store, out,
                        "--verifier", verifier, "--normed-final-state"], capture_output=True,
                       text=True, timeout=120, preexec_fn=limit)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "writing the export failed after" in r.stderr and "nothing was left under" in \
        r.stderr, r.stderr
    assert "after %d of %d sample(s)" % (len(rows), len(rows)) in r.stderr, r.stderr
    assert sorted(os.listdir(str(tmp_path))) == ["data.jsonl", "store", "target"]


def test_export_into_a_folder_that_holds_files_is_refused(full_store, tmp_path):
    store, _, verifier = full_store
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    r = store_cli("export", store, str(out), "--verifier", verifier, "--normed-final-state")
    assert r.returncode == 1 and "is not an empty folder" in r.stderr, r.stderr
    assert os.listdir(str(out)) == ["keep.txt"]
    # links planted where the old export wrote (hs_N.safetensors.tmp, sample_lengths.json)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    planted = tmp_path / "planted"
    (planted / "hidden_states").mkdir(parents=True)
    os.symlink(str(secret), str(planted / "hidden_states" / "sample_lengths.json"))
    os.symlink(str(secret), str(planted / "hidden_states" / "hs_0.safetensors.tmp"))
    link = tmp_path / "link"
    os.symlink(str(tmp_path / "empty"), str(link))
    (tmp_path / "empty").mkdir()
    for where in (planted, link):
        r = store_cli("export", store, str(where), "--verifier", verifier,
                      "--normed-final-state")
        assert r.returncode == 1 and "is not an empty folder" in r.stderr, r.stderr
    assert secret.read_bytes() == b"root only\n" and os.listdir(str(tmp_path / "empty")) == []


def test_planted_links_and_fifos_in_a_store_are_refused_not_followed(full_store, tmp_path):
    """A store folder others can write: a symlinked or FIFO store.json, a
    symlinked shard, are refused (never followed, never waited on); the file
    a link points to is untouched."""
    store, _, verifier = full_store
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    os.chmod(str(secret), 0o600)
    man = os.path.join(store, "store.json")
    saved = open(man, "rb").read()
    os.rename(man, man + ".real")
    os.symlink(man + ".real", man)
    r = store_cli("info", store)
    assert r.returncode == 1 and "store.json is a symbolic link: refused" in r.stderr, r.stderr
    os.unlink(man)
    os.mkfifo(man)
    r = store_cli("info", store)  # would hang on open() without O_NONBLOCK
    assert r.returncode == 1 and "store.json is not a regular file" in r.stderr, r.stderr
    os.unlink(man)
    with open(man, "wb") as f:
        f.write(saved)
    os.unlink(man + ".real")
    shard = os.path.join(store, "shard-00000.hsd")
    os.rename(shard, shard + ".real")
    os.symlink(str(secret), shard)
    r = store_cli("info", store)
    assert r.returncode == 0 and "stored      0 of" in r.stdout, r.stdout + r.stderr
    r = store_cli("export", store, str(tmp_path / "out"), "--verifier", verifier,
                  "--normed-final-state")
    assert r.returncode == 1 and "missing" in r.stderr
    assert secret.read_bytes() == b"root only\n"
    os.unlink(shard)
    os.rename(shard + ".real", shard)
    big = os.path.join(store, "index.hsi")
    with open(big, "r+b") as f:  # a sparse index far past what the plan can have written
        f.truncate(1 << 31)
    r = store_cli("info", store)
    assert r.returncode == 1 and "index.hsi is 2147483648 bytes, more than" in r.stderr, r.stderr

def fp8_store_with_one_batch(scales, codes):
    """A Store of one fp8 batch (2 sequences of 2 tokens, H=3, 2 layers) whose
    region holds `codes` [4, 6] and `scales` [4], without files."""
    from hsflow.data import store as S
    st = S.Store.__new__(S.Store)
    st.n_seqs, st.n_tokens = {0: 2}, {0: 4}
    st.hidden_size, st.layers, st.dtype = 3, [1, 2], "fp8"
    o = S.offsets(2, 4, 3, 2, "fp8")
    region = bytearray(o["total"])
    struct.pack_into("<3i", region, o["cu_seqlens"], 0, 2, 4)
    struct.pack_into("<2Q", region, o["sample_ids"], 5, 9)
    region[o["hidden"]:o["hidden"] + 24] = np.asarray(codes, np.uint8).tobytes()
    region[o["scales"]:o["scales"] + 16] = np.asarray(scales, "<f4").tobytes()
    return st, bytes(region)


def test_export_refuses_fp8_rows_whose_scale_or_codes_mean_no_number():
    from hsflow.data.store import StoreError
    good_codes = np.tile(np.array([0x38, 0xb8, 0x7e, 0xfe, 0x01, 0x00], np.uint8), (4, 1))
    st, region = fp8_store_with_one_batch([1.0, 0.5, 2.0 ** -20, 3.3895e38 / 448], good_codes)
    got = list(st.samples(0, region))
    assert [s[0] for s in got] == [5, 9] and got[0][3].shape == (2, 2, 3)
    values = (got[1][3].astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.isfinite(values)) and values.max() > 3e38  # 448 * the largest scale
    zero_row = good_codes.copy()
    zero_row[2] = [0x00, 0x80, 0, 0, 0, 0]
    st, region = fp8_store_with_one_batch([1.0, 1.0, 0.0, 1.0], zero_row)
    assert len(list(st.samples(0, region))) == 2  # scale 0 over +-0 codes is a row of zeros
    nan_code = good_codes.copy()
    nan_code[3, 4] = 0xff
    for scales, codes in (([1.0, float("nan"), 1.0, 1.0], good_codes),
                          ([1.0, 1.0, float("inf"), 1.0], good_codes),
                          ([1.0, 1.0, 1.0, -0.25], good_codes),
                          ([-0.0, 1.0, 1.0, 1.0], zero_row),
                          ([1.0, 0.0, 1.0, 1.0], good_codes),
                          ([1.0, 1.0, 1e36, 1.0], good_codes),
                          ([1.0, 1.0, 1.0, 1.0], nan_code)):
        st, region = fp8_store_with_one_batch(scales, codes)
        with pytest.raises(StoreError, match=r"batch 0 token \d: fp8 scale .* mean no number"):
            list(st.samples(0, region))


def fill_with_library_producer(data, store, **target):
    """One epoch from an hsflow.Producer of `target` (synthetic states) into
    the store; returns the consumer's stats."""
    from conftest import ConsumerThread
    from test_producer import producer
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy",
                         store=store) as c:
        ct = ConsumerThread(c, lambda b: None)
        with producer(c.port, data, **target) as p:
            for t in p.tickets():
                t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens,
                                                             t.layers, t.hidden_size))
        ct.join()
        return c.stats()


def test_a_store_filled_by_one_library_producer_refuses_another_target(dataset, tmp_path,
                                                                       capfd):
    data, _ = dataset
    store = str(tmp_path / "store")
    a, b = 0x1111222233334444, 0x5555666677778888
    s = fill_with_library_producer(data, store, target="model-a", target_fingerprint=a)
    assert s["complete"] and s["target_fingerprint"] == "%016x" % a and s["target"] == "model-a"
    man = json.load(open(os.path.join(store, "store.json")))
    assert man["target_fingerprint"] == "%016x" % a and man["model"] == "model-a"
    # a complete store replayed alone names its target; pinned to another, it is refused
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy",
                         store=store) as c:
        assert sum(1 for _ in c) == s["batches_delivered"]
        assert c.stats()["target_fingerprint"] == "%016x" % a
    with pytest.raises(hsflow.HsflowError):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, store=store,
                        expect={"target": b})
    assert "holds the states of target %016x (model-a), --expect-target is %016x" % (a, b) \
        in capfd.readouterr().err
    # the store keeps one batch: the others are asked of producers, and
    # another library producer's states are not mixed in: it is refused
    with open(os.path.join(store, "index.hsi"), "r+b") as f:
        f.truncate(64)
    with pytest.raises(hsflow.HsflowError):
        fill_with_library_producer(data, store, target="model-b", target_fingerprint=b)
    err = capfd.readouterr().err
    assert ("target %016x ('model-b'), the store holds the states of %016x ('model-a')"
            % (b, a)) in err, err[-3000:]
    # the same target under another name is the same target
    s = fill_with_library_producer(data, store, target="model-a-copy", target_fingerprint=a)
    assert s["complete"] and s["store_hits"] == 1 and s["batches_delivered"] > 1
    info = store_cli("info", store)
    assert "target      %016x (model-a)" % a in info.stdout, info.stdout


def test_a_library_producer_must_name_its_target(dataset):
    data, _ = dataset
    with pytest.raises(ValueError, match="say which target computes the states"):
        hsflow.Producer(to="127.0.0.1:1", data=data, token_budget=256, hidden_size=8,
                        layers=[1, 2])


def test_target_fingerprint_covers_config_and_weights_and_is_cached_beside_them(tmp_path):
    import shutil
    root = os.path.join(os.path.dirname(__file__), "..", "data", "qwen3")
    model = tmp_path / "model"
    shutil.copytree(root, model)
    fp = hsflow.target_fingerprint(model)
    cache = model / ".hsflow-target"
    assert cache.is_file() and fp == hsflow.target_fingerprint(str(model))
    assert fp == hsflow.target_fingerprint(shutil.copytree(model, tmp_path / "copy"))
    assert fp != hsflow.synthetic_target_fingerprint()
    # a poisoned cache of another user is not believed
    text = cache.read_text()
    cache.write_text(text.replace(text.split()[-1], "0" * 16))
    if os.geteuid() == 0:
        os.chown(cache, 65534, 65534)
        assert hsflow.target_fingerprint(model) == fp
        cache.unlink()
    # new weights in the same place (same size) and a changed config: other targets
    w = model / "model.safetensors"
    blob = bytearray(w.read_bytes())
    blob[-2] ^= 1
    w.write_bytes(bytes(blob))
    fp2 = hsflow.target_fingerprint(model)
    assert fp2 != fp
    cfg = model / "config.json"
    conf = json.loads(cfg.read_text())
    conf["x_extra"] = 1
    cfg.write_text(json.dumps(conf))
    assert hsflow.target_fingerprint(model) not in (fp, fp2)
    # a folder this user cannot write keeps no cache and still gives the fingerprint
    ro = shutil.copytree(root, tmp_path / "ro")
    os.chmod(ro, 0o555)
    try:
        assert hsflow.target_fingerprint(ro) == fp
        if os.geteuid() != 0:
            assert not os.path.exists(os.path.join(ro, ".hsflow-target"))
    finally:
        os.chmod(ro, 0o755)
