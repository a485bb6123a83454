"""The ops, grouped by kind, and the small functions `Tensor` methods and `functional` call.

Operands meet as in PyTorch. Python numbers become 0-d constants in the dtype of the tensor they meet,
so `x * 0.5` stays float32 when x is float32; a float meeting an integer or bool tensor promotes both
to float32 (`ints * 0.5` is float, not a truncated integer). An integer or bool tensor meeting a
floating one takes its dtype (NumPy would make int64 * float32 float64); integers divide to float32,
and exp, log and tanh of integers are float32. Lists, tuples and other objects are refused: make
them tensors first (PyTorch refuses them too).

An op whose idea nn also names as a Module ends in Op (LinearOp, EmbeddingOp, SiLUOp, LayerNormOp, RMSNormOp,
DropoutOp: the autograd Function, beside nn.LayerNorm, the module holding its parameters); the tape shows an
op's kind (`op`, "layer_norm"), not its class name.
"""

from __future__ import annotations

import builtins

import numpy as np

from .. import backend, state
from ..backend import xp
from ..checks import kind
from ..engine.tensor import Tensor  # tensor.py imports this package last, so either may be imported first
from ._util import broadcast_shape, constant, unbroadcast
from .attention import ChunkedAttention
from .elementwise import Add, Cast, Div, Exp, Log, MaskedFill, Mul, Neg, Pow, Rsqrt, Scale, Sigmoid, Sqrt, Sub, Tanh
from .linalg import LinearOp, MatMul
from .moe import Combine, Dispatch, TopKRouting
from .movement import Concatenate, EmbeddingOp, GetItem, Permute, Reshape, Split, Swapaxes, View
from .nn import GELU, CrossEntropy, DropoutOp, LayerNormOp, LogSoftmax, ReLU, RMSNormOp, SiLUOp, Softmax
from .reduce import Max, Mean, Sum
from .rotary import Rotary

__all__ = [
    "Add", "Sub", "Mul", "Scale", "Div", "Cast", "Neg", "Pow", "Exp", "Log", "Tanh", "Sqrt", "Rsqrt", "Sigmoid",
    "MaskedFill", "MatMul", "LinearOp", "Reshape", "View", "Permute", "Swapaxes", "GetItem", "Split", "Concatenate",
    "EmbeddingOp", "GELU", "SiLUOp", "ReLU", "Softmax", "LogSoftmax", "CrossEntropy", "LayerNormOp", "RMSNormOp",
    "DropoutOp", "ChunkedAttention", "Rotary", "TopKRouting", "Dispatch", "Combine", "Sum", "Mean", "Max",
    "unbroadcast",
]

_NUMBERS = (int, float)  # bool is an int
_BOOL = np.dtype(bool)


def _promoted(t, value):
    """(t, value as a 0-d constant of t's dtype), except where PyTorch promotes: a float meeting an integer or
    bool tensor makes both float32, an int meeting a bool tensor makes both int64 (such tensors cannot require
    grad, so their converted data may stand in for them)."""
    k = kind(t.dtype)
    target = "float32" if isinstance(value, float) and k in "iub" else (
        "int64" if k == "b" and not isinstance(value, bool) else None)
    if target is not None:
        data = _raw(t).astype(target)
        return data, constant(value, data)
    return t, constant(value, _raw(t))


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}


def _mixed(a, b):
    """(a, b) in the one dtype PyTorch computes them in: the higher category (bool < integer < floating) wins; within
    one, a dimensioned operand's dtype wins over a 0-d one's (float16 [3] * float64 [] is float16); else NumPy's
    promotion, which there is PyTorch's. An operand that requires grad is cast by an op, so its gradient flows back."""
    rank_a, rank_b = _CATEGORY[kind(a.dtype)], _CATEGORY[kind(b.dtype)]
    if rank_a != rank_b:
        dtype = (a if rank_a > rank_b else b).dtype
    elif bool(a.shape) != bool(b.shape):
        dtype = (a if a.shape else b).dtype
    else:
        dtype = np.promote_types(a.dtype, b.dtype)
    return cast(a, dtype), cast(b, dtype)


