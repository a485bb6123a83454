"""The Llama family (Llama 2/3, Mistral, Mixtral) with Hugging Face's module paths and parameter names, so a
checkpoint in that layout loads as it is."""

from __future__ import annotations

import numpy as np

from .. import backend
from .. import functional as F
from ..checks import one_of
from ..engine.tensor import Tensor
from ..ops.moe import balanced_indices, expert_picks
from ..ops.rotary import rotary_table
from ..recompute.plans import run_checkpointed
from .module import (
    Embedding,
    Linear,
    Module,
    ModuleList,
    RMSNorm,
    SiLU,
    _dropout,
    _heads,
    _input,
    _real,
    _size,
    _token_ids,
    next_token_logits_and_loss,
)


def llama_ffn_hidden(d_model: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU width Meta's Llama code computes [Meta]: 2/3 of 4·d (three matrices instead of two, so about the
    parameters of a 4·d GELU MLP), times ffn_dim_multiplier if given, rounded up to a multiple of multiple_of:
    4096 -> 11008 (Llama-2-7B); with 1.3 and 1024, 4096 -> 14336 (Llama-3-8B); with 1.3 and 4096, 8192 -> 28672
    (Llama-3-70B)."""
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


class RotaryEmbedding(Module):
    """The cos/sin table of rotary positions, [2, max_positions, head_dim], held once for the whole model (a buffer:
    not a parameter, not in state_dict) and read by every layer's attention (ops.rotary)."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0, dtype=np.float32):
        super().__init__()
        self.head_dim, self.max_positions, self.base = head_dim, max_positions, base
        self.register_buffer("table", Tensor(rotary_table(head_dim, max_positions, base, dtype)))

    def buffer_in(self, key: str, dtype):
        """The table made again in `dtype` (from float64, rounded once), not its old values converted."""
        return rotary_table(self.head_dim, self.max_positions, self.base, dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, positions={self.max_positions}, base={self.base:g}"


class LlamaAttention(Module):
    """Causal self-attention with rotary positions and n_kv_head ≤ n_head key/value heads (grouped-query attention;
    1: multi-query), no biases: q_proj [H·hd, d], k_proj and v_proj [Hkv·hd, d], o_proj [d, H·hd]. k and v are never
    repeated per query head (functional.scaled_dot_product_attention(enable_gqa=True)). `dropout` drops attention
    weights (Hugging Face's attention_dropout). The rotary table is the model's, read here, not owned."""

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, rotary: RotaryEmbedding, dropout: float = 0.0,
                 attention: str = "explicit"):
        super().__init__()
        d_model, n_head = _heads("LlamaAttention", d_model, n_head, "n_head")
        n_kv_head = _size("LlamaAttention", "n_kv_head", n_kv_head)
        if n_head % n_kv_head:
            raise ValueError(f"LlamaAttention: n_kv_head={n_kv_head} must divide n_head={n_head} (each key/value "
                             f"head serves n_head/n_kv_head query heads); pick a divisor of {n_head}")
        one_of("LlamaAttention", "attention", attention, ("explicit", "chunked"))
        hd = d_model // n_head
        self.q_proj = Linear(d_model, n_head * hd, bias=False)
        self.k_proj = Linear(d_model, n_kv_head * hd, bias=False)
        self.v_proj = Linear(d_model, n_kv_head * hd, bias=False)
        self.o_proj = Linear(n_head * hd, d_model, bias=False)
        object.__setattr__(self, "rotary", rotary)  # shared, not a child: its table is named once, by the model
        self.n_head, self.n_kv_head, self.head_dim, self.d_model = n_head, n_kv_head, hd, d_model
        self.dropout, self.attention = _dropout("LlamaAttention", dropout), attention

    def forward(self, x):
        _input("LlamaAttention", x, self.d_model)
        B, T, _ = x.shape
        H, Hkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).reshape(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd] (views)
        k = self.k_proj(x).reshape(B, T, Hkv, hd).transpose(1, 2)  # [B, Hkv, T, hd]
        v = self.v_proj(x).reshape(B, T, Hkv, hd).transpose(1, 2)
        table = self.rotary.table.data
        if table.dtype != q.dtype:  # under autocast q, k are half: the table in their dtype, as Hugging Face's
            table = table.astype(q.dtype)  # rotary embedding gives cos and sin in the activations' dtype
        q, k = F.rotary_embedding(q, table), F.rotary_embedding(k, table)  # new [B, H(kv), T, hd] buffers
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training,
                                           impl=self.attention, enable_gqa=Hkv != H)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # [B, T, H·hd] (a copy: the transpose is not contiguous)
        return self.o_proj(y)

    def extra_repr(self) -> str:
        return f"heads={self.n_head}, kv_heads={self.n_kv_head}, attention={self.attention}"


