"""PyTorch models this engine did not write, for tests of torch_plans and torch_weights: the module layouts and
parameter names of nanoGPT (with its bias=False switch), Hugging Face's GPT-2 (Conv1D weights stored [in, out])
and Hugging Face's Llama (model.layers[i].self_attn / mlp, blocks called with keyword arguments and returning a
tuple). Written here from those layouts; no scope names, no engine imports: to the engine they are foreign.

Attention splits the fused projection's output into three equal parts and lets heads follow from the width
(view(B, T, -1, hd)), so that the same code runs on a tensor-parallel shard."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# ---- nanoGPT's layout ----------------------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """A layer norm whose bias can be switched off (torch's LayerNorm had no such switch when nanoGPT was written)."""

    def __init__(self, dim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class SelfAttention(nn.Module):
    def __init__(self, d: int, n_head: int, block_size: int, dropout: float, bias: bool, fused: bool):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d, bias=bias)
        self.c_proj = nn.Linear(d, d, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.head_dim, self.p, self.fused = d // n_head, dropout, fused
        if not fused:  # the causal mask as a buffer, as nanoGPT keeps it when it has no fused attention
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size,
                                                                                            block_size))

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).chunk(3, dim=-1)  # each [B, T, width/3]
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # [B, heads, T, hd]
        if self.fused:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # [B, heads, T, T]
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, -1)  # [B, T, width]
        return self.resid_dropout(self.c_proj(y))


class FeedForward(nn.Module):
    def __init__(self, d: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoBlock(nn.Module):
    def __init__(self, d, n_head, block_size, dropout, bias, fused):
        super().__init__()
        self.ln_1 = LayerNorm(d, bias)
        self.attn = SelfAttention(d, n_head, block_size, dropout, bias, fused)
        self.ln_2 = LayerNorm(d, bias)
        self.mlp = FeedForward(d, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPTStyle(nn.Module):
    """transformer.{wte, wpe, drop, h, ln_f} and a tied lm_head; model(idx, targets) -> (logits, loss)."""

    def __init__(self, vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=64, dropout=0.0, bias=True,
                 fused=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd), drop=nn.Dropout(dropout),
            h=nn.ModuleList([NanoBlock(n_embd, n_head, block_size, dropout, bias, fused) for _ in range(n_layer)]),
            ln_f=LayerNorm(n_embd, bias)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.normal_(m.bias, 0.0, 0.02)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        tr = self.transformer
        x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(T, device=idx.device)))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(B * T, -1), targets.view(-1))
        return logits, loss


# ---- Hugging Face GPT-2's layout: Conv1D, weights [in, out] ----------------------------------------------------
class Conv1D(nn.Module):
    """x @ W + b with W stored [in, out] (the transpose of a Linear's), as Hugging Face's GPT-2 stores it."""

    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.randn(n_out) * 0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class HFGPT2Attention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.c_attn, self.c_proj, self.head_dim = Conv1D(3 * d, d), Conv1D(d, d), d // n_head

    def forward(self, hidden_states):
        B, T, _ = hidden_states.shape
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2)
                   for t in self.c_attn(hidden_states).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class HFGPT2MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc, self.c_proj = Conv1D(4 * d, d), Conv1D(d, 4 * d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class HFGPT2Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), HFGPT2Attention(d, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(d), HFGPT2MLP(d)

    def forward(self, hidden_states, attention_mask=None):
        h = hidden_states + self.attn(self.ln_1(hidden_states))
        return (h + self.mlp(self.ln_2(h)),)  # a tuple, as Hugging Face's blocks return


class HFGPT2Style(nn.Module):
    def __init__(self, vocab_size=64, n_positions=32, n_layer=2, n_head=4, n_embd=64):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte, self.transformer.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(n_positions,
                                                                                                     n_embd)
        self.transformer.h = nn.ModuleList([HFGPT2Block(n_embd, n_head) for _ in range(n_layer)])
        self.transformer.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def forward(self, input_ids, labels=None):
        tr = self.transformer
        h = tr.wte(input_ids) + tr.wpe(torch.arange(input_ids.shape[1]))
        for block in tr.h:
            h = block(h, attention_mask=None)[0]
        logits = self.lm_head(tr.ln_f(h))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return logits, loss


# ---- Hugging Face Llama's layout ---------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def _rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


class LlamaStyleAttention(nn.Module):
    def __init__(self, d, n_head, n_kv_head):
        super().__init__()
        hd = d // n_head
        self.q_proj, self.k_proj = nn.Linear(d, n_head * hd, bias=False), nn.Linear(d, n_kv_head * hd, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, n_kv_head * hd, bias=False), nn.Linear(n_head * hd, d, bias=False)
        self.head_dim, self.group = hd, n_head // n_kv_head

    def forward(self, hidden_states, position_embeddings):
        B, T, _ = hidden_states.shape
        cos, sin = position_embeddings
        q, k, v = (p(hidden_states).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k, v = k.repeat_interleave(self.group, dim=1), v.repeat_interleave(self.group, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class LlamaStyleMLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaStyleLayer(nn.Module):
    def __init__(self, d, n_head, n_kv_head, hidden):
        super().__init__()
        self.self_attn, self.mlp = LlamaStyleAttention(d, n_head, n_kv_head), LlamaStyleMLP(d, hidden)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings)
        return (h + self.mlp(self.post_attention_layernorm(h)),)


class LlamaStyle(nn.Module):
    """model.{embed_tokens, layers, norm}, lm_head; the rotary tables computed once and given to every layer."""

    def __init__(self, vocab_size=64, n_layer=3, n_head=4, n_kv_head=2, d=64, hidden=96, theta=10000.0):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(vocab_size, d)
        self.model.layers = nn.ModuleList([LlamaStyleLayer(d, n_head, n_kv_head, hidden) for _ in range(n_layer)])
        self.model.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab_size, bias=False)
        hd = d // n_head
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def forward(self, input_ids, labels=None):
        T = input_ids.shape[1]
        angles = torch.outer(torch.arange(T).float(), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        pe = (angles.cos(), angles.sin())
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, attention_mask=None, position_embeddings=pe)[0]
        logits = self.lm_head(self.model.norm(h))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return logits, loss
