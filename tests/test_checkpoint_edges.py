"""Checkpoint edge cases from PyTorch's own checkpoint tests, translated to this API: identity segments,
outputs returned twice, inputs passed through, outputs that do not require grad, no input requiring
grad. Each is checked against the plain run (bit for bit), against central differences in float64,
and against torch.utils.checkpoint when PyTorch is installed."""

import numpy as np
import pytest
from helpers import rel_err
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn

try:
    import torch
    import torch.utils.checkpoint as torch_checkpoint
except ImportError:  # the PyTorch comparisons skip; the rest runs
    torch = None


def _grads(fn, inputs, checkpointed, weights):
    """Gradients of sum_i sum(out_i * w_i) w.r.t. the inputs, with fn run plainly or checkpointed."""
    xs = [tg.Tensor(x.copy(), requires_grad=rg) for x, rg in inputs]
    out = tg.checkpoint(fn, *xs) if checkpointed else fn(*xs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = None
    for o, w in zip(outs, weights):
        if o.requires_grad:
            term = (o * tg.Tensor(w)).sum()
            loss = term if loss is None else loss + term
    loss.backward()
    return [x.grad for x in xs], [o.requires_grad for o in outs]


def _torch_grads(torch_fn, inputs, weights):
    xs = [torch.tensor(x, requires_grad=rg) for x, rg in inputs]
    out = torch_checkpoint.checkpoint(torch_fn, *xs, use_reentrant=False)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.tensor(w)).sum() for o, w in zip(outs, weights) if o.requires_grad)
    loss.backward()
    return [None if x.grad is None else x.grad.numpy() for x in xs], [o.requires_grad for o in outs]


X = np.array([0.1, -0.4, 0.7])
Y = np.array([1.3, 0.2, -0.5])
W = [np.array([0.3, -1.1, 2.0]), np.array([-0.7, 0.4, 1.5]), np.array([0.9, 0.8, -0.2])]

# (name, our fn, torch fn, inputs as (array, requires_grad), expected gradients as a function of X, Y)
CASES = [
    ("identity", lambda t: t, lambda t: t, [(X, True)], lambda: [W[0]]),
    ("output_twice", lambda t: (lambda e: (e, e))(t.exp()), lambda t: (lambda e: (e, e))(t.exp()),
     [(X, True)], lambda: [np.exp(X) * (W[0] + W[1])]),
    ("input_passed_through", lambda a, b: (a, a * b), lambda a, b: (a, a * b),
     [(X, True), (Y, True)], lambda: [W[0] + Y * W[1], X * W[1]]),
    ("mixed_requires_grad", lambda a, b: (a.exp(), b * 2.0), lambda a, b: (a.exp(), b * 2.0),
     [(X, True), (Y, False)], lambda: [np.exp(X) * W[0], None]),
    ("input_twice_in_outputs", lambda a: (a, a.tanh(), a), lambda a: (a, a.tanh(), a),
     [(X, True)], lambda: [W[0] + (1 - np.tanh(X) ** 2) * W[1] + W[2]]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_edge_case_gradients_equal_plain_and_analytic(case):
    _, fn, _, inputs, expected = case
    plain, plain_rg = _grads(fn, inputs, False, W)
    ckpt, ckpt_rg = _grads(fn, inputs, True, W)
    assert ckpt_rg == plain_rg
    for got, ref, want in zip(ckpt, plain, expected()):
        if want is None:
            assert got is None and ref is None
        else:
            np.testing.assert_array_equal(got, ref)  # bit for bit
            np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.skipif(torch is None, reason=TORCH_MISSING)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_edge_case_gradients_match_pytorch_checkpoint(case):
    _, fn, torch_fn, inputs, _ = case
    ours, our_rg = _grads(fn, inputs, True, W)
    theirs, their_rg = _torch_grads(torch_fn, inputs, W)
    assert our_rg == their_rg
    for a, b in zip(ours, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            assert rel_err(a, b) < 1e-12


def test_outputs_that_do_not_require_grad_stay_that_way():
    x = tg.Tensor(X.copy(), requires_grad=True)
    c = tg.Tensor(Y.copy())
    a, b = tg.checkpoint(lambda t, u: (t * 3.0, u.exp()), x, c)
    assert a.requires_grad and not b.requires_grad and b.is_leaf
    a.sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0))


def test_no_input_requires_grad_but_parameters_inside_do():
    """PyTorch's reentrant checkpoint silently drops these gradients; the non-reentrant one (and this
    one) gives the parameters their gradients."""
    tg.manual_seed(0)
    block = nn.Block(8, 2)
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float64)
    block.to(np.float64)
    block(tg.Tensor(x)).sum().backward()
    plain = {n: p.grad.copy() for n, p in block.named_parameters()}
    block.zero_grad()
    y = tg.checkpoint(block, tg.Tensor(x))
    assert y.requires_grad
    assert [e.op for e in y.tape()] == ["checkpoint"]
    assert "12 tensors" in repr(y.tape()[0])  # its parameters are inputs of the entry
    y.sum().backward()
    for n, p in block.named_parameters():
        np.testing.assert_array_equal(p.grad, plain[n], err_msg=n)


def test_a_tensor_from_a_closure_gets_its_gradient_through_the_outer_graph():
    x = tg.Tensor(X.copy(), requires_grad=True)
    h = x.exp()  # recorded outside, read inside
    y = tg.checkpoint(lambda t: t * h, tg.Tensor(Y.copy(), requires_grad=True))
    y.sum().backward()
    np.testing.assert_allclose(x.grad, Y * np.exp(X), rtol=1e-12)


def test_an_argument_also_read_from_the_closure_is_counted_once_per_use():
    x = tg.Tensor(X.copy(), requires_grad=True)
    y = tg.checkpoint(lambda t: t * x, x)  # x as the argument and from the closure: d(x²)/dx = 2x
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * X, rtol=1e-12)


def test_checkpoint_central_differences_in_float64():
    """A block through a checkpoint: the input gradient against central differences."""
    tg.manual_seed(1)
    block = nn.Block(8, 2).to(np.float64)
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((1, 3, 8))
    w = rng.standard_normal((1, 3, 8))

    def value(a):
        with tg.no_grad():
            return float((block(tg.Tensor(a)) * tg.Tensor(w)).sum().item())

    x = tg.Tensor(x0.copy(), requires_grad=True)
    (tg.checkpoint(block, x) * tg.Tensor(w)).sum().backward()
    eps, numeric = 1e-6, np.zeros_like(x0)
    for i in np.ndindex(x0.shape):
        up, down = x0.copy(), x0.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (value(up) - value(down)) / (2 * eps)
    assert rel_err(x.grad, numeric) < 1e-7


def test_second_backward_through_a_checkpoint_needs_retain_graph():
    x = tg.Tensor(X.copy(), requires_grad=True)
    y = tg.checkpoint(lambda t: t.exp(), x)
    y.sum().backward(retain_graph=True)
    y.sum().backward()  # replays again
    np.testing.assert_allclose(x.grad, 2 * np.exp(X), rtol=1e-12)
    with pytest.raises(RuntimeError, match=r"\[checkpoint\] a second time.*retain_graph"):
        y.sum().backward()


def test_checkpoint_name_and_inputs_on_the_tape():
    x = tg.Tensor(X.copy(), requires_grad=True, name="x")
    with tg.name_scope("blk"):
        y = tg.checkpoint(lambda t: t.exp(), x, name="seg")
    text = repr(y.tape()[0])
    assert text.startswith("blk.seg.checkpoint [checkpoint] (x [3] float64)")
    assert "saves input0 [3] float64" in text
