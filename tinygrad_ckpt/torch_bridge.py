"""This engine's checkpoint plans applied to a PyTorch GPT (and Llama), and what PyTorch keeps for backward, measured.

    model = TorchGPT.from_engine(gpt)           # nanoGPT's modules, the engine GPT's weights and names
    model.checkpoint = "every_layer"             # the same switch as nn.GPT(checkpoint=...)
    step = measure_step(model, idx, targets)     # one forward + backward, what PyTorch kept measured
    step.peak, step.like_for_like()              # raw, and set beside the ledger term by term

Plans ("every_layer", "sqrt", k segments, a planner Plan) run their checkpointed segments with
`torch.utils.checkpoint.checkpoint(use_reentrant=False)`. A `Policy` (tg.save_matmuls,
tg.korthikanti_selective, ...) checkpoints every block with selective activation checkpointing
(`create_selective_checkpoint_contexts`): each aten op is given the engine's op kind (aten.addmm in a Linear
is "linear", aten.bmm is "matmul", aten.native_layer_norm "layer_norm", ...) and the scoped name it would have
in this engine ("transformer.h.3.attn.softmax"), and the engine's policy decides save or recompute.

`SavedBytes` counts what PyTorch holds for backward over the step, each storage once (by
untyped_storage().data_ptr(), nbytes), from when it is kept until autograd lets it go: tensors packed by
`torch.autograd.graph.saved_tensors_hooks` outside checkpointed segments; inside them, the tensors the replay
rebuilds (held from the replay until backward reads them) and the outputs selective checkpointing caches in
forward (held until the replay takes them). Parameters are not counted. This is the number to set beside the
ledger's activation bytes.

Nothing else in the package imports this module; it needs the optional extra `pip install -e ".[torch]"`.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, is_traceable_wrapper_subclass

try:  # tensor parallelism's sharded tensors (SavedBytes counts a DTensor's local shard)
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    DTensor = type("DTensor", (), {})

from . import planner
from .estimate import llama_ffn_hidden
from .events import layer_of
from .policies import Policy

aten = torch.ops.aten


# ---- a nanoGPT in PyTorch, named and shaped as this engine's nn.GPT -----------------------------------------
class CausalSelfAttention(torch.nn.Module):
    """As nn.CausalSelfAttention: fused c_attn, explicit q kᵀ·scale, causal masked_fill, softmax, dropout
    called directly in this module (so its ops are "transformer.h.i.attn.dropout", the attention core), @ v."""

    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.c_attn = torch.nn.Linear(d_model, 3 * d_model)
        self.c_proj = torch.nn.Linear(d_model, d_model)
        self.resid_dropout = torch.nn.Dropout(dropout)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))  # [B, H, T, T]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
        att = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        att = F.dropout(att, self.dropout, self.training)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)  # [B, T, C]
        return self.resid_dropout(self.c_proj(y))


class MLP(torch.nn.Module):
    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        self.c_fc = torch.nn.Linear(d_model, 4 * d_model)
        self.c_proj = torch.nn.Linear(4 * d_model, d_model)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class _OutputSavingLayerNorm(torch.autograd.Function):
    """PyTorch's layer norm with the engine's saves: its output (the next linear keeps it anyway) and 1/std, x̂
    recovered as (out - b)/w in backward (Apex's "memory efficient" layer norm keeps the same), so a plan's
    saved bytes compare like for like. Columns whose weight is exactly 0 keep x̂ itself."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        out, _, rstd = aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
        zero = (weight == 0).nonzero().flatten()
        kept = ((x[..., zero] - x.mean(-1, keepdim=True)) * rstd,) if zero.numel() else ()
        ctx.zero = zero
        ctx.save_for_backward(out, rstd, weight, bias, *kept)
        return out

    @staticmethod
    def backward(ctx, g):
        out, rstd, weight, bias, *kept = ctx.saved_tensors
        xhat = (out - bias) / torch.where(weight == 0, torch.ones_like(weight), weight)
        if kept:
            xhat[..., ctx.zero] = kept[0]
        gw = (g * xhat).sum(dim=tuple(range(g.dim() - 1)))
        gb = g.sum(dim=tuple(range(g.dim() - 1)))
        ghat = g * weight
        gx = rstd * (ghat - ghat.mean(-1, keepdim=True) - xhat * (ghat * xhat).mean(-1, keepdim=True))
        return gx, gw, gb, None


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm that keeps its output and 1/std for backward, not its input (as nn.LayerNorm here)."""

    def forward(self, x):
        return _OutputSavingLayerNorm.apply(x, self.weight, self.bias, self.eps)


_NORMS = {"engine": LayerNorm, "pytorch": torch.nn.LayerNorm}  # TorchGPT(saves=...)


class Block(torch.nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float, saves: str = "engine"):
        super().__init__()
        norm = _NORMS[saves]
        self.ln_1 = norm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln_2 = norm(d_model)
        self.mlp = MLP(d_model, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _EngineWeights:
    """Weights from and to an engine state_dict ({name: NumPy array}): the names are the same."""

    def load_engine_state(self, state: dict) -> None:
        """Copy an engine state_dict into this model (every name must be there, and no other)."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        if missing:
            raise KeyError(f"{type(self).__name__}.load_engine_state: missing {missing}")
        with torch.no_grad():
            for name, value in state.items():
                if name not in own:
                    raise KeyError(f"{type(self).__name__}.load_engine_state: unexpected key {name!r}")
                own[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))

    def engine_state(self) -> dict:
        """{name: NumPy array}: loads into the engine's model with load_state_dict."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


class TorchGPT(_EngineWeights, torch.nn.Module):
    """nanoGPT (learned positions, tied lm_head, exact GELU) with the parameter names of nn.GPT's state_dict.
    `checkpoint`: None, "every_layer", "sqrt", a number of segments, a planner Plan or a Policy (see
    `run_blocks`). `saves`: "engine" (its layer norms keep what the engine's keep, as Apex's memory-efficient
    layer norm: a plan's bytes compare like for like) or "pytorch" (torch.nn.LayerNorm, PyTorch's own: compare
    with the engine under tg.saves_like("pytorch"))."""

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 dropout: float = 0.0, checkpoint=None, saves: str = "engine"):
        super().__init__()
        if saves not in _NORMS:
            raise ValueError(f"TorchGPT: saves must be 'engine' or 'pytorch', got {saves!r}")
        self.transformer = torch.nn.ModuleDict(dict(
            wte=torch.nn.Embedding(vocab_size, d_model),
            wpe=torch.nn.Embedding(block_size, d_model),
            drop=torch.nn.Dropout(dropout),
            h=torch.nn.ModuleList([Block(d_model, n_head, dropout, saves) for _ in range(n_layer)]),
            ln_f=_NORMS[saves](d_model),
        ))
        self.lm_head = torch.nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT
        self.checkpoint = checkpoint
        for name, module in self.named_modules():  # each module's scoped name, as the engine names its ops
            module.scope = name  # "transformer.h.3.attn", as the engine names the ops a module runs

    @classmethod
    def from_engine(cls, gpt, checkpoint=None, saves: str = "engine") -> TorchGPT:
        """A TorchGPT with the shapes, dropout and (copied) weights of an engine nn.GPT."""
        wte, wpe = gpt.transformer.wte.weight, gpt.transformer.wpe.weight
        block = gpt.transformer.h[0]
        model = cls(wte.shape[0], wpe.shape[0], len(gpt.transformer.h), block.attn.n_heads, wte.shape[1],
                    dropout=block.attn.dropout, checkpoint=checkpoint, saves=saves)
        model.load_engine_state(gpt.state_dict())
        return model

    def forward(self, idx, targets=None):
        B, T = idx.shape
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device)))
        x = tr.ln_f(run_blocks(list(tr.h), x, self.checkpoint))
        logits = self.lm_head(x)
        loss = None if targets is None else F.cross_entropy(logits.view(B * T, -1), targets.view(-1))
        return logits, loss


# ---- a Llama / Mixtral in PyTorch, named and shaped as this engine's nn.Llama -----------------------------------
# Written from the published architecture (Hugging Face's modeling_llama / modeling_mixtral read for the facts:
# rotate_half on the two halves, grouped key/value heads repeated per query head, softmax -> top-k -> renormalise,
# experts in expert order added into zeros, the load-balancing loss), in the input dtype throughout (Hugging Face
# computes RMSNorm and the router softmax in float32), so float64 runs compare to 1e-10.
class TorchRMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchLlamaAttention(torch.nn.Module):
    def __init__(self, d_model: int, n_head: int, n_kv_head: int, dropout: float):
        super().__init__()
        hd = d_model // n_head
        self.q_proj = torch.nn.Linear(d_model, n_head * hd, bias=False)
        self.k_proj = torch.nn.Linear(d_model, n_kv_head * hd, bias=False)
        self.v_proj = torch.nn.Linear(d_model, n_kv_head * hd, bias=False)
        self.o_proj = torch.nn.Linear(n_head * hd, d_model, bias=False)
        self.n_head, self.n_kv_head, self.head_dim, self.dropout = n_head, n_kv_head, hd, dropout

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, Hkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).view(B, T, H, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, Hkv, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, Hkv, hd).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)  # head h uses h // G
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
        att = F.dropout(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1), self.dropout, self.training)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, H * hd))


class TorchSwiGLU(torch.nn.Module):
    """down(silu(gate(x)) * up(x)) under the engine's names: (gate_proj, up_proj, down_proj) for a dense MLP,
    (w1, w3, w2) for an expert."""

    def __init__(self, d_model: int, ffn_hidden: int, names=("gate_proj", "up_proj", "down_proj")):
        super().__init__()
        self.names = names
        for name, (n_in, n_out) in zip(names, ((d_model, ffn_hidden), (d_model, ffn_hidden), (ffn_hidden, d_model))):
            setattr(self, name, torch.nn.Linear(n_in, n_out, bias=False))

    def forward(self, x):
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(F.silu(gate(x)) * up(x))


class TorchSparseMoe(torch.nn.Module):
    def __init__(self, d_model: int, ffn_hidden: int, n_experts: int, k: int):
        super().__init__()
        self.gate = torch.nn.Linear(d_model, n_experts, bias=False)
        self.experts = torch.nn.ModuleList([TorchSwiGLU(d_model, ffn_hidden, ("w1", "w3", "w2"))
                                            for _ in range(n_experts)])
        self.k = k

    def forward(self, x):
        B, T, d = x.shape
        rows = x.reshape(B * T, d)
        logits = self.gate(rows)
        weights, chosen = torch.topk(F.softmax(logits, dim=-1), self.k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(rows)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel():
                out = out.index_add(0, token, expert(rows[token]) * weights[token, slot, None])
        return out.reshape(B, T, d), logits


class TorchLlamaLayer(torch.nn.Module):
    def __init__(self, d_model, n_head, n_kv_head, ffn_hidden, norm_eps, n_experts, k, dropout, owner):
        super().__init__()
        self.self_attn = TorchLlamaAttention(d_model, n_head, n_kv_head, dropout)
        self.input_layernorm = TorchRMSNorm(d_model, norm_eps)
        self.post_attention_layernorm = TorchRMSNorm(d_model, norm_eps)
        if n_experts:
            self.block_sparse_moe = TorchSparseMoe(d_model, ffn_hidden, n_experts, k)
        else:
            self.mlp = TorchSwiGLU(d_model, ffn_hidden)
        object.__setattr__(self, "owner", owner)  # the TorchLlama: its rotary table and router-logit list

    def forward(self, x):
        cos, sin = self.owner.cos_sin(x.shape[1])
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        if hasattr(self, "mlp"):
            return h + self.mlp(self.post_attention_layernorm(h))
        out, logits = self.block_sparse_moe(self.post_attention_layernorm(h))
        if self.owner.collecting is not None:  # the first forward only (a checkpoint's replay runs in backward)
            self.owner.collecting.append(logits)
        return h + out


class TorchLlama(_EngineWeights, torch.nn.Module):
    """nn.Llama in PyTorch with the same parameter names (Hugging Face's): dense, grouped-query and MoE blocks, the
    lm_head tied or not, the load-balancing loss when `output_router_logits` (added to the loss times
    `router_aux_loss_coef`, and kept in `aux_loss`). `checkpoint` as TorchGPT's."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, d_model, n_kv_head=None, ffn_hidden=None,
                 rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=False, n_experts=0, experts_per_token=2,
                 dropout=0.0, checkpoint=None):
        super().__init__()
        n_kv_head = n_kv_head or n_head
        ffn_hidden = ffn_hidden or llama_ffn_hidden(d_model)
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab_size, d_model)
        self.model.layers = torch.nn.ModuleList([
            TorchLlamaLayer(d_model, n_head, n_kv_head, ffn_hidden, norm_eps, n_experts, experts_per_token, dropout,
                            self) for _ in range(n_layer)])
        self.model.norm = TorchRMSNorm(d_model, norm_eps)
        self.lm_head = torch.nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        hd = d_model // n_head
        inv_freq = 1.0 / rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
        angles = np.outer(np.arange(block_size, dtype=np.float64), inv_freq)
        angles = np.concatenate([angles, angles], axis=-1)
        self.register_buffer("cos_table", torch.from_numpy(np.cos(angles)).float(), persistent=False)
        self.register_buffer("sin_table", torch.from_numpy(np.sin(angles)).float(), persistent=False)
        self._angles = angles  # float64: the tables are rounded from these to the parameters' dtype
        self.checkpoint, self.n_experts, self.k = checkpoint, n_experts, experts_per_token
        self.output_router_logits, self.router_aux_loss_coef, self.aux_loss = False, 0.001, None
        self.collecting = None
        for name, module in self.named_modules():
            module.scope = name

    @classmethod
    def from_engine(cls, llama, checkpoint=None) -> TorchLlama:
        """A TorchLlama with the shapes, settings and (copied) weights of an engine nn.Llama, in its dtype."""
        layer = llama.model.layers[0]
        attn = layer.self_attn
        moe = layer._modules.get("block_sparse_moe")
        ffn = (moe.experts[0].w1 if moe is not None else layer.mlp.gate_proj).weight.shape[0]
        model = cls(llama.vocab_size, llama.block_size, len(llama.model.layers), attn.n_head, attn.d_model,
                    attn.n_kv_head, ffn, llama.model.rotary_emb.base, llama.model.norm.eps,
                    llama.lm_head.weight is llama.model.embed_tokens.weight, llama.n_experts,
                    llama.experts_per_token, attn.dropout, checkpoint)
        model.to(torch.from_numpy(np.zeros(0, llama.lm_head.weight.dtype)).dtype)
        model.load_engine_state(llama.state_dict())
        model.output_router_logits, model.router_aux_loss_coef = llama.output_router_logits, llama.router_aux_loss_coef
        return model

    def cos_sin(self, t: int):
        dtype = self.lm_head.weight.dtype
        if self.cos_table.dtype != dtype:  # rounded once from float64, as the engine's table
            self.cos_table = torch.from_numpy(np.cos(self._angles)).to(dtype)
            self.sin_table = torch.from_numpy(np.sin(self._angles)).to(dtype)
        return self.cos_table[:t], self.sin_table[:t]

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.model.embed_tokens(idx)
        self.collecting = [] if self.n_experts and self.output_router_logits else None
        try:
            x = self.model.norm(run_blocks(list(self.model.layers), x, self.checkpoint))
            router_logits, self.collecting = self.collecting, None
        finally:
            self.collecting = None
        logits = self.lm_head(x)
        self.aux_loss = None if router_logits is None else load_balancing_loss(router_logits, self.n_experts, self.k)
        loss = None if targets is None else F.cross_entropy(logits.view(B * T, -1), targets.view(-1))
        if loss is not None and self.aux_loss is not None:
            loss = loss + self.router_aux_loss_coef * self.aux_loss
        return logits, loss


