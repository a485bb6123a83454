"""The ops, grouped by kind, and the small functions `Tensor` methods and `functional` call.

Python numbers become 0-d constants in the dtype of the tensor they meet, so `x * 0.5` stays
float32 when x is float32.
"""

from __future__ import annotations

from ._util import constant, unbroadcast
from .elementwise import Add, Div, Exp, Log, MaskedFill, Mul, Neg, Pow, Scale, Sub, Tanh
from .linalg import Linear, MatMul
from .movement import Embedding, GetItem, Permute, Reshape, Swapaxes
from .nn import GELU, CrossEntropy, Dropout, LayerNorm, LogSoftmax, Softmax
from .reduce import Max, Mean, Sum

__all__ = [
    "Add", "Sub", "Mul", "Scale", "Div", "Neg", "Pow", "Exp", "Log", "Tanh", "MaskedFill", "MatMul", "Linear",
    "Reshape", "Permute", "Swapaxes", "GetItem", "Embedding", "GELU", "Softmax", "LogSoftmax",
    "CrossEntropy", "LayerNorm", "Dropout", "Sum", "Mean", "Max", "unbroadcast",
]


def _pair(a, b):
    """Turn a Python number on either side into a constant of the other side's dtype."""
    from ..tensor import Tensor

    if not isinstance(a, Tensor) and isinstance(b, Tensor) and isinstance(a, (int, float)):
        a = constant(a, b.data)
    if not isinstance(b, Tensor) and isinstance(a, Tensor) and isinstance(b, (int, float)):
        b = constant(b, a.data)
    return a, b


def add(a, b):
    return Add.apply(*_pair(a, b))


def sub(a, b):
    return Sub.apply(*_pair(a, b))


def mul(a, b):
    """a * b; a Python number on either side becomes a Scale op, which saves nothing."""
    from ..tensor import Tensor

    if isinstance(b, (int, float)) and isinstance(a, Tensor):
        return Scale.apply(a, factor=b)
    if isinstance(a, (int, float)) and isinstance(b, Tensor):
        return Scale.apply(b, factor=a)
    return Mul.apply(a, b)


def div(a, b):
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


def getitem(x, index):
    from ..tensor import Tensor

    if isinstance(index, Tensor):
        index = index.data
    return GetItem.apply(x, index=index)
