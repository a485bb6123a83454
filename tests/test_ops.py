"""Every op against central finite differences (float64, random output weights, broadcast shapes),
tensors used several times, and dtypes (float32 default, float64 kept, float16 runs, no leaks).

REGISTRY is also used by test_torch_oracle.py: each case may carry a PyTorch reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from helpers import analytic_grads, numeric_grads, rel_err, to_backend, to_numpy, weighted_loss

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import ops
from tinygrad_ckpt.function import Function


@dataclass
class OpCase:
    """One op call: `fn(*tensors, **kwargs)` on float inputs of `shapes`.

    kwargs hold the non-differentiable constants (index arrays, ids, targets, masks) as NumPy
    arrays; they are moved to the active backend before the call. `positive` draws inputs in
    [0.5, 2] (log, div, fractional powers). `torch(t, *tensors, **kwargs)` is the PyTorch
    reference (t is the torch module), or None when there is none.
    """

    name: str
    fn: Callable
    shapes: tuple
    kwargs: dict = field(default_factory=dict)
    positive: bool = False
    torch: Callable | None = None

    def inputs(self, rng, dtype=np.float64):
        if self.positive:
            return [rng.uniform(0.5, 2.0, size=s).astype(dtype) for s in self.shapes]
        return [rng.standard_normal(s).astype(dtype) for s in self.shapes]


def _dropout_fixed_mask(x):
    tg.set_rng_state((5, 0))  # the same mask on every call, so finite differences see one function
    return F.dropout(x, 0.3, training=True)


def _chunked_dropout_fixed_masks(q, k, v):
    tg.set_rng_state((5, 0))  # the same per-block masks on every call
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, impl="chunked", block_size=2)


def _torch_causal_sdpa(t, q, k, v):
    """Causal attention written out (mask aligned to the bottom right when T_q != T_k)."""
    tq, tk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    mask = t.ones(tq, tk, dtype=t.bool).triu(1 + tk - tq)
    return t.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v


_IDX = np.array([0, 2, 2, 1, 0])  # repeats: the gradient must be summed, not overwritten
_IDS = np.array([[1, 3, 3], [0, 6, 1]])
_TARGETS = np.array([0, 4, -1, 2, -1, 1])  # two ignored rows
_MASK = np.random.default_rng(7).random((3, 4)) < 0.4

REGISTRY = [
    # elementwise, with broadcasting
    OpCase("add", lambda a, b: a + b, [(3, 4), (3, 4)], torch=lambda t, a, b: a + b),
    OpCase("add_broadcast", lambda a, b: a + b, [(3, 1, 4), (5, 4)], torch=lambda t, a, b: a + b),
    OpCase("add_broadcast_lead", lambda a, b: a + b, [(4,), (2, 3, 4)], torch=lambda t, a, b: a + b),
    OpCase("add_scalar", lambda a: a + 2.5, [(3, 4)], torch=lambda t, a: a + 2.5),
    OpCase("radd_scalar", lambda a: 2.5 + a, [(3, 4)], torch=lambda t, a: 2.5 + a),
    OpCase("sub_broadcast", lambda a, b: a - b, [(3, 1, 4), (5, 4)], torch=lambda t, a, b: a - b),
    OpCase("sub_size1", lambda a, b: a - b, [(2, 3), (2, 1)], torch=lambda t, a, b: a - b),
    OpCase("rsub_scalar", lambda a: 1.5 - a, [(3, 4)], torch=lambda t, a: 1.5 - a),
    OpCase("mul_broadcast", lambda a, b: a * b, [(3, 1, 4), (5, 4)], torch=lambda t, a, b: a * b),
    OpCase("mul_size1", lambda a, b: a * b, [(2, 3), (2, 1)], torch=lambda t, a, b: a * b),
    OpCase("mul_scalar", lambda a: a * 0.5, [(3, 4)], torch=lambda t, a: a * 0.5),
    OpCase("rmul_scalar", lambda a: -3.0 * a, [(3, 4)], torch=lambda t, a: -3.0 * a),
    OpCase("div_broadcast", lambda a, b: a / b, [(3, 1, 4), (5, 4)], positive=True, torch=lambda t, a, b: a / b),
    OpCase("div_scalar", lambda a: a / 4.0, [(3, 4)], torch=lambda t, a: a / 4.0),
    OpCase("rdiv_scalar", lambda a: 2.0 / a, [(3, 4)], positive=True, torch=lambda t, a: 2.0 / a),
    OpCase("neg", lambda a: -a, [(2, 3)], torch=lambda t, a: -a),
    OpCase("pow_2", lambda a: a**2, [(3, 4)], torch=lambda t, a: a**2),
    OpCase("pow_3_int", lambda a: a**3, [(3, 4)], torch=lambda t, a: a**3),
    OpCase("pow_half", lambda a: a**0.5, [(3, 4)], positive=True, torch=lambda t, a: a**0.5),
    OpCase("pow_neg", lambda a: a**-1.5, [(3, 4)], positive=True, torch=lambda t, a: a**-1.5),
    OpCase("exp", lambda a: a.exp(), [(3, 4)], torch=lambda t, a: a.exp()),
    OpCase("log", lambda a: a.log(), [(3, 4)], positive=True, torch=lambda t, a: a.log()),
    OpCase("tanh", lambda a: a.tanh(), [(3, 4)], torch=lambda t, a: a.tanh()),
    # reductions
    OpCase("sum_all", lambda a: a.sum(), [(2, 3, 4)], torch=lambda t, a: a.sum()),
    OpCase("sum_all_keep", lambda a: a.sum(keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.sum(dim=(0, 1, 2), keepdim=True)),
    OpCase("sum_axis0", lambda a: a.sum(axis=0), [(2, 3, 4)], torch=lambda t, a: a.sum(dim=0)),
    OpCase("sum_axis_neg1_keep", lambda a: a.sum(axis=-1, keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.sum(dim=-1, keepdim=True)),
    OpCase("sum_tuple", lambda a: a.sum(axis=(0, 2)), [(2, 3, 4)], torch=lambda t, a: a.sum(dim=(0, 2))),
    OpCase("sum_tuple_keep", lambda a: a.sum(axis=(0, -1), keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.sum(dim=(0, -1), keepdim=True)),
    OpCase("mean_all", lambda a: a.mean(), [(2, 3, 4)], torch=lambda t, a: a.mean()),
    OpCase("mean_axis1", lambda a: a.mean(axis=1), [(2, 3, 4)], torch=lambda t, a: a.mean(dim=1)),
    OpCase("mean_axis_neg1_keep", lambda a: a.mean(axis=-1, keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.mean(dim=-1, keepdim=True)),
    OpCase("mean_tuple", lambda a: a.mean(axis=(1, 2)), [(2, 3, 4)], torch=lambda t, a: a.mean(dim=(1, 2))),
    OpCase("mean_tuple_keep", lambda a: a.mean(axis=(0, 2), keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.mean(dim=(0, 2), keepdim=True)),
    OpCase("max_all", lambda a: a.max(), [(2, 3, 4)], torch=lambda t, a: a.amax()),
    OpCase("max_all_keep", lambda a: a.max(keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.amax(dim=(0, 1, 2), keepdim=True)),
    OpCase("max_axis1", lambda a: a.max(axis=1), [(2, 3, 4)], torch=lambda t, a: a.amax(dim=1)),
    OpCase("max_axis_neg1_keep", lambda a: a.max(axis=-1, keepdims=True), [(2, 3, 4)],
           torch=lambda t, a: a.amax(dim=-1, keepdim=True)),
    # movement
    OpCase("reshape", lambda a: a.reshape(6, 4), [(2, 3, 4)], torch=lambda t, a: a.reshape(6, 4)),
    OpCase("reshape_minus1", lambda a: a.reshape(-1), [(2, 3, 4)], torch=lambda t, a: a.reshape(-1)),
    OpCase("reshape_tuple_minus1", lambda a: a.reshape((4, -1)), [(2, 3, 4)], torch=lambda t, a: a.reshape(4, -1)),
    OpCase("reshape_noncontiguous", lambda a: a.permute(2, 0, 1).reshape(4, 6), [(2, 3, 4)],
           torch=lambda t, a: a.permute(2, 0, 1).reshape(4, 6)),
    OpCase("view", lambda a: a.view(3, 8), [(2, 3, 4)], torch=lambda t, a: a.view(3, 8)),
    OpCase("view_op", lambda a: ops.View.apply(a, shape=(3, 8)), [(2, 3, 4)], torch=lambda t, a: a.view(3, 8)),
    OpCase("cast", lambda a: ops.Cast.apply(a, dtype=a.dtype) * 2.0, [(3, 4)], torch=lambda t, a: a * 2.0),
    OpCase("permute", lambda a: a.permute(2, 0, 1), [(2, 3, 4)], torch=lambda t, a: a.permute(2, 0, 1)),
    OpCase("permute_negative", lambda a: a.permute((-1, 0, 1)), [(2, 3, 4)],
           torch=lambda t, a: a.permute(-1, 0, 1)),
    OpCase("transpose_reverse", lambda a: a.transpose(), [(2, 3, 4)], torch=lambda t, a: a.permute(2, 1, 0)),
    OpCase("transpose_two_axes", lambda a: a.transpose(0, 2), [(2, 3, 4)], torch=lambda t, a: a.transpose(0, 2)),
    OpCase("T", lambda a: a.T, [(3, 5)], torch=lambda t, a: a.T),
    OpCase("swapaxes", lambda a: a.swapaxes(-1, -2), [(2, 3, 4)], torch=lambda t, a: a.swapaxes(-1, -2)),
    OpCase("getitem_slices", lambda a: a[1:3, ::2], [(4, 5)], torch=lambda t, a: a[1:3, ::2]),
    OpCase("getitem_int", lambda a: a[:, 1], [(4, 5)], torch=lambda t, a: a[:, 1]),
    OpCase("getitem_ellipsis_newaxis", lambda a: a[..., None, 1:], [(2, 3, 4)],
           torch=lambda t, a: a[..., None, 1:]),
    OpCase("getitem_negative", lambda a: a[-1], [(3, 4)], torch=lambda t, a: a[-1]),
    OpCase("getitem_array_repeats", lambda a, idx: a[idx], [(4, 3)], {"idx": _IDX},
           torch=lambda t, a, idx: a[idx]),
    OpCase("getitem_array_axis1", lambda a, idx: a[:, idx], [(2, 4)], {"idx": np.array([1, 1, 3])},
           torch=lambda t, a, idx: a[:, idx]),
    OpCase("getitem_array_2d", lambda a, idx: a[idx], [(3, 2)], {"idx": np.array([[0, 1], [1, 1]])},
           torch=lambda t, a, idx: a[idx]),
    # split: one op, several views; a piece nobody reads gets a zero gradient
    OpCase("split_uneven", lambda a: (lambda p: p[0] + p[1] * p[2])(a.split(2, dim=1)), [(3, 5)],
           torch=lambda t, a: (lambda p: p[0] + p[1] * p[2])(a.split(2, dim=1))),
    OpCase("split_sections_last_axis", lambda a: (lambda p: p[1] * p[0])(a.split([1, 3], dim=-1)), [(2, 3, 4)],
           torch=lambda t, a: (lambda p: p[1] * p[0])(a.split([1, 3], dim=-1))),
    OpCase("split_one_piece_read", lambda a: a.split(2)[1] * 1.5, [(6, 3)],
           torch=lambda t, a: a.split(2)[1] * 1.5),
    OpCase("split_qkv", lambda a: (lambda q, k, v: q * k + v)(*a.split(4, dim=2)), [(2, 3, 12)],
           torch=lambda t, a: (lambda q, k, v: q * k + v)(*a.split(4, dim=2))),
    OpCase("embedding", lambda w, ids: F.embedding(ids, w), [(7, 5)], {"ids": _IDS},
           torch=lambda t, w, ids: t.nn.functional.embedding(ids, w)),
    # matrix products
    OpCase("matmul", lambda a, b: a @ b, [(3, 4), (4, 5)], torch=lambda t, a, b: a @ b),
    OpCase("matmul_batched", lambda a, b: a @ b, [(2, 3, 4), (2, 4, 5)], torch=lambda t, a, b: a @ b),
    OpCase("matmul_broadcast_rhs", lambda a, b: a @ b, [(2, 3, 4), (4, 5)], torch=lambda t, a, b: a @ b),
    OpCase("matmul_broadcast_lhs", lambda a, b: a @ b, [(4, 5), (2, 5, 3)], torch=lambda t, a, b: a @ b),
    OpCase("matmul_broadcast_batch", lambda a, b: a @ b, [(3, 1, 2, 4), (5, 4, 6)], torch=lambda t, a, b: a @ b),
    OpCase("linear", lambda x, w, b: F.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)],
           torch=lambda t, x, w, b: t.nn.functional.linear(x, w, b)),
    OpCase("linear_no_bias", lambda x, w: F.linear(x, w), [(2, 3, 4), (5, 4)],
           torch=lambda t, x, w: t.nn.functional.linear(x, w)),
    OpCase("linear_2d", lambda x, w, b: F.linear(x, w, b), [(3, 4), (2, 4), (2,)],
           torch=lambda t, x, w, b: t.nn.functional.linear(x, w, b)),
    # the transformer's non-linear ops
    OpCase("gelu", lambda a: F.gelu(a), [(3, 7)], torch=lambda t, a: t.nn.functional.gelu(a)),
    OpCase("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), [(3, 7)],
           torch=lambda t, a: t.nn.functional.gelu(a, approximate="tanh")),
    OpCase("softmax", lambda a: F.softmax(a), [(2, 3, 5)], torch=lambda t, a: t.softmax(a, dim=-1)),
    OpCase("softmax_axis0", lambda a: F.softmax(a, axis=0), [(4, 3)], torch=lambda t, a: t.softmax(a, dim=0)),
    OpCase("log_softmax", lambda a: F.log_softmax(a), [(3, 5)], torch=lambda t, a: t.log_softmax(a, dim=-1)),
    OpCase("log_softmax_axis1", lambda a: F.log_softmax(a, axis=1), [(2, 4, 3)],
           torch=lambda t, a: t.log_softmax(a, dim=1)),
    OpCase("layer_norm", lambda x, w, b: F.layer_norm(x, w, b), [(2, 3, 6), (6,), (6,)],
           torch=lambda t, x, w, b: t.nn.functional.layer_norm(x, (6,), w, b, eps=1e-5)),
    OpCase("layer_norm_eps", lambda x, w, b: F.layer_norm(x, w, b, eps=0.1), [(4, 5), (5,), (5,)],
           torch=lambda t, x, w, b: t.nn.functional.layer_norm(x, (5,), w, b, eps=0.1)),
    OpCase("cross_entropy", lambda x, targets: F.cross_entropy(x, targets), [(6, 5)], {"targets": _TARGETS},
           torch=lambda t, x, targets: t.nn.functional.cross_entropy(x, targets, ignore_index=-1)),
    OpCase("cross_entropy_ignore_100", lambda x, targets: F.cross_entropy(x, targets, ignore_index=-100), [(4, 3)],
           {"targets": np.array([2, -100, 0, 1])},
           torch=lambda t, x, targets: t.nn.functional.cross_entropy(x, targets, ignore_index=-100)),
    OpCase("masked_fill", lambda x, mask: ops.MaskedFill.apply(x, mask, value=-2.0), [(3, 4)], {"mask": _MASK},
           torch=lambda t, x, mask: x.masked_fill(mask, -2.0)),
    OpCase("masked_fill_broadcast_mask", lambda x, mask: ops.MaskedFill.apply(x, mask, value=0.5), [(2, 3, 4)],
           {"mask": _MASK}, torch=lambda t, x, mask: x.masked_fill(mask, 0.5)),
    OpCase("masked_fill_broadcast_x", lambda x, mask: ops.MaskedFill.apply(x, mask, value=-1.0), [(1, 4)],
           {"mask": _MASK}, torch=lambda t, x, mask: x.masked_fill(mask, -1.0)),
    OpCase("sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True), [(2, 2, 5, 4)] * 3,
           torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
    OpCase("sdpa_full", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=False), [(1, 2, 4, 3)] * 3,
           torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v)),
    OpCase("sdpa_causal_tq_lt_tk", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
           [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)], torch=_torch_causal_sdpa),
    OpCase("sdpa_chunked_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, impl="chunked",
                                                                                 block_size=2),
           [(2, 2, 5, 4)] * 3,
           torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)),
    OpCase("sdpa_chunked_full", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=False, impl="chunked",
                                                                               block_size=3),
           [(1, 2, 4, 3)] * 3, torch=lambda t, q, k, v: t.nn.functional.scaled_dot_product_attention(q, k, v)),
    OpCase("sdpa_chunked_tq_lt_tk", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, impl="chunked",
                                                                                   block_size=2),
           [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)], torch=_torch_causal_sdpa),
    OpCase("sdpa_chunked_dropout", _chunked_dropout_fixed_masks, [(1, 2, 5, 3)] * 3),
    OpCase("dropout", _dropout_fixed_mask, [(4, 6)]),
]

CASE_IDS = [c.name for c in REGISTRY]


def _call(case, tensors):
    return case.fn(*tensors, **{k: to_backend(v) for k, v in case.kwargs.items()})


def _run(case, arrays, w):
    """Forward and backward of sum(fn(...) * w); returns (output, grads)."""
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = _call(case, tensors)
    weighted_loss(out, w).backward()
    return out, [t.grad for t in tensors]


def test_registry_names_are_unique():
    assert len(set(CASE_IDS)) == len(CASE_IDS)


def test_registry_covers_every_op(rng):
    """Every Function subclass exported by tinygrad_ckpt.ops is exercised by some case."""
    wanted = {
        obj.kind() for obj in vars(ops).values()
        if isinstance(obj, type) and issubclass(obj, Function) and obj is not Function
    }
    assert len(wanted) >= 26
    seen = set()
    for case in REGISTRY:
        arrays = case.inputs(rng)
        tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
        out = _call(case, tensors)
        seen |= {e.op for e in out.tape().entries}
    assert wanted - seen == set()


@pytest.mark.parametrize("case", REGISTRY, ids=CASE_IDS)
def test_gradient_matches_finite_differences(case, backend, rng):
    xp = backend.xp()
    arrays = [xp.asarray(a) for a in case.inputs(rng)]
    before = [to_numpy(a).copy() for a in arrays]
    with tg.no_grad():
        out_shape = _call(case, [tg.Tensor(a) for a in arrays]).shape
    w = xp.asarray(rng.standard_normal(out_shape))
    out, grads = _run(case, arrays, w)
    assert out.dtype == np.float64
    kwargs = {k: to_backend(v) for k, v in case.kwargs.items()}
    expected = numeric_grads(case.fn, arrays, w, kwargs)
    for i, (g, e) in enumerate(zip(grads, expected)):
        assert g is not None, f"{case.name}: input {i} got no gradient"
        assert tuple(g.shape) == tuple(e.shape)
        assert g.dtype == np.float64
        np.testing.assert_allclose(to_numpy(g), e, rtol=1e-5, atol=1e-7, err_msg=f"{case.name}: input {i}")
    for a, b in zip(arrays, before):  # neither forward nor backward writes into its inputs
        np.testing.assert_array_equal(to_numpy(a), b)


# ---- forward values that the gradient check cannot see (a wrong forward can have a right gradient) ----


def test_forward_values_against_numpy(rng):
    from scipy.special import erf

    x = rng.standard_normal((3, 5))
    t = tg.Tensor(x)
    np.testing.assert_allclose(F.gelu(t).numpy(), 0.5 * x * (1 + erf(x / np.sqrt(2))), rtol=1e-12)
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(F.gelu(t, approximate="tanh").numpy(), tanh_gelu, rtol=1e-12)
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(F.softmax(t).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(F.log_softmax(t).numpy(), np.log(e / e.sum(-1, keepdims=True)), rtol=1e-12)
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(F.layer_norm(t, tg.Tensor(w), tg.Tensor(b)).numpy(), xhat * w + b, rtol=1e-12)
    targets = np.array([1, -1, 4])
    logp = np.log(e / e.sum(-1, keepdims=True))
    expected = -(logp[0, 1] + logp[2, 4]) / 2  # the ignored row counts neither in the sum nor in N
    assert F.cross_entropy(t, targets).item() == pytest.approx(expected, rel=1e-12)
    assert t.max().item() == x.max() and (t.max(axis=0).numpy() == x.max(0)).all()
    np.testing.assert_array_equal(t[np.array([2, 0, 2])].numpy(), x[[2, 0, 2]])


def test_softmax_is_stable_for_large_logits():
    x = tg.Tensor(np.array([[1000.0, 1001.0, 1002.0]]))
    out = F.softmax(x).numpy()
    assert np.isfinite(out).all() and out.sum() == pytest.approx(1.0)
    assert F.cross_entropy(x, np.array([2])).item() == pytest.approx(-np.log(out[0, 2]))


def test_causal_attention_does_not_look_ahead(rng):
    """Changing a later key/value must not change an earlier query's output."""
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    base = F.scaled_dot_product_attention(tg.Tensor(q), tg.Tensor(k), tg.Tensor(v)).numpy()
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 4:] += 3.0
    v2[:, :, 4:] -= 2.0
    moved = F.scaled_dot_product_attention(tg.Tensor(q), tg.Tensor(k2), tg.Tensor(v2)).numpy()
    np.testing.assert_array_equal(moved[:, :, :4], base[:, :, :4])
    assert not np.allclose(moved[:, :, 4:], base[:, :, 4:])


