# SPDX-License-Identifier: Apache-2.0
"""hsflow-produce (python -m hsflow.produce) end to end on the CPU: tiny
random transformers models built here (llama, qwen3, and the qwen3_moe
mixture of experts), served to a real consumer over loopback. Every
sample's received hidden states are compared with transformers'
output_hidden_states for those indices; a Python producer and an
hs-producer serve one run together; bad model folders and layer indices,
an out-of-memory batch and a killed worker are each handled as described in
python/README.md. The GPU path (side-stream copies into page-locked
staging) has its own test, skipped without a CUDA device."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hsflow
from conftest import ROOT, ConsumerThread, asan_runtime_loaded, write_dataset
from ports import reserve_port

# The Python producer runs torch, whose C++ exceptions (c10's CUDA probe on a
# machine without a GPU) throw through the preloaded ASan runtime's
# __cxa_throw interceptor, which finds no C++ runtime beside it: under a
# sanitized library these tests would test that clash, not hsflow.
pytestmark = pytest.mark.skipif(asan_runtime_loaded(),
                                reason="torch does not run under the preloaded ASan runtime")

if os.environ.get("CI"):  # scripts/install-deps installs them: CI must not skip
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

VOCAB = 500
BUDGET = 512


def _round_to_bf16(model):
    """Rounds every weight to bf16 (kept in fp32), so hs-producer's bf16
    weights and transformers' fp32 ones are the same numbers."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def make_model(family, path, head_dim=16):
    """head_dim: vLLM's CPU attention takes 32 and more (test_vllm.py)."""
    torch.manual_seed(1234)
    common = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=64 // head_dim,
                  num_key_value_heads=max(1, 32 // head_dim),
                  max_position_embeddings=1024, tie_word_embeddings=False)
    if family == "llama":
        cfg = transformers.LlamaConfig(intermediate_size=96, num_hidden_layers=4, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(intermediate_size=96, num_hidden_layers=4,
                                       head_dim=head_dim, **common)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif family == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32,
                                          num_experts=4, num_experts_per_tok=2,
                                          num_hidden_layers=3, head_dim=head_dim,
                                          decoder_sparse_step=1, norm_topk_prob=True, **common)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    else:
        raise ValueError(family)
    # Weights of a visible size: random init at std 0.02 makes every layer
    # look alike, and a wrong layer must fail the comparison.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.15)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
    _round_to_bf16(model)
    model.eval()
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for fam in ("llama", "qwen3", "qwen3_moe"):
        out[fam] = (str(root / fam), make_model(fam, str(root / fam)))
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("data") / "data.jsonl")
    rows = write_dataset(path, 36, 3, 150, VOCAB, seed=11)
    return path, rows


