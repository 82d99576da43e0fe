# SPDX-License-Identifier: Apache-2.0
"""GPU delivery through the binding (needs torch with CUDA; skipped on CPU
machines): device views are torch tensors sharing the device memory, and a
consumer with gpu=0 (a build with CUDA) hands every batch of a run to the
trainer on the GPU, values intact."""
import numpy as np
import pytest

import hsflow
from hsflow import _arrays
from conftest import have_torch

cuda = pytest.mark.skipif(not (have_torch() and __import__("torch").cuda.is_available()),
                          reason="needs torch with a CUDA GPU")


@cuda
def test_device_views_are_torch_tensors_over_the_same_gpu_memory():
    import torch
    src = torch.arange(5 * 6, dtype=torch.int16, device="cuda:0").view(5, 6)
    v = _arrays.device_view(src.data_ptr(), (5, 6), np.uint16, 0, want_torch=True)
    assert v.dtype == torch.bfloat16 and v.device == torch.device("cuda:0")
    assert v.data_ptr() == src.data_ptr() and v.shape == (5, 6)
    assert torch.equal(v.view(torch.int16), src)
    src[0, 0] = 77  # the same memory, not a copy
    assert int(v.view(torch.int16)[0, 0]) == 77
    ids = torch.arange(7, dtype=torch.int32, device="cuda:0")
    w = _arrays.device_view(ids.data_ptr(), (7,), np.int32, 0, want_torch=True)
    assert w.dtype == torch.int32 and torch.equal(w, ids)
    ca = _arrays.device_view(ids.data_ptr(), (7,), np.int32, 0, want_torch=False)
    assert ca.__cuda_array_interface__["data"][0] == ids.data_ptr()


@cuda
def test_consumer_on_gpu_delivers_every_batch_as_cuda_tensors(producer_bin, dataset):
    import torch
    from test_consumer import H, LAYERS, start_producers, stop
    data, rows = dataset
    try:
        c = hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, gpu=0,
                            verify_synthetic=True, arrays="torch")
    except hsflow.HsflowError as e:
        pytest.skip("libhsflow has no GPU delivery (%s)" % e)
    seen = []
    with c:
        procs = start_producers(producer_bin, c.port, data)
        try:
            for b in c:
                assert b.on_device
                hs = b.hidden_states
                assert hs.is_cuda and hs.dtype == torch.bfloat16
                assert hs.shape == (b.n_tokens, len(LAYERS) * H)
                assert hs.data_ptr() == b.pointers()["hidden_states"]
                cu = b.cu_seqlens.cpu().numpy()
                sids = b.sample_ids.cpu().numpy().view(np.uint64)
                assert cu[0] == 0 and cu[-1] == b.n_tokens and np.all(np.diff(cu) > 0)
                want = hsflow.synthetic_hidden(sids, cu, b.layers, H)
                got = hs.view(torch.int16).cpu().numpy().view(np.uint16)
                assert np.array_equal(got, want)
                ids = b.input_ids.cpu().numpy()
                for s in range(b.n_seqs):
                    assert ids[cu[s]:cu[s + 1]].tolist() == rows[int(sids[s])][0][:cu[s + 1] - cu[s]]
                seen.append((b.epoch, b.batch))
            s = c.stats()
        finally:
            stop(procs)
    assert len(seen) == len(set(seen)) == s["batches_planned"] > 2
    assert s["checksum_failures"] == 0
