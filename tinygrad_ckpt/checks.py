"""A caller's arguments, checked once for every public entry point that takes them (modules, optimizers, the
ledger): a real number, a floating-point dtype, one of a few names. Each error names the call, the argument,
the value and what it must be."""

from __future__ import annotations

import difflib
import numbers

import ml_dtypes
import numpy as np


def number(x) -> bool:
    """A real number: Python's or NumPy's (np.float32(0.1), np.int64(1)), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


BFLOAT16 = np.dtype(ml_dtypes.bfloat16)  # NumPy has none of its own; ml_dtypes (the JAX team's) adds it


def kind(dtype) -> str:
    """NumPy's kind letter of a dtype ("f" floating, "i" signed, "u" unsigned, "b" bool, "c" complex), with
    bfloat16, a "V" (void) to NumPy, counted as the floating-point type it is."""
    dtype = np.dtype(dtype)
    return "f" if dtype == BFLOAT16 else dtype.kind


FLOAT_NAMES = {"bfloat16": BFLOAT16, "bf16": BFLOAT16, "float16": np.dtype(np.float16), "fp16": np.dtype(np.float16),
               "float32": np.dtype(np.float32), "fp32": np.dtype(np.float32), "float64": np.dtype(np.float64),
               "fp64": np.dtype(np.float64)}  # the names tg.autocast, Tensor.to and Module.to take
HALF_DTYPES = (BFLOAT16, np.dtype(np.float16))  # half precision: 2 bytes, sums and master weights kept in float32
_LISTED = ", ".join(repr(n) for n in FLOAT_NAMES)


def dtype_of(where: str, dtype) -> np.dtype:
    """The dtype `dtype` stands for: a NumPy dtype or type (np.float32, BFLOAT16, "int64") or one of FLOAT_NAMES
    ("bf16", "fp32", ...). TypeError naming the call for anything else, and for a dtype that is not a real number's
    (complex, object: the engine differentiates real tensors only)."""
    if isinstance(dtype, str) and dtype in FLOAT_NAMES:
        return FLOAT_NAMES[dtype]
    try:
        found = np.dtype(dtype) if dtype is not None else None  # np.dtype(None) would be float64
    except (TypeError, ValueError):
        found = None
    if found is None:
        raise TypeError(f"{where}: {dtype!r} is not a dtype; pass a NumPy dtype such as np.float32 or one of {_LISTED}")
    if kind(found) not in "biuf":
        raise TypeError(f"{where}: dtype {found} is not supported (tensors hold real numbers: bool, integers or "
                        f"floating point); pass a NumPy real dtype or one of {_LISTED}")
    return found


def float_dtype(dtype) -> bool:
    """Does `dtype` name a floating-point dtype (np.float32, "float16", "bfloat16")?"""
    try:
        return kind(dtype) == "f"
    except TypeError:
        return False


def one_of(where: str, argument: str, value, valid, none: str | None = None) -> None:
    """ValueError unless `value` is one of the names in `valid` (or None, when `none` says what None means),
    listing them and the closest one: "flops_by_layer: phase must be 'forward', ... or 'optimizer', got 'fwd'
    (did you mean 'forward'?)"."""
    if (value is None and none is not None) or (isinstance(value, str) and value in valid):
        return
    names = [repr(v) for v in valid]
    listed = " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"
    close = []
    if isinstance(value, str) and value:
        close = [v for v in valid if v.startswith(value)] or difflib.get_close_matches(value, valid, n=1, cutoff=0.5)
    raise ValueError(f"{where}: {argument} must be {listed}" + (f", or None ({none})" if none else "")
                     + f", got {value!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
