"""The "meta" backend: arrays with a shape and a dtype but no data.

Like PyTorch's meta device, `tg.use_backend("meta")` runs the engine without computing anything: every
operation works out only what NumPy would hand back (the shape, the dtype, the memory layout, whether the
result is a view of an existing buffer or a new one, an array or a NumPy scalar). That is all the ledger needs,
so a meta run records the same allocations, saves, releases and FLOPs as a NumPy run: the seed's 7B model
trains for one step in seconds and a few megabytes (`tinygrad-ckpt estimate`).

Only the part of NumPy that the engine calls is here; a missing function raises AttributeError rather than
guessing. NumPy's rules for views (`MetaArray.base`), strides and 0-d scalars (`MetaScalar`) are copied
because the ledger's numbers depend on them; result dtypes are NumPy's own, asked on empty arrays. Anything
that needs a value (`bool(a)`, `.item()`, a boolean-mask index) raises `NoDataError`. The rules in full:
docs/house.md.
"""

from __future__ import annotations

import math
import weakref
from functools import cache
from types import SimpleNamespace

import numpy as np

from .numpy_backend import Backend

__all__ = ["MetaArray", "MetaScalar", "MetaBackend", "MetaGenerator", "NoDataError", "xp"]


class NoDataError(RuntimeError):
    """A value was asked of a meta array, which has a shape and a dtype but no data."""


def _no_data(what: str):
    return NoDataError(
        f"{what}: meta arrays carry a shape and a dtype but no values (tg.use_backend('meta') is for "
        "counting memory and FLOPs). Switch back with tg.use_backend('numpy') to compute values."
    )


