"""Functional API (`from tinygrad_ckpt import functional as F`), in PyTorch's names and layouts."""

from __future__ import annotations

import math

from . import ops
from .backend import xp
from .tensor import Tensor


def _data(x):
    return x.data if isinstance(x, Tensor) else x


def gelu(x, approximate: str = "none"):
    """x·Φ(x) (approximate="none", with erf) or its tanh approximation (approximate="tanh")."""
    return ops.GELU.apply(x, approximate=approximate)


def softmax(x, axis: int = -1):
    (x,) = ops.autocast_inputs("float32", x)
    return ops.Softmax.apply(x, axis=axis)


def log_softmax(x, axis: int = -1):
    (x,) = ops.autocast_inputs("float32", x)
    return ops.LogSoftmax.apply(x, axis=axis)


def layer_norm(x, weight, bias, eps: float = 1e-5):
    return ops.LayerNorm.apply(*ops.autocast_inputs("float32", x, weight, bias), eps=eps)


def linear(x, weight, bias=None):
    """x @ weightᵀ + bias, weight of shape [out_features, in_features]."""
    inputs = ops.autocast_inputs("half", x, weight) if bias is None else ops.autocast_inputs("half", x, weight, bias)
    return ops.Linear.apply(*inputs)


def dropout(x, p: float = 0.0, training: bool = True):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity if p == 0 or eval."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    return ops.Dropout.apply(x, p=p)


def embedding(ids, weight):
    """weight[ids]: rows of `weight` ([num_embeddings, dim]) picked by an integer array `ids`."""
    return ops.Embedding.apply(weight, _data(ids))


def cross_entropy(logits, targets, ignore_index: int = -1):
    """Mean negative log-likelihood of integer `targets` [N] under `logits` [N, C], over the targets that are
    not `ignore_index`; one example unbatched (logits [C], a 0-d target) as PyTorch takes it. Unlike PyTorch
    (NaN), a batch whose targets are all ignored gives 0 and zero gradients: a NaN there would reach every
    parameter through the optimizer."""
    targets = _data(targets)
    if len(logits.shape) == 1:
        targets = xp().asarray(targets)
        if targets.shape != ():
            raise ValueError(f"cross_entropy: unbatched logits [{logits.shape[0]}] take one 0-d target, got targets "
                             f"{list(targets.shape)}; for a batch pass logits [N, C] and targets [N]")
        logits, targets = logits.reshape(1, -1), targets.reshape(1)
    (logits,) = ops.autocast_inputs("float32", logits)
    return ops.CrossEntropy.apply(logits, targets, ignore_index=ignore_index)


def causal_mask(t_q: int, t_k: int):
    """Boolean [t_q, t_k] array, True above the diagonal (the future positions to hide). With fewer queries
    than keys the diagonal sits bottom-right (the last query sees every key, as when decoding with cached keys);
    PyTorch's is_causal aligns it top-left (its causal_lower_right bias gives this one)."""
    return xp().triu(xp().ones((t_q, t_k), dtype=bool), k=1 + t_k - t_q)


def scaled_dot_product_attention(q, k, v, causal: bool = True, dropout_p: float = 0.0, training: bool = True,
                                 impl: str = "explicit", block_size: int = ops.attention.BLOCK_SIZE):
    """softmax(q kᵀ/√d + mask) v, q, k, v: [B, H, T, head_dim].

    impl="explicit" builds it from primitives so the tape shows each piece: it keeps q and k (for the
    scores' backward), the boolean causal mask, the [B, H, T, T] attention weights (softmax output), the
    dropout mask if any, and v. impl="chunked" is one op (ops.ChunkedAttention) that walks blocks of
    `block_size` queries and keys with an online softmax: it keeps q, k, v, the output and one
    log-sum-exp per row, no [T, T] array, and recomputes the weights block by block in backward.
    """
    if impl not in ("explicit", "chunked"):
        raise ValueError(f"scaled_dot_product_attention: impl must be 'explicit' or 'chunked', got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must be [B, H, T, head_dim], got {list(t.shape)}"
            )
    if impl == "chunked":
        q, k, v = ops.autocast_inputs("half", q, k, v)
        return ops.ChunkedAttention.apply(q, k, v, causal=causal, dropout_p=dropout_p if training else 0.0,
                                          block_size=block_size)
    scores = q @ k.swapaxes(-2, -1)  # [B, H, T, T]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if causal:  # scaled and masked in one op: one [B, H, T, T] array fewer
        scores = ops.MaskedFill.apply(scores, causal_mask(q.shape[-2], k.shape[-2]), value=float("-inf"),
                                      scale=scale)
    else:
        scores = scores * scale
    att = softmax(scores, axis=-1)
    att = dropout(att, dropout_p, training)
    return att @ v  # [B, H, T, head_dim]
