"""This engine's checkpoint plans applied to a PyTorch GPT (and Llama), and what PyTorch keeps for backward, measured.

    model = TorchGPT.from_engine(gpt)           # nanoGPT's modules, the engine GPT's weights and names
    model.checkpoint = "every_layer"             # the same switch as nn.GPT(checkpoint=...)
    step = measure_step(model, idx, targets)     # one forward + backward, what PyTorch kept measured
    step.peak, step.like_for_like()              # raw, and set beside the ledger term by term

Plans and policies run as torch_saves runs them (checkpoint(use_reentrant=False), selective checkpointing with
the engine's op kinds and scoped names), and SavedBytes (torch_saves) measures what PyTorch keeps. The same
plans on any other torch.nn.Module: apply_plan / remove_plan (torch_plans, re-exported here).

Nothing else in the package imports this module; it needs the optional extra `pip install -e ".[torch]"`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..nn import llama_ffn_hidden
from .plans import apply_plan, comparison_table, find_blocks, measure, remove_plan  # any nn.Module
from .saves import Kept, SavedBytes, TorchStep, engine_op, measure_step, run_blocks, selective_contexts

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


@torch.library.custom_op("tinygrad_ckpt::layer_norm", mutates_args=())
def output_saving_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                             eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PyTorch's layer norm with the engine's saves, one op: (out, 1/std, x̂ of the columns whose weight is exactly
    0). Autograd keeps its output (the next linear keeps it anyway) and 1/std, x̂ recovered as (out - b)/w in
    backward (Apex's "memory efficient" layer norm keeps the same), so a plan's saved bytes compare like for like;
    the zero-weight columns keep x̂ itself."""
    out, mean, rstd = aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    zero = (weight == 0).nonzero().flatten()
    return out, rstd, (x[..., zero] - mean) * rstd


@output_saving_layer_norm.register_fake
def _(x, weight, bias, eps):
    zero = torch.library.get_ctx().new_dynamic_size()
    return torch.empty_like(x), x.new_empty(x.shape[:-1] + (1,)), x.new_empty(x.shape[:-1] + (zero,))


def _layer_norm_keep(ctx, inputs, output):
    _, weight, bias, _ = inputs
    out, rstd, kept = output
    ctx.save_for_backward(out, rstd, weight, bias, *((kept,) if kept.shape[-1] else ()))


def _layer_norm_backward(ctx, g, _g_rstd, _g_kept):
    """dL/dw = Σ g·x̂, dL/db = Σ g, dL/dx = rstd·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) with ĝ = g·w."""
    out, rstd, weight, bias, *kept = ctx.saved_tensors
    xhat = (out - bias) / torch.where(weight == 0, torch.ones_like(weight), weight)
    if kept:
        xhat[..., (weight == 0).nonzero().flatten()] = kept[0]
    gw = (g * xhat).sum(dim=tuple(range(g.dim() - 1)))
    gb = g.sum(dim=tuple(range(g.dim() - 1)))
    ghat = g * weight
    gx = rstd * (ghat - ghat.mean(-1, keepdim=True) - xhat * (ghat * xhat).mean(-1, keepdim=True))
    return gx, gw, gb, None


output_saving_layer_norm.register_autograd(_layer_norm_backward, setup_context=_layer_norm_keep)


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm that keeps its output and 1/std for backward, not its input (as nn.LayerNorm here)."""

    def forward(self, x):
        return output_saving_layer_norm(x, self.weight, self.bias, self.eps)[0]


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
        """Copy an engine state_dict into this model: all of it, or nothing (_checked_engine_state)."""
        own = self.state_dict(keep_vars=True)
        ready = _checked_engine_state(f"{type(self).__name__}.load_engine_state", own, state)
        with torch.no_grad():
            for name, value in ready.items():
                own[name].copy_(torch.from_numpy(value))

    def engine_state(self) -> dict:
        """{name: NumPy array}: loads into the engine's model with load_state_dict."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


