"""Ops that move data without arithmetic: reshape, contiguous, permute, swapaxes, indexing, split, concatenation,
embedding lookup.

Most return views of their input, which the ledger counts once with the input's buffer. None of
them saves an array, except indexing with an integer array (it keeps the indices).
"""

from __future__ import annotations

import numpy as np

from .. import backend
from ..backend import xp
from ..engine.function import Function
from ._util import AxisError, axis_of, check_range, numel


class Reshape(Function):
    """out = x viewed with a new shape (a copy only if x is not contiguous). Saves nothing."""

    @staticmethod
    def forward(ctx, x, shape, call="reshape"):
        shape = tuple(shape)
        for n in shape:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
                raise TypeError(f"{call}: sizes must be integers, got {n!r} ({type(n).__name__}) in {list(shape)}; "
                                f"pass ints, e.g. x.{call}({', '.join(str(_as_int(m)) for m in shape)})")
        known = numel([n for n in shape if n != -1])
        if shape.count(-1) > 1 or (-1 not in shape and known != numel(x.shape)) or (
            -1 in shape and (known == 0 or numel(x.shape) % known)
        ):
            raise ValueError(
                f"{call}: cannot view an input of shape {list(x.shape)} ({numel(x.shape)} elements) "
                f"as {list(shape)}; the element counts must match (at most one -1)."
            )
        return x.reshape(shape)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.reshape(ctx.in_shapes[0])


def _as_int(n):
    """A size as the int it stands for where it is one (2.0 -> 2), else as it is (for an error's example)."""
    return int(n) if isinstance(n, float) and n.is_integer() else n


class View(Reshape):
    """out = x's buffer under a new shape, as PyTorch's view: where that needs a copy (x is not contiguous in the
    way the shape asks), it raises; reshape copies. Saves nothing."""

    @staticmethod
    def forward(ctx, x, shape):
        out = Reshape.forward(ctx, x, shape, call="view")
        be = backend.current()
        if be.buffer(out)[0] is not be.buffer(x)[0]:
            raise RuntimeError(
                f"view: view size is not compatible with input tensor's size and stride: a tensor of shape "
                f"{list(x.shape)} that is not contiguous (a permute or a strided slice of another) cannot be viewed as "
                f"{list(shape)} without a copy. Use .reshape(...) instead (it copies where it must)."
            )
        return out


class Contiguous(Function):
    """out = x laid out in row-major (C) order, in a new buffer: what .view() needs after a permute or a transpose
    (Tensor.contiguous returns x itself where it is laid out so already, as PyTorch's). Saves nothing; dL/dx = g."""

    @staticmethod
    def forward(ctx, x):
        return x.copy()

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out


def is_contiguous(a) -> bool:
    """a is laid out in row-major order: each stride is the item size times the lengths of the axes after it (axes
    of length 1 aside; an array of no elements is)."""
    if 0 in a.shape:
        return True
    expected = np.dtype(a.dtype).itemsize
    for n, stride in zip(reversed(a.shape), reversed(a.strides)):
        if n != 1 and stride != expected:
            return False
        expected *= n
    return True


class Permute(Function):
    """out = x with its axes reordered (a view). Saves nothing; backward applies the inverse order."""

    @staticmethod
    def forward(ctx, x, axes):
        if len(axes) != len(x.shape):
            raise AxisError(f"permute: {list(axes)} does not name each axis of a tensor of shape {list(x.shape)} once "
                            f"({len(x.shape)} axes, {len(axes)} given)")
        axes = tuple(axis_of("permute", a, x.shape) for a in axes) if x.shape else ()
        if len(set(axes)) < len(axes):
            raise AxisError(f"permute: {list(axes)} is not a permutation of the axes of {list(x.shape)}: an axis "
                            "appears twice")
        ctx.inverse = tuple(sorted(range(len(axes)), key=axes.__getitem__))
        return x.transpose(axes)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.transpose(ctx.inverse)


