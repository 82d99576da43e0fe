# SPDX-License-Identifier: Apache-2.0
"""The dtype vocabulary of common/hs_dtype.h, the one the C library parses
and prints: each name with its id (hs_dtype_t, the same numbers as
include/hsflow.h's hs_hidden_dtype_t), bytes per value and bytes per token
row besides the values (fp8's scale). Every Python name of a hidden-state
or weights dtype comes from here; tests/python/test_api.py compiles
common/dtype.c and checks that this table is the C one.

The compute dtypes of hsflow-produce --dtype (bf16, fp16, fp32: torch's)
are another vocabulary, _hf.DTYPES, which C does not have."""
from collections import namedtuple

DType = namedtuple("DType", "id name elem_bytes row_scale_bytes")

BF16 = DType(1, "bf16", 2, 0)
FP8 = DType(2, "fp8", 1, 4)  # float8_e4m3fn values, one fp32 scale per token

TABLE = (BF16, FP8)  # in id order, as hs_dtype_table()
BY_NAME = {d.name: d for d in TABLE}
BY_ID = {d.id: d for d in TABLE}
NAMES = tuple(d.name for d in TABLE)
DEFAULT = BF16.name
# a model's Linear weights (hs_model_weights_t): "auto", then these
WEIGHTS = ("auto",) + NAMES


def names(first=None, sep=", ", last_sep=" or ", quote=""):
    """The names joined as hs_dtype_names() joins them: "bf16 or fp8", or
    "bf16|fp8" with sep = last_sep = "|"; `first` before them ("auto")."""
    items = ([first] if first else []) + [quote + n + quote for n in NAMES]
    if len(items) == 1:
        return items[0]
    return sep.join(items[:-1]) + last_sep + items[-1]
