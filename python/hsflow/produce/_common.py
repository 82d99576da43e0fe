# SPDX-License-Identifier: Apache-2.0
"""What every engine of hsflow-produce shares: exit codes, the flag
helpers, the worker process's life (serve: load, report ready, wait for the
go, run, report the exit), its hsflow.Producer and its figures. An engine
module (transformers.py, vllm.py) provides add_arguments(parser),
check(args, spec), DEPS, a Worker class (load, run, close) and a
worker_main(index, spec, queue, go, abort) that calls serve with it; the
command (__init__.py) and its supervisor know nothing else of an engine.

Messages to the parent (a multiprocessing queue): ("ready", i, info),
("error", i, code, text), ("stats", i, figures), ("exit", i, code, figures).
Exit codes, hs-producer's: 0 run over, 1 failure (no consumer, lost, a
crash), 2 bad model/flags or refused by the consumer, 3 out of memory (the
ticket went back; lower the token budget)."""
import argparse
import os
import signal
import time

from .. import _dtypes

EXIT_OK, EXIT_FAIL, EXIT_INPUT, EXIT_OOM = 0, 1, 2, 3
# What hs-producer exits 2 for too: the consumer refused this producer (plan,
# layout, dataset, version, secret) or the flags name what cannot work
# (HS_ERR_INVALID, _IO, _FORMAT, _MISMATCH, _AUTH, _NOT_FOUND, _UNSUPPORTED).
REFUSED_STATUS = (-1, -3, -4, -6, -7, -13, -14)


class Stop(Exception):
    """SIGTERM in a worker process."""


class Failure(Exception):
    """A worker's failure its message explains in full (no traceback)."""


class SelfCheckError(Exception):
    """The first batch's states of a sequence differ from that sequence run
    alone beyond bf16 noise: nothing is streamed."""


def env(name, default=None):
    return os.environ.get("HS_" + name.upper().replace("-", "_"), default)


def env_flag(name):
    v = env(name)
    return v is not None and v.lower() in ("1", "true", "yes")


def uint(lo, hi, what):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            v = lo - 1
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError("'%s': expected %s" % (s, what))
        return v
    return parse


def fault(spec_text, worker):
    """HS_PRODUCE_FAULT for tests: KIND:W:N entries separated by commas,
    KIND at worker W's N-th batch (or layer, as the engine reads it).
    Returns {N: KIND} for this worker."""
    out = {}
    for part in filter(None, (spec_text or "").split(",")):
        kind, w, n = part.split(":")
        if int(w) == worker:
            out[int(n)] = kind
    return out


def late_busy_pct(sent):
    """Busy % over the second half of a worker's batches: their compute
    time over the wall time from the send of the batch before them to the
    send of the last (None under 4 batches). Beside the whole run's busy %,
    it leaves out a fresh process's first batches, which load and tune
    kernels for each new shape."""
    n = len(sent)
    if n < 4:
        return None
    h = n // 2
    span = sent[-1][0] - sent[h - 1][0]
    return round(100.0 * sum(b for _, b in sent[h:]) / span, 1) if span > 0 else None


def is_oom(e):
    import torch
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and ("out of memory" in str(e).lower() or
                                            "can't allocate memory" in str(e).lower())


class WorkerBase:
    """The figures, faults and hsflow.Producer of one worker."""

    def __init__(self, index, spec, queue):
        self.index, self.spec, self.q = index, spec, queue
        self.gpu = spec["gpus"][index] if index < len(spec["gpus"]) else -1
        self.label = "worker %d" % index
        self.fig = {"worker": index, "gpu": self.gpu, "batches": 0, "tokens": 0, "bytes": 0,
                    "busy_s": 0.0, "stall_s": 0.0, "padded_tokens": 0, "seconds": 0.0,
                    "launch_s": 0.0, "wait_s": 0.0, "send_s": 0.0,
                    "plan_hash": None, "pid": os.getpid()}
        self.faults = fault(os.environ.get("HS_PRODUCE_FAULT"), index)
        self.producer = None
        self.sent_at = []  # (monotonic time sent, busy seconds) per batch

    def connect(self):
        import hsflow
        s = self.spec
        name = s["name"]
        if name and s.get("n_workers", len(s["gpus"])) > 1:
            name = "%s/%d" % (name, self.index)
        self.producer = hsflow.Producer(
            to=s["to"], data=s["data"], token_budget=s["token_budget"],
            hidden_size=s["hidden_size"], layers=s["layers"], seed=s["seed"],
            max_seq_len=s["max_seq_len"], overflow=s["overflow"], prefetch=s["prefetch"],
            secret_file=s["secret_file"], transport=s["transport"], name=name,
            connect_timeout_s=s["connect_timeout"], arrays="torch", reconnect=s["reconnect"],
            status_interval_s=s["status_interval"] if s["status_interval"] > 0 else -1,
            hs_dtype=s.get("hs_dtype", "bf16"), staging_buffers=s.get("staging_buffers", 0),
            target=s["model"], target_fingerprint=s["target_fingerprint"])
        p = self.producer
        self.fig["plan_hash"] = "%016x" % p.plan_hash
        self.fig["staging_buffers"] = len(p.staging())
        if p.max_batch_tokens > s["token_budget"]:
            raise RuntimeError("the plan has a batch of %d tokens, over the budget %d"
                               % (p.max_batch_tokens, s["token_budget"]))
        return p

    def count_sent(self, t, t_send, busy, padded):
        """The figures of ticket t, just sent: t_send is when its packing or
        sealing began, busy its compute seconds, padded its padding tokens."""
        f = self.fig
        now = time.monotonic()
        f["send_s"] += now - t_send
        self.sent_at.append((now, busy))
        f["busy_s"] += busy
        f["batches"] += 1
        f["tokens"] += t.n_tokens
        f["bytes"] += t.nbytes
        f["padded_tokens"] += padded

    def close(self):
        if self.producer is not None:
            self.producer.close()
            self.producer = None


