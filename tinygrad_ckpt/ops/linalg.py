"""Matrix products. These are where the FLOPs are: 2·m·k·n for an [m, k] @ [k, n] product."""

from __future__ import annotations

from .. import backend
from ..engine.function import Function
from ._util import broadcast_shape, numel, unbroadcast


class MatMul(Function):
    """out = a @ b (batched, broadcasting leading axes). dL/da = g @ bᵀ needs b; dL/db = aᵀ @ g needs a."""

    @staticmethod
    def forward(ctx, a, b):
        if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-2]:
            raise ValueError(
                f"matmul: cannot multiply {list(a.shape)} by {list(b.shape)}: both need at least 2 dimensions (1 "
                f"through the @ operator) and a's last ({a.shape[-1] if a.shape else '-'}) must equal b's "
                f"second-to-last ({b.shape[-2] if len(b.shape) > 1 else '-'}); transpose or reshape one of them."
            )
        if a.dtype != b.dtype:
            _two_dtypes("matmul", a, b)
        batch = broadcast_shape("matmul", a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        if ctx.needs_input_grad[0]:
            ctx.save(b=b)
        if ctx.needs_input_grad[1]:
            ctx.save(a=a)
        work = 2 * numel(batch) * m * k * n
        ctx.flops = (work, work * sum(ctx.needs_input_grad))
        return backend.current().matmul(a, b)

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.in_shapes
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = unbroadcast(grad_out @ ctx.saved["b"].swapaxes(-1, -2), a_shape)
        if ctx.needs_input_grad[1]:
            gb = unbroadcast(ctx.saved["a"].swapaxes(-1, -2) @ grad_out, b_shape)
        return ga, gb


class LinearOp(Function):
    """out = x @ Wᵀ + b with W of shape [out, in] (PyTorch layout).

    dL/dx = g @ W needs W (a parameter: no extra memory); dL/dW = gᵀ @ x needs the input x, which is
    what a linear layer really keeps; dL/db = Σ g needs nothing.
    """

    op = "linear"

    @staticmethod
    def forward(ctx, x, weight, bias=None):
        if len(weight.shape) != 2 or not x.shape or x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"linear: input of shape {list(x.shape)} does not fit weight of shape {list(weight.shape)}; "
                f"the input's last dimension must equal the weight's in_features ({weight.shape[-1]}). "
                "Weights are [out_features, in_features] as in PyTorch."
            )
        if bias is not None and tuple(bias.shape) != (weight.shape[0],):
            raise ValueError(f"linear: bias of shape {list(bias.shape)} should be [{weight.shape[0]}]")
        if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
            _two_dtypes("linear", x, weight, *([] if bias is None else [bias]))
        if ctx.needs_input_grad[0]:
            ctx.save(weight=weight)
        if ctx.needs_input_grad[1]:
            ctx.save(x=x)
        rows, (n_out, n_in) = numel(x.shape[:-1]), weight.shape
        ctx.flops = (2 * rows * n_in * n_out + (rows * n_out if bias is not None else 0),
                     2 * rows * n_in * n_out * (ctx.needs_input_grad[0] + ctx.needs_input_grad[1]))
        out = backend.current().matmul(_rows(x), weight.T)  # one [rows, in] @ [in, out] product, not one per row
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], n_out)

    @staticmethod
    def backward(ctx, grad_out):
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = (_rows(grad_out) @ ctx.saved["weight"]).reshape(ctx.in_shapes[0])
        if ctx.needs_input_grad[1]:
            gw = _rows(grad_out).T @ _rows(ctx.saved["x"])
        if len(ctx.in_shapes) == 3 and ctx.needs_input_grad[2]:  # a bias was given
            gb = _rows(grad_out).sum(axis=0)
        return gx, gw, gb


def _rows(a):
    """a as a 2-d [rows, last] array: a view when a is contiguous (else NumPy copies, as the product would)."""
    return a.reshape(numel(a.shape[:-1]), a.shape[-1])


def _two_dtypes(op: str, *arrays) -> None:
    """The TypeError for a product of two dtypes (PyTorch does not promote them)."""
    listed = " and ".join(f"{list(a.shape)} {a.dtype}" for a in arrays)
    raise TypeError(f"{op}: operands {listed} must have one dtype, as in PyTorch; convert one of them first (x.to)")
