# SPDX-License-Identifier: Apache-2.0
"""The GPU's energy counter and power-cap time, through NVML by ctypes, for
the baselines the forward benches time in torch (transformers): the same
figures hs-bench-forward reports from kernels/gpu_energy.c.

At its power limit a GPU lowers its clocks until it draws no more than the
limit, so two programs that both hold the limit run in the ratio of their
joules per token, not of their kernels' speed at full clocks.

    meter = EnergyMeter.for_torch_device()   # None without NVML
    a = meter.mark(); ...timed runs...; b = meter.mark()
    meter.span(a, b) -> dict(joules, watts, limit_watts, power_capped)
"""
import ctypes
import time

NVML_PERF_POLICY_POWER = 0


class _Violation(ctypes.Structure):
    _fields_ = [("reference_time", ctypes.c_ulonglong), ("violation_ns", ctypes.c_ulonglong)]


class EnergyMeter:
    def __init__(self, pci_bus_id):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise OSError("nvmlInit_v2 failed")
        self.dev = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(),
                                                     ctypes.byref(self.dev)) != 0:
            raise OSError(f"NVML has no device at {pci_bus_id}")
        limit = ctypes.c_uint()
        ok = self.lib.nvmlDeviceGetEnforcedPowerLimit(self.dev, ctypes.byref(limit)) == 0
        self.limit_watts = limit.value / 1e3 if ok else 0.0
        self.mark()  # raises when the device has no energy counter

    @classmethod
    def for_torch_device(cls, device=None):
        """The meter of torch's current (or given) CUDA device, or None."""
        import torch
        p = torch.cuda.get_device_properties(device if device is not None
                                             else torch.cuda.current_device())
        try:
            return cls("%08x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id))
        except (OSError, AttributeError):
            return None

    def _energy_mj(self):
        mj = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)) != 0:
            raise OSError("NVML has no energy counter for this device")
        return mj.value

    def mark(self):
        """(mJ, power-capped ns, time) at the counter's next update: the driver
        updates it every 100 ms (H200), so a plain read can be that stale
        (several percent of a one-second span at 700 W)."""
        first = self._energy_mj()
        t0 = at = time.perf_counter()
        mj = first
        while mj == first and at - t0 < 0.25:
            time.sleep(0.0002)
            mj, at = self._energy_mj(), time.perf_counter()
        v = _Violation()
        ok = self.lib.nvmlDeviceGetViolationStatus(self.dev, NVML_PERF_POLICY_POWER,
                                                   ctypes.byref(v)) == 0
        return mj, v.violation_ns if ok else 0, at

    def span(self, a, b):
        seconds = b[2] - a[2]
        joules = (b[0] - a[0]) / 1e3
        capped = min(1.0, max(0.0, (b[1] - a[1]) / 1e9 / seconds))
        return dict(joules=joules, watts=joules / seconds, limit_watts=self.limit_watts,
                    power_capped=capped)


def time_transformers(model, n, L, iters, meter=None):
    """transformers' forward (output_hidden_states, no LM head) of n random
    sequences of L tokens: one warm-up, then iters timed runs. The median ms,
    the peak GiB and, with a meter, its figures over the timed runs
    (j_per_token, watts, limit_watts, power_capped)."""
    import statistics

    import torch
    ids = torch.randint(0, model.config.vocab_size, (n, L), device="cuda")
    times, energy = [], {}
    with torch.inference_mode():
        for i in range(iters + 1):
            if i == 1 and meter:
                torch.cuda.synchronize()
                mark0 = meter.mark()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            out = model.model(input_ids=ids, output_hidden_states=True, use_cache=False)
            e1.record()
            torch.cuda.synchronize()
            del out
            if i:
                times.append(e0.elapsed_time(e1))
    if meter and iters:
        s = meter.span(mark0, meter.mark())
        energy = dict(j_per_token=s["joules"] / (iters * n * L), watts=s["watts"],
                      limit_watts=s["limit_watts"], power_capped=s["power_capped"])
    peak = torch.cuda.max_memory_allocated() / 2**30
    return dict(ms=statistics.median(times), peak_gib=peak, **energy)


def power_note(r):
    """', 9.8 mJ/token at 699 W of 700, power-capped 98% of the time', where metered"""
    if "j_per_token" not in r:
        return ""
    return (f", {r['j_per_token'] * 1e3:.3f} mJ/token at {r['watts']:.0f} W of "
            f"{r['limit_watts']:.0f}, power-capped {r['power_capped'] * 100:.0f}% of the time")


def energy_cells(h, t):
    """the table's 'mJ/token a / b | W a / b' cells, '-' where not metered"""
    if "j_per_token" not in h or "j_per_token" not in t:
        return "- | -"
    return (f"{h['j_per_token'] * 1e3:.3f} / {t['j_per_token'] * 1e3:.3f} | "
            f"{h['watts']:.0f} / {t['watts']:.0f}")


def metered(r, key, scale, digits):
    """r[key] * scale with digits decimals, '-' where the run was not metered"""
    return f"{r[key] * scale:.{digits}f}" if key in r else "-"
