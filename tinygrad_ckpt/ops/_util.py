"""Helpers shared by ops: undo broadcasting, element counts, constants of the right dtype."""

from __future__ import annotations

import math

from .. import backend
from ..backend import unbroadcast, xp  # noqa: F401  (unbroadcast: ops import it from here)


def numel(shape) -> int:
    return math.prod(shape)


def constant(value, like):
    """A 0-d array holding `value` in the dtype of `like` (so float32 stays float32)."""
    return xp().asarray(value, dtype=like.dtype)


def check_range(op: str, what: str, values, size: int, of: str, skip=None) -> None:
    """IndexError naming the op and the first value outside [0, size) (values equal to `skip` aside); a
    backend without values (meta) checks nothing."""
    if not backend.current().has_values or values.size == 0:
        return
    bad = (values < 0) | (values >= size)
    if skip is not None:
        bad &= values != skip
    if bool(bad.any()):
        position = tuple(int(i) for i in xp().argwhere(bad)[0])
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
