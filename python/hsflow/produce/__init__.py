# SPDX-License-Identifier: Apache-2.0
"""hsflow-produce (python -m hsflow.produce): a producer for any causal LM
that an engine runs: transformers (--engine transformers, the default) or
vLLM (--engine vllm). It takes hs-producer's flags, computes the same plan
(the same plan hash, so it can serve a run beside hs-producer processes)
and runs one worker process per replica (a GPU, or a vLLM replica of
several), each with its own engine and connection. The engines live one a
module: transformers.py (and ../_hf.py for the model side), vllm.py (with
_vllm_connector.py and _rows.py); _common.py says what an engine provides.
ENGINES is the only place this module names them."""
import argparse
import json
import multiprocessing
import os
import signal
import socket
import sys
import time

import importlib

from .. import _deps, _dtypes, _hf, _lib, _log
from .._outfile import output_conflict
from . import _common
from ._common import EXIT_FAIL, EXIT_INPUT, EXIT_OK, EXIT_OOM
from .transformers import profile_first_batch

# --engine NAME: the module hsflow.produce.NAME (add_arguments, check, DEPS,
# worker_main; _common.py)
ENGINES = ("transformers", "vllm")


def engine_module(name):
    return importlib.import_module("%s.%s" % (__name__, name))

PROG = "hsflow-produce"

DESCRIPTION = """\
Computes the hidden states a consumer tickets with a transformers model (any
causal LM, mixture-of-experts models, the decoder of a vision-language
checkpoint) or with vLLM (--engine vllm: any model vLLM serves, over its
tensor, pipeline and expert parallelism, quantised checkpoints included)
and streams them to it. Flags have hs-producer's spellings and
meanings; every producer of a run (this one and hs-producer alike) must use
the same --data, --token-budget, --max-seq-len, --overflow, --seed and --layers:
the consumer checks the plan hash and layout. Each flag is also settable as
HS_<NAME>, e.g. HS_TOKEN_BUDGET=65536.

transformers engine: one worker process per GPU (--gpus 0,1,2) or N CPU
workers (--gpus cpu:N), each with its own model replica holding only the
decoder layers up to the highest captured one (no LM head). vLLM engine: one
worker process per replica of --tensor-parallel-size x
--pipeline-parallel-size GPUs (--gpus 0,1,2,3 --tensor-parallel-size 2: two
replicas), or --gpus cpu:R replicas on vLLM's CPU build, each an in-process
vllm.LLM whose KV connector hands the captured rows over through shared
memory (docs/pyproducer.md). Exit status, as hs-producer's: 0 the
run is over, 1 the run failed (no consumer within --connect-timeout, the
consumer lost, a worker failed or died), 2 bad flags, model or data, or
refused by the consumer (plan, layout, dataset, version, secret), 3 out of
memory (lower --token-budget)."""

EPILOG = """\
examples:
  hsflow-produce --to drafter:7000 --data train.hst --token-budget 32768 \\
      --model /models/Qwen3-30B-A3B --layers 2,24,45 --gpus 0,1,2,3
  hsflow-produce --to 127.0.0.1:7000 --data data.jsonl --token-budget 4096 \\
      --model ./tiny-llama --dflash-layers 3 --gpus cpu:2 --dtype float32
  hsflow-produce --to d1:7000-7003,d2:7000-7003 --data train.hst --token-budget 32768 \\
      --model /models/Qwen3-30B-A3B --layers 2,24,45 --gpus 0,1,2,3   # 8 consumer ranks
  hsflow-produce --engine vllm --to drafter:7000 --data train.hst --token-budget 65536 \\
      --model /models/Qwen3-235B-A22B-FP8 --eagle3-layers --gpus 0,1,2,3,4,5,6,7 \\
      --tensor-parallel-size 4 --enable-expert-parallel        # two replicas of 4 GPUs
"""


_env, _env_flag, _uint = _common.env, _common.env_flag, _common.uint


def _to(s):
    """--to: HOST:PORT, several comma-separated (the ranks of a data-parallel
    trainer), or a port range HOST:LO-HI; the library connects to each."""
    items = s.split(",")
    for item in items:
        host, sep, ports = item.rpartition(":")
        lo, dash, hi = ports.partition("-")
        ok = sep and host and lo.isdigit() and 0 < int(lo) < 65536
        if ok and dash:
            ok = hi.isdigit() and int(lo) <= int(hi) < 65536
        if not ok:
            raise argparse.ArgumentTypeError(
                "'%s': '%s' is not HOST:PORT or HOST:LO-HI; expected e.g. drafter:7000, "
                "d1:7000,d1:7001 or d1:7000-7003,d2:7000-7003" % (s, item))
    return s