def test_dropout_scales_kept_values_and_is_identity_in_eval(rng):
    x = rng.standard_normal((50, 40))
    out = F.dropout(tg.Tensor(x), 0.25).numpy()
    kept = out != 0
    np.testing.assert_allclose(out[kept], x[kept] / 0.75)
    assert 0.65 < kept.mean() < 0.85
    t = tg.Tensor(x)
    assert F.dropout(t, 0.25, training=False) is t and F.dropout(t, 0.0) is t
    with pytest.raises(ValueError, match="dropout"):
        F.dropout(t, 1.0)


def test_max_over_several_axes_is_refused_clearly(rng):
    """Max reduces one axis (or all): a tuple of axes is refused with a message, not a wrong answer."""
    t = tg.Tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)
    with pytest.raises(ValueError, match=r"max: axis must be an int or None"):
        t.max(axis=(0, 1))


def test_unbroadcast_sums_leading_and_size1_axes():
    g = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(ops.unbroadcast(g, (3, 1)), g.sum(axis=(0, 2)).reshape(3, 1))
    np.testing.assert_array_equal(ops.unbroadcast(g, (4,)), g.sum(axis=(0, 1)))
    np.testing.assert_array_equal(ops.unbroadcast(g, (1, 3, 4)), g.sum(axis=0, keepdims=True))
    assert ops.unbroadcast(g, (2, 3, 4)) is g


