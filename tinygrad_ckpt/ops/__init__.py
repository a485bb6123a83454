"""The ops, grouped by kind, and the small functions `Tensor` methods and `functional` call.

Python numbers become 0-d constants in the dtype of the tensor they meet, so `x * 0.5` stays
float32 when x is float32. As in PyTorch, a float meeting an integer or bool tensor promotes both to
float32 (`ints * 0.5` is float, not a truncated integer).
"""

from __future__ import annotations

from ._util import constant, unbroadcast
from .attention import ChunkedAttention
from .elementwise import Add, Div, Exp, Log, MaskedFill, Mul, Neg, Pow, Scale, Sub, Tanh
from .linalg import Linear, MatMul
from .movement import Embedding, GetItem, Permute, Reshape, Split, Swapaxes
from .nn import GELU, CrossEntropy, Dropout, LayerNorm, LogSoftmax, Softmax
from .reduce import Max, Mean, Sum

__all__ = [
    "Add", "Sub", "Mul", "Scale", "Div", "Neg", "Pow", "Exp", "Log", "Tanh", "MaskedFill", "MatMul", "Linear",
    "Reshape", "Permute", "Swapaxes", "GetItem", "Split", "Embedding", "GELU", "Softmax", "LogSoftmax",
    "CrossEntropy", "LayerNorm", "Dropout", "ChunkedAttention", "Sum", "Mean", "Max", "unbroadcast",
]


def _promoted(t, value):
    """(t, value as a 0-d constant of t's dtype), except where PyTorch promotes: a float meeting an integer or
    bool tensor makes both float32, an int meeting a bool tensor makes both int64 (such tensors cannot require
    grad, so their converted data may stand in for them)."""
    kind = t.dtype.kind
    target = "float32" if isinstance(value, float) and kind in "iub" else (
        "int64" if kind == "b" and not isinstance(value, bool) else None)
    if target is not None:
        data = t.data.astype(target)
        return data, constant(value, data)
    return t, constant(value, t.data)


def _pair(a, b):
    """Turn a Python number on either side into a constant of the other side's dtype (promoted as above)."""
    from ..tensor import Tensor

    if not isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(a, (int, float)):
        b, a = _promoted(b, a)
    if not isinstance(b, Tensor) and isinstance(a, Tensor) and isinstance(b, (int, float)):
        a, b = _promoted(a, b)
    return a, b


def add(a, b):
    return Add.apply(*_pair(a, b))


def sub(a, b):
    return Sub.apply(*_pair(a, b))


def mul(a, b):
    """a * b; a Python number on either side becomes a Scale op, which saves nothing."""
    from ..tensor import Tensor

    if isinstance(a, (int, float)) and isinstance(b, Tensor):
        a, b = b, a
    if isinstance(b, (int, float)) and isinstance(a, Tensor):
        return Scale.apply(_promoted(a, b)[0], factor=b)
    return Mul.apply(a, b)


def div(a, b):
    """a / b, true division: an integer Python number divides as a float (ints / 2 is float32, as in PyTorch)."""
    a, b = (float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in (a, b))
    return Div.apply(*_pair(a, b))


def neg(x):
    return Neg.apply(x)


def pow(x, exponent):
    if not isinstance(exponent, (int, float)):
        raise TypeError(f"pow: only a constant Python number exponent is supported, got {type(exponent).__name__}")
    return Pow.apply(x, exponent=exponent)


def exp(x):
    return Exp.apply(x)


def log(x):
    return Log.apply(x)


def tanh(x):
    return Tanh.apply(x)


def matmul(a, b):
    return MatMul.apply(a, b)


def sum(x, axis=None, keepdims=False):  # noqa: A001  (mirrors the method name)
    return Sum.apply(x, axis=axis, keepdims=keepdims)


def mean(x, axis=None, keepdims=False):
    return Mean.apply(x, axis=axis, keepdims=keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return Max.apply(x, axis=axis, keepdims=keepdims)


def reshape(x, shape):
    return Reshape.apply(x, shape=tuple(shape))


def permute(x, axes):
    return Permute.apply(x, axes=tuple(axes))


def swapaxes(x, axis1, axis2):
    return Swapaxes.apply(x, axis1=axis1, axis2=axis2)


def split(x, split_size_or_sections, axis=0):
    """PyTorch's split: pieces of `split_size_or_sections` along `axis` (the last one shorter if the length is not a
    multiple), or of the listed sizes, as a tuple of views."""
    length = x.shape[axis] if -x.ndim <= axis < x.ndim else None
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
    from ..tensor import Tensor

    if isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    elif isinstance(index, Tensor):
        index = index.data
    return GetItem.apply(x, index=index)
