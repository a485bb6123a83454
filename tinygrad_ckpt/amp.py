"""Automatic mixed precision: `with tg.autocast("bfloat16"):` (PyTorch's autocast, with its CUDA rules).

Which ops take which dtype is said where each op's function casts its inputs (`ops.autocast_inputs`:
matmul, linear and attention "half"; softmax, log-softmax, layer norm and cross-entropy "float32"); this
module only opens the block. Master weights for half-precision parameters are the optimizers'
(`optim.AdamW(..., master_weights=True)`).
"""

from __future__ import annotations

import numpy as np

from .checks import BFLOAT16, float_dtype
from .state import patched

_HALF = {"bfloat16": BFLOAT16, "bf16": BFLOAT16, "float16": np.dtype(np.float16), "fp16": np.dtype(np.float16)}


def autocast(dtype="bfloat16", enabled: bool = True):
    """PyTorch's automatic mixed precision, with its CUDA rules on every backend: inside the block, matmuls,
    linears and attention run in `dtype` ("bfloat16" or "float16"); softmax, log-softmax, layer norm and
    cross-entropy in float32; other ops in their inputs' dtype. Parameters keep their dtype: each use casts it,
    and the cast is an op on the tape (its gradient comes back in the parameter's dtype). Unlike PyTorch, a cast
    is not cached: a weight used twice in the block is cast twice. This thread only; `enabled=False` turns it
    off inside an enclosing block."""
    if not isinstance(enabled, bool):
        raise TypeError(f"autocast: enabled must be True or False, got {enabled!r}")
    name = dtype if isinstance(dtype, str) else str(np.dtype(dtype)) if float_dtype(dtype) else None
    if name not in _HALF:
        raise ValueError(f"autocast: dtype must be 'bfloat16' or 'float16' (the half type matmuls run in), got "
                         f"{dtype!r}")
    return patched(autocast=_HALF[name] if enabled else None)