class Swapaxes(Function):
    """out = x with two axes exchanged (a view; a 0-d tensor's one axis with itself). Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis1, axis2):
        order = list(range(len(x.shape)))
        i, j = axis_of("swapaxes", axis1, x.shape), axis_of("swapaxes", axis2, x.shape)
        if order:
            order[i], order[j] = order[j], order[i]
        ctx.order = tuple(order)  # its own inverse
        return x.transpose(ctx.order)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.transpose(ctx.order)


def _describe(index) -> str:
    parts = index if isinstance(index, tuple) else (index,)
    return "[" + ", ".join(f"array{list(p.shape)}" if hasattr(p, "shape") else repr(p) for p in parts) + "]"


def _is_basic(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, (int, slice)) or p is None or p is Ellipsis for p in parts)


class GetItem(Function):
    """out = x[index]. Basic slicing gives a view; the gradient is scattered back (summed on repeats, with
    add.at: on CuPy its atomic adds may order a repeated index's sum differently from run to run).

    Indices follow NumPy's rules. PyTorch differs in one case: an integer and an array index separated by a
    slice (x[1, :, idx]) put the array's axes first in NumPy and leave them in place in PyTorch."""

    op = "getitem"

    @staticmethod
    def forward(ctx, x, index):
        ctx.index = index
        if not _is_basic(index):
            ctx.save(index=index)  # integer/boolean arrays: kept, since backward scatters through them
        try:
            return x[index]
        except IndexError as exc:
            raise IndexError(f"getitem: cannot index a tensor of shape {list(x.shape)} with {_describe(index)}: "
                             f"{exc}") from None

    @staticmethod
    def backward(ctx, grad_out):
        grad = xp().zeros(ctx.in_shapes[0], dtype=grad_out.dtype)
        if "index" in ctx.saved:
            xp().add.at(grad, ctx.saved["index"], grad_out)
        else:
            grad[ctx.index] = grad_out
        return grad


class Split(Function):
    """Consecutive pieces of x along `axis`, of the given `sizes` (views): attention's q, k and v out of one
    qkv buffer. Saves nothing. dL/dx = the pieces' gradients side by side in one new buffer, each written
    once (three indexings would each fill a zeroed copy of x, which the tape would then add up)."""

    @staticmethod
    def forward(ctx, x, sizes, axis):
        if not x.shape:
            raise ValueError("split: a 0-d tensor has no axis to split; reshape it to 1-d first")
        axis = axis_of("split", axis, x.shape)
        if sum(sizes) != x.shape[axis] or any(n < 0 for n in sizes):
            raise ValueError(f"split: sizes {list(sizes)} must be non-negative and add up to {x.shape[axis]}, the "
                             f"length of axis {axis} of a tensor of shape {list(x.shape)}")
        ctx.pieces, start = [], 0
        for n in sizes:
            ctx.pieces.append((slice(None),) * axis + (slice(start, start + n),))
            start += n
        return tuple(x[piece] for piece in ctx.pieces)

    @staticmethod
    def backward(ctx, *grads):
        grad = xp().empty(ctx.in_shapes[0], dtype=grads[0].dtype)
        for piece, g in zip(ctx.pieces, grads):
            grad[piece] = g
        return grad


class Concatenate(Function):
    """out = x₀, x₁, ... side by side along `axis` (one new buffer). Saves nothing: dL/dxᵢ = the piece of g that
    xᵢ filled (views of g)."""

    op = "cat"

    @staticmethod
    def forward(ctx, *xs, axis):
        if not xs:
            raise ValueError("cat: expected a non-empty list of tensors")
        first = xs[0].shape
        if not first or any(not x.shape for x in xs):
            raise ValueError("cat: zero-dimensional tensors cannot be concatenated; reshape them to 1-d first")
        axis = axis_of("cat", axis, first)
        for i, x in enumerate(xs):
            if len(x.shape) != len(first) or any(a != b for k, (a, b) in enumerate(zip(x.shape, first)) if k != axis):
                raise ValueError(f"cat: tensor {i} has shape {list(x.shape)}, tensor 0 {list(first)}: all must have "
                                 f"the same shape except along axis {axis}")
        if len({x.dtype for x in xs}) > 1:
            raise TypeError(f"cat: inputs have dtypes {[str(x.dtype) for x in xs]}; convert them to one (functional's "
                            "cat does, as PyTorch promotes)")
        ctx.pieces, start = [], 0
        for x in xs:
            ctx.pieces.append((slice(None),) * axis + (slice(start, start + x.shape[axis]),))
            start += x.shape[axis]
        return xp().concatenate(xs, axis=axis)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(grad_out[piece] for piece in ctx.pieces)


class EmbeddingOp(Function):
    """out[..., :] = weight[ids[...], :]. Saves the ids; dL/dweight scatters g into their rows, summed per id in a
    fixed order (backend.scatter_add_rows), so the gradient has the same bits on every run, GPU included."""

    op = "embedding"

    @staticmethod
    def forward(ctx, weight, ids):
        if ids.dtype.kind not in "iu":
            raise TypeError(f"embedding: ids must be an integer array, got dtype {ids.dtype}")
        check_range("embedding", "id", ids, weight.shape[0], f"rows of a table of shape {list(weight.shape)}")
        ctx.save(ids=ids)
        ctx.flops = (0, numel(ids.shape) * weight.shape[1])
        return weight[ids]

    @staticmethod
    def backward(ctx, grad_out):
        ids = ctx.saved["ids"]
        grad = xp().zeros(ctx.in_shapes[0], dtype=grad_out.dtype)
        rows = grad_out.reshape(numel(ids.shape), ctx.in_shapes[0][1])
        backend.current().scatter_add_rows(grad, ids.reshape(-1), rows)
        return grad, None
