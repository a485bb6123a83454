"""Functional API (`from tinygrad_ckpt import functional as F`), in PyTorch's names and layouts."""

from __future__ import annotations

import math

from . import ops, state
from .backend import xp
from .engine.tensor import Tensor
from .ops._util import causal_mask  # noqa: F401  (functional.causal_mask, as before)


def _data(x):
    return x.data if isinstance(x, Tensor) else x


def gelu(x, approximate: str = "none"):
    """x·Φ(x) (approximate="none", with erf) or its tanh approximation (approximate="tanh")."""
    return ops.GELU.apply(x, approximate=approximate)


def silu(x):
    """x·σ(x) (swish): the gate of a SwiGLU MLP."""
    return ops.SiLUOp.apply(x)


def relu(x):
    """max(x, 0) (integers stay integers, as in PyTorch)."""
    return x.relu()


def sigmoid(x):
    """σ(x) = 1/(1 + e^(-x)); integers become float32, as in PyTorch."""
    return x.sigmoid()


def softmax(x, axis: int = -1):
    (x,) = ops.autocast_inputs("float32", x)
    return ops.Softmax.apply(x, axis=axis)


def log_softmax(x, axis: int = -1):
    (x,) = ops.autocast_inputs("float32", x)
    return ops.LogSoftmax.apply(x, axis=axis)


def layer_norm(x, weight, bias, eps: float = 1e-5):
    return state.op_variant(ops.LayerNormOp).apply(*ops.autocast_inputs("float32", x, weight, bias), eps=eps)


def rms_norm(x, weight, eps: float = 1e-6):
    """x / √(mean(x²) + eps) · weight over the last axis (Llama's RMSNorm; PyTorch's F.rms_norm over the last axis
    with a weight). A weight of another dtype is cast to x's (its gradient cast back), as PyTorch does."""
    weight = ops.cast(weight, x.dtype) if weight.dtype != x.dtype else weight
    return state.op_variant(ops.RMSNormOp).apply(x, weight, eps=eps)


def rotary_embedding(x, table, positions=None):
    """Rotary positions (Hugging Face's rotate_half convention) on x [..., T, head_dim]: x·cos + rotate_half(x)·sin
    with cos, sin from `table` [2, positions, head_dim] (ops.rotary.rotary_table), at positions 0..T-1 or at
    `positions` ([T] or [B, T]). Keeps only the table (one buffer a model shares between its layers)."""
    return ops.Rotary.apply(x, _data(table), positions=None if positions is None else _data(positions))


def cat(tensors, dim: int = 0):
    """PyTorch's torch.cat: the tensors side by side along `dim` (one new buffer), in the one dtype PyTorch
    promotes them to."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat: expected a non-empty list of tensors")
    dtype = ops.promoted_dtype([t.dtype for t in tensors])
    return ops.Concatenate.apply(*(ops.cast(t, dtype) for t in tensors), axis=dim)


def stack(tensors, dim: int = 0):
    """PyTorch's torch.stack: tensors of one shape along a new axis `dim` (each viewed with a size-1 axis there,
    then concatenated)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    shape = tuple(tensors[0].shape)
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape:
            raise ValueError(f"stack: tensor {i} has shape {list(t.shape)}, tensor 0 {list(shape)}; stack expects "
                             "each tensor to be equal size")
    n = len(shape) + 1
    if isinstance(dim, bool) or not isinstance(dim, int) or not -n <= dim < n:
        raise IndexError(f"stack: dim {dim!r} is out of range for {n} dimensions ({-n} to {n - 1})")
    dim %= n
    return cat([t.reshape(*shape[:dim], 1, *shape[dim:]) for t in tensors], dim=dim)


def linear(x, weight, bias=None):
    """x @ weightᵀ + bias, weight of shape [out_features, in_features]."""
    inputs = ops.autocast_inputs("half", x, weight) if bias is None else ops.autocast_inputs("half", x, weight, bias)
    return ops.LinearOp.apply(*inputs)


