# SPDX-License-Identifier: Apache-2.0
"""The baseline of the delivery benches (pipeline, delivery): torch's pinned
host -> device cudaMemcpyAsync of nbytes on the current GPU, in GB/s."""


def pinned_h2d_gbs(nbytes, reps=10):
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:%d" % torch.cuda.current_device())
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    e.record()
    torch.cuda.synchronize()
    return nbytes * reps / (s.elapsed_time(e) * 1e-3) / 1e9
