"""Attention without the T×T matrix: one op that walks query and key blocks with an online softmax
(Rabe & Staats 2021, "Self-attention does not need O(n²) memory"; the backward of FlashAttention-2).

Forward, for each block of queries, over the key blocks it can see (a causal mask skips the blocks
that lie wholly in the future):

    s = (q·scale) kᵀ,  m' = max(m, rowmax s),  p = e^(s - m'),  l ← l·e^(m - m') + Σ p,
    acc ← acc·e^(m - m') + p v;          at the end  out = acc / l,  lse = m + log l.

It saves q, k, v, the output and the per-row log-sum-exp (B·H·T numbers), never a [T, T] array (k and v once
under grouped-query attention). Backward recomputes each block's probabilities from lse, P = e^(s - lse), and
with D = rowsum(dO ∘ O): dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D), dQ += dS K·scale, dK += dSᵀ Q·scale: one
more [T, T]-sized product than the explicit path's backward (lesson 10). Attention dropout regenerates each
block's mask from a reserved random stream (backend.next_stream). In full: docs/house.md.
"""

from __future__ import annotations

import math

from .. import backend
from ..backend import xp
from ..engine.function import Function

# queries and keys per block. Larger blocks mean fewer, bigger NumPy calls and BLAS products (a product of 128 x 64
# x 128 is too small for OpenBLAS's two threads to share well) but larger temporaries ([B, H, block, block] scores
# and probabilities, not kept) and more work on the diagonal blocks, half of which the causal mask discards.
# Forward + backward of one layer against the explicit path (d = 256, H = 4, B = 1, 2 threads), two runs each, on the
# machine of 2026-12-01 (AVX-512): blocks of 256 took 1.03x its time at T = 256 and 512, 1.00-1.01x at 1024,
# 0.62-0.64x at 2048 and 0.46-0.52x at 4096; blocks of 128, 1.05-1.06x, 1.08-1.14x, 1.06-1.20x, 0.83-1.00x and
# 0.49-0.70x. At 1 thread the two were equal (T = 512 to 2048). At (B, T, d, H) = (8, 256, 256, 8), where 256 is one
# block and nothing is skipped, 128 was faster (1.02x against 1.08x). On the machine before it, 128 beat 64 and 256.
BLOCK_SIZE = 256


def blocks(t: int, size: int) -> list:
    """[(start, stop)] of t positions cut into blocks of `size` (the last one may be shorter)."""
    return [(i, min(i + size, t)) for i in range(0, t, size)]


