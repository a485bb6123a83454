"""Chunked attention (ops.ChunkedAttention): the explicit path's gradients, what it keeps, dropout that
replays under a checkpoint, skipped causal blocks, the meta backend, and clear errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import tiny_batch

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn


def _attention(arrays, w, **kwargs):
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = F.scaled_dot_product_attention(*tensors, **kwargs)
    (out * tg.Tensor(w)).sum().backward()
    return [out.numpy()] + [t.grad for t in tensors], out


SHAPES = [  # (T_q, T_k, block_size, causal)
    (16, 16, 4, True), (16, 16, 5, True), (13, 13, 1, True), (7, 7, 64, True), (6, 11, 4, True),
    (12, 12, 5, False), (5, 9, 2, False),
]


@pytest.mark.parametrize("tq, tk, block, causal", SHAPES)
def test_gradients_equal_the_explicit_path_float64(tq, tk, block, causal, rng):
    q, k, v = rng.standard_normal((2, 3, tq, 4)), rng.standard_normal((2, 3, tk, 4)), rng.standard_normal((2, 3, tk, 5))
    w = rng.standard_normal((2, 3, tq, 5))
    explicit, _ = _attention((q, k, v), w, causal=causal)
    chunked, _ = _attention((q, k, v), w, causal=causal, impl="chunked", block_size=block)
    for name, a, b in zip(("out", "dq", "dk", "dv"), chunked, explicit):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10, err_msg=name)


def test_it_keeps_no_t_by_t_array(rng):
    q, k, v = (tg.Tensor(rng.standard_normal((2, 2, 16, 4)).astype(np.float32), requires_grad=True)
               for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, impl="chunked", block_size=4)
    (entry,) = out.tape().entries
    assert entry.op == "chunked_attention"
    assert {n: tuple(a.shape) for n, a in entry.ctx.saved.items()} == {
        "q": (2, 2, 16, 4), "k": (2, 2, 16, 4), "v": (2, 2, 16, 4), "out": (2, 2, 16, 4), "lse": (2, 2, 16, 1)}
    explicit = F.scaled_dot_product_attention(q, k, v)
    assert any(a.shape[-2:] == (16, 16) for e in explicit.tape().entries for a in e.ctx.saved.values())


def test_causal_blocks_in_the_future_are_skipped(rng):
    """With 8 blocks a side, causal attention computes 36 of the 64 blocks: its FLOPs are 36/64 of the full's."""
    q, k, v = (tg.Tensor(rng.standard_normal((1, 1, 32, 4)), requires_grad=True) for _ in range(3))
    causal = F.scaled_dot_product_attention(q, k, v, impl="chunked", block_size=4).tape().entries[0].ctx.flops
    full = F.scaled_dot_product_attention(q, k, v, causal=False, impl="chunked", block_size=4).tape().entries[0]
    assert causal[0] * 64 == full.ctx.flops[0] * 36 and causal[1] * 64 == full.ctx.flops[1] * 36


def test_the_default_block_size_is_one_constant(rng):
    """F.scaled_dot_product_attention, nn.Block(attention="chunked") and the op itself all walk blocks of
    ops.attention.BLOCK_SIZE when no block_size is given; at T = 1.5 blocks the causal op computes 3 of 4."""
    from tinygrad_ckpt import ops
    from tinygrad_ckpt.ops.attention import BLOCK_SIZE

    T = BLOCK_SIZE * 3 // 2
    q, k, v = (tg.Tensor(rng.standard_normal((1, 1, T, 4)), requires_grad=True) for _ in range(3))
    for out in (F.scaled_dot_product_attention(q, k, v, impl="chunked"), ops.ChunkedAttention.apply(q, k, v)):
        (entry,) = out.tape().entries
        assert entry.ctx.block_size == BLOCK_SIZE
        half = T - BLOCK_SIZE  # the second, shorter block of queries sees both key blocks
        assert entry.ctx.flops[0] == (BLOCK_SIZE * BLOCK_SIZE + half * T) * (2 * 4 + 2 * 4 + 5)
    block = nn.Block(8, 2, attention="chunked")
    y = block(tg.Tensor(rng.standard_normal((1, T, 8)).astype(np.float32)))  # the block's dtype (as PyTorch asks)
    (entry,) = [e for e in y.tape().entries if e.op == "chunked_attention"]
    assert entry.ctx.block_size == BLOCK_SIZE


