"""The cheaper saves: layer norm keeps its output (x̂ recovered from it, zero weights exact), GELU reads Φ(x)
from its output, and dropout keeps a 1-bit mask. Gradients against PyTorch and central differences, and the bytes
the ledger sees."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import numeric_grads, rel_err
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn


def _ln_grads(x, w, b, g):
    tensors = [tg.Tensor(a, requires_grad=True) for a in (x, w, b)]
    out = F.layer_norm(*tensors)
    saved = {k: tuple(a.shape) for k, a in out.tape().entries[0].ctx.saved.items()}
    (out * tg.Tensor(g)).sum().backward()
    return saved, [t.grad for t in tensors]


def test_layer_norm_keeps_its_output_and_the_next_linear_shares_it(rng):
    block = nn.Block(16, 2)
    x = tg.Tensor(rng.standard_normal((2, 5, 16)).astype(np.float32), requires_grad=True)
    y = block(x)
    entries = {e.name: e for e in y.tape().entries}
    ln, c_attn = entries["ln_1.layer_norm"], entries["attn.c_attn.linear"]
    assert set(ln.ctx.saved) == {"out", "rstd", "weight", "bias"}
    assert ln.ctx.saved["out"] is c_attn.ctx.saved["x"]  # one buffer, counted once by the ledger


@pytest.mark.parametrize("zeros", [[], [0, 3], [0, 1, 2, 3, 4, 5]])
def test_layer_norm_gradients_with_zero_weights_are_exact(zeros, rng):
    x, b, g = rng.standard_normal((3, 4, 6)), rng.standard_normal(6), rng.standard_normal((3, 4, 6))
    w = rng.standard_normal(6)
    w[zeros] = 0.0
    saved, grads = _ln_grads(x, w, b, g)
    assert ("xhat_where_weight_is_0" in saved) == bool(zeros)
    if zeros:
        assert saved["xhat_where_weight_is_0"] == (3, 4, len(zeros))  # only those columns
    expected = numeric_grads(lambda x, w, b: F.layer_norm(x, w, b), [x, w, b], g)
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    assert np.abs(grads[1][zeros]).sum() > 0 if zeros else True  # dL/dw of a zero weight is not zero


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layer_norm_and_dropout_match_torch(dtype, rng):
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    x, b, g = (rng.standard_normal(s).astype(dtype) for s in ((4, 7, 32), (32,), (4, 7, 32)))
    w = (1 + 0.1 * rng.standard_normal(32)).astype(dtype)
    w[5] = 0.0
    _, grads = _ln_grads(x, w, b, g)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    (torch.nn.functional.layer_norm(tx, (32,), tw, tb, eps=1e-5) * torch.from_numpy(g)).sum().backward()
    tol = 1e-10 if dtype == np.float64 else 2e-5
    for ours, theirs in zip(grads, (tx.grad, tw.grad, tb.grad)):
        assert rel_err(ours, theirs.numpy()) < tol
    # dropout: the same mask applied by hand in torch gives the same gradient
    tg.manual_seed(4)
    xt = tg.Tensor(x, requires_grad=True)
    out = F.dropout(xt, 0.3)
    (out * tg.Tensor(g)).sum().backward()
    mask = out.numpy() != 0
    tx = torch.tensor(x, requires_grad=True)
    (tx * torch.from_numpy(mask) / 0.7 * torch.from_numpy(g)).sum().backward()
    assert rel_err(xt.grad, tx.grad.numpy()) < tol


def test_dropout_keeps_one_bit_per_element(rng):
    x = tg.Tensor(rng.standard_normal((3, 5, 7)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as led:
        out = F.dropout(x, 0.5)
    (entry,) = out.tape().entries
    bits = entry.ctx.saved["mask_bits"]
    assert bits.dtype == np.uint8 and bits.shape == (-(-105 // 8),)  # 105 elements: 14 bytes, not 105
    assert led.saved_breakdown(by="name") == {"dropout:mask_bits": 14}
    kept = np.unpackbits(bits)[:105].reshape(3, 5, 7).astype(bool)
    np.testing.assert_array_equal(kept, out.numpy() != 0)


def test_block_saves_match_the_engine_terms_with_packed_masks():
    """A dropout block: no x̂ anywhere, each mask 1 bit per element, the whole equal to estimate's terms."""
    from tinygrad_ckpt.scale import estimate

    B, T, d, H = 2, 8, 16, 2
    tg.manual_seed(0)
    block = nn.Block(d, H, dropout=0.1)
    x = tg.Tensor(np.ones((B, T, d), np.float32), requires_grad=True)
    with tg.Ledger() as led:
        y = block(x)
    saved = led.saved_breakdown(by="name")
    assert not any("xhat" in k for k in saved)
    assert saved["attn.dropout:mask_bits"] == B * H * T * T // 8
    assert saved["attn.resid_dropout.dropout:mask_bits"] == saved["mlp.dropout.dropout:mask_bits"] == B * T * d // 8
    shape = estimate.GPTShape(1, d, H, T, B, dtype="float32", dropout=0.1)
    assert sum(saved.values()) == estimate.engine_activation_bytes_per_layer(shape)
    del y


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_reads_phi_from_its_output_and_matches_torch(approximate, dtype, rng):
    """GELU keeps x and its output (the next linear's input: one buffer) and reads Φ(x) = out/x in backward;
    its gradient equals PyTorch's, at x = 0 exactly (Φ = ½) and far in both tails, and central differences."""
    x = np.concatenate([rng.standard_normal(40) * 3, [0.0, -0.0, 1e-30, -1e-30, -12.0, 12.0, -30.0]]).astype(dtype)
    g = rng.standard_normal(x.shape).astype(dtype)
    xt = tg.Tensor(x, requires_grad=True)
    out = F.gelu(xt, approximate=approximate)
    (entry,) = out.tape().entries
    assert set(entry.ctx.saved) == {"x", "out"} and entry.ctx.saved["out"] is out.data
    (out * tg.Tensor(g)).sum().backward()
    assert np.all(np.isfinite(xt.grad))
    np.testing.assert_array_equal(xt.grad[40:42], 0.5 * g[40:42])  # Φ(0) = ½, φ(0)·0 = 0
    if dtype == np.float64:
        expected = numeric_grads(lambda x: F.gelu(x, approximate=approximate), [x[:40]], g[:40])[0]
        np.testing.assert_allclose(xt.grad[:40], expected, rtol=1e-6, atol=1e-8)
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    tx = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.gelu(tx, approximate=approximate) * torch.from_numpy(g)).sum().backward()
    assert rel_err(xt.grad, tx.grad.numpy()) < (1e-12 if dtype == np.float64 else 2e-6)


def test_gelu_output_is_the_next_linears_input(rng):
    mlp = nn.MLP(8)
    y = mlp(tg.Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32), requires_grad=True))
    entries = {e.name: e for e in y.tape().entries}
    assert entries["gelu"].ctx.saved["out"] is entries["c_proj.linear"].ctx.saved["x"]  # one buffer