def _size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = s.strip().lower()
    try:
        v = int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)
    except ValueError:
        v = -1
    return v


def _budget(s):
    if s == "auto":
        raise argparse.ArgumentTypeError("'auto' measures hs-producer's built-in forward; "
                                         "give tokens per batch, e.g. 32768 or 32K")
    v = _size(s)
    if not 0 < v <= 1 << 30:
        raise argparse.ArgumentTypeError("'%s': expected tokens per batch, e.g. 65536 or 64K" % s)
    return v


def _maxlen(s):
    v = _size(s)
    if not 0 < v <= 1 << 30:
        raise argparse.ArgumentTypeError("'%s': expected a length in tokens" % s)
    return v


def _layers(s):
    try:
        v = [int(x) for x in s.split(",")]
    except ValueError:
        v = None
    if not v or len(v) > 32:
        raise argparse.ArgumentTypeError("'%s': expected up to 32 comma-separated indices such "
                                         "as 2,16,29" % s)
    if v[0] < 0 or any(b <= a for a, b in zip(v, v[1:])):
        raise argparse.ArgumentTypeError("'%s': indices must be >= 0 and strictly increasing" % s)
    return v


def _gpus(s):
    bad = argparse.ArgumentTypeError("'%s': expected cpu:N (N CPU workers) or distinct GPU ids "
                                     "such as 0,1,2" % s)
    if s.startswith("cpu:"):
        n = s[4:]
        if not n.isdigit() or not 0 < int(n) <= 64:
            raise bad
        return [-1] * int(n)
    try:
        ids = [int(x) for x in s.split(",")]
    except ValueError:
        raise bad
    if not ids or len(ids) > 64 or min(ids) < 0 or len(set(ids)) != len(ids):
        raise bad
    return ids


SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")


def _sdpa_backends(s):
    if s == "auto":
        return s
    names = [x.strip() for x in s.split(",") if x.strip()]
    bad = [x for x in names if x not in SDPA_BACKENDS]
    if not names or bad:
        raise argparse.ArgumentTypeError("%r: expected auto or a comma-separated list of %s"
                                         % (s, ", ".join(SDPA_BACKENDS)))
    return ",".join(dict.fromkeys(names))


def _dtype(s):
    if s.lower() not in _hf.DTYPES:
        raise argparse.ArgumentTypeError("'%s': expected bf16, fp16 or fp32" % s)
    return _hf.DTYPES[s.lower()]


