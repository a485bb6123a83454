"""The transformer's non-linear ops, each with a hand-written backward and a deliberate choice of
what to save. These choices are the activation memory the lessons measure."""

from __future__ import annotations

import math

from .. import backend
from ..backend import threads, xp
from ..function import Function
from ._util import axis_of, check_float, check_range, numel

_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_TANH_C = math.sqrt(2 / math.pi)


class GELU(Function):
    """Exact GELU: out = x·Φ(x), Φ(x) = ½(1 + erf(x/√2)); tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³))).

    dL/dx = g·(Φ(x) + x·φ(x)) (tanh form: its own derivative). Saves its input x, which cannot be recovered
    from gelu(x) (gelu is not one-to-one for x < 0), and its output, which the linear after it keeps anyway:
    backward reads Φ(x) = out/x (½ at x = 0) from it instead of evaluating erf (or tanh) again. Runs on
    blocks of rows over the thread pool.
    """

    @staticmethod
    def forward(ctx, x, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' (erf) or 'tanh', got {approximate!r}")
        check_float("gelu", x)
        ctx.approximate = approximate
        ctx.flops = (8 * numel(x.shape), 8 * numel(x.shape))
        out = xp().empty(x.shape, dtype=x.dtype)
        threads.rows(_gelu_tanh if approximate == "tanh" else _gelu_erf, out, x)
        ctx.save(x=x, out=out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)
        kernel = _gelu_tanh_grad if ctx.approximate == "tanh" else _gelu_erf_grad
        threads.rows(kernel, grad, ctx.saved["x"], ctx.saved["out"], grad_out)
        return grad


def _gelu_erf(out, x):
    backend.current().gelu(x, out)


def _gelu_tanh(out, x):
    out[...] = xp().tanh(_TANH_C * (x + 0.044715 * x * x * x))
    out += 1
    out *= 0.5 * x


def _phi(phi, x, out):
    """phi = Φ = out/x, read from gelu's output (½ where x = 0, which divides 0 by 1 instead of by 0)."""
    zero = x == 0
    xp().divide(out, x + zero, out=phi)
    xp().copyto(phi, xp().asarray(0.5, dtype=phi.dtype), where=zero)


def _gelu_erf_grad(grad, x, out, grad_out):
    """grad = g·(Φ(x) + x·φ(x)), φ(x) = e^(-x²/2)/√(2π), with one temporary."""
    _phi(grad, x, out)
    density = x * x
    density *= -0.5
    xp().exp(density, out=density)
    density *= x
    density *= _INV_SQRT_2PI
    grad += density
    grad *= grad_out


def _gelu_tanh_grad(grad, x, out, grad_out):
    """grad = g·(½(1 + t) + ½x(1 - t²)·√(2/π)(1 + 3·0.044715x²)), t = 2Φ - 1 read from the output."""
    _phi(grad, x, out)  # ½(1 + t)
    t = 2 * grad - 1
    grad += 0.5 * x * (1 - t * t) * _TANH_C * (1 + 3 * 0.044715 * x * x)
    grad *= grad_out


class Softmax(Function):
    """out = e^(x - max) / Σ e^(x - max) along an axis. Saves its output y: dL/dx = y·(g - Σ g·y).
    Along the last axis it runs on row chunks over the thread pool."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        check_float("softmax", x)
        ctx.axis = _axis("softmax", axis, x)
        out = xp().empty(x.shape, dtype=x.dtype)
        _by_rows(ctx, _softmax, out, x)
        ctx.save(out=out)
        ctx.flops = (4 * numel(x.shape), 4 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)
        _by_rows(ctx, _softmax_grad, grad, ctx.saved["out"], grad_out)
        return grad


def _axis(op: str, axis, x):
    """The axis softmax runs along: checked, counted from 0; for a 0-d tensor none, (), so it is one value alone."""
    axis = axis_of(op, axis, x.shape)
    return axis if x.shape else ()


def _by_rows(ctx, kernel, *arrays):
    """kernel(*arrays, axis=ctx.axis), on row chunks when the axis is the last one (nothing to do when empty)."""
    axis = ctx.axis
    if numel(arrays[0].shape) == 0:
        return
    if axis == len(arrays[0].shape) - 1:
        threads.rows(lambda *chunks: kernel(*chunks, axis=-1), *arrays)
    else:
        kernel(*arrays, axis=axis)


def _softmax(out, x, axis):
    xp().subtract(x, x.max(axis=axis, keepdims=True), out=out)
    xp().exp(out, out=out)
    out /= backend.current().row_sums(out) if axis == -1 else out.sum(axis=axis, keepdims=True)


def _softmax_grad(out, y, grad_out, axis):
    """out = y·(g - Σ g·y), with no temporary beyond the row sums."""
    xp().multiply(grad_out, y, out=out)
    dot = out.sum(axis=axis, keepdims=True)
    xp().subtract(grad_out, dot, out=out)
    out *= y


class LogSoftmax(Function):
    """out = x - logΣe^x along an axis (stable). Saves its output: dL/dx = g - e^out·Σ g."""

    op = "log_softmax"

    @staticmethod
    def forward(ctx, x, axis=-1):
        check_float("log_softmax", x)
        ctx.axis = axis = _axis("log_softmax", axis, x)
        if numel(x.shape) == 0:
            return xp().empty(x.shape, dtype=x.dtype)  # nothing to normalise (max has no identity to start from)
        shifted = x - x.max(axis=axis, keepdims=True)
        out = shifted - xp().log(xp().exp(shifted).sum(axis=axis, keepdims=True))
        ctx.save(out=out)
        ctx.flops = (4 * numel(x.shape), 3 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if numel(grad_out.shape) == 0:
            return grad_out
        out = ctx.saved["out"]
        return grad_out - xp().exp(out) * grad_out.sum(axis=ctx.axis, keepdims=True)


class CrossEntropy(Function):
    """loss = mean over rows of (logΣ_c e^(x_c) - x_target), fused and stable; rows with target
    == ignore_index do not count. Saves the logits (the caller keeps them anyway), the per-row
    log-sum-exp and the targets: dL/dx = (softmax(x) - onehot(target)) · g / N."""

    op = "cross_entropy"

    @staticmethod
    def forward(ctx, logits, targets, ignore_index=-1):
        if len(logits.shape) != 2 or tuple(targets.shape) != (logits.shape[0],):
            raise ValueError(
                f"cross_entropy: logits must be [N, C] and targets [N]; got logits {list(logits.shape)} and "
                f"targets {list(targets.shape)}. Flatten with logits.reshape(-1, C), targets.reshape(-1)."
            )
        if targets.dtype.kind not in "iu":
            raise TypeError(f"cross_entropy: targets must be integer class indices, got dtype {targets.dtype}")
        check_float("cross_entropy", logits)
        check_range("cross_entropy", "target", targets, logits.shape[1], "classes", skip=ignore_index)
        m = logits.max(axis=1, keepdims=True)
        lse = xp().log(xp().exp(logits - m).sum(axis=1, keepdims=True)) + m
        valid = targets != ignore_index
        count = max(int(valid.sum()), 1) if backend.current().has_values else logits.shape[0]
        rows = xp().arange(logits.shape[0])
        picked = logits[rows, xp().where(valid, targets, 0)]
        loss = ((lse[:, 0] - picked) * valid).sum() / count
        ctx.count = count
        ctx.save(logits=logits, lse=lse, targets=targets, valid=valid)
        ctx.flops = (4 * numel(logits.shape), 4 * numel(logits.shape))
        return loss.astype(logits.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        logits, lse, targets, valid = (ctx.saved[k] for k in ("logits", "lse", "targets", "valid"))
        grad = xp().exp(logits - lse)
        rows = xp().arange(logits.shape[0])
        grad[rows, xp().where(valid, targets, 0)] -= 1
        grad *= (grad_out / ctx.count) * valid[:, None]
        return grad, None


class LayerNorm(Function):
    """out = x̂·w + b with x̂ = (x - mean)/√(var + eps) over the last axis.

    Saves its output, 1/std (one number per row), w and b: the layer after it (a linear) keeps the
    output anyway, so the output costs no extra bytes, and backward recovers x̂ = (out - b)/w. Where a
    weight is exactly 0 the output forgets x̂, so those columns of x̂ are saved as well (none, usually).
    With x̂ and 1/std, dL/dx = (1/std)·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) where ĝ = g·w, dL/dw = Σ g·x̂,
    dL/db = Σ g. (Recovering x̂ costs 2 operations per value in backward and rounds like |b|/|w| times
    the output's rounding: exact enough at the weights training sees, and PyTorch's tolerance is checked.)
    """

    op = "layer_norm"

    @staticmethod
    def forward(ctx, x, weight, bias, eps=1e-5):
        if not x.shape:
            raise ValueError("layer_norm: a 0-d tensor has no last axis to normalise over; reshape it to 1-d first")
        d = x.shape[-1]
        if tuple(weight.shape) != (d,) or tuple(bias.shape) != (d,):
            raise ValueError(
                f"layer_norm: weight {list(weight.shape)} and bias {list(bias.shape)} must both be [{d}] "
                f"to normalise an input of shape {list(x.shape)} over its last axis."
            )
        check_float("layer_norm", x, weight, bias)
        if not x.dtype == weight.dtype == bias.dtype:
            raise TypeError(f"layer_norm: input {x.dtype}, weight {weight.dtype} and bias {bias.dtype} must have one "
                            "dtype, as in PyTorch; convert the weight and bias to the input's")
        out = xp().empty(x.shape, dtype=x.dtype)
        xhat = xp().empty(x.shape, dtype=x.dtype)
        rstd = xp().empty(x.shape[:-1] + (1,), dtype=x.dtype)

        be = backend.current()

        def normalise(out, xhat, rstd, x):
            mean = be.row_sums(x)
            mean /= d
            xp().subtract(x, mean, out=xhat)
            var = be.row_dots(xhat, xhat)
            var /= d
            var += eps
            rstd[...] = 1 / xp().sqrt(var)
            xhat *= rstd
            xp().multiply(xhat, weight, out=out)
            out += bias

        if numel(x.shape):
            threads.rows(normalise, out, xhat, rstd, x)
        else:  # nothing to normalise (and a row of no values has no mean)
            rstd[...] = 0
        ctx.save(out=out, rstd=rstd, weight=weight, bias=bias)
        ctx.zero_columns = _zero_columns(weight) if ctx.saving else None
        if ctx.zero_columns is not None:
            ctx.save(xhat_where_weight_is_0=xhat[..., ctx.zero_columns])
        ctx.flops = (8 * numel(x.shape), 12 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        out, rstd, weight, bias = (ctx.saved[k] for k in ("out", "rstd", "weight", "bias"))
        if numel(out.shape) == 0:
            return tuple(xp().zeros(a.shape, dtype=grad_out.dtype) for a in (out, weight, bias))
        zero = ctx.zero_columns
        safe_weight = weight if zero is None else xp().where(weight == 0, xp().ones((), dtype=weight.dtype), weight)
        xhat = xp().empty(out.shape, dtype=out.dtype)

        def recover(xhat, out):
            xp().subtract(out, bias, out=xhat)
            xhat /= safe_weight

        threads.rows(recover, xhat, out)
        if zero is not None:
            xhat[..., zero] = ctx.saved["xhat_where_weight_is_0"]
        rows = grad_out.reshape(-1, grad_out.shape[-1])
        gw = (rows * xhat.reshape(rows.shape)).sum(axis=0)
        gb = rows.sum(axis=0)
        gx = xp().empty(grad_out.shape, dtype=grad_out.dtype)

        def input_grad(gx, grad_out, xhat, rstd):
            xp().multiply(grad_out, weight, out=gx)  # ĝ = g·w
            dot = (gx * xhat).mean(axis=-1, keepdims=True)
            gx -= gx.mean(axis=-1, keepdims=True)
            gx -= xhat * dot
            gx *= rstd

        threads.rows(input_grad, gx, grad_out, xhat, rstd)
        return gx, gw, gb


def _zero_columns(weight):
    """Indices of the weights that are exactly 0, or None (also on the meta backend, which has no values)."""
    if not backend.current().has_values:
        return None
    zero = xp().flatnonzero(weight == 0)
    return zero if zero.size else None


class Dropout(Function):
    """out = x·mask/(1-p), mask ~ Bernoulli(1-p) from the engine's RNG. Saves the mask packed 1 bit per
    element (packbits: n/8 bytes instead of a bool array's n): dL/dx = g·mask/(1-p)."""

    @staticmethod
    def forward(ctx, x, p):
        check_float("dropout", x)
        mask = backend.next_generator().random(x.shape, dtype=xp().float32) >= p
        ctx.scale = 1.0 / (1.0 - p)
        if ctx.saving:
            ctx.save(mask_bits=xp().packbits(mask.reshape(-1)))
        ctx.flops = (2 * numel(x.shape), 3 * numel(x.shape))
        out = x * mask
        out *= xp().asarray(ctx.scale, dtype=x.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        n = numel(grad_out.shape)
        mask = xp().unpackbits(ctx.saved["mask_bits"])[:n].reshape(grad_out.shape)  # 0/1 as uint8
        grad = grad_out * mask
        grad *= xp().asarray(ctx.scale, dtype=grad.dtype)
        return grad
