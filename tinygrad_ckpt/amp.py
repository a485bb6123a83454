"""Automatic mixed precision: `with tg.autocast("bfloat16"):` (PyTorch's autocast, with its CUDA rules).

Which ops take which dtype is said where each op's function casts its inputs (`ops.autocast_inputs`:
matmul, linear and attention "half"; softmax, log-softmax, layer norm and cross-entropy "float32"); this
module only opens the block. Master weights for half-precision parameters are the optimizers'
(`optim.AdamW(..., master_weights=True)`).
"""

from __future__ import annotations

from .checks import HALF_DTYPES, dtype_of
from .state import patched


def autocast(dtype="bfloat16", enabled: bool = True):
    """PyTorch's automatic mixed precision, with its CUDA rules on every backend: inside the block, matmuls,
    linears and attention run in `dtype` ("bfloat16" or "float16"); softmax, log-softmax, layer norm and
    cross-entropy in float32; other ops in their inputs' dtype. Parameters keep their dtype: each use casts it,
    and the cast is an op on the tape (its gradient comes back in the parameter's dtype). Unlike PyTorch, a cast
    is not cached: a weight used twice in the block is cast twice. This thread only; `enabled=False` turns it
    off inside an enclosing block."""
    if not isinstance(enabled, bool):
        raise TypeError(f"autocast: enabled must be True or False, got {enabled!r}")
    half = dtype_of("autocast", dtype)
    if half not in HALF_DTYPES:
        raise ValueError(f"autocast: dtype must be 'bfloat16' or 'float16' (also 'bf16', 'fp16': the half type "
                         f"matmuls run in), got {dtype!r}")
    return patched(autocast=half if enabled else None)
