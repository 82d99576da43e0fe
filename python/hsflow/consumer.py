# SPDX-License-Identifier: Apache-2.0
"""hsflow.Consumer: the drafter side. Listens for producers, hands out tickets,
and yields verified batches as zero-copy arrays over the consumer's memory."""
import ctypes
import os
import json
import threading

import numpy as np

from . import _arrays, _dtypes, _log
from ._lib import (HS_ERR_NOSPACE, HS_HIDDEN_FP8, HS_OK, CBatch, ConsumerConfig, ConsumerStats,
                   Endpoint, HsflowError, OptionInfo, load, status_str)

# CBatch.hidden_dtype before hs_consumer_next() fills it (it sets 1 or 2)
_NOT_FILLED = 0


def _resume_text(resume):
    """The JSON text of a resume state given as state_dict() returned it (a
    dict), or as its JSON text (str or bytes)."""
    if isinstance(resume, dict):
        try:
            return json.dumps(resume, separators=(",", ":")).encode()
        except (TypeError, ValueError) as e:
            raise ValueError("resume: the state is not JSON-serialisable (%s); give what "
                             "Consumer.state_dict() returned" % e)
    if isinstance(resume, str):
        return resume.encode()
    if isinstance(resume, (bytes, bytearray)):
        return bytes(resume)
    raise ValueError("resume=%r: expected the dict Consumer.state_dict() returned (or its "
                     "JSON text)" % (type(resume).__name__,))


def _parse_listen(listen):
    if isinstance(listen, int):
        return "0.0.0.0", listen
    if not isinstance(listen, str) or ":" not in listen:
        raise ValueError("listen=%r: expected 'HOST:PORT' (e.g. '0.0.0.0:7000'; port 0 picks "
                         "a free one) or a port number" % (listen,))
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        p = int(port)
    except ValueError:
        p = -1
    if not 0 <= p <= 65535:
        raise ValueError("listen=%r: the port must be a number 0..65535" % (listen,))
    return host, p


