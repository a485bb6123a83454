"""What other frameworks save, as variants of this engine's ops, and `saves_like`, which puts them in force.

Each variant computes what the engine's op computes (values and gradients the same bits) and keeps other
arrays, so a ledger counts the bytes that framework keeps:

    pytorch    PyTorch's autograd on CUDA: layer norm keeps its input, the mean and 1/std; dropout a 1-byte
               mask; the MoE ops what Hugging Face's Mixtral block leaves on PyTorch's tape
    megatron   Korthikanti et al. 2022, Table 2: a norm keeps its input alone (mean, 1/std made again in
               backward); dropout a 1-byte mask; the causal mask is made again in backward

A profile is a table {engine op: variant}; functional looks each op up in the table in force
(state.op_variant), so the layers below this wing never name a framework.
"""

from __future__ import annotations

from .. import ops, state
from ..backend import kernels
from ..ops._util import causal_mask
from ..state import SAVES


class PyTorchLayerNormOp(ops.LayerNormOp):
    """Layer norm as PyTorch's native_layer_norm saves it: its input x, the mean and 1/std (w and b); backward
    makes x̂ = (x - mean)·(1/std) from them."""

    @staticmethod
    def keep(ctx, x, out, xhat, mean, rstd, weight, bias) -> None:
        ctx.save(x=x, mean=mean, rstd=rstd, weight=weight, bias=bias)

    @staticmethod
    def normalized(ctx):
        saved = ctx.saved
        return kernels.layer_norm_xhat_from_input(saved["x"], saved["mean"], saved["rstd"]), saved["rstd"]


class MegatronLayerNormOp(ops.LayerNormOp):
    """Layer norm as Korthikanti's Table 2 counts it: its input x alone (w and b); backward normalises x again."""

    @staticmethod
    def keep(ctx, x, out, xhat, mean, rstd, weight, bias) -> None:
        ctx.save(x=x, weight=weight, bias=bias)

    @staticmethod
    def normalized(ctx):
        saved = ctx.saved
        _, xhat, _, rstd = kernels.layer_norm(saved["x"], saved["weight"], saved["bias"], ctx.eps)
        return xhat, rstd


class MegatronRMSNormOp(ops.RMSNormOp):
    """RMS norm keeping its input alone (w too): backward makes 1/rms again."""

    @staticmethod
    def keep(ctx, x, rstd, weight) -> None:
        ctx.save(x=x, weight=weight)

    @staticmethod
    def inverse_rms(ctx):
        return kernels.rms_norm(ctx.saved["x"], ctx.saved["weight"], ctx.eps)[1]


class ByteMaskDropoutOp(ops.DropoutOp):
    """Dropout keeping its mask as a bool array, 1 byte an element (PyTorch's CUDA kernel; Korthikanti's count)."""

    @staticmethod
    def keep_mask(ctx, mask) -> None:
        ctx.save(mask=mask)

    @staticmethod
    def saved_mask(ctx, shape):
        return ctx.saved["mask"]


class PyTorchTopKRouting(ops.TopKRouting):
    """Routing keeping softmax's output p [N, E] and the division's divisor Σ p_chosen [N, 1], as autograd does."""

    @staticmethod
    def keep_routing(ctx, probabilities, total) -> None:
        ctx.save(probabilities=probabilities, total=total)


class PyTorchDispatch(ops.Dispatch):
    """Dispatch keeping each choice's slot too: torch.where(chosen == e) gives (token, slot) in one buffer."""

    @staticmethod
    def keep_slots(ctx, picks, k: int) -> None:
        ctx.save(**{f"slots{e}": p % k for e, p in enumerate(picks)})


class PyTorchCombine(ops.Combine):
    """Combine keeping, per expert, the indexed weights [n_e, 1] and the weighted output [n_e, d] (index_add's
    source), as autograd does."""

    @staticmethod
    def keep_weighted(ctx, expert: int, weight, weighted) -> None:
        ctx.save(**{f"weight{expert}": weight, f"weighted{expert}": weighted})


class MegatronMaskedFill(ops.MaskedFill):
    """The causal fill of Megatron's fused softmax, which keeps no mask: forward and backward each make the causal
    mask of x's last two axes."""

    @staticmethod
    def causal_mask_to_give(t_q: int, t_k: int):
        return None

    @staticmethod
    def forward(ctx, x, mask, value: float, scale: float = 1.0):
        return ops.MaskedFill.fill(ctx, x, causal_mask(*x.shape[-2:]), value, scale)

    @staticmethod
    def backward(ctx, grad_out):
        return ops.MaskedFill.grad(ctx, grad_out, causal_mask(*ctx.in_shapes[0][-2:]))


PROFILES = {
    "engine": {},
    "pytorch": {ops.LayerNormOp: PyTorchLayerNormOp, ops.DropoutOp: ByteMaskDropoutOp,
                ops.TopKRouting: PyTorchTopKRouting, ops.Dispatch: PyTorchDispatch, ops.Combine: PyTorchCombine},
    "megatron": {ops.LayerNormOp: MegatronLayerNormOp, ops.RMSNormOp: MegatronRMSNormOp,
                 ops.DropoutOp: ByteMaskDropoutOp, ops.MaskedFill: MegatronMaskedFill},
}


def saves_like(framework: str):
    """Ops recorded in the block save what `framework` saves (see SAVES): "engine", "pytorch" or "megatron". The
    values computed are the same whichever; what the ledger counts changes (this thread only)."""
    if framework not in SAVES:
        raise ValueError(f"saves_like: framework must be one of {', '.join(map(repr, SAVES))}, got {framework!r}")
    return state.patched(saves=framework, op_variants=PROFILES[framework])


__all__ = ["saves_like", "PROFILES"]
