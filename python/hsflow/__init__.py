# SPDX-License-Identifier: Apache-2.0
"""hsflow: stream the hidden states of a target LLM into a drafter trainer.

Pure-ctypes binding over libhsflow.so (include/hsflow.h):

    import hsflow
    with hsflow.Consumer(listen="0.0.0.0:7000", cache_gb=64, epochs=2) as c:
        for b in c:  # b.hidden_states [T, k*H] bf16, b.input_ids, b.loss_mask, b.cu_seqlens
            ...

    with hsflow.Producer(to="drafter:7000", data="train.hst", token_budget=65536,
                         hidden_size=4096, layers=[2, 16, 29], target="/models/target") as p:
        for t in p.tickets():
            t.send(hidden_states=forward(t.input_ids, t.cu_seqlens))

The library is found through $HSFLOW_LIB, then this package's directory
(pip install ./python builds it and puts it there), then
<repo>/build/libhsflow.so when run from a checkout, then the system library
path.
"""
from ._lib import HsflowError, find_tool, library_path, library_version, status_str
from ._lib import release_version as _release_version
from ._arrays import bf16_bits_to_f32, f32_to_bf16_bits
from .consumer import Batch, Consumer
from .producer import (Producer, Ticket, quantize_fp8, synthetic_target_fingerprint,
                       target_fingerprint)
from .synthetic import synthetic_hidden

# The release: include/hsflow.h's HSFLOW_VERSION_STRING, read from the header
# in a checkout and from the installed distribution's metadata otherwise
# (tests check that the library and every binary say the same).
__version__ = _release_version()
__all__ = ["Consumer", "Batch", "Producer", "Ticket", "HsflowError", "find_tool",
           "library_path", "library_version", "status_str", "f32_to_bf16_bits", "bf16_bits_to_f32",
           "synthetic_hidden", "quantize_fp8", "target_fingerprint",
           "synthetic_target_fingerprint", "__version__"]
