"""Reductions over axes. `sum` and `mean` save nothing; `max` saves where the maxima were."""

from __future__ import annotations

from ..backend import xp
from ..function import Function
from ._util import numel


def _axes(axis, ndim: int, op: str) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {a} is out of range for an input with {ndim} dimensions")
    return tuple(sorted(a % ndim for a in axes))


def _expand(grad_out, in_shape, axes, keepdims):
    """Broadcast the reduced gradient back over the reduced axes (a view, no copy)."""
    if not keepdims:
        grad_out = xp().expand_dims(grad_out, axes)
    return xp().broadcast_to(grad_out, in_shape)


class Sum(Function):
    """out = Σ_axes x. dL/dx = g broadcast back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.in_shape, ctx.axes, ctx.keepdims = x.shape, _axes(axis, len(x.shape), "sum"), keepdims
        ctx.flops = (numel(x.shape), 0)
        return x.sum(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        return _expand(grad_out, ctx.in_shape, ctx.axes, ctx.keepdims)


class Mean(Function):
    """out = Σ_axes x / n. dL/dx = g/n broadcast back. Saves nothing."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        ctx.in_shape, ctx.axes, ctx.keepdims = x.shape, _axes(axis, len(x.shape), "mean"), keepdims
        ctx.count = numel([x.shape[a] for a in ctx.axes])
        ctx.flops = (numel(x.shape), numel(x.shape))
        return x.mean(axis=ctx.axes, keepdims=keepdims)

    @staticmethod
    def backward(ctx, grad_out):
        return _expand(grad_out / ctx.count, ctx.in_shape, ctx.axes, ctx.keepdims)


class Max(Function):
    """out = max over one axis (or all). Gradient goes to the first maximum; saves its index."""

    @staticmethod
    def forward(ctx, x, axis=None, keepdims=False):
        if axis is not None and not isinstance(axis, int):
            raise ValueError(f"max: axis must be an int or None, got {axis!r}")
        if numel(x.shape) == 0:
            raise ValueError(f"max: a tensor of shape {list(x.shape)} has no elements, so no maximum; "
                             "check the slice or batch that produced it.")
        ctx.in_shape, ctx.axis, ctx.keepdims = x.shape, axis, keepdims
        if axis is None:
            index = x.argmax()
            out = x.reshape(-1)[index]
            out = out.reshape((1,) * len(x.shape)) if keepdims else out.reshape(())
        else:
            axis = _axes(axis, len(x.shape), "max")[0]
            ctx.axis = axis
            index = xp().expand_dims(x.argmax(axis=axis), axis)
            out = xp().take_along_axis(x, index, axis=axis)
            out = out if keepdims else out.squeeze(axis)
        ctx.save(index=index)
        ctx.flops = (numel(x.shape), 0)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad = xp().zeros(ctx.in_shape, dtype=grad_out.dtype)
        index = ctx.saved["index"]
        if ctx.axis is None:
            grad.reshape(-1)[index] = grad_out.reshape(())
        else:
            g = grad_out if ctx.keepdims else xp().expand_dims(grad_out, ctx.axis)
            xp().put_along_axis(grad, index, g, axis=ctx.axis)
        return grad