def build_parser():
    # allow_abbrev=False: '--layer 2' is an unknown flag, not --layers
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    a = p.add_argument
    a("--engine", choices=ENGINES, default=_env("engine", "transformers"),
      help="what computes the states: transformers (default; --attn-implementation, "
           "--sdpa-backends, --batching) or vllm (vLLM's extract_hidden_states with hsflow's "
           "KV connector; the vLLM flags below; needs vLLM installed: "
           "scripts/install-engine-venv)")
    a("--to", type=_to, default=_env("to"),
      help="the consumer (hs-consumer --listen), HOST:PORT; for data-parallel ranks every "
           "rank's address, HOST:PORT,HOST:PORT,... or a range HOST:7000-7007: each worker "
           "takes tickets from all of them, and a set whose ranks or world sizes do not fit "
           "together is refused")
    a("--data", default=_env("data"),
      help="dataset: JSONL lines {\"input_ids\": [...], \"loss_mask\": [...]} or a .hst file")
    a("--token-budget", type=_budget, default=_env("token-budget", "65536"),
      help="tokens per batch (default 65536); also the most tokens one forward call holds")
    a("--max-seq-len", type=_maxlen, default=_env("max-seq-len"),
      help="longer sequences are truncated or dropped (default: the budget)")
    a("--overflow", choices=("truncate", "drop"), default=_env("overflow", "truncate"),
      help="what to do with sequences longer than --max-seq-len")
    a("--seed", type=_uint(0, 2**64 - 1, "an integer"), default=_env("seed", "0"),
      help="epoch shuffle seed (default 0)")
    a("--layers", type=_layers, default=_env("layers"),
      help="captured layers as Hugging Face output_hidden_states indices (0 = embeddings, "
           "i = output of decoder layer i-1, N = final normed output)")
    a("--dflash-layers", type=_uint(1, 32, "1..32 draft layers"), default=_env("dflash-layers"),
      help="DFlash's default layer set for an N-layer drafter")
    a("--eagle3-layers", action="store_true", default=_env_flag("eagle3-layers"),
      help="EAGLE-3's default layer set as speculators and vLLM use it: 2, N/2, N-3 and the "
           "final normed output N of an N-layer model")
    a("--hidden-size", type=_uint(1, 65536, "1..65536"), default=_env("hidden-size"),
      help="hidden size; must be the model's (default: taken from the model)")
    a("--model", default=_env("model"),
      help="local Hugging Face model folder (config.json + weights)")
    a("--dtype", type=_dtype, default=_env("dtype", "bf16"),
      help="weights and activations: bf16 (default), fp16 or fp32; states are captured as "
           "bf16 (and travel as --hs-dtype says)")
    a("--hs-dtype", choices=_dtypes.NAMES, default=_env("hs-dtype", _dtypes.DEFAULT),
      help="how hidden states travel and wait in the consumer's cache: bf16 (default) or fp8 "
           "(e4m3 values and one fp32 scale per token, quantised on the worker's GPU; half "
           "the bytes; every producer of a run must use the same: the consumer refuses one "
           "that differs; docs/fp8.md)")
    a("--attn-implementation", default=_env("attn-implementation", "auto"),
      help="transformers attention: auto (default: the fastest the model supports here, "
           "flash_attention_3 or _2 when installed on a GPU, then sdpa, flex_attention, "
           "eager), or one of those, or a kernels-hub name; one the model cannot run is "
           "refused naming those that work")
    a("--sdpa-backends", type=_sdpa_backends, default=_env("sdpa-backends", "auto"),
      help="with sdpa attention on a GPU, the torch kernels it may pick, comma-separated from "
           "cudnn, flash, efficient, math; auto (default): flash, efficient, math, not cudnn: "
           "padded calls change shape every batch and torch builds cuDNN's attention graph "
           "anew for each new shape, tens of ms of host time per call (docs/pyproducer.md)")
    a("--batching", choices=("auto", "packed", "padded"), default=_env("batching", "auto"),
      help="packed: one padding-free row per batch (position ids restart per sequence; "
           "linear-attention and state-space mixers run per sequence), refused at load when a "
           "layer still mixes sequences; padded: right-padded [n, Lmax] calls, longest first; "
           "auto (default): packed with flash/flex/kernels attention when exact, padded "
           "otherwise")
    a("--self-check", type=_uint(0, 1024, "a number of sequences, 0 to skip"),
      default=_env("self-check", "4"),
      help="before the first batch is sent, run this many of its sequences alone and compare "
           "every captured layer with the batch's states; beyond bf16 noise the worker refuses "
           "to stream, naming the layer, the sequence and the error (default 4; 0 = skip)")
    a("--gpus", type=_gpus, default=_env("gpus", "cpu:1"),
      help="one worker process per GPU id (0,1,2) or N CPU workers (cpu:N; default cpu:1); "
           "with --engine vllm one per replica of --tensor-parallel-size x "
           "--pipeline-parallel-size GPUs, or cpu:R replicas")
    a("--prefetch", type=_uint(1, 64, "1..64"), default=_env("prefetch", "4"),
      help="tickets each worker asks to keep queued (default 4; the consumer grants at most its "
           "own --prefetch, and the worker warns when that is fewer): with 4 tickets and 4 "
           "staging buffers a worker keeps a forward queued while two batches are on the wire "
           "and in the consumer's checks (0.97x a plain loop in the steady state on an H200, "
           "against 0.77x with 2 and 3: docs/pyproducer.md)")
    a("--staging-buffers", type=_uint(2, 4, "2..4"), default=_env("staging-buffers", "4"),
      help="batch-sized page-locked host buffers per worker, 2..4 (default 4): each holds "
           "one batch of hidden states in host memory, and a ticket comes with a free one; "
           "fewer save host memory (a batch each) and cost throughput when the network is "
           "slower than the forward (docs/pyproducer.md)")
    a("--secret-file", default=_env("secret-file"),
      help="shared secret for the HMAC handshake")
    a("--transport", choices=("auto", "shm", "tcp", "ucx"), default=_env("transport", "auto"),
      help="auto, shm, tcp or ucx (default auto: shared memory with a consumer on this "
        "host, ucx where an RDMA device is present, else tcp)")
    a("--connect-timeout", type=_uint(0, 86400, "seconds"), default=_env("connect-timeout", "30"),
      help="seconds to keep trying to reach the consumer (default 30)")
    a("--reconnect", action="store_true", default=_env_flag("reconnect"),
      help="when the consumer goes away mid-run, connect again (for up to --connect-timeout) "
           "and carry on with a restarted consumer")
    a("--summary-json", default=_env("summary-json"),
      help="write this producer's summary as JSON")
    a("--name", default=_env("name"),
      help="identity in the consumer's logs (default host:pid; NAME/i per worker)")
    a("--status-interval", type=float, default=_env("status-interval", "5"),
      help="seconds between status lines (default 5; 0 = off)")
    for name in ENGINES:
        mod = engine_module(name)
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(p)
    _lib.add_version_flag(p)
    return p


