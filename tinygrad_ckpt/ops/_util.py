"""Helpers shared by ops: undo broadcasting, element counts, constants of the right dtype, axes and dtypes checked."""

from __future__ import annotations

import math
import operator

import numpy as np

from .. import backend
from ..backend import unbroadcast, xp  # noqa: F401  (unbroadcast: ops import it from here)
from ..checks import HALF_DTYPES, kind


def numel(shape) -> int:
    return math.prod(shape)


def constant(value, like):
    """A 0-d array holding `value` in the dtype of `like` (so float32 stays float32)."""
    return xp().asarray(value, dtype=like.dtype)


def accumulation_dtype(dtype):
    """The dtype a sum over many elements runs in, as in PyTorch's kernels: float32 for half precision (bfloat16 keeps
    8 bits: 256 + 1 rounds back to 256), a dtype's own otherwise."""
    return np.dtype(np.float32) if dtype in HALF_DTYPES else dtype


def accumulated(method: str, x, axes, keepdims: bool):
    """x.sum or x.mean over `axes`, accumulated in accumulation_dtype(x.dtype) and rounded once to x's dtype."""
    wide = accumulation_dtype(x.dtype)
    if wide == x.dtype:
        return getattr(x, method)(axis=axes, keepdims=keepdims)
    return getattr(x, method)(axis=axes, keepdims=keepdims, dtype=wide).astype(x.dtype)


def check_range(op: str, what: str, values, size: int, of: str, skip=None) -> None:
    """IndexError naming the op and the first value outside [0, size) (values equal to `skip` aside); a
    backend without values (meta) checks nothing."""
    position = backend.current().first_outside(values, size, skip)
    if position is not None:
        value = int(values[position])
        hint = "negative values do not count from the end here" if value < 0 else "check the sizes and the data"
        raise IndexError(f"{op}: {what} {value} at position {list(position)} is outside [0, {size}) ({size} {of}); "
                         f"{hint}.")


def broadcast_shape(op: str, *shapes) -> tuple:
    """NumPy's broadcast result shape, or a ValueError naming the op and the shapes."""
    ndim = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[(1,) * (ndim - len(s)) + tuple(s) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            listed = " and ".join(str(list(s)) for s in shapes)
            raise ValueError(
                f"{op}: shapes {listed} cannot be broadcast together (sizes {sorted(sizes)} meet in one axis); "
                "reshape one input or add a size-1 axis where it should repeat."
            )
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


class AxisError(IndexError, ValueError):
    """An axis out of range or repeated: an IndexError as PyTorch raises, a ValueError as NumPy's AxisError is."""


def axis_of(op: str, axis, shape) -> int:
    """`axis` as an index in [0, ndim), negative ones counted from the end. As in PyTorch a 0-d tensor has one axis
    to name (-1 or 0: the caller decides what it means). Anything else raises, naming the op, the axis and the shape."""
    n = max(len(shape), 1)
    try:
        index = operator.index(axis)
    except TypeError:
        raise TypeError(f"{op}: axis must be an int, got {axis!r}") from None
    if not -n <= index < n:
        raise AxisError(f"{op}: axis {index} is out of range for a tensor of shape {list(shape)} ({len(shape)} "
                        f"dimensions: axes {-n} to {n - 1})")
    return index % n


def axes_of(op: str, axis, shape) -> tuple:
    """The axes a reduction runs over, sorted, from None (all), an int or a sequence of ints (each checked by axis_of,
    none twice); a 0-d tensor has none to run over (its one axis may still be named, as in PyTorch)."""
    if axis is None:
        return tuple(range(len(shape)))
    axes = [axis_of(op, a, shape) for a in (axis if isinstance(axis, (tuple, list)) else (axis,))]
    if len(set(axes)) < len(axes):
        raise AxisError(f"{op}: axis {tuple(axis)} names an axis twice for a tensor of shape {list(shape)}")
    return tuple(sorted(axes)) if shape else ()


def check_float(op: str, *arrays) -> None:
    """TypeError naming the op unless every array is floating point (PyTorch has no integer kernel for the op)."""
    for a in arrays:
        if kind(a.dtype) != "f":
            raise TypeError(f"{op}: needs floating-point input, got dtype {a.dtype} (shape {list(a.shape)}), as in "
                            "PyTorch; convert first, e.g. tg.Tensor(x.numpy().astype(np.float32))")


def causal_mask(t_q: int, t_k: int):
    """Boolean [t_q, t_k] array, True above the diagonal (the future positions to hide). With fewer queries
    than keys the diagonal sits bottom-right (the last query sees every key, as when decoding with cached keys);
    PyTorch's is_causal aligns it top-left (its causal_lower_right bias gives this one)."""
    return xp().triu(xp().ones((t_q, t_k), dtype=bool), k=1 + t_k - t_q)
