"""One device's share of a GPT trained on many: tensor, sequence and pipeline parallelism, ZeRO, simulated.

    par = Parallelism(tensor=8, sequence=True)
    model = DeviceShard(GPTShape(...), par)       # what device 0 holds and runs (on the meta backend: seconds)

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) splits each block's matrices over t devices: c_attn
and c_fc column-parallel, the projections row-parallel, the embedding and lm_head over the vocabulary.
Sequence parallelism (Korthikanti et al. 2022) splits the layer norms, dropouts and residual adds along the
sequence ([B, T/t, d]): all-gathered before a column-parallel linear, reduce-scattered after a row-parallel one.

One device is simulated alone: a collective is an op with the shapes and the saves of the real one, the other
devices' values taken to equal this one's; so every byte the ledger counts is the real device's, the values
are not. Pipeline parallelism and ZeRO are in `measure.ParallelStep`. In full: docs/house.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import backend, nn
from .. import functional as F
from ..engine.function import Function
from ..engine.tensor import Parameter
from ..recompute.plans import run_checkpointed
from .estimate import GPTShape


@dataclass(frozen=True)
class Parallelism:
    """How training is split: tensor-parallel degree t, sequence parallelism, pipeline stages p with m
    microbatches, ZeRO stage (0: none) over d data-parallel replicas, and v virtual stages (model chunks) per
    pipeline device: Megatron's interleaved 1F1B (Narayanan et al. 2021) when v > 1."""

    tensor: int = 1
    sequence: bool = False
    pipeline: int = 1
    microbatches: int = 1
    zero: int = 0
    data: int = 1
    virtual: int = 1

    def check(self, shape: GPTShape) -> None:
        """ValueError naming the argument, its value and what to do, for a split the model does not allow."""
        t, p, m = self.tensor, self.pipeline, self.microbatches
        for name, value in (("tensor_parallel", t), ("pipeline_parallel", p), ("microbatches", m),
                            ("data_parallel", self.data)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if shape.n_head % t:
            raise ValueError(f"tensor_parallel {t} does not divide the {shape.n_head} heads: each device takes "
                             f"heads/t of them; pick a divisor of {shape.n_head}")
        if shape.vocab_size % t:
            raise ValueError(f"tensor_parallel {t} does not divide the vocabulary {shape.vocab_size} (the embedding "
                             "is split over it); pad the vocabulary to a multiple of t")
        if self.sequence and t == 1:
            raise ValueError("sequence_parallel splits the sequence over the tensor-parallel devices: it needs "
                             "tensor_parallel > 1")
        if self.sequence and shape.seq_len % t:
            raise ValueError(f"sequence_parallel: tensor_parallel {t} does not divide the sequence length "
                             f"{shape.seq_len}")
        if isinstance(self.virtual, bool) or not isinstance(self.virtual, int) or self.virtual < 1:
            raise ValueError(f"virtual_stages must be a positive integer, got {self.virtual!r}")
        if shape.n_layer % p:
            raise ValueError(f"pipeline_parallel {p} does not divide the {shape.n_layer} layers; each stage takes "
                             "layers/p of them")
        if self.virtual > 1 and p == 1:
            raise ValueError(f"virtual_stages {self.virtual} interleaves the chunks of pipeline stages: it needs "
                             "pipeline_parallel > 1")
        if shape.n_layer % (p * self.virtual):
            raise ValueError(f"virtual_stages {self.virtual} × pipeline_parallel {p} does not divide the "
                             f"{shape.n_layer} layers; each model chunk takes layers/(p·v) of them")
        if self.virtual > 1 and m % p:
            raise ValueError(f"virtual_stages {self.virtual}: the interleaved schedule runs microbatches in groups "
                             f"of the {p} stages; microbatches {m} must be a multiple of {p}")
        if m > 1 and p == 1:
            raise ValueError(f"microbatches {m} without pipeline_parallel: microbatches feed pipeline stages; "
                             "pass pipeline_parallel > 1 too")
        if shape.batch % m:
            raise ValueError(f"microbatches {m} does not divide the batch {shape.batch}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero must be 1, 2 or 3 (0: off), got {self.zero!r}")
        if self.zero and self.data == 1:
            raise ValueError(f"zero {self.zero} shards over the data-parallel replicas: it needs data_parallel > 1")

    def describe(self) -> str:
        parts = [f"tensor parallel {self.tensor}" + (" + sequence parallel" if self.sequence else "")]
        if self.pipeline > 1:
            parts.append(f"pipeline {self.pipeline} stages, {self.microbatches} microbatches " + (
                f"(interleaved 1F1B, {self.virtual} model chunks a device)" if self.virtual > 1 else "(1F1B)"))
        if self.data > 1:
            parts.append(f"data parallel {self.data}" + (f", ZeRO-{self.zero}" if self.zero else ""))
        return "; ".join(parts)


# ---- collectives, as one device sees them -----------------------------------------------------------------
def _gather(x, parts: int):
    """[B, S, ...] -> [B, parts·S, ...]: the all-gather along the sequence (the local slice repeated)."""
    xp = backend.xp()
    return xp.broadcast_to(x[:, None], (x.shape[0], parts, *x.shape[1:])).reshape(
        x.shape[0], parts * x.shape[1], *x.shape[2:])


def _scatter_sum(g, parts: int):
    """[B, parts·S, ...] -> [B, S, ...]: the reduce-scatter along the sequence (t equal slices summed)."""
    return g.reshape(g.shape[0], parts, g.shape[1] // parts, *g.shape[2:]).sum(axis=1)


class GatherLinear(Function):
    """Sequence parallel into a column-parallel linear: out = gather(x) @ Wᵀ + b. Keeps only the local slice x
    ([B, T/t, d]) and gathers it again in backward (Korthikanti 2022, sec. 4.2.2); dL/dx is reduce-scattered."""

    op = "linear"

    @staticmethod
    def forward(ctx, x, weight, bias=None, parts=1):
        ctx.parts, ctx.has_bias = parts, bias is not None
        ctx.save(x=x, weight=weight)
        full = _gather(x, parts)
        rows, (n_out, n_in) = full.size // full.shape[-1], weight.shape
        ctx.flops = (2 * rows * n_in * n_out, 4 * rows * n_in * n_out)
        out = full @ weight.T
        if bias is not None:
            out += bias
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved["x"], ctx.saved["weight"]
        full = _gather(x, ctx.parts)
        gx = _scatter_sum(grad_out @ weight, ctx.parts)
        gw = grad_out.reshape(-1, grad_out.shape[-1]).T @ full.reshape(-1, full.shape[-1])
        gb = grad_out.reshape(-1, grad_out.shape[-1]).sum(axis=0) if ctx.has_bias else None
        return gx, gw, gb


class ReduceScatter(Function):
    """After a row-parallel linear under sequence parallelism: [B, T, d] partial sums -> [B, T/t, d]. Saves
    nothing; its backward all-gathers."""

    @staticmethod
    def forward(ctx, x, parts=1):
        ctx.parts = parts
        return _scatter_sum(x, parts)

    @staticmethod
    def backward(ctx, grad_out):
        return (_gather(grad_out, ctx.parts),)


class ScatterSequence(Function):
    """Into the sequence-parallel region: keep this device's [B, T/t, d] slice. Saves nothing; its backward
    all-gathers."""

    @staticmethod
    def forward(ctx, x, parts=1):
        ctx.parts = parts
        return x[:, : x.shape[1] // parts].copy()

    @staticmethod
    def backward(ctx, grad_out):
        return (_gather(grad_out, ctx.parts),)


# ---- the sharded modules ----------------------------------------------------------------------------------
class ColumnLinear(nn.Module):
    """Column-parallel: this device's out/t output features. Under sequence parallelism its input is the local
    sequence slice, gathered inside (GatherLinear)."""

    def __init__(self, d_in: int, d_out: int, par: Parallelism, bias: bool = True, weight=None):
        super().__init__()
        self.weight = weight if weight is not None else Parameter(
            nn._normal((d_out // par.tensor, d_in), 0.02, np.float32), name="weight")
        self.bias = Parameter(backend.xp().zeros(d_out // par.tensor, dtype=np.float32), name="bias") if bias \
            else None
        self.par = par

    def forward(self, x):
        if self.par.sequence:
            args = (x, self.weight) if self.bias is None else (x, self.weight, self.bias)
            return GatherLinear.apply(*args, parts=self.par.tensor)
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    """Row-parallel: multiplies this device's in/t input features; the partial sums are all-reduced (identity
    here: same shapes) or, under sequence parallelism, reduce-scattered to the local sequence slice."""

    def __init__(self, d_in: int, d_out: int, par: Parallelism):
        super().__init__()
        self.weight = Parameter(nn._normal((d_out, d_in // par.tensor), 0.02, np.float32), name="weight")
        self.bias = Parameter(backend.xp().zeros(d_out, dtype=np.float32), name="bias")
        self.par = par

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        return ReduceScatter.apply(out, parts=self.par.tensor) if self.par.sequence else out


class ShardedAttention(nn.Module):
    """Causal self-attention over this device's heads/t heads: "explicit" (the [B, H/t, T, T] weights kept) or
    "chunked" (FlashAttention's saves: q, k, v, the output and a log-sum-exp a row)."""

    def __init__(self, d_model: int, n_head: int, dropout: float, par: Parallelism, attention: str = "explicit"):
        super().__init__()
        self.attention = attention
        self.c_attn = ColumnLinear(d_model, 3 * d_model, par)
        self.c_proj = RowLinear(d_model, d_model, par)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads, self.head_dim, self.dropout = n_head // par.tensor, d_model // n_head, dropout

    def forward(self, x):
        qkv = self.c_attn(x)  # [B, T, 3·C/t] (T: the whole sequence, gathered under sequence parallelism)
        B, T, three_c = qkv.shape
        C, H, hd = three_c // 3, self.heads, self.head_dim
        q, k, v = qkv[:, :, :C], qkv[:, :, C:2 * C], qkv[:, :, 2 * C:]
        q = q.reshape(B, T, H, hd).transpose(1, 2)  # [B, H/t, T, hd]
        k = k.reshape(B, T, H, hd).transpose(1, 2)
        v = v.reshape(B, T, H, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training,
                                           impl=self.attention)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, T, C/t]
        return self.resid_dropout(self.c_proj(y))


class ShardedMLP(nn.Module):
    def __init__(self, d_model: int, dropout: float, par: Parallelism):
        super().__init__()
        self.c_fc = ColumnLinear(d_model, 4 * d_model, par)
        self.c_proj = RowLinear(4 * d_model, d_model, par)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class ShardedBlock(nn.Module):
    """nn.Block's math on one device: layer norms and residuals on [B, T, d] (or [B, T/t, d] under sequence
    parallelism), attention and MLP tensor-parallel."""

    def __init__(self, d_model: int, n_head: int, dropout: float, par: Parallelism, attention: str = "explicit"):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = ShardedAttention(d_model, n_head, dropout, par, attention)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = ShardedMLP(d_model, dropout, par)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class DeviceShard(nn.Module):
    """What device 0 holds and runs: the first pipeline stage (embeddings and blocks 0 .. L/p-1; with p = 1 also
    the final layer norm, the vocabulary-parallel lm_head tied to the embedding, and the loss), tensor-parallel
    over t. `model(idx, targets)` returns (output, loss): the stage's output and None when p > 1. With v virtual
    stages it holds v model chunks of L/(p·v) blocks (global chunks 0, p, 2p, ...): `model(idx)` runs the first
    from the tokens, `model.run_chunk(x, c)` chunk c from the activation the last stage sent. `attention`:
    "explicit" or "chunked" in every block."""

    def __init__(self, shape: GPTShape, par: Parallelism, checkpoint=None, attention: str = "explicit"):
        super().__init__()
        par.check(shape)
        d, V = shape.d_model, shape.vocab_size
        layers = shape.n_layer // par.pipeline
        self.transformer = nn.ModuleDict(
            transparent_scope=True,
            wte=nn.Embedding(V // par.tensor, d),  # vocabulary-parallel: V/t rows here
            wpe=nn.Embedding(shape.block_size, d),
            drop=nn.Dropout(shape.dropout),
            h=nn.ModuleList([ShardedBlock(d, shape.n_head, shape.dropout, par, attention) for _ in range(layers)]),
            ln_f=nn.LayerNorm(d),
        )
        if par.pipeline == 1:
            self.lm_head = ColumnLinear(d, V, par, bias=False, weight=self.transformer.wte.weight)
        self.shape, self.par, self.checkpoint = shape, par, checkpoint

    def forward(self, idx, targets=None):
        tr, t = self.transformer, self.par.tensor
        B, T = idx.shape
        x = tr.wte(idx) + tr.wpe(backend.xp().arange(T))  # [B, T, d] (the vocabulary-parallel sum is all-reduced)
        if self.par.sequence:
            x = ScatterSequence.apply(x, parts=t)  # [B, T/t, d]
        x = run_checkpointed(self.chunk_blocks(0), tr.drop(x), self.checkpoint)
        if self.par.pipeline > 1:
            return x, None
        logits = self.lm_head(tr.ln_f(x))  # [B, T, V/t]: this device's slice of the vocabulary
        # the vocabulary-parallel loss as one device computes it: targets are ids within this device's slice
        loss = F.cross_entropy(logits.reshape(B * T, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def chunk_blocks(self, chunk: int) -> list:
        """The blocks of this device's model chunk `chunk` (all of them when v = 1)."""
        n = len(self.transformer.h) // self.par.virtual
        return list(self.transformer.h)[chunk * n:(chunk + 1) * n]

    def run_chunk(self, x, chunk: int):
        """Model chunk `chunk` (> 0) from the activation x [B, T(/t), d] the previous stage sent: its output."""
        return run_checkpointed(self.chunk_blocks(chunk), x, self.checkpoint)

__all__ = ["Parallelism", "DeviceShard", "ShardedBlock", "GatherLinear", "ReduceScatter", "ScatterSequence"]