# ---- layout helpers (strides in bytes, as NumPy's) -------------------------------------------
def _fmt_shape(shape) -> str:
    """(2,3) and (3,) as NumPy writes shapes in its error messages."""
    return "(" + ",".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _c_strides(shape, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _is_c_contiguous(shape, strides, itemsize: int) -> bool:
    if 0 in shape:
        return True
    expected = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def _strides_in(a, shape) -> tuple:
    """a's strides seen from a result of `shape` it broadcasts into (0 where it repeats)."""
    pad = len(shape) - a.ndim
    return (0,) * pad + tuple(0 if n == 1 else s for n, s in zip(a.shape, a.strides))


def _order_strides(shape, itemsize: int, operand_strides=()) -> tuple:
    """Strides of a new array laid out in NumPy's order "K" (the nditer's axis ordering).

    Axes are sorted from fastest to slowest by the operands' strides (a stable insertion sort that
    starts from C order; operands that disagree leave C order; broadcast axes do not vote).
    """
    ndim = len(shape)
    perm = list(range(ndim - 1, -1, -1))  # fastest axis first
    for i0 in range(1, ndim):
        ax0, pos = perm[i0], i0
        for i1 in range(i0 - 1, -1, -1):
            ax1, ambiguous, swap = perm[i1], True, False
            for st in operand_strides:
                if st[ax0] != 0 and st[ax1] != 0:
                    if abs(st[ax1]) <= abs(st[ax0]):
                        swap = False
                    elif ambiguous:
                        swap = True
                    ambiguous = False
            if not ambiguous:
                if swap:
                    pos = i1
                else:
                    break
        if pos != i0:
            perm.insert(pos, perm.pop(i0))
    strides, step = [0] * ndim, itemsize
    for ax in perm:
        strides[ax] = step
        step *= shape[ax]
    return tuple(strides)


def _broadcast(shapes) -> tuple:
    shaped = [s for s in shapes if s]
    if all(s == shaped[0] for s in shaped[1:]):  # equal shapes and scalars: no rule to apply
        return tuple(shaped[0]) if shaped else ()
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " ".join(_fmt_shape(s) for s in shapes)
        raise ValueError(f"operands could not be broadcast together with shapes {listed} ") from None


def _broadcasts_to(shape, target) -> bool:
    try:
        return tuple(np.broadcast_shapes(shape, target)) == tuple(target)
    except ValueError:
        return False


def _axes(axis, ndim: int) -> tuple:
    """Normalised, sorted axes (NumPy's AxisError when out of range)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(int(a), ndim)
    out = sorted(int(a) % ndim for a in axes)
    if len(set(out)) != len(out):
        raise ValueError("duplicate value in 'axis'")
    return tuple(out)


def _shape_arg(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(n) for n in shape)


# ---- dtypes: ask NumPy, on empty arrays --------------------------------------------------------
_SCALARS = (np.generic, bool, int, float, complex)  # operands that mix with meta arrays


@cache
def _resolve(fn, keys: tuple, out_dtype=None) -> np.dtype:
    """The dtype NumPy gives `fn(*operands)`; raises what NumPy raises (e.g. bool subtract).

    `keys` are the arrays' dtypes (probed with empty arrays) and the other operands' types (probed
    with a zero of that type: a Python number stays "weak" under NEP 50, a NumPy scalar does not).
    """
    args = [np.empty(0, dtype=k) if isinstance(k, np.dtype) else k(0) for k in keys]
    if out_dtype is not None:
        return fn(*args, out=np.empty(0, dtype=out_dtype)).dtype
    return np.asarray(fn(*args)).dtype


def _check_operand(x, op: str) -> None:
    if isinstance(x, np.ndarray):
        raise TypeError(
            f"{op}: cannot mix a NumPy array (shape {list(x.shape)}) with meta arrays; create it on the meta "
            "backend (tg.use_backend('meta') before creating tensors, or backend.current().asarray(x))."
        )
    if not isinstance(x, (MetaArray, *_SCALARS)):
        raise TypeError(f"{op}: unsupported operand of type {type(x).__name__} for a meta array")


def _elementwise(fn, args, out=None, name=None, scalar_result=True):
    """Shape, dtype and layout of an elementwise NumPy call (a ufunc, `where`, scipy's erf)."""
    name = name or fn.__name__
    for a in args:
        _check_operand(a, name)
    shape = _broadcast([a.shape if isinstance(a, MetaArray) else () for a in args])
    keys = tuple(a.dtype if isinstance(a, MetaArray) else type(a) for a in args)
    if out is not None:
        if out._readonly:
            raise ValueError("output array is read-only")
        if not _broadcasts_to(shape, out.shape):
            raise ValueError(
                f"non-broadcastable output operand with shape {_fmt_shape(out.shape)} doesn't match "
                f"the broadcast shape {_fmt_shape(shape)}"
            )
        _resolve(fn, keys, out.dtype)
        return out
    dtype = _resolve(fn, keys)
    if not shape and scalar_result:
        return MetaScalar(dtype)
    metas = [a for a in args if isinstance(a, MetaArray) and a.ndim]
    if all(a.shape == shape and _is_c_contiguous(a.shape, a.strides, a.itemsize) for a in metas):
        return MetaArray(shape, dtype)  # every operand in C order: NumPy's order "K" is C order too
    return MetaArray(shape, dtype, _order_strides(shape, dtype.itemsize, [_strides_in(a, shape) for a in metas]))


@cache
def _reduced_dtype(method: str, dtype: np.dtype, out_dtype=None) -> np.dtype:
    kwargs = {} if out_dtype is None else {"dtype": out_dtype}  # sum(dtype=...): accumulate in, and give, that dtype
    return getattr(np.zeros(1, dtype=dtype), method)(**kwargs).dtype


# ---- the arrays --------------------------------------------------------------------------------
def _operand(x) -> bool:
    """What the operators take: meta arrays, numbers, and NumPy arrays (refused by _check_operand)."""
    return isinstance(x, (MetaArray, np.ndarray, *_SCALARS))


def _binary(ufunc):
    """The forward, reflected and in-place operators of a ufunc."""

    def forward(self, other):
        return _elementwise(ufunc, (self, other)) if _operand(other) else NotImplemented

    def reflected(self, other):
        return _elementwise(ufunc, (other, self)) if _operand(other) else NotImplemented

    def inplace(self, other):
        if not _operand(other):
            return NotImplemented
        if isinstance(self, MetaScalar):  # NumPy scalars are immutable: `s += 1` rebinds
            return _elementwise(ufunc, (self, other))
        return _elementwise(ufunc, (self, other), out=self)

    return forward, reflected, inplace


class MetaArray:
    """An array that has a shape, a dtype and strides, but no data.

    `base` is None for an array that owns its (imaginary) buffer, and the owner for a view; the
    backend counts a view by its owner's bytes, and a view keeps its owner alive, as in NumPy.
    """

    __slots__ = ("shape", "dtype", "strides", "base", "_readonly", "__weakref__")
    __array_ufunc__ = None  # NumPy operators defer to ours (which refuse NumPy arrays)
    __hash__ = None  # like ndarray: == is elementwise

    def __init__(self, shape, dtype, strides=None, base=None, readonly=False):
        self.shape = _shape_arg(shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(strides) if strides is not None else _c_strides(self.shape, self.dtype.itemsize)
        self.base = base
        self._readonly = readonly

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    T = property(lambda self: self.transpose())

    @property
    def flags(self):
        """ndarray.flags as far as it is read: writeable (by Backend.owns_data) and owndata."""
        return SimpleNamespace(owndata=self.base is None, writeable=not self._readonly)

    def _view(self, shape, strides, readonly=None) -> MetaArray:
        owner = self.base if self.base is not None else self
        return MetaArray(shape, self.dtype, strides, owner, self._readonly if readonly is None else readonly)

    def __repr__(self) -> str:
        view = ", view" if self.base is not None else ""
        return f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}{view})"

    # ---- what needs data -------------------------------------------------------------------
    def _needs_values(self, *args, **kwargs):
        raise _no_data("bool(), int(), float() or .item() of a meta array")

    __bool__ = __int__ = __float__ = __index__ = item = _needs_values

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "a meta array has no data to convert to NumPy; to get values, run on tg.use_backend('numpy')"
        )

    # ---- arithmetic ------------------------------------------------------------------------
    __add__, __radd__, __iadd__ = _binary(np.add)
    __sub__, __rsub__, __isub__ = _binary(np.subtract)
    __mul__, __rmul__, __imul__ = _binary(np.multiply)
    __truediv__, __rtruediv__, __itruediv__ = _binary(np.true_divide)
    __floordiv__, __rfloordiv__, __ifloordiv__ = _binary(np.floor_divide)
    __mod__, __rmod__, __imod__ = _binary(np.remainder)
    __pow__, __rpow__, __ipow__ = _binary(np.power)
    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = (
        _binary(f)[0] for f in (np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal))

    def __neg__(self):
        return _elementwise(np.negative, (self,))

    def __matmul__(self, other):
        return _matmul(self, other) if isinstance(other, (MetaArray, np.ndarray)) else NotImplemented

    # ---- reductions ------------------------------------------------------------------------
    def _reduce(self, method, axis, keepdims, dtype=None):
        axes = _axes(axis, self.ndim)
        dtype = _reduced_dtype(method, self.dtype, None if dtype is None else np.dtype(dtype))
        kshape = tuple(1 if i in axes else n for i, n in enumerate(self.shape))
        keep = range(self.ndim) if keepdims else [i for i in range(self.ndim) if i not in axes]
        if not keep:
            return MetaScalar(dtype)
        strides = _order_strides(kshape, dtype.itemsize, [_strides_in(self, kshape)])
        return MetaArray(tuple(kshape[i] for i in keep), dtype, tuple(strides[i] for i in keep))

    def sum(self, axis=None, keepdims=False, dtype=None):
        return self._reduce("sum", axis, keepdims, dtype)

    def mean(self, axis=None, keepdims=False, dtype=None):
        return self._reduce("mean", axis, keepdims, dtype)

    def max(self, axis=None, keepdims=False):
        return self._reduce("max", axis, keepdims)

    def argmax(self, axis=None):
        """A new C-ordered index array (NumPy moves the axis last and fills a fresh result)."""
        intp = np.dtype(np.intp)
        if axis is None:
            return MetaScalar(intp)
        (ax,) = _axes(axis, self.ndim)
        shape = self.shape[:ax] + self.shape[ax + 1:]
        return MetaArray(shape, intp) if shape else MetaScalar(intp)

    # ---- copies ----------------------------------------------------------------------------
    def astype(self, dtype, copy=True):
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        return MetaArray(self.shape, dtype, _order_strides(self.shape, dtype.itemsize, [self.strides]))

    def copy(self):
        return MetaArray(self.shape, self.dtype)

    # ---- movement (views) ------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return _reshape(self, _shape_arg(shape))

    def transpose(self, *axes):
        if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = () if axes[0] is None else tuple(axes[0])
        perm = [_axes(a, self.ndim)[0] for a in axes] or list(range(self.ndim - 1, -1, -1))
        if sorted(perm) != list(range(self.ndim)):
            raise ValueError("axes don't match array")
        return self._view(tuple(self.shape[a] for a in perm), tuple(self.strides[a] for a in perm))

    def swapaxes(self, axis1, axis2):
        (a1,), (a2,) = _axes(axis1, self.ndim), _axes(axis2, self.ndim)
        order = list(range(self.ndim))
        order[a1], order[a2] = a2, a1
        return self.transpose(order)

    def squeeze(self, axis):
        axes = _axes(axis, self.ndim)
        if any(self.shape[a] != 1 for a in axes):
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
        if not axes:
            return self  # NumPy returns the array itself when there is nothing to squeeze
        keep = [i for i in range(self.ndim) if i not in axes]
        return self._view(tuple(self.shape[i] for i in keep), tuple(self.strides[i] for i in keep))

    # ---- indexing --------------------------------------------------------------------------
    def __getitem__(self, index):
        return _getitem(self, index)

    def __setitem__(self, index, value) -> None:
        """Assignment changes values only: check what NumPy checks, then do nothing."""
        _check_operand(value, "setitem")
        if self._readonly:
            raise ValueError("assignment destination is read-only")
        target = self[index].shape
        vshape = tuple(getattr(value, "shape", ()))
        while len(vshape) > len(target) and vshape[0] == 1:
            vshape = vshape[1:]
        if not _broadcasts_to(vshape, target):
            raise ValueError(
                f"could not broadcast input array from shape {_fmt_shape(vshape)} into shape {_fmt_shape(target)}"
            )


