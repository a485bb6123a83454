"""`Tensor`: an array plus what autograd needs to know about it. No math lives here.

A tensor holds its `data` (a backend array), `requires_grad`, an optional `name`, its `.grad`
(a backend array, for leaves) and, when an op made it, `_entry` (that op's tape entry, which keeps
the graph behind the tensor alive) and `_index` (which output of the op it is). Operators call the
functions in `ops/`.

In-place methods (`add_`, `sub_`, `mul_`, `zero_`, `copy_`) change `data` and bump its version, so
an entry that saved the old values refuses to run backward; `x += y` builds a new tensor.

As in PyTorch: comparisons (`==`, `<`, ...) are elementwise and give bool tensors that need no grad, so
a tensor is hashed by identity (the engine keys tensors by `id`) and `x in [y]` compares values (and
raises for more than one element, as `bool()` of a tensor does); NumPy arrays on the left of an
operator defer to the tensor (`np_array + t` is a Tensor on the graph).
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import backend, state
from ..checks import dtype_of, kind
from . import observe
from .arraylike import ArrayLike
from .tape import Tape, backward_steps, graph, run_steps


def _as_array(data, dtype):
    """A backend array for `data`; Python floats and lists become float32 (NumPy arrays keep theirs)."""
    if isinstance(data, Tensor):
        raise TypeError(f"Tensor(data): data is already a Tensor ({list(data.shape)} {data.dtype}); use t.detach() for "
                        "a tensor of the same data cut from the graph, or tg.Tensor(t.numpy().copy()) for a copy")
    be = backend.current()
    dtype = None if dtype is None else dtype_of("Tensor(dtype=...)", dtype)
    found = data.dtype if hasattr(data, "dtype") else np.asarray(data).dtype
    _refuse_complex("Tensor(data)", found)
    if be.is_array(data):
        return data if dtype is None or data.dtype == dtype else data.astype(dtype)
    if dtype is None and not isinstance(data, np.ndarray):
        dtype = np.float32 if found == np.float64 else found
    return be.asarray(data, dtype=dtype)


def _refuse_complex(call: str, dtype) -> None:
    """TypeError naming the call for complex values, which converting to a real dtype would cut to their real part
    (with only NumPy's ComplexWarning)."""
    if getattr(dtype, "kind", None) == "c" or dtype is complex:
        raise TypeError(f"{call}: complex values ({dtype}) are not supported: tensors are real, and converting would "
                        "drop the imaginary part; pass x.real, abs(x) or the two parts as separate tensors")


class Tensor:
    """An n-dimensional array that records the ops applied to it when it requires grad."""

    __slots__ = ("data", "requires_grad", "name", "_grad", "_uid", "_entry", "_index", "__weakref__")
    is_parameter = False
    grad_dtype = None  # the dtype `.grad` accumulates in: the tensor's own (Parameter can say otherwise)
    __array_ufunc__ = None  # NumPy's operators return NotImplemented, so Python calls ours (np_array + t: __radd__)
    __hash__ = object.__hash__  # by identity: == compares values

    def __init__(self, data, requires_grad: bool = False, name: str | None = None, dtype=None):
        self._init(_as_array(data, dtype), requires_grad, None, 0)
        self.name = name
        if self.requires_grad:
            self._check_differentiable("Tensor(requires_grad=True)")
        observe.alloc(self.data, "parameter" if self.is_parameter else "other", self.name or "tensor")

    def _init(self, data, requires_grad, entry, index) -> None:
        self.data = data
        self.requires_grad = bool(requires_grad)
        self.name = None
        self._grad = None
        self._uid = state.new_tensor(self)  # creation order (a checkpoint tells tensors made inside it from older
        # ones); the tensor is remembered weakly, so a Ledger entered later finds what it holds
        self._entry, self._index = entry, index

    @classmethod
    def _from_op(cls, data, requires_grad: bool, entry, index: int) -> Tensor:
        """Wrap output `index` of an op (no conversion; the observer hears of it from Function.apply)."""
        t = object.__new__(cls)
        t._init(data, requires_grad, entry, index)
        return t

    # ---- autograd -------------------------------------------------------------------------
    @property
    def grad(self):
        """The gradient backward accumulated (leaves only). Read on a tensor an op made, it warns, as PyTorch's."""
        if self._grad is None and self._entry is not None:
            warnings.warn(_not_a_leaf(self), UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value) -> None:
        if value is not None:
            _check_grad(self, value)
            observe.alloc(value, "gradient", self.name or "tensor", "grad")
        if self._grad is not None:
            observe.used(self._grad)  # dropped or replaced: the code used it (a Ledger's "untouched" ends)
        self._grad = value

    @property
    def is_leaf(self) -> bool:
        return self._entry is None

    def tape(self) -> Tape:
        """The entries this tensor depends on, in forward order: print it to read the graph."""
        return Tape(graph([self]))

    def backward(self, grad=None, retain_graph: bool = False) -> None:
        """Backpropagate from this tensor; leaf tensors accumulate their gradient in `.grad`.

        Each entry's saves are released once its backward ran: a second backward through them raises
        unless the first passed retain_graph=True."""
        run_steps(self.backward_steps(grad, retain_graph))

    def backward_steps(self, grad=None, retain_graph: bool = False):
        """The backward pass as a generator: yields each tape entry just before its backward runs."""
        if not self.requires_grad:
            raise RuntimeError(
                f"backward() on a tensor of shape {list(self.shape)} that does not require grad: "
                "no input of the computation had requires_grad=True (or it ran under tg.no_grad())."
            )
        if grad is None:
            if self.size != 1:
                raise RuntimeError(
                    f"backward() on a non-scalar tensor of shape {list(self.shape)} needs the gradient of the "
                    "loss with respect to it: call .backward(grad) with an array of that shape, or reduce it "
                    "to a scalar first (e.g. .sum() or .mean())."
                )
            grad = backend.xp().ones(self.shape, dtype=self.dtype)
        else:
            grad = _seed_gradient(self, grad)
        return backward_steps([self], [grad], retain_graph)

    def _accumulate_grad(self, g) -> None:
        """self.grad += g, as PyTorch's AccumulateGrad: the first gradient becomes `.grad` (backward hands over
        an array it made and no one else holds: tape._Gradients decides), later ones add into it in place."""
        if self._grad is None:
            if self.grad_dtype is not None and g.dtype != self.grad_dtype:
                g = g.astype(self.grad_dtype)
            observe.alloc(g, "gradient", self.name or "tensor", "grad")
            self._grad = g
        else:
            self._grad += g
        observe.used(self.data, self._grad)  # its gradient was taken (for a Ledger: used, not "untouched")

    def detach(self) -> Tensor:
        """Same data (no copy), cut from the graph."""
        return Tensor(self.data, requires_grad=False, name=self.name)

    def requires_grad_(self, flag: bool = True) -> Tensor:
        """Change whether a leaf tensor records (PyTorch's rule: only leaves, only floating point)."""
        if self._entry is not None and not flag:
            raise RuntimeError(
                f"requires_grad_(False): only a leaf tensor can stop requiring grad; this one was made by "
                f"'{self._entry.name}' [{self._entry.op}] and is part of its graph. Use t.detach() for a tensor "
                "with the same data cut from the graph."
            )
        self.requires_grad = bool(flag)
        if self.requires_grad:
            self._check_differentiable("requires_grad_(True)")
        return self

    def _check_differentiable(self, call: str) -> None:
        if kind(self.dtype) != "f":
            self.requires_grad = False
            raise TypeError(
                f"{call}: only floating-point tensors can require gradients, got dtype {self.dtype} "
                f"(shape {list(self.shape)}). Convert first, e.g. tg.Tensor(x.astype(np.float32), requires_grad=True)."
            )
        state.grad_leaves[id(backend.current().buffer(self.data)[0])] = self  # see _change

    def zero_grad(self) -> None:
        self.grad = None

    # ---- in-place changes -----------------------------------------------------------------
    @property
    def _version(self) -> int:
        """How many times the buffer behind `data` was changed in place (PyTorch's `t._version`)."""
        change = state.changed.get(id(backend.current().buffer(self.data)[0]))
        return change[1] if change else 0

    def _change(self, method: str, update, other=None) -> Tensor:
        if state.local.grad_enabled:
            if self.requires_grad or getattr(other, "requires_grad", False):
                raise RuntimeError(
                    f"{method}: '{self.name or 'tensor'}' {list(self.shape)} takes part in a graph (it or the other "
                    "operand requires grad), and an in-place change cannot be recorded. Change it under "
                    "`with tg.no_grad():` (as optimizers do), or use the out-of-place operator (x = x + y)."
                )
            leaf = _leaf_viewed_by(self)
            if leaf is not None:
                raise RuntimeError(
                    f"{method}: a view of a leaf Variable that requires grad is being used in an in-place operation "
                    f"(PyTorch's words): this {list(self.shape)} tensor views the buffer of '{leaf.name or 'tensor'}' "
                    f"{list(leaf.shape)}, taken before requires_grad was set or under no_grad. Change it under "
                    "`with tg.no_grad():`, or change a copy."
                )
        _refuse_complex(method, other.dtype if hasattr(other, "dtype") else type(other))
        update(self.data, _raw(other))
        observe.used(self.data, _raw(other))
        increment_version(self)
        return self

    def add_(self, other) -> Tensor:
        return self._change("add_", lambda a, b: a.__iadd__(b), other)

    def sub_(self, other) -> Tensor:
        ops.no_bool("sub_", self, other)
        return self._change("sub_", lambda a, b: a.__isub__(b), other)

    def mul_(self, other) -> Tensor:
        return self._change("mul_", lambda a, b: a.__imul__(b), other)

    def copy_(self, src) -> Tensor:
        return self._change("copy_", lambda a, b: a.__setitem__(Ellipsis, b), src)

    def zero_(self) -> Tensor:
        return self._change("zero_", lambda a, _: a.__setitem__(Ellipsis, 0))

    # ---- data access: the array side, written in engine/arraylike.py and taken here by name, in place ------
    shape, dtype, ndim, size, nbytes = (ArrayLike.shape, ArrayLike.dtype, ArrayLike.ndim, ArrayLike.size,
                                        ArrayLike.nbytes)
    numpy, item, __array__, __repr__ = ArrayLike.numpy, ArrayLike.item, ArrayLike.__array__, ArrayLike.__repr__
    __len__, __iter__, __bool__ = ArrayLike.__len__, ArrayLike.__iter__, ArrayLike.__bool__

    # ---- operators (implemented in ops/) ----------------------------------------------------
    def __add__(self, other):
        return ops.add(self, other)

    def __radd__(self, other):
        return ops.add(other, self)

    def __sub__(self, other):
        return ops.sub(self, other)

    def __rsub__(self, other):
        return ops.sub(other, self)

    def __mul__(self, other):
        return ops.mul(self, other)

    def __rmul__(self, other):
        return ops.mul(other, self)

    def __truediv__(self, other):
        return ops.div(self, other)

    def __rtruediv__(self, other):
        return ops.div(other, self)

    def __neg__(self):
        return ops.neg(self)

    def __pow__(self, exponent):
        return ops.pow(self, exponent)

    def __matmul__(self, other):
        return ops.matmul(self, other)

    def __rmatmul__(self, other):
        return ops.matmul(other, self)

    def __getitem__(self, index):
        return ops.getitem(self, index)

    def __eq__(self, other):
        return ops.compare("eq", self, other)

    def __ne__(self, other):
        return ops.compare("ne", self, other)

    def __lt__(self, other):
        return ops.compare("lt", self, other)

    def __le__(self, other):
        return ops.compare("le", self, other)

    def __gt__(self, other):
        return ops.compare("gt", self, other)

    def __ge__(self, other):
        return ops.compare("ge", self, other)

    def exp(self):
        return ops.exp(self)

    def log(self):
        return ops.log(self)

    def tanh(self):
        return ops.tanh(self)

    def sqrt(self):
        return ops.sqrt(self)

    def rsqrt(self):
        return ops.rsqrt(self)

    def sigmoid(self):
        return ops.sigmoid(self)

    def relu(self):
        return ops.relu(self)

    def to(self, dtype) -> Tensor:
        """This tensor in `dtype` (itself if it has it), as PyTorch's .to(dtype): on the graph, its gradient cast
        back. `dtype`: a NumPy dtype or one of autocast's names ("bf16", "bfloat16", "fp16", "fp32", ...)."""
        dtype = dtype_of("Tensor.to", dtype)
        return self if dtype == self.dtype else ops.Cast.apply(self, dtype=dtype)

    def sum(self, axis=None, keepdims=False):
        return ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis=None, keepdims=False):
        return ops.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis=None, keepdims=False):
        return ops.max(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape):
        """This tensor under a new shape (a view where the layout allows, else a copy)."""
        return ops.reshape(self, _shape(shape))

    def view(self, *shape):
        """This tensor's buffer under a new shape, as PyTorch's view: where that needs a copy it raises (reshape
        copies)."""
        return ops.view(self, _shape(shape))

    def contiguous(self):
        """This tensor in row-major layout (itself if it is), as PyTorch's: what .view() needs after a permute."""
        return self if ops.movement.is_contiguous(self.data) else ops.movement.Contiguous.apply(self)

    def permute(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.permute(self, axes)

    def transpose(self, *axes):
        """`t.transpose()` reverses the axes (NumPy); `t.transpose(a, b)` swaps two (PyTorch)."""
        if len(axes) == 2 and all(isinstance(a, int) for a in axes):
            return ops.swapaxes(self, *axes)
        if not axes:
            axes = tuple(reversed(range(self.ndim)))
        return self.permute(*axes)

    def swapaxes(self, axis1: int, axis2: int):
        return ops.swapaxes(self, axis1, axis2)

    def split(self, split_size_or_sections, dim: int = 0):
        """PyTorch's split: views of `split_size_or_sections` along `dim` (an int: equal pieces, the last
        shorter; a list: those sizes)."""
        return ops.split(self, split_size_or_sections, dim)

    @property
    def T(self):
        return self.transpose()


class Parameter(Tensor):
    """A trainable leaf tensor owned by a module (counted as "parameter" by the ledger). `grad_dtype`: the dtype its
    `.grad` accumulates in, None for its own; float32 for a half-precision parameter is Megatron's "main grad"
    (mixed precision: half weights, gradients summed in float32 for a float32 master copy)."""

    __slots__ = ("grad_dtype",)
    is_parameter = True

    def __init__(self, data, name: str | None = None, grad_dtype=None):
        super().__init__(data, requires_grad=True, name=name)
        self.grad_dtype = None if grad_dtype is None else np.dtype(grad_dtype)


def increment_version(tensor: Tensor) -> int:
    """Tell autograd that `tensor.data` was changed in place (an optimizer does, after its update): entries
    that saved it before now refuse to run backward. Returns the new version."""
    return state.mark_changed(backend.current().buffer(tensor.data)[0], tensor.name or f"tensor {list(tensor.shape)}")


def _seed_gradient(tensor: Tensor, grad):
    """The gradient a caller passed to backward(), as PyTorch takes it: the tensor's shape, cast to its dtype."""
    be = backend.current()
    grad = be.as_array(grad.data if isinstance(grad, Tensor) else grad)
    if not be.is_array(grad):
        if not isinstance(grad, (int, float, list, tuple, np.ndarray)) or isinstance(grad, bool):
            raise TypeError(f"backward(grad): grad must be a {be.name} array or a Tensor of shape "
                            f"{list(tensor.shape)}, got {type(grad).__name__}")
        grad = be.asarray(grad)
    _refuse_complex("backward(grad)", grad.dtype)
    if tuple(grad.shape) != tensor.shape:
        raise ValueError(f"backward(grad): grad has shape {list(grad.shape)}, the tensor {list(tensor.shape)}; "
                         "pass the gradient of the loss with respect to this tensor, of its shape")
    return grad if grad.dtype == tensor.dtype else grad.astype(tensor.dtype)


def _check_grad(tensor: Tensor, value) -> None:
    """Raise unless `value` may be assigned to `tensor.grad`: a backend array of its shape and gradient dtype."""
    be, label = backend.current(), tensor.name or "tensor"
    if not be.is_array(value):
        raise TypeError(f".grad of '{label}' must be a {be.name} array (as backward leaves it), got "
                        f"{type(value).__name__}; for a Tensor g, assign g.data.")
    if tuple(value.shape) != tensor.shape or value.dtype != (tensor.grad_dtype or tensor.dtype):
        raise ValueError(f".grad of '{label}' must match the tensor: {list(tensor.shape)} "
                         f"{tensor.grad_dtype or tensor.dtype}, got "
                         f"{list(value.shape)} {value.dtype}.")


def _not_a_leaf(t: Tensor) -> str:
    return (f"The .grad attribute of a Tensor that is not a leaf Tensor is being accessed (PyTorch's words): "
            f"'{t.name or 'tensor'}' {list(t.shape)} was made by '{t._entry.name}', and backward fills .grad of leaves "
            "only, so it stays None. Read the .grad of the leaf (a parameter, an input made with requires_grad=True), "
            "or make this one a leaf where it is made: h = h.detach().requires_grad_()")


def _raw(x):
    return x.data if isinstance(x, Tensor) else x


def _shape(args) -> tuple:
    """reshape(2, 3) and reshape((2, 3)) alike."""
    return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else args


def _leaf_viewed_by(t: Tensor) -> Tensor | None:
    """The leaf requiring grad whose buffer `t.data` is a view of (not its very array: a detach() may change it in
    place), or None. Leaves are found by buffer in state.grad_leaves, and checked, since a buffer id may be reused."""
    owner = backend.current().buffer(t.data)[0]
    leaf = state.grad_leaves.get(id(owner))
    if leaf is None or not leaf.requires_grad or leaf.data is t.data:
        return None
    return leaf if backend.current().buffer(leaf.data)[0] is owner else None


from .. import ops  # noqa: E402  (ops needs Tensor; imported last to close the cycle)
