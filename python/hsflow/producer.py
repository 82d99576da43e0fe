# SPDX-License-Identifier: Apache-2.0
"""hsflow.Producer: the target side for models the built-in decoder does not
cover. The library computes the shared plan, talks to the consumer and hands
out tickets; the caller computes each ticket's hidden states and sends them."""
import ctypes
import os
import sys

import numpy as np

from . import _arrays, _dtypes
from ._lib import HS_OK, CWork, Endpoint, HsflowError, ProducerClientConfig, ProducerInfo, load
from .consumer import _config_set



class Ticket:
    """One ticketed batch. From the shared plan (read-only numpy, zero-copy):
    input_ids [T] int32, loss_mask [T] uint8, cu_seqlens [n_seqs+1] int32,
    sample_ids [n_seqs] uint64 (dataset indices); epoch, batch, n_seqs,
    n_tokens (T), hidden_size (H), layers. `hidden` is the buffer to fill,
    [T, k*H] bf16 (torch.bfloat16 tensor, or numpy uint16 bits in numpy
    mode; `hidden_bits` is always the numpy view). Fill it in place and call
    send(), or pass the states to send(hidden_states=...).

    In an fp8 run (Producer(hs_dtype="fp8")) `hidden` is a bf16 buffer of
    the producer's that send() quantises into the staging buffer, as every
    hsflow producer does (hsflow.quantize_fp8); a caller that quantises
    itself (on its GPU, say) fills `hidden_fp8` [T, k*H] (uint8 e4m3 bytes;
    numpy, or a torch.uint8 tensor in torch mode) and `hidden_scales` [T]
    float32 and calls send(quantized=True)."""

    def __init__(self, producer, work, layers, mode, scratch=None):
        self._producer = producer
        self._work = work
        self._sent = False
        self.epoch = work.epoch
        self.batch = work.batch
        self.n_seqs = work.n_seqs
        self.n_tokens = work.n_tokens
        self.hidden_size = work.hidden_size
        self.n_layers = work.n_layers
        self.layers = tuple(layers)
        self.nbytes = work.bytes
        T, n, kH = work.n_tokens, work.n_seqs, work.n_layers * work.hidden_size
        hv = _arrays.host_view
        self._views = {
            "input_ids": hv(work.input_ids, (T,), np.int32, False),
            "loss_mask": hv(work.loss_mask, (T,), np.uint8, False),
            "cu_seqlens": hv(work.cu_seqlens, (n + 1,), np.int32, False),
            "sample_ids": hv(work.sample_ids, (n,), np.uint64, False),
        }
        self.hs_dtype = (_dtypes.FP8 if scratch is not None else _dtypes.BF16).name
        if scratch is None:
            self._views["hidden_bits"] = hv(work.hidden, (T, kH), np.uint16, True)
        else:
            self._scratch = scratch
            self._views["hidden_bits"] = scratch[:T * kH].reshape(T, kH)
            self._views["hidden_fp8"] = hv(work.hidden_fp8, (T, kH), np.uint8, True)
            self._views["hidden_scales"] = hv(work.hidden_scales, (T,), np.float32, True)
        # numpy views for the library's quantiser; torch or numpy for the caller
        self._np = dict(self._views)
        torch_mode = mode == "torch"
        for name in ("hidden_bits", "hidden_fp8", "hidden_scales"):
            if name in self._np:
                alias = "hidden" if name == "hidden_bits" else name
                self._views[alias] = (_arrays.torch_from_host(self._np[name]) if torch_mode
                                      else self._np[name])
        self._views["hidden_bits"] = self._np["hidden_bits"]

    def _get(self, name):
        if self._sent:
            raise HsflowError("ticket (epoch %d, batch %d) was already sent; its staging buffer "
                              "belongs to the producer again" % (self.epoch, self.batch))
        return self._views[name]

    input_ids = property(lambda self: self._get("input_ids"))
    loss_mask = property(lambda self: self._get("loss_mask"))
    cu_seqlens = property(lambda self: self._get("cu_seqlens"))
    sample_ids = property(lambda self: self._get("sample_ids"))
    hidden = property(lambda self: self._get("hidden"))
    hidden_bits = property(lambda self: self._get("hidden_bits"))
    hidden_fp8 = property(lambda self: self._get_fp8("hidden_fp8"))
    hidden_scales = property(lambda self: self._get_fp8("hidden_scales"))

    def _get_fp8(self, name):
        if self.hs_dtype != "fp8":
            raise HsflowError("%s: this run's hidden states travel as bf16 (hs_dtype='bf16'); "
                              "fill `hidden` instead" % name)
        return self._get(name)

    @property
    def sent(self):
        return self._sent

    def pointers(self):
        """The C pointers of the views (dict name -> int); for checks."""
        w = self._work
        return {"input_ids": w.input_ids, "loss_mask": w.loss_mask, "cu_seqlens": w.cu_seqlens,
                "sample_ids": w.sample_ids, "hidden": w.hidden}

    def send(self, hidden_states=None, quantized=False):
        """Copies `hidden_states` into the staging buffer (unless None: then
        `hidden` was filled in place), seals the batch and sends it. In an
        fp8 run the bf16 states are quantised on the way (a NaN or infinite
        value raises, naming the token); quantized=True sends the
        `hidden_fp8` and `hidden_scales` the caller filled as they are.

        hidden_states: [T, k*H], or a list/tuple of k arrays [T, H] (one per
        captured layer, in the order of `layers`). Accepted: torch tensors
        (bf16, or float types converted to bf16; CPU or CUDA), numpy float32
        or float64 (rounded to bf16, nearest-even), numpy uint16 (bf16 bits),
        numpy arrays of an ml_dtypes bfloat16 type."""
        dst = self._get("hidden_bits")
        if quantized:
            if self.hs_dtype != "fp8" or hidden_states is not None:
                raise ValueError("send(quantized=True) sends the hidden_fp8 and hidden_scales "
                                 "filled in place, in an fp8 run (hs_dtype='fp8'), with no "
                                 "hidden_states")
        else:
            if hidden_states is not None:
                _fill(dst, hidden_states, self.n_tokens, self.n_layers, self.hidden_size)
            if self.hs_dtype == "fp8":
                _quantize_into(dst, self._np["hidden_fp8"], self._np["hidden_scales"],
                               "ticket (epoch %d, batch %d)" % (self.epoch, self.batch))
        self._producer._submit(self)

    def __repr__(self):
        return ("<hsflow.Ticket epoch=%d batch=%d seqs=%d tokens=%d%s>"
                % (self.epoch, self.batch, self.n_seqs, self.n_tokens,
                   " sent" if self._sent else ""))


