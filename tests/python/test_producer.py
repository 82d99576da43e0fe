# SPDX-License-Identifier: Apache-2.0
"""hsflow.Producer in this process feeding an hsflow.Consumer (in a thread of
the same process), with hidden states computed in numpy (and torch when it
is installed): every batch is delivered once and every value arrives
exactly as sent."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import hsflow
from conftest import ConsumerThread, have_torch

H, LAYERS, BUDGET = 40, [0, 3], 512


def exact_values(sample_ids, cu, layers, h):
    """float32 [T, k*H] values that bf16 holds exactly: multiples of 1/16 in
    [-8, 8), a function of (sample, position, layer, channel)."""
    T = int(cu[-1])
    out = np.empty((T, len(layers) * h), np.float32)
    ch = np.arange(h)
    for s, sid in enumerate(sample_ids):
        lo, hi = int(cu[s]), int(cu[s + 1])
        pos = np.arange(hi - lo)[:, None]
        for j, layer in enumerate(layers):
            v = (int(sid) * 7 + pos * 3 + layer * 5 + ch[None, :]) % 256 - 128
            out[lo:hi, j * h:(j + 1) * h] = v / 16.0
    return out


def send_held_then_the_rest(p, held):
    """Sends the tickets a test took, then every other ticket of the run,
    with the synthetic states the consumer's verify_synthetic expects."""
    for t in itertools.chain(held, p.tickets()):  # lazily: a ticket is taken as sent
        t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens, t.layers, H))


def producer(port, data, **kw):
    return hsflow.Producer(to="127.0.0.1:%d" % port, data=data, token_budget=BUDGET,
                           hidden_size=H, layers=LAYERS, connect_timeout_s=20,
                           arrays=kw.pop("arrays", "numpy"), target=kw.pop("target", "synthetic"),
                           **kw)


def test_python_producer_synthetic_states_pass_the_consumers_end_to_end_check(dataset):
    data, rows = dataset

    def check(b):
        assert np.array_equal(b.hidden_states,
                              hsflow.synthetic_hidden(b.sample_ids, b.cu_seqlens, b.layers, H))
        for s in range(b.n_seqs):
            lo, hi = int(b.cu_seqlens[s]), int(b.cu_seqlens[s + 1])
            assert b.input_ids[lo:hi].tolist() == rows[int(b.sample_ids[s])][0][:hi - lo]

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, verify_synthetic=True,
                         arrays="numpy") as c:
        ct = ConsumerThread(c, check)
        with producer(c.port, data) as p:
            for t in p.tickets():
                assert t.hidden.ctypes.data == t.pointers()["hidden"]  # zero-copy staging
                assert t.input_ids.ctypes.data == t.pointers()["input_ids"]
                assert t.cu_seqlens[0] == 0 and t.cu_seqlens[-1] == t.n_tokens
                assert t.layers == tuple(LAYERS) and t.hidden.shape == (t.n_tokens, 2 * H)
                t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens,
                                                             t.layers, H))
            sent = p.batches_sent
        seen = ct.join()
        s = c.stats()
    assert len(seen) == len(set(seen)) == sent == s["batches_planned"] > 2
    assert s["checksum_failures"] == 0 and s["finished"]


def test_python_producer_float_states_arrive_bit_exact_in_every_accepted_form(dataset):
    data, _ = dataset

    def check(b):
        want = exact_values(b.sample_ids, b.cu_seqlens, b.layers, H)
        assert np.array_equal(hsflow.bf16_bits_to_f32(b.hidden_states), want), \
            "epoch %d batch %d" % (b.epoch, b.batch)

    forms = []
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=3, arrays="numpy") as c:
        ct = ConsumerThread(c, check)
        with producer(c.port, data) as p:
            for i, t in enumerate(p.tickets()):
                x = exact_values(t.sample_ids, t.cu_seqlens, t.layers, H)
                form = i % 4
                forms.append(form)
                if form == 0:    # [T, k*H] float32
                    t.send(hidden_states=x)
                elif form == 1:  # k arrays [T, H], float64
                    t.send(hidden_states=[x[:, :H].astype(np.float64), x[:, H:]])
                elif form == 2:  # bf16 bits
                    t.send(hidden_states=hsflow.f32_to_bf16_bits(x))
                else:            # written in place into the staging buffer
                    hsflow.f32_to_bf16_bits(x, out=t.hidden)
                    t.send()
        seen = ct.join()
    assert len(seen) == len(set(seen)) == len(forms) and set(forms) == {0, 1, 2, 3}