# ---- one tensor used several times ----------------------------------------------------------


FAN_OUT = {
    "x*x+x@x.T": (lambda x: x * x + x @ x.T, (4, 4)),
    "x+x": (lambda x: x + x, (3, 4)),
    "x*x": (lambda x: x * x, (3, 4)),
    "x-x": (lambda x: x - x, (3, 4)),
    "x/x": (lambda x: x / x, (3, 4)),
    "x/(x*x+1)": (lambda x: x / (x * x + 1.0), (3, 4)),
    "x@x": (lambda x: x @ x, (4, 4)),
    "nonleaf_h*h+h": (lambda x: (lambda h: h * h + h + h.exp())(x.tanh()), (3, 4)),
    "x_in_three_ops": (lambda x: (x.sum(axis=0) * x).exp() + F.softmax(x) * x[::-1], (3, 4)),
    "residual_chain": (lambda x: (lambda h: F.gelu(h) + h)(x @ x.T + x.sum(axis=1, keepdims=True)), (3, 3)),
}


@pytest.mark.parametrize("name", list(FAN_OUT))
def test_fan_out_gradients_accumulate(name, backend, rng):
    fn, shape = FAN_OUT[name]
    xp = backend.xp()
    x = xp.asarray(rng.standard_normal(shape))
    with tg.no_grad():
        w = xp.asarray(rng.standard_normal(fn(tg.Tensor(x)).shape))
    _, (g,) = analytic_grads(fn, [x], w)
    (expected,) = numeric_grads(fn, [x], w)
    np.testing.assert_allclose(to_numpy(g), expected, rtol=1e-5, atol=1e-7)