def children():
    """(pid, create time) of every process under this one (vLLM's engine
    and its workers), to end them even if vLLM does not."""
    try:
        import psutil
    except ImportError:
        return []
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            out.append((c.pid, c.create_time()))
        except psutil.Error:
            pass
    return out


def end_children(children, timeout=5.0):
    """Ends the processes of children ((pid, create time) pairs, as
    _children gives them) that still run: SIGTERM, then SIGKILL after
    timeout. A pid reused by another process (other create time) is left
    alone."""
    try:
        import psutil
    except ImportError:
        return
    procs = []
    for pid, created in children:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                procs.append(p)
        except psutil.Error:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def serve(worker_cls, index, spec, queue, go, abort):
    """A spawned worker process's life: load the engine, report ready, wait
    for every worker to be ready, run, report the exit, leave."""
    from .. import _log
    log = _log.setup("producer w%d" % index)

    def on_term(signum, frame):
        raise Stop()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us with SIGTERM
    w = worker_cls(index, spec, queue)
    w.log = log
    code = EXIT_FAIL
    try:
        try:
            info = w.load()
        except Stop:
            raise
        except Exception as e:
            code = EXIT_INPUT  # a folder the engine cannot load, or too big for the device
            queue.put(("error", index, code,
                       "worker %d (%s): cannot load %s: %s" % (
                           index, w.label, spec["model"],
                           str(e).splitlines()[0] if str(e) else type(e).__name__)))
            return
        queue.put(("ready", index, info))
        ppid = os.getppid()
        code = EXIT_OK
        while not go.wait(0.5):
            if abort.is_set() or os.getppid() != ppid:
                return
        if abort.is_set():
            return
        code = w.run()
    except Stop:
        code = EXIT_OK
    except SelfCheckError as e:
        code = EXIT_INPUT
        queue.put(("error", index, code, "worker %d (%s): %s" % (index, w.label, e)))
    except Failure as e:
        code = EXIT_FAIL
        queue.put(("error", index, code, "worker %d (%s): %s" % (index, w.label, e)))
    except Exception as e:
        import hsflow
        if (isinstance(e, hsflow.HsflowError) and w.fig["batches"] == 0 and
                e.status in REFUSED_STATUS):
            code = EXIT_INPUT
            queue.put(("error", index, code,
                       "worker %d (%s): %s. The consumer refused this producer or is not there: "
                       "every producer of a run needs the same --data, --token-budget, "
                       "--max-seq-len, --overflow, --seed and --layers, and the model's hidden "
                       "size (%d) must be the run's" % (index, w.label, e, spec["hidden_size"])))
        elif isinstance(e, hsflow.HsflowError) and w.fig["batches"] == 0:
            code = EXIT_FAIL  # nobody there, or lost: the same command may work later
            queue.put(("error", index, code,
                       "worker %d (%s): %s. No consumer took this producer at --to %s within "
                       "--connect-timeout, or it was lost: start the consumer first, check the "
                       "address, or give --reconnect" % (index, w.label, e, spec.get("to"))))
        else:
            code = EXIT_FAIL
            log.exception("worker %d (%s) failed", index, w.label)
            queue.put(("error", index, code, "worker %d (%s) failed: %s" % (index, w.label, e)))
    finally:
        try:
            w.close()
        except Stop:
            pass
        queue.put(("exit", index, code, dict(w.fig)))
        queue.close()
        queue.join_thread()
        os._exit(code)  # skips torch's and CUDA's slow teardown; everything is closed
