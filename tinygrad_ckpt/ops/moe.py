"""A mixture of experts' three steps (Shazeer et al. 2017; Mixtral, Jiang et al. 2024), each one op:

    route:     p = softmax(router logits) over E experts; each token's k largest p (`indices` [N, k]) and
               their weights w = p_chosen / Σ p_chosen (renormalised over the k);
    dispatch:  expert e's tokens x[rows_e], the tokens that chose e (`picks`: positions token·k + slot);
    combine:   out[n] = Σ over n's k choices of w[n, slot]·y_e[i], y_e the expert's output for those rows.

So every token goes through its k experts only. Each op keeps what its backward reads; the variants in
scale/save_profiles.py keep what PyTorch's autograd keeps for Hugging Face's Mixtral block (hooks `keep_routing`,
`keep_slots`, `keep_weighted`). Values decide the shapes (how many tokens each expert takes); the meta backend has
none, so there every expert takes a balanced share (`balanced_indices`: token n's slot j goes to expert
(n·k + j) mod E), as a NumPy run with `routing="balanced"` can, and then its ledger equals the meta ledger event
for event. What each op keeps, in full: docs/house.md.
"""

from __future__ import annotations

import numpy as np

from .. import backend
from ..backend import xp
from ..engine.function import Function
from ._util import check_float, numel


def balanced_indices(n_tokens: int, k: int, n_experts: int):
    """[N, k] experts dealing the N·k choices round robin: token n's slot j -> expert (n·k + j) mod E (k distinct
    experts per token, since k <= E), on the active backend (shapes only on meta)."""
    return backend.current().from_host(
        lambda: np.arange(n_tokens * k, dtype=np.intp).reshape(n_tokens, k) % n_experts, (n_tokens, k), np.intp)


def expert_picks(indices, n_experts: int) -> list:
    """Per expert, the positions token·k + slot (ascending, int) of the choices that picked it. On the meta backend
    (no values) the counts of `balanced_indices`: expert e gets ⌈(N·k - e)/E⌉ choices."""
    return backend.current().positions_of_each(indices, n_experts)


class TopKRouting(Function):
    """(weights [N, k], indices [N, k]) from router logits [N, E]: each row's k most probable experts (largest first;
    `experts`, an [N, k] integer array, chooses them instead) and w = p_chosen / Σ p_chosen, p = softmax(logits).

    The weights are a softmax over the chosen logits alone (e^l / Σ_chosen e^l: the normaliser cancels), so with
    g = dL/dw, dL/dlogits = w·(g - Σ g·w) at the chosen experts and 0 elsewhere. Saves the weights and indices
    (2·N·k numbers): nothing of the [N, E] probabilities."""

    op = "topk_routing"

    @classmethod
    def forward(cls, ctx, logits, k, experts=None):
        check_float("topk_routing", logits)
        if len(logits.shape) != 2:
            raise ValueError(f"topk_routing: logits must be [tokens, experts], got {list(logits.shape)}")
        n_experts = logits.shape[1]
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n_experts:
            raise ValueError(f"topk_routing: k must be an int from 1 to the number of experts ({n_experts}), got {k!r}")
        shift = logits.max(axis=1, keepdims=True) if numel(logits.shape) else 0
        p = xp().exp(logits - shift)
        p /= p.sum(axis=1, keepdims=True)  # softmax over the experts
        if experts is None:
            indices = backend.current().top_k_indices(p, k)  # the k largest, largest first
        else:
            if tuple(experts.shape) != (logits.shape[0], k) or experts.dtype.kind not in "iu":
                raise ValueError(f"topk_routing: experts must be integers [{logits.shape[0]}, {k}], got "
                                 f"{list(experts.shape)} {experts.dtype}")
            indices = experts.astype(np.intp)  # a copy: the op's own
        chosen = xp().take_along_axis(p, indices, axis=1)
        total = chosen.sum(axis=1, keepdims=True)
        weights = chosen / total
        ctx.save(weights=weights, indices=indices)
        cls.keep_routing(ctx, p, total)
        ctx.mark_non_differentiable(1)
        ctx.flops = (5 * numel(logits.shape), 4 * numel(weights.shape))
        return weights, indices

    @staticmethod
    def keep_routing(ctx, probabilities, total) -> None:
        """Keep nothing more of the [N, E] probabilities p and the [N, 1] sums Σ p_chosen (backward reads w alone)."""

    @staticmethod
    def backward(ctx, grad_weights, grad_indices=None):
        weights, indices = ctx.saved["weights"], ctx.saved["indices"]
        chosen = weights * (grad_weights - (grad_weights * weights).sum(axis=1, keepdims=True))  # w·(g - Σ g·w)
        grad = xp().zeros(ctx.in_shapes[0], dtype=grad_weights.dtype)
        xp().put_along_axis(grad, indices, chosen, axis=1)
        return grad