def reference(model, ids):
    """transformers' output_hidden_states of one sequence, fp32 [N+1][L, H]."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return [h[0].float().numpy() for h in out.hidden_states]


class Refs:
    """transformers' states of every sample, computed before the run starts
    (so the consumer's checks keep pace on a loaded machine)."""

    def __init__(self, model, rows):
        self.model, self.rows = model, rows
        self.cache = {i: reference(model, r[0]) for i, r in enumerate(rows)}

    def get(self, sid, n):
        if sid not in self.cache:
            self.cache[sid] = reference(self.model, self.rows[sid][0])
        return [h[:n] for h in self.cache[sid]]


def check_batch(b, refs, layers, H, worst):
    """Every sequence of batch b equals the reference at every captured
    index, to bf16 rounding: at most one bf16 step (2^-7 of the value, plus
    1e-5) from the fp32 reference, and 95% of the values are exactly the
    reference rounded to bf16."""
    got = hsflow.bf16_bits_to_f32(np.asarray(b.hidden_states))
    for s in range(b.n_seqs):
        lo, hi = int(b.cu_seqlens[s]), int(b.cu_seqlens[s + 1])
        ref = refs.get(int(b.sample_ids[s]), hi - lo)
        for j, layer in enumerate(layers):
            g = got[lo:hi, j * H:(j + 1) * H]
            r = ref[layer]
            err = np.abs(g - r)
            bound = 2.0 ** -7 * np.abs(r) + 1e-5
            worst[layer] = max(worst.get(layer, 0.0), float((err / bound).max()))
            exact = np.mean(hsflow.f32_to_bf16_bits(np.ascontiguousarray(r)) ==
                            np.asarray(b.hidden_states)[lo:hi, j * H:(j + 1) * H])
            assert exact >= 0.95, "batch %d/%d sample %d layer %d: only %.1f%% exact" % (
                b.epoch, b.batch, int(b.sample_ids[s]), layer, 100 * exact)
            assert (err <= bound).all(), (
                "batch %d/%d sample %d layer %d: max |got-ref| %.3g (bound %.3g); got %s ref %s"
                % (b.epoch, b.batch, int(b.sample_ids[s]), layer, err.max(),
                   bound[err.argmax() // H].max(), g.ravel()[:4], r.ravel()[:4]))


def produce_cmd(port, data, model, layers, *extra):
    return [sys.executable, "-m", "hsflow.produce", "--to", "127.0.0.1:%d" % port, "--data", data,
            "--token-budget", str(BUDGET), "--model", model, "--layers", layers,
            "--dtype", "fp32", "--connect-timeout", "60", "--status-interval", "0"] + list(extra)


class Proc:
    """A producer process whose stderr is collected in a thread."""

    def __init__(self, cmd, env=None):
        e = dict(os.environ, HS_LOG_LEVEL="info")
        e["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "python")] + [os.path.abspath(x) for x in
                                             os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                             if x])
        e.update(env or {})
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  text=True, env=e, cwd=ROOT)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line)

    @property
    def text(self):
        return "".join(self.lines)

    def wait_for(self, pattern, timeout=180):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.text)
            if m:
                return m
            if self.p.poll() is not None:
                time.sleep(0.3)
                m = re.search(pattern, self.text)
                if m:
                    return m
                raise AssertionError("exited %s before printing %r:\n%s"
                                     % (self.p.returncode, pattern, self.text))
            time.sleep(0.1)
        raise AssertionError("no %r within %d s:\n%s" % (pattern, timeout, self.text))

    def wait(self, timeout=240):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
            raise AssertionError("producer still running after %d s:\n%s" % (timeout, self.text))
        self.t.join(10)
        return rc

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()


@pytest.mark.parametrize("family,layers,extra", [
    ("llama", "0,2,4", ["--gpus", "cpu:1"]),                              # embeddings .. final norm
    ("qwen3", "1,3", ["--gpus", "cpu:1", "--batching", "packed", "--staging-buffers", "2"]),
    ("qwen3_moe", "2,3", ["--gpus", "cpu:2", "--attn-implementation", "eager",
                          "--staging-buffers", "3"]),
])
def test_every_sample_equals_transformers_output_hidden_states(models, data, tmp_path, family,
                                                               layers, extra):
    path, model = models[family]
    data_path, rows = data
    lay = [int(x) for x in layers.split(",")]
    H = model.config.hidden_size
    refs, worst = Refs(model, rows), {}
    summary = str(tmp_path / "summary.json")
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        ct = ConsumerThread(c, lambda b: check_batch(b, refs, lay, H, worst), deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, layers, "--summary-json", summary, *extra))
        try:
            rc = pr.wait()
            assert rc == 0, pr.text
            seen = ct.join(240)
        finally:
            pr.kill()
        s = c.stats()
    assert len(seen) == len(set(seen)) == s["batches_planned"] > 3
    js = json.load(open(summary))
    assert js["batches"] == len(seen) and js["status"] == "ok" and js["layers"] == lay
    assert js["batching"] == ("packed" if "packed" in extra else "padded")
    n_workers = int(extra[1].split(":")[1])
    assert len(js["workers"]) == n_workers
    staging = int(extra[extra.index("--staging-buffers") + 1]) if "--staging-buffers" in extra \
        else 4  # hsflow-produce's default
    assert [w["staging_buffers"] for w in js["workers"]] == [staging] * n_workers
    for w in js["workers"]:  # where each worker's host time went, per batch
        assert set(w["host_ms_per_batch"]) == {"launch", "wait", "send"}, w
        assert all(v >= 0 for v in w["host_ms_per_batch"].values()), w
        assert w["batches"] == 0 or w["host_ms_per_batch"]["launch"] > 0, w
    print("%s: worst error / bound per layer: %s" % (family, worst))


