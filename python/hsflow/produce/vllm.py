# SPDX-License-Identifier: Apache-2.0
"""The vLLM engine of hsflow-produce (--engine vllm): one worker process per
replica, each holding an in-process vllm.LLM that runs the target with its
own parallelism (tensor, pipeline, expert), quantisation and kernels.

For each ticketed batch the worker submits the batch's sequences as prompt
token ids with max_tokens=1 under vLLM's extract_hidden_states speculative
method; hsflow's KV connector (_vllm_connector, loaded through
kv_connector_module_path) writes each finished request's captured layers and
token ids into the shared-memory area of the request's batch (_rows.Rows).
Once every sequence of a batch is there the worker checks each sequence's
token ids against the plan's, applies the model's own final norm to index N
(vLLM captures the residual stream before it), packs the rows into the
ticket's [T, k*H] bf16 buffer and sends. Up to --staging-buffers batches are
in vLLM's scheduler at once.

Messages and exit codes are the transformers engine's (_common)."""
import json
import os
import time

from . import _common
from ._common import EXIT_OK, EXIT_OOM, SelfCheckError

# the packages this engine's workers import, named before any process starts
DEPS = ("torch", "transformers", "vllm")
WAIT_ROWS_S = 120.0  # the most a finished batch's rows may take to arrive


def add_arguments(p):
    g = p.add_argument_group("vLLM engine (--engine vllm)")
    env = _common.env
    a = g.add_argument
    a("--tensor-parallel-size", type=_common.uint(1, 1024, "1..1024"),
      default=env("tensor-parallel-size", "1"),
      help="vLLM tensor parallelism: ranks per replica; --gpus is split into replicas of "
           "tensor x pipeline parallel size GPUs each (default 1); on the CPU --gpus cpu:R "
           "runs R replicas of that many CPU ranks")
    a("--pipeline-parallel-size", type=_common.uint(1, 1024, "1..1024"),
      default=env("pipeline-parallel-size", "1"),
      help="vLLM pipeline parallelism: stages per replica (default 1)")
    a("--enable-expert-parallel", action="store_true",
      default=_common.env_flag("enable-expert-parallel"),
      help="vLLM expert parallelism for mixture-of-experts layers")
    a("--quantization", default=env("quantization"),
      help="vLLM's --quantization (fp8, compressed-tensors, ...; default: the checkpoint's)")
    a("--max-num-batched-tokens", type=_common.uint(16, 1 << 30, "16 or more tokens"),
      default=env("max-num-batched-tokens"),
      help="the most tokens one vLLM step schedules (longer prompts are prefilled in chunks; "
           "default vLLM's)")
    a("--gpu-memory-utilization", type=float, default=env("gpu-memory-utilization"),
      help="vLLM's share of each GPU's memory, 0..1 (default vLLM's); on the CPU "
           "VLLM_CPU_KVCACHE_SPACE (GiB) sizes the cache the states pass through")
    a("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
      help="any other vllm.LLM engine argument, e.g. --vllm-arg max_model_len=32768 "
           "--vllm-arg enforce_eager=true (VALUE read as JSON when it parses, else a string); "
           "repeatable")


def _vllm_args(items):
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise ValueError("--vllm-arg %r: expected KEY=VALUE, e.g. max_model_len=32768" % item)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


# what hsflow sets itself: a --vllm-arg may not change it
_OWN = ("model", "speculative_config", "kv_transfer_config", "enable_prefix_caching",
        "skip_tokenizer_init", "tokenizer")


# model types whose Gated DeltaNet layers vLLM 0.32's CPU build runs in bf16
# only (its CPU kernel asserts "CPU GDN attention requires BF16", at the first
# batch, after the whole load)
_CPU_BF16_ONLY = ("qwen3_next", "qwen3_5")