def load_balancing_loss(router_logits: list, n_experts: int, k: int):
    """Mixtral's auxiliary loss (Switch Transformer eqs. 4-6, as Hugging Face's load_balancing_loss_func without an
    attention mask): over every layer's tokens at once, E·Σ_e (share of the top-k choices that went to e)·(mean
    router probability of e)."""
    probabilities = F.softmax(torch.cat(router_logits, dim=0), dim=-1)
    _, chosen = torch.topk(probabilities, k, dim=-1)
    choices = F.one_hot(chosen, n_experts).to(probabilities.dtype)  # [L·N, k, E]
    return n_experts * (choices.mean(dim=0) * probabilities.mean(dim=0)[None]).sum()


# ---- plans and policies ---------------------------------------------------------------------------------
def run_blocks(blocks, x, spec):
    """Run `blocks` over x as the engine's GPT(checkpoint=spec) would: None (plainly), "every_layer", "sqrt",
    an int k (k segments), a planner Plan (nested plans nest checkpoints) or a Policy (every block
    checkpointed with selective activation checkpointing deciding op by op), through planner.Plan.run."""
    n = len(blocks)
    if spec is None:
        return planner.no_checkpoint_plan(n).run(blocks, x, None)
    if isinstance(spec, Policy):
        return planner.every_layer_plan(n).run(blocks, x, lambda chunk, x: torch_checkpoint.checkpoint(
            _Region(chunk), x, use_reentrant=False, context_fn=lambda: selective_contexts(spec)))
    plan = planner.plan_for(n, spec, owner="TorchGPT")
    return plan.run(blocks, x, lambda chunk, x: torch_checkpoint.checkpoint(_Region(chunk), x, use_reentrant=False))