def test_one_python_producer_feeds_two_ranks_each_its_shard(models, data):
    """--to with every rank's address: the workers take tickets from both
    consumer ranks, each rank gets the same number of batches, and the two
    shards are disjoint; a malformed address list is refused as a flag
    error before anything connects."""
    path, model = models["llama"]
    data_path, rows = data
    layers, lay = "1,3", [1, 3]
    H = model.config.hidden_size
    refs, worst = Refs(model, rows), {}
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, rank=0, world=2,
                         arrays="numpy") as c0, \
            hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, rank=1, world=2,
                            arrays="numpy") as c1:
        threads = [ConsumerThread(c, lambda b: check_batch(b, refs, lay, H, worst),
                                  deadline_s=240) for c in (c0, c1)]
        to = "127.0.0.1:%d,127.0.0.1:%d" % (c0.port, c1.port)
        cmd = produce_cmd(0, data_path, path, layers, "--gpus", "cpu:2")
        cmd[cmd.index("--to") + 1] = to
        pr = Proc(cmd)
        try:
            rc = pr.wait()
            assert rc == 0, pr.text
            seen = [t.join(240) for t in threads]
        finally:
            pr.kill()
        stats = [c0.stats(), c1.stats()]
    assert "rank 0 of 2" in pr.text and "rank 1 of 2" in pr.text, pr.text
    got = [{(e, b) for e, b, _ in s} for s in seen]
    assert len(got[0]) == len(seen[0]) == len(got[1]) == len(seen[1]) > 1
    assert not got[0] & got[1], "a batch went to both ranks"
    assert all(s["batches_delivered"] == s["batches_planned"] == len(got[0]) for s in stats)
    bad_cmd = produce_cmd(0, data_path, path, layers)
    bad_cmd[bad_cmd.index("--to") + 1] = "127.0.0.1:7003-7000"
    bad = Proc(bad_cmd)
    assert bad.wait() == 2, bad.text
    assert "is not HOST:PORT or HOST:LO-HI" in bad.text, bad.text


def plan_hash_of_hs_producer(text):
    m = re.search(r"plan ([0-9a-f]{16}):", text)
    assert m, text
    return m.group(1)


def test_python_and_hs_producer_serve_one_run_exactly_once_with_one_plan_hash(
        models, data, tmp_path, producer_bin):
    path, model = models["llama"]
    data_path, rows = data
    H = model.config.hidden_size
    refs, worst = Refs(model, rows), {}
    plan = ["--seed", "7", "--max-seq-len", "100", "--overflow", "truncate"]
    summary_py, summary_c = str(tmp_path / "py.json"), str(tmp_path / "c.json")
    delivered = []

    def check(b):
        check_batch(b, refs, [1, 3], H, worst)
        delivered.append((b.epoch, b.batch))
        time.sleep(0.05)  # a trainer that takes a moment, so both producers get tickets

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.0015, epochs=3, arrays="numpy") as c:
        py = Proc(produce_cmd(c.port, data_path, path, "1,3", "--summary-json", summary_py,
                              *plan))
        cp = None
        try:
            deadline = time.monotonic() + 180
            while c.stats()["producers_connected"] < 1:
                assert py.p.poll() is None and time.monotonic() < deadline, py.text
                time.sleep(0.2)
            cp = Proc([producer_bin, "--to", "127.0.0.1:%d" % c.port, "--data", data_path,
                       "--token-budget", str(BUDGET), "--source", "model", "--model", path,
                       "--layers", "1,3", "--summary-json", summary_c] + plan)
            # The trainer starts once both producers are in: until then the
            # small cache holds the Python producer back, so on a fast machine
            # it cannot finish the run before hs-producer has joined.
            while c.stats()["producers_connected"] < 2:
                assert cp.p.poll() is None and time.monotonic() < deadline, cp.text
                time.sleep(0.1)
            ct = ConsumerThread(c, check, deadline_s=240)
            deadline = time.monotonic() + 240
            while ct.thread.is_alive() and time.monotonic() < deadline:
                ct.thread.join(0.5)
            ct.join(1)
            assert cp.wait() == 0, cp.text
            assert py.wait() == 0, py.text
        finally:
            py.kill()
            if cp:
                cp.kill()
        s = c.stats()
    assert len(delivered) == len(set(delivered)) == s["batches_planned"] == s["batches_delivered"]
    assert s["duplicates"] == 0 and s["checksum_failures"] == 0
    js_py, js_c = json.load(open(summary_py)), json.load(open(summary_c))
    assert js_py["batches"] > 0 and js_c["batches"] > 0, (js_py, js_c)
    assert "late_busy_pct" in js_py["workers"][0], js_py
    assert js_py["plan_hash"] == plan_hash_of_hs_producer(cp.text)


