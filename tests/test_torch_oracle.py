"""PyTorch as the oracle for whole models: a transformer Block and a 2-layer GPT (every op alone is compared with
PyTorch over generated shapes and dtypes by the op table, test_op_table.py).

Errors are max |ours - torch| / max |torch| (relative to the largest magnitude, see helpers.rel_err).
float64: < 1e-8 for forward values and gradients. float32: < 1e-4 for the GPT's gradients (longer chains of
rounding).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import rel_err, tiny_batch, tiny_gpt, weighted_loss
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn

torch = pytest.importorskip("torch", reason=TORCH_MISSING)
tnn = torch.nn
TF = torch.nn.functional


# ---- a nanoGPT reference, written out here --------------------------------------------------


class TorchAttention(tnn.Module):
    def __init__(self, d, n_head, block_size):
        super().__init__()
        self.c_attn = tnn.Linear(d, 3 * d)
        self.c_proj = tnn.Linear(d, d)
        self.n_head = n_head
        # nanoGPT's causal-mask buffer (present when it runs without flash attention): not a parameter
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # [B, H, T, hd]
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = TF.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class TorchMLP(tnn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = tnn.Linear(d, 4 * d)
        self.gelu = tnn.GELU()
        self.c_proj = tnn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class TorchBlock(tnn.Module):
    def __init__(self, d, n_head, block_size):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(d)
        self.attn = TorchAttention(d, n_head, block_size)
        self.ln_2 = tnn.LayerNorm(d)
        self.mlp = TorchMLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TorchGPT(tnn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, d):
        super().__init__()
        self.transformer = tnn.ModuleDict(dict(
            wte=tnn.Embedding(vocab, d),
            wpe=tnn.Embedding(block_size, d),
            h=tnn.ModuleList([TorchBlock(d, n_head, block_size) for _ in range(n_layer)]),
            ln_f=tnn.LayerNorm(d),
        ))
        self.lm_head = tnn.Linear(d, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = TF.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def _to_torch_state(state: dict) -> dict:
    return {k: torch.from_numpy(v.copy()) for k, v in state.items()}


def _randomise_torch(module, seed):
    """Non-trivial values everywhere (LayerNorm weights != 1, biases != 0) so every layout matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)


@pytest.mark.parametrize("attention", ["explicit", "chunked"])
def test_block_matches_torch_float64(attention, rng):
    d, n_head, T = 16, 4, 6
    ours = nn.Block(d, n_head, attention=attention)
    ours.to(np.float64)
    ref = TorchBlock(d, n_head, block_size=8).double()
    _randomise_torch(ref, seed=1)
    # torch -> ours (nanoGPT names, [out, in] layouts); the mask buffer is skipped
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    for name, p in ours.named_parameters():
        np.testing.assert_array_equal(p.numpy(), ref.state_dict()[name].numpy())

    x = rng.standard_normal((2, T, d))
    w = rng.standard_normal((2, T, d))
    xt = tg.Tensor(x, requires_grad=True)
    out = ours(xt)
    weighted_loss(out, w).backward()
    xr = torch.tensor(x, requires_grad=True)
    out_r = ref(xr)
    (out_r * torch.from_numpy(w)).sum().backward()

    assert rel_err(out, out_r.detach().numpy()) < 1e-8
    assert rel_err(xt.grad, xr.grad.numpy()) < 1e-8
    ref_params = dict(ref.named_parameters())
    names = [n for n, _ in ours.named_parameters()]
    assert sorted(names) == sorted(ref_params)
    for name, p in ours.named_parameters():
        assert p.grad.dtype == np.float64
        assert rel_err(p.grad, ref_params[name].grad.numpy()) < 1e-8, name


@pytest.mark.parametrize("direction", ["ours_to_torch", "torch_to_ours"])
def test_gpt_loss_and_every_gradient_match_torch_float64(direction):
    vocab, block_size, n_layer, n_head, d = 13, 8, 2, 2, 16
    ours = tiny_gpt(vocab, block_size, n_layer, n_head, d, dtype=np.float64, seed=3)
    ref = TorchGPT(vocab, block_size, n_layer, n_head, d).double()
    if direction == "ours_to_torch":
        missing, unexpected = ref.load_state_dict(_to_torch_state(ours.state_dict()), strict=False)
        assert unexpected == [] and sorted(missing) == [f"transformer.h.{i}.attn.bias" for i in range(n_layer)]
    else:
        _randomise_torch(ref, seed=2)
        ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})  # strict, as is
    for name, value in ours.state_dict().items():
        np.testing.assert_array_equal(value, ref.state_dict()[name].numpy(), err_msg=name)

    idx, targets = tiny_batch(vocab, batch=2, seq=7, seed=4)
    targets[0, 2] = targets[1, 5] = -1  # ignored positions
    logits, loss = ours(idx, targets)
    loss.backward()
    logits_r, loss_r = ref(torch.from_numpy(idx), torch.from_numpy(targets))
    loss_r.backward()

    assert loss.dtype == np.float64
    assert abs(loss.item() - loss_r.item()) / abs(loss_r.item()) < 1e-8
    assert rel_err(logits, logits_r.detach().numpy()) < 1e-8
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    assert set(ours.state_dict()) == set(ref_params)
    checked = 0
    for name, p in ours.named_parameters():
        assert rel_err(p.grad, ref_params[name].grad.numpy()) < 1e-8, name
        checked += 1
    assert checked == len(list(ref.parameters())) == 4 + 12 * n_layer  # the tied weight once, with both uses


def test_gpt_float32_close_to_torch():
    vocab, d = 13, 16
    ours = tiny_gpt(vocab, 8, 2, 2, d, seed=5)
    ref = TorchGPT(vocab, 8, 2, 2, d)
    ref.load_state_dict(_to_torch_state(ours.state_dict()), strict=False)
    idx, targets = tiny_batch(vocab, batch=2, seq=8, seed=6)
    _, loss = ours(idx, targets)
    loss.backward()
    _, loss_r = ref(torch.from_numpy(idx), torch.from_numpy(targets))
    loss_r.backward()
    assert loss.dtype == np.float32
    assert abs(loss.item() - loss_r.item()) / abs(loss_r.item()) < 1e-5
    ref_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        assert p.grad.dtype == np.float32
        assert rel_err(p.grad, ref_params[name].grad.numpy()) < 1e-4, name