class _Region:
    """The function a torch checkpoint runs: blocks (by an inner plan, if any). Its first call is the forward;
    later calls are replays. While a `SavedBytes` meter is active it reports what the region keeps."""

    def __init__(self, chunk: planner.Chunk):
        self.chunk, self.calls = chunk, 0

    def __call__(self, x):
        replay, self.calls = self.calls > 0, self.calls + 1
        meter = SavedBytes.active
        if meter is None:
            return self._run(x)
        if not replay:  # what selective checkpointing caches here and no replay takes back goes with the region
            self.cached, self.regenerated = [], []
            weakref.finalize(self, meter.release_all, self.cached)
            weakref.finalize(self, meter.release_all, self.regenerated)
        else:  # the replay draws the dropout noise again: the masks counted in its place are done
            meter.release_all(self.regenerated)
        outer, meter.region = meter.region, self
        try:
            with meter.inside_region(replay):
                return self._run(x)
        finally:
            meter.region = outer

    def _run(self, x):
        return self.chunk(x)


# aten op -> the engine's op kind (inside a Linear module, a matrix product is "linear")
_KINDS = {
    aten.addmm.default: "matmul", aten.mm.default: "matmul", aten.bmm.default: "matmul",
    aten.native_layer_norm.default: "layer_norm", aten.gelu.default: "gelu", aten._softmax.default: "softmax",
    aten.masked_fill.Scalar: "masked_fill", aten.add.Tensor: "add", aten.mul.Tensor: "mul",
    aten.native_dropout.default: "dropout", aten.bernoulli_.float: "dropout", aten.div_.Scalar: "dropout",
    aten.empty_like.default: "dropout", aten.embedding.default: "embedding",
}
_ALIASES = {aten.view.default, aten._unsafe_view.default, aten.transpose.int, aten.t.default, aten.split.Tensor,
            aten.expand.default, aten.slice.Tensor, aten.permute.default, aten.split_with_sizes.default}