def test_bad_model_folders_and_layer_indices_fail_before_any_ticket(models, data, tmp_path):
    path, _ = models["llama"]
    data_path, _ = data
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "no_such_model_type"}))
    (unknown / "model.safetensors").write_bytes(b"x")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    cases = [
        (str(tmp_path / "missing"), "0,1", r"not a directory"),
        (str(tmp_path), "0,1", r"no config.json there"),
        (str(unknown), "0,1", r"cannot load this config \(model_type 'no_such_model_type'\)"),
        (path, "2,5", r"hidden state 5 but the model at .* has 4 layers \(valid: 0\.\.4"),
        (str(broken), "0,1", r"cannot load .*broken.*no ticket was taken"),
    ]
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        for model_dir, layers, msg in cases:
            pr = Proc(produce_cmd(c.port, data_path, model_dir, layers))
            rc = pr.wait()
            assert rc == 2, pr.text
            assert re.search(msg, pr.text, re.S), pr.text
        s = c.stats()
    assert s["producers_seen"] == 0 and s["tickets_out"] == 0


def test_both_producers_exit_2_when_refused_and_1_when_no_consumer_answers(models, data,
                                                                           producer_bin):
    """One exit-code table for hs-producer and hsflow-produce: a refusal by
    the consumer (here another plan than the one it pins) is 2, as bad flags
    are, since the same command fails again; no consumer within
    --connect-timeout is 1, a failure of the run."""
    path, _ = models["llama"]
    data_path, _ = data

    def commands(port):
        return {"hsflow-produce": produce_cmd(port, data_path, path, "1,3",
                                              "--connect-timeout", "3", "--self-check", "0"),
                "hs-producer": [producer_bin, "--to", "127.0.0.1:%d" % port, "--data", data_path,
                                "--token-budget", str(BUDGET), "--source", "model", "--model",
                                path, "--layers", "1,3", "--connect-timeout", "3"]}

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy",
                         expect={"plan": "0123456789abcdef"}) as c:
        for name, cmd in commands(c.port).items():
            pr = Proc(cmd)
            assert pr.wait() == 2, (name, pr.text)
            assert re.search(r"refused", pr.text), (name, pr.text)
    port = reserve_port()  # a port nobody listens on
    for name, cmd in commands(port).items():
        pr = Proc(cmd)
        assert pr.wait() == 1, (name, pr.text)
        assert "Traceback" not in pr.text, (name, pr.text)


def test_hs_consumer_loopback_runs_hsflow_produce_as_its_producer_command(models, data,
                                                                         tmp_path):
    """hs-consumer --loopback N -- COMMAND ...: the word after -- is the
    producer command (hsflow-produce, found next to hs-consumer in build/bin),
    run with its own arguments and --to/--name added; the run completes."""
    path, _ = models["llama"]
    data_path, _ = data
    summary = tmp_path / "run.json"
    pr = Proc([hsflow.find_tool("hs-consumer"), "--loopback", "1", "--cache-gb", "0.05",
               "--epochs", "1", "--status-interval", "0", "--summary-json", str(summary), "--",
               "hsflow-produce", "--data", data_path, "--token-budget", str(BUDGET),
               "--model", path, "--layers", "1,4", "--dtype", "fp32", "--self-check", "0"])
    assert pr.wait(300) == 0, pr.text
    assert re.search(r"started 1 local producer\(s\): \S*hsflow-produce", pr.text), pr.text
    s = json.load(open(summary))
    assert s["complete"] is True and s["producers_seen"] == 1, s
    assert s["batches_delivered"] == s["batches_planned"] > 0 and s["duplicates"] == 0, s


