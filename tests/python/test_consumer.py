# SPDX-License-Identifier: Apache-2.0
"""hsflow.Consumer in this process, fed by real hs-producer processes with
the synthetic source: every batch's views are checked (shapes, dtypes,
cu_seqlens, ids and mask against the dataset, every hidden value) and shown
to be zero-copy views of the library's memory."""
import os
import subprocess
import tempfile

import numpy as np
import pytest

import hsflow
from conftest import have_torch

H, LAYERS, BUDGET = 48, [1, 4, 9], 600


def start_producers(producer_bin, port, data, n=2, workers=2, extra=()):
    """n hs-producer processes; their stderr goes to temporary files that
    stop() prints when one fails."""
    args = [producer_bin, "--to", "127.0.0.1:%d" % port, "--data", data,
            "--token-budget", str(BUDGET), "--hidden-size", str(H),
            "--layers", ",".join(map(str, LAYERS)), "--source", "synthetic",
            "--gpus", "cpu:%d" % workers, "--connect-timeout", "20"] + list(extra)
    procs = []
    for i in range(n):
        log = tempfile.TemporaryFile()
        p = subprocess.Popen(args + ["--name", "p%d" % i], stdout=log, stderr=subprocess.STDOUT,
                             env=dict(os.environ, HS_LOG_LEVEL="info"))
        p.log = log
        procs.append(p)
    return procs


def stop(procs):
    """Waits for the producers (they end when the consumer says BYE) and
    asserts each ended well: exit 0, or told BYE by the consumer (a producer
    that connects after the last batch was delivered is sent away, and
    hs-producer then exits 1). Prints the output of any that failed."""
    for p in procs:
        try:
            rc = p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        p.log.seek(0)
        out = p.log.read().decode(errors="replace")
        p.log.close()
        if rc != 0 and "consumer says BYE" not in out:
            raise AssertionError("hs-producer exited %d:\n%s" % (rc, out))


def check_batch(b, rows):
    """Every view of a host batch against the plan's rules and the dataset."""
    T, n, kH = b.n_tokens, b.n_seqs, len(LAYERS) * H
    assert b.layers == tuple(LAYERS) and b.hidden_size == H and b.n_layers == len(LAYERS)
    assert not b.on_device
    hs, ids, mask, cu, sids = b.hidden_states, b.input_ids, b.loss_mask, b.cu_seqlens, b.sample_ids
    assert (hs.shape, hs.dtype) == ((T, kH), np.uint16)
    assert (ids.shape, ids.dtype) == ((T,), np.int32)
    assert (mask.shape, mask.dtype) == ((T,), np.uint8)
    assert (cu.shape, cu.dtype) == ((n + 1,), np.int32)
    assert (sids.shape, sids.dtype) == ((n,), np.uint64)
    assert 0 < T <= BUDGET
    assert cu[0] == 0 and cu[-1] == T and np.all(np.diff(cu) > 0), cu
    # zero-copy: each numpy array's data is the library's pointer
    ptrs = b.pointers()
    for name, arr in (("hidden_states", hs), ("input_ids", ids), ("loss_mask", mask),
                      ("cu_seqlens", cu), ("sample_ids", sids)):
        assert arr.ctypes.data == ptrs[name], name
        assert not arr.flags.writeable and not arr.flags.owndata, name
    for s in range(n):
        want_ids, want_mask = rows[int(sids[s])]
        lo, hi = int(cu[s]), int(cu[s + 1])
        assert ids[lo:hi].tolist() == want_ids[:hi - lo]
        assert mask[lo:hi].tolist() == want_mask[:hi - lo]
    want = hsflow.synthetic_hidden(sids, cu, b.layers, H)
    assert np.array_equal(hs, want)


def test_consumer_receives_every_batch_from_hs_producer_as_zero_copy_verified_views(
        producer_bin, dataset):
    data, rows = dataset
    seen = []
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, verify_synthetic=True,
                         arrays="numpy") as c:
        assert 0 < c.port < 65536
        procs = start_producers(producer_bin, c.port, data)
        try:
            for b in c:
                check_batch(b, rows)
                seen.append((b.epoch, b.batch))
            s = c.stats()
        finally:
            stop(procs)
    assert len(seen) == len(set(seen)) == s["batches_planned"] == s["batches_delivered"] > 2
    assert {e for e, _ in seen} == {0, 1}
    assert s["checksum_failures"] == 0 and s["duplicates"] == 0 and s["finished"]
    assert s["tokens_delivered"] == 2 * sum(len(r[0]) for r in rows)
    assert "tokens_per_s" in s