def test_dropout_is_one_function_of_the_rng_state_and_keeps_1_minus_p(rng):
    q, k, v = (rng.standard_normal((4, 4, 24, 8)) for _ in range(3))
    w = rng.standard_normal((4, 4, 24, 8))
    plain, _ = _attention((q, k, v), w, impl="chunked", block_size=8)
    tg.manual_seed(3)
    first, out = _attention((q, k, v), w, impl="chunked", block_size=8, dropout_p=0.25)
    assert out.tape().entries[0].ctx.stream == (3, 0) and tg.get_rng_state() == (3, 1)  # one draw reserved
    tg.manual_seed(3)
    again, _ = _attention((q, k, v), w, impl="chunked", block_size=8, dropout_p=0.25)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(first[0], plain[0])
    # the mean over many masks approaches the output without dropout (E[mask/(1-p)] = 1)
    outs = []
    for seed in range(200):
        tg.manual_seed(seed)
        with tg.no_grad():
            outs.append(F.scaled_dot_product_attention(*(tg.Tensor(a) for a in (q, k, v)), impl="chunked",
                                                       block_size=8, dropout_p=0.25).numpy())
    spread = np.abs(np.std(outs, axis=0)).mean() / np.sqrt(len(outs))
    assert np.abs(np.mean(outs, axis=0) - plain[0]).mean() < 4 * spread
    with tg.no_grad():  # eval mode: no dropout at all
        evaluated = F.scaled_dot_product_attention(*(tg.Tensor(a) for a in (q, k, v)), impl="chunked", block_size=8,
                                                   dropout_p=0.25, training=False).numpy()
    np.testing.assert_array_equal(evaluated, plain[0])


def _gpt_grads(checkpoint, attention, dropout=0.2, seed=0):
    tg.manual_seed(seed)
    model = nn.GPT(11, 16, 2, 2, 16, dropout=dropout, checkpoint=checkpoint, attention=attention)
    idx, targets = tiny_batch(seq=16)
    with tg.Ledger() as led:
        _, loss = model(idx, targets)
        loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}, led


@pytest.mark.parametrize("checkpoint", ["every_layer", 1, tg.korthikanti_selective])
def test_dropout_replays_bitwise_under_checkpoint(checkpoint):
    plain, _ = _gpt_grads(None, "chunked")
    ckpt, led = _gpt_grads(checkpoint, "chunked")
    assert led.flops("recompute") > 0
    for name in plain:
        np.testing.assert_array_equal(plain[name], ckpt[name], err_msg=name)


