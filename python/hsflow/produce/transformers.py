# SPDX-License-Identifier: Apache-2.0
"""One hsflow-produce worker process: a model replica on one device (a GPU,
or the CPU), its own connection to the consumer (an hsflow.Producer), and
the loop that turns tickets into hidden states.

On a GPU, batch k's forward runs on the compute stream into one of two
device output buffers; a side stream then copies the [T, k*H] bf16 result
straight into the ticket's staging buffer (page-locked once with
cudaHostRegister) while batch k+1's forward is queued. Batch k is sealed
and sent once its copy is done. On the CPU the hooks write into the staging
buffer directly and the same loop runs with the copies done in place.

Messages to the parent and exit codes: _common.py.
"""
import contextlib
import math
import os
import time
import traceback
import warnings

from . import _common
from ._common import (EXIT_FAIL, EXIT_INPUT, EXIT_OK, EXIT_OOM, REFUSED_STATUS,  # noqa: F401
                      SelfCheckError, late_busy_pct)
from ._common import Stop as _Stop  # noqa: F401
from ._common import is_oom as _is_oom

# what this engine's workers import, named before any process starts
DEPS = ("torch", "transformers")


# HS_PRODUCE_FAULT (_common.fault), as this engine reads it: 'oom:W:N' raises
# an out-of-memory error at worker W's N-th batch; 'hang:W:N' makes worker W
# stop there (holding the ticket) until it is killed; 'leak:W:I' makes worker
# W's decoder layer I leak across the sequences of a packed row;
# 'shape_noise:W:I' makes its layer I's output depend slightly on the call's
# shape, as kernels chosen by shape do in bf16.
_fault = _common.fault


def profile_first_batch(text):
    """HS_PRODUCE_PROFILE_FROM: the first profiled batch, 2 or more (the
    profiler starts after the batch before it); 3 when not given."""
    if not text:
        return 3
    if not text.isdigit() or int(text) < 2:
        raise ValueError("HS_PRODUCE_PROFILE_FROM=%s: expected a batch number, 2 or more" % text)
    return int(text)


def _alloc_counts(torch, device):
    """The CUDA caching allocator's device allocations, frees and retries
    (a free or a retry synchronises the device)."""
    st = torch.cuda.memory_stats(device)
    return {k: int(st.get(k, 0)) for k in ("num_device_alloc", "num_device_free",
                                            "num_alloc_retries")}