def check(args, spec):
    """Checks the vLLM flags and splits --gpus into replicas; fills spec.
    Returns None, or the message of what is wrong."""
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    info = spec.get("info") or {}
    if (spec["gpus"][0] < 0 and args.dtype != "bfloat16" and
            str(info.get("model_type", "")).startswith(_CPU_BF16_ONLY)):
        return ("--dtype %s: vLLM's CPU build runs the Gated DeltaNet layers of %s (%s) in "
                "bf16 only (\"CPU GDN attention requires BF16\"); use --dtype bf16, or GPUs"
                % (args.dtype, spec["model"], info.get("architecture", "?")))
    try:
        extra = _vllm_args(args.vllm_arg)
    except ValueError as e:
        return str(e)
    own = sorted(set(extra) & set(_OWN))
    if own:
        return ("--vllm-arg %s: hsflow sets it (the model, the capture, prefix caching off); "
                "drop it" % ", ".join(own))
    gpus = spec["gpus"]
    per = tp * pp
    if gpus[0] < 0:  # cpu:R = R replicas of tp*pp CPU ranks
        replicas = [[] for _ in gpus]
        labels = ["cpu replica %d (%d rank%s)" % (i, per, "s" if per > 1 else "")
                  for i in range(len(gpus))]
    else:
        if len(gpus) % per:
            return ("--gpus %s: %d GPUs do not split into replicas of --tensor-parallel-size %d "
                    "x --pipeline-parallel-size %d = %d GPUs"
                    % (",".join(map(str, gpus)), len(gpus), tp, pp, per))
        replicas = [gpus[i:i + per] for i in range(0, len(gpus), per)]
        labels = ["gpus %s" % ",".join(map(str, r)) for r in replicas]
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        return "--gpu-memory-utilization %s: expected a fraction in (0, 1]" % (
            args.gpu_memory_utilization)
    spec.update({"replicas": replicas, "labels": labels, "tp": tp, "pp": pp,
                 "expert_parallel": args.enable_expert_parallel,
                 "quantization": args.quantization,
                 "max_num_batched_tokens": args.max_num_batched_tokens,
                 "gpu_memory_utilization": args.gpu_memory_utilization, "vllm_args": extra,
                 "n_workers": len(replicas), "cpu_binds": _cpu_binds(len(replicas), per)
                 if gpus[0] < 0 else None})
    return None