# flags of one engine only, with the value that means "not given"
_TRANSFORMERS_ONLY = {"attn_implementation": "auto", "sdpa_backends": "auto", "batching": "auto"}
_VLLM_ONLY = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1,
              "enable_expert_parallel": False, "quantization": None,
              "max_num_batched_tokens": None, "gpu_memory_utilization": None, "vllm_arg": []}


def _other_engines_flags(args):
    """The flags given that the chosen engine does not take."""
    other = _VLLM_ONLY if args.engine == "transformers" else _TRANSFORMERS_ONLY
    return ["--" + k.replace("_", "-") for k, unset in other.items()
            if getattr(args, k) != unset]


def _fail(msg):
    print("%s: %s" % (PROG, msg), file=sys.stderr)
    return EXIT_INPUT


def parse(argv):
    """Parses and checks the flags and the model folder; returns (args,
    spec) or an exit code. Nothing connects before this passes."""
    parser = build_parser()
    try:
        # argparse applies `type` to string defaults taken from HS_* variables too.
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not args.to:
        return _fail("--to HOST:PORT (or every rank's, HOST:LO-HI) is required")
    if not args.data:
        return _fail("--data FILE is required")
    if not os.path.isfile(args.data):
        return _fail("--data %s: no such file" % args.data)
    if not args.model:
        return _fail("--model DIR is required (a local Hugging Face model folder)")
    if bool(args.layers) + bool(args.dflash_layers) + bool(args.eagle3_layers) > 1:
        return _fail("give one of --layers, --dflash-layers and --eagle3-layers, not several")
    if not args.layers and not args.dflash_layers and not args.eagle3_layers:
        return _fail("--layers L1,L2,... is required (e.g. 2,16,29), or a preset: "
                     "--dflash-layers N or --eagle3-layers")
    if args.max_seq_len and args.max_seq_len > args.token_budget:
        return _fail("--max-seq-len %d is larger than --token-budget %d: a sequence must fit in "
                     "one batch" % (args.max_seq_len, args.token_budget))
    if args.secret_file and not os.path.isfile(args.secret_file):
        return _fail("--secret-file %s: no such file" % args.secret_file)
    if args.summary_json:
        why = output_conflict(args.summary_json, (args.data, args.secret_file, args.model))
        if why:
            return _fail("--summary-json %s" % why)
    try:
        info = _hf.inspect_model(args.model)
        n = info["n_layers"]
        # presets from the config alone, before any weight is read
        layers = args.layers or (_hf.eagle3_layers(n) if args.eagle3_layers else
                                 _hf.dflash_layers(n, args.dflash_layers))
        _hf.check_layers(layers, n, args.model)
    except _hf.ModelError as e:
        return _fail(str(e))
    try:
        profile_first_batch(os.environ.get("HS_PRODUCE_PROFILE_FROM"))
    except ValueError as e:
        return _fail(str(e))
    wrong = _other_engines_flags(args)
    if wrong:
        return _fail("%s: not a flag of --engine %s (%s is the %s engine's)" % (
            ", ".join(wrong), args.engine, "it" if len(wrong) == 1 else "they",
            "vllm" if args.engine == "transformers" else "transformers"))
    engine = engine_module(args.engine)
    try:  # the workers' packages, named before any process starts
        _deps.check(engine.DEPS, PROG if args.engine == "transformers" else
                    "%s --engine %s" % (PROG, args.engine),
                    "produce" if args.engine == "transformers" else "vllm")
    except _deps.MissingPackage as e:
        return _fail(str(e))
    if args.hidden_size and args.hidden_size != info["hidden_size"]:
        return _fail("--hidden-size %d but the model at %s has hidden size %d: drop --hidden-size "
                     "or give %d" % (args.hidden_size, args.model, info["hidden_size"],
                                     info["hidden_size"]))
    # auto: each worker packs when its attention implementation is varlen
    # (known once 'auto' is resolved) and the load-time probe finds it exact
    packed = {"packed": True, "padded": False}.get(args.batching)
    if packed and not _hf.packing_is_varlen(args.attn_implementation) \
            and not _hf.packing_masks_supported():
        return _fail("--batching packed with --attn-implementation %s needs a transformers that "
                     "masks packed sequences apart (4.56 or later); use --batching padded"
                     % args.attn_implementation)
    try:
        target = _target_fingerprint(args.model)
    except (ValueError, _lib.HsflowError) as e:
        return _fail("--model %s: its fingerprint cannot be taken: %s" % (args.model, e))
    spec = {"to": args.to, "data": args.data, "token_budget": args.token_budget,
            "max_seq_len": args.max_seq_len or 0, "overflow": args.overflow, "seed": args.seed,
            "layers": layers, "hidden_size": info["hidden_size"], "n_layers": n,
            "n_run": _hf.layers_to_run(layers, n), "model": args.model, "dtype": args.dtype,
            "attn_implementation": args.attn_implementation, "packed": packed,
            "sdpa_backends": args.sdpa_backends,
            "batching": args.batching, "self_check": args.self_check,
            "status_interval": args.status_interval, "hs_dtype": args.hs_dtype,
            "gpus": args.gpus, "prefetch": args.prefetch,
            "staging_buffers": args.staging_buffers, "secret_file": args.secret_file,
            "transport": args.transport, "connect_timeout": args.connect_timeout,
            "reconnect": args.reconnect, "name": args.name, "info": info,
            "target_fingerprint": target,
            "engine": args.engine, "n_workers": len(args.gpus)}
    if hasattr(engine, "check"):
        why = engine.check(args, spec)
        if why:
            return _fail(why)
    return args, spec