def test_float32_to_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -2.5, 0.0, -0.0,
                  np.inf, -np.inf, np.nan, 3.0e38, 1e-45], np.float32)
    got = hsflow.f32_to_bf16_bits(x)
    assert [int(v) for v in got[:9]] == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x0000,
                                         0x8000, 0x7F80, 0xFF80]
    assert (got[9] & 0x7F80) == 0x7F80 and (got[9] & 0x7F) != 0  # still a NaN
    assert got[10] == 0x7F62 and got[11] == 0x0000
    if have_torch():
        import torch
        r = np.random.default_rng(1).standard_normal(4099).astype(np.float32) * 1e3
        ref = torch.from_numpy(r).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(hsflow.f32_to_bf16_bits(r), ref)


def test_ticket_send_rejects_wrong_shapes_and_types_and_a_sent_ticket_is_dead(dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        ct = ConsumerThread(c, lambda b: None)
        with producer(c.port, data, staging_buffers=2) as p:
            gen = p.tickets()
            t = next(gen)
            T = t.n_tokens
            with pytest.raises(ValueError, match=r"expected \[T, k\*H\] = \[%d, %d\]" % (T, 2 * H)):
                t.send(hidden_states=np.zeros((T, H), np.float32))
            with pytest.raises(ValueError, match="list of 1 arrays; expected one per captured"):
                t.send(hidden_states=[np.zeros((T, H), np.float32)])
            with pytest.raises(ValueError, match=r"hidden_states\[1\] has shape"):
                t.send(hidden_states=[np.zeros((T, H), np.float32), np.zeros((T, H + 1))])
            with pytest.raises(TypeError, match="dtype int64"):
                t.send(hidden_states=np.zeros((T, 2 * H), np.int64))
            with pytest.raises(TypeError, match="expected a torch tensor or a numpy array"):
                t.send(hidden_states="nope")
            with pytest.raises(hsflow.HsflowError, match="was not sent"):
                next(gen)  # the previous ticket must go first
            t.send(hidden_states=np.zeros((T, 2 * H), np.float32))
            assert t.sent
            with pytest.raises(hsflow.HsflowError, match="already sent"):
                t.input_ids
            with pytest.raises(hsflow.HsflowError, match="already sent"):
                t.send()
            a, b = p.next_ticket(), p.next_ticket()
            with pytest.raises(hsflow.HsflowError, match="2 tickets are taken and not sent"):
                p.next_ticket()
            b.send(hidden_states=np.ones((b.n_tokens, 2 * H), np.float32))
            a.send(hidden_states=np.ones((a.n_tokens, 2 * H), np.float32))
            for t in p.tickets():
                t.send()
        seen = ct.join()
        planned = c.stats()["batches_planned"]
    assert len(seen) == len(set(seen)) == planned

@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_python_producer_accepts_torch_tensors_and_gives_a_bf16_staging_tensor(dataset):
    import torch
    data, _ = dataset

    def check(b):
        want = exact_values(b.sample_ids, b.cu_seqlens, b.layers, H)
        assert torch.equal(b.hidden_states.float(), torch.from_numpy(want))

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, arrays="torch") as c:
        ct = ConsumerThread(c, check)
        with producer(c.port, data, arrays="torch") as p:
            for i, t in enumerate(p.tickets()):
                x = torch.from_numpy(exact_values(t.sample_ids, t.cu_seqlens, t.layers, H))
                assert t.hidden.dtype == torch.bfloat16
                assert t.hidden.data_ptr() == t.pointers()["hidden"]
                if i % 3 == 0:
                    t.send(hidden_states=x.to(torch.bfloat16))
                elif i % 3 == 1:
                    t.send(hidden_states=list(x.split(H, dim=1)))  # float32, per layer
                else:
                    t.hidden.copy_(x)
                    t.send()
        seen = ct.join()
    assert len(seen) == len(set(seen)) > 2


