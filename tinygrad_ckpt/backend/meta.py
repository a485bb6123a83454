"""The "meta" backend: arrays with a shape and a dtype but no data.

Like PyTorch's meta device, `tg.use_backend("meta")` runs the engine without computing anything:
every operation works out only what NumPy would hand back: the shape, the dtype, the memory
layout, whether the result is a view of an existing buffer or a new one, and whether it is an
array at all or a NumPy scalar. That is all the ledger needs, so a meta run records the same
allocations, saves and releases, with the same byte counts, and the same FLOPs as a NumPy run:
the seed's 7B model trains for one step in seconds and a few megabytes
(`tinygrad-ckpt estimate`).

Three NumPy rules are copied because the ledger's numbers depend on them:

* views: slicing, transposes, `broadcast_to` and `reshape` (when NumPy's no-copy rule allows it)
  share their owner's buffer; `MetaArray.base` is that owner, as NumPy's `.base` is.
* layout: new results get NumPy's strides (elementwise ops and `astype` follow their inputs'
  memory order, matmul keeps its core axes innermost, advanced indexing puts the indexed axes
  outermost), so that a later `reshape` is a view or a copy exactly when it is one in NumPy.
* scalars: a 0-d result of an elementwise op, a reduction or integer indexing is a NumPy scalar,
  not an array; here it is a `MetaScalar`, which the ledger does not count either.

Result dtypes are NumPy's own: NumPy is asked on empty arrays (NEP 50 promotion, true division of
integers, bool arithmetic, and the errors these raise). Anything that needs a value (`bool(a)`,
`float(a)`, `.item()`, `to_numpy`) raises `NoDataError`. Boolean-mask indexing selects a
data-dependent number of elements; the meta result assumes every element is selected (an upper
bound) unless the mask is a real NumPy array. Zero-size arrays hold no bytes, and their strides
(arbitrary in NumPy) are not copied.
"""

from __future__ import annotations

import math
from functools import cache

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
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        listed = " ".join(_fmt_shape(s) for s in shapes)
        raise ValueError(f"operands could not be broadcast together with shapes {listed} ") from None