class Dispatch(Function):
    """(x[rows_0], x[rows_1], ...): each expert's tokens, rows_e = picks_e // k (see the module), from x [N, d].
    Saves the picks (the same arrays combine keeps): dL/dx[rows_e] += g_e for every expert (a token's rows within
    one expert are distinct, so plain indexed adds suffice)."""

    op = "dispatch"

    @classmethod
    def forward(cls, ctx, x, picks, k):
        if len(x.shape) != 2:
            raise ValueError(f"dispatch: x must be [tokens, features], got {list(x.shape)}")
        _check_picks("dispatch", picks, x.shape[0], k)
        ctx.k = k
        ctx.save(**{f"picks{e}": p for e, p in enumerate(picks)})
        cls.keep_slots(ctx, picks, k)
        ctx.experts = len(picks)
        return tuple(x[p // k] for p in picks)

    @staticmethod
    def keep_slots(ctx, picks, k: int) -> None:
        """Keep nothing more: each choice's slot, picks_e mod k, is read from the picks when wanted."""

    @staticmethod
    def backward(ctx, *grads):
        grad = xp().zeros(ctx.in_shapes[0], dtype=next(g for g in grads if g is not None).dtype)
        for e, g in enumerate(grads):
            if g is not None:
                grad[ctx.saved[f"picks{e}"] // ctx.k] += g
        return grad


class Combine(Function):
    """out [N, d] = Σ_e scatter of w[picks_e]·y_e to rows picks_e // k (see the module), from the routing weights
    [N, k] and each expert's output y_e [n_e, d]. Saves the weights, the picks and the expert outputs: dL/dy_e =
    g[rows_e]·w[picks_e], dL/dw[picks_e] = Σ_d g[rows_e]·y_e (the expert outputs are what combine's backward reads:
    the tokens' k·d values; the weights are N·k numbers)."""

    op = "combine"

    @classmethod
    def forward(cls, ctx, weights, *outputs, picks):
        if len(weights.shape) != 2 or len(outputs) != len(picks):
            raise ValueError(f"combine: weights must be [tokens, k] and there must be one output per expert, got "
                             f"weights {list(weights.shape)}, {len(outputs)} outputs, {len(picks)} experts")
        n, k = weights.shape
        _check_picks("combine", picks, n, k)
        d = outputs[0].shape[-1] if outputs else 0
        for e, (y, p) in enumerate(zip(outputs, picks)):
            if tuple(y.shape) != (p.shape[0], d):
                raise ValueError(f"combine: expert {e} returned {list(y.shape)} for {p.shape[0]} tokens; expected "
                                 f"[{p.shape[0]}, {d}]")
            if y.dtype != weights.dtype:
                raise TypeError(f"combine: expert {e}'s output is {y.dtype} and the weights {weights.dtype}")
        ctx.k = k
        ctx.save(weights=weights, **{f"picks{e}": p for e, p in enumerate(picks)})
        if ctx.needs_input_grad[0]:
            ctx.save(**{f"out{e}": y for e, y in enumerate(outputs)})
        out = xp().zeros((n, d), dtype=weights.dtype)
        flat = weights.reshape(-1)
        for e, (y, p) in enumerate(zip(outputs, picks)):
            w = flat[p][:, None]
            weighted = y * w
            out[p // k] += weighted
            cls.keep_weighted(ctx, e, w, weighted)
        ctx.flops = (2 * n * k * d, 4 * n * k * d)
        return out

    @staticmethod
    def keep_weighted(ctx, expert: int, weight, weighted) -> None:
        """Keep nothing more of expert e's weights w[picks_e] [n_e, 1] and weighted output [n_e, d] (backward reads
        the routing weights and the expert outputs)."""

    @staticmethod
    def backward(ctx, grad_out):
        weights, k = ctx.saved["weights"], ctx.k
        flat = weights.reshape(-1)
        experts = len(ctx.in_shapes) - 1
        grads = []
        grad_w = xp().zeros(numel(weights.shape), dtype=grad_out.dtype) if ctx.needs_input_grad[0] else None
        for e in range(experts):
            picks = ctx.saved[f"picks{e}"]
            g = grad_out[picks // k]  # [n_e, d]
            if grad_w is not None:
                grad_w[picks] = (g * ctx.saved[f"out{e}"]).sum(axis=1)
            grads.append(g * flat[picks][:, None] if ctx.needs_input_grad[1 + e] else None)
        return (None if grad_w is None else grad_w.reshape(weights.shape), *grads)


def _check_picks(op: str, picks, n_tokens: int, k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{op}: k must be a positive int (experts per token), got {k!r}")
    for e, p in enumerate(picks):
        if len(p.shape) != 1 or p.dtype.kind not in "iu":
            raise TypeError(f"{op}: picks {e} must be a 1-d integer array (positions token·k + slot), got "
                            f"{list(p.shape)} {p.dtype}")
    for e, p in enumerate(picks):
        if backend.current().first_outside(p, n_tokens * k) is not None:
            raise IndexError(f"{op}: picks {e} hold positions outside [0, {n_tokens * k}) (tokens·k)")
