"""nanoGPT's model, with its parameter names and layouts: a nanoGPT `state_dict` converted to NumPy
(`{k: v.numpy() for k, v in sd.items()}`) loads as it is."""

from __future__ import annotations

import math

from .. import backend
from .. import functional as F
from ..checks import one_of
from ..engine.tensor import Tensor
from ..recompute.plans import run_checkpointed
from .module import (
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    Module,
    ModuleDict,
    ModuleList,
    _dropout,
    _heads,
    _input,
    _size,
    _token_ids,
    next_token_logits_and_loss,
)


class CausalSelfAttention(Module):
    """Multi-head causal self-attention with the fused q,k,v projection `c_attn` ([3d, d]). `attention`:
    "explicit" (the [T, T] weights on the tape, as nanoGPT without flash) or "chunked" (ops.ChunkedAttention:
    no [T, T] array kept, the weights recomputed block by block in backward)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, n_layer: int = 1,
                 attention: str = "explicit"):
        super().__init__()
        d_model, n_heads = _heads("CausalSelfAttention", d_model, n_heads)
        dropout, n_layer = _dropout("CausalSelfAttention", dropout), _size("CausalSelfAttention", "n_layer", n_layer)
        one_of("CausalSelfAttention", "attention", attention, ("explicit", "chunked"))
        self.attention = attention
        self.c_attn = Linear(d_model, 3 * d_model)
        self.c_proj = Linear(d_model, d_model, std=0.02 / math.sqrt(2 * n_layer))
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)
        self.n_heads, self.d_model, self.dropout = n_heads, d_model, dropout

    def forward(self, x):
        _input("CausalSelfAttention", x, self.d_model)
        B, T, C = x.shape
        H = self.n_heads
        qkv = self.c_attn(x)  # [B, T, 3C]
        q, k, v = qkv.split(C, dim=2)  # views, [B, T, C] each
        q = q.reshape(B, T, H, C // H).transpose(1, 2)  # [B, H, T, hd]
        k = k.reshape(B, T, H, C // H).transpose(1, 2)
        v = v.reshape(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training,
                                           impl=self.attention)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, T, C] (a copy: the transpose is not contiguous)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"attention={self.attention}"


class MLP(Module):
    """GPT-2's feed-forward half: c_fc (d -> 4d), GELU (exact, or approximate="tanh"), c_proj (4d -> d, its init
    scaled by 1/sqrt(2·n_layer) as GPT-2's), dropout. With dropout > 0 a checkpoint's replay of the block runs c_proj
    too (the early stop cannot skip it): the dropout after it saves a mask, so it is replayed, and it reads c_proj's
    output."""

    def __init__(self, d_model: int, dropout: float = 0.0, n_layer: int = 1, approximate: str = "none"):
        d_model, dropout = _size("MLP", "d_model", d_model), _dropout("MLP", dropout)
        n_layer = _size("MLP", "n_layer", n_layer)
        one_of("MLP", "approximate", approximate, ("none", "tanh"))
        super().__init__()
        self.c_fc = Linear(d_model, 4 * d_model)
        self.c_proj = Linear(4 * d_model, d_model, std=0.02 / math.sqrt(2 * n_layer))
        self.dropout = Dropout(dropout)
        self.approximate = approximate

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(Module):
    """Pre-LayerNorm GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, n_layer: int = 1,
                 attention: str = "explicit"):
        d_model, n_heads = _heads("Block", d_model, n_heads)
        dropout, n_layer = _dropout("Block", dropout), _size("Block", "n_layer", n_layer)
        one_of("Block", "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.d_model = d_model
        self.ln_1 = LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, n_layer, attention)
        self.ln_2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout, n_layer)

    def forward(self, x):
        _input("Block", x, self.d_model)
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """nanoGPT: token + position embeddings, n_layer blocks, final LayerNorm, lm_head tied to wte.

    `gpt(idx, targets)` -> (logits, loss). idx, targets: integer arrays [B, T]. With targets the
    logits cover every position; without, only the last one (as nanoGPT). `checkpoint` chooses
    activation checkpointing of the blocks: None, "every_layer", "sqrt", an int (that many
    segments), a policy (selective recomputation inside every block) or a planner Plan. `attention`:
    "explicit" or "chunked", for every block (see CausalSelfAttention).
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 dropout: float = 0.0, checkpoint=None, attention: str = "explicit"):
        vocab_size, block_size = _size("GPT", "vocab_size", vocab_size), _size("GPT", "block_size", block_size)
        n_layer, (d_model, n_head) = _size("GPT", "n_layer", n_layer, 0), _heads("GPT", d_model, n_head, "n_head")
        dropout = _dropout("GPT", dropout)
        one_of("GPT", "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.transformer = ModuleDict(
            wte=Embedding(vocab_size, d_model),
            wpe=Embedding(block_size, d_model),
            drop=Dropout(dropout),
            h=ModuleList([Block(d_model, n_head, dropout, n_layer, attention) for _ in range(n_layer)]),
            ln_f=LayerNorm(d_model),
        )
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT
        self.vocab_size, self.block_size, self.checkpoint = vocab_size, block_size, checkpoint

    def forward(self, idx, targets=None):
        given = idx.data if isinstance(idx, Tensor) else idx
        idx = _token_ids("GPT", given, self.block_size)
        T = idx.shape[1]
        tr = self.transformer
        pos = backend.xp().arange(T)
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # [B, T, d]
        x = self.run_blocks(x)
        x = tr.ln_f(x)
        return next_token_logits_and_loss("GPT", self.lm_head, x, idx, given, targets, self.vocab_size)

    def run_blocks(self, x):
        """Run the blocks, checkpointed as `self.checkpoint` says (recompute/plans.py: run_checkpointed)."""
        return run_checkpointed(list(self.transformer.h), x, self.checkpoint)