def _axes(axis, ndim: int) -> tuple:
    """Normalised, sorted reduction axes (NumPy's AxisError when out of range)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise np.exceptions.AxisError(int(a), ndim)
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError("duplicate value in 'axis'")
    return tuple(sorted(out))


def _shape_arg(shape) -> tuple:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(n) for n in shape)


# ---- dtypes: ask NumPy, on empty arrays --------------------------------------------------------
_PY_SCALARS = (bool, int, float, complex)


def _dtype_key(x):
    if isinstance(x, MetaArray):
        return x.dtype
    if isinstance(x, np.generic):
        return x.dtype
    return type(x)  # a Python number: "weak" under NEP 50


def _probe(key):
    return np.empty(0, dtype=key) if isinstance(key, np.dtype) else key(0)


@cache
def _resolve(fn, keys: tuple, out_dtype=None) -> np.dtype:
    """The dtype NumPy gives `fn(*operands)`; raises what NumPy raises (e.g. bool subtract)."""
    args = [_probe(k) for k in keys]
    if out_dtype is not None:
        return fn(*args, out=np.empty(0, dtype=out_dtype)).dtype
    return np.asarray(fn(*args)).dtype


@cache
def _reduced_dtype(method: str, dtype: np.dtype, requested) -> np.dtype:
    probe = np.zeros(1, dtype=dtype)
    if method in ("sum", "prod", "mean"):
        return np.asarray(getattr(probe, method)(dtype=requested)).dtype
    return np.asarray(getattr(probe, method)()).dtype


def _where(cond, x, y):
    return np.where(cond, x, y)


def _check_operand(x, op: str) -> None:
    if isinstance(x, np.ndarray):
        raise TypeError(
            f"{op}: cannot mix a NumPy array (shape {list(x.shape)}) with meta arrays; create it on the meta "
            "backend (tg.use_backend('meta') before creating tensors, or backend.current().asarray(x))."
        )
    if not isinstance(x, (MetaArray, np.generic, *_PY_SCALARS)):
        raise TypeError(f"{op}: unsupported operand of type {type(x).__name__} for a meta array")


def _elementwise(fn, args, out=None, name=None, scalar_result=True):
    """Shape, dtype and layout of an elementwise NumPy call (a ufunc, `where`, scipy's erf)."""
    name = name or getattr(fn, "__name__", "op")
    if out is None and not any(isinstance(a, (MetaArray, np.ndarray)) for a in args):
        return fn(*args)  # only plain numbers: NumPy computes the real value
    for a in args:
        _check_operand(a, name)
    metas = [a for a in args if isinstance(a, MetaArray)]
    shape = _broadcast([a.shape if isinstance(a, MetaArray) else () for a in args])
    keys = tuple(_dtype_key(a) for a in args)
    if out is not None:
        if not isinstance(out, MetaArray) or isinstance(out, MetaScalar):
            raise TypeError(f"{name}: out must be a meta array")
        if out._readonly:
            raise ValueError("output array is read-only")
        if not _broadcastable(shape, out.shape) or tuple(np.broadcast_shapes(shape, out.shape)) != out.shape:
            raise ValueError(
                f"non-broadcastable output operand with shape {_fmt_shape(out.shape)} doesn't match "
                f"the broadcast shape {_fmt_shape(_broadcast([shape, out.shape]))}"
            )
        _resolve(fn, keys, out.dtype)
        return out
    dtype = _resolve(fn, keys)
    if not shape and scalar_result:
        return MetaScalar(dtype)
    strides = _order_strides(shape, dtype.itemsize, [_strides_in(a, shape) for a in metas if a.ndim])
    return MetaArray(shape, dtype, strides)


def _broadcastable(*shapes) -> bool:
    try:
        np.broadcast_shapes(*shapes)
        return True
    except ValueError:
        return False


# ---- the arrays --------------------------------------------------------------------------------
class _Flags:
    """The memory-layout flags NumPy's `ndarray.flags` reports (attribute or item access)."""

    def __init__(self, a):
        self.c_contiguous = _is_c_contiguous(a.shape, a.strides, a.itemsize)
        self.f_contiguous = _is_c_contiguous(a.shape[::-1], a.strides[::-1], a.itemsize)
        self.contiguous = self.c_contiguous
        self.owndata = a.base is None
        self.writeable = not a._readonly and not isinstance(a, MetaScalar)

    def __getitem__(self, key: str) -> bool:
        name = {"C": "c_contiguous", "F": "f_contiguous", "W": "writeable", "O": "owndata"}.get(key, key.lower())
        return getattr(self, name)

    def __repr__(self) -> str:
        return "\n".join(f"  {k.upper()} : {v}" for k, v in vars(self).items())


def _binary(ufunc):
    def forward(self, other):
        if not isinstance(other, (MetaArray, np.ndarray, np.generic, *_PY_SCALARS)):
            return NotImplemented
        return _elementwise(ufunc, (self, other))

    def reflected(self, other):
        if not isinstance(other, (MetaArray, np.ndarray, np.generic, *_PY_SCALARS)):
            return NotImplemented
        return _elementwise(ufunc, (other, self))

    def inplace(self, other):
        if not isinstance(other, (MetaArray, np.ndarray, np.generic, *_PY_SCALARS)):
            return NotImplemented
        if isinstance(self, MetaScalar):  # NumPy scalars are immutable: `s += 1` rebinds
            return _elementwise(ufunc, (self, other))
        return _elementwise(ufunc, (self, other), out=self)

    return forward, reflected, inplace


def _compare(ufunc):
    def method(self, other):
        if not isinstance(other, (MetaArray, np.ndarray, np.generic, *_PY_SCALARS)):
            return NotImplemented
        return _elementwise(ufunc, (self, other))

    return method


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

    # ---- what is known without data ----------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def T(self):
        return self.transpose()

    @property
    def flags(self) -> _Flags:
        return _Flags(self)

    def _view(self, shape, strides, readonly=None) -> MetaArray:
        owner = self.base if self.base is not None else self
        return MetaArray(shape, self.dtype, strides, owner, self._readonly if readonly is None else readonly)

    def __repr__(self) -> str:
        view = ", view" if self.base is not None else ""
        return f"MetaArray(shape={self.shape}, dtype={self.dtype}{view})"

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    # ---- what needs data -------------------------------------------------------------------
    def __bool__(self):
        raise _no_data("bool() of a meta array")

    def __float__(self):
        raise _no_data("float() of a meta array")

    def __int__(self):
        raise _no_data("int() of a meta array")

    def __complex__(self):
        raise _no_data("complex() of a meta array")

    def __index__(self):
        raise _no_data("using a meta array as a Python integer")

    def item(self, *args):
        raise _no_data(".item() of a meta array")

    def tolist(self):
        raise _no_data(".tolist() of a meta array")

    def nonzero(self):
        raise _no_data(".nonzero() of a meta array (its result's shape depends on the values)")

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
    __and__, __rand__, __iand__ = _binary(np.bitwise_and)
    __or__, __ror__, __ior__ = _binary(np.bitwise_or)
    __xor__, __rxor__, __ixor__ = _binary(np.bitwise_xor)
    __eq__ = _compare(np.equal)
    __ne__ = _compare(np.not_equal)
    __lt__ = _compare(np.less)
    __le__ = _compare(np.less_equal)
    __gt__ = _compare(np.greater)
    __ge__ = _compare(np.greater_equal)

    def __neg__(self):
        return _elementwise(np.negative, (self,))

    def __pos__(self):
        return _elementwise(np.positive, (self,))

    def __abs__(self):
        return _elementwise(np.absolute, (self,))

    def __invert__(self):
        return _elementwise(np.invert, (self,))

    def __matmul__(self, other):
        if not isinstance(other, (MetaArray, np.ndarray)):
            return NotImplemented
        return _matmul(self, other)

    def __rmatmul__(self, other):
        if not isinstance(other, (MetaArray, np.ndarray)):
            return NotImplemented
        return _matmul(other, self)

    def __imatmul__(self, other):
        result = _matmul(self, other)
        if result.shape != self.shape:
            raise ValueError(
                f"matmul: output shape {_fmt_shape(result.shape)} does not match the in-place operand "
                f"{_fmt_shape(self.shape)}"
            )
        return self

    # ---- reductions ------------------------------------------------------------------------
    def _reduce(self, method, axis=None, keepdims=False, dtype=None, out=None):
        if out is not None:
            raise NotImplementedError(f"meta: {method}(out=...) is not supported")
        axes = _axes(axis, self.ndim)
        out_dtype = _reduced_dtype(method, self.dtype, None if dtype is None else np.dtype(dtype))
        if method in ("max", "min") and any(self.shape[a] == 0 for a in axes):
            op = "maximum" if method == "max" else "minimum"
            raise ValueError(f"zero-size array to reduction operation {op} which has no identity")
        kshape = tuple(1 if i in axes else n for i, n in enumerate(self.shape))
        keep = range(self.ndim) if keepdims else [i for i in range(self.ndim) if i not in axes]
        if not keep:
            return MetaScalar(out_dtype)
        strides = _order_strides(kshape, out_dtype.itemsize, [_strides_in(self, kshape)])
        return MetaArray(tuple(kshape[i] for i in keep), out_dtype, tuple(strides[i] for i in keep))

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("sum", axis, keepdims, dtype, out)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("prod", axis, keepdims, dtype, out)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce("mean", axis, keepdims, dtype, out)

    def max(self, axis=None, out=None, keepdims=False):
        return self._reduce("max", axis, keepdims, None, out)

    def min(self, axis=None, out=None, keepdims=False):
        return self._reduce("min", axis, keepdims, None, out)

    def all(self, axis=None, out=None, keepdims=False):
        return self._reduce("all", axis, keepdims, None, out)

    def any(self, axis=None, out=None, keepdims=False):
        return self._reduce("any", axis, keepdims, None, out)

    def argmax(self, axis=None, out=None, keepdims=False):
        return self._arg("argmax", axis, keepdims)

    def argmin(self, axis=None, out=None, keepdims=False):
        return self._arg("argmin", axis, keepdims)

    def _arg(self, method, axis, keepdims):
        intp = np.dtype(np.intp)
        if axis is None:
            if self.size == 0:
                raise ValueError(f"attempt to get {method} of an empty sequence")
            return MetaArray((1,) * self.ndim, intp) if keepdims and self.ndim else MetaScalar(intp)
        (ax,) = _axes(axis, self.ndim)
        if self.shape[ax] == 0:
            raise ValueError(f"attempt to get {method} of an empty sequence")
        shape = tuple(1 if i == ax else n for i, n in enumerate(self.shape)) if keepdims else (
            self.shape[:ax] + self.shape[ax + 1:])
        return MetaArray(shape, intp) if shape else MetaScalar(intp)

    # ---- conversions and copies ------------------------------------------------------------
    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        dtype = np.dtype(dtype)
        if not copy and dtype == self.dtype:
            return self
        return MetaArray(self.shape, dtype, _order_strides(self.shape, dtype.itemsize, [self.strides]))

    def copy(self, order="C"):
        if order == "K":
            return MetaArray(self.shape, self.dtype, _order_strides(self.shape, self.itemsize, [self.strides]))
        return MetaArray(self.shape, self.dtype)

    def flatten(self, order="C"):
        return MetaArray((self.size,), self.dtype)

    def ravel(self, order="C"):
        if _is_c_contiguous(self.shape, self.strides, self.itemsize):
            return self.reshape(-1)
        return MetaArray((self.size,), self.dtype)

    def view(self, dtype=None):
        if dtype is not None and np.dtype(dtype) != self.dtype:
            raise NotImplementedError("meta: view(dtype) with another dtype is not supported")
        return self._view(self.shape, self.strides)

    def fill(self, value) -> None:
        if self._readonly:
            raise ValueError("assignment destination is read-only")

    # ---- movement (views) ------------------------------------------------------------------
    def reshape(self, *shape, order="C"):
        if order != "C":
            raise NotImplementedError("meta: only order='C' reshapes are supported")
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return _reshape(self, _shape_arg(shape))

    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = () if axes[0] is None else tuple(axes[0])
        if not axes:
            axes = tuple(range(self.ndim - 1, -1, -1))
        if len(axes) != self.ndim:
            raise ValueError("axes don't match array")
        axes = tuple(_axes(a, self.ndim)[0] for a in axes)
        if len(set(axes)) != len(axes):
            raise ValueError("repeated axis in transpose")
        return self._view(tuple(self.shape[a] for a in axes), tuple(self.strides[a] for a in axes))

    def swapaxes(self, axis1, axis2):
        (a1,), (a2,) = _axes(axis1, self.ndim), _axes(axis2, self.ndim)
        order = list(range(self.ndim))
        order[a1], order[a2] = a2, a1
        return self.transpose(order)

    def squeeze(self, axis=None):
        if axis is None:
            axes = tuple(i for i, n in enumerate(self.shape) if n == 1)
        else:
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
        if isinstance(value, np.ndarray):
            _check_operand(value, "setitem")
        if self._readonly:
            raise ValueError("assignment destination is read-only")
        target = _index_shape(self, index)[0]
        vshape = tuple(getattr(value, "shape", ()))
        while len(vshape) > len(target) and vshape[0] == 1:
            vshape = vshape[1:]
        if not _broadcastable(vshape, target) or tuple(np.broadcast_shapes(vshape, target)) != target:
            raise ValueError(
                f"could not broadcast input array from shape {_fmt_shape(vshape)} into shape {_fmt_shape(target)}"
            )


class MetaScalar(MetaArray):
    """What NumPy returns as a scalar (np.float32(…)): 0-d, immutable, not an array to the engine."""

    __slots__ = ()

    def __init__(self, dtype):
        super().__init__((), dtype)

    def __repr__(self) -> str:
        return f"MetaScalar(dtype={self.dtype})"

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        return MetaScalar(dtype)

    def copy(self, order="C"):
        return MetaScalar(self.dtype)

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        shape = _shape_arg(shape)
        if shape == ():
            return MetaScalar(self.dtype)
        return MetaArray((), self.dtype).reshape(shape)  # NumPy makes a 0-d array first

    def squeeze(self, axis=None):
        return MetaScalar(self.dtype)

    def transpose(self, *axes):
        return MetaScalar(self.dtype)

    def __setitem__(self, index, value):
        raise TypeError(f"'{self.dtype.type.__name__}' object does not support item assignment")


# ---- reshape: NumPy's no-copy rule ---------------------------------------------------------------
def _fix_shape(shape: tuple, size: int) -> tuple:
    unknown = [i for i, n in enumerate(shape) if n == -1]
    if len(unknown) > 1:
        raise ValueError("can only specify one unknown dimension")
    if any(n < -1 for n in shape):
        raise ValueError("negative dimensions not allowed")
    known = math.prod(n for n in shape if n != -1)
    if unknown:
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {_fmt_shape(shape)}")
        shape = tuple(size // known if n == -1 else n for n in shape)
    elif known != size:
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
_SIGNATURE = "(n?,k),(k,m?)->(n?,m?)"


def _matmul(a, b):
    for x in (a, b):
        _check_operand(x, "matmul")
    for i, x in enumerate((a, b)):
        if x.ndim == 0:
            raise ValueError(
                f"matmul: Input operand {i} does not have enough dimensions (has 0, gufunc core with "
                f"signature {_SIGNATURE} requires 1)"
            )
    a_shape = (1,) + a.shape if a.ndim == 1 else a.shape
    b_shape = b.shape + (1,) if b.ndim == 1 else b.shape
    if a_shape[-1] != b_shape[-2]:
        raise ValueError(
            f"matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
            f"{_SIGNATURE} (size {b_shape[-2]} is different from {a_shape[-1]})"
        )
    try:
        batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
    except ValueError:
        raise ValueError(
            f"operands could not be broadcast together with remapped shapes [original->remapped]: "
            f"{_fmt_shape(a.shape)}->{_fmt_shape(a_shape[:-2] + ('newaxis', 'newaxis'))} "
            f"{_fmt_shape(b.shape)}->{_fmt_shape(b_shape[:-2] + ('newaxis', 'newaxis'))}  and requested shape "
            f"{_fmt_shape((a_shape[-2], b_shape[-1]))}"
        ) from None
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
    """One index entry as (kind, info): kind in new, ellipsis, slice, int, array, bool."""
    if item is None:
        return "new", None
    if item is Ellipsis:
        return "ellipsis", None
    if isinstance(item, slice):
        return "slice", item
    if isinstance(item, (bool, np.bool_)):
        return "bool", ((), int(item))
    if isinstance(item, (int, np.integer)):
        return "int", int(item)
    if isinstance(item, MetaArray):
        if item.dtype.kind == "b":
            return "bool", (item.shape, item.size)  # upper bound: every element selected
        if item.dtype.kind in "iu":
            return ("int", None) if item.ndim == 0 else ("array", item.shape)
        raise IndexError("arrays used as indices must be of integer (or boolean) type")
    try:
        arr = np.asarray(item)
    except TypeError:
        arr = None
    if arr is None or arr.dtype == object:
        raise IndexError(
            "only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) and integer or boolean "
            "arrays are valid indices"
        )
    if arr.dtype.kind == "b":
        return "bool", (arr.shape, int(arr.sum()))
    if arr.dtype.kind in "iu" or arr.size == 0:
        return ("int", int(arr)) if arr.ndim == 0 else ("array", arr.shape)
    raise IndexError("arrays used as indices must be of integer (or boolean) type")


def _index_shape(a: MetaArray, index):
    """(shape, strides, kind, buffer) of a[index]; kind is "view", "scalar" or "copy".

    A "copy" (advanced indexing) gets NumPy's layout: NumPy fills a new buffer with the indexed
    axes outermost (C order) and the other axes in their source order, and returns a transposed
    view of it when the indexed axes were adjacent but not first; `buffer` is then (shape, strides)
    of that new buffer, and None when the result is the buffer itself.
    """
    items = [_classify(i) for i in (index if isinstance(index, tuple) else (index,))]
    consumed = sum(1 if k in ("slice", "int", "array") else len(info[0]) if k == "bool" else 0
                   for k, info in items)
    ellipses = sum(k == "ellipsis" for k, _ in items)
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > a.ndim:
        raise IndexError(f"too many indices for array: array is {a.ndim}-dimensional, but {consumed} were indexed")
    fill = [("slice", slice(None))] * (a.ndim - consumed)
    if ellipses:
        at = next(i for i, (k, _) in enumerate(items) if k == "ellipsis")
        expanded = items[:at] + fill + items[at + 1:]
    else:
        expanded = items + fill
    advanced = any(k in ("array", "bool") for k, _ in expanded)

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
        elif k in ("int", "array"):
            n = a.shape[dim]
            if k == "int" and info is not None and not -n <= info < n:
                raise IndexError(f"index {info} is out of bounds for axis {dim} with size {n}")
            if advanced:  # with an array present, integers are indices to broadcast too
                adv_pos.append(pos)
                adv_shapes.append(() if k == "int" else info)
            dim += 1
        else:  # a boolean mask over len(mask_shape) axes
            mask_shape, count = info
            for j, m in enumerate(mask_shape):
                if m != a.shape[dim + j]:
                    raise IndexError(
                        f"boolean index did not match indexed array along axis {dim + j}; size of axis is "
                        f"{a.shape[dim + j]} but size of corresponding boolean axis is {m}"
                    )
            adv_pos.append(pos)
            adv_shapes.append((count,))
            dim += len(mask_shape)
        if not adv_pos:
            basic_before = len(shape)
    if not advanced:
        if not shape and all(k == "int" for k, _ in items):
            return (), (), "scalar", None
        return tuple(shape), tuple(strides), "view", None
    try:
        bshape = tuple(np.broadcast_shapes(*adv_shapes))
    except ValueError:
        listed = " ".join(_fmt_shape(s) for s in adv_shapes)
        raise IndexError(
            f"shape mismatch: indexing arrays could not be broadcast together with shapes {listed} "
        ) from None
    sub_shape = tuple(shape)
    inner = _order_strides(sub_shape, a.itemsize, [tuple(strides)])
    block = a.itemsize * math.prod(sub_shape)
    buf_shape = bshape + sub_shape
    buf_strides = tuple(s * block for s in _c_strides(bshape, 1)) + inner
    adjacent = adv_pos == list(range(adv_pos[0], adv_pos[0] + len(adv_pos)))
    if not (adjacent and basic_before):
        return buf_shape, buf_strides, "copy", None
    nb = len(bshape)
    order = [*range(nb, nb + basic_before), *range(nb), *range(nb + basic_before, len(buf_shape))]
    return (tuple(buf_shape[i] for i in order), tuple(buf_strides[i] for i in order), "copy",
            (buf_shape, buf_strides))


def _getitem(a: MetaArray, index):
    if isinstance(a, MetaScalar):
        if index is Ellipsis or (isinstance(index, tuple) and not index):
            return MetaScalar(a.dtype) if index == () else MetaArray((), a.dtype)
        return MetaArray((), a.dtype)[index]
    shape, strides, kind, buf = _index_shape(a, index)
    if kind == "scalar":
        return MetaScalar(a.dtype)
    if kind == "view":
        return a._view(shape, strides)
    if buf is None:
        return MetaArray(shape, a.dtype, strides)
    return MetaArray(buf[0], a.dtype, buf[1])._view(shape, strides)


# ---- the array namespace ---------------------------------------------------------------------------
def _dtype_of(x):
    if isinstance(x, (MetaArray, np.ndarray, np.generic)):
        return x.dtype
    return np.asarray(x).dtype


def _new(shape, dtype, like=None):
    shape = _shape_arg(shape)
    dtype = np.dtype(dtype)
    if like is not None and like.shape == shape and like.ndim:
        return MetaArray(shape, dtype, _order_strides(shape, dtype.itemsize, [like.strides]))
    return MetaArray(shape, dtype)


def asarray(a, dtype=None, order=None, copy=None):
    if isinstance(a, MetaScalar):
        return MetaArray((), a.dtype if dtype is None else dtype)
    if isinstance(a, MetaArray):
        if (dtype is None or np.dtype(dtype) == a.dtype) and not copy:
            return a
        return a.astype(a.dtype if dtype is None else dtype)
    if isinstance(a, np.ndarray):
        return MetaArray(a.shape, a.dtype if dtype is None else dtype)
    probe = np.asarray(a, dtype=dtype)  # Python numbers and lists: small
    return MetaArray(probe.shape, probe.dtype)


def ascontiguousarray(a, dtype=None):
    a = asarray(a, dtype)
    return a if a.flags.c_contiguous else a.copy()


def array(a, dtype=None, copy=True, order="K"):
    return asarray(a, dtype=dtype, copy=copy)


def zeros(shape, dtype=float, order="C"):
    return _new(shape, dtype)


def full(shape, fill_value, dtype=None, order="C"):
    return _new(shape, _dtype_of(fill_value) if dtype is None else dtype)


def zeros_like(a, dtype=None, shape=None):
    return _new(a.shape if shape is None else shape, a.dtype if dtype is None else dtype, like=a)


def full_like(a, fill_value, dtype=None, shape=None):
    return zeros_like(a, dtype, shape)


def arange(start, stop=None, step=None, dtype=None):
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    if isinstance(start, MetaArray) or isinstance(stop, MetaArray) or isinstance(step, MetaArray):
        raise _no_data("arange with meta-array bounds")
    n = max(0, math.ceil((stop - start) / step))
    return MetaArray((n,), np.arange(start, start, step, dtype=dtype).dtype)


def eye(n, m=None, k=0, dtype=float):
    return MetaArray((n, n if m is None else m), dtype)


def tri(n, m=None, k=0, dtype=float):
    return eye(n, m, k, dtype)


def triu(m, k=0):
    if m.ndim < 2:
        raise ValueError("input array must be at least 2-d")
    return _elementwise(_where, (MetaArray(m.shape[-2:], bool), MetaArray((1,), m.dtype), m), name="triu",
                        scalar_result=False)


def tril(m, k=0):
    return triu(m, k)


def where(condition, x=None, y=None):
    if x is None and y is None:
        raise _no_data("where(condition) with one argument (its result's shape depends on the values)")
    return _elementwise(_where, (condition, x, y), name="where", scalar_result=False)


def broadcast_to(a, shape, subok=False):
    shape = _shape_arg(shape)
    if not isinstance(a, MetaArray) or isinstance(a, MetaScalar):
        _check_operand(a, "broadcast_to")
        a = asarray(a)
    if len(shape) < a.ndim or any(n != m and n != 1 for n, m in zip(a.shape[::-1], shape[::-1])):
        raise ValueError(
            f"operands could not be broadcast together with remapped shapes [original->remapped]: "
            f"{_fmt_shape(a.shape)}  and requested shape {_fmt_shape(shape)}"
        )
    return a._view(shape, _strides_in(a, shape), readonly=True)


def expand_dims(a, axis):
    if not isinstance(a, MetaArray):
        _check_operand(a, "expand_dims")
        a = asarray(a)
    if isinstance(a, MetaScalar):
        a = MetaArray((), a.dtype)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    ndim = a.ndim + len(axes)
    axes = [int(x) % ndim if -ndim <= x < ndim else _raise_axis(x, ndim) for x in axes]
    if len(set(axes)) != len(axes):
        raise ValueError("repeated axis")
    rest = iter(a.shape)
    return a.reshape(tuple(1 if i in axes else next(rest) for i in range(ndim)))


def _raise_axis(axis, ndim):
    raise np.exceptions.AxisError(int(axis), ndim)


def take_along_axis(arr, indices, axis):
    if axis is None:
        return _getitem(arr.reshape(-1), indices)
    (ax,) = _axes(axis, arr.ndim)
    if indices.ndim != arr.ndim:
        raise ValueError("`indices` and `arr` must have the same number of dimensions")
    shape = _broadcast([indices.shape, tuple(1 if i == ax else n for i, n in enumerate(arr.shape))])
    return MetaArray(shape, arr.dtype)


def put_along_axis(arr, indices, values, axis) -> None:
    if not isinstance(arr, MetaArray):
        raise TypeError("put_along_axis: arr must be a meta array")


def concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    if axis is None:
        arrays, axis = [a.reshape(-1) for a in arrays], 0
    (ax,) = _axes(axis, arrays[0].ndim)
    shape = list(arrays[0].shape)
    shape[ax] = sum(a.shape[ax] for a in arrays)
    return MetaArray(shape, dtype or np.result_type(*[a.dtype for a in arrays]))


def stack(arrays, axis=0, dtype=None):
    arrays = [expand_dims(a, axis) for a in arrays]
    return concatenate(arrays, axis=axis, dtype=dtype)


def matmul(a, b):
    return _matmul(a, b)


def result_type(*args):
    return np.result_type(*[a.dtype if isinstance(a, MetaArray) else a for a in args])


def _method(name):
    def call(a, *args, **kwargs):
        if not isinstance(a, MetaArray):
            _check_operand(a, name)
            a = asarray(a)
        return getattr(a, name)(*args, **kwargs)

    call.__name__ = name
    return call


class _Ufunc:
    """A NumPy ufunc on meta arrays: `xp.exp(a)`, `xp.add.at(a, index, b)`."""

    _REDUCE = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min",
               "logical_and": "all", "logical_or": "any"}

    def __init__(self, ufunc):
        self.ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, out=None):
        return _elementwise(self.ufunc, args, out=out)

    def at(self, a, indices, b=None) -> None:
        """Unbuffered in-place update: changes values only."""
        if not isinstance(a, MetaArray) or isinstance(a, MetaScalar):
            raise TypeError(f"{self.__name__}.at: the first argument must be a meta array")
        if a._readonly:
            raise ValueError("output array is read-only")
        _index_shape(a, indices)

    def reduce(self, a, axis=0, dtype=None, out=None, keepdims=False):
        method = self._REDUCE.get(self.__name__)
        if method is None:
            raise NotImplementedError(f"meta: {self.__name__}.reduce is not supported")
        kwargs = {"dtype": dtype} if method in ("sum", "prod") else {}
        return getattr(asarray(a), method)(axis=axis, keepdims=keepdims, out=out, **kwargs)

    def __repr__(self) -> str:
        return f"<meta ufunc '{self.__name__}'>"