def dropout(x, p: float = 0.0, training: bool = True):
    """Zero each element with probability p and scale the rest by 1/(1-p); identity if p == 0 or eval."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    return state.op_variant(ops.DropoutOp).apply(x, p=p)


def embedding(ids, weight):
    """weight[ids]: rows of `weight` ([num_embeddings, dim]) picked by an integer array `ids`."""
    return ops.EmbeddingOp.apply(weight, _data(ids))


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


def scaled_dot_product_attention(q, k, v, causal: bool = True, dropout_p: float = 0.0, training: bool = True,
                                 impl: str = "explicit", block_size: int = ops.attention.BLOCK_SIZE,
                                 enable_gqa: bool = False):
    """softmax(q kᵀ/√d + mask) v, q, k, v: [B, H, T, head_dim].

    impl="explicit" builds it from primitives so the tape shows each piece: it keeps q and k (for the
    scores' backward), the boolean causal mask, the [B, H, T, T] attention weights (softmax output), the
    dropout mask if any, and v. impl="chunked" is one op (ops.ChunkedAttention) that walks blocks of
    `block_size` queries and keys with an online softmax: it keeps q, k, v, the output and one
    log-sum-exp per row, no [T, T] array, and recomputes the weights block by block in backward.

    enable_gqa (as PyTorch's): k and v may have Hkv heads, a divisor of q's H (grouped-query attention; Hkv = 1
    is multi-query attention); query head h attends with key/value head h // (H/Hkv). Neither path repeats k or
    v: q is viewed as [B, Hkv, H/Hkv, T, d] and k, v as [B, Hkv, 1, T, d], and the products broadcast.
    """
    if impl not in ("explicit", "chunked"):
        raise ValueError(f"scaled_dot_product_attention: impl must be 'explicit' or 'chunked', got {impl!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ValueError(
                f"scaled_dot_product_attention: {name} must be [B, H, T, head_dim], got {list(t.shape)}"
            )
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads != kv_heads or kv_heads != v.shape[1]:
        if not enable_gqa or kv_heads != v.shape[1] or not kv_heads or heads % kv_heads:
            hint = "" if enable_gqa else "; with fewer key/value heads than query heads pass enable_gqa=True"
            raise ValueError(f"scaled_dot_product_attention: q has {heads} heads, k {kv_heads} and v {v.shape[1]}: "
                             f"k and v need one head count that divides q's{hint}")
    if impl == "chunked":
        q, k, v = ops.autocast_inputs("half", q, k, v)
        return ops.ChunkedAttention.apply(q, k, v, causal=causal, dropout_p=dropout_p if training else 0.0,
                                          block_size=block_size)
    if heads != kv_heads:  # [B, Hkv, G, T, d] queries against [B, Hkv, 1, T, d] keys and values: broadcast
        B, _, t_q, _ = q.shape
        out = _explicit_attention(q.reshape(B, kv_heads, heads // kv_heads, t_q, q.shape[-1]),
                                  k.reshape(B, kv_heads, 1, *k.shape[2:]), v.reshape(B, kv_heads, 1, *v.shape[2:]),
                                  causal, dropout_p, training)
        return out.reshape(B, heads, t_q, v.shape[-1])
    return _explicit_attention(q, k, v, causal, dropout_p, training)


def _explicit_attention(q, k, v, causal, dropout_p, training):
    """The explicit path on [..., T, d] queries, keys and values (broadcasting over the leading axes)."""
    scores = q @ k.swapaxes(-2, -1)  # [B, H, T, T]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if causal:  # scaled and masked in one op: one [B, H, T, T] array fewer
        fill = state.op_variant(ops.MaskedFill)
        scores = fill.apply(scores, fill.causal_mask_to_give(q.shape[-2], k.shape[-2]), value=float("-inf"),
                            scale=scale)
    else:
        scores = scores * scale
    att = softmax(scores, axis=-1)
    att = dropout(att, dropout_p, training)
    return att @ v  # [B, H, T, head_dim]


def topk_routing(logits, k: int, experts=None):
    """(weights [N, k], indices [N, k]) of a router: each token's k most probable experts under softmax(logits) and
    their probabilities renormalised over the k, as Mixtral; `experts` ([N, k] integers) chooses instead."""
    return state.op_variant(ops.TopKRouting).apply(logits, k=k, experts=None if experts is None else _data(experts))


def moe_dispatch(x, picks, k: int):
    """Each expert's tokens: x[picks_e // k] for the picks of every expert (ops.moe.expert_picks), x [N, d]."""
    return state.op_variant(ops.Dispatch).apply(x, picks=tuple(_data(p) for p in picks), k=k)


def moe_combine(weights, outputs, picks):
    """out [N, d]: every token's expert outputs weighted by its routing weights [N, k] and summed (the scatter back
    of moe_dispatch)."""
    return state.op_variant(ops.Combine).apply(weights, *outputs, picks=tuple(_data(p) for p in picks))