def _cpu_binds(replicas, ranks):
    """VLLM_CPU_OMP_THREADS_BIND per replica: this process's cores split
    evenly over every rank of every replica, ranks separated by '|'."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cores = list(range(os.cpu_count() or 1))
    n = replicas * ranks
    if len(cores) < n:  # more ranks than cores: they share
        cores = (cores * n)[:n]
    per = len(cores) // n
    groups = [cores[i * per:(i + 1) * per] for i in range(n)]
    text = [",".join(map(str, g)) for g in groups]
    return ["|".join(text[r * ranks:(r + 1) * ranks]) for r in range(replicas)]


def load_final_norm(model_dir, dtype):
    """The model's own final norm module, built from its transformers class
    on the meta device and given the checkpoint's weights for it alone (no
    other weight is read). Returns the module on the CPU; raises
    ModelError naming why N cannot be served."""
    import glob

    import torch
    from safetensors import safe_open

    from .. import _hf
    transformers = _hf._transformers()
    cfg = _hf.load_config(model_dir)
    cls = _hf._model_class(cfg)
    if cls is None:
        raise _hf.ModelError("capture index N (the final normed output): transformers has no "
                             "class for %s to take the model's final norm from; capture up to "
                             "N-1 instead" % type(cfg).__name__)
    with torch.device("meta"):
        model = cls._from_config(cfg) if hasattr(cls, "_from_config") else cls(cfg)
    decoder = _hf._find_decoder(model)
    norm = _hf.final_norm(decoder)
    prefix = next(n for n, m in model.named_modules() if m is norm)
    want = {prefix + "." + n: n for n, _ in norm.named_parameters()}
    want.update({prefix + "." + n: n for n, _ in norm.named_buffers()})
    found = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for key in set(f.keys()) & set(want):
                found[want[key]] = f.get_tensor(key)
    params = {n for n, _ in norm.named_parameters()}
    if not params <= set(found):
        raise _hf.ModelError("capture index N (the final normed output): the checkpoint at %s "
                             "has no %s for the model's final norm (%s), which vLLM's capture "
                             "(the residual stream before the norm) needs; capture up to N-1 "
                             "instead" % (model_dir, ", ".join(sorted(set(want) - {
                                 prefix + "." + p for p in found})), type(norm).__name__))
    norm = norm.to_empty(device="cpu")
    with torch.no_grad():
        for name, t in found.items():
            obj = norm
            *path, last = name.split(".")
            for p in path:
                obj = getattr(obj, p)
            getattr(obj, last).copy_(t)
    del model
    return norm.to(getattr(torch, _hf.DTYPES[dtype])).eval().requires_grad_(False)


class Worker(_common.WorkerBase):
    """One replica: a vllm.LLM and its own hsflow.Producer."""

    def __init__(self, index, spec, queue):
        super().__init__(index, spec, queue)
        self.label = spec["labels"][index]
        self.llm = None
        self.areas = []
        self.tag = 0

    # ---- setup ---------------------------------------------------------------

    def load(self):
        s = self.spec
        devices = s["replicas"][self.index]
        if devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        else:
            if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = s["cpu_binds"][self.index]
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        t0 = time.monotonic()
        import torch
        from .. import _hf
        from ._rows import Rows
        layers, n = s["layers"], s["n_layers"]
        self.torch_dtype = getattr(torch, _hf.DTYPES[s["dtype"]])
        self.norm = load_final_norm(s["model"], s["dtype"]) if n in layers else None
        itemsize = torch.empty(0, dtype=self.torch_dtype).element_size()
        budget, k, H = s["token_budget"], len(layers), s["hidden_size"]
        n_areas = s["staging_buffers"]
        for i in range(n_areas):
            path = "/dev/shm/hsflow-vllm-%d-%d-%d" % (os.getpid(), self.index, i)
            self.areas.append(Rows(path, budget, budget, k, H, itemsize, create=True))
        self.free_areas = list(range(n_areas))
        kw = dict(model=s["model"], dtype=_hf.DTYPES[s["dtype"]],
                  tensor_parallel_size=s["tp"], pipeline_parallel_size=s["pp"],
                  enable_expert_parallel=s["expert_parallel"], enable_prefix_caching=False,
                  skip_tokenizer_init=True,
                  speculative_config={
                      "method": "extract_hidden_states", "num_speculative_tokens": 1,
                      "draft_model_config": {"hf_config": {
                          "eagle_aux_hidden_state_layer_ids": list(layers)}}},
                  kv_transfer_config={
                      "kv_connector": "HsflowStatesConnector",
                      "kv_connector_module_path": "hsflow.produce._vllm_connector",
                      "kv_role": "kv_producer",
                      "kv_connector_extra_config": {
                          "hsflow_areas": [a.describe() for a in self.areas]}})
        for key in ("quantization", "max_num_batched_tokens", "gpu_memory_utilization"):
            if s[key] is not None:
                kw[key] = s[key]
        kw.update(s["vllm_args"])
        import vllm
        _check_eagle3_interface(s)
        try:
            self.llm = vllm.LLM(**kw)
        except Exception as e:
            raise _hf.ModelError(_explain_start_failure(e, s)) from e
        self.engine = self.llm.llm_engine
        self.vllm_children = _common.children()
        return {"pid": os.getpid(), "load_s": time.monotonic() - t0, "params": 0,
                "batching": "vLLM", "attn_implementation": "vLLM %s" % vllm.__version__,
                "children": self.vllm_children,
                "note": "vLLM %s, tensor parallel %d, pipeline parallel %d%s, %s; index N gets "
                        "the model's own final norm" % (
                            vllm.__version__, s["tp"], s["pp"],
                            ", expert parallel" if s["expert_parallel"] else "",
                            _hf.DTYPES[s["dtype"]]) if self.norm is not None else
                        "vLLM %s, tensor parallel %d, pipeline parallel %d%s, %s" % (
                            vllm.__version__, s["tp"], s["pp"],
                            ", expert parallel" if s["expert_parallel"] else "",
                            _hf.DTYPES[s["dtype"]])}

    # ---- one batch -------------------------------------------------------------

    def submit(self, t, plant=False):
        """Adds ticket t's sequences to vLLM. Returns the record. plant
        (HS_PRODUCE_FAULT=token:W:N, tests): the last sequence's first
        token reaches the engine changed."""
        import numpy as np
        from vllm import SamplingParams
        self.tag += 1
        area = self.free_areas.pop(0)
        rows = self.areas[area]
        rows.clear(t.n_seqs)
        cu = np.asarray(t.cu_seqlens, dtype=np.int64)
        ids = np.asarray(t.input_ids, dtype=np.int64)
        if plant:
            ids = ids.copy()
            q0 = int(cu[t.n_seqs - 1])
            ids[q0] = ids[q0] + 1 if ids[q0] == 0 else ids[q0] - 1
        rec = {"t": t, "area": area, "tag": self.tag, "t0": time.monotonic(), "req": set(),
               "padded": t.n_tokens}
        for q in range(t.n_seqs):
            lo, hi = int(cu[q]), int(cu[q + 1])
            rid = "hsflow-%d-%d-%d" % (self.tag, t.batch, q)
            sp = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                extra_args={"kv_transfer_params": {"hsflow": {
                                    "area": area, "seq": q, "row": lo, "tag": self.tag}}})
            try:
                self.engine.add_request(rid, {"prompt_token_ids": ids[lo:hi].tolist()}, sp)
            except ValueError as e:  # vLLM's refusal of this prompt (too long, say)
                raise _common.Failure(
                    "batch %d/%d: vLLM refused sequence %d (sample %d, %d tokens): %s. Lower "
                    "--max-seq-len for every producer of the run, or raise vLLM's limit "
                    "(--vllm-arg max_model_len=N)" % (t.epoch, t.batch, q, int(t.sample_ids[q]),
                                                      hi - lo, str(e).splitlines()[0])) from e
            rec["req"].add(rid)
        return rec

    def _arrived(self, rec):
        """Whether every sequence of rec's batch is in its area; raises when
        the engine refused one."""
        from ._rows import REFUSED, STATUS, TAG, WRITTEN
        t = rec["t"]
        h = self.areas[rec["area"]].header[:t.n_seqs]
        mine = h[:, TAG] == rec["tag"]
        if ((h[:, STATUS] == REFUSED) & mine).any():
            q = int(((h[:, STATUS] == REFUSED) & mine).nonzero()[0][0])
            raise RuntimeError("batch %d/%d: sequence %d (sample %d): the engine's rows did not "
                               "fit the batch's area (%d rows)" % (
                                   t.epoch, t.batch, q, int(t.sample_ids[q]),
                                   int(h[q, 1])))
        return bool(((h[:, STATUS] == WRITTEN) & mine).all())

    def pump(self, inflight, until=None):
        """Steps vLLM until the oldest batch of inflight has all its rows
        (or, with until=None, once). Finished requests leave rec['req']."""
        t_end = time.monotonic() + WAIT_ROWS_S
        while True:
            if self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        for rec in inflight:
                            rec["req"].discard(out.request_id)
            else:
                time.sleep(0.001)
            if until is None:
                return
            if not until["req"] and self._arrived(until):
                return
            if not until["req"] and time.monotonic() > t_end:
                t = until["t"]
                raise RuntimeError("batch %d/%d: vLLM finished its %d sequences but the rows of "
                                   "%d did not arrive within %.0f s" % (
                                       t.epoch, t.batch, t.n_seqs,
                                       int((self.areas[until["area"]].header[:t.n_seqs, 2] == 0)
                                           .sum()), WAIT_ROWS_S))

    def pack(self, rec, out=None):
        """Checks rec's token ids against the plan's and writes its states
        into out ([T, k*H] bf16; t.hidden by default) with N normed."""
        import numpy as np
        import torch
        t = rec["t"]
        s = self.spec
        rows = self.areas[rec["area"]]
        T, k, H = t.n_tokens, len(s["layers"]), s["hidden_size"]
        plan = np.asarray(t.input_ids)
        seen = rows.tokens[:T]
        if not np.array_equal(plan, seen):
            pos = int(np.nonzero(plan != seen)[0][0])
            cu = np.asarray(t.cu_seqlens)
            q = int(np.searchsorted(cu, pos, side="right") - 1)
            raise TokenMismatch(
                "batch %d/%d: sequence %d (sample %d) reached the engine with token %d at "
                "position %d where the plan has %d: its states are not the plan's; nothing was "
                "sent" % (t.epoch, t.batch, q, int(t.sample_ids[q]), int(seen[pos]),
                          pos - int(cu[q]), int(plan[pos])))
        h = self.areas[rec["area"]].header[:t.n_seqs]
        if (h[:, 3] != rows.itemsize).any():
            raise RuntimeError("batch %d/%d: the engine wrote %d-byte states where %d were "
                               "expected" % (t.epoch, t.batch, int(h[0, 3]), rows.itemsize))
        states = rows.states(self.torch_dtype, T)
        dst = (t.hidden if out is None else out).view(T, k, H)
        with torch.inference_mode():
            for j, layer in enumerate(s["layers"]):
                x = states[:, j]
                if layer == s["n_layers"]:
                    x = self.norm(x.unsqueeze(0))[0]
                dst[:, j].copy_(x)
        return dst

    def finish(self, rec):
        t = rec["t"]
        t_send = time.monotonic()
        self.pack(rec)
        self.free_areas.append(rec["area"])
        t.send()
        self.count_sent(t, t_send, t_send - rec["t0"], rec["padded"])

    def self_check(self, rec):
        """--self-check N: up to N sequences of the first batch (spread over
        it, the last included) run alone through vLLM, every captured layer
        against the same sequence inside the batch, within bf16 noise
        (_hf._parity's bound)."""
        import numpy as np
        import torch
        from .. import _hf
        s = self.spec
        t = rec["t"]
        t0 = time.monotonic()
        n = t.n_seqs
        picks = sorted({int(round(x)) for x in np.linspace(n - 1, 0, min(n, s["self_check"]))})
        k, H = len(s["layers"]), s["hidden_size"]
        cu = np.asarray(t.cu_seqlens, dtype=np.int64)
        batch = self.pack(rec, torch.empty((t.n_tokens, k * H), dtype=torch.float32))
        worst = (0.0, None, None)
        for q in picks:
            lo, hi = int(cu[q]), int(cu[q + 1])
            alone = _Alone(t, lo, hi, q)
            r = self.submit(alone)
            self.pump([r], until=r)
            got = self.pack(r, torch.empty((hi - lo, k * H), dtype=torch.float32))
            self.free_areas.append(r["area"])
            for j, layer in enumerate(s["layers"]):
                l2, mx = _hf._parity(got[:, j], batch[lo:hi, j])
                if l2 > worst[0]:
                    worst = (l2, layer, q)
                if l2 > _hf.PARITY_L2 or mx > _hf.PARITY_MAX:
                    raise SelfCheckError(
                        "self-check: layer %d of sequence %d of batch %d/%d (sample %d, %d "
                        "tokens, %d sequences in the batch) differs from that sequence run "
                        "alone through vLLM: relative error %.3g, max error %.3g of the "
                        "layer's largest value (bf16 noise is below %.3g and %.3g). vLLM's "
                        "batch mixes sequences here: nothing was streamed"
                        % (layer, q, t.epoch, t.batch, int(t.sample_ids[q]), hi - lo, n, l2,
                           mx, _hf.PARITY_L2, _hf.PARITY_MAX))
        cost = time.monotonic() - t0
        self.log.info("worker %d (%s): self-check passed: %d of %d sequence(s) of batch %d/%d "
                      "match themselves run alone, at every captured layer (worst relative "
                      "error %.2g, layer %s, sequence %s); it took %.2f s", self.index,
                      self.label, len(picks), n, t.epoch, t.batch, worst[0], worst[1],
                      worst[2], cost)
        self.fig["self_check_s"] = cost

    # ---- the loop --------------------------------------------------------------

    def run(self):
        s = self.spec
        p = self.connect()
        t_start = time.monotonic()
        t_report = t_start
        inflight = []
        depth = len(self.areas)
        checked = s["self_check"] == 0
        n = 0
        try:
            while True:
                t = None
                # the first batch alone until the self-check has passed
                if len(inflight) < depth and self.free_areas and (checked or not inflight):
                    try:
                        t_wait = time.monotonic()
                        t = p.next_ticket(timeout=0.0 if inflight else None)
                        if not inflight:
                            self.fig["stall_s"] += time.monotonic() - t_wait
                    except StopIteration:
                        if not inflight:
                            break
                if t is not None:
                    n += 1
                    kind = self.faults.get(n)
                    if kind == "die":
                        self._kill_engine(t)
                    if kind == "oom":
                        import torch
                        raise torch.OutOfMemoryError("out of memory (HS_PRODUCE_FAULT)")
                    t_launch = time.monotonic()
                    inflight.append(self.submit(t, plant=kind == "token"))
                    self.fig["launch_s"] += time.monotonic() - t_launch
                    continue
                head = inflight[0]
                t_wait = time.monotonic()
                self.pump(inflight, until=head)
                self.fig["wait_s"] += time.monotonic() - t_wait
                inflight.pop(0)
                if not checked:
                    checked = True
                    self.self_check(head)
                self.finish(head)
                now = time.monotonic()
                if now - t_report >= 1.0:
                    t_report = now
                    self.fig["seconds"] = now - t_start
                    self.q.put(("stats", self.index, dict(self.fig)))
        except Exception as e:
            if _common.is_oom(e):
                self.log.error("worker %d (%s): out of memory in vLLM with %d batch(es) in "
                               "flight: %s. Their tickets go back to the consumer and this "
                               "worker stops. Lower --max-num-batched-tokens, --token-budget "
                               "or --staging-buffers, or raise --gpu-memory-utilization "
                               "(VLLM_CPU_KVCACHE_SPACE on the CPU)", self.index, self.label,
                               len(inflight), str(e).splitlines()[0])
                return EXIT_OOM
            if _is_engine_dead(e):
                raise EngineDied("vLLM's engine died with %d batch(es) in flight (%s); their "
                                 "tickets go back to the consumer. vLLM's log above says why; "
                                 "out of memory: lower --max-num-batched-tokens or "
                                 "--token-budget" % (len(inflight), str(e).splitlines()[0]
                                                     if str(e) else type(e).__name__)) from e
            raise
        finally:
            self.fig["seconds"] = time.monotonic() - t_start
            self.fig["late_busy_pct"] = _common.late_busy_pct(self.sent_at)
        return EXIT_OK

    def _kill_engine(self, t):
        import signal
        self.log.warning("worker %d (%s): HS_PRODUCE_FAULT kills vLLM's engine before batch "
                         "%d/%d", self.index, self.label, t.epoch, t.batch)
        for pid, _ in self.vllm_children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)

    def close(self):
        try:
            if self.llm is not None:
                try:
                    self.engine.engine_core.shutdown()
                except Exception:  # already gone
                    pass
                self.llm = None
        finally:
            _common.end_children(getattr(self, "vllm_children", []))
            for a in self.areas:
                a.close(unlink=True)
            self.areas = []
            super().close()