_VIEW_KINDS = _ALIASES | {aten.clone.default, aten.reshape.default}  # the engine's reshape may copy, as clone


_LINEARS = {"lm_head", "gate", "w1", "w2", "w3"}  # with c_* (nanoGPT) and *_proj (Llama): the Linear modules' names


def engine_op(op, scope: str) -> tuple[str, str]:
    """(op kind, scoped name) of an aten op as this engine names it: aten.addmm in "transformer.h.0.attn.c_attn"
    is ("linear", "transformer.h.0.attn.c_attn.linear"); aten.bmm in "transformer.h.0.attn" is ("matmul",
    "transformer.h.0.attn.matmul"); a view or
    a copy for a view is "reshape"; inside a Dropout module everything is "dropout"."""
    last = scope.rsplit(".", 1)[-1]
    if op in _VIEW_KINDS:
        kind = "reshape"
    elif last in ("drop", "dropout", "resid_dropout") and op in _KINDS:
        kind = "dropout"
    else:
        kind = _KINDS.get(op, str(op.overloadpacket.__name__))
        if kind == "matmul" and (last.startswith("c_") or last.endswith("_proj") or last in _LINEARS):
            kind = "linear"
    return kind, f"{scope}.{kind}" if scope else kind


def _current_scope() -> str:
    return _SCOPE[-1] if _SCOPE else ""