@pytest.mark.parametrize("value", ["1", "5", "two"])
def test_staging_buffers_outside_2_to_4_are_refused_before_anything_runs(models, data, value):
    path, _ = models["llama"]
    data_path, _ = data
    pr = Proc(produce_cmd(1, data_path, path, "1", "--staging-buffers", value))
    assert pr.wait(60) == 2, pr.text
    assert "--staging-buffers" in pr.text and "2..4" in pr.text, pr.text


def test_summary_json_onto_an_input_is_refused_before_anything_runs(models, data, tmp_path):
    path, _ = models["llama"]
    data_path, _ = data
    secret = tmp_path / "key"
    secret.write_text("secret-secret-secret-secret-secret\n")
    os.symlink(data_path, tmp_path / "data-link.jsonl")
    watched = [data_path, str(secret)] + sorted(os.path.join(path, f) for f in os.listdir(path))
    before = {f: open(f, "rb").read() for f in watched}
    cases = [(data_path, "the output is the input"),
             (str(tmp_path / "data-link.jsonl"), "by another name or link"),
             (str(secret), "the output is the input"),
             (os.path.join(path, "config.json"), "inside the input folder"),
             (os.path.join(path, "summary.json"), "inside the input folder")]
    for out, why in cases:
        # port 1: nothing listens; the refusal comes before any connection
        pr = Proc(produce_cmd(1, data_path, path, "0,1", "--secret-file", str(secret),
                              "--summary-json", out))
        assert pr.wait() == 2, pr.text
        assert "--summary-json" in pr.text and why in pr.text, pr.text
    assert {f: open(f, "rb").read() for f in watched} == before
    assert not os.path.exists(os.path.join(path, "summary.json"))


def finish_with_hs_producer(producer_bin, port, data_path, path, layers):
    cp = Proc([producer_bin, "--to", "127.0.0.1:%d" % port, "--data", data_path,
               "--token-budget", str(BUDGET), "--source", "model", "--model", path,
               "--layers", layers])
    assert cp.wait() == 0, cp.text


def test_out_of_memory_returns_the_ticket_names_the_budget_and_stops_the_worker(
        models, data, producer_bin):
    path, model = models["llama"]
    data_path, rows = data
    H = model.config.hidden_size
    refs, worst, delivered = Refs(model, rows), {}, []

    def check(b):
        check_batch(b, refs, [2], H, worst)
        delivered.append((b.epoch, b.batch))

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        ct = ConsumerThread(c, check, deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, "2"), env={"HS_PRODUCE_FAULT": "oom:0:3"})
        try:
            rc = pr.wait()
        finally:
            pr.kill()
        assert rc == 3, pr.text
        assert re.search(r"out of memory on batch 0/\d+ .*Its ticket goes back to the consumer "
                         r"and this worker stops\. Lower --token-budget \(now 512; e\.g\. 256\)",
                         pr.text), pr.text
        assert len(delivered) <= 2  # the batches before the failure, no more
        deadline = time.monotonic() + 30
        while c.stats()["leases_returned"] < 1:
            assert time.monotonic() < deadline, "the failed batch's ticket never came back"
            time.sleep(0.1)
        finish_with_hs_producer(producer_bin, c.port, data_path, path, "2")
        ct.join(240)
        s = c.stats()
    assert len(delivered) == len(set(delivered)) == s["batches_planned"]


def test_a_killed_worker_is_reported_its_tickets_go_back_and_the_others_go_on(models, data):
    path, model = models["llama"]
    data_path, rows = data
    H = model.config.hidden_size
    refs, worst, delivered = Refs(model, rows), {}, []

    def check(b):
        check_batch(b, refs, [4], H, worst)
        delivered.append((b.epoch, b.batch))

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, arrays="numpy") as c:
        ct = ConsumerThread(c, check, deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, "4", "--gpus", "cpu:2"),
                  env={"HS_PRODUCE_FAULT": "hang:1:1"})
        try:
            pid = int(pr.wait_for(r"worker 1 \(cpu 1\): HS_PRODUCE_FAULT hangs on batch "
                                  r"\d+/\d+ \(pid (\d+)\)").group(1))
            os.kill(pid, signal.SIGKILL)
            rc = pr.wait()
            ct.join(240)
        finally:
            pr.kill()
        s = c.stats()
    assert rc == 1, pr.text
    assert re.search(r"worker 1 \(cpu 1, pid %d\) died: killed by signal 9 \(SIGKILL\); the "
                     r"consumer puts the tickets it held back in the queue; [01] worker\(s\) go on"
                     % pid, pr.text), pr.text
    assert s["leases_returned"] >= 1
    assert len(delivered) == len(set(delivered)) == s["batches_planned"]