class TokenMismatch(_common.Failure):
    """A sequence reached the engine with other tokens than the plan's."""


class EngineDied(_common.Failure):
    """vLLM's engine process ended."""


class _Alone:
    """One sequence of a ticket as a batch of its own (the self-check)."""

    def __init__(self, t, lo, hi, q):
        import numpy as np
        self.input_ids = np.asarray(t.input_ids)[lo:hi]
        self.cu_seqlens = np.array([0, hi - lo], dtype=np.int32)
        self.sample_ids = np.asarray(t.sample_ids)[q:q + 1]
        self.n_seqs, self.n_tokens = 1, hi - lo
        self.epoch, self.batch = t.epoch, t.batch


def _is_engine_dead(e):
    name = type(e).__name__
    return name in ("EngineDeadError", "EngineGenerateError") or "EngineCore" in str(e)


def _check_eagle3_interface(s):
    """Refuses, before vLLM starts, an architecture whose vLLM model lacks
    the EAGLE-3 interface extract_hidden_states needs (where vLLM's
    registry can tell)."""
    from .. import _hf
    arch = s["info"]["architecture"]
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_eagle3
        cls = ModelRegistry._try_load_model_cls(arch)
    except Exception:  # another vLLM: its start says it
        return
    if cls is not None and not supports_eagle3(cls):
        raise _hf.ModelError(
            "vLLM cannot capture hidden states of %s (%s): its extract_hidden_states needs the "
            "model's EAGLE-3 interface (auxiliary hidden-state outputs), which vLLM's %s lacks; "
            "use --engine transformers for it" % (s["model"], arch, cls.__name__))


def _explain_start_failure(e, s):
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "EAGLE3" in str(e) or "aux_hidden" in str(e).lower():
        from .. import _hf
        info = s.get("info") or _hf.inspect_model(s["model"])
        return ("vLLM cannot capture hidden states of %s (%s): vLLM's extract_hidden_states "
                "needs the model's EAGLE-3 interface (auxiliary hidden-state outputs), which "
                "vLLM's implementation of this architecture lacks (%s); use --engine "
                "transformers for it" % (s["model"], info["architecture"], text))
    return "vLLM could not start on %s: %s" % (s["model"], text)


def worker_main(index, spec, queue, go, abort):
    """Entry point of a spawned vLLM worker process."""
    _common.serve(Worker, index, spec, queue, go, abort)