def test_same_tensor_as_both_inputs_closed_form(rng):
    x_np = rng.standard_normal((3, 4))
    w = rng.standard_normal((3, 4))
    for fn, expected in [
        (lambda x: x + x, 2 * w),
        (lambda x: x * x, 2 * x_np * w),
        (lambda x: x - x, np.zeros_like(w)),
    ]:
        _, (g,) = analytic_grads(fn, [x_np], w)
        np.testing.assert_allclose(g, expected, rtol=1e-12, atol=1e-15)


# ---- dtypes --------------------------------------------------------------------------------


def test_python_numbers_and_lists_default_to_float32():
    assert tg.Tensor([1.0, 2.0]).dtype == np.float32
    assert tg.Tensor([[1.5], [2.5]]).dtype == np.float32
    assert tg.Tensor(3.0).dtype == np.float32
    assert tg.Tensor([1, 2]).dtype.kind == "i"  # integers stay integers (indices)
    assert tg.Tensor(np.zeros(3)).dtype == np.float64  # NumPy arrays keep their dtype
    assert tg.Tensor(np.zeros(3, np.float16)).dtype == np.float16
    assert tg.Tensor([1.0, 2.0], dtype=np.float64).dtype == np.float64
    assert tg.Tensor(np.zeros(3), dtype=np.float32).dtype == np.float32


