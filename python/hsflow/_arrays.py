# SPDX-License-Identifier: Apache-2.0
"""Zero-copy array views over library memory, and bf16 conversions.

Host memory becomes numpy arrays (np.ctypeslib.as_array over the C pointer:
no copy) and, when torch is wanted, torch tensors sharing that memory. Device
memory becomes torch tensors through __cuda_array_interface__. bf16 travels
as its 16 raw bits (numpy has no bf16 type): uint16 in numpy, reinterpreted
as torch.bfloat16 in torch.
"""
import ctypes

import numpy as np

_torch = None
_torch_checked = False


def torch_module():
    """torch if it can be imported, else None (imported once, lazily)."""
    global _torch, _torch_checked
    if not _torch_checked:
        _torch_checked = True
        try:
            import torch  # noqa: F401
            _torch = torch
        except ImportError:
            _torch = None
    return _torch


def resolve_arrays(arrays):
    """'auto' -> 'torch' when torch imports, else 'numpy'."""
    if arrays not in ("auto", "numpy", "torch"):
        raise ValueError("arrays=%r: expected 'auto', 'numpy' or 'torch'" % (arrays,))
    if arrays == "auto":
        return "torch" if torch_module() is not None else "numpy"
    if arrays == "torch" and torch_module() is None:
        raise ValueError("arrays='torch' but torch cannot be imported; install PyTorch "
                         "or use arrays='numpy'")
    return arrays


_CTYPE = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint8): ctypes.c_uint8,
          np.dtype(np.uint16): ctypes.c_uint16, np.dtype(np.uint64): ctypes.c_uint64,
          np.dtype(np.int16): ctypes.c_int16, np.dtype(np.float32): ctypes.c_float}


def host_view(ptr, shape, dtype, writable):
    """A numpy array over `ptr` (no copy). An empty shape gives an empty array."""
    dtype = np.dtype(dtype)
    if any(s == 0 for s in shape):
        return np.empty(shape, dtype)
    if not ptr:
        raise ValueError("null pointer for a non-empty array")
    a = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(_CTYPE[dtype])), shape=shape)
    if not writable:
        a.flags.writeable = False
    return a


def torch_from_host(arr):
    """A torch tensor sharing a numpy array's memory. uint16 arrays are bf16
    bits and come back as torch.bfloat16; uint64 as int64 (same bits)."""
    torch = torch_module()
    if arr.dtype == np.uint16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    if arr.dtype == np.uint64:
        return torch.from_numpy(arr.view(np.int64))
    return torch.from_numpy(arr)


class CudaArray:
    """Device memory described by __cuda_array_interface__ (version 3); torch,
    cupy and numba can wrap it without a copy."""

    def __init__(self, ptr, shape, typestr, readonly, owner=None):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (int(ptr or 0), bool(readonly)),
            "version": 3, "strides": None, "stream": None}
        self._owner = owner  # keeps whatever owns the memory alive


_TYPESTR = {np.dtype(np.int32): "<i4", np.dtype(np.uint8): "|u1",
            np.dtype(np.uint16): "<i2", np.dtype(np.uint64): "<i8",
            np.dtype(np.float32): "<f4"}


def device_view(ptr, shape, dtype, gpu, want_torch, owner=None):
    """A view of device memory: a torch tensor on cuda:gpu (bf16 for uint16
    data) when torch is wanted, else a CudaArray."""
    dtype = np.dtype(dtype)
    ca = CudaArray(ptr, shape, _TYPESTR[dtype], readonly=False, owner=owner)
    if not want_torch:
        return ca
    torch = torch_module()
    t = torch.as_tensor(ca, device="cuda:%d" % gpu)
    if dtype == np.uint16:
        t = t.view(torch.bfloat16)
    return t


def f32_to_bf16_bits(x, out=None):
    """float32 -> bf16 bits (uint16) with round-to-nearest-even; NaN stays
    NaN (quiet), infinities stay infinities. Works in row chunks so the
    temporaries stay small."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is not None and not out.flags.c_contiguous:
        out[...] = f32_to_bf16_bits(x)
        return out
    if out is None:
        out = np.empty(x.shape, np.uint16)
    flat_in = x.reshape(-1)
    flat_out = out.reshape(-1)
    step = 1 << 22
    for lo in range(0, flat_in.size, step):
        u = flat_in[lo:lo + step].view(np.uint32)
        r = (u + (((u >> 16) & 1) + np.uint32(0x7FFF))) >> 16
        nan = (u & 0x7FFFFFFF) > 0x7F800000
        if nan.any():
            r = np.where(nan, (u >> 16) | 0x0040, r)
        flat_out[lo:lo + step] = r.astype(np.uint16)
    return out


def bf16_bits_to_f32(bits):
    """bf16 bits (uint16) -> float32, exact."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)