class Worker(_common.WorkerBase):
    """One transformers replica: its figures (launch_s, wait_s and send_s are
    host seconds queueing forwards, waiting for the GPU, sealing and
    sending; sent_at's busy seconds are GPU seconds, for late_busy_pct),
    faults and hsflow.Producer as every engine's (WorkerBase)."""

    def __init__(self, index, spec, queue):
        super().__init__(index, spec, queue)
        self.label = "cpu %d" % index if self.gpu < 0 else "gpu %d" % self.gpu
        self.profile_dir = os.environ.get("HS_PRODUCE_PROFILE") if index == 0 else None
        self.profile_from = profile_first_batch(os.environ.get("HS_PRODUCE_PROFILE_FROM"))
        self.profiler = None
        self.pinned = []

    # ---- setup ---------------------------------------------------------------

    def load(self):
        import torch
        from .. import _hf
        s = self.spec
        if self.gpu >= 0:
            if not torch.cuda.is_available():
                raise _hf.ModelError("--gpus %d: torch sees no CUDA device here (torch %s); use "
                                     "--gpus cpu:N or install a CUDA build of torch"
                                     % (self.gpu, torch.__version__))
            if self.gpu >= torch.cuda.device_count():
                raise _hf.ModelError("--gpus %d: this machine has %d CUDA device(s)"
                                     % (self.gpu, torch.cuda.device_count()))
            torch.cuda.set_device(self.gpu)
            self.device = torch.device("cuda", self.gpu)
        else:
            self.device = torch.device("cpu")
            n_cpu = sum(1 for g in s["gpus"] if g < 0)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // n_cpu))
        t0 = time.monotonic()
        self.decoder, _ = _hf.load_decoder(s["model"], s["n_run"], s["dtype"],
                                           s["attn_implementation"],
                                           "cpu" if self.gpu < 0 else "cuda:%d" % self.gpu)
        self.impl = getattr(self.decoder.config, "_attn_implementation", None) or \
            s["attn_implementation"]
        self.sdpa_note = self._choose_sdpa_backends()
        self.packed = s["packed"] if s["packed"] is not None else _hf.packing_is_varlen(self.impl)
        self.packing_note = None
        if self.packed:
            self.packed, self.packing_note = self._check_packing()
        if "leak" in self.faults.values():
            self._plant_leak([n for n, k in self.faults.items() if k == "leak"][0])
        if "shape_noise" in self.faults.values():
            self._plant_shape_noise([n for n, k in self.faults.items() if k == "shape_noise"][0])
        self.capture = _hf.Capture(self.decoder, s["layers"], s["n_layers"], s["hidden_size"])
        kH = len(s["layers"]) * s["hidden_size"]
        self.out = None
        if self.gpu >= 0:
            self.compute = torch.cuda.Stream(self.device)
            self.copy = torch.cuda.Stream(self.device)
            self.out = [torch.empty((s["token_budget"], kH), dtype=torch.bfloat16,
                                    device=self.device) for _ in range(2)]
        return {"pid": os.getpid(), "load_s": time.monotonic() - t0,
                "params": sum(p.numel() for p in self.decoder.parameters()),
                "batching": "packed" if self.packed else "padded",
                "note": "; ".join(x for x in (self.packing_note, self.sdpa_note) if x) or None,
                "attn_implementation": self.impl}

    def _choose_sdpa_backends(self):
        """--sdpa-backends, for sdpa attention on a GPU: the torch kernels
        scaled_dot_product_attention may pick in this worker process. auto
        leaves cuDNN out: padded calls change shape every batch, and torch
        builds cuDNN's attention graph anew for each new (rows, length),
        tens of ms of host time per call that leave the GPU idle (seen in
        HS_PRODUCE_PROFILE's ops table). Returns the note to log."""
        import torch
        want = self.spec.get("sdpa_backends", "auto")
        if self.gpu < 0 or self.impl != "sdpa":
            return None
        names = ["flash", "efficient", "math"] if want == "auto" else want.split(",")
        b = torch.backends.cuda
        b.enable_cudnn_sdp("cudnn" in names)
        b.enable_flash_sdp("flash" in names)
        b.enable_mem_efficient_sdp("efficient" in names)
        b.enable_math_sdp("math" in names)
        return "sdpa kernels: %s%s" % (",".join(names),
                                       " (auto: not cudnn, whose graph is rebuilt for every "
                                       "new shape)" if want == "auto" else "")

    def _check_packing(self):
        """Hands packed rows' boundaries to the stateful mixers, then probes
        that packing is exact on every layer. Returns (packed, note): with
        --batching packed a model that mixes sequences is an error, with
        auto it runs padded and the note says why."""
        from .. import _hf
        wrapped = _hf.per_sequence_mixers(self.decoder)
        why = _hf.probe_packing(self.decoder, self.device)
        if why is None:
            note = None
            if wrapped:
                note = "%d stateful mixer(s) (%s) run per sequence inside packed rows" % (
                    len(wrapped), ", ".join(sorted({c for _, _, c in wrapped})))
            return True, note
        if self.spec["batching"] == "packed":
            raise _hf.ModelError("--batching packed is not exact for this model with "
                                 "--attn-implementation %s: %s. Use --batching padded (or auto, "
                                 "which falls back to it)" % (self.impl, why))
        return False, "packing refused, padded batches instead: %s" % why

    def _plant_leak(self, layer):
        """HS_PRODUCE_FAULT=leak:W:I (tests): decoder layer I adds each token's
        predecessor in the row to its output, a packing that leaks across
        sequences, planted after the load-time probe."""
        def hook(module, args, output):
            x = output[0] if isinstance(output, (tuple, list)) else output
            x[:, 1:] += 0.5 * x[:, :-1].clone()
        self.decoder.layers[layer].register_forward_hook(hook)

    def _plant_shape_noise(self, layer):
        """HS_PRODUCE_FAULT=shape_noise:W:I (tests): decoder layer I scales
        its output by 1 + 0.04 sin(rows x columns of the call), a change that
        depends on the call's shape and on nothing else, like the bf16
        rounding of kernels chosen by shape, but above the fixed bound."""
        def hook(module, args, output):
            x = output[0] if isinstance(output, (tuple, list)) else output
            x.mul_(1.0 + 0.04 * math.sin(x.shape[0] * x.shape[1]))
        self.decoder.layers[layer].register_forward_hook(hook)

    def _pin_staging(self):
        """Page-locks the producer's staging buffers once, so the
        device-to-host copies are asynchronous and straight into them."""
        import torch
        cudart = torch.cuda.cudart()
        for addr, size in self.producer.staging():
            rc = cudart.cudaHostRegister(addr, size, 0)
            if int(rc) != 0:
                self.log.warning("worker %d (%s): cannot page-lock %.1f MiB of staging "
                                 "(cudaHostRegister error %s); copies to it are synchronous",
                                 self.index, self.label, size / 2**20, int(rc))
            else:
                self.pinned.append(addr)

    def _unpin_staging(self):
        import torch
        if self.pinned:
            torch.cuda.synchronize(self.device)
            cudart = torch.cuda.cudart()
            for addr in self.pinned:
                cudart.cudaHostUnregister(addr)
            self.pinned = []

    # ---- one batch -------------------------------------------------------------

    def launch(self, t, slot):
        """Queues (GPU) or runs (CPU) the forward of ticket t and the copy of
        its hidden states into t.hidden. Returns the in-flight record."""
        import torch
        rec = {"t": t, "slot": slot}
        t0 = time.monotonic()
        if self.gpu < 0:
            self._forward(t, t.hidden, rec)
            rec["busy"] = time.monotonic() - t0
            return rec
        with torch.cuda.stream(self.compute):
            out = self.out[slot][:t.n_tokens]
            rec["ev0"] = torch.cuda.Event(enable_timing=True)
            rec["ev1"] = torch.cuda.Event(enable_timing=True)
            rec["ev0"].record(self.compute)
            self._forward(t, out, rec)
            rec["ev1"].record(self.compute)
        self.copy.wait_event(rec["ev1"])
        with torch.cuda.stream(self.copy):
            if t.hs_dtype == "fp8":  # quantised here: half the bytes cross PCIe
                from ..producer import quantize_fp8_torch
                q, scales, rec["finite"] = quantize_fp8_torch(out)
                t.hidden_fp8.copy_(q, non_blocking=bool(self.pinned))
                t.hidden_scales.copy_(scales, non_blocking=bool(self.pinned))
                rec["fp8"] = (q, scales)  # alive until the copies are done
            else:
                t.hidden.copy_(out, non_blocking=bool(self.pinned))
        rec["copied"] = torch.cuda.Event()
        rec["copied"].record(self.copy)
        return rec

    def _forward(self, t, out, rec):
        """The forward calls of ticket t, the hooks writing into out."""
        import torch
        from .. import _hf
        s = self.spec
        chunks = _hf.batch_chunks(t.input_ids, t.cu_seqlens, self.packed, s["token_budget"],
                                  self.device, varlen="flash" in (self.impl or ""))
        rec["padded"] = sum(c.padded_tokens for c in chunks)
        with torch.inference_mode():
            for c in chunks:
                self.capture.begin(out, c)
                c.run(self.decoder)
                if self.capture.seen != len(s["layers"]):
                    raise RuntimeError("%d of %d capture hooks ran; the model's forward does not "
                                       "call its decoder layers as modules"
                                       % (self.capture.seen, len(s["layers"])))

    def _self_check(self, t, rec):
        """Proves the first batch's states of up to --self-check sequences
        (spread over the batch, the last one included) depend on nothing
        but their own tokens. Two tests, every captured layer:
          - neighbours: the batch again with the tokens of every other
            sequence replaced (odd ones, then even ones), same lengths, so
            the same shapes and kernels: a sequence's states must not move
            (exact for most models);
          - alone (packed batches): the sequence run alone, against the
            batch. This catches position ids that do not restart.
        The bound of each is _hf._parity's bf16 noise bound, or 3x what the
        same test changes in sequence 0 where that is larger (capped at
        4x): sequence 0 has nothing before it, so its change is noise
        alone (other GEMM shapes; in deep bf16 models it can exceed the
        fixed bound, as an 8-layer Llama's padded batch against its
        sequences run alone did on the H200).
        Raises SelfCheckError naming the test, the layer, the sequence and
        the error; logs its cost."""
        import numpy as np
        import torch
        from .. import _hf
        s = self.spec
        t0 = time.monotonic()
        if self.gpu >= 0:
            rec["ev1"].synchronize()
            got_all = self.out[rec["slot"]][:t.n_tokens]
            scratch = self.out[rec["slot"] ^ 1][:t.n_tokens]  # free: nothing pending yet
        else:
            got_all = t.hidden
            scratch = torch.empty_like(got_all)
        cu = np.asarray(t.cu_seqlens, dtype=np.int64)
        ids = np.asarray(t.input_ids, dtype=np.int64)
        n = t.n_seqs
        k = min(n, s["self_check"])
        picks = sorted({int(round(x)) for x in np.linspace(n - 1, min(1, n - 1), k)})
        H, layers = s["hidden_size"], s["layers"]
        worst = (0.0, None, None, None)

        def rows(buf, q):
            """The captured layers' [tokens, H] of sequence q in buf."""
            lo, hi = int(cu[q]), int(cu[q + 1])
            return [buf[lo:hi, j * H:(j + 1) * H] for j in range(len(layers))]

        def check(test, q, got, ref, floor):
            """got, ref: the captured layers' [tokens, H] of sequence q;
            floor: per layer, 3x sequence 0's (relative, max) error."""
            nonlocal worst
            lo, hi = int(cu[q]), int(cu[q + 1])
            for j, layer in enumerate(layers):
                l2, mx = _hf._parity(got[j], ref[j])
                bl2 = max(_hf.PARITY_L2, min(4 * _hf.PARITY_L2, floor[j][0]))
                bmx = max(_hf.PARITY_MAX, min(4 * _hf.PARITY_MAX, floor[j][1]))
                if l2 > worst[0]:
                    worst = (l2, layer, q, test)
                if l2 > bl2 or mx > bmx:
                    raise SelfCheckError(
                        "self-check (%s): layer %d of sequence %d of batch %d/%d (sample %d, %d "
                        "tokens, %d sequences in the batch) %s: relative error %.3g, max error "
                        "%.3g of the layer's largest value (bf16 noise is below %.3g and %.3g). "
                        "The %s batch mixes sequences: nothing was streamed. %s"
                        % (test, layer, q, t.epoch, t.batch, int(t.sample_ids[q]), hi - lo, n,
                           "moves when the other sequences' tokens change" if test == "neighbours"
                           else "differs from that sequence run alone", l2, mx, bl2,
                           bmx, "packed" if self.packed else "padded",
                           "Use --batching padded" if self.packed else
                           "Try another --attn-implementation"))
        with torch.inference_mode():
            # neighbours: odd sequences' tokens replaced, then even ones';
            # sequence 0 (kept in the first run, nothing before it) measures
            # what the new tokens change through noise alone (an MoE's
            # experts get other token counts, so other GEMM shapes)
            vocab = self.decoder.embed_tokens.num_embeddings
            rng = np.random.default_rng(t.batch)
            floor = None
            for parity in ((1, 0) if n > 1 else ()):
                other = ids.copy()
                for q in range(parity, n, 2):
                    lo, hi = int(cu[q]), int(cu[q + 1])
                    other[lo:hi] = (ids[lo:hi] + rng.integers(1, vocab, hi - lo)) % vocab
                for c in _hf.batch_chunks(other, cu, self.packed, s["token_budget"], self.device,
                                          varlen="flash" in (self.impl or "")):
                    self.capture.begin(scratch, c)
                    c.run(self.decoder)
                if floor is None:
                    floor = [[3 * e for e in _hf._parity(a, b)]
                             for a, b in zip(rows(scratch, 0), rows(got_all, 0))]
                for q in picks:
                    if q and q % 2 != parity:
                        check("neighbours", q, rows(scratch, q), rows(got_all, q), floor)
            if self.packed:
                def alone(q):
                    lo, hi = int(cu[q]), int(cu[q + 1])
                    out = torch.empty((hi - lo, len(layers) * H), dtype=torch.float32,
                                      device=self.device)
                    c = _hf.batch_chunks(ids[lo:hi], np.array([0, hi - lo]), False,
                                         s["token_budget"], self.device)[0]
                    self.capture.begin(out, c)
                    c.run(self.decoder)
                    return rows(got_all, q), [out[:, j * H:(j + 1) * H]
                                              for j in range(len(layers))]
                g0, a0 = alone(0)  # the row's first sequence: shape noise only
                floor = [[3 * e for e in _hf._parity(g, a)] for g, a in zip(g0, a0)]
                for q in picks:
                    if q:
                        got, ref = alone(q)
                        check("alone", q, got, ref, floor)
        cost = time.monotonic() - t0
        self.log.info("worker %d (%s): self-check passed: %d of %d sequence(s) of batch %d/%d "
                      "keep their states when the other sequences change%s, at every captured "
                      "layer (worst relative error %.2g, layer %s, sequence %s, %s); it took "
                      "%.2f s", self.index, self.label, len(picks), n, t.epoch, t.batch,
                      " and match themselves run alone" if self.packed else "",
                      worst[0], worst[1], worst[2], worst[3] or "-", cost)
        self.fig["self_check_s"] = cost

    def _next_ticket(self, p, pending):
        """The next ticket (None at the end of the plan) and what is still
        pending then. While no ticket is queued, pending is sent once its
        copy is done and the wait goes on: blocking on the GPU here instead
        would leave it idle from the end of that forward until this send,
        the consumer's check of an earlier batch and the next ticket were
        through. Time spent waiting with nothing on the GPU is stall."""
        while True:
            t_wait = time.monotonic()
            try:
                with self._mark("hsflow next_ticket"):
                    t = p.next_ticket(timeout=0.002 if pending else None)
            except StopIteration:
                return None, pending
            if t is not None:
                if pending is None:
                    self.fig["stall_s"] += time.monotonic() - t_wait
                return t, pending
            if pending is not None and self._copied(pending):
                with self._mark("hsflow finish"):
                    self.finish(pending)
                pending = None

    def _mark(self, name):
        """A named span in HS_PRODUCE_PROFILE's trace (nothing when not profiling)."""
        if self.profiler is None:
            return contextlib.nullcontext()
        import torch
        return torch.profiler.record_function(name)

    def _copied(self, rec):
        """Whether rec's states are in host memory (a CPU forward's always are)."""
        return self.gpu < 0 or rec["copied"].query()

    def finish(self, rec):
        """Waits for rec's copy, then seals and sends its batch."""
        t = rec["t"]
        t_wait = time.monotonic()
        if self.gpu >= 0:
            rec["copied"].synchronize()
            busy = rec["ev0"].elapsed_time(rec["ev1"]) / 1e3
        else:
            busy = rec["busy"]
        t_send = time.monotonic()
        self.fig["wait_s"] += t_send - t_wait
        if "finite" in rec:
            if not bool(rec["finite"].all()):
                bad = int((~rec["finite"]).nonzero()[0, 0])
                raise ValueError("batch %d/%d: token %d has a NaN or infinite hidden state; it "
                                 "cannot be quantised to fp8 (nothing was sent)"
                                 % (t.epoch, t.batch, bad))
            t.send(quantized=True)
        else:
            t.send()
        self.count_sent(t, t_send, busy, rec["padded"])

    # ---- the loop --------------------------------------------------------------

    def run(self):
        s = self.spec
        p = self.connect()
        if self.gpu >= 0:
            self._pin_staging()
        t_start = time.monotonic()
        t_report = t_start
        pending, slot, n = None, 0, 0
        try:
            while True:
                t, pending = self._next_ticket(p, pending)
                if t is None:
                    break
                n += 1
                kind = self.faults.get(n)
                try:
                    if kind == "hang":
                        self.log.warning("worker %d (%s): HS_PRODUCE_FAULT hangs on batch %d/%d "
                                         "(pid %d)", self.index, self.label, t.epoch, t.batch,
                                         os.getpid())
                        while True:
                            time.sleep(1)
                    if kind == "oom":
                        import torch
                        raise torch.OutOfMemoryError("CUDA out of memory (HS_PRODUCE_FAULT)")
                    t_launch = time.monotonic()
                    with self._mark("hsflow launch"):
                        rec = self.launch(t, slot)
                    self.fig["launch_s"] += time.monotonic() - t_launch
                    if n == 1 and s["self_check"] > 0:
                        self._self_check(t, rec)
                except Exception as e:
                    if not _is_oom(e):
                        raise
                    self._on_oom(e, t, pending)
                    return EXIT_OOM
                if pending is not None:
                    with self._mark("hsflow finish"):
                        self.finish(pending)
                pending, slot = rec, slot ^ 1
                self._profile_step(n)
                now = time.monotonic()
                if now - t_report >= 1.0:
                    t_report = now
                    self.fig["seconds"] = now - t_start
                    self.q.put(("stats", self.index, dict(self.fig)))
            if pending is not None:
                self.finish(pending)
        finally:
            self.fig["seconds"] = time.monotonic() - t_start
            self.fig["late_busy_pct"] = late_busy_pct(self.sent_at)
        return EXIT_OK

    def _profile_step(self, n):
        """HS_PRODUCE_PROFILE=DIR: worker 0's batches F to F+3 (F from
        HS_PRODUCE_PROFILE_FROM, 3 by default: after the self-check) under
        torch.profiler and torch's sync debug mode; its trace (trace.json,
        for chrome://tracing or Perfetto), the ops that take the most host
        and device time (ops.txt), and every call site that made the host wait for the GPU,
        with its stack and count, beside the CUDA allocator's counts of
        device allocations, frees and retries over those batches
        (syncs.txt) go into DIR."""
        if not self.profile_dir or self.gpu < 0:
            return
        import torch
        first = self.profile_from
        span = "%d-%d" % (first, first + 3)
        if n == first - 1:
            self.profiler = torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            self.sync_sites = {}
            self.alloc_before = _alloc_counts(torch, self.device)
            # every occurrence counted, not the first of each place only
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.simplefilter("always")
            self._old_showwarning = warnings.showwarning
            warnings.showwarning = self._note_sync
            torch.cuda.set_sync_debug_mode("warn")
            self.profiler.start()
        elif n == first + 3 and self.profiler is not None:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = self._old_showwarning
            self._warnings.__exit__(None, None, None)
            torch.cuda.synchronize(self.device)
            self.profiler.stop()
            os.makedirs(self.profile_dir, exist_ok=True)
            self.profiler.export_chrome_trace(os.path.join(self.profile_dir, "trace.json"))
            ka = self.profiler.key_averages()
            with open(os.path.join(self.profile_dir, "ops.txt"), "w") as f:
                f.write(ka.table(sort_by="self_cpu_time_total", row_limit=40))
                f.write(ka.table(sort_by="self_cuda_time_total", row_limit=25))
            after = _alloc_counts(torch, self.device)
            with open(os.path.join(self.profile_dir, "syncs.txt"), "w") as f:
                counts = ", ".join("%s +%d" % (k, after[k] - self.alloc_before[k])
                                   for k in sorted(after))
                f.write("CUDA allocator over batches %s: %s\n" % (span, counts))
                f.write("%d call site(s) made the host wait for the GPU (torch's sync debug "
                        "mode; it does not see every kind of wait)\n" % len(self.sync_sites))
                for stack, (count, what) in sorted(self.sync_sites.items(),
                                                   key=lambda x: -x[1][0]):
                    f.write("\n=== %d x %s\n%s" % (count, what, stack))
            self.log.info("worker %d: batches %s profiled into %s", self.index, span,
                          self.profile_dir)
            self.profiler = None

    def _note_sync(self, message, category, filename, lineno, file=None, line=None):
        """warnings.showwarning while profiling: counts each synchronising
        call site by its stack; other warnings go where they went."""
        if "synchronizing CUDA operation" not in str(message):
            return self._old_showwarning(message, category, filename, lineno, file, line)
        stack = "".join(traceback.format_stack(limit=16)[:-2])
        site = self.sync_sites.setdefault(stack, [0, str(message).split("(")[0].strip()])
        site[0] += 1

    def _on_oom(self, e, t, pending):
        import torch
        s = self.spec
        peak = ""
        if self.gpu >= 0:
            peak = "; peak %.1f GiB of %.1f GiB" % (
                torch.cuda.max_memory_allocated(self.device) / 2**30,
                torch.cuda.get_device_properties(self.device).total_memory / 2**30)
            torch.cuda.empty_cache()
        if pending is not None:
            self.finish(pending)  # computed before the failure: it still goes out
        self.log.error("worker %d (%s): out of memory on batch %d/%d (%d sequences, %d tokens%s): "
                       "%s. Its ticket goes back to the consumer and this worker stops. Lower "
                       "--token-budget (now %d; e.g. %d) for every producer of the run, or give "
                       "this target more memory (fewer captured layers, --dtype bf16)",
                       self.index, self.label, t.epoch, t.batch, t.n_seqs, t.n_tokens, peak,
                       str(e).splitlines()[0], s["token_budget"], max(1, s["token_budget"] // 2))

    def close(self):
        if self.producer is not None:
            try:
                if self.gpu >= 0:
                    self._unpin_staging()
            finally:
                self.producer.close()
                self.producer = None


def worker_main(index, spec, queue, go, abort):
    """Entry point of a spawned worker process."""
    _common.serve(Worker, index, spec, queue, go, abort)