class ChunkedAttention(Function):
    """softmax(q kᵀ/√d + causal mask) v by blocks of `block_size` queries and keys (see the module).

    Saves q, k, v (views of the caller's buffers: in a GPT block, of the q/k/v projection), the output
    and the per-row log-sum-exp [B, H, T_q, 1]; with dropout, the random stream (two integers). k and v may
    have fewer heads than q (a divisor of q's: grouped-query attention), and are then not repeated.
    """

    op = "chunked_attention"

    @staticmethod
    def forward(ctx, q, k, v, causal=True, dropout_p=0.0, block_size=BLOCK_SIZE):
        _check(q, k, v, causal, dropout_p, block_size)
        ctx.save(q=q, k=k, v=v)
        q, k, v = _grouped(q, k, v)  # fewer key/value heads: [B, Hkv, G, T, D] against [B, Hkv, 1, T, D]
        tq, tk = q.shape[-2], k.shape[-2]
        ctx.causal, ctx.dropout_p, ctx.block_size = causal, dropout_p, block_size
        ctx.scale = 1.0 / math.sqrt(q.shape[-1])
        ctx.stream = backend.next_stream() if dropout_p > 0 else None
        out = xp().empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
        lse = xp().empty(q.shape[:-1] + (1,), dtype=q.dtype)
        area = 0  # score elements computed: the FLOPs follow it
        for bi, (i0, i1) in enumerate(blocks(tq, block_size)):
            qb = q[..., i0:i1, :] * xp().asarray(ctx.scale, dtype=q.dtype)
            m = l_sum = acc = None
            for bj, (j0, j1) in _visible(ctx, i0, i1, tq, tk):
                s = qb @ k[..., j0:j1, :].swapaxes(-1, -2)  # [B, H, bq, bk]
                _mask_partial(ctx, s, i0, i1, j0, j1, tq, tk)
                area += (i1 - i0) * (j1 - j0)
                block_max = s.max(axis=-1, keepdims=True)
                m_new = block_max if m is None else xp().maximum(m, block_max)
                shift = _shift(m_new)
                s -= shift
                p = xp().exp(s)
                if m is None:
                    l_sum, acc = p.sum(axis=-1, keepdims=True), _dropped(ctx, p, bi, bj) @ v[..., j0:j1, :]
                else:
                    correction = xp().exp(m - shift)
                    l_sum *= correction
                    l_sum += p.sum(axis=-1, keepdims=True)
                    acc *= correction
                    acc += _dropped(ctx, p, bi, bj) @ v[..., j0:j1, :]
                m = m_new
            if m is None:  # no key to attend to (t_k = 0): an empty sum, 0, as PyTorch's
                out[..., i0:i1, :], lse[..., i0:i1, :] = 0, -math.inf
                continue
            acc /= l_sum
            out[..., i0:i1, :] = acc
            lse[..., i0:i1, :] = m + xp().log(l_sum)
        ctx.save(out=out, lse=lse)
        batch = math.prod(q.shape[:-2])
        d, dv = q.shape[-1], v.shape[-1]
        ctx.flops = (batch * area * (2 * d + 2 * dv + 5),  # q kᵀ, p v, and the softmax's max/subtract/exp/sum
                     batch * area * (6 * d + 4 * dv + 5))  # q kᵀ again, dV, dP, dQ, dK, and P, dS
        if out.ndim != len(ctx.in_shapes[0]):  # grouped: the heads' groups side by side again (a view)
            return out.reshape(ctx.in_shapes[0][:-1] + v.shape[-1:])
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = (ctx.saved[n] for n in ("q", "k", "v", "out", "lse"))
        q, k, v = _grouped(q, k, v)
        if grad_out.ndim != out.ndim:
            grad_out = grad_out.reshape(out.shape)
        grouped = q.ndim == 5 and k.shape[2] != q.shape[2]  # each key block serves G query heads: sum over them
        tq, tk = q.shape[-2], k.shape[-2]
        scale = xp().asarray(ctx.scale, dtype=q.dtype)
        row_dot = (grad_out * out).sum(axis=-1, keepdims=True)  # D = rowsum(dO ∘ O)
        dq = xp().zeros(q.shape, dtype=q.dtype)
        dk = xp().zeros(k.shape, dtype=k.dtype)
        dv = xp().zeros(v.shape, dtype=v.dtype)
        for bi, (i0, i1) in enumerate(blocks(tq, ctx.block_size)):
            qb = q[..., i0:i1, :] * scale
            gb = grad_out[..., i0:i1, :]
            for bj, (j0, j1) in _visible(ctx, i0, i1, tq, tk):
                kb, vb = k[..., j0:j1, :], v[..., j0:j1, :]
                s = qb @ kb.swapaxes(-1, -2)
                _mask_partial(ctx, s, i0, i1, j0, j1, tq, tk)
                s -= lse[..., i0:i1, :]
                p = xp().exp(s)  # the probabilities, recomputed
                dv[..., j0:j1, :] += _heads_summed(_dropped(ctx, p, bi, bj).swapaxes(-1, -2) @ gb, grouped)
                dp = _dropped(ctx, gb @ vb.swapaxes(-1, -2), bi, bj)  # dropout's backward is its forward
                dp -= row_dot[..., i0:i1, :]
                dp *= p  # dS = P ∘ (dP - D)
                dq[..., i0:i1, :] += dp @ kb
                dk[..., j0:j1, :] += _heads_summed(dp.swapaxes(-1, -2) @ qb, grouped)
        dq *= scale
        if grouped:
            return tuple(g.reshape(shape) for g, shape in zip((dq, dk, dv), ctx.in_shapes))
        return dq, dk, dv


