"""PyTorch's autograd contract on the shapes and dtypes users type: 0-d leaves, gradients in their leaf's dtype,
leaf gradients kept as PyTorch keeps them, custom Functions checked at the boundary."""

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import Function
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.backend import xp


def _micrograd(a, b):
    """micrograd's README example, with tanh where micrograd has relu (this engine's op set)."""
    c = a + b
    d = a * b + b ** 3
    c = c + c + 1
    c = c + 1 + c + (-a)
    d = d + d * 2 + (b + a).tanh()
    d = d + 3 * d + (b - a).tanh()
    e = c - d
    f = e ** 2
    g = f / 2.0
    return g + 10.0 / f


def test_micrograd_scalar_example_backpropagates_into_0d_leaves():
    a = tg.Tensor(np.array(-4.0), requires_grad=True)
    b = tg.Tensor(np.array(2.0), requires_grad=True)
    g = _micrograd(a, b)
    g.backward()
    assert isinstance(g.data, np.ndarray) and g.data.shape == ()
    for leaf in (a, b):
        assert isinstance(leaf.grad, np.ndarray) and leaf.grad.shape == () and leaf.grad.dtype == np.float64
    value = lambda x, y: _micrograd(tg.Tensor(np.array(x)), tg.Tensor(np.array(y))).item()  # noqa: E731
    h = 1e-6
    assert a.grad.item() == pytest.approx((value(-4 + h, 2) - value(-4 - h, 2)) / (2 * h), rel=1e-6)
    assert b.grad.item() == pytest.approx((value(-4, 2 + h) - value(-4, 2 - h)) / (2 * h), rel=1e-6)
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    ta = torch.tensor(-4.0, dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    tg_ = _micrograd(ta, tb)
    tg_.backward()
    assert g.item() == pytest.approx(tg_.item(), rel=1e-12)
    assert a.grad.item() == pytest.approx(ta.grad.item(), rel=1e-12)
    assert b.grad.item() == pytest.approx(tb.grad.item(), rel=1e-12)


def test_the_tanh_example_of_the_issue():
    a = tg.Tensor(np.array(-4.0), requires_grad=True)
    b = tg.Tensor(np.array(2.0), requires_grad=True)
    ((a * b + b ** 3) * (a + b)).tanh().backward()
    assert a.grad is not None and b.grad is not None and a.grad.shape == ()


def test_0d_outputs_and_saves_are_arrays_the_ledger_counts():
    x = tg.Tensor(np.array(0.5), requires_grad=True)
    with tg.Ledger() as led:
        y = x.exp()  # exp saves its output: a 0-d float64 array of 8 bytes
        assert isinstance(y.data, np.ndarray)
        assert y.tape()[0].ctx.saved["out"] is y.data
        assert y.tape().saved_bytes() == 8
        assert led.live_bytes("activation") == 8


def test_gradients_take_their_leafs_dtype():
    h = tg.Tensor(np.ones(3, np.float16), requires_grad=True)
    d = tg.Tensor(np.full(3, 2.0), requires_grad=True)  # float64
    (h * d).sum().backward()
    assert h.grad.dtype == np.float16 and d.grad.dtype == np.float64
    np.testing.assert_array_equal(h.grad, np.full(3, 2, np.float16))

    w = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    ints = tg.Tensor(np.arange(3))  # int64, needs no grad
    (ints * w).sum().backward()
    assert w.grad.dtype == np.float32
    np.testing.assert_array_equal(w.grad, [0, 1, 2])


def test_a_seed_gradient_takes_its_outputs_dtype():
    x = tg.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    y = x * 3.0
    y.backward(np.ones(y.shape))  # float64 seed for a float32 graph
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 3.0, np.float32))


def test_the_first_gradient_is_never_the_callers_array():
    x = tg.Tensor(np.zeros(3, np.float32), requires_grad=True)
    g = np.ones(3, np.float32)
    (x + 2).backward(g)
    g[:] = 5
    np.testing.assert_array_equal(x.grad, np.ones(3))