_SCOPE: list[str] = []  # the scoped names of the modules running now (kept by SavedBytes' module hooks)


def selective_contexts(policy: Policy):
    """create_selective_checkpoint_contexts with the engine's policy deciding each aten op (by its engine op
    kind and scoped name; views are recomputed), plus, under a SavedBytes meter, an observer that counts what
    the cache keeps."""
    def decide(ctx, op, *args, **kwargs):
        kind, name = engine_op(op, _current_scope())
        mutable = op.overloadpacket.__name__.endswith("_") or op is aten.empty_like.default  # dropout's noise
        save = kind != "reshape" and not mutable and policy.decide(kind, name).save
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE if save else \
            torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

    forward, recompute = torch_checkpoint.create_selective_checkpoint_contexts(decide)
    meter = SavedBytes.active
    if meter is None:
        return forward, recompute
    return (_Both(forward, _CacheObserver(meter, decide, False, policy)),
            _Both(recompute, _CacheObserver(meter, decide, True, policy)))


class _Both:
    """Enter two context managers, the first outermost."""

    def __init__(self, outer, inner):
        self.outer, self.inner = outer, inner

    def __enter__(self):
        self.outer.__enter__()
        self.inner.__enter__()

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        return self.outer.__exit__(*exc)


class _CacheObserver(TorchDispatchMode):
    """Runs above selective checkpointing's caching mode: in forward, the outputs of the ops it caches are
    held (until the replay); in the replay they are handed back (no longer held by the cache)."""

    def __init__(self, meter: SavedBytes, decide, replay: bool, policy: Policy):
        super().__init__()
        self.meter, self.decide, self.replay, self.policy = meter, decide, replay, policy

    def keeps_dropout(self) -> bool:
        return self.policy.decide(*engine_op(aten.native_dropout.default, _current_scope())).save

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        cached = self.decide(None, func) == torch_checkpoint.CheckpointPolicy.MUST_SAVE
        if cached:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    if self.replay:
                        self.meter.release_tensor(t, "cached")
                    else:
                        self.meter.region.cached.append(self.meter.hold(t, "cached"))
        elif not self.replay and func is aten.bernoulli_.float and self.keeps_dropout():
            # dropout noise for a dropout the policy keeps: an in-place random op cannot be cached, so PyTorch
            # regenerates it in the replay; the engine keeps it as a 1-byte mask (counted per holder only)
            self.meter.region.regenerated.append(self.meter.hold_mask(args[0]))
        elif not self.replay and func not in _ALIASES and func is not aten.empty_like.default:
            # an op the replay will run again reads its inputs (a view or empty_like reads no data); noted in forward,
            # while every cached storage is alive and its address its own
            for a in (*args, *(kwargs or {}).values()):
                if isinstance(a, torch.Tensor):
                    self.meter.read(a.untyped_storage().data_ptr())
        return out