def _grouped(q, k, v):
    """q, k, v as they are, or with fewer key/value heads than query heads (grouped-query attention, H = G·Hkv) as
    views [B, Hkv, G, T, D] (query head h = kv·G + g) and [B, Hkv, 1, T, D], which broadcast: every key and value
    block serves its G query heads without being repeated."""
    heads, kv_heads = q.shape[-3] if q.ndim >= 3 else 1, k.shape[-3] if k.ndim >= 3 else 1
    if heads == kv_heads:
        return q, k, v
    lead, group = q.shape[:-3], heads // kv_heads
    return (q.reshape(lead + (kv_heads, group) + q.shape[-2:]), k.reshape(lead + (kv_heads, 1) + k.shape[-2:]),
            v.reshape(lead + (kv_heads, 1) + v.shape[-2:]))


def _heads_summed(a, grouped: bool):
    """A key or value block's gradient from its G query heads, summed over them (the group axis, -3)."""
    return a.sum(axis=-3, keepdims=True) if grouped else a


def _visible(ctx, i0: int, i1: int, tq: int, tk: int):
    """(index, (j0, j1)) of the key blocks queries i0..i1-1 can see. Causal (aligned bottom-right, as
    functional.causal_mask): query i sees keys j <= i + tk - tq, so blocks starting after the last query's
    horizon are skipped, not computed."""
    horizon = i1 - 1 + tk - tq if ctx.causal else tk - 1
    return [(bj, (j0, j1)) for bj, (j0, j1) in enumerate(blocks(tk, ctx.block_size)) if j0 <= horizon]


def _mask_partial(ctx, s, i0: int, i1: int, j0: int, j1: int, tq: int, tk: int) -> None:
    """-inf in place where a block straddles the diagonal (key j > query i + tk - tq). Set, not added: a NaN or inf
    score of a future key (NaN + -inf is NaN) must not reach the queries before it, as on the explicit path."""
    first_hidden = i0 + tk - tq - j0 + 1  # column offset from the diagonal, in block coordinates
    if ctx.causal and j1 - 1 >= i0 + tk - tq + 1:  # some key of the block is after the first query's horizon
        hidden = xp().triu(xp().ones((i1 - i0, j1 - j0), dtype=bool), k=first_hidden)
        xp().copyto(s, xp().asarray(-math.inf, dtype=s.dtype), where=hidden)


def _shift(m):
    """The running row maximum to subtract, 0 where it is still -inf (every score so far -inf: a key of -inf, or a
    masked one): -inf - -inf would be NaN, and the explicit path's softmax sees the row's finite scores too."""
    return xp().where(m == -math.inf, xp().zeros((), dtype=m.dtype), m)


def _dropped(ctx, p, bi: int, bj: int):
    """p with block (bi, bj)'s dropout mask applied and kept values scaled by 1/(1 - p); p itself without."""
    if ctx.stream is None:
        return p
    keep = backend.stream_generator(ctx.stream, bi, bj).random(p.shape, dtype=xp().float32) >= ctx.dropout_p
    out = p * keep
    out *= xp().asarray(1.0 / (1.0 - ctx.dropout_p), dtype=p.dtype)
    return out


def _check(q, k, v, causal, dropout_p, block_size) -> None:
    shapes = f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"chunked_attention: block_size must be a positive int (queries and keys per block), "
                         f"got {block_size!r}; 64 to 256 is a good range")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"chunked_attention: dropout_p must be in [0, 1), got {dropout_p}")
    if not q.dtype == k.dtype == v.dtype:  # as PyTorch's scaled_dot_product_attention: no silent promotion
        raise ValueError(f"chunked_attention: expected query, key, and value to have the same dtype, got q {q.dtype}, "
                         f"k {k.dtype}, v {v.dtype}; give them one dtype (e.g. create all three float32)")
    heads, kv_heads = (q.shape[-3], k.shape[-3]) if q.ndim >= 3 and k.ndim >= 3 else (None, None)
    if (q.shape[:-3] != k.shape[:-3] or q.ndim != k.ndim or k.shape[:-1] != v.shape[:-1]
            or q.shape[-1] != k.shape[-1] or (heads != kv_heads and (not kv_heads or heads % kv_heads))):
        raise ValueError(f"chunked_attention: {shapes} do not fit: q and k need the same leading axes and head_dim "
                         "(or, for grouped-query attention, q a multiple of k's heads), k and v the same leading "
                         "axes and length (broadcast them first)")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"chunked_attention: causal with more queries than keys ({shapes}) leaves the first "
                         f"{q.shape[-2] - k.shape[-2]} queries with no key to attend to; pass fewer queries")