_UFUNCS = (
    "add subtract multiply divide true_divide floor_divide remainder mod power float_power maximum minimum "
    "fmax fmin negative positive absolute abs sign exp exp2 expm1 log log2 log10 log1p sqrt square "
    "reciprocal tanh sinh cosh sin cos tan arctan arctanh arcsin arccos floor ceil rint trunc isfinite isnan "
    "isinf signbit equal not_equal less less_equal greater greater_equal logical_and logical_or "
    "logical_xor logical_not bitwise_and bitwise_or bitwise_xor invert hypot arctan2 copysign"
).split()


class _Namespace:
    """The meta backend's `xp`: the part of NumPy the engine uses, on meta arrays.

    Dtypes and constants (`xp.float32`, `xp.inf`) are NumPy's own; a NumPy function that is not
    here raises AttributeError naming this module, rather than computing on no data.
    """

    ndarray = MetaArray
    newaxis = None

    def __init__(self):
        for name in _UFUNCS:
            setattr(self, name, _Ufunc(getattr(np, name)))
        for fn in (asarray, array, zeros, full, zeros_like, full_like, arange, eye, tri, triu, tril, where,
                   broadcast_to, expand_dims, take_along_axis, put_along_axis, concatenate, stack, matmul,
                   result_type):
            setattr(self, fn.__name__, fn)
        self.ones = self.empty = zeros
        self.ones_like = self.empty_like = zeros_like
        self.ascontiguousarray = ascontiguousarray
        self.copy = lambda a, order="K": asarray(a).copy(order=order)
        for name in ("sum", "prod", "mean", "max", "min", "all", "any", "argmax", "argmin", "reshape",
                     "transpose", "swapaxes", "squeeze", "ravel", "astype"):
            setattr(self, name, _method(name))
        self.amax, self.amin = self.max, self.min
        self.shape = lambda a: tuple(a.shape)
        self.ndim = lambda a: len(a.shape)
        self.size = lambda a: math.prod(a.shape)

    def __getattr__(self, name):
        value = getattr(np, name, None)
        if isinstance(value, (type, np.dtype, int, float, str)) and name != "ndarray":
            return value  # dtypes (float32, bool_, dtype, finfo, ...) and constants (inf, pi)
        raise AttributeError(
            f"the meta backend's array namespace has no '{name}'; add it to tinygrad_ckpt/backend/meta.py "
            "(it must compute the result's shape, dtype and layout, and whether it is a view)"
        )

    def __repr__(self) -> str:
        return "<tinygrad_ckpt.meta array namespace>"


