"""The NumPy backend, and the interface every backend follows (the others subclass this one)."""

from __future__ import annotations

import numpy as np

from ..checks import kind
from .erf import erf_float32

_vecdot = getattr(np, "vecdot", None)  # NumPy >= 2.0


class Backend:
    """A backend: its name, its array namespace `xp`, and the few things that differ between libraries."""

    name = "numpy"
    array_type = np.ndarray  # what its arrays are (exactly: not a subclass)
    has_values = True  # arrays hold numbers (the meta backend's hold only shapes): value checks can run

    def __init__(self):
        self.xp = np

    def is_array(self, a) -> bool:
        return isinstance(a, np.ndarray)

    def buffer(self, a):
        """(owner, nbytes) of the memory behind `a`: views resolve to the array that owns the data."""
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a, a.nbytes

    def as_array(self, a):
        """`a` as an array of this backend: a NumPy scalar (what NumPy returns for a 0-d result) becomes a 0-d
        array, which holds bytes the ledger counts, as PyTorch's 0-d tensors do; anything else is returned as is."""
        return np.asarray(a) if isinstance(a, np.generic) else a

    def any_scalar(self, values) -> bool:
        """Is any of these a NumPy scalar (which `as_array` turns into a 0-d array)?"""
        return any(isinstance(v, np.generic) for v in values)

    def owns_data(self, a) -> bool:
        """True if `a` is a writeable array owning its memory (not a view or a broadcast)."""
        return a.base is None and a.flags.writeable

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def asarray(self, data, dtype=None):
        return np.asarray(data, dtype=dtype)

    def erf(self, x):
        """erf: a float32 rational approximation (erf.py, within 1e-7) for float32, SciPy otherwise."""
        if x.dtype == np.float32:
            return erf_float32(x)
        from scipy.special import erf

        return erf(x)

    def matmul(self, a, b):
        """a @ b in the operands' dtype: ml_dtypes' bfloat16 product comes back in float32, where it was summed
        (as a GPU's tensor cores sum), and is rounded to bfloat16 here, as PyTorch returns it."""
        out = a @ b
        return out if out.dtype == a.dtype else out.astype(a.dtype)

    def row_sums(self, a):
        """Σ over the last axis, kept as [..., 1]. On a short contiguous axis NumPy's add.reduce loops per row
        (30 µs on [512, 256] float32 here); einsum's sum-of-products loop takes 11 µs. Each row is summed the
        same way whatever rows surround it, so blocks of rows give the same bits. float16 sums in float32."""
        if self.xp is not np:
            return a.sum(axis=-1, keepdims=True)
        if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
            return np.einsum("...i->...", a)[..., None]
        return a.sum(axis=-1, keepdims=True, dtype=np.float32 if kind(a.dtype) == "f" else None)

    def row_dots(self, a, b):
        """Σ a·b over the last axis, kept as [..., 1], with no temporary for the products (NumPy's vecdot: one
        dot product per row; einsum on NumPy 1.x)."""
        if self.xp is not np or kind(a.dtype) != "f" or a.dtype.itemsize < 4:
            return self.row_sums(a * b)
        if _vecdot is None:
            return np.einsum("...i,...i->...", a, b)[..., None]
        return _vecdot(a, b)[..., None]

    def scatter_add_rows(self, target, ids, rows) -> None:
        """target[ids[k]] += rows[k] for every k, repeated ids summed (NumPy's add.at: in order, exactly)."""
        self.xp.add.at(target, ids, rows)

    # ---- what ops read from values; the meta backend, which holds none, answers with what it assumes ----
    def from_host(self, make, shape, dtype):
        """The array `make()` computes with NumPy (of that shape and dtype: a table, an index pattern), here."""
        return self.asarray(make())

    def count_nonzero_or(self, mask, otherwise: int) -> int:
        """How many elements of `mask` are true (meta: `otherwise`)."""
        return int(mask.sum())

    def nonzero_or_none(self, mask):
        """The flat indices where `mask` is true, or None where there are none (meta: None)."""
        where = self.xp.flatnonzero(mask)
        return where if where.size else None

    def first_outside(self, values, size: int, skip=None):
        """The position (a tuple) of the first value outside [0, size), values equal to `skip` aside, or None
        (meta: None)."""
        bad = (values < 0) | (values >= size)
        if skip is not None:
            bad &= values != skip
        return tuple(int(i) for i in self.xp.argwhere(bad)[0]) if values.size and bool(bad.any()) else None

    def top_k_indices(self, p, k: int):
        """Each row's k largest entries' indices [N, k], largest first (ties: the lower index), a new array
        (meta: zeros)."""
        order = self.xp.argsort(-p, axis=1, kind="stable")
        return self.xp.ascontiguousarray(order[:, :k])

    def positions_of_each(self, indices, n: int) -> list:
        """Per value v in 0..n-1, the flat positions (ascending, int) where `indices` holds v (meta: the counts of
        a round robin, ops.moe.balanced_indices)."""
        flat = indices.reshape(-1)
        return [self.xp.flatnonzero(flat == v) for v in range(n)]

    def generator(self, seed: int, counter: int, *keys: int):
        """A generator for draw `counter` of `seed`; `keys` pick one piece of that draw (next_stream)."""
        return np.random.default_rng([seed, counter, *keys])

    def synchronize(self):
        pass
