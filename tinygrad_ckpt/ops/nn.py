"""The transformer's non-linear ops, each with a hand-written backward and a deliberate choice of
what to save. These choices are the activation memory the lessons measure."""

from __future__ import annotations

from .. import backend
from ..backend import kernels, xp
from ..engine.function import Function
from ._util import accumulation_dtype, axis_of, check_float, check_range, numel


class GELU(Function):
    """Exact GELU: out = x·Φ(x), Φ(x) = ½(1 + erf(x/√2)); tanh form: ½x(1 + tanh(√(2/π)(x + 0.044715x³))).

    dL/dx = g·(Φ(x) + x·φ(x)) (tanh form: its own derivative). Saves its input x, which cannot be recovered
    from gelu(x) (gelu is not one-to-one for x < 0), and its output, which the linear after it keeps anyway:
    backward reads Φ(x) = out/x (½ at x = 0) from it instead of evaluating erf (or tanh) again.
    """

    @staticmethod
    def forward(ctx, x, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError(f"gelu: approximate must be 'none' (erf) or 'tanh', got {approximate!r}")
        check_float("gelu", x)
        ctx.approximate = approximate
        ctx.flops = (8 * numel(x.shape), 8 * numel(x.shape))
        out = kernels.gelu(x, approximate)  # x·Φ(x)
        ctx.save(x=x, out=out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, out = ctx.saved["x"], ctx.saved["out"]
        return kernels.gelu_grad(grad_out, x, out, ctx.approximate)  # g·(Φ(x) + x·φ(x)), Φ(x) = out/x


class SiLUOp(Function):
    """SiLU (swish): out = x·σ(x), σ(x) = 1/(1 + e^(-x)); dL/dx = g·σ(x)·(1 + x·(1 - σ(x))).

    Saves its input x, as PyTorch's silu does: x cannot be recovered from silu(x) (not one-to-one for x < 0),
    and σ(x) is cheaper to evaluate again than to keep. In a SwiGLU MLP the output is multiplied with the up
    projection, and that product keeps it: silu's input and output are both kept, 2 of the MLP's 4 wide arrays.
    """

    op = "silu"

    @staticmethod
    def forward(ctx, x):
        check_float("silu", x)
        ctx.save(x=x)
        ctx.flops = (4 * numel(x.shape), 7 * numel(x.shape))
        return kernels.silu(x)  # x / (1 + e^(-x))

    @staticmethod
    def backward(ctx, grad_out):
        return kernels.silu_grad(grad_out, ctx.saved["x"])  # g·σ(x)·(1 + x·(1 - σ(x)))


class ReLU(Function):
    """out = max(x, 0). Saves its output (as PyTorch does): dL/dx = g where out > 0, else 0 (0 at x = 0)."""

    op = "relu"

    @staticmethod
    def forward(ctx, x):
        if x.dtype.kind == "b":
            raise TypeError("relu: bool inputs are not supported (as in PyTorch); convert to a number dtype first")
        out = xp().maximum(x, xp().zeros((), dtype=x.dtype))
        ctx.save(out=out)
        ctx.flops = (numel(x.shape), numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out * (ctx.saved["out"] > 0)


class Softmax(Function):
    """out = e^(x - max) / Σ e^(x - max) along an axis. Saves its output y: dL/dx = y·(g - Σ g·y)."""

    @staticmethod
    def forward(ctx, x, axis=-1):
        check_float("softmax", x)
        ctx.axis = _axis("softmax", axis, x)
        out = kernels.softmax(x, ctx.axis)
        ctx.save(out=out)
        ctx.flops = (4 * numel(x.shape), 4 * numel(x.shape))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        return kernels.softmax_grad(grad_out, ctx.saved["out"], ctx.axis)  # y·(g - Σ g·y)


def _axis(op: str, axis, x):
    """The axis softmax runs along: checked, counted from 0; for a 0-d tensor none, (), so it is one value alone."""
    axis = axis_of(op, axis, x.shape)
    return axis if x.shape else ()


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
    == ignore_index do not count. Half-precision logits are worked in float32 and the loss rounded once, as
    PyTorch's kernels accumulate. Saves the logits (the caller keeps them anyway), the per-row
    log-sum-exp (float32 for half logits) and the targets: dL/dx = (softmax(x) - onehot(target)) · g / N, in the
    logits' dtype."""

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
        x = logits.astype(accumulation_dtype(logits.dtype), copy=False)  # half precision: worked in float32
        m = x.max(axis=1, keepdims=True)
        lse = xp().log(xp().exp(x - m).sum(axis=1, keepdims=True)) + m
        valid = targets != ignore_index
        count = max(backend.current().count_nonzero_or(valid, otherwise=logits.shape[0]), 1)
        rows = xp().arange(logits.shape[0])
        picked = x[rows, xp().where(valid, targets, 0)]
        loss = ((lse[:, 0] - picked) * valid).sum() / count
        ctx.count = count
        ctx.save(logits=logits, lse=lse, targets=targets, valid=valid)
        ctx.flops = (4 * numel(logits.shape), 4 * numel(logits.shape))
        return loss.astype(logits.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        logits, lse, targets, valid = (ctx.saved[k] for k in ("logits", "lse", "targets", "valid"))
        grad = xp().exp(logits.astype(lse.dtype, copy=False) - lse)
        rows = xp().arange(logits.shape[0])
        grad[rows, xp().where(valid, targets, 0)] -= 1
        grad *= (grad_out.astype(lse.dtype, copy=False) / ctx.count) * valid[:, None]
        return grad.astype(logits.dtype, copy=False), None


class LayerNormOp(Function):
    """out = x̂·w + b with x̂ = (x - mean)/√(var + eps) over the last axis.

    Saves (`keep`) its output and 1/std (one number per row), and w and b (parameters): the layer after it (a
    linear) keeps the output anyway, so the output costs no extra bytes, and backward recovers (`normalized`)
    x̂ = (out - b)/w (where a weight is exactly 0 the output forgets x̂, so those columns of x̂ are saved as well:
    none, usually). Other frameworks keep other arrays: their variants override keep and normalized
    (scale/save_profiles.py).
    With x̂ and 1/std, dL/dx = (1/std)·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) where ĝ = g·w, dL/dw = Σ g·x̂,
    dL/db = Σ g. (Recovering x̂ from the output rounds like |b|/|w| times the output's rounding: exact enough at
    the weights training sees, and PyTorch's tolerance is checked.)
    """

    op = "layer_norm"

    @classmethod
    def forward(cls, ctx, x, weight, bias, eps=1e-5):
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
        out, xhat, mean, rstd = kernels.layer_norm(x, weight, bias, eps)  # x̂ = (x - mean)/√(var + eps); x̂·w + b
        ctx.eps = eps
        cls.keep(ctx, x, out, xhat, mean, rstd, weight, bias)
        ctx.flops = (8 * numel(x.shape), 12 * numel(x.shape))
        return out

    @staticmethod
    def keep(ctx, x, out, xhat, mean, rstd, weight, bias) -> None:
        """Save the output, 1/std, w and b, and x̂'s columns where w is exactly 0 (if any)."""
        ctx.save(out=out, rstd=rstd, weight=weight, bias=bias)
        ctx.zero_columns = backend.current().nonzero_or_none(weight == 0) if ctx.saving else None
        if ctx.zero_columns is not None:
            ctx.save(xhat_where_weight_is_0=xhat[..., ctx.zero_columns])

    @staticmethod
    def normalized(ctx):
        """(x̂, 1/std) from what `keep` saved: x̂ = (out - b)/w."""
        saved, zero = ctx.saved, ctx.zero_columns
        xhat = kernels.layer_norm_xhat(saved["out"], saved["weight"], saved["bias"], zero is not None)
        if zero is not None:
            xhat[..., zero] = saved["xhat_where_weight_is_0"]
        return xhat, saved["rstd"]

    @classmethod
    def backward(cls, ctx, grad_out):
        weight, bias = ctx.saved["weight"], ctx.saved["bias"]
        if numel(grad_out.shape) == 0:
            return tuple(xp().zeros(a.shape, dtype=grad_out.dtype) for a in (grad_out, weight, bias))
        xhat, rstd = cls.normalized(ctx)
        rows = grad_out.reshape(-1, grad_out.shape[-1])
        gw = (rows * xhat.reshape(rows.shape)).sum(axis=0)  # Σ g·x̂
        gb = rows.sum(axis=0)  # Σ g
        return kernels.layer_norm_input_grad(grad_out, xhat, rstd, weight), gw, gb


class RMSNormOp(Function):
    """out = x·(1/rms)·w with 1/rms = 1/√(mean(x²) + eps) over the last axis (Zhang & Sennrich 2019; Llama).

    Saves (`keep`) what PyTorch's fused rms_norm kernel saves: its input x and 1/rms (one number per row), and the
    weight (a parameter: no new bytes). The output is not kept: the linears after it keep it themselves. With
    x̂ = x·(1/rms) and ĝ = g·w: dL/dx = (1/rms)·(ĝ - x̂·mean(ĝ·x̂)), dL/dw = Σ g·x̂.
    """

    op = "rms_norm"

    @classmethod
    def forward(cls, ctx, x, weight, eps=1e-6):
        if not x.shape:
            raise ValueError("rms_norm: a 0-d tensor has no last axis to normalise over; reshape it to 1-d first")
        d = x.shape[-1]
        if tuple(weight.shape) != (d,):
            raise ValueError(f"rms_norm: weight {list(weight.shape)} must be [{d}] to normalise an input of shape "
                             f"{list(x.shape)} over its last axis.")
        check_float("rms_norm", x, weight)
        if x.dtype != weight.dtype:
            raise TypeError(f"rms_norm: input {x.dtype} and weight {weight.dtype} must have one dtype; convert the "
                            "weight to the input's")
        out, rstd = kernels.rms_norm(x, weight, eps)  # (x·(1/rms))·w, 1/rms per row
        ctx.eps = eps
        cls.keep(ctx, x, rstd, weight)
        ctx.flops = (4 * numel(x.shape), 8 * numel(x.shape))
        return out

    @staticmethod
    def keep(ctx, x, rstd, weight) -> None:
        """Save x, w and 1/rms."""
        ctx.save(x=x, weight=weight, rstd=rstd)

    @staticmethod
    def inverse_rms(ctx):
        """1/rms per row, as `keep` saved it."""
        return ctx.saved["rstd"]

    @classmethod
    def backward(cls, ctx, grad_out):
        x, weight = ctx.saved["x"], ctx.saved["weight"]
        rstd = cls.inverse_rms(ctx)
        if numel(x.shape) == 0:
            return xp().zeros(x.shape, dtype=grad_out.dtype), xp().zeros(weight.shape, dtype=grad_out.dtype)
        return kernels.rms_norm_grads(grad_out, x, rstd, weight)


class DropoutOp(Function):
    """out = x·mask/(1-p), mask ~ Bernoulli(1-p) from the engine's RNG: dL/dx = g·mask/(1-p). Saves the mask
    (`keep_mask`) packed 1 bit per element (packbits: n/8 bytes); PyTorch's CUDA kernel keeps a bool array of n
    bytes, and Korthikanti counts one (scale/save_profiles.py)."""

    op = "dropout"

    @classmethod
    def forward(cls, ctx, x, p):
        check_float("dropout", x)
        mask = backend.next_generator().random(x.shape, dtype=xp().float32) >= p
        ctx.scale = 1.0 / (1.0 - p)
        if ctx.saving:
            cls.keep_mask(ctx, mask)
        ctx.flops = (2 * numel(x.shape), 3 * numel(x.shape))
        out = x * mask
        out *= xp().asarray(ctx.scale, dtype=x.dtype)
        return out

    @staticmethod
    def keep_mask(ctx, mask) -> None:
        """Save the mask packed 8 elements a byte."""
        ctx.save(mask_bits=xp().packbits(mask.reshape(-1)))

    @staticmethod
    def saved_mask(ctx, shape):
        """The mask `keep_mask` saved, unpacked to `shape` (0/1 as uint8)."""
        return xp().unpackbits(ctx.saved["mask_bits"])[:numel(shape)].reshape(shape)

    @classmethod
    def backward(cls, ctx, grad_out):
        grad = grad_out * cls.saved_mask(ctx, grad_out.shape)
        grad *= xp().asarray(ctx.scale, dtype=grad.dtype)
        return grad