def test_batch_views_raise_once_the_batch_is_released(producer_bin, dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            first = next(c)
            assert first.input_ids is not None and not first.released
            first.release()
            first.release()  # idempotent
            assert first.released
            for attr in ("hidden_states", "input_ids", "loss_mask", "cu_seqlens", "sample_ids"):
                with pytest.raises(hsflow.HsflowError, match="was released"):
                    getattr(first, attr)
            second = next(c)
            with second:  # a batch is a context manager that releases on exit
                assert second.n_tokens > 0
            with pytest.raises(hsflow.HsflowError):
                second.hidden_states
            third = next(c)
            n = 3
            for _ in c:  # taking the next batch releases the previous one
                n += 1
                assert third.released
            s = c.stats()
        finally:
            stop(procs)
    assert n == s["batches_planned"]


def test_consumer_iteration_is_done_after_the_last_epoch(producer_bin, dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            n = sum(1 for _ in c)
            assert n > 0
            assert list(c) == []  # stays exhausted
            with pytest.raises(StopIteration):
                c.next_batch(timeout=0.1)
        finally:
            stop(procs)
    with pytest.raises(hsflow.HsflowError, match="closed"):
        c.port


def test_consumer_delivers_plan_order_when_asked(producer_bin, dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, order="plan",
                         arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=2)
        try:
            got = [(b.epoch, b.batch) for b in c]
        finally:
            stop(procs)
    assert len(got) == len(set(got)) > 2


@pytest.mark.parametrize("transport", ["ucx", "tcp"])
def test_producer_joining_after_the_run_is_told_bye_and_exits(producer_bin, dataset, transport):
    """A consumer whose run is over answers a new connection with BYE at
    once. Over UCX that frame can arrive while the producer is still inside
    connect, before it knows the connection; it must still see the BYE and
    exit, not wait for a WELCOME that never comes."""
    import time
    if transport == "ucx" and "UCX not found" in hsflow.library_version()["build"]:
        pytest.skip("built without UCX")
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, transport=transport,
                         arrays="numpy") as c:
        procs = start_producers(producer_bin, c.port, data, n=1,
                                extra=("--transport", transport))
        try:
            assert sum(1 for _ in c) > 2
        finally:
            stop(procs)
        for attempt in range(5):  # several late joiners: each one is a fresh race
            late = start_producers(producer_bin, c.port, data, n=1,
                                   extra=("--transport", transport))[0]
            t0 = time.monotonic()
            try:
                rc = late.wait(60)
            except subprocess.TimeoutExpired:
                late.kill()
                rc = late.wait()
            late.log.seek(0)
            out = late.log.read().decode(errors="replace")
            late.log.close()
            assert "consumer says BYE" in out, \
                "late producer %d (exit %d after %.1f s) never saw BYE:\n%s" % (
                    attempt, rc, time.monotonic() - t0, out)


def test_tickets_of_a_stopped_producer_expire_after_lease_timeout_s(producer_bin, dataset):
    """A producer stopped (SIGSTOP) while it is in the run keeps its
    connection but makes no progress: after lease_timeout_s its tickets go to
    the other producer and every batch still arrives exactly once."""
    import signal
    import time
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.001, epochs=2, lease_timeout_s=2,
                         verify_synthetic=True, arrays="numpy") as c:
        stopped = start_producers(producer_bin, c.port, data, n=1, workers=1)
        others = []
        try:
            t_end = time.monotonic() + 30
            while c.stats()["producers_connected"] < 1:
                assert time.monotonic() < t_end, "the first producer never joined"
                time.sleep(0.01)
            stopped[0].send_signal(signal.SIGSTOP)
            others = start_producers(producer_bin, c.port, data, n=1)
            got = []
            while True:
                try:
                    b = c.next_batch(timeout=30)
                except StopIteration:
                    break
                assert b is not None, "no batch for 30 s: the stopped producer kept its tickets"
                got.append((b.epoch, b.batch))
            s = c.stats()
        finally:
            stopped[0].kill()
            stopped[0].wait()
            stopped[0].log.close()
            stop(others)
    assert len(got) == len(set(got)) == s["batches_planned"] == s["batches_delivered"] > 4
    assert s["producers_dropped"] >= 1 and s["leases_returned"] >= 1, s
    assert s["duplicates"] == 0 and s["checksum_failures"] == 0


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_torch_mode_gives_bf16_tensors_sharing_the_consumer_memory(producer_bin, dataset):
    import torch
    data, rows = dataset
    n = 0
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, verify_synthetic=True,
                         arrays="torch") as c:
        procs = start_producers(producer_bin, c.port, data, n=1)
        try:
            for b in c:
                hs = b.hidden_states
                assert isinstance(hs, torch.Tensor) and hs.dtype == torch.bfloat16
                assert hs.shape == (b.n_tokens, len(LAYERS) * H)
                assert hs.data_ptr() == b.pointers()["hidden_states"]
                assert b.input_ids.dtype == torch.int32
                assert b.input_ids.data_ptr() == b.pointers()["input_ids"]
                assert b.loss_mask.dtype == torch.uint8 and b.cu_seqlens.dtype == torch.int32
                want = hsflow.synthetic_hidden(b.sample_ids, b.cu_seqlens.numpy(), b.layers, H)
                got = hs.view(torch.int16).numpy().view(np.uint16)
                assert np.array_equal(got, want)
                # the bf16 values are what the bits say
                f = hs[:4].float().numpy()
                assert np.array_equal(f, hsflow.bf16_bits_to_f32(want[:4]))
                n += 1
        finally:
            stop(procs)
    assert n > 0