def _checked_engine_state(owner: str, own: dict, state: dict) -> dict:
    """{name: contiguous array} to copy into `own` ({name: tensor}, a model's state_dict), everything checked first:
    every name there and no other (KeyError), each value a numeric array of its tensor's shape, and the names of one
    tied parameter given equal values (ValueError). One error names every problem."""
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise KeyError(f"{owner}: missing keys {missing}, unexpected keys {unexpected}; nothing was loaded (pass "
                       "the engine model's whole state_dict(), of a model of the same configuration)")
    ready, problems, first = {}, [], {}  # first: id(tensor) -> the first name it was given under
    for name, t in own.items():
        value = np.ascontiguousarray(state[name])
        if value.dtype.kind not in "biuf" or value.shape != tuple(t.shape):
            problems.append(f"'{name}' is {list(value.shape)} {value.dtype}, the model's is {list(t.shape)} "
                            f"{str(t.dtype).removeprefix('torch.')}")
            continue
        ready[name] = value
        other = first.setdefault(id(t), name)
        if other != name and other in ready and not np.array_equal(ready[other], value):
            problems.append(f"'{other}' and '{name}' name one tied parameter but hold different values (an untied "
                            f"model's); give both the same array or build the model untied")
    if problems:
        raise ValueError(f"{owner}: {'; '.join(problems)}; nothing was loaded")
    return ready


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
# rotate_half on the two halves, grouped key/value heads, softmax -> top-k -> renormalise, experts in expert order
# added into zeros, the load-balancing loss), in the input dtype throughout (Hugging Face computes RMSNorm and the
# router softmax in float32), so float64 runs compare to 1e-10. What autograd keeps is what a CUDA run keeps:
# RMSNorm and rotary are one op each (torch.library custom ops), and k, v are never repeated per query head.
@torch.library.custom_op("tinygrad_ckpt::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(x·rstd·weight, rstd), rstd = 1/sqrt(mean(x²) + eps) per row: one op, as CUDA's fused kernel
    (aten._fused_rms_norm); autograd keeps x, the weight and rstd, as its derivative formula does. CPU's own
    rms_norm is composite and keeps x·rstd besides, B·T·d more per norm."""
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * rstd * weight, rstd


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[:-1] + (1,))


def _rms_norm_keep(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_backward(ctx, g, _g_rstd):
    """dL/dw = Σ g·x̂, dL/dx = rstd·(ĝ - x̂·mean(ĝ·x̂)) with x̂ = x·rstd, ĝ = g·w."""
    x, weight, rstd = ctx.saved_tensors
    xhat, ghat = x * rstd, g * weight
    gw = (g * xhat).sum(dim=tuple(range(g.dim() - 1)))
    return rstd * (ghat - xhat * (ghat * xhat).mean(-1, keepdim=True)), gw, None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_keep)


@torch.library.custom_op("tinygrad_ckpt::rotary", mutates_args=())
def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + rotate_half(x)·sin (rotate_half([x₁, x₂]) = [-x₂, x₁]) as one op, as the engine's ops.Rotary;
    autograd keeps cos and sin, as the composite form does (a rotation needs nothing of x)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@rotary.register_fake
def _(x, cos, sin):
    return torch.empty_like(x)


def _rotary_keep(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])


def _rotary_backward(ctx, g):
    """The rotation back: dL/dx = g·cos + [h₂, -h₁], h = g·sin."""
    cos, sin = ctx.saved_tensors
    h, half = g * sin, g.shape[-1] // 2
    return g * cos + torch.cat((h[..., half:], -h[..., :half]), dim=-1), None, None


rotary.register_autograd(_rotary_backward, setup_context=_rotary_keep)


class TorchRMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)[0]


class TorchLlamaAttention(torch.nn.Module):
    """Grouped-query attention as the engine's (and FlashAttention's, with SDPA's enable_gqa): the H query heads
    in Hkv groups of G, each group against its one key/value head (einsum folds G into the rows; nothing is
    repeated). Hugging Face's eager attention repeats k and v to H heads first (repeat_kv), keeping
    2·B·(H - Hkv)·T·hd more per layer."""

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
        q, k = rotary(q, cos, sin).reshape(B, Hkv, H // Hkv, T, hd), rotary(k, cos, sin)  # head h: group h // G
        att = torch.einsum("bkgtd,bksd->bkgts", q, k) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
        att = F.dropout(F.softmax(att.masked_fill(mask, float("-inf")), dim=-1), self.dropout, self.training)
        y = torch.einsum("bkgts,bksd->bkgtd", att, v).reshape(B, H, T, hd)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, H * hd))


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
        self._tables_dtype = torch.float32
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
        if self._tables_dtype != dtype:  # rounded once from float64, as the engine's table (not by .to(), which
            self.cos_table = torch.from_numpy(np.cos(self._angles)).to(dtype)  # converts the float32 values)
            self.sin_table = torch.from_numpy(np.sin(self._angles)).to(dtype)
            self._tables_dtype = dtype
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


__all__ = ["TorchGPT", "TorchLlama", "load_balancing_loss", "run_blocks", "engine_op", "selective_contexts",
           "SavedBytes", "Kept", "TorchStep", "measure_step", "apply_plan", "remove_plan", "measure",
           "comparison_table", "find_blocks"]
