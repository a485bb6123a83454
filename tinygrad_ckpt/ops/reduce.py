"""Reductions over axes. `sum` and `mean` save nothing; `max` saves where the maxima were."""

from __future__ import annotations

import math

from ..backend import xp
from ..engine.function import Function
from ._util import accumulated, axes_of, check_float, numel


def _expand(grad_out, in_shape, axes, keepdims):
    """Broadcast the reduced gradient back over the reduced axes (a view, no copy)."""
    if not keepdims:
        grad_out = xp().expand_dims(grad_out, axes)
    return xp().broadcast_to(grad_out, in_shape)


class Sum(Function):
    """out = Σ_axes x (half precision accumulated in float32). dL/dx = g broadcast back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.axes, ctx.keepdims = axes_of("sum", axis, x.shape), keepdims
        ctx.flops = (numel(x.shape), 0)
        return accumulated("sum", x, ctx.axes, keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        return _expand(grad_out, ctx.in_shapes[0], ctx.axes, ctx.keepdims)


class Mean(Function):
    """out = Σ_axes x / n (floating point only, half precision accumulated in float32, as in PyTorch). dL/dx = g/n
    broadcast back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        check_float("mean", x)
        ctx.axes, ctx.keepdims = axes_of("mean", axis, x.shape), keepdims
        ctx.count = numel([x.shape[a] for a in ctx.axes])
        ctx.flops = (numel(x.shape), numel(x.shape))
        if ctx.count == 0:  # the mean of nothing is NaN, as in PyTorch (without NumPy's warning)
            return x.sum(axis=ctx.axes, keepdims=keepdims) * xp().asarray(math.nan, dtype=x.dtype)
        return accumulated("mean", x, ctx.axes, keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        if ctx.count == 0:  # an empty mean: nothing to spread the gradient over
            return xp().zeros(ctx.in_shapes[0], dtype=grad_out.dtype)
        return _expand(grad_out / ctx.count, ctx.in_shapes[0], ctx.axes, ctx.keepdims)


class Max(Function):
    """out = max over one axis (or all). Gradient goes to the first maximum; saves its index."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        if isinstance(axis, (tuple, list)):
            raise ValueError(f"max: axis must be an int or None, got {axis!r}")
        if axis is not None:
            axis = axes_of("max", axis, x.shape)  # () for a 0-d tensor: its maximum is itself
            axis = axis[0] if axis else None
        if (numel(x.shape) if axis is None else x.shape[axis]) == 0:
            raise ValueError(f"max: a tensor of shape {list(x.shape)} has no elements "
                             f"{'' if axis is None else f'along axis {axis} '}to take a maximum of; check the slice or "
                             "batch that produced it.")
        ctx.axis, ctx.keepdims = axis, keepdims
        if axis is None:
            index = x.argmax()
            out = x.reshape(-1)[index]
            out = out.reshape((1,) * len(x.shape)) if keepdims else out.reshape(())
        else:
            index = xp().expand_dims(x.argmax(axis=axis), axis)
            out = xp().take_along_axis(x, index, axis=axis)
            out = out if keepdims else out.squeeze(axis)
        ctx.save(index=index)
        ctx.flops = (numel(x.shape), 0)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad = xp().zeros(ctx.in_shapes[0], dtype=grad_out.dtype)
        index = ctx.saved["index"]
        if ctx.axis is None:
            grad.reshape(-1)[index] = grad_out.reshape(())
        else:
            g = grad_out if ctx.keepdims else xp().expand_dims(grad_out, ctx.axis)
            xp().put_along_axis(grad, index, g, axis=ctx.axis)
        return grad