def _quantize_into(bits, q, scales, what):
    """bf16 bits [T, n] to e4m3 bytes q [T, n] and scales [T], as every
    hsflow producer quantises (the library's hs_fp8_quantize_rows)."""
    T, n = bits.shape
    for a, dt in ((bits, np.uint16), (q, np.uint8), (scales, np.float32)):
        assert a.dtype == dt and a.flags.c_contiguous
    bad = ctypes.c_uint64(0)
    st = load().hs_fp8_quantize_rows(bits.ctypes.data, T, n, q.ctypes.data, scales.ctypes.data,
                                     ctypes.byref(bad))
    if st != HS_OK:
        raise ValueError("%s: token %d of the batch has a NaN or infinite hidden state; it "
                         "cannot be quantised to fp8 (nothing was sent)" % (what, bad.value))


def quantize_fp8(hidden_states):
    """(e4m3 bytes, scales) of bf16 hidden states [T, n] as every hsflow
    producer quantises them for an fp8 run: per token scale = amax / 448 (1
    for a row of zeros), e4m3(value / scale) rounded to nearest even.
    hidden_states: anything Ticket.send accepts as one [T, n] array; returns
    numpy uint8 [T, n] and float32 [T]. Raises ValueError for a NaN or
    infinite value."""
    if not hasattr(hidden_states, "shape") or len(hidden_states.shape) != 2:
        raise ValueError("quantize_fp8: expected a 2-D array [T, n]")
    T, n = (int(x) for x in hidden_states.shape)
    bits = np.empty((T, n), np.uint16)
    _copy_one(bits, hidden_states)
    q, scales = np.empty((T, n), np.uint8), np.empty(T, np.float32)
    _quantize_into(bits, q, scales, "quantize_fp8")
    return q, scales


