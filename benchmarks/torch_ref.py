"""The same pre-LN GPT block stack in PyTorch (CPU), loaded with the engine's weights.

`TorchBlock` is nanoGPT's block written out: LayerNorm, fused c_attn, explicit causal attention
(q kᵀ·scale, masked_fill(-inf), softmax, @ v: the path nanoGPT takes without flash attention; the
same math as `tinygrad_ckpt`), exact GELU. `attention="sdpa"` swaps in
`F.scaled_dot_product_attention(is_causal=True)` (a fused kernel that keeps no [T, T] matrix), shown
for information.

`saved_bytes(fn)` counts what autograd keeps for backward with `torch.autograd.graph.saved_tensors_hooks`,
each storage once (by `untyped_storage().data_ptr()`), parameters left out: the number to set beside
the ledger's activation bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from .handwritten import PARAM_NAMES


class TorchBlock(torch.nn.Module):
    def __init__(self, d_model: int, n_heads: int, attention: str = "math"):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(d_model)
        self.c_attn = torch.nn.Linear(d_model, 3 * d_model)
        self.c_proj = torch.nn.Linear(d_model, d_model)
        self.ln_2 = torch.nn.LayerNorm(d_model)
        self.c_fc = torch.nn.Linear(d_model, 4 * d_model)
        self.mlp_proj = torch.nn.Linear(4 * d_model, d_model)
        self.n_heads, self.attention = n_heads, attention

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_heads
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu_(1)
            att = att.masked_fill(mask, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


_TORCH_NAMES = dict(zip(PARAM_NAMES, (
    "ln_1.weight", "ln_1.bias", "c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias",
    "ln_2.weight", "ln_2.bias", "c_fc.weight", "c_fc.bias", "mlp_proj.weight", "mlp_proj.bias",
)))


def from_engine(blocks, n_heads: int, attention: str = "math", dtype=torch.float32) -> torch.nn.ModuleList:
    """Torch blocks with the weights of the engine's `nn.Block`s (copied)."""
    out = torch.nn.ModuleList()
    for b in blocks:
        own = dict(b.named_parameters())
        d_model = own["ln_1.weight"].shape[0]
        tb = TorchBlock(d_model, n_heads, attention).to(dtype)
        with torch.no_grad():
            params = dict(tb.named_parameters())
            for ours, theirs in _TORCH_NAMES.items():
                params[theirs].copy_(torch.from_numpy(np.ascontiguousarray(own[ours].numpy())))
        out.append(tb)
    return out


def grads_as_engine(tblocks) -> list:
    """[{engine parameter name: NumPy gradient}] per block, to compare with the engine's."""
    out = []
    for tb in tblocks:
        params = dict(tb.named_parameters())
        out.append({ours: params[theirs].grad.numpy() for ours, theirs in _TORCH_NAMES.items()})
    return out


def run_stack(tblocks, x):
    for b in tblocks:
        x = b(x)
    return x


def step(tblocks, x, dout) -> None:
    """One forward + backward (gradients land in .grad of the parameters and of x)."""
    for p in tblocks.parameters():
        p.grad = None
    x.grad = None
    run_stack(tblocks, x).backward(dout)


def saved_bytes(fn, params) -> dict:
    """Run `fn()` (a forward) under saved-tensor hooks; bytes of the distinct non-parameter storages
    autograd packed for backward, overall and by dtype. Returns {"total": ..., "by_dtype": {...}, "out": fn()}."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, tuple] = {}

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_ptrs and ptr not in seen:
            seen[ptr] = (st.nbytes(), str(t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    by_dtype: dict[str, int] = {}
    for nbytes, dtype in seen.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    return {"total": sum(n for n, _ in seen.values()), "by_dtype": by_dtype, "out": out}
