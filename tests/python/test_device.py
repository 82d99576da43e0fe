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


@cuda
@pytest.mark.parametrize("deliver", ["bf16", "fp8"])
def test_fp8_run_on_gpu_is_dequantised_on_the_device_as_numpy_quantises(
        producer_bin, dataset, deliver):
    """An fp8 run delivered to the GPU: as bf16 (dequantised by the copy
    stream's kernel) equal bit for bit to the numpy reference of
    test_consumer, or as the raw e4m3 bytes and scales."""
    import torch
    from test_consumer import (H, _dequantize_rows, _quantize_rows, start_producers, stop)
    data, _ = dataset
    try:
        c = hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, gpu=0,
                            verify_synthetic=True, arrays="torch", deliver=deliver)
    except hsflow.HsflowError as e:
        pytest.skip("libhsflow has no GPU delivery (%s)" % e)
    n = 0
    with c:
        procs = start_producers(producer_bin, c.port, data, extra=("--hs-dtype", "fp8"))
        try:
            for b in c:
                cu = b.cu_seqlens.cpu().numpy()
                sids = b.sample_ids.cpu().numpy().view(np.uint64)
                q, scale = _quantize_rows(hsflow.synthetic_hidden(sids, cu, b.layers, H))
                if deliver == "bf16":
                    hs = b.hidden_states
                    assert hs.is_cuda and hs.dtype == torch.bfloat16
                    got = hs.view(torch.int16).cpu().numpy().view(np.uint16)
                    assert np.array_equal(got, _dequantize_rows(q, scale))
                else:
                    assert b.hidden_fp8.dtype == torch.float8_e4m3fn and b.hidden_fp8.is_cuda
                    assert np.array_equal(b.hidden_fp8.view(torch.uint8).cpu().numpy(), q)
                    assert np.array_equal(b.hidden_scales.cpu().numpy(), scale)
                n += 1
            s = c.stats()
        finally:
            stop(procs)
    assert n == s["batches_planned"] > 2 and s["checksum_failures"] == 0


@cuda
def test_gpu_forward_quantises_on_the_device_as_numpy_quantises_its_bf16_states(
        producer_bin, tmp_path):
    """hs-producer --source model on GPU 0 with --hs-dtype fp8 (the rows
    quantised by a kernel before they leave the device) sends, for every
    batch, the e4m3 bytes and scales numpy computes from the bf16 states the
    same producer sends in a bf16 run of the same plan."""
    import os
    from conftest import write_dataset
    from test_consumer import _quantize_rows, stop
    import subprocess
    import tempfile
    model = os.path.join(os.path.dirname(__file__), "..", "data", "llama3")
    data = str(tmp_path / "d.jsonl")
    write_dataset(data, 40, 5, 300, 64, seed=3)
    runs = {}
    for dtype, deliver in (("bf16", "bf16"), ("fp8", "fp8")):
        got = {}
        with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.05, arrays="numpy",
                             deliver=deliver) as c:
            log = tempfile.TemporaryFile()
            p = subprocess.Popen([producer_bin, "--to", "127.0.0.1:%d" % c.port, "--data", data,
                                  "--token-budget", "512", "--source", "model", "--model", model,
                                  "--layers", "1,2", "--gpus", "0", "--hs-dtype", dtype,
                                  "--connect-timeout", "60"], stdout=log,
                                 stderr=subprocess.STDOUT)
            p.log = log
            try:
                for b in c:
                    got[(b.epoch, b.batch)] = (b.hidden_states.copy() if dtype == "bf16" else
                                               (b.hidden_fp8.copy(), b.hidden_scales.copy()))
            finally:
                stop([p])
        runs[dtype] = got
    assert runs["bf16"].keys() == runs["fp8"].keys() and len(runs["bf16"]) > 1
    for key, hs in runs["bf16"].items():
        q, scale = _quantize_rows(hs)
        assert np.array_equal(runs["fp8"][key][1], scale), key
        assert np.array_equal(runs["fp8"][key][0], q), key


@cuda
def test_fp8_quantisation_in_torch_on_the_gpu_gives_the_librarys_bits():
    """hsflow-produce's on-GPU quantiser (quantize_fp8_torch on CUDA) against
    the library's hs_fp8_quantize_rows, over rows of many scales."""
    import torch
    from hsflow.producer import quantize_fp8_torch
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal((64, 4099)) * 10.0 ** rng.integers(-6, 6, (64, 1)),
                        np.zeros((1, 4099))]).astype(np.float32)
    bits = hsflow.f32_to_bf16_bits(x)
    q_ref, s_ref = hsflow.quantize_fp8(bits)
    xt = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).cuda()
    q, scales, finite = quantize_fp8_torch(xt)
    assert bool(finite.all())
    assert np.array_equal(scales.cpu().numpy(), s_ref)
    assert np.array_equal(q.cpu().numpy(), q_ref)