def test_later_backwards_add_into_grad_in_place():
    x = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    (x * 2.0).sum().backward()
    first = x.grad
    (x * 3.0).sum().backward()
    assert x.grad is first
    np.testing.assert_array_equal(first, np.full(3, 5.0))


def test_an_assigned_grad_is_added_into_as_pytorch_does():
    x = tg.Tensor(np.ones(2, np.float32), requires_grad=True)
    mine = np.full(2, 10.0, np.float32)
    x.grad = mine
    (x * 2.0).sum().backward()
    assert x.grad is mine
    np.testing.assert_array_equal(mine, [12.0, 12.0])


def test_one_gradient_for_two_leaves_is_not_shared():
    a = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    b = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    (a + b).backward(np.ones(3, np.float32))  # add hands one array to both inputs
    assert a.grad is not b.grad
    (a * 2.0).sum().backward()
    np.testing.assert_array_equal(b.grad, np.ones(3))
    np.testing.assert_array_equal(a.grad, np.full(3, 3.0))


def test_a_leaf_used_twice_accumulates_both_paths():
    x = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * x + x  # dy/dx = 2x + 1
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 5.0])


class _Shaped(Function):
    """A custom op whose backward returns whatever the test says."""

    @staticmethod
    def forward(ctx, x, grad=None):
        ctx.grad = grad
        return x * 1

    @staticmethod
    def backward(ctx, grad_out):
        return ctx.grad


def test_a_custom_function_returning_a_smaller_gradient_raises_naming_it():
    x = tg.Tensor(np.ones((5, 5)), requires_grad=True)
    y = _Shaped.apply(x, grad=np.ones((1, 5)))
    with pytest.raises(RuntimeError, match=r"_Shaped.backward .* invalid gradient at index 0: got \[1, 5\] but "
                                           r"expected shape compatible with \[5, 5\]"):
        y.sum().backward()


def test_a_custom_function_returning_a_broadcast_gradient_is_summed_down():
    x = tg.Tensor(np.ones((1, 5)), requires_grad=True)
    y = _Shaped.apply(x, grad=np.ones((3, 5)))
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, np.full((1, 5), 3.0))


def test_a_custom_function_gradient_is_cast_to_its_inputs_dtype():
    x = tg.Tensor(np.ones(4, np.float32), requires_grad=True)
    _Shaped.apply(x, grad=np.ones(4, np.float64)).sum().backward()
    assert x.grad.dtype == np.float32


def test_a_custom_function_returning_a_non_array_gradient_raises_naming_it():
    x = tg.Tensor(np.ones(4), requires_grad=True)
    with pytest.raises(TypeError, match=r"_Shaped.backward .* returned a str as the gradient of input 0"):
        _Shaped.apply(x, grad="oops").sum().backward()


class _TooMany(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, grad_out


def test_a_custom_function_returning_too_many_gradients_raises():
    x = tg.Tensor(np.ones(2), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"_TooMany.backward .* returned 2 gradient\(s\), expected 1"):
        _TooMany.apply(x).sum().backward()


class _WithCount(Function):
    """Returns its input doubled and a plain Python number, which passes through as in PyTorch."""

    @staticmethod
    def forward(ctx, x):
        return x * 2, 3

    @staticmethod
    def backward(ctx, grad_out, grad_count):
        assert grad_count is None
        return grad_out * 2


def test_non_array_outputs_pass_through():
    x = tg.Tensor(np.ones(2), requires_grad=True)
    y, count = _WithCount.apply(x)
    assert count == 3 and isinstance(y, tg.Tensor)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


def test_0d_gradients_of_a_custom_function_are_arrays():
    x = tg.Tensor(np.array(3.0), requires_grad=True)
    _Shaped.apply(x, grad=np.float64(2.0)).backward()
    assert isinstance(x.grad, np.ndarray) and x.grad.shape == () and x.grad == 2.0


def test_the_engine_works_after_a_bad_custom_backward():
    x = tg.Tensor(np.ones((5, 5)), requires_grad=True)
    with pytest.raises(RuntimeError):
        _Shaped.apply(x, grad=np.ones((1, 5))).sum().backward()
    (F.gelu(x) * 2.0).sum().backward()
    assert x.grad.shape == (5, 5)
    assert xp() is np