def test_consumer_refuses_a_cache_larger_than_memory_unless_forced(tmp_path, monkeypatch):
    # A stand-in system: 16 MiB available, a cgroup limit of 12 MiB with 2 in use.
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "meminfo").write_text("MemAvailable:      16384 kB\n")
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/job\n")
    cg = tmp_path / "sys" / "fs" / "cgroup" / "job"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text("%d\n" % (12 << 20))
    (cg / "memory.current").write_text("%d\n" % (2 << 20))
    monkeypatch.setenv("HS_SYSTEM_ROOT", str(tmp_path))
    with pytest.raises(hsflow.HsflowError, match="hs_consumer_create"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02)
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, force=True) as c:
        assert c.port > 0
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.005) as c:  # 5 MiB fits
        assert c.port > 0


def test_two_ranks_deliver_disjoint_shards_of_equal_size_with_torchrun_defaults(
        producer_bin, dataset, monkeypatch, capsys):
    data, rows = dataset
    shards = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("HS_LOG_LEVEL", "info")  # read by the Python logger at each start
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2,
                             verify_synthetic=True, arrays="numpy") as c:
            assert (c.rank, c.world) == (rank, 2)
            # the rank, where it came from and LOCAL_RANK are logged at start
            assert ("rank %d of 2 from torchrun's RANK and WORLD_SIZE, LOCAL_RANK %d" % (rank, rank)
                    in capsys.readouterr().err)
            procs = start_producers(producer_bin, c.port, data, n=1)
            try:
                shards.append([(b.epoch, b.batch) for b in c])
            finally:
                stop(procs)
    a, b = shards
    assert len(a) == len(b) > 0 and not set(a) & set(b)
    assert sum(1 for e, _ in a if e == 0) == sum(1 for e, _ in b if e == 0)


def test_rank_and_world_are_checked(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="rank must be 0..world-1"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, rank=2, world=2)
    with pytest.raises(ValueError, match="uneven"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, rank=0, world=2, uneven="pad")
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02)


def test_expect_pins_the_run_and_refuses_a_wrong_first_producer(producer_bin, dataset):
    data, _ = dataset
    tool = hsflow.find_tool("hs-data")
    assert tool, "hs-data not found next to hs-producer"
    out = subprocess.run([tool, "plan", data, "--token-budget", str(BUDGET), "--hidden-size",
                          str(H), "--layers", ",".join(map(str, LAYERS))],
                         capture_output=True, text=True, check=True).stdout
    pin = [l.split(None, 1)[1] for l in out.splitlines() if l.startswith("pin ")][0]
    words = pin.split()
    as_dict = {"plan": words[1], "dataset": words[3],
               "layout": {"H": H, "layers": LAYERS}}
    for expect in (pin, as_dict):
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, verify_synthetic=True,
                             arrays="numpy", expect=expect) as c:
            # a producer with other layers connects first: refused, the run stays open
            wrong = start_producers(producer_bin, c.port, data, n=1, extra=("--layers", "1,4"))[0]
            assert wrong.wait(30) == 2  # refused: the exit-code table's 2
            wrong.log.seek(0)
            text = wrong.log.read().decode(errors="replace")
            wrong.log.close()
            assert "expected H=%d,layers=%s,dtype=bf16" % (H, ",".join(map(str, LAYERS))) in text
            procs = start_producers(producer_bin, c.port, data, n=1)
            try:
                seen = [(b.epoch, b.batch) for b in c]
                s = c.stats()
            finally:
                stop(procs)
        assert len(seen) == s["batches_planned"] == s["batches_delivered"] > 0


