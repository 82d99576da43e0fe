# SPDX-License-Identifier: Apache-2.0
"""The baselines of the delivery and transport benches: torch's
cudaMemcpyAsync of nbytes between pinned host memory and the current GPU,
in GB/s (CUDA events, after a warm-up copy)."""


def _pinned_copy_gbs(nbytes, to_device, reps):
    import torch
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % torch.cuda.current_device())
    src, dst = (host, dev) if to_device else (dev, host)
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    e.record()
    torch.cuda.synchronize()
    return nbytes * reps / (s.elapsed_time(e) * 1e-3) / 1e9


def pinned_h2d_gbs(nbytes, reps=10):
    """host -> device: the baseline of the consumer's GPU delivery."""
    return _pinned_copy_gbs(nbytes, True, reps)


def pinned_d2h_gbs(nbytes, reps=10):
    """device -> host: the baseline of a GPU producer's copy into its
    staging buffer (a shared-memory ring over --transport shm)."""
    return _pinned_copy_gbs(nbytes, False, reps)