def quantize_fp8_torch(x):
    """The fp8 quantisation of quantize_fp8 in torch, on x's device: x
    [T, n] (bf16, or a float type rounded to bf16 first) -> (q torch.uint8
    [T, n], scales torch.float32 [T], finite torch.bool [T]: False for a row
    with a NaN or infinite value, whose q and scale are meaningless). The
    same bits as hs_fp8_quantize_rows (the tests compare them): true
    divisions in float32 (a tensor divisor; torch turns a scalar one into a
    multiplication by its reciprocal) and torch's nearest-even e4m3."""
    torch = _arrays.torch_module()
    xf = x.to(torch.bfloat16).float()
    finite = torch.isfinite(xf).all(dim=1)
    amax = xf.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / torch.full_like(amax, 448.0), torch.ones_like(amax))
    q = (xf / scales[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return q, scales, finite


def _shape_error(what, got, T, k, H):
    return ValueError("hidden_states%s has shape %s; expected [T, k*H] = [%d, %d] or a list of "
                      "k=%d arrays [T, H] = [%d, %d]" % (what, tuple(got), T, k * H, k, T, H))


def _fill(dst, hs, T, k, H):
    """Copies hs (see Ticket.send) into dst, a [T, k*H] uint16 view."""
    if isinstance(hs, (list, tuple)):
        if len(hs) != k:
            raise ValueError("hidden_states is a list of %d arrays; expected one per captured "
                             "layer (k=%d), each [T, H] = [%d, %d]" % (len(hs), k, T, H))
        for j, part in enumerate(hs):
            if not hasattr(part, "shape"):
                raise TypeError("hidden_states[%d] is a %s; expected a torch tensor or a numpy "
                                "array [T, H] = [%d, %d]" % (j, type(part).__name__, T, H))
            if tuple(part.shape) != (T, H):
                raise _shape_error("[%d]" % j, part.shape, T, k, H)
            _copy_one(dst[:, j * H:(j + 1) * H], part)
        return
    if not hasattr(hs, "shape"):
        raise TypeError("hidden_states is a %s; expected a torch tensor or a numpy array "
                        "[T, k*H] = [%d, %d], or a list of k=%d of them [T, H]"
                        % (type(hs).__name__, T, k * H, k))
    if tuple(hs.shape) != (T, k * H):
        raise _shape_error("", hs.shape, T, k, H)
    _copy_one(dst, hs)


def _copy_one(dst, src):
    # a tensor means torch is imported already; numpy input must not pay for
    # importing it (seconds, on the first batch)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(src, torch.Tensor):
        src = src.detach()
        if not src.dtype.is_floating_point:
            raise TypeError("hidden_states has dtype %s; expected torch.bfloat16 (or a float "
                            "type, rounded to bf16)" % (src.dtype,))
        if src.dtype != torch.bfloat16:
            src = src.to(torch.bfloat16)  # round to nearest even
        # copy_ takes the device-to-host path directly for CUDA tensors.
        _arrays.torch_from_host(dst).copy_(src)
        return
    if not isinstance(src, np.ndarray):
        raise TypeError("hidden_states is a %s; expected a torch tensor or a numpy array"
                        % type(src).__name__)
    if src.dtype == np.uint16:
        np.copyto(dst, src)
    elif src.dtype.name == "bfloat16":  # ml_dtypes / jax bf16
        np.copyto(dst, src.view(np.uint16))
    elif src.dtype in (np.float32, np.float64, np.float16):
        _arrays.f32_to_bf16_bits(src.astype(np.float32, copy=False), out=dst)
    else:
        raise TypeError("hidden_states has dtype %s; expected float32/float64/float16 "
                        "(rounded to bf16), uint16 (bf16 bits) or bfloat16" % (src.dtype,))


def target_fingerprint(model_dir):
    """The fingerprint of a Hugging Face model folder as every hsflow producer
    announces it (hs_target_fingerprint): its config.json and the content of
    each *.safetensors file, read once and then kept in the folder's
    .hsflow-target under each file's size, mtime, ctime and inode (a folder
    this user cannot write is read whole each time). An int, never 0."""
    if not isinstance(model_dir, (str, os.PathLike)) or not os.path.isdir(model_dir):
        raise ValueError("target=%r: not a folder; expected the model folder (config.json and "
                         "*.safetensors) whose states are sent" % (model_dir,))
    out = ctypes.c_uint64()
    st = load().hs_target_fingerprint(os.fsencode(model_dir), ctypes.byref(out))
    if st != HS_OK:
        raise HsflowError("hs_target_fingerprint(%s) failed; the log above says why"
                          % (model_dir,), st)
    return int(out.value)


def synthetic_target_fingerprint():
    """The synthetic source's fingerprint (hsflow.synthetic_hidden, hs-producer
    --source synthetic)."""
    return int(load().hs_target_synthetic_fingerprint())


def _resolve_target(target, fingerprint):
    """Producer(target=, target_fingerprint=) -> (fingerprint, name)."""
    if fingerprint is not None:
        value = fingerprint
        if isinstance(value, str):
            h = value[2:] if value.lower().startswith("0x") else value
            value = int(h, 16) if 0 < len(h) <= 16 and set(h.lower()) <= set(
                "0123456789abcdef") else -1
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or not 0 < int(value) < 1 << 64:
            raise ValueError("target_fingerprint=%r: expected a 64-bit fingerprint other than 0 "
                             "(an int or 16 hex digits)" % (fingerprint,))
        return int(value), os.fspath(target) if target is not None else "unnamed"
    if target == "synthetic":
        return synthetic_target_fingerprint(), "synthetic"
    if target is None:
        raise ValueError("say which target computes the states: target=MODEL_DIR (the folder "
                         "of its config and weights, fingerprinted), target='synthetic' "
                         "(hsflow.synthetic_hidden's states), or target_fingerprint= a 64-bit "
                         "fingerprint of your own; a run and its store hold one target")
    return target_fingerprint(target), os.fspath(target)


class Producer(Endpoint):
    """Connects to a consumer and yields the tickets it hands out:

        with hsflow.Producer(to="drafter:7000", data="train.hst", token_budget=65536,
                             hidden_size=4096, layers=[2, 16, 29],
                             target="/models/my-target") as p:
            for t in p.tickets():
                t.send(hidden_states=my_model(t.input_ids, t.cu_seqlens))

    target names the target that computes the states, which the consumer
    checks (a run and its store hold one target): the model folder (its
    config.json and *.safetensors are fingerprinted, target_fingerprint()),
    'synthetic' for hsflow.synthetic_hidden's states, or, with
    target_fingerprint=, a name for a 64-bit fingerprint of the caller's own.
    One of them is required.

    For the ranks of a data-parallel trainer (DESIGN §11), `to` names every
    rank: "d1:7000,d1:7001" or a range "d1:7000-7003" (several comma-separated
    for several drafter nodes). The producer connects to each and takes
    tickets from all of them, and refuses a set whose world sizes differ or
    that has a rank twice, naming both.

    Every producer of a run needs the same data, token_budget, max_seq_len,
    overflow, seed, hidden_size and layers (the consumer checks the plan hash
    and the layout). The constructor loads the data, builds the plan and
    connects (retrying for connect_timeout_s seconds). With reconnect=True a
    lost consumer is reached again (for up to connect_timeout_s) and the run
    carries on with the restarted one; tickets of the lost connection are
    dropped, and sending one of them is a no-op.

    After construction: plan_hash (the same as hs-producer's for the same
    data and plan settings), n_batches (per epoch), max_batch_tokens, and
    staging(): the (address, bytes) of the staging buffers every ticket's
    arrays live in, e.g. to page-lock them for device copies.

    staging_buffers: batch-sized host buffers, 2..4; 0 = the library's 3.
    At most that many tickets are taken or on the wire at once. Three let a
    caller that queues batch N+1's work before it sends N take N+2 while N
    is sent; two save one batch's memory."""

    def __init__(self, to, data, token_budget, hidden_size, layers, seed=0, max_seq_len=0,
                 overflow="truncate", prefetch=2, secret_file=None, transport="auto", name=None,
                 connect_timeout_s=0, arrays="auto", reconnect=False, status_interval_s=0,
                 hs_dtype="bf16", staging_buffers=0, target=None, target_fingerprint=None):
        self._p = None
        lib = load()
        if not isinstance(to, str) or any(":" not in a for a in to.split(",")):
            raise ValueError("to=%r: expected the consumer as 'HOST:PORT', e.g. "
                             "'127.0.0.1:7000', or every rank's: 'HOST:PORT,HOST:PORT' or "
                             "'HOST:LO-HI'" % (to,))
        if not isinstance(data, (str, os.PathLike)) or not os.path.isfile(data):
            raise ValueError("data=%r: not a file; expected a JSONL or .hst dataset (the same "
                             "for every producer of the run)" % (data,))
        try:
            layers = [int(x) for x in layers]
        except (TypeError, ValueError):
            raise ValueError("layers=%r: expected a list of captured layer indices (Hugging "
                             "Face output_hidden_states numbering), e.g. [2, 16, 29]" % (layers,))
        if not layers or any(b <= a for a, b in zip(layers, layers[1:])) or layers[0] < 0:
            raise ValueError("layers=%r: expected a non-empty, strictly increasing list of "
                             "indices >= 0" % (layers,))
        # the settings, through the library's table (hs_producer_client_config_set): its
        # bounds and messages; layers and the target are fields (arrays, fingerprints)
        cfg = ProducerClientConfig()
        lib.hs_producer_client_config_default(ctypes.byref(cfg))
        self._keep = []
        for nm, v in (("to", to), ("data", os.fspath(data)), ("token_budget", token_budget),
                      ("max_seq_len", max_seq_len), ("overflow", overflow), ("seed", seed),
                      ("hidden_size", hidden_size), ("prefetch", prefetch),
                      ("secret_file", secret_file), ("transport", transport), ("name", name),
                      ("connect_timeout_s", connect_timeout_s), ("reconnect", reconnect),
                      ("status_interval_s", status_interval_s), ("hs_dtype", hs_dtype),
                      ("staging_buffers", staging_buffers)):
            if v is not None:
                self._keep.append(_config_set(lib, cfg, nm, v, "hs_producer_client_config_set"))
        self.hs_dtype = hs_dtype
        self.target_fingerprint, self.target_name = _resolve_target(target, target_fingerprint)
        self._mode = _arrays.resolve_arrays(arrays)
        self._layers = layers

        self._keep.append(_config_set(lib, cfg, "target_name", self.target_name,
                                      "hs_producer_client_config_set"))
        self._keep.append((ctypes.c_int32 * len(layers))(*layers))
        cfg.layers = ctypes.cast(self._keep[-1], ctypes.POINTER(ctypes.c_int32))
        cfg.n_layers = len(layers)
        cfg.target_fingerprint = self.target_fingerprint
        h = ctypes.c_void_p()
        st = lib.hs_producer_open(ctypes.byref(cfg), ctypes.byref(h))
        if st != HS_OK:
            raise HsflowError("hs_producer_open (to %s, data %s) failed; the log above says why"
                              % (to, data), st)
        self._lib = lib
        self._p = h
        info = ProducerInfo()
        lib.hs_producer_info(h, ctypes.byref(info))
        self.plan_hash = int(info.plan_hash)
        self.n_batches = int(info.n_batches)
        self.max_batch_tokens = int(info.max_batch_tokens)
        self._staging = [(int(a), int(info.staging_bytes)) for a in info.staging if a]
        self._max_out = len(self._staging)  # tickets taken or on the wire at once
        # fp8: the bf16 states of each ticket out are gathered here, then
        # quantised into the staging buffer when sent
        self._scratch = ([np.empty(self.max_batch_tokens * len(layers) * int(hidden_size),
                                   np.uint16) for _ in range(self._max_out)]
                         if hs_dtype == "fp8" else [])
        self._out = []     # tickets taken and not yet sent
        self._done = False
        self._closing = False
        self.batches_sent = 0
        self.tokens_sent = 0

    def staging(self):
        """[(address, bytes)] of the staging buffers (valid until close())."""
        return list(self._staging)

    def close(self):
        """Says BYE if the run is not over, stops and frees. Tickets not sent
        go back to the consumer's queue."""
        self._closing = True
        if self._p is None:
            return
        for t in self._out:
            t._sent = True
            t._views = t._np = {}
        self._out = []
        self._lib.hs_producer_close(self._p)
        self._p = None

    def next_ticket(self, timeout=None):
        """The next ticket; None after `timeout` seconds without one; raises
        StopIteration once the consumer says the run is over."""
        if self._p is None:
            raise HsflowError("the producer is closed")
        if len(self._out) >= self._max_out:
            raise HsflowError("%d tickets are taken and not sent (%s); send one before taking "
                              "another" % (len(self._out), ", ".join(map(repr, self._out))))
        if self._done:
            raise StopIteration
        w = CWork()
        if not self._wait_next(lambda ms: self._lib.hs_producer_next(self._p, ctypes.byref(w), ms),
                               timeout, "hs_producer_next"):
            return None
        scratch = None
        if self._scratch:
            busy = {id(x._scratch) for x in self._out}
            scratch = next(b for b in self._scratch if id(b) not in busy)
        t = Ticket(self, w, self._layers, self._mode, scratch)
        self._out.append(t)
        return t

    def tickets(self):
        """Yields tickets until the run is over. Each must be sent before the
        next one is taken."""
        while True:
            if self._out:
                raise HsflowError("ticket %r was not sent; call t.send(...) on every ticket "
                                  "before taking the next" % (self._out[0],))
            try:
                t = self.next_ticket()
            except StopIteration:
                return
            yield t

    def _submit(self, t):
        if self._p is None:
            raise HsflowError("the producer is closed")
        st = self._lib.hs_producer_submit(self._p, ctypes.byref(t._work))
        if st != HS_OK:
            raise HsflowError("hs_producer_submit (epoch %d, batch %d)" % (t.epoch, t.batch), st)
        t._sent = True
        t._views = t._np = {}
        self._out.remove(t)
        self.batches_sent += 1
        self.tokens_sent += t.n_tokens