def _target_fingerprint(model_dir):
    """The model folder's fingerprint (hs_target_fingerprint, as hs-producer
    announces it), taken once here for every worker."""
    from ..producer import target_fingerprint
    return target_fingerprint(model_dir)


def _describe_exit(p):
    if p.exitcode is None:
        return "still running"
    if p.exitcode < 0:
        try:
            return "killed by signal %d (%s)" % (-p.exitcode, signal.Signals(-p.exitcode).name)
        except ValueError:
            return "killed by signal %d" % -p.exitcode
    return "exit status %d" % p.exitcode


class Supervisor:
    """Starts the workers, waits until every one has its model, lets them
    connect, then reports status lines, failures and the summary."""

    def __init__(self, args, spec, log):
        self.args, self.spec, self.log = args, spec, log
        n = spec["n_workers"]
        ctx = multiprocessing.get_context("spawn")  # CUDA is initialised in the children only
        self.q = ctx.Queue()
        self.go, self.abort = ctx.Event(), ctx.Event()
        target = engine_module(spec["engine"]).worker_main
        self.procs = [ctx.Process(target=target, args=(i, spec, self.q, self.go, self.abort),
                                  name="hsflow-produce-w%d" % i, daemon=False) for i in range(n)]
        self.children = [[] for _ in range(n)]  # an engine's own processes, per worker
        self.fig = [None] * n
        self.batching = [None] * n
        self.codes = [None] * n
        self.reported = [False] * n
        self.t_start = None

    def label(self, i):
        if "labels" in self.spec:
            return self.spec["labels"][i]
        g = self.spec["gpus"][i]
        return "cpu %d" % i if g < 0 else "gpu %d" % g

    def _drain(self, timeout):
        """Handles the workers' messages for up to `timeout` seconds."""
        import queue as queue_mod
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            try:
                msg = self.q.get(timeout=max(0.0, left)) if left > 0 else self.q.get_nowait()
            except queue_mod.Empty:
                return
            kind, i = msg[0], msg[1]
            if kind == "ready":
                info = msg[2]
                self.ready[i] = True
                if info["params"]:
                    self.log.info("worker %d (%s): pid %d, model loaded in %.1f s (%.1fM "
                                  "parameters), %s attention, %s batches", i, self.label(i),
                                  info["pid"], info["load_s"], info["params"] / 1e6,
                                  info["attn_implementation"], info["batching"])
                else:
                    self.log.info("worker %d (%s): pid %d, model loaded in %.1f s by %s",
                                  i, self.label(i), info["pid"], info["load_s"],
                                  info["attn_implementation"])
                if info["note"]:
                    self.log.info("worker %d (%s): %s", i, self.label(i), info["note"])
                self.batching[i] = info["batching"]
                self.children[i] = info.get("children") or []
            elif kind == "error":
                self.codes[i] = msg[2]
                self.reported[i] = True
                self.log.error("%s", msg[3])
            elif kind == "stats":
                self.fig[i] = msg[2]
            elif kind == "exit":
                self.codes[i] = msg[2] if self.codes[i] is None else self.codes[i]
                self.fig[i] = msg[3]

    def _reap(self):
        """Notes workers that ended; a death (no exit message) is reported."""
        for i, p in enumerate(self.procs):
            if p.exitcode is None or self.reported[i]:
                continue
            self._drain(0.2)  # its last messages
            self.reported[i] = True
            _common.end_children(self.children[i])  # an engine's processes go with it
            if self.codes[i] is None or p.exitcode not in (0, self.codes[i]):
                self.codes[i] = EXIT_FAIL
                alive = sum(1 for q in self.procs if q.exitcode is None)
                self.log.error("worker %d (%s, pid %d) died: %s; the consumer puts the tickets "
                               "it held back in the queue; %d worker(s) go on", i, self.label(i),
                               p.pid, _describe_exit(p), alive)

    def _status(self):
        figs = [f for f in self.fig if f]
        if not figs or not self.t_start:
            return
        el = time.monotonic() - self.t_start
        tok = sum(f["tokens"] for f in figs)
        bat = sum(f["batches"] for f in figs)
        byt = sum(f["bytes"] for f in figs)
        pad = sum(f["padded_tokens"] for f in figs)
        n = len(self.procs)
        self.log.info("%d batches | %.0f tok/s | %.2f batch/s | %.2f GB/s | padding %.0f%% | "
                      "worker busy %.0f%% | stall %.0f%%", bat, tok / el, bat / el, byt / el / 1e9,
                      100.0 * (pad - tok) / pad if pad else 0.0,
                      100.0 * sum(f["busy_s"] for f in figs) / el / n,
                      100.0 * sum(f["stall_s"] for f in figs) / el / n)

    def stop(self, *_):
        self.abort.set()
        for p in self.procs:
            if p.exitcode is None:
                p.terminate()

    def run(self):
        s = self.spec
        info = s["info"]
        if s["engine"] == "vllm":
            self.log.info("model %s (%s, %s): %d layers, hidden %d; capturing %s with vLLM, "
                          "%s, tensor parallel %d, pipeline parallel %d; %d replica(s)",
                          s["model"], info["architecture"], info["model_type"], s["n_layers"],
                          s["hidden_size"], ",".join(map(str, s["layers"])), s["dtype"], s["tp"],
                          s["pp"], len(self.procs))
        else:
            self.log.info("model %s (%s, %s): %d layers, hidden %d; capturing %s; running decoder "
                          "layers 0..%d, %s, %s attention, %s batches; %d worker(s)",
                          s["model"], info["architecture"], info["model_type"], s["n_layers"],
                          s["hidden_size"], ",".join(map(str, s["layers"])), s["n_run"] - 1,
                          s["dtype"], s["attn_implementation"],
                          {True: "packed (if exact)", False: "padded"}.get(s["packed"], "auto"),
                          len(self.procs))
        self.ready = [False] * len(self.procs)
        for p in self.procs:
            p.start()
        # Every worker loads its model before any connects: a model that does
        # not load takes no ticket.
        while not all(self.ready):
            self._drain(0.5)
            if any(c is not None for c in self.codes) or any(
                    p.exitcode is not None for p in self.procs):
                self._drain(0.5)
                self._reap()
                self.stop()
                for p in self.procs:
                    p.join(30)
                code = max((c for c in self.codes if c), default=EXIT_FAIL)
                self.log.error("not starting: a worker could not load the model; no ticket "
                               "was taken")
                return code
        self.t_start = time.monotonic()
        self.go.set()
        interval = self.args.status_interval
        t_status = time.monotonic()
        while any(p.exitcode is None for p in self.procs):
            self._drain(0.25)
            self._reap()
            if interval > 0 and time.monotonic() - t_status >= interval:
                t_status = time.monotonic()
                self._status()
        self._drain(0.5)
        self._reap()
        for p in self.procs:
            p.join(10)
        for c in self.children:
            _common.end_children(c)
        return self.summary()

    def summary(self):
        el = time.monotonic() - self.t_start
        rows, tok, bat, pad = [], 0, 0, 0
        for i, f in enumerate(self.fig):
            f = f or {"batches": 0, "tokens": 0, "busy_s": 0.0, "stall_s": 0.0,
                      "padded_tokens": 0, "plan_hash": None}
            tok += f["tokens"]
            bat += f["batches"]
            pad += f["padded_tokens"]
            busy = 100.0 * f["busy_s"] / el if el > 0 else 0.0
            stall = 100.0 * f["stall_s"] / el if el > 0 else 0.0
            per = {k: 1e3 * f.get(k + "_s", 0.0) / f["batches"] if f["batches"] else 0.0
                   for k in ("launch", "wait", "send")}
            late = f.get("late_busy_pct")
            self.log.info("worker %d (%s): %d batches, %d tokens, busy %.0f%%%s, stall %.0f%%; "
                          "host ms a batch: %.1f queueing the forward, %.1f waiting for the GPU, "
                          "%.1f sealing and sending", i, self.label(i), f["batches"], f["tokens"],
                          busy, "" if late is None else " (%.0f%% over its second half)" % late,
                          stall, per["launch"], per["wait"], per["send"])
            gpu = (self.spec["replicas"][i] or -1) if "replicas" in self.spec else \
                self.spec["gpus"][i]
            rows.append({"worker": i, "gpu": gpu, "batches": f["batches"],
                         "tokens": f["tokens"], "busy_pct": round(busy, 2),
                         "late_busy_pct": f.get("late_busy_pct"),
                         "stall_pct": round(stall, 2), "exit": self.codes[i],
                         "staging_buffers": f.get("staging_buffers"),
                         "host_ms_per_batch": {k: round(v, 2) for k, v in per.items()}})
        codes = [c for c in self.codes if c]
        code = EXIT_OK if not codes else (EXIT_INPUT if EXIT_INPUT in codes else
                                          EXIT_OOM if EXIT_OOM in codes else EXIT_FAIL)
        hashes = sorted({f["plan_hash"] for f in self.fig if f and f.get("plan_hash")})
        self.log.info("done: %d batches, %d tokens in %.2f s (%.0f tokens/s), padding %.1f%%%s",
                      bat, tok, el, tok / el if el > 0 else 0,
                      100.0 * (pad - tok) / pad if pad else 0.0,
                      "" if code == EXIT_OK else "; %d worker(s) failed" % len(codes))
        if self.args.summary_json:
            out = {"workers": rows, "batches": bat, "tokens": tok, "seconds": round(el, 3),
                   "tokens_per_s": round(tok / el, 1) if el > 0 else 0.0,
                   "padding_pct": round(100.0 * (pad - tok) / pad, 2) if pad else 0.0,
                   "plan_hash": hashes[0] if len(hashes) == 1 else hashes,
                   "model": self.spec["model"], "layers": self.spec["layers"],
                   "engine": self.spec["engine"],
                   "batching": "/".join(sorted({b for b in self.batching if b})) or "none",
                   "status": "ok" if code == EXIT_OK else "failed", "exit": code}
            try:
                with open(self.args.summary_json, "w") as f:
                    json.dump(out, f, indent=2)
                    f.write("\n")
            except OSError as e:
                self.log.error("cannot write %s: %s", self.args.summary_json, e)
        return code


def main(argv=None):
    r = parse(sys.argv[1:] if argv is None else argv)
    if isinstance(r, int):
        return r
    args, spec = r
    log = _log.setup("producer %s" % args.name if args.name else "producer")
    sup = Supervisor(args, spec, log)
    signal.signal(signal.SIGTERM, lambda *a: sup.stop())
    signal.signal(signal.SIGINT, lambda *a: sup.stop())
    log.debug("host %s, pid %d", socket.gethostname(), os.getpid())
    return sup.run()