class Batch:
    """One batch, as views into the consumer's memory. Valid until release()
    or until the consumer hands out the next batch; afterwards every array
    attribute raises HsflowError. Arrays taken before that point must not be
    used after it (numpy/torch cannot be told the memory went away).

    Attributes: epoch, batch (id in the plan), n_seqs, n_tokens (T),
    hidden_size (H), layers (tuple of the k captured layer indices),
    on_device, nbytes, hidden_dtype ('bf16' or 'fp8'); arrays: hidden_states
    [T, k*H] (torch.bfloat16, or numpy uint16 holding bf16 bits), input_ids
    [T] int32, loss_mask [T] uint8, cu_seqlens [n_seqs+1] int32, sample_ids
    [n_seqs] uint64 (always numpy on the host; on the device an int64 tensor /
    CudaArray). An fp8 run delivered as fp8 (Consumer(deliver='fp8')) has no
    hidden_states but hidden_fp8 [T, k*H] (torch.float8_e4m3fn, or numpy
    uint8 of e4m3 bytes) and hidden_scales [T] float32: value = e4m3 *
    scale of its token."""

    def __init__(self, consumer, cb, ref, mode, gpu):
        self._consumer = consumer
        self._cb = cb
        self._ref = ref  # ctypes.byref(cb), made once
        self._released = False
        self.epoch = cb.epoch
        self.batch = cb.batch
        self.n_seqs = cb.n_seqs
        self.n_tokens = cb.n_tokens
        self.hidden_size = cb.hidden_size
        self.n_layers = cb.n_layers
        self.on_device = bool(cb.on_device)
        self.nbytes = cb.bytes
        lay = ctypes.cast(cb.layers, ctypes.POINTER(ctypes.c_int32))
        self.layers = tuple(lay[i] for i in range(cb.n_layers)) if cb.layers else ()
        T, n, kH = cb.n_tokens, cb.n_seqs, cb.n_layers * cb.hidden_size
        fp8 = cb.hidden_dtype == HS_HIDDEN_FP8
        self.hidden_dtype = (_dtypes.FP8 if fp8 else _dtypes.BF16).name
        if self.hidden_dtype == "fp8":
            spec = {"hidden_fp8": (cb.hidden_fp8, (T, kH), np.uint8),
                    "hidden_scales": (cb.hidden_scales, (T,), np.float32)}
        else:
            spec = {"hidden_states": (cb.hidden, (T, kH), np.uint16)}
        spec.update({
                "input_ids": (cb.input_ids, (T,), np.int32),
                "loss_mask": (cb.loss_mask, (T,), np.uint8),
                "cu_seqlens": (cb.cu_seqlens, (n + 1,), np.int32),
                "sample_ids": (cb.sample_ids, (n,), np.uint64)})
        self._views = {}
        for name, (ptr, shape, dtype) in spec.items():
            if self.on_device:
                v = _arrays.device_view(ptr, shape, dtype, gpu, mode == "torch", owner=self)
            else:
                v = _arrays.host_view(ptr, shape, dtype, writable=mode == "torch")
                if mode == "torch" and name != "sample_ids":
                    v = _arrays.torch_from_host(v)
                elif mode == "torch":
                    v.flags.writeable = False
            if name == "hidden_fp8" and mode == "torch":
                v = v.view(_arrays.torch_module().float8_e4m3fn)  # the same bytes
            self._views[name] = v

    def _get(self, name):
        if not self._released and name not in self._views:
            raise HsflowError("this batch was delivered as %s: it has %s" % (
                self.hidden_dtype, "hidden_fp8 and hidden_scales, not hidden_states"
                if self.hidden_dtype == "fp8" else "hidden_states, not %s" % name))
        if self._released:
            raise HsflowError("batch (epoch %d, batch %d) was released; its memory now belongs "
                              "to the consumer again. Copy what you need to keep (e.g. "
                              "tensor.clone()) before taking the next batch"
                              % (self.epoch, self.batch))
        return self._views[name]

    hidden_states = property(lambda self: self._get("hidden_states"))
    hidden_fp8 = property(lambda self: self._get("hidden_fp8"))
    hidden_scales = property(lambda self: self._get("hidden_scales"))
    input_ids = property(lambda self: self._get("input_ids"))
    loss_mask = property(lambda self: self._get("loss_mask"))
    cu_seqlens = property(lambda self: self._get("cu_seqlens"))
    sample_ids = property(lambda self: self._get("sample_ids"))

    @property
    def released(self):
        return self._released

    def pointers(self):
        """The C pointers of the views (dict name -> int); for checks."""
        cb = self._cb
        return {"hidden_states": cb.hidden, "hidden_fp8": cb.hidden_fp8,
                "hidden_scales": cb.hidden_scales, "input_ids": cb.input_ids,
                "loss_mask": cb.loss_mask, "cu_seqlens": cb.cu_seqlens,
                "sample_ids": cb.sample_ids}

    def release(self):
        """Gives the batch's memory back to the consumer (idempotent)."""
        if not self._released:
            self._consumer._release(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return ("<hsflow.Batch epoch=%d batch=%d seqs=%d tokens=%d layers=%s H=%d%s%s>"
                % (self.epoch, self.batch, self.n_seqs, self.n_tokens, list(self.layers),
                   self.hidden_size, " on_device" if self.on_device else "",
                   " released" if self._released else ""))


_EXPECT_KEYS = ("plan", "layout", "dataset", "target")
_HEX = set("0123456789abcdefABCDEF")


def _expect_pins(expect):
    """expect= -> {'plan': b'..', 'layout': b'..', 'dataset': b'..'} (the keys given)."""
    if expect is None:
        return {}
    if isinstance(expect, str):
        words, pins = expect.split(), {}
        i = 0
        while i < len(words):
            w = words[i]
            if w.startswith("--expect-") and i + 1 < len(words):
                key, val = w[len("--expect-"):], words[i + 1]
                i += 2
            elif "=" in w and not w.startswith("-"):
                key, val = w.split("=", 1)
                i += 1
            else:
                raise ValueError("expect=%r: '%s' is neither --expect-KEY VALUE nor KEY=VALUE; "
                                 "give what `hs-data plan` prints after 'pin'" % (expect, w))
            if key in pins:
                raise ValueError("expect=%r: %s given twice" % (expect, key))
            pins[key] = val
        expect = pins
    if not isinstance(expect, dict):
        raise ValueError("expect=%r: expected a dict with 'plan', 'layout' and/or 'dataset', or "
                         "the string `hs-data plan` prints after 'pin'" % (expect,))
    out = {}
    for key, val in expect.items():
        if key not in _EXPECT_KEYS:
            raise ValueError("expect: unknown key %r; expected 'plan', 'layout', 'dataset' or "
                             "'target'" % (key,))
        if val is None:
            continue
        if key == "layout" and isinstance(val, dict):
            try:
                layers = ",".join(str(int(x)) for x in val["layers"])
                val = "H=%d,layers=%s,dtype=%s" % (int(val["H"]), layers,
                                                   val.get("dtype", _dtypes.DEFAULT))
            except (KeyError, TypeError, ValueError):
                raise ValueError("expect['layout']=%r: expected {'H': 4096, 'layers': [2, 16, "
                                 "29]} or 'H=4096,layers=2,16,29,dtype=bf16'" % (val,)) from None
        if isinstance(val, int) and not isinstance(val, bool) and key != "layout":
            val = "%016x" % val
        if not isinstance(val, str):
            raise ValueError("expect[%r]=%r: expected a string" % (key, val))
        if key != "layout":
            h = val[2:] if val.lower().startswith("0x") else val
            if not 0 < len(h) <= 16 or not set(h) <= _HEX:
                raise ValueError("expect[%r]=%r: expected 16 hex digits, as `hs-data plan` "
                                 "prints it" % (key, val))
        out[key] = val.encode()
    return out


class OptionError(HsflowError, ValueError):
    """A setting an option table of the library refuses (HS_ERR_INVALID):
    names the option, the value and what was expected."""


def option_names(lib=None):
    """The names of the consumer's options (its table, docs/cli.md): each is
    a keyword argument of Consumer."""
    lib = lib or load()
    info = OptionInfo()
    names = []
    for i in range(lib.hs_consumer_option_count()):
        if lib.hs_consumer_option_info(i, ctypes.byref(info)) == HS_OK:
            names.append(info.name.decode())
    return names


def _config_set(lib, cfg, name, value, setter="hs_consumer_config_set"):
    """Sets option `name` of cfg from a Python value through the table of
    `setter` (hs_consumer_config_set, hs_producer_client_config_set);
    returns the bytes cfg may now point to (the caller keeps them)."""
    if isinstance(value, bool):
        text = b"true" if value else b"false"
    elif isinstance(value, np.integer):
        text = str(int(value)).encode()
    elif isinstance(value, (int, float)):
        text = repr(value).encode()
    elif isinstance(value, bytes):
        text = value
    elif isinstance(value, (str, os.PathLike)):
        text = os.fsencode(value)
    else:
        raise ValueError("%s=%r: expected a number, a string or a bool" % (name, value))
    why = ctypes.create_string_buffer(256)
    if getattr(lib, setter)(ctypes.byref(cfg), name.encode(), text, why, 256) != HS_OK:
        raise OptionError("%s=%r: %s" % (name, value, why.value.decode(errors="replace")))
    return text


def _rank_world(rank, world):
    """rank and world as given, else from torchrun's RANK / WORLD_SIZE, else 0 of 1."""
    def env(name):
        v = os.environ.get(name)
        if v is None or v == "":
            return None
        try:
            return int(v)
        except ValueError:
            raise ValueError("%s=%r in the environment: expected a whole number (torchrun sets "
                             "it)" % (name, v))
    from_env = rank is None and world is None and env("WORLD_SIZE") is not None
    if rank is None:
        rank = env("RANK") or 0
    if world is None:
        world = env("WORLD_SIZE") or 1
    for name, v in (("rank", rank), ("world", world)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError("%s=%r: expected a whole number >= 0" % (name, v))
    if world < 1 or rank >= world:
        raise ValueError("rank=%d, world=%d: the rank must be 0..world-1" % (rank, world))
    if world > 1 or from_env:
        _log.setup("consumer", "hsflow.consumer").info(
            "rank %d of %d%s, LOCAL_RANK %s", rank, world,
            " from torchrun's RANK and WORLD_SIZE" if from_env else " as given",
            os.environ.get("LOCAL_RANK", "unset"))
    return rank, world


class Consumer(Endpoint):
    """Listens for producers and yields verified batches:

        with hsflow.Consumer(listen="0.0.0.0:7000", cache_gb=64, epochs=2) as c:
            for b in c:
                train(b.hidden_states, b.input_ids, b.loss_mask, b.cu_seqlens)

    Iterating releases the previous batch when the next is taken; the
    iteration ends when every batch of every epoch has been delivered.

    gpu=None (or -1) delivers host memory; gpu=K copies each batch to GPU K
    (a build with CUDA) and the arrays are device tensors. arrays='auto'
    gives torch tensors when torch imports, else numpy ('numpy'/'torch'
    force one). listen port 0 picks a free port (see .port).

    Resume follows the trainer's checkpoint, as with PyTorch's stateful data
    loaders: save `consumer.state_dict()` (plain JSON types) in the
    checkpoint, and build the consumer of the restarted run with
    `resume=state`; it then delivers exactly the batches not delivered before
    that state (the same plan, epochs and order are required). `journal=`
    covers a consumer that restarts while the trainer lives; with both, the
    state wins.

    lease_timeout_s: a producer holding tickets that shows no progress (no
    finished batch, no heartbeat from a computing worker) for this many
    seconds is dropped and its tickets go back to the queue (0 = never);
    heartbeats alone hold them for at most that plus the plan's largest batch
    at lease_min_tokens_per_s.

    A cache_gb larger than the memory this process can get (MemAvailable, or
    its cgroup's limit less its usage) is refused, since it would be
    OOM-killed once it fills; force=True starts anyway with a warning.

    Data-parallel training (DESIGN §11) runs one consumer per rank, each on
    its own port: rank=R, world=W make this one deliver only rank R's shard
    of every epoch, the same number of batches per epoch on every rank.
    They default to torchrun's RANK and WORLD_SIZE when those are set (else
    0 and 1); uneven='drop' (default) skips the batches of an epoch that do
    not divide by W, 'repeat' gives the short ranks batches from the epoch's
    start. A journal or resume state belongs to one rank.

    expect= pins the run, so a misconfigured producer that connects first
    cannot define it: a dict with any of 'plan' (the plan hash), 'dataset'
    (the dataset fingerprint) and 'layout' ('H=4096,layers=2,16,29,dtype=bf16',
    or a dict {'H': 4096, 'layers': [2, 16, 29]}), or the string `hs-data plan
    FILE --hidden-size H --layers ...` prints after "pin" ("--expect-plan X
    --expect-dataset Y --expect-layout Z"; "plan=X dataset=Y layout=Z" works
    too), and 'target': the fingerprint of the target model (its config and
    weights, hsflow.target_fingerprint(DIR); producers log it). A producer
    (or a store) that differs in any of them is refused, naming what
    differs, and the consumer waits for the right ones. stats()['target']
    and ['target_fingerprint'] name the target whose states the run
    delivers.

    deliver= says how the hidden states of an fp8 run (producers'
    --hs-dtype fp8) reach the trainer: 'bf16' (default) dequantised, on the
    GPU as part of the copy with gpu=, or 'fp8': the raw e4m3 bytes and the
    per-token scales (Batch.hidden_fp8, Batch.hidden_scales). A bf16 run is
    delivered as bf16 either way.

    store= names a folder (made if missing) that keeps each verified batch
    once on disk, bound to the dataset, layout, plan and model (docs/store.md):
    later epochs and later runs of the same plan read it back, verified,
    instead of asking producers, and a complete store needs no producer at
    all. stats() counts store_hits, store_misses and store_writes.

    Every setting but listen, arrays, resume and expect is an option of the
    consumer's table (docs/cli.md: the same bounds as hs-consumer's flags),
    set by its name; an option of the table with no keyword above is given
    as a keyword argument all the same (hsflow.consumer.option_names()).

    A process forked from this one (os.fork(), a torch DataLoader worker)
    gets an inert copy: close() and garbage collection there do nothing to
    the consumer, and any other call raises HsflowError."""

    def __init__(self, listen="127.0.0.1:7000", gpu=None, cache_gb=4, epochs=1,
                 order="arrival", prefetch=4, verify_synthetic=False, secret_file=None,
                 insecure=False, transport="auto", verify_threads=1, peer_timeout_s=10,
                 arrays="auto", metrics=None, journal=None, resume=None,
                 lease_timeout_s=60, force=False, rank=None, world=None, uneven="drop",
                 expect=None, deliver="bf16", lease_min_tokens_per_s=200, store=None,
                 **options):
        self._c = None
        # the process this consumer belongs to: a forked child's copy is inert
        self._owner_pid = os.getpid()
        lib = load()
        host, port = _parse_listen(listen)
        if gpu is None or (isinstance(gpu, str) and gpu.lower() == "none") or gpu == -1:
            gpu = "none"
        rank, world = _rank_world(rank, world)
        pins = _expect_pins(expect)
        self.rank, self.world = rank, world
        self._mode = _arrays.resolve_arrays(arrays)

        cfg = ConsumerConfig()
        lib.hs_consumer_config_default(ctypes.byref(cfg))
        self._keep = [host.encode(), _resume_text(resume) if resume is not None else None]
        cfg.listen_host = self._keep[0]
        cfg.listen_port = port
        cfg.resume_state = self._keep[1]
        # every other setting by its name in the consumer's option table
        # (docs/cli.md), checked there against the table's type and bounds
        settings = dict(cache_gb=cache_gb, epochs=epochs, gpu=gpu, order=order,
                        prefetch=prefetch, verify_synthetic=verify_synthetic,
                        secret_file=secret_file, insecure=insecure, transport=transport,
                        verify_threads=verify_threads, peer_timeout_s=peer_timeout_s,
                        metrics=metrics, journal=journal, lease_timeout_s=lease_timeout_s,
                        force=force, rank=rank, world=world, uneven=uneven, deliver=deliver,
                        lease_min_tokens_per_s=lease_min_tokens_per_s, store=store)
        settings.update(("expect_" + k, v) for k, v in pins.items())
        unknown = set(options) - set(option_names(lib))
        if unknown:
            raise TypeError("Consumer() got an unexpected keyword argument %r (the consumer's "
                            "options are in docs/cli.md)" % sorted(unknown)[0])
        settings.update(options)
        for name, value in settings.items():
            if value is not None:
                self._keep.append(_config_set(lib, cfg, name, value))
        gpu = cfg.gpu
        self._gpu = gpu
        # HS_SYSTEM_ROOT: a stand-in /proc and /sys (tests), as for hs-consumer
        lib.hsflow_set_system_root(os.environ.get("HS_SYSTEM_ROOT", "").encode())
        h = ctypes.c_void_p()
        st = lib.hs_consumer_create(ctypes.byref(cfg), ctypes.byref(h))
        if st != HS_OK and resume is not None:
            raise HsflowError("hs_consumer_create refused the resume state (the log above says "
                              "what differs or is malformed)", st)
        if st != HS_OK:
            raise HsflowError("hs_consumer_create (listen %s:%d, cache %s GiB, gpu %d) failed; "
                              "the log above says why" % (host, port, cache_gb, gpu), st)
        self._lib = lib
        self._c = h
        self._lock = threading.RLock()
        self._current = None
        self._done = False
        self._closing = False

    # -- lifetime -------------------------------------------------------------
    def close(self):
        """Releases the current batch, tells producers BYE, frees everything.
        May be called from another thread while one waits in next_batch().
        In a process forked from the one that made the consumer it does
        nothing: the consumer, its threads, connections and journal are the
        parent's (the child's lock may even be held forever)."""
        if self._foreign():
            return
        self._closing = True
        with getattr(self, "_lock", threading.RLock()):
            if self._c is None:
                return
            if self._current is not None:
                try:
                    self._release(self._current)
                except HsflowError:
                    pass
            self._lib.hs_consumer_destroy(self._c)
            self._c = None

    def _foreign(self):
        """True in a process forked from the one that made this consumer."""
        return getattr(self, "_owner_pid", None) not in (None, os.getpid())

    def _check_owner(self):
        """Raises HsflowError in a process forked from the consumer's; before
        the lock is taken, which a thread of the parent may have held at the
        fork, for good in the child."""
        if self._foreign():
            raise HsflowError(
                "this Consumer belongs to process %d; process %d was forked from it and cannot "
                "use it (its network threads are not in this process). Take batches in the "
                "process that made the consumer: a torch DataLoader over it needs num_workers=0"
                % (self._owner_pid, os.getpid()))

    def _handle(self):
        self._check_owner()
        if self._c is None:
            raise HsflowError("the consumer is closed")
        return self._c

    @property
    def port(self):
        """The port actually bound."""
        return int(self._lib.hs_consumer_port(self._handle()))

    # -- batches --------------------------------------------------------------
    def _release(self, batch):
        """Releases `batch` once, whatever interrupts it: a call cut short
        (an exception raised by a signal handler at any point) is completed
        by the next one, which asks the library whether it still holds the
        batch before releasing it."""
        if self._foreign():  # the parent's batch: its memory is not this process's to give
            batch._released = True
            batch._views = {}
            return
        with self._lock:
            if batch._released:
                return
            st = HS_OK
            if self._c is not None and self._lib.hs_consumer_holds(self._c, batch._ref):
                if batch.on_device and self._mode == "torch":
                    # The library orders its copies against the legacy default
                    # stream; work queued on another torch stream joins it here.
                    torch = _arrays.torch_module()
                    dev = torch.device("cuda", self._gpu)
                    cur = torch.cuda.current_stream(dev)
                    default = torch.cuda.default_stream(dev)
                    if cur != default:
                        default.wait_stream(cur)
                st = self._lib.hs_consumer_release(self._c, batch._ref)
            batch._released = True
            batch._views = {}
            if self._current is batch:
                self._current = None
            if st != HS_OK:
                raise HsflowError("hs_consumer_release (epoch %d, batch %d)"
                                  % (batch.epoch, batch.batch), st)

    def _forget(self, b):
        """Ends Batch `b` that next_batch() made but never returned (its
        views go away; the library has the batch back)."""
        if b is None:
            return
        b._released = True
        b._views = {}
        with self._lock:
            if self._current is b:
                self._current = None

    def next_batch(self, timeout=None):
        """The next verified batch, releasing the previous one first. Returns
        None when `timeout` seconds pass without one; raises StopIteration
        when every batch of every epoch has been delivered.

        An exception raised inside it (KeyboardInterrupt, or any exception a
        signal handler raises) loses nothing: the batch it was taking stays
        queued, the next call returns it, and state_dict() and the journal
        count only batches this method returned."""
        self._check_owner()
        cb = b = None
        try:
            with self._lock:
                h = self._handle()
                if self._current is not None:
                    self._release(self._current)
                if self._done:
                    raise StopIteration
                cb = CBatch()  # hidden_dtype _NOT_FILLED until the library hands one out
                ref = ctypes.byref(cb)
                if not self._wait_next(lambda ms: self._lib.hs_consumer_next(h, ref, ms),
                                       timeout, "hs_consumer_next"):
                    return None
                b = Batch(self, cb, ref, self._mode, self._gpu)
                if b.on_device and self._mode == "torch":
                    torch = _arrays.torch_module()
                    dev = torch.device("cuda", self._gpu)
                    cur = torch.cuda.current_stream(dev)
                    default = torch.cuda.default_stream(dev)
                    if cur != default:
                        cur.wait_stream(default)
                self._current = b
            return b
        except BaseException:
            # The library takes the batch back before anything else runs:
            # CPython runs a pending signal handler only at a call's end, a
            # function's start or a backward jump, and there is none before
            # hs_consumer_unget() has done its work, so a second Ctrl-C
            # cannot lose the batch either.
            with self._lock:
                if cb is not None and cb.hidden_dtype != _NOT_FILLED and self._c is not None:
                    st = self._lib.hs_consumer_unget(self._c, ref)
                    if st == HS_OK:
                        cb.hidden_dtype = _NOT_FILLED
                    else:
                        _log.setup("consumer", "hsflow.consumer").error(
                            "could not give back batch %d of epoch %d after an exception in "
                            "next_batch(): %s", cb.batch, cb.epoch, status_str(st))
            self._forget(b)
            raise

    def __iter__(self):
        return self

    # next_batch() itself, with no timeout (a batch or StopIteration): no
    # frame of its own between the batch and the for loop that gets it
    __next__ = next_batch

    # -- position ---------------------------------------------------------------
    def state_dict(self):
        """The consumer's position as a dict of plain JSON types, to save in
        the trainer's checkpoint: every batch handed out so far, the current
        one included. Consumer(..., resume=state) delivers the others."""
        self._check_owner()
        with self._lock:
            h = self._handle()
            n = ctypes.c_size_t(0)
            buf = None
            for _ in range(4):  # the position only moves in next_batch()
                cap = len(buf) if buf is not None else 0
                st = self._lib.hs_consumer_state_save(h, buf, cap, ctypes.byref(n))
                if st == HS_OK:
                    return json.loads(buf.value.decode())
                if st != HS_ERR_NOSPACE:
                    raise HsflowError("hs_consumer_state_save", st)
                buf = ctypes.create_string_buffer(n.value + 1)
            raise HsflowError("hs_consumer_state_save: the state kept growing", st)

    # -- figures --------------------------------------------------------------
    def _raw_stats(self):
        s = ConsumerStats()
        self._lib.hs_consumer_stats(self._handle(), ctypes.byref(s))
        return s

    def stats(self):
        """The consumer's figures as a dict: the fields of hs_consumer_stats_t
        plus the derived keys of hs_consumer_stats_json (tokens_per_s, ...)."""
        s = self._raw_stats()
        out = {name: getattr(s, name) for name, _ in s._fields_}
        out["target_name"] = s.target_name.decode(errors="replace")
        n = self._lib.hs_consumer_stats_json(ctypes.byref(s), None, 0)
        buf = ctypes.create_string_buffer(max(n, 0) + 1)
        self._lib.hs_consumer_stats_json(ctypes.byref(s), buf, len(buf))
        try:
            out.update(json.loads(buf.value.decode()))
        except ValueError:
            pass
        return out

    def status_line(self):
        """The one-line live status the hs-consumer command prints."""
        buf = ctypes.create_string_buffer(1024)
        self._lib.hs_consumer_status_line(self._handle(), buf, len(buf))
        return buf.value.decode(errors="replace")