def test_a_packing_that_leaks_across_sequences_is_caught_by_the_self_check_before_any_batch(
        models, data):
    """HS_PRODUCE_FAULT=leak plants, after the load-time probe, a decoder
    layer 1 that adds each token's predecessor in the row to its output: in
    a packed row the first token of every sequence but the first gets its
    neighbour's state. The self-check runs sequences of the first batch
    alone, finds captured index 2 off, and the worker refuses to stream:
    exit 2 naming the layer, the sequence and the error, no batch delivered,
    the ticket back in the queue."""
    path, _ = models["llama"]
    data_path, _ = data
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        pr = Proc(produce_cmd(c.port, data_path, path, "0,2,4", "--batching", "packed"),
                  env={"HS_PRODUCE_FAULT": "leak:0:1"})
        try:
            rc = pr.wait()
        finally:
            pr.kill()
        s = c.stats()
    assert rc == 2, pr.text
    assert re.search(r"self-check \(neighbours\): layer 2 of sequence \d+ of batch 0/\d+ "
                     r"\(sample \d+, \d+ tokens, \d+ sequences in the batch\) moves when the "
                     r"other sequences' tokens change: relative error [0-9.e+-]+, .*The packed "
                     r"batch mixes sequences: nothing was streamed\. Use --batching padded",
                     pr.text), pr.text
    assert s["batches_delivered"] == 0


@pytest.mark.parametrize("batching", ["padded", "packed"])
def test_shape_dependent_rounding_beyond_the_fixed_bound_does_not_refuse_a_correct_batch(
        models, data, batching):
    """On a GPU an 8-layer Llama's padded batch differed from its sequences
    run alone by 0.020 at layer 8 (kernels chosen by shape), over the fixed
    bound, and the self-check refused a correct run. HS_PRODUCE_FAULT=
    shape_noise plants a change of up to 4% that depends on the call's
    shape only: the self-check measures it on sequence 0 and streams."""
    path, _ = models["llama"]
    data_path, _ = data
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
        ct = ConsumerThread(c, lambda b: None, deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, "0,2,4", "--batching", batching),
                  env={"HS_PRODUCE_FAULT": "shape_noise:0:1"})
        try:
            assert pr.wait() == 0, pr.text
            ct.join(240)
        finally:
            pr.kill()
        s = c.stats()
    assert re.search(r"self-check passed: \d+ of \d+ sequence\(s\) of batch 0/\d+ keep their "
                     r"states when the other sequences change%s" % (
                         " and match themselves run alone" if batching == "packed" else ""),
                     pr.text), pr.text
    assert s["batches_delivered"] == s["batches_planned"]