def autocast_inputs(category: str, *xs):
    """The inputs as PyTorch's autocast runs an op: inside `tg.autocast(dtype)`, an op of category "half" (matmul,
    linear, attention) takes its floating-point inputs in that dtype, one of category "float32" (softmax, norms,
    cross-entropy) in float32; outside, as they are. Each cast of a tensor that requires grad is a Cast op, so its
    gradient flows back in its own dtype (the float32 weight of an AMP run gets a float32 gradient)."""
    half = state.local.autocast
    if half is None:
        return xs
    dtype = half if category == "half" else np.dtype(np.float32)
    return tuple(cast(x, dtype) if hasattr(x, "dtype") and kind(x.dtype) == "f" else x for x in xs)


def promoted_dtype(dtypes):
    """The dtype PyTorch computes tensors of these dtypes in (all with dimensions): the highest category (bool <
    integer < floating) wins, and within it NumPy's promotion, which there is PyTorch's."""
    dtypes = [np.dtype(d) for d in dtypes]
    top = builtins.max(_CATEGORY[kind(d)] for d in dtypes)
    return np.result_type(*(d for d in dtypes if _CATEGORY[kind(d)] == top))


def cast(x, dtype):
    """x in `dtype`: itself if it has it, a Cast op if it requires grad, else its data converted."""
    if x.dtype == dtype:
        return x
    return Cast.apply(x, dtype=dtype) if isinstance(x, Tensor) and x.requires_grad else _raw(x).astype(dtype)


def _operand(op: str, v):
    """A binary op's operand: a Tensor, a backend array or a Python number as it is, a NumPy scalar as a Python
    number; anything else (a list, a tuple, a string) raises, naming the op."""
    if isinstance(v, (Tensor, int, float)) or backend.backend_of(v) is not None:  # arrays: apply checks the backend
        return v
    if isinstance(v, np.generic) and v.dtype.kind in "biuf":
        return v.item()
    raise TypeError(f"{op}: cannot combine a Tensor with a {type(v).__name__} ({v!r:.40}); make it a tensor first, "
                    "e.g. tg.Tensor(np.array(value)), as PyTorch asks too")


def _pair(op: str, a, b):
    """(a, b) ready for a binary op, as PyTorch promotes (see the module)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return (a, b) if a.data.dtype == b.data.dtype else _mixed(a, b)
    a, b = _operand(op, a), _operand(op, b)
    if isinstance(b, _NUMBERS):
        return _promoted(a, b)
    if isinstance(a, _NUMBERS):
        b, a = _promoted(b, a)
        return a, b
    return (a, b) if a.dtype == b.dtype else _mixed(a, b)


def _raw(x):
    """A Tensor's data; anything else as it is."""
    return x.data if isinstance(x, Tensor) else x


def add(a, b):
    return Add.apply(*_pair("add", a, b))


def sub(a, b):
    """a - b; not with a bool operand, as in PyTorch (checked before promotion, which would make it a number)."""
    no_bool("sub", a, b)
    return Sub.apply(*_pair("sub", a, b))


def no_bool(op: str, a, b) -> None:
    for v in (a.data if isinstance(a, Tensor) else a, b.data if isinstance(b, Tensor) else b):
        if v.__class__ is bool or getattr(v, "dtype", None) is _BOOL:
            raise TypeError(f"{op}: cannot subtract with a bool operand, as in PyTorch; convert it to an integer or "
                            "float dtype first, x.to(np.int64) (for masks, a.numpy() ^ b.numpy() is their xor)")


def mul(a, b):
    """a * b; a Python number on either side becomes a Scale op, which saves nothing."""
    if isinstance(a, _NUMBERS) and isinstance(b, Tensor):
        a, b = b, a
    if isinstance(b, _NUMBERS) and isinstance(a, Tensor):
        return Scale.apply(_promoted(a, b)[0], factor=b)
    return Mul.apply(*_pair("mul", a, b))


def div(a, b):
    """a / b, true division: integers divide as floats (ints / 2 and ints / ints are float32, as in PyTorch)."""
    a, b = _pair("div", *(float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in (a, b)))
    if kind(a.dtype) != "f" and kind(b.dtype) != "f":
        a, b = _raw(a).astype(np.float32), _raw(b).astype(np.float32)
    return Div.apply(a, b)


_COMPARISONS = {"eq": "equal", "ne": "not_equal", "lt": "less", "le": "less_equal", "gt": "greater",
                "ge": "greater_equal"}