def _as_0d_array(name):
    """A NumPy scalar's method: the 0-d array's method, its 0-d results made scalars again."""

    def method(self, *args, **kwargs):
        out = getattr(MetaArray((), self.dtype), name)(*args, **kwargs)
        return out if out.shape else MetaScalar(out.dtype)

    return method


class MetaScalar(MetaArray):
    """What NumPy returns as a scalar (np.float32(…)): 0-d, immutable, not an array to the engine."""

    __slots__ = ()

    def __init__(self, dtype):
        super().__init__((), dtype, readonly=True)


for _name in ("astype", "copy", "reshape", "squeeze", "transpose"):
    setattr(MetaScalar, _name, _as_0d_array(_name))


# ---- reshape: NumPy's no-copy rule ---------------------------------------------------------------
def _fix_shape(shape: tuple, size: int) -> tuple:
    unknown = [i for i, n in enumerate(shape) if n == -1]
    known = math.prod(n for n in shape if n != -1)
    if len(unknown) > 1 or any(n < -1 for n in shape):
        raise ValueError(f"invalid shape {_fmt_shape(shape)}: one -1 at most, and no other negative sizes")
    if unknown and known and size % known == 0:
        shape = tuple(size // known if n == -1 else n for n in shape)
    elif unknown or known != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {_fmt_shape(shape)}")
    return shape


def _nocopy_strides(shape, strides, newshape, itemsize):
    """NumPy's _attempt_nocopy_reshape (C order): strides for a view, or None if a copy is needed."""
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    olddims, oldstrides = [n for n, _ in old], [s for _, s in old]
    newstrides = [0] * len(newshape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(newshape) and oi < len(olddims):
        np_, op = newshape[ni], olddims[oi]
        while np_ != op:
            if np_ < op:
                np_ *= newshape[nj]
                nj += 1
            else:
                op *= olddims[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if oldstrides[ok] != olddims[ok + 1] * oldstrides[ok + 1]:
                return None
        newstrides[nj - 1] = oldstrides[oj - 1]
        for nk in range(nj - 1, ni, -1):
            newstrides[nk - 1] = newstrides[nk] * newshape[nk]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = newstrides[ni - 1] if ni >= 1 else itemsize
    for nk in range(ni, len(newshape)):
        newstrides[nk] = last
    return tuple(newstrides)


def _reshape(a: MetaArray, shape: tuple) -> MetaArray:
    shape = _fix_shape(shape, a.size)
    if a.size == 0 or _is_c_contiguous(a.shape, a.strides, a.itemsize):
        return a._view(shape, _c_strides(shape, a.itemsize))
    strides = _nocopy_strides(a.shape, a.strides, shape, a.itemsize)
    if strides is None:  # NumPy copies into a C-ordered array of the old shape and views that
        return MetaArray(a.shape, a.dtype)._view(shape, _c_strides(shape, a.itemsize))
    return a._view(shape, strides)


# ---- matmul ------------------------------------------------------------------------------------
def _matmul(a, b):
    for x in (a, b):
        _check_operand(x, "matmul")
        if x.ndim == 0:
            raise ValueError("matmul: an input operand is 0-d (it needs at least 1 dimension)")
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
            f"(n?,k),(k,m?)->(n?,m?) (size {b_shape[-2]} is different from {a_shape[-1]})"
        )
    batch = _broadcast([a_shape[:-2], b_shape[:-2]])
    dtype = _resolve(np.matmul, (a.dtype, b.dtype))
    full = batch + (a_shape[-2], b_shape[-1])
    # loop (batch) axes follow the inputs' memory order; the core axes stay innermost, C-ordered
    votes = []
    for x in (a, b):
        if x.ndim > 2:
            pad = (0,) * (len(batch) - (x.ndim - 2))
            votes.append(pad + tuple(0 if n == 1 else s for n, s in zip(x.shape[:-2], x.strides[:-2])) + (0, 0))
    strides = _order_strides(full, dtype.itemsize, votes)
    keep = [i for i in range(len(full)) if not (
        (a.ndim == 1 and i == len(full) - 2) or (b.ndim == 1 and i == len(full) - 1))]
    shape = tuple(full[i] for i in keep)
    if not shape:
        return MetaScalar(dtype)
    return MetaArray(shape, dtype, tuple(strides[i] for i in keep))


# ---- indexing ----------------------------------------------------------------------------------
def _classify(item):
    """One index entry as (kind, info): kind in new, ellipsis, slice, int, array."""
    if item is None:
        return "new", None
    if item is Ellipsis:
        return "ellipsis", None
    if isinstance(item, slice):
        return "slice", item
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        return "int", int(item)
    if isinstance(item, MetaArray) and item.dtype.kind in "iu":
        return ("int", None) if item.ndim == 0 else ("array", item.shape)
    if isinstance(item, MetaArray) and item.dtype.kind == "b":
        raise _no_data("indexing with a boolean meta array (how many elements it selects)")
    raise IndexError(
        "meta arrays take integers, slices (`:`), ellipsis (`...`), None and integer meta arrays as indices"
    )


def _getitem(a: MetaArray, index):
    """a[index]: a view (basic indexing), a scalar (an integer per axis) or a new array (advanced).

    Advanced indexing gets NumPy's layout: NumPy fills a new buffer with the indexed axes outermost
    (C order) and the other axes in their source order, and returns a transposed view of it when
    the indexed axes were adjacent but not first.
    """
    items = [_classify(i) for i in (index if isinstance(index, tuple) else (index,))]
    expanded = _expanded(a, items)
    advanced = any(k == "array" for k, _ in expanded)

    dim, shape, strides = 0, [], []  # the basic (slice / newaxis) axes of the result
    adv_pos, adv_shapes, basic_before = [], [], 0
    for pos, (k, info) in enumerate(expanded):
        if k == "new":
            shape.append(1)
            strides.append(0)
        elif k == "slice":
            shape.append(len(range(*info.indices(a.shape[dim]))))
            strides.append(a.strides[dim] * (info.step or 1))
            dim += 1
        else:  # an integer or an integer array
            n = a.shape[dim]
            if k == "int" and info is not None and not -n <= info < n:
                raise IndexError(f"index {info} is out of bounds for axis {dim} with size {n}")
            if advanced:  # with an array present, integers are indices to broadcast too
                adv_pos.append(pos)
                adv_shapes.append(() if k == "int" else info)
            dim += 1
        if not adv_pos:
            basic_before = len(shape)
    if not advanced:
        if not shape and all(k == "int" for k, _ in items):
            return MetaScalar(a.dtype)
        return a._view(tuple(shape), tuple(strides))
    return _advanced_result(a, tuple(shape), tuple(strides), adv_shapes, adv_pos, basic_before)


def _expanded(a: MetaArray, items: list) -> list:
    """The classified index items with the ellipsis (or the end) filled by full slices: one item per axis of
    `a`, plus any newaxis."""
    consumed = sum(k in ("slice", "int", "array") for k, _ in items)
    ellipses = [i for i, (k, _) in enumerate(items) if k == "ellipsis"]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > a.ndim:
        raise IndexError(f"too many indices for array: array is {a.ndim}-dimensional, but {consumed} were indexed")
    fill = [("slice", slice(None))] * (a.ndim - consumed)
    at = ellipses[0] if ellipses else len(items)
    return items[:at] + fill + items[at + 1:]


def _advanced_result(a: MetaArray, sub_shape: tuple, sub_strides: tuple, adv_shapes: list, adv_pos: list,
                     basic_before: int):
    """The new buffer of an advanced index in NumPy's layout (see _getitem): the broadcast indexed axes outermost,
    then the basic axes, transposed back when the indexed axes were adjacent but not first."""
    bshape = _broadcast(adv_shapes)
    inner = _order_strides(sub_shape, a.itemsize, [sub_strides])
    block = a.itemsize * math.prod(sub_shape)
    buf_shape = bshape + sub_shape
    buf_strides = tuple(s * block for s in _c_strides(bshape, 1)) + inner
    adjacent = adv_pos == list(range(adv_pos[0], adv_pos[0] + len(adv_pos)))
    buf = MetaArray(buf_shape, a.dtype, buf_strides)
    if not (adjacent and basic_before):
        return buf
    nb = len(bshape)
    return buf.transpose([*range(nb, nb + basic_before), *range(nb), *range(nb + basic_before, len(buf_shape))])


# ---- the array namespace: what the engine calls as xp().name ------------------------------------
def asarray(a, dtype=None):
    """A new meta array with the shape and dtype of a NumPy array, list or number."""
    if isinstance(a, np.ndarray):
        return MetaArray(a.shape, a.dtype if dtype is None else dtype)
    probe = np.asarray(a, dtype=dtype)  # Python numbers and lists: small
    return MetaArray(probe.shape, probe.dtype)


def zeros(shape, dtype=float):
    return MetaArray(_shape_arg(shape), dtype)


def arange(stop):
    return MetaArray((max(0, stop),), np.arange(stop, stop).dtype)


def triu(m, k=0):
    """NumPy's triu is where(mask, zeros(1, m.dtype), m): a new array in m's layout."""
    return _elementwise(np.where, (MetaArray(m.shape[-2:], bool), MetaArray((1,), m.dtype), m), name="triu",
                        scalar_result=False)


def where(condition, x, y):
    return _elementwise(np.where, (condition, x, y), name="where", scalar_result=False)


def broadcast_to(a, shape):
    """A read-only view repeating a (stride 0) along the broadcast axes."""
    shape = _shape_arg(shape)
    if isinstance(a, MetaScalar):  # NumPy makes a new 0-d array of it first
        a = MetaArray((), a.dtype)
    if len(shape) < a.ndim or any(n != m and n != 1 for n, m in zip(a.shape[::-1], shape[::-1])):
        raise ValueError(f"cannot broadcast an array of shape {_fmt_shape(a.shape)} to {_fmt_shape(shape)}")
    return a._view(shape, _strides_in(a, shape), readonly=True)


def expand_dims(a, axis):
    ndim = a.ndim + (1 if isinstance(axis, (int, np.integer)) else len(axis))
    axes = _axes(axis, ndim)
    rest = iter(a.shape)
    return a.reshape(tuple(1 if i in axes else next(rest) for i in range(ndim)))


def take_along_axis(arr, indices, axis):
    (ax,) = _axes(axis, arr.ndim)
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    return MetaArray(_broadcast([indices.shape, arr.shape[:ax] + (1,) + arr.shape[ax + 1:]]), arr.dtype)


def put_along_axis(arr, indices, values, axis) -> None:
    """An in-place scatter: changes values only."""


def packbits(a):
    """Eight bools to a byte, as NumPy's packbits of a 1-d array."""
    return MetaArray(((a.size + 7) // 8,), np.uint8)


def unpackbits(a):
    return MetaArray((a.size * 8,), np.uint8)


def concatenate(arrays, axis=0):
    """A new array of the arrays side by side; its layout follows theirs (NumPy orders the result's axes by the
    inputs' strides, as order "K")."""
    arrays = list(arrays)
    for a in arrays:
        _check_operand(a, "concatenate")
    first = arrays[0]
    if any(a.ndim != first.ndim for a in arrays) or first.ndim == 0:
        raise ValueError("all the input arrays must have same number of dimensions")
    (ax,) = _axes(axis, first.ndim)
    if any(a.shape[:ax] + a.shape[ax + 1:] != first.shape[:ax] + first.shape[ax + 1:] for a in arrays):
        raise ValueError("all the input array dimensions except for the concatenation axis must match exactly")
    shape = first.shape[:ax] + (sum(a.shape[ax] for a in arrays),) + first.shape[ax + 1:]
    dtype = np.result_type(*(a.dtype for a in arrays))
    return MetaArray(shape, dtype, _order_strides(shape, dtype.itemsize, [_strides_in(a, a.shape) for a in arrays]))


def copyto(dst, src, where=True) -> None:
    """Copy where a mask says: changes values only (NumPy's checks: writeable, broadcastable)."""
    _elementwise(np.where, (where, src, dst), name="copyto", scalar_result=False)
    if dst._readonly:
        raise ValueError("assignment destination is read-only")


class _Ufunc:
    """xp.exp(a) and its kin; xp.add.at(a, index, b), an in-place scatter that changes values only."""

    def __init__(self, ufunc):
        self.ufunc = ufunc

    def __call__(self, *args, out=None):
        return _elementwise(self.ufunc, args, out=out)

    def at(self, a, indices, b) -> None:
        if a._readonly:
            raise ValueError("output array is read-only")
        a[indices]  # NumPy's index checks


class _Namespace:
    """The meta backend's `xp`. Dtypes (`xp.float32`) are NumPy's own; a NumPy function that is not
    here raises AttributeError naming this module, rather than computing on no data."""

    def __getattr__(self, name):
        value = getattr(np, name, None)
        if isinstance(value, type) and issubclass(value, np.generic):
            return value
        raise AttributeError(
            f"the meta backend's array namespace has no '{name}'; add it to tinygrad_ckpt/backend/meta.py "
            "(it must compute the result's shape, dtype and layout, and whether it is a view)"
        )


xp = _Namespace()
for _fn in (asarray, zeros, arange, triu, where, broadcast_to, expand_dims, take_along_axis, put_along_axis, copyto,
            packbits, unpackbits, concatenate):
    setattr(xp, _fn.__name__, _fn)
xp.ones = zeros
xp.empty = zeros
for _name in ("add", "subtract", "multiply", "divide", "negative", "exp", "log", "sqrt", "tanh", "maximum", "equal",
              "not_equal",
              "less", "less_equal", "greater", "greater_equal"):
    setattr(xp, _name, _Ufunc(getattr(np, _name)))


# ---- random numbers and the backend ----------------------------------------------------------
class MetaGenerator:
    """Draws shapes, not numbers: the meta stand-in for numpy.random.Generator."""

    def random(self, size, dtype=np.float64):
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"Unsupported dtype {dtype!r} for random")  # as NumPy's Generator
        return MetaArray(_shape_arg(size), dtype)

    standard_normal = random


class MetaBackend(Backend):
    """tg.use_backend("meta"): shape-only arrays; the ledger counts them as if they were NumPy's."""

    name = "meta"
    array_type = MetaArray
    has_values = False

    def __init__(self):
        self.xp = xp
        self._stand_ins: dict[int, MetaArray] = {}  # id(NumPy array) -> the meta array standing for it

    def is_array(self, a) -> bool:
        return isinstance(a, MetaArray) and not isinstance(a, MetaScalar)

    def as_array(self, a):
        return MetaArray((), a.dtype) if isinstance(a, MetaScalar) else a

    def any_scalar(self, values) -> bool:
        return any(isinstance(v, MetaScalar) for v in values)

    def buffer(self, a):
        owner = a.base if a.base is not None else a
        return owner, owner.nbytes

    def to_numpy(self, a):
        raise _no_data("to_numpy() / Tensor.numpy() / Tensor.item()")

    def asarray(self, data, dtype=None):
        """As NumPy's asarray, which hands a NumPy array back without a copy: the same NumPy array always
        gets the same meta array (one buffer, living as long as the NumPy array does), so a ledger counts
        the caller's ids and targets exactly as on NumPy."""
        if not isinstance(data, np.ndarray) or (dtype is not None and np.dtype(dtype) != data.dtype):
            return asarray(data, dtype=dtype)
        key = id(data)
        if key not in self._stand_ins:
            self._stand_ins[key] = asarray(data)
            weakref.finalize(data, self._stand_ins.pop, key, None)
        return self._stand_ins[key]

    def erf(self, x):
        from scipy.special import erf  # only its dtype rule is used (float16 -> float64, as SciPy does)

        return _elementwise(erf, (x,))

    def generator(self, seed: int, counter: int, *keys: int):
        return MetaGenerator()

    # what ops read from values: none here, so what a meta run assumes (numpy_backend.Backend says what each is)
    def from_host(self, make, shape, dtype):
        return zeros(shape, dtype=dtype)

    def count_nonzero_or(self, mask, otherwise: int) -> int:
        return otherwise

    def nonzero_or_none(self, mask):
        return None

    def first_outside(self, values, size: int, skip=None):
        return None

    def top_k_indices(self, p, k: int):
        return zeros((p.shape[0], k), dtype=np.intp)

    def positions_of_each(self, indices, n: int) -> list:
        """Round robin's counts: value v is held ⌈(total - v)/n⌉ times (every expert a balanced share)."""
        total = math.prod(indices.shape)
        return [zeros((-(-(total - v) // n) if total > v else 0,), dtype=np.intp) for v in range(n)]