def test_scalar_constants_keep_the_tensor_dtype():
    for dtype in (np.float16, np.float32):
        x = tg.Tensor(np.ones((2, 2), dtype), requires_grad=True)
        y = ((x * 0.5 + 1.0) / 3.0 - 2.0) ** 2
        z = (1.0 - y) * 2.0 + 1.0 / (y + 1.0)
        assert y.dtype == dtype and z.dtype == dtype
        z.sum().backward()
        assert x.grad.dtype == dtype


def _saved_float_dtypes(out):
    return {
        (e.name, k, str(a.dtype))
        for e in out.tape().entries for k, a in e.ctx.saved.items()
        if hasattr(a, "dtype") and a.dtype.kind == "f"
    }


@pytest.mark.parametrize("case", REGISTRY, ids=CASE_IDS)
def test_float32_stays_float32(case, backend, rng):
    """Outputs, gradients and saved arrays of every op keep float32: no float64 leaks."""
    xp = backend.xp()
    arrays = [xp.asarray(a) for a in case.inputs(rng, np.float32)]
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = _call(case, tensors)
    assert out.dtype == np.float32
    leaked = {s for s in _saved_float_dtypes(out) if s[2] != "float32"}
    assert not leaked, f"saved arrays in another dtype: {leaked}"
    w = xp.asarray(rng.standard_normal(out.shape).astype(np.float32))
    weighted_loss(out, w).backward()
    for i, t in enumerate(tensors):
        assert t.grad is not None and t.grad.dtype == np.float32, (case.name, i, getattr(t.grad, "dtype", None))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case", REGISTRY, ids=CASE_IDS)
def test_float16_runs_and_keeps_dtype(case, backend, rng):
    xp = backend.xp()
    arrays = [xp.asarray(a) for a in case.inputs(rng, np.float16)]
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = _call(case, tensors)
    assert out.dtype == np.float16
    with tg.no_grad():  # and agrees with the float32 computation, roughly
        ref = _call(case, [tg.Tensor(a.astype(np.float32)) for a in arrays])
    assert rel_err(out, ref) < 2e-2
    w = xp.asarray(rng.standard_normal(out.shape).astype(np.float16))
    weighted_loss(out, w).backward()
    for t in tensors:
        assert t.grad is not None and t.grad.dtype == np.float16
        assert np.isfinite(to_numpy(t.grad)).all()