def test_expect_is_checked_before_the_consumer_starts():
    for bad in ({"plan": "xyz"}, {"colour": "blue"}, "--expect-plan", "plan=0123 plan=4567", 42):
        with pytest.raises(ValueError, match="expect"):
            hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, expect=bad)
    with pytest.raises(hsflow.HsflowError):  # the library names the layers out of order
        hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, expect={"layout": "H=48,layers=9,4"})


def _e4m3_values():
    """float value of every e4m3 code (0x7f/0xff NaN), from its definition."""
    v = np.empty(256, np.float64)
    for c in range(256):
        e, m = (c >> 3) & 15, c & 7
        x = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[c] = np.nan if (c & 0x7f) == 0x7f else (-x if c & 0x80 else x)
    return v


def _quantize_rows(bf16_bits):
    """The fp8 rows hsflow's producers write, computed here in numpy: per
    token scale = amax / 448, each value to the nearest e4m3 code (ties to
    the even code) of value / scale."""
    x = (bf16_bits.astype(np.uint32) << 16).view(np.float32)
    amax = np.abs(x).max(axis=1)
    scale = np.where(amax > 0, amax / np.float32(448), np.float32(1)).astype(np.float32)
    y = (x / scale[:, None]).astype(np.float32).astype(np.float64)
    codes = np.arange(0x7f)  # non-negative finite codes, increasing in value
    table = _e4m3_values()[:0x7f]
    a = np.minimum(np.abs(y), 448.0)
    hi = np.clip(np.searchsorted(table, a), 1, 0x7e)
    lo = hi - 1
    d_lo, d_hi = a - table[lo], table[hi] - a
    pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0)), hi, lo)
    q = (pick | np.where(np.signbit(y), 0x80, 0)).astype(np.uint8)
    return q, scale


def _dequantize_rows(q, scale):
    """bf16 bits of e4m3 * scale (the product rounded to float32, then to
    bf16, nearest even)."""
    f = (_e4m3_values()[q].astype(np.float32) * scale[:, None]).astype(np.float32)
    u = f.view(np.uint32)
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("deliver", ["fp8", "bf16"])
def test_fp8_run_delivers_raw_bytes_and_scales_or_bf16_as_numpy_quantises_the_states(
        producer_bin, dataset, deliver):
    """Producers with --hs-dtype fp8; the consumer checks every byte and
    scale (verify_synthetic) and hands the trainer the e4m3 bytes and scales
    (deliver='fp8') or their bf16 values (deliver='bf16'), each equal, bit
    for bit, to a quantisation of the synthetic states computed here."""
    data, _ = dataset
    n = 0
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, verify_synthetic=True,
                         arrays="numpy", deliver=deliver) as c:
        procs = start_producers(producer_bin, c.port, data, extra=("--hs-dtype", "fp8"))
        try:
            for b in c:
                assert b.hidden_dtype == deliver
                want = hsflow.synthetic_hidden(b.sample_ids, b.cu_seqlens, b.layers, H)
                q, scale = _quantize_rows(want)
                if deliver == "fp8":
                    assert b.hidden_fp8.dtype == np.uint8 and b.hidden_scales.dtype == np.float32
                    assert np.array_equal(b.hidden_fp8, q)
                    assert np.array_equal(b.hidden_scales, scale)
                    with pytest.raises(hsflow.HsflowError, match="delivered as fp8"):
                        b.hidden_states
                else:
                    assert np.array_equal(b.hidden_states, _dequantize_rows(q, scale))
                n += 1
            s = c.stats()
        finally:
            stop(procs)
    assert n == s["batches_planned"] > 2 and s["checksum_failures"] == 0


