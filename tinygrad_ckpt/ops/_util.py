"""Helpers shared by ops: undo broadcasting, element counts, constants of the right dtype."""

from __future__ import annotations

import math

from ..backend import xp


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the adjoint of NumPy broadcasting (leading axes, then size-1 axes)."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    extra = len(grad.shape) - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    grad = grad.sum(axis=axes, keepdims=True) if axes else grad
    return grad.reshape(shape)


def numel(shape) -> int:
    return math.prod(shape)


def constant(value, like):
    """A 0-d array holding `value` in the dtype of `like` (so float32 stays float32)."""
    return xp().asarray(value, dtype=like.dtype)


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
