# SPDX-License-Identifier: Apache-2.0
"""The synthetic hidden states of hsflow's test source, in numpy.

Bit-identical to hs_batch_synth_fill (common/region.c): a producer that sends
these lets a consumer started with verify_synthetic=True check every element
end to end. Each value is a finite bf16 in [2^-7, 2)."""
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_STRIDE = 0x9E3


def _splitmix64(state):
    """One splitmix64 step on an array of states; returns (new_state, output)."""
    with np.errstate(over="ignore"):
        state = state + _GOLDEN
        z = state
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return state, z ^ (z >> np.uint64(31))


def _bases(sample_id, layer, positions):
    s = np.full(positions.shape, sample_id, dtype=np.uint64)
    _, x = _splitmix64(s)
    s = x ^ ((np.uint64(layer & 0xFFFFFFFF) << np.uint64(32)) | positions.astype(np.uint64))
    _, y = _splitmix64(s)
    return (y >> np.uint64(32)).astype(np.uint32)


def synthetic_hidden(sample_ids, cu_seqlens, layers, hidden_size):
    """[T, k*H] uint16 (bf16 bits) for a batch described by its sample ids,
    cu_seqlens and captured layers."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    layers = [int(x) for x in layers]
    T, H, k = int(cu[-1]), int(hidden_size), len(layers)
    out = np.empty((T, k * H), dtype=np.uint16)
    ch = np.arange(H, dtype=np.uint32) * np.uint32(_STRIDE)
    for s, sid in enumerate(np.asarray(sample_ids, dtype=np.uint64)):
        lo, hi = int(cu[s]), int(cu[s + 1])
        if hi <= lo:
            continue
        pos = np.arange(hi - lo, dtype=np.uint32)
        for j, layer in enumerate(layers):
            base = _bases(sid, layer, pos)
            vals = (base[:, None] + ch[None, :]) & np.uint32(0x3FF)
            out[lo:hi, j * H:(j + 1) * H] = (vals | np.uint32(0x3C00)).astype(np.uint16)
    return out