class LlamaMLP(Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) · up_proj(x)), no biases; gate and up [f, d], down [d, f]."""

    def __init__(self, d_model: int, ffn_hidden: int):
        super().__init__()
        self.gate_proj = Linear(d_model, ffn_hidden, bias=False)
        self.up_proj = Linear(d_model, ffn_hidden, bias=False)
        self.down_proj = Linear(ffn_hidden, d_model, bias=False)
        self.act_fn = SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(Module):
    """One expert of a Mixtral MoE (Hugging Face's MixtralBlockSparseTop2MLP): w2(silu(w1(x)) · w3(x))."""

    def __init__(self, d_model: int, ffn_hidden: int):
        super().__init__()
        self.w1 = Linear(d_model, ffn_hidden, bias=False)
        self.w2 = Linear(ffn_hidden, d_model, bias=False)
        self.w3 = Linear(d_model, ffn_hidden, bias=False)
        self.act_fn = SiLU()

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(Module):
    """Mixtral's sparse MoE: the router `gate` ([E, d], no bias) picks each token's k experts (softmax, top-k, weights
    renormalised over the k), each expert runs on its tokens only, and their outputs are summed back, weighted
    (ops.moe: topk_routing, dispatch, combine).

    `routing`: "learned" (the router's choice) or "balanced" (token n's slot j goes to expert (n·k + j) mod E, the
    weights still the router's softmax over those experts: what the shape-only meta backend assumes, since there a
    router has no values to choose by; on NumPy it makes a run's ledger equal the meta ledger)."""

    def __init__(self, d_model: int, ffn_hidden: int, n_experts: int, experts_per_token: int = 2):
        super().__init__()
        n_experts = _size("MixtralSparseMoeBlock", "n_experts", n_experts)
        k = _size("MixtralSparseMoeBlock", "experts_per_token", experts_per_token)
        if k > n_experts:
            raise ValueError(f"MixtralSparseMoeBlock: experts_per_token={k} is more than the {n_experts} experts")
        self.gate = Linear(d_model, n_experts, bias=False)
        self.experts = ModuleList([MixtralExpert(d_model, ffn_hidden) for _ in range(n_experts)])
        self.n_experts, self.k, self.d_model, self.routing = n_experts, k, d_model, "learned"

    def forward(self, x, statistics: bool = False):
        """x [B, T, d] -> the experts' weighted sum [B, T, d]; with `statistics`, also (the router probabilities
        summed over the tokens [E], how often each expert was chosen [E]) for the load-balancing loss."""
        B, T, d = x.shape
        rows = x.reshape(B * T, d)
        logits = self.gate(rows)  # [N, E]
        be = backend.current()
        balanced = self.routing == "balanced" or not be.has_values
        experts = balanced_indices(B * T, self.k, self.n_experts) if balanced else None
        weights, indices = F.topk_routing(logits, self.k, experts)  # [N, k] each
        picks = expert_picks(indices.data, self.n_experts)
        inputs = F.moe_dispatch(rows, picks, self.k)
        outputs = [expert(xe) for expert, xe in zip(self.experts, inputs)]  # each expert on its tokens only
        out = F.moe_combine(weights, outputs, picks).reshape(B, T, d)
        if not statistics:
            return out
        chosen = Tensor(be.asarray(np.array([p.shape[0] for p in picks], dtype=np.float64)).astype(x.dtype)
                        if be.has_values else backend.xp().zeros((self.n_experts,), dtype=x.dtype))
        return out, F.softmax(logits, axis=-1).sum(axis=0), chosen

    def extra_repr(self) -> str:
        return f"experts={self.n_experts}, per_token={self.k}, routing={self.routing}"


class LlamaDecoderLayer(Module):
    """Pre-RMSNorm Llama block: h = x + self_attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h))
    (mlp: SwiGLU, or `block_sparse_moe` with n_experts > 0). With the router's statistics wanted (Llama's
    output_router_logits) it takes and returns (x, probabilities summed, choices counted), so that a checkpointed
    layer hands them on too."""

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, ffn_hidden: int, rotary: RotaryEmbedding,
                 norm_eps: float = 1e-5, n_experts: int = 0, experts_per_token: int = 2, dropout: float = 0.0,
                 attention: str = "explicit"):
        super().__init__()
        self.d_model = d_model
        self.self_attn = LlamaAttention(d_model, n_head, n_kv_head, rotary, dropout, attention)
        self.input_layernorm = RMSNorm(d_model, norm_eps)
        self.post_attention_layernorm = RMSNorm(d_model, norm_eps)
        if n_experts:
            self.block_sparse_moe = MixtralSparseMoeBlock(d_model, ffn_hidden, n_experts, experts_per_token)
        else:
            self.mlp = LlamaMLP(d_model, ffn_hidden)

    def forward(self, x):
        carry = isinstance(x, tuple)
        if carry:
            x, probabilities, chosen = x
        _input("LlamaDecoderLayer", x, self.d_model)
        h = x + self.self_attn(self.input_layernorm(x))
        normed = self.post_attention_layernorm(h)
        if "mlp" in self._modules:
            out = h + self.mlp(normed)
            return (out, probabilities, chosen) if carry else out
        if not carry:
            return h + self.block_sparse_moe(normed)
        moe, p, c = self.block_sparse_moe(normed, statistics=True)
        return h + moe, probabilities + p, chosen + c


