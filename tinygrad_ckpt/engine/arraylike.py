"""What a Tensor shares with an array: its shape, dtype, ndim, size and nbytes, its values (`numpy()`, `item()`,
`np.asarray(t)`), `len()`, iteration over the first axis, `bool()` of one value, and its repr.

They are written here so that engine/tensor.py reads as autograd (its data, gradient, tape entry, in-place
changes); `Tensor` takes each of them by name in its body, where its data access belongs, so that the class
lists them in place (help(Tensor), docs/api.md). Each reads only `self.data` (the repr also the autograd fields).
"""

from __future__ import annotations

import math

import numpy as np

from .. import backend


class ArrayLike:
    """The array side of a Tensor: not a base class, a namespace of the members Tensor takes by name."""

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def size(self) -> int:
        return math.prod(self.data.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def numpy(self) -> np.ndarray:
        return backend.current().to_numpy(self.data)

    def item(self) -> float:
        """The one value of a tensor of one element, as a Python number."""
        if self.size != 1:
            raise RuntimeError(f"item(): a Tensor with {self.size} elements (shape {list(self.shape)}) cannot be "
                               "converted to a Python number (PyTorch's rule); index one element first (t[0].item()), "
                               "reduce it (t.sum().item()), or take them all with t.numpy()")
        return self.numpy().item()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:
        if self.size != 1:
            raise RuntimeError(f"Boolean value of a Tensor of shape {list(self.shape)} ({self.size} values) is "
                               "ambiguous, as in PyTorch: use (x == y).numpy().all() or .any(); to find a tensor in a "
                               "list, compare identities (any(t is x for t in ts))")
        return bool(self.item())

    def __array__(self, dtype=None, copy=None):
        """np.asarray(t): the values (PyTorch's tensors convert too)."""
        out = self.numpy()
        return out.astype(dtype) if dtype is not None else out.copy() if copy else out

    def __repr__(self) -> str:
        parts = [f"shape={list(self.shape)}", f"dtype={self.dtype}"]
        if self.name:
            parts.insert(0, f"name={self.name!r}")
        if self.requires_grad:
            parts.append("requires_grad=True")
        if self._entry is not None:
            parts.append(f"from={self._entry.name!r}")
        if self.size <= 8 and backend.current().has_values:
            parts.append(f"data={np.array2string(self.numpy().ravel(), precision=4, separator=', ')}")
        return f"Tensor({', '.join(parts)})"