def test_fp8_python_producer_quantises_as_every_producer_in_every_form(dataset):
    """hs_dtype='fp8': states given as bf16 bits, as floats written in place
    into `hidden`, and quantised by the caller (hsflow.quantize_fp8, sent with
    quantized=True) all arrive as the consumer's own quantisation of the
    synthetic states (verify_synthetic checks every e4m3 byte and scale), and
    the trainer gets the numpy reference's bytes and scales."""
    from test_consumer import _quantize_rows
    data, _ = dataset

    def check(b):
        q, scale = _quantize_rows(hsflow.synthetic_hidden(b.sample_ids, b.cu_seqlens, b.layers,
                                                          H))
        assert np.array_equal(b.hidden_fp8, q) and np.array_equal(b.hidden_scales, scale)

    forms = []
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, verify_synthetic=True,
                         arrays="numpy", deliver="fp8") as c:
        ct = ConsumerThread(c, check)
        with producer(c.port, data, hs_dtype="fp8") as p:
            for i, t in enumerate(p.tickets()):
                assert t.hs_dtype == "fp8" and t.hidden_fp8.shape == (t.n_tokens, 2 * H)
                assert t.hidden_fp8.ctypes.data != t.hidden.ctypes.data
                want = hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens, t.layers, H)
                forms.append(i % 3)
                if i % 3 == 0:
                    t.send(hidden_states=want)
                elif i % 3 == 1:
                    t.hidden[:] = want
                    t.send()
                else:
                    q, scales = hsflow.quantize_fp8(want)
                    t.hidden_fp8[:] = q
                    t.hidden_scales[:] = scales
                    t.send(quantized=True)
            sent = p.batches_sent
        seen = ct.join()
        s = c.stats()
    assert len(seen) == len(set(seen)) == sent == s["batches_planned"] > 2
    assert set(forms) == {0, 1, 2} and s["checksum_failures"] == 0 and s["finished"]


def test_fp8_python_producer_refuses_a_nan_naming_the_token_and_sends_nothing(dataset):
    data, _ = dataset
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, arrays="numpy") as c:
        with producer(c.port, data, hs_dtype="fp8") as p:
            t = p.next_ticket(timeout=20)
            x = np.zeros((t.n_tokens, 2 * H), np.float32)
            x[t.n_tokens - 1, 3] = np.nan
            with pytest.raises(ValueError, match="token %d .*NaN or infinite" % (t.n_tokens - 1)):
                t.send(hidden_states=x)
            assert not t.sent and p.batches_sent == 0
            with pytest.raises(ValueError, match="in an fp8 run"):
                t.send(hidden_states=x, quantized=True)
    with pytest.raises(ValueError, match="hs_dtype='int4'.*'bf16' or 'fp8'"):
        hsflow.Producer(to="127.0.0.1:1", data=data, token_budget=BUDGET, hidden_size=H,
                        layers=LAYERS, hs_dtype="int4")


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_fp8_quantisation_in_torch_gives_the_librarys_bits(dataset):
    """quantize_fp8_torch (hsflow-produce's on-GPU quantiser; here on the
    CPU) against the library's hs_fp8_quantize_rows: random rows over many
    scales, rows of subnormal e4m3 values, exact ties, zero rows, a row
    whose amax is one value, and a NaN row flagged."""
    import torch
    from hsflow.producer import quantize_fp8_torch
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(257) * 10.0 ** rng.integers(-6, 6) for _ in range(200)]
    rows.append(np.zeros(257))
    tiny = np.zeros(257)
    tiny[0], tiny[1:] = 448.0, rng.integers(-8, 8, 256) * 2.0 ** -9  # e4m3 subnormals
    rows.append(tiny)
    ties = np.full(257, 1.0)
    ties[0], ties[1:] = 448.0, 1.0 + (2 * rng.integers(0, 8, 256) + 1) / 16.0  # halfway codes
    rows.append(ties)
    one = np.zeros(257)
    one[100] = -3.5
    rows.append(one)
    x = hsflow.f32_to_bf16_bits(np.stack(rows).astype(np.float32))
    q_ref, s_ref = hsflow.quantize_fp8(x)
    xt = torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
    q, scales, finite = quantize_fp8_torch(xt)
    assert finite.all()
    assert np.array_equal(scales.numpy(), s_ref)
    diff = np.nonzero(q.numpy() != q_ref)
    assert diff[0].size == 0, "first differences (row, col): %s" % list(zip(*diff))[:5]
    xt = xt.clone()
    xt[7, 5] = float("inf")
    assert quantize_fp8_torch(xt)[2].tolist() == [i != 7 for i in range(len(rows))]