class LlamaModel(Module):
    """Hugging Face's LlamaModel: embed_tokens, layers, norm, and the rotary table shared by every layer."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, d_model, n_kv_head, ffn_hidden, rope_theta, norm_eps,
                 n_experts, experts_per_token, dropout, attention):
        super().__init__()
        self.embed_tokens = Embedding(vocab_size, d_model)
        self.rotary_emb = RotaryEmbedding(d_model // n_head, block_size, rope_theta)
        self.layers = ModuleList([LlamaDecoderLayer(d_model, n_head, n_kv_head, ffn_hidden, self.rotary_emb, norm_eps,
                                                    n_experts, experts_per_token, dropout, attention)
                                  for _ in range(n_layer)])
        self.norm = RMSNorm(d_model, norm_eps)

    def forward(self, idx, checkpoint=None, statistics=None):
        x = self.embed_tokens(idx)  # [B, T, d]
        x = run_checkpointed(list(self.layers), x if statistics is None else (x, *statistics), checkpoint)
        if statistics is None:
            return self.norm(x), None
        x, *statistics = x
        return self.norm(x), statistics


class Llama(Module):
    """A Llama / Mistral / Mixtral causal LM, as nn.GPT is nanoGPT: `model(idx, targets)` -> (logits, loss).

    Pre-RMSNorm blocks, rotary positions (rope_theta; one [2, block_size, head_dim] cos/sin table for the model),
    grouped-query attention (n_kv_head key/value heads, default n_head), a SwiGLU MLP of ffn_hidden units (default:
    `llama_ffn_hidden(d_model)`, Meta's rule with multiple_of 256, 11008 at d = 4096), no biases, lm_head untied
    unless tie_embeddings. With n_experts > 0 every MLP is a Mixtral sparse MoE of experts_per_token experts per token.
    Module paths and state_dict names are Hugging Face's LlamaForCausalLM / MixtralForCausalLM (`model.embed_tokens`,
    `model.layers.{i}.self_attn.q_proj`, `...mlp.gate_proj` or `...block_sparse_moe.experts.{e}.w1`, `model.norm`,
    `lm_head`), so a checkpoint in that layout loads as it is and the ops are named by the same paths
    (`model.layers.3.mlp.act_fn.silu`).

    idx, targets: integer arrays [B, T]; targets[t] is the token after idx[t] (nanoGPT's convention: Hugging Face
    shifts its labels inside instead). Without targets only the last position's logits. `checkpoint`: as nn.GPT's
    (None, "every_layer", "sqrt", a number of segments, a Policy such as tg.korthikanti_selective, a planner Plan).
    `attention`: "explicit" or "chunked". `dropout`: on the attention weights (Hugging Face's attention_dropout).

    Mixtral's load-balancing loss (Hugging Face's load_balancing_loss_func: E·Σ_e f_e·P_e over every layer's tokens,
    f_e the share of choices that went to expert e, P_e its mean router probability): set `output_router_logits =
    True` and each forward computes it into `aux_loss` and adds `router_aux_loss_coef · aux_loss` to the loss (as
    MixtralForCausalLM; coefficient default 0.001, MixtralConfig's), under every checkpoint plan too.
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 n_kv_head: int | None = None, ffn_hidden: int | None = None, rope_theta: float = 10000.0,
                 norm_eps: float = 1e-5, tie_embeddings: bool = False, n_experts: int = 0, experts_per_token: int = 2,
                 dropout: float = 0.0, checkpoint=None, attention: str = "explicit"):
        owner = "Llama"
        vocab_size, block_size = _size(owner, "vocab_size", vocab_size), _size(owner, "block_size", block_size)
        n_layer, (d_model, n_head) = _size(owner, "n_layer", n_layer, 0), _heads(owner, d_model, n_head, "n_head")
        if (d_model // n_head) % 2:
            raise ValueError(f"Llama: head_dim = d_model/n_head = {d_model // n_head} must be even (rotary positions "
                             "turn pairs of features)")
        n_kv_head = n_head if n_kv_head is None else _size(owner, "n_kv_head", n_kv_head)
        if n_head % n_kv_head:
            raise ValueError(f"Llama: n_kv_head={n_kv_head} must divide n_head={n_head}")
        ffn_hidden = llama_ffn_hidden(d_model) if ffn_hidden is None else _size(owner, "ffn_hidden", ffn_hidden)
        rope_theta = _real(owner, "rope_theta", rope_theta, "a base > 0 such as 10000.0", lambda v: v > 0)
        norm_eps = _real(owner, "norm_eps", norm_eps, "a small number >= 0 such as 1e-5", lambda v: v >= 0)
        if not isinstance(tie_embeddings, (bool, np.bool_)):
            raise TypeError(f"Llama: tie_embeddings must be True or False, got {tie_embeddings!r}")
        n_experts = _size(owner, "n_experts", n_experts, 0)
        experts_per_token = _size(owner, "experts_per_token", experts_per_token)
        if n_experts and experts_per_token > n_experts:
            raise ValueError(f"Llama: experts_per_token={experts_per_token} is more than n_experts={n_experts}")
        dropout = _dropout(owner, dropout)
        one_of(owner, "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.model = LlamaModel(vocab_size, block_size, n_layer, n_head, d_model, n_kv_head, ffn_hidden, rope_theta,
                                norm_eps, n_experts, experts_per_token, dropout, attention)
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.vocab_size, self.block_size, self.checkpoint = vocab_size, block_size, checkpoint
        self.n_experts, self.experts_per_token = n_experts, experts_per_token
        self.output_router_logits, self.router_aux_loss_coef, self.aux_loss = False, 0.001, None

    def forward(self, idx, targets=None):
        be = backend.current()
        given = idx.data if isinstance(idx, Tensor) else idx
        idx = _token_ids("Llama", given, self.block_size)
        B, T = idx.shape
        statistics = None
        if self.n_experts and self.output_router_logits:
            statistics = tuple(Tensor(be.xp.zeros((self.n_experts,), dtype=self.lm_head.weight.dtype))
                               for _ in range(2))
        x, statistics = self.model(idx, self.checkpoint, statistics)
        self.aux_loss = None if statistics is None else self._load_balancing_loss(*statistics, B * T)
        logits, loss = next_token_logits_and_loss("Llama", self.lm_head, x, idx, given, targets, self.vocab_size)
        if loss is not None and self.aux_loss is not None:
            loss = loss + self.aux_loss * self.router_aux_loss_coef
        return logits, loss

    def _load_balancing_loss(self, probabilities, chosen, tokens: int):
        """E·Σ_e (chosen_e / (L·N))·(probabilities_e / (L·N)): Hugging Face's load_balancing_loss_func over every
        layer's N tokens at once (the choices' share per expert times its mean probability, summed, times E)."""
        seen = len(self.model.layers) * tokens
        return (probabilities * (chosen * (self.n_experts / (seen * seen)))).sum()