# ---- the meter --------------------------------------------------------------------------------------------
@dataclass
class Kept:
    """One storage PyTorch kept for backward: where (scoped module name), its dtype, shape, bytes, and how
    (saved: by an autograd node outside checkpoints; recomputed: by a checkpoint replay; cached: by selective
    checkpointing, from forward to the replay)."""

    scope: str
    dtype: str
    shape: tuple
    nbytes: int
    how: str
    requires_grad: bool
    ptr: int = 0
    noise: bool = False  # a dropout noise mask: floats that need no grad, each 0 or the same 1/(1-p)
    needed: bool = False  # an autograd node kept it or a replayed op read it (else: cached for nothing)

    @property
    def layer(self) -> str:
        """The layer of the module that kept it, as the ledger names layers ("transformer.h.3"; "" outside any)."""
        return layer_of(f"{self.scope}.op") if self.scope else ""  # the path of a module: its ops' layer


@dataclass
class SavedBytes:
    """Live bytes kept for backward, each storage counted once while any holder keeps it, and their peak.

    A second count, `with_masks`, adds what the engine keeps where PyTorch keeps nothing: where selective
    checkpointing regenerates the noise of a dropout the policy keeps (an in-place random op cannot be cached),
    the engine keeps a mask of 1 bit per element (hold_mask). Each count notes what was live at its peak."""

    exclude: set = field(default_factory=set)  # storage pointers not to count (the parameters)
    live: int = 0
    peak: int = 0
    at_peak: list = field(default_factory=list)  # Kept records live at the peak
    live_with_masks: int = 0
    peak_with_masks: int = 0
    at_peak_with_masks: list = field(default_factory=list)  # Kept records live at that peak
    after_forward: int = 0
    kept: list = field(default_factory=list)  # Kept, one per storage each time it starts being held
    _refs: dict = field(default_factory=lambda: defaultdict(int))  # (ptr, how) -> holders
    _live: dict = field(default_factory=dict)  # ptr -> Kept
    _live_with_masks: dict = field(default_factory=dict)  # ptr (a mask: a negative number) -> Kept
    _masks: int = 0  # masks counted in PyTorch's place (hold_mask)

    region: object = None  # the checkpointed region running now
    active = None  # class attribute: the meter measuring now (one at a time)

    def hold(self, t: torch.Tensor, how: str) -> tuple | None:
        """Count t's storage as kept by one more holder of kind `how`; returns the key to release it with."""
        storage = _local(t).untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self.exclude or nbytes == 0:
            return None
        if how == "saved":
            self.read(ptr)  # an autograd node keeps it: backward reads it
        if ptr not in self._live:
            record = Kept(_current_scope(), str(t.dtype).removeprefix("torch."), tuple(_local(t).shape), nbytes, how,
                          t.requires_grad, ptr, _is_noise(_local(t)), needed=how != "cached")
            self._live[ptr] = record
            self.kept.append(record)
            self.live += nbytes
            if self.live > self.peak:
                self.peak, self.at_peak = self.live, list(self._live.values())
            self._count_with_masks(record)
        self._refs[ptr, how] += 1
        return ptr, how

    def hold_mask(self, noise: torch.Tensor) -> tuple:
        """Count, in `with_masks` only, the 1-bit-per-element mask the engine keeps where PyTorch regenerates
        `noise` in the replay; returns the key to release it with."""
        self._masks += 1
        key = (-self._masks, "regenerated")
        record = Kept(_current_scope(), "bits", tuple(noise.shape), -(-noise.numel() // 8), "regenerated", False,
                      key[0])
        self._refs[key] += 1
        self._count_with_masks(record)
        return key

    def _count_with_masks(self, record: Kept) -> None:
        self._live_with_masks[record.ptr] = record
        self.live_with_masks += record.nbytes
        if self.live_with_masks > self.peak_with_masks:
            self.peak_with_masks, self.at_peak_with_masks = self.live_with_masks, list(self._live_with_masks.values())

    def read(self, ptr: int) -> None:
        """The storage at ptr is needed in backward (kept by a node, or read by a replayed op)."""
        if ptr in self._live:
            self._live[ptr].needed = True

    def release(self, key: tuple | None) -> None:
        if key is None:
            return
        self._refs[key] -= 1
        if self._refs[key]:
            return
        del self._refs[key]
        ptr = key[0]
        if key[1] == "regenerated":
            self.live_with_masks -= self._live_with_masks.pop(ptr).nbytes
            return
        if not any((ptr, how) in self._refs for how in ("saved", "recomputed", "cached")):
            self.live -= self._live.pop(ptr).nbytes
            self.live_with_masks -= self._live_with_masks.pop(ptr).nbytes

    def release_tensor(self, t: torch.Tensor, how: str) -> None:
        """The cache handed t back to a replay: no longer held by it."""
        key = _local(t).untyped_storage().data_ptr(), how
        if key in self._refs and key in self.region.cached:
            self.region.cached.remove(key)
            self.release(key)

    def release_all(self, keys: list) -> None:
        """A checkpointed region is gone: what its cache still held (its replay stopped early) goes with it."""
        for key in keys:
            self.release(key)
        keys.clear()

    def by_module(self, depth: int | None = None) -> dict:
        """{module path: bytes} of every storage kept for backward over the step, each counted once each time it
        starts being held (a replay's storages again), under the module that held it first ("" outside any):
        the counterpart of the ledger's saved_breakdown(by="module"). `depth` cuts paths to that many parts."""
        out: dict[str, int] = {}
        for k in self.kept:
            key = ".".join(k.scope.split(".")[:depth]) if depth else k.scope
            out[key] = out.get(key, 0) + k.nbytes
        return out

    def by_layer(self) -> dict:
        """{layer: bytes} as by_module, per layer as the ledger's saved_breakdown(by="layer") names them
        ("transformer.h.3", "model.layers.0", "transformer.ln_f"; events.layer_of)."""
        out: dict[str, int] = {}
        for k in self.kept:
            out[k.layer] = out.get(k.layer, 0) + k.nbytes
        return out

    # saved-tensor hooks: outside regions the packed tensor is held by its slot; inside a region's forward the
    # checkpoint's hook below drops it (the slot learns at unpack which replayed tensor it stood for); inside a
    # replay the tensor is held until the forward's slot for it is read and let go
    def _pack(self, x):
        return _Slot(self, x, self.hold(x, "saved"))

    def inside_region(self, replay: bool):
        below = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if below is None:
            raise RuntimeError("SavedBytes: a checkpointed region runs without the checkpoint's saved-tensor hooks")
        pack_below, unpack_below = below

        def pack(x):
            packed = pack_below(x)
            if replay:
                return _Slot(self, packed, self.hold(x, "recomputed"), owns=False)
            self.read(_local(x).untyped_storage().data_ptr())  # a node keeps it: a cached storage is needed
            return _Slot(self, packed, None, below=unpack_below)

        return torch.autograd.graph.saved_tensors_hooks(pack, _Slot.unpack)

    def __enter__(self):
        if SavedBytes.active is not None:
            raise RuntimeError("SavedBytes: one meter at a time")
        SavedBytes.active = self
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _Slot.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        SavedBytes.active = None

def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds t's data on this process: a DTensor's local shard (and the tensor inside any
    other wrapper, such as a collective's AsyncCollectiveTensor), else t."""
    while is_traceable_wrapper_subclass(t):
        t = getattr(t, t.__tensor_flatten__()[0][0])
    return t


def _is_noise(t: torch.Tensor) -> bool:
    """Is t a dropout noise mask as CPU dropout makes it (floats needing no grad, each 0 or 1/(1-p))?"""
    if t.requires_grad or not t.is_floating_point() or t.dim() < 2 or t.numel() == 0:
        return False
    with torch.no_grad(), _disable_current_modes():  # not seen by selective checkpointing's modes
        top = t.max()
        return bool(top > 1) and bool(((t == 0) | (t == top)).all())


class _Slot:
    """What a saved-tensor hook hands autograd: the packed value and the pointer it keeps counted; when autograd
    lets the slot go, the count drops."""

    __slots__ = ("packed", "cell", "below", "__weakref__")

    def __init__(self, meter: SavedBytes, packed, ptr, owns: bool = True, below=None):
        self.packed, self.below = packed, below
        self.cell = [ptr if owns else None]
        weakref.finalize(self, _release_cell, meter, self.cell)

    @staticmethod
    def unpack(slot):
        if slot.below is None:
            return slot.packed
        t = slot.below(slot.packed)  # a replayed tensor, held since the replay: let go with this slot
        if slot.cell[0] is None:
            key = _local(t).untyped_storage().data_ptr(), "recomputed"
            meter = SavedBytes.active
            if meter is not None and key in meter._refs:
                slot.cell[0] = key
        return t


def _release_cell(meter: SavedBytes, cell: list) -> None:
    meter.release(cell[0])
    cell[0] = None


def _module_hooks(model: torch.nn.Module) -> list:
    """Forward pre/post hooks keeping _SCOPE, the scoped names of the modules running (replays included)."""
    handles = []
    for module in model.modules():
        scope = getattr(module, "scope", None)
        if scope is None or isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict) or module is model:
            continue
        handles.append(module.register_forward_pre_hook(lambda m, a, s=scope: _SCOPE.append(s) and None))
        handles.append(module.register_forward_hook(lambda m, a, o: _SCOPE.pop() and None, always_call=True))
    return handles


# ---- one measured step ----------------------------------------------------------------------------------
@dataclass
class TorchStep:
    """What one PyTorch forward + backward kept: the meter (peak, live after forward, every storage kept),
    the loss and the seconds the step took."""

    meter: SavedBytes
    loss: float
    seconds: float

    @property
    def peak(self) -> int:
        return self.meter.peak

    @property
    def after_forward(self) -> int:
        return self.meter.after_forward

    def like_for_like(self, masks: str = "bits") -> dict:
        """PyTorch's peak made comparable with the engine's, term by term, each term measured at the peak of
        the `with_masks` count: {"peak": distinct storages, "with_masks": ..., "regenerated": the 1-bit masks
        counted where selective checkpointing regenerates dropout noise the engine's policy keeps,
        "dead_cache": bytes selective checkpointing cached that no autograd node kept and no replayed op read
        (outputs backward never needs, such as a Linear's before a residual add), "noise": float dropout noise
        (CPU dropout keeps it at the value dtype, see _is_noise), "noise_masks": the same noise as the engine
        keeps it: masks of 1 bit per element (masks="bits", the engine's own saves) or of 1 byte (masks="bytes",
        PyTorch's CUDA dropout: the engine under saves_like("pytorch")), and "comparable": with_masks -
        dead_cache - noise + noise_masks}."""
        if masks not in ("bits", "bytes"):
            raise ValueError(f"like_for_like: masks must be 'bits' or 'bytes', got {masks!r}")
        records = self.meter.at_peak_with_masks
        noise = [k for k in records if k.noise]
        per_mask = (lambda n: -(-n // 8)) if masks == "bits" else (lambda n: n)
        out = {"peak": self.meter.peak, "with_masks": self.meter.peak_with_masks,
               "regenerated": sum(k.nbytes for k in records if k.how == "regenerated"),
               "dead_cache": sum(k.nbytes for k in records if k.how == "cached" and not k.needed),
               "noise": sum(k.nbytes for k in noise),
               "noise_masks": sum(per_mask(math.prod(k.shape)) for k in noise)}
        out["comparable"] = out["with_masks"] - out["dead_cache"] - out["noise"] + out["noise_masks"]
        return out


def measure_step(model: TorchGPT, idx, targets, seed: int = 0) -> TorchStep:
    """One forward and backward of `model` (its .checkpoint as set), measured by SavedBytes; gradients land
    in the parameters' .grad."""
    import time

    idx, targets = (torch.as_tensor(np.asarray(a)) for a in (idx, targets))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    handles = _module_hooks(model)
    gc.collect()
    gc.disable()  # slots are let go by reference counting, at the moment autograd drops them: not at gc's whim
    try:
        t0 = time.perf_counter()
        with SavedBytes(exclude=params) as meter:
            _, loss = model(idx, targets)
            meter.after_forward = meter.live
            loss.backward()
        seconds = time.perf_counter() - t0
    finally:
        gc.enable()
        for h in handles:
            h.remove()
        _SCOPE.clear()
    return TorchStep(meter, loss.item(), seconds)


__all__ = ["TorchGPT", "TorchLlama", "load_balancing_loss", "run_blocks", "engine_op", "selective_contexts",
           "SavedBytes", "Kept", "TorchStep", "measure_step"]


def __getattr__(name):  # the engine's plans on any torch.nn.Module live in torch_plans (it imports this module)
    if name in ("apply_plan", "remove_plan", "measure", "comparison_table", "find_blocks"):
        from . import torch_plans
        return getattr(torch_plans, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
