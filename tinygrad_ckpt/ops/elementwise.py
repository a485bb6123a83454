"""Elementwise ops. Binary ops broadcast like NumPy; their backward sums gradients back down.

What each saves is only what its derivative reads, and only for inputs that need a gradient:
`a * b` keeps b to get dL/da and a to get dL/db; `exp` keeps its output, `log` its input.
"""

from __future__ import annotations

from ..backend import kernels, xp
from ..checks import kind
from ..engine.function import Function
from ._util import broadcast_shape, causal_mask, numel, unbroadcast


class Add(Function):
    """out = a + b. Saves nothing (the derivative is 1)."""

    @staticmethod
    def forward(ctx, a, b):
        shape = broadcast_shape("add", a.shape, b.shape)
        ctx.flops = (numel(shape), 0)
        return a + b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.in_shapes
        return unbroadcast(grad_out, a_shape), unbroadcast(grad_out, b_shape)


class Sub(Function):
    """out = a - b. Saves nothing."""

    @staticmethod
    def forward(ctx, a, b):
        shape = broadcast_shape("sub", a.shape, b.shape)
        ctx.flops = (numel(shape), numel(shape))
        return a - b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.in_shapes
        gb = unbroadcast(-grad_out, b_shape) if ctx.needs_input_grad[1] else None
        return unbroadcast(grad_out, a_shape), gb