def compare(op: str, a, b):
    """a `op` b elementwise (op: eq, ne, lt, le, gt, ge): a bool tensor that does not require grad, not recorded (a
    comparison has no gradient). Operands meet as in arithmetic; `b` of any other type gives NotImplemented, so
    `x == None` is False and `x < None` raises, as in PyTorch."""
    if not isinstance(b, (Tensor, int, float, np.generic)) and backend.backend_of(b) is None:
        return NotImplemented
    a, b = (_raw(v) for v in _pair(op, a, b))
    broadcast_shape(op, a.shape, b.shape)
    return Tensor(backend.current().as_array(getattr(xp(), _COMPARISONS[op])(a, b)))


def neg(x):
    return Neg.apply(x)


def pow(x, exponent):
    if isinstance(exponent, np.generic):
        exponent = exponent.item()
    if not isinstance(exponent, _NUMBERS):
        raise TypeError(f"pow: only a constant Python number exponent is supported, got {type(exponent).__name__}")
    if isinstance(exponent, int) and exponent < 0 and kind(x.dtype) in "biu":
        raise ValueError(f"pow: integers to negative integer powers are not allowed ({x.dtype} ** {exponent}), as in "
                         "PyTorch; use a float exponent or convert the tensor, x.to(np.float32)")
    return Pow.apply(_promoted(x, exponent)[0], exponent=exponent)


def _floating(x):
    """x, or an integer or bool tensor's data as float32 (PyTorch's exp, log and tanh of integers)."""
    return x if kind(x.dtype) == "f" else _raw(x).astype(np.float32)


def exp(x):
    return Exp.apply(_floating(x))


def log(x):
    return Log.apply(_floating(x))


def tanh(x):
    return Tanh.apply(_floating(x))


def sqrt(x):
    return Sqrt.apply(_floating(x))


def rsqrt(x):
    return Rsqrt.apply(_floating(x))


def sigmoid(x):
    return Sigmoid.apply(_floating(x))


def relu(x):
    return ReLU.apply(x)


def matmul(a, b):
    """a @ b; as in PyTorch and NumPy, a 1-d operand is a row on the left or a column on the right, and that axis is
    dropped from the result."""
    if isinstance(a, Tensor) and isinstance(b, Tensor) and a.data.ndim > 1 and b.data.ndim > 1:
        return MatMul.apply(*autocast_inputs("half", a, b))
    a, b = autocast_inputs("half", _operand("matmul", a), _operand("matmul", b))
    if isinstance(a, _NUMBERS) or isinstance(b, _NUMBERS):
        raise TypeError(f"matmul: cannot multiply {a!r:.40} by {b!r:.40} with @: both must be tensors; use * for a "
                        "number")
    row, column = len(a.shape) == 1, len(b.shape) == 1
    if not (row or column):
        return MatMul.apply(a, b)
    out = MatMul.apply(reshape(a, (1, -1)) if row else a, reshape(b, (-1, 1)) if column else b)
    kept = out.shape[:-2] + out.shape[-2:][row:2 - column]
    return reshape(out, kept)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (mirrors the method name)
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return Max.apply(x, axis=axis, keepdims=keepdims)


def reshape(x, shape):
    return Reshape.apply(x, shape=tuple(shape))


def view(x, shape):
    return View.apply(x, shape=tuple(shape))


def permute(x, axes):
    return Permute.apply(x, axes=tuple(axes))


def swapaxes(x, axis1, axis2):
    return Swapaxes.apply(x, axis1=axis1, axis2=axis2)


def split(x, split_size_or_sections, axis=0):
    """PyTorch's split: pieces of `split_size_or_sections` along `axis` (the last one shorter if the length is not a
    multiple), or of the listed sizes, as a tuple of views."""
    length = x.shape[axis] if isinstance(axis, int) and -x.ndim <= axis < x.ndim else None
    if isinstance(split_size_or_sections, int) and not isinstance(split_size_or_sections, bool):
        size = split_size_or_sections
        if size < 0 or (size == 0 and length):
            raise ValueError(f"split: split_size must be a positive int, got {size}")
        sizes = [min(size, length - start) for start in range(0, length, size)] if length else [0]
    elif isinstance(split_size_or_sections, (list, tuple)) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in split_size_or_sections):
        sizes = list(split_size_or_sections)
    else:
        raise TypeError(f"split: split_size_or_sections must be an int or a list of ints, got "
                        f"{split_size_or_sections!r}")
    return Split.apply(x, sizes=tuple(sizes), axis=axis)


def getitem(x, index):
    """x[index]; Tensors in the index (alone or inside a tuple) index by their data."""
    from ..engine.tensor import Tensor

    if isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    elif isinstance(index, Tensor):
        index = index.data
    return GetItem.apply(x, index=index)