@pytest.mark.parametrize("asked,buffers", [(0, 3), (2, 2)])
def test_a_caller_holds_as_many_batches_as_staging_buffers_three_by_default(
        dataset, asked, buffers):
    # A GPU caller takes batch N+1 before it sends N; with three buffers it
    # can take N+2 while N is still on the wire (docs/pyproducer.md).
    data, _ = dataset

    # the consumer's prefetch counts tickets not yet on the wire: 4 lets this
    # caller hold every buffer's ticket at once
    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=2, verify_synthetic=True,
                         arrays="numpy", prefetch=4) as c:
        ct = ConsumerThread(c, lambda b: None)
        with producer(c.port, data, staging_buffers=asked, prefetch=4) as p:
            bufs = p.staging()
            assert len(bufs) == buffers and len({a for a, _ in bufs}) == buffers
            held = [p.next_ticket(timeout=20) for _ in range(buffers)]
            assert all(t is not None for t in held)
            with pytest.raises(hsflow.HsflowError, match="taken and not sent"):
                p.next_ticket(timeout=1)
            send_held_then_the_rest(p, held)
        ct.join()
        s = c.stats()
    assert s["batches_delivered"] == s["batches_planned"] and s["checksum_failures"] == 0


def test_a_consumer_that_grants_fewer_tickets_than_asked_is_obeyed_and_named(dataset, capfd):
    # The consumer's --prefetch caps what a producer asks: the producer is
    # told at WELCOME and says so, rather than running with fewer batches in
    # flight than its --prefetch without a word.
    data, _ = dataset

    with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, verify_synthetic=True,
                         arrays="numpy", prefetch=2) as c:
        ct = ConsumerThread(c, lambda b: None)
        with producer(c.port, data, prefetch=4) as p:
            held = [p.next_ticket(timeout=20) for _ in range(2)]
            assert all(t is not None for t in held)
            assert p.next_ticket(timeout=1) is None  # a staging buffer is free, no ticket
            send_held_then_the_rest(p, held)
        ct.join()
        s = c.stats()
    assert s["batches_delivered"] == s["batches_planned"] and s["checksum_failures"] == 0
    assert "queues 2 ticket(s) per worker, not the 4 asked (--prefetch)" in capfd.readouterr().err


@pytest.mark.parametrize("bad", [1, 5, True, 2.0])
def test_staging_buffers_outside_two_to_four_are_refused_before_connecting(dataset, bad):
    with pytest.raises(ValueError, match="staging_buffers"):
        producer(1, dataset[0], staging_buffers=bad)


def test_numpy_states_are_sent_without_importing_torch(dataset, tmp_path):
    """numpy states (arrays="numpy") never import torch: a tensor means torch
    is imported already, and the import cost seconds on the first batch
    (the run's first batch waited for it; a slow trainer's test misread it)."""
    pytest.importorskip("torch")  # else torch could not be imported anyway
    data, _ = dataset
    script = tmp_path / "numpy_only.py"
    script.write_text('''
import sys
import hsflow
from conftest import ConsumerThread
with hsflow.Consumer(listen="127.0.0.1:0", cache_gb=0.02, epochs=1, arrays="numpy") as c:
    ct = ConsumerThread(c, lambda b: None)
    with hsflow.Producer(to="127.0.0.1:%%d" %% c.port, data=%r, token_budget=256,
                         hidden_size=32, layers=[0, 2], connect_timeout_s=20,
                         arrays="numpy", target="synthetic") as p:
        for t in p.tickets():
            t.send(hidden_states=hsflow.synthetic_hidden(t.sample_ids, t.cu_seqlens,
                                                         t.layers, 32))
        sent = p.batches_sent
    ct.join()
print("sent", sent, "torch imported", "torch" in sys.modules)
''' % data)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "torch imported False" in r.stdout and "sent 0 " not in r.stdout, r.stdout
