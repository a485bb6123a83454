"""Every op of the table (test_op_table.py), at its fixed examples, against central finite differences on every
backend (float64, random output weights, broadcast shapes); tensors used several times; and dtypes (float32 default,
float64 kept, float16 runs, no leaks).

REGISTRY is the table's rows at their examples, as OpCases; the table itself runs hypothesis' shapes against PyTorch.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from helpers import analytic_grads, numeric_grads, rel_err, to_backend, to_numpy, weighted_loss
from test_op_table import GRAD_ROWS

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend as backend_module
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import ops


@dataclass
class OpCase:
    """One op call: `fn(*tensors, **kwargs)` on float inputs of `shapes`.

    kwargs hold the non-differentiable constants (index arrays, ids, targets, masks) as NumPy
    arrays; they are moved to the active backend before the call. `positive` draws inputs in
    [0.5, 2] (log, div, fractional powers).
    """

    name: str
    fn: Callable
    shapes: tuple
    kwargs: dict = field(default_factory=dict)
    positive: bool = False

    def inputs(self, rng, dtype=np.float64):
        if self.positive:
            return [rng.uniform(0.5, 2.0, size=s).astype(dtype) for s in self.shapes]
        return [rng.standard_normal(s).astype(dtype) for s in self.shapes]


def _one_output(fn):
    """fn with a tuple of outputs turned into one: each weighted by a fixed random array and summed (so each output's
    gradient is still a random weighting, not a plain sum)."""

    def call(*tensors, **kwargs):
        out = fn(*tensors, **kwargs)
        if not isinstance(out, tuple):
            return out
        rng = np.random.default_rng(0)
        weighted = [(o * tg.Tensor(backend_module.current().asarray(rng.standard_normal(o.shape).astype(o.dtype))))
                    .sum() for o in out]
        return functools.reduce(operator.add, weighted)

    return call


REGISTRY = [
    OpCase(f"{row.name}_{i}" if len(row.examples) > 1 else row.name, _one_output(row.ours), [tuple(s) for s in shapes],
           consts, row.domain == "positive")
    for row in GRAD_ROWS if not row.constants and row.name != "to"  # every input a float leaf, the dtype kept
    for i, (shapes, consts) in enumerate(row.examples)
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