xp = _Namespace()


# ---- random numbers and the backend ----------------------------------------------------------
def _random_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"Unsupported dtype {dtype!r} for random")
    return dtype


def _sample(size, dtype):
    return MetaScalar(dtype) if size is None else MetaArray(_shape_arg(size), dtype)


class MetaGenerator:
    """Draws shapes, not numbers: the meta stand-in for numpy.random.Generator."""

    def random(self, size=None, dtype=np.float64, out=None):
        return _sample(size, _random_dtype(dtype))

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        return _sample(size, _random_dtype(dtype))

    def normal(self, loc=0.0, scale=1.0, size=None):
        return _sample(size, np.float64)

    def uniform(self, low=0.0, high=1.0, size=None):
        return _sample(size, np.float64)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        return _sample(size, np.dtype(dtype))

    def permutation(self, x):
        n = x if isinstance(x, (int, np.integer)) else len(x)
        return MetaArray((n,), np.int64 if isinstance(x, (int, np.integer)) else x.dtype)


class MetaBackend(Backend):
    """tg.use_backend("meta"): shape-only arrays; the ledger counts them as if they were NumPy's."""

    name = "meta"

    def __init__(self):
        self.xp = xp

    def is_array(self, a) -> bool:
        return isinstance(a, MetaArray) and not isinstance(a, MetaScalar)

    def buffer(self, a):
        owner = a.base if a.base is not None else a
        return owner, owner.nbytes

    def to_numpy(self, a):
        raise _no_data("to_numpy() / Tensor.numpy() / Tensor.item()")

    def asarray(self, data, dtype=None):
        return asarray(data, dtype=dtype)

    def erf(self, x):
        from scipy.special import erf  # only its dtype rule is used (float16 -> float64, as SciPy does)

        return _elementwise(erf, (x,))

    def generator(self, seed: int, counter: int):
        return MetaGenerator()