def test_gpt_chunked_keeps_fewer_bytes_with_the_same_gradients():
    explicit, led_e = _gpt_grads(None, "explicit", dropout=0.0)
    chunked, led_c = _gpt_grads(None, "chunked", dropout=0.0)
    for name in explicit:
        np.testing.assert_allclose(chunked[name], explicit[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert led_c.peak_bytes("activation") < led_e.peak_bytes("activation")
    kept = {e.name for e in led_c.events if e.category == "activation" and "attn" in e.name}
    assert any("chunked_attention" in n for n in kept) and not any("softmax" in n for n in kept)


def test_meta_backend_counts_the_same_bytes_and_flops():
    counts = []
    for name in ("numpy", "meta"):
        tg.use_backend(name)
        tg.manual_seed(0)
        model = nn.GPT(11, 20, 2, 2, 16, dropout=0.1, attention="chunked")
        idx, targets = tiny_batch(seq=20)
        with tg.Ledger() as led:
            _, loss = model(idx, targets)
            loss.backward()
        counts.append((led.peak_bytes("activation"), led.peak_bytes(), led.flops()))
    tg.use_backend("numpy")
    assert counts[0] == counts[1]


@pytest.mark.parametrize("kwargs, match", [
    ({"block_size": 0}, r"block_size must be a positive int .* got 0"),
    ({"block_size": 2.5}, r"block_size must be a positive int .* got 2.5"),
    ({"block_size": True}, r"block_size must be a positive int .* got True"),
    ({"dropout_p": 1.0}, r"dropout_p must be in \[0, 1\), got 1.0"),
    ({"impl": "flash"}, r"impl must be 'explicit' or 'chunked', got 'flash'"),
])
def test_bad_arguments_are_named(kwargs, match, rng):
    q = tg.Tensor(rng.standard_normal((1, 2, 4, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=match):
        F.scaled_dot_product_attention(q, q, q, **{"impl": "chunked", **kwargs})
    out = F.scaled_dot_product_attention(q, q, q, impl="chunked")  # and it works as before
    out.sum().backward()
    assert q.grad.shape == (1, 2, 4, 3)


@pytest.mark.parametrize("shapes, match", [
    ([(1, 2, 4, 3), (1, 2, 4, 5), (1, 2, 4, 3)], r"q \[1, 2, 4, 3\], k \[1, 2, 4, 5\].* and head_dim"),
    ([(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 6, 3)], r"k and v the same leading axes and length"),
    ([(1, 3, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3)], r"q has 3 heads, k 2 and v 2: .*pass enable_gqa=True"),
    ([(1, 2, 6, 3), (1, 2, 4, 3), (1, 2, 4, 3)], r"more queries than keys .* first 2 queries with no key"),
    ([(2, 4, 3), (2, 4, 3), (2, 4, 3)], r"q must be \[B, H, T, head_dim\], got \[2, 4, 3\]"),
])
def test_bad_shapes_are_named(shapes, match, rng):
    q, k, v = (tg.Tensor(rng.standard_normal(s)) for s in shapes)
    with pytest.raises(ValueError, match=match):
        F.scaled_dot_product_attention(q, k, v, impl="chunked")


def test_grouped_heads_must_divide(rng):
    q, k = tg.Tensor(rng.standard_normal((1, 3, 4, 2))), tg.Tensor(rng.standard_normal((1, 2, 4, 2)))
    for impl in ("explicit", "chunked"):
        with pytest.raises(ValueError, match=r"q has 3 heads, k 2 and v 2: k and v need one head count that divides"):
            F.scaled_dot_product_attention(q, k, k, impl=impl, enable_gqa=True)


def test_modules_refuse_an_unknown_attention():
    with pytest.raises(ValueError, match=r"attention must be 'explicit' or 'chunked', got 'flash'"):
        nn.GPT(11, 8, 1, 2, 16, attention="flash")
    assert "attention=chunked" in repr(nn.Block(16, 2, attention="chunked"))
    assert nn.Block(16, 2).attn.attention == "explicit"  # the default stays explicit


@pytest.mark.parametrize("tq, tk", [(12, 12), (6, 11)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("block", [1, 3, 4, 16])
def test_a_nan_or_inf_key_stays_in_the_rows_that_see_it(tq, tk, bad, block, rng):
    """Key j = [bad, 0, 0, 0] against queries whose first component is positive: every score of key j is NaN, +inf
    or -inf. The queries before it (i + tk - tq < j) must not see it, forward or backward, and the chunked path must
    agree with the explicit one row by row, NaN for NaN. The diagonal block's mask used to be added to the scores
    (NaN + -inf is NaN, and so is +inf + -inf), so it leaked into the earlier queries of that block; and a row whose
    first key block held only -inf scores became NaN (-inf - -inf)."""
    for j in range(tk):
        q, k = rng.standard_normal((1, 2, tq, 4)), rng.standard_normal((1, 2, tk, 4))
        v = rng.standard_normal((1, 2, tk, 3))
        q[..., 0] = np.abs(q[..., 0]) + 0.1
        k[..., j, :] = [bad, 0, 0, 0]
        w = rng.standard_normal((1, 2, tq, 3))
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            explicit, _ = _attention((q, k, v), w)
            chunked, _ = _attention((q, k, v), w, impl="chunked", block_size=block)
        before = np.arange(tq) + tk - tq < j
        # dq's first component multiplies key j's bad entry by a zero weight (0 · NaN) on both paths: not compared
        for name, a, b in (("out", chunked[0], explicit[0]), ("dq", chunked[1][..., 1:], explicit[1][..., 1:])):
            assert np.isfinite(a[..., before, :]).all(), (name, j)
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-10, equal_nan=True, err_msg=f"{name}, key {j}")