class Scale(Function):
    """out = x · c for a Python number c. Saves nothing: dL/dx = g · c (c is a plain attribute)."""

    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        ctx.flops = (numel(x.shape), numel(x.shape))
        return x * xp().asarray(factor, dtype=x.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * xp().asarray(ctx.factor, dtype=grad_out.dtype)


class Mul(Function):
    """out = a * b. Saves b if a needs a gradient (dL/da = g·b) and a if b does (dL/db = g·a)."""

    @staticmethod
    def forward(ctx, a, b):
        shape = broadcast_shape("mul", a.shape, b.shape)
        if ctx.needs_input_grad[0]:
            ctx.save(b=b)
        if ctx.needs_input_grad[1]:
            ctx.save(a=a)
        ctx.flops = (numel(shape), numel(shape) * sum(ctx.needs_input_grad))
        return a * b

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.in_shapes
        ga = unbroadcast(grad_out * ctx.saved["b"], a_shape) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(grad_out * ctx.saved["a"], b_shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Div(Function):
    """out = a / b. dL/da = g/b, dL/db = -g·out/b. Saves b, and out when b needs a gradient."""

    @staticmethod
    def forward(ctx, a, b):
        shape = broadcast_shape("div", a.shape, b.shape)
        out = a / b
        ctx.save(b=b)
        if ctx.needs_input_grad[1]:
            ctx.save(out=out)
        ctx.flops = (numel(shape), 3 * numel(shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        a_shape, b_shape = ctx.in_shapes
        b = ctx.saved["b"]
        ga = unbroadcast(grad_out / b, a_shape) if ctx.needs_input_grad[0] else None
        gb = unbroadcast(-grad_out * ctx.saved["out"] / b, b_shape) if ctx.needs_input_grad[1] else None
        return ga, gb


class Cast(Function):
    """out = x in another dtype. Saves nothing: dL/dx = g in x's dtype. A non-floating result needs no gradient."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.in_dtype = x.dtype
        out = x.astype(dtype)
        if kind(out.dtype) != "f":
            ctx.mark_non_differentiable(0)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out.astype(ctx.in_dtype)


class Neg(Function):
    """out = -x. Saves nothing."""

    @staticmethod
    def forward(ctx, x):
        ctx.flops = (numel(x.shape), numel(x.shape))
        return -x

    @staticmethod
    def backward(ctx, grad_out):
        return -grad_out


class Pow(Function):
    """out = x ** p for a constant p. dL/dx = g·p·x^(p-1) (0 for p = 0, also at x = 0, as in PyTorch): saves x,
    unless p = 0."""

    @staticmethod
    def forward(ctx, x, exponent: float):
        ctx.exponent = exponent
        if exponent != 0:
            ctx.save(x=x)
        ctx.flops = (numel(x.shape), 3 * numel(x.shape))
        return x**exponent

    @staticmethod
    def backward(ctx, grad_out):
        p = ctx.exponent
        if p == 0:
            return xp().zeros(grad_out.shape, dtype=grad_out.dtype)
        return grad_out * (p * ctx.saved["x"] ** (p - 1))


class Exp(Function):
    """out = e^x. Saves its output: d/dx e^x = e^x, so nothing else is needed."""

    @staticmethod
    def forward(ctx, x):
        out = xp().exp(x)
        ctx.save(out=out)
        ctx.flops = (numel(x.shape), numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * ctx.saved["out"]


class Log(Function):
    """out = ln x. Saves x: d/dx ln x = 1/x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save(x=x)
        ctx.flops = (numel(x.shape), numel(x.shape))
        return xp().log(x)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out / ctx.saved["x"]


class Tanh(Function):
    """out = tanh x. Saves its output: d/dx tanh x = 1 - tanh² x."""

    @staticmethod
    def forward(ctx, x):
        out = xp().tanh(x)
        ctx.save(out=out)
        ctx.flops = (numel(x.shape), 3 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out = ctx.saved["out"]
        return grad_out * (1 - out * out)


class Sqrt(Function):
    """out = √x. Saves its output: d/dx √x = 1/(2√x)."""

    @staticmethod
    def forward(ctx, x):
        out = xp().sqrt(x)
        ctx.save(out=out)
        ctx.flops = (numel(x.shape), 2 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out / (2 * ctx.saved["out"])


class Rsqrt(Function):
    """out = 1/√x. Saves its output: d/dx x^(-1/2) = -½·x^(-3/2) = -½·out³."""

    @staticmethod
    def forward(ctx, x):
        out = 1 / xp().sqrt(x)
        ctx.save(out=out)
        ctx.flops = (2 * numel(x.shape), 3 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out = ctx.saved["out"]
        return grad_out * (-0.5 * out * out * out)


class Sigmoid(Function):
    """out = σ(x) = 1/(1 + e^(-x)). Saves its output: σ' = σ·(1 - σ)."""

    @staticmethod
    def forward(ctx, x):
        out = 1 / (1 + xp().exp(-x))
        ctx.save(out=out)
        ctx.flops = (4 * numel(x.shape), 3 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out = ctx.saved["out"]
        return grad_out * (out * (1 - out))


class MaskedFill(Function):
    """out = value where mask else x·scale (e.g. -inf above the diagonal; attention's 1/√d folded in, so the
    scores are not copied once more): dL/dx = 0 where mask else g·scale. Saves the boolean mask."""

    op = "masked_fill"

    @staticmethod
    def causal_mask_to_give(t_q: int, t_k: int):
        """The mask a causal attention passes: the [t_q, t_k] causal mask, made once and kept."""
        return causal_mask(t_q, t_k)

    @staticmethod
    def forward(ctx, x, mask, value: float, scale: float = 1.0):
        broadcast_shape("masked_fill", x.shape, mask.shape)
        ctx.save(mask=mask)
        return MaskedFill.fill(ctx, x, mask, value, scale)

    @staticmethod
    def fill(ctx, x, mask, value: float, scale: float):
        """The fill itself, and its FLOPs (what a variant that keeps no mask runs too)."""
        ctx.scale = scale
        ctx.flops = ((1 + (scale != 1)) * numel(x.shape), (1 + (scale != 1)) * numel(x.shape))
        return kernels.masked_fill(x, mask, value, scale)

    @staticmethod
    def backward(ctx, grad_out):
        return MaskedFill.grad(ctx, grad_out, ctx.saved["mask"])

    @staticmethod
    def grad(ctx, grad_out, mask):
        grad = kernels.masked_fill_grad(grad_out, mask, ctx.scale)  # 0 where mask else g·scale
        return unbroadcast(grad, ctx.in_shapes[0]), None