# A trainer that forks after making its consumer: a plain child that tries
# it (refused at once, though a thread of the parent held its lock at the
# fork) and exits as a script does (the interpreter's teardown collects the
# consumer and the batch the parent holds), or a torch DataLoader with 2
# forked workers whose dataset holds the consumer and tries it. Prints its port, then one JSON
# line: the batches it took and what the children did.
FORKING_TRAINER = r"""
import json, os, sys, time
import hsflow
mode, journal = sys.argv[1], sys.argv[2]
c = hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, journal=journal,
                    arrays="numpy")
print(json.dumps({"port": c.port}), flush=True)


def reap(pid, limit_s):
    t_end = time.monotonic() + limit_s
    while time.monotonic() < t_end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung for %d s" % limit_s


seen, report = [], {}
for b in c:
    seen.append([b.epoch, b.batch])
    if len(seen) != 3:
        continue
    if mode == "fork":
        import threading
        held, go = threading.Event(), threading.Event()

        def hold():  # another thread of the trainer is inside the consumer at the fork
            with c._lock:
                held.set()
                go.wait(30)
        t = threading.Thread(target=hold)
        t.start()
        held.wait(30)
        pid = os.fork()
        if pid == 0:
            try:
                c.next_batch(timeout=1)
                code = 3
            except hsflow.HsflowError as e:
                code = 0 if "forked" in str(e) else 4
            sys.exit(code)
        go.set()
        t.join()
        report["child"] = reap(pid, 20)
    else:
        import torch.utils.data as tud

        class Probe(tud.Dataset):
            def __init__(self, consumer):
                self.consumer = consumer

            def __len__(self):
                return 4

            def __getitem__(self, i):
                try:
                    self.consumer.next_batch(timeout=2)
                    return "took a batch"
                except hsflow.HsflowError as e:
                    self.consumer.close()
                    return str(e)

        loader = tud.DataLoader(Probe(c), batch_size=None, num_workers=2,
                                multiprocessing_context="fork", timeout=30)
        report["workers"] = list(loader)
print(json.dumps({"seen": seen, "report": report, "stats": c.stats()}), flush=True)
c.close()
"""


def run_forking_trainer(producer_bin, data, mode, journal):
    """Runs FORKING_TRAINER with producers; returns its last line, parsed."""
    import json
    import sys
    proc = subprocess.Popen([sys.executable, "-c", FORKING_TRAINER, mode, journal],
                            stdout=subprocess.PIPE, env=dict(os.environ, HS_LOG_LEVEL="warn"))
    procs = []
    try:
        port = json.loads(proc.stdout.readline())["port"]
        procs = start_producers(producer_bin, port, data)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, "the trainer exited %d" % proc.returncode
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop(procs)  # each exited 0 or was told BYE: none lost its connection
    return json.loads(out.decode().strip().splitlines()[-1])


def check_forked_run(res, journal):
    seen = [tuple(x) for x in res["seen"]]
    s = res["stats"]
    assert len(seen) == len(set(seen)) == s["batches_planned"] == s["batches_delivered"] > 3
    assert s["producers_dropped"] == 0 and s["finished"], s
    with open(journal) as f:
        lines = f.read().splitlines()[1:]
    entries = [tuple(int(x) for x in line.split()) for line in lines if line.strip()]
    assert len(entries) == len(set(entries)), "the journal names a batch twice: %s" % entries
    assert sorted(entries) == sorted(seen)


def test_a_forked_child_that_exits_normally_leaves_the_parents_consumer_alone(
        producer_bin, dataset, tmp_path):
    """The child's exit collects its copy of the consumer and of the batch
    the parent holds: it must neither hang in the library's teardown nor
    release, journal or disconnect anything of the parent's."""
    data, _ = dataset
    journal = str(tmp_path / "journal")
    res = run_forking_trainer(producer_bin, data, "fork", journal)
    assert res["report"]["child"] == 0, res["report"]
    check_forked_run(res, journal)


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_dataloader_workers_forked_from_the_trainer_cannot_touch_its_consumer(
        producer_bin, dataset, tmp_path):
    data, _ = dataset
    journal = str(tmp_path / "journal")
    res = run_forking_trainer(producer_bin, data, "dataloader", journal)
    workers = res["report"]["workers"]
    assert len(workers) == 4
    for said in workers:
        assert "forked" in said and "num_workers=0" in said, said
    check_forked_run(res, journal)