def test_help_lists_hs_producers_flags_with_the_same_spellings(producer_bin):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    ours = subprocess.run([sys.executable, "-m", "hsflow.produce", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert ours.returncode == 0, ours.stderr
    theirs = subprocess.run([producer_bin, "--help"], capture_output=True, text=True, timeout=30)
    shared = ["--to", "--data", "--token-budget", "--max-seq-len", "--overflow", "--seed",
              "--layers", "--dflash-layers", "--hidden-size", "--model", "--gpus", "--prefetch",
              "--secret-file", "--transport", "--connect-timeout", "--reconnect",
              "--summary-json", "--name"]
    for flag in shared:
        assert flag in theirs.stdout, flag
        assert flag in ours.stdout, flag
    for flag in ("--dtype", "--attn-implementation", "--sdpa-backends", "--batching"):
        assert flag in ours.stdout


def test_sdpa_backends_flag_leaves_cudnn_out_by_default_and_refuses_unknown_kernels():
    # torch rebuilds cuDNN's attention graph for every new padded shape (tens
    # of ms of host time a call), so auto keeps a GPU worker's sdpa off it
    from hsflow import _produce_worker, produce
    assert produce._sdpa_backends("flash, math,flash") == "flash,math"
    with pytest.raises(Exception, match="expected auto or a comma-separated list"):
        produce._sdpa_backends("cudnn,fast")
    b = torch.backends.cuda
    before = (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(),
              b.math_sdp_enabled())
    try:
        for want, enabled in (("auto", (False, True, True, True)),
                              ("cudnn,math", (True, False, False, True))):
            w = _produce_worker.Worker(0, {"gpus": [0], "sdpa_backends": want}, None)
            w.impl = "sdpa"
            assert "sdpa kernels" in w._choose_sdpa_backends()
            assert (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(),
                    b.math_sdp_enabled()) == enabled, want
        w.impl = "eager"  # other attention: left alone
        assert w._choose_sdpa_backends() is None
    finally:
        b.enable_cudnn_sdp(before[0])
        b.enable_flash_sdp(before[1])
        b.enable_mem_efficient_sdp(before[2])
        b.enable_math_sdp(before[3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_worker_copies_through_pinned_staging_and_matches_transformers(models, data):
    path, model = models["qwen3"]
    data_path, rows = data
    H = model.config.hidden_size
    refs, worst = Refs(model, rows), {}
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, arrays="numpy") as c:
        ct = ConsumerThread(c, lambda b: check_batch(b, refs, [0, 2, 4], H, worst),
                            deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, "0,2,4", "--gpus", "0"))
        try:
            rc = pr.wait()
            seen = ct.join(240)
        finally:
            pr.kill()
    assert rc == 0, pr.text
    assert "cannot page-lock" not in pr.text
    assert len(seen) == len(set(seen)) > 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_profile_names_where_the_host_waits_for_the_gpu(models, data, tmp_path):
    """HS_PRODUCE_PROFILE writes the ops table, the trace, and syncs.txt:
    the allocator's counts and every call site that synchronised, with
    its stack."""
    path, _ = models["qwen3"]
    data_path, _ = data
    prof = tmp_path / "prof"
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, arrays="numpy") as c:
        ct = ConsumerThread(c, lambda b: None, deadline_s=240)
        pr = Proc(produce_cmd(c.port, data_path, path, "0,2,4", "--gpus", "0"),
                  env={"HS_PRODUCE_PROFILE": str(prof)})
        try:
            assert pr.wait() == 0, pr.text
            ct.join(240)
        finally:
            pr.kill()
    assert (prof / "ops.txt").stat().st_size > 0 and (prof / "trace.json").exists()
    syncs = (prof / "syncs.txt").read_text()
    assert re.match(r"CUDA allocator over batches 3-6: num_alloc_retries \+\d+, "
                    r"num_device_alloc \+\d+, num_device_free \+\d+\n\d+ call site", syncs), syncs


@pytest.mark.parametrize("value", ["1", "x", "-4"])
def test_a_profile_start_before_batch_2_or_not_a_number_is_refused_before_anything_runs(
        models, data, value):
    path, _ = models["llama"]
    data_path, _ = data
    pr = Proc(produce_cmd(1, data_path, path, "1"), env={"HS_PRODUCE_PROFILE_FROM": value})
    assert pr.wait(60) == 2, pr.text
    assert "HS_PRODUCE_PROFILE_FROM=%s" % value in pr.text and "2 or more" in pr.text, pr.text


def test_the_profiles_sync_counter_keys_sites_by_stack_and_passes_other_warnings_on():
    from hsflow import _produce_worker
    w = _produce_worker.Worker(0, {"gpus": [-1]}, None)
    w.sync_sites, passed = {}, []
    w._old_showwarning = lambda *a: passed.append(a[0])

    def site(msg):
        w._note_sync(UserWarning(msg), UserWarning, "f.py", 1)
    for _ in range(3):
        site("called a synchronizing CUDA operation (Triggered internally at x.cpp:1.)")
    site("called a synchronizing CUDA operation (Triggered internally at x.cpp:1.)")
    site("something else")
    assert sorted(c for c, _ in w.sync_sites.values()) == [1, 3]  # two call sites, by stack
    assert {m for _, m in w.sync_sites.values()} == {"called a synchronizing CUDA operation"}
    assert [str(m) for m in passed] == ["something else"]


class _Tickets:
    """A producer whose next_ticket gives None for the first `empty` calls
    (nothing queued), then `ticket`; records each call's timeout."""
    def __init__(self, empty, ticket="T"):
        self.empty, self.ticket, self.timeouts = empty, ticket, []

    def next_ticket(self, timeout=None):
        self.timeouts.append(timeout)
        if len(self.timeouts) <= self.empty:
            return None
        return self.ticket


class _Copy:
    """A copy event whose query() is False for the first `busy` calls."""
    def __init__(self, busy):
        self.busy, self.queries = busy, 0

    def query(self):
        self.queries += 1
        return self.queries > self.busy

    def synchronize(self):
        raise AssertionError("the worker blocked on the GPU waiting for a ticket")


def test_late_busy_is_the_forward_time_over_the_wall_time_of_the_second_half():
    from hsflow._produce_worker import late_busy_pct
    # sends at 1, 2, 3, 4 s; the second half (batches 3, 4) ran from 2 to 4 s
    assert late_busy_pct([(1.0, 0.5), (2.0, 0.5), (3.0, 0.9), (4.0, 0.3)]) == 60.0
    assert late_busy_pct([(1.0, 0.5), (2.0, 0.5), (3.0, 0.9)]) is None  # too few to halve


def _gpu_worker_recording_sends():
    from hsflow import _produce_worker
    w = _produce_worker.Worker(0, {"gpus": [0]}, None)
    w.sent = []
    w.finish = lambda rec: w.sent.append(rec["t"])
    return w


def test_with_no_ticket_queued_the_batch_on_the_gpu_is_sent_once_copied_without_blocking():
    w = _gpu_worker_recording_sends()
    pending = {"t": "N", "copied": _Copy(busy=2)}
    p = _Tickets(empty=3)
    t, left = w._next_ticket(p, pending)
    # polled while the copy ran, sent as it finished, then a blocking wait
    assert (t, left, w.sent) == ("T", None, ["N"])
    assert p.timeouts == [0.002, 0.002, 0.002, None]


def test_a_ticket_that_comes_during_the_forward_leaves_the_batch_on_the_gpu_pending():
    w = _gpu_worker_recording_sends()
    pending = {"t": "N", "copied": _Copy(busy=10)}
    t, left = w._next_ticket(_Tickets(empty=2), pending)
    assert (t, left, w.sent) == ("T", pending, [])
    assert w.fig["stall_s"] == 0.0  # the GPU had work: not a stall


@pytest.mark.parametrize("gpus", ["cpu:1", "0"])
def test_fp8_run_sends_the_quantisation_of_the_bf16_runs_states(models, data, gpus):
    """hsflow-produce --hs-dtype fp8 (on the CPU: the library's quantiser;
    on a GPU: torch's, before the copy to the host) sends, for every batch,
    the e4m3 bytes and scales the test's numpy quantiser computes from the
    bf16 states a bf16 run of the same plan sends."""
    if gpus != "cpu:1" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from test_consumer import _quantize_rows
    path, model = models["llama"]
    data_path, _ = data
    runs = {}
    for dtype in ("bf16", "fp8"):
        got = {}

        def keep(b):
            got[(b.epoch, b.batch)] = (b.hidden_states.copy() if dtype == "bf16" else
                                       (b.hidden_fp8.copy(), b.hidden_scales.copy()))
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy",
                             deliver=dtype) as c:
            ct = ConsumerThread(c, keep, deadline_s=240)
            pr = Proc(produce_cmd(c.port, data_path, path, "0,2,4", "--gpus", gpus,
                                  "--hs-dtype", dtype))
            try:
                rc = pr.wait()
                assert rc == 0, pr.text
                ct.join(240)
            finally:
                pr.kill()
        runs[dtype] = got
    assert runs["bf16"].keys() == runs["fp8"].keys() and len(runs["fp8"]) > 3
    for key, bits in runs["bf16"].items():
        q, scale = _quantize_rows(bits)
        assert np.array_equal(runs["fp8"][key][1], scale), "batch %s: scales" % (key,)
        assert np.array_equal(runs["fp8"][key][0], q), "batch %s: e4m3 bytes" % (key,)


def test_the_package_installs_hsflow_produce_as_a_console_script():
    import tomllib
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["hsflow-produce"] == "hsflow.produce:main"
    from hsflow import produce
    assert produce.main(["--help"]) == 0
