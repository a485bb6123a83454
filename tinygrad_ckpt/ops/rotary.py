"""Rotary position embedding (Su et al. 2021, RoFormer; Llama), as one op.

Each pair of features (i, i + D/2) of a query or key at position t is turned by an angle t·θᵢ,
θᵢ = base^(-2i/D), the convention of Hugging Face's Llama (`rotate_half`: the two halves of the last
axis, not interleaved pairs):

    out = x·cos + rotate_half(x)·sin,   rotate_half([x₁, x₂]) = [-x₂, x₁],
    cos[t] = cos(t·[θ, θ]),  sin[t] = sin(t·[θ, θ])            (the tables: [positions, D] each)

A rotation is linear in x and its transpose is the rotation back, so dL/dx = g·cos + [g₂, -g₁]·sin:
the op keeps nothing of x, only the tables, which a model holds once as one [2, positions, D] buffer
shared by every layer (`rotary_table`), so the ledger counts them once per model, not per layer.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from ..backend import kernels
from ..engine.function import Function
from ._util import check_float, check_range, numel


def rotary_table(head_dim: int, positions: int, base: float = 10000.0, dtype=np.float32):
    """The [2, positions, head_dim] table: cos then sin of t·[θ, θ], θᵢ = base^(-2i/head_dim), computed in float64
    and rounded once to `dtype`, on the active backend."""
    if head_dim % 2:
        raise ValueError(f"rotary_table: head_dim must be even (pairs of features are rotated), got {head_dim}")

    def make():
        inv_freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)  # θᵢ
        angles = np.outer(np.arange(positions, dtype=np.float64), inv_freq)  # [positions, head_dim/2]
        angles = np.concatenate([angles, angles], axis=-1)  # [θ, θ]: Hugging Face's layout
        return np.stack([np.cos(angles), np.sin(angles)]).astype(dtype)

    return backend.current().from_host(make, (2, positions, head_dim), dtype)


class Rotary(Function):
    """out = x·cos + rotate_half(x)·sin over x's last axis (see the module), x [..., T, D] with positions 0..T-1,
    or the positions given ([T], or [B, T] for x [B, H, T, D]). Saves the table (the model's one shared buffer)
    and, when given, the positions: dL/dx = g·cos + [g₂, -g₁]·sin."""

    op = "rotary"

    @staticmethod
    def forward(ctx, x, table, positions=None):
        check_float("rotary", x, table)
        if len(x.shape) < 2 or x.shape[-1] % 2:
            raise ValueError(f"rotary: x must be [..., T, D] with an even D (feature pairs turn), got {list(x.shape)}")
        if len(table.shape) != 3 or table.shape[0] != 2 or table.shape[2] != x.shape[-1]:
            raise ValueError(f"rotary: the table must be [2, positions, {x.shape[-1]}] (cos, sin), got "
                             f"{list(table.shape)}; make it with rotary_table(head_dim, positions, base)")
        if x.dtype != table.dtype:
            raise TypeError(f"rotary: x is {x.dtype} and the table {table.dtype}; make the table in x's dtype")
        t = x.shape[-2]
        if positions is None and t > table.shape[1]:
            raise ValueError(f"rotary: {t} positions but the table holds {table.shape[1]}; make a longer table")
        if positions is not None:
            _check_positions(positions, x, table)
            ctx.save(positions=positions)
        ctx.save(table=table)
        ctx.flops = (3 * numel(x.shape), 3 * numel(x.shape))
        return kernels.rotary(x, *_cos_sin(table, t, positions))

    @staticmethod
    def backward(ctx, grad_out):
        cos, sin = _cos_sin(ctx.saved["table"], grad_out.shape[-2], ctx.saved.get("positions"))
        return kernels.rotary_grad(grad_out, cos, sin), None


def _cos_sin(table, t: int, positions):
    """cos and sin for x's positions: views of the table's first t rows, or its rows at `positions` ([T] -> [T, D],
    [B, T] -> [B, 1, T, D], to broadcast over heads)."""
    if positions is None:
        return table[0, :t], table[1, :t]
    picked = table[:, positions]  # [2, T, D] or [2, B, T, D]
    if len(positions.shape) == 2:
        picked = picked[:, :, None]
    return picked[0], picked[1]


def _check_positions(positions, x, table) -> None:
    if getattr(positions, "dtype", np.dtype(float)).kind not in "iu":
        raise TypeError(f"rotary: positions must be an integer array, got {getattr(positions, 'dtype', positions)!r}")
    t = x.shape[-2]
    fits = tuple(positions.shape) == (t,) or (len(positions.shape) == 2 and len(x.shape) == 4
                                              and tuple(positions.shape) == (x.shape[0], t))
    if not fits:
        raise ValueError(f"rotary: positions {list(positions.shape)} must be [{t}] or, for x [B, H, T, D], [B, {t}] "
                         f"(x is {list(x.shape)})")
    check_range("rotary", "position", positions, table.shape[1], "positions in the table")
