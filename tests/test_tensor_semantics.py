"""Tensors behave as a NumPy or PyTorch user expects (issue 27, point 5): comparisons, hashing, NumPy arrays on the
left, lists, Tensor(tensor), axes, pow, view, in-place changes through views, integers in float ops, dtype promotion,
and grad mode in generators and coroutines. Every refused call leaves the engine as it was.

Expected values come from NumPy on the raw arrays or from PyTorch (when installed), never from the engine."""

from __future__ import annotations

import asyncio
import gc
import re
import warnings

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import state

try:
    import torch
except ImportError:
    torch = None


def leaf(*shape, dtype=np.float64, seed=0):
    return tg.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), requires_grad=True)


# ---- comparisons ------------------------------------------------------------------------------------------------
COMPARISONS = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
               ">=": np.greater_equal}


def _compare(a, b, op):
    return {"==": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, "<=": lambda: a <= b,
            ">": lambda: a > b, ">=": lambda: a >= b}[op]()


@pytest.mark.parametrize("op", list(COMPARISONS))
def test_comparisons_are_elementwise_bool_tensors_off_the_graph(op):
    x = tg.Tensor(np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]]), requires_grad=True)
    y = tg.Tensor(np.array([1.0, 1.0, 1.0]), requires_grad=True)
    for other, raw in ((y, y.data), (1.0, 1.0), (np.array([0.0, 2.0, 1.0]), np.array([0.0, 2.0, 1.0]))):
        out = _compare(x, other, op)
        assert isinstance(out, tg.Tensor) and out.dtype == np.bool_ and out.shape == (2, 3)
        np.testing.assert_array_equal(out.numpy(), COMPARISONS[op](x.data, raw))
        assert not out.requires_grad and out.is_leaf and len(out.tape()) == 0
    flipped = _compare(np.array([0.0, 2.0, 1.0]), x, op)  # a NumPy array on the left: Python asks the Tensor
    assert isinstance(flipped, tg.Tensor)
    np.testing.assert_array_equal(flipped.numpy(), COMPARISONS[op](np.array([0.0, 2.0, 1.0]), x.data))


def test_comparisons_broadcast_or_name_the_shapes():
    x, y = leaf(2, 3), leaf(4, 3)
    with pytest.raises(ValueError, match=r"eq: shapes \[2, 3\] and \[4, 3\] cannot be broadcast"):
        _ = x == y
    with pytest.raises(ValueError, match=r"lt: shapes \[2, 3\] and \[4, 3\]"):
        _ = x < y


def test_comparing_with_other_objects_follows_python_as_pytorch_does():
    x = leaf(3)
    assert (x == None) is False and (x != None) is True  # noqa: E711  (what `in` and `==` on mixed lists do)
    assert (x == "word") is False and (x == [1.0, 2.0, 3.0]) is False
    with pytest.raises(TypeError, match="not supported"):
        _ = x < None
    if torch is not None:
        t = torch.ones(3)
        assert (t == None) is False and (t == [1.0, 1.0, 1.0]) is False  # noqa: E711


def test_tensors_hash_by_identity_so_sets_and_dicts_keep_them_apart():
    a, b = tg.Tensor(np.ones(3)), tg.Tensor(np.ones(3))
    assert hash(a) == object.__hash__(a) and hash(a) != hash(b)
    assert len({a, b}) == 2 and {a: 1, b: 2}[a] == 1
    assert a in {a} and b not in {a}  # set membership: hash first, then identity


def test_membership_and_index_compare_identity_first_then_values_as_in_pytorch():
    a, b = tg.Tensor(np.ones(3)), tg.Tensor(np.ones(3))
    assert a in [a] and [b, a].index(b) == 0  # identity answers before == is asked
    with pytest.raises(RuntimeError, match=r"Boolean value of a Tensor of shape \[3\].*ambiguous.*is x"):
        _ = a in [b]  # a == b is a tensor of three bools: ambiguous, as in PyTorch
    with pytest.raises(RuntimeError, match="ambiguous"):
        [b, a].index(a)
    one, other = tg.Tensor(np.array([2.0])), tg.Tensor(np.array([2.0]))
    assert one in [other]  # one element: its value decides, as in PyTorch
    if torch is not None:
        with pytest.raises(RuntimeError, match="ambiguous"):
            _ = torch.ones(3) in [torch.ones(3)]


def test_bool_of_a_tensor_is_its_one_value():
    assert bool(tg.Tensor(np.array(1.5))) and not bool(tg.Tensor(np.array([0.0])))
    assert bool(tg.Tensor(np.array([[True]])))
    for shape in ((2,), (0,), (1, 2)):
        with pytest.raises(RuntimeError, match=re.escape(f"Boolean value of a Tensor of shape {list(shape)}")):
            bool(tg.Tensor(np.zeros(shape)))


def test_len_and_iteration_of_a_0d_tensor_raise_as_in_pytorch():
    t = tg.Tensor(np.array(2.0))
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(t)
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(t)
    rows = list(tg.Tensor(np.arange(6.0).reshape(3, 2)))
    assert len(rows) == 3 and all(r.shape == (2,) for r in rows)
    np.testing.assert_array_equal(rows[2].numpy(), [4.0, 5.0])


# ---- NumPy arrays on the left, lists, Tensor(tensor) ----------------------------------------------------------
@pytest.mark.parametrize("op", ["+", "-", "*", "/", "@"])
def test_a_numpy_array_on_the_left_defers_to_the_tensor(op):
    x = leaf(3, 3)
    arr = np.random.default_rng(1).uniform(1.0, 2.0, (3, 3))
    out = {"+": lambda: arr + x, "-": lambda: arr - x, "*": lambda: arr * x, "/": lambda: arr / x,
           "@": lambda: arr @ x}[op]()
    assert isinstance(out, tg.Tensor) and out.requires_grad and not out.is_leaf
    expected = {"+": arr + x.data, "-": arr - x.data, "*": arr * x.data, "/": arr / x.data, "@": arr @ x.data}[op]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (3, 3) and np.isfinite(x.grad).all()
    if torch is not None:
        tx = torch.tensor(x.data, requires_grad=True)
        ta = torch.from_numpy(arr)
        {"+": lambda: ta + tx, "-": lambda: ta - tx, "*": lambda: ta * tx, "/": lambda: ta / tx,
         "@": lambda: ta @ tx}[op]().sum().backward()
        np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12)


def test_numpy_scalars_on_either_side_are_numbers():
    x = leaf(3, dtype=np.float32)
    for out in (np.float64(2.0) * x, x * np.float32(2.0), np.int64(2) + x, x - np.float16(1.0)):
        assert isinstance(out, tg.Tensor) and out.dtype == np.float32 and out.requires_grad


def test_numpy_functions_see_the_values_but_ufuncs_refuse_a_tensor():
    x = leaf(2, 3)
    np.testing.assert_array_equal(np.asarray(x), x.data)
    assert np.array(x, dtype=np.float32).dtype == np.float32
    with pytest.raises(TypeError):
        np.exp(x)  # ufuncs would cut the graph: use x.exp()


@pytest.mark.parametrize("call", [lambda x: x + [1.0, 2.0, 3.0], lambda x: [1.0, 2.0, 3.0] + x,
                                  lambda x: x * (1.0, 2.0, 3.0), lambda x: (1.0, 2.0, 3.0) - x,
                                  lambda x: x / [2.0], lambda x: x @ [[1.0], [2.0], [3.0]], lambda x: x + "1"],
                         ids=["add", "radd", "mul_tuple", "rsub_tuple", "div", "matmul", "str"])
def test_a_list_operand_is_refused_as_pytorch_does_naming_the_op_and_the_fix(call):
    x = leaf(3)
    with pytest.raises(TypeError, match=r"(add|sub|mul|div|matmul): cannot combine a Tensor with a (list|tuple|str).*"
                                        r"tg\.Tensor\(np\.array"):
        call(x)
    if torch is not None:
        with pytest.raises(TypeError):
            call(torch.ones(3))


def test_tensor_of_a_tensor_says_what_to_do():
    x = leaf(3)
    for make in (tg.Tensor, tg.Parameter):
        with pytest.raises(TypeError, match=r"Tensor\(data\): data is already a Tensor \(\[3\] float64\).*detach.*"
                                            r"numpy\(\)\.copy\(\)"):
            make(x)
    copy = tg.Tensor(x.numpy().copy())
    assert not np.shares_memory(copy.data, x.data) and (copy.numpy() == x.numpy()).all()


# ---- axes ---------------------------------------------------------------------------------------------------------
AXIS_CALLS = {
    "softmax": lambda x: F.softmax(x, axis=3), "log_softmax": lambda x: F.log_softmax(x, axis=-4),
    "swapaxes": lambda x: x.swapaxes(0, 3), "transpose": lambda x: x.transpose(-4, 0), "sum": lambda x: x.sum(axis=3),
    "mean": lambda x: x.mean(axis=(0, 3)), "max": lambda x: x.max(axis=-4), "split": lambda x: x.split(1, dim=3),
    "permute": lambda x: x.permute(0, 1, 5),
}


@pytest.mark.parametrize("op", list(AXIS_CALLS))
def test_axes_are_checked_wherever_they_are_taken(op):
    x = leaf(2, 3, 4)
    axis = {"softmax": 3, "log_softmax": -4, "swapaxes": 3, "transpose": -4, "sum": 3, "mean": 3, "max": -4,
            "split": 3, "permute": 5}[op]
    named = "swapaxes" if op == "transpose" else op  # transpose(a, b) swaps two axes
    with pytest.raises(IndexError, match=rf"{named}: axis {axis} is out of range for a tensor of shape \[2, 3, 4\] "
                                         r"\(3 dimensions: axes -3 to 2\)"):
        AXIS_CALLS[op](x)
    with pytest.raises(ValueError):  # also a ValueError, as NumPy's AxisError is
        AXIS_CALLS[op](x)
    if torch is not None and op not in ("log_softmax",):
        tx = torch.zeros(2, 3, 4)
        with pytest.raises((IndexError, RuntimeError)):
            {"softmax": lambda: tx.softmax(3), "swapaxes": lambda: tx.swapaxes(0, 3),
             "transpose": lambda: tx.transpose(-4, 0), "sum": lambda: tx.sum(3), "mean": lambda: tx.mean((0, 3)),
             "max": lambda: tx.amax(-4),
             "split": lambda: tx.split(1, dim=3), "permute": lambda: tx.permute(0, 1, 5)}[op]()


def test_permute_refuses_repeats_and_the_wrong_count():
    x = leaf(2, 3, 4)
    with pytest.raises(ValueError, match=r"permute: \[0, 0, 1\] is not a permutation .*\[2, 3, 4\]"):
        x.permute(0, -3, 1)
    with pytest.raises(ValueError, match=r"permute: \[0, 1\] does not name each axis .*\[2, 3, 4\] once"):
        x.permute(0, 1)
    with pytest.raises(TypeError, match=r"sum: axis must be an int, got 1\.5"):
        x.sum(axis=1.5)
    with pytest.raises(ValueError, match=r"sum: axis \(1, -2\) names an axis twice"):
        x.sum(axis=(1, -2))


def test_0d_tensors_have_one_axis_as_in_pytorch():
    x = tg.Tensor(np.array(0.7), requires_grad=True)
    assert F.softmax(x, axis=-1).item() == 1.0 and F.log_softmax(x, axis=0).item() == 0.0
    for out in (x.sum(axis=0), x.mean(axis=-1, keepdims=True), x.max(axis=0), x.swapaxes(0, -1), x.transpose()):
        assert out.shape == () and out.item() == 0.7
    with pytest.raises(IndexError, match=r"sum: axis 1 is out of range for a tensor of shape \[\]"):
        x.sum(axis=1)
    (F.softmax(x, axis=-1) + x.max(axis=0) * 2.0).backward()
    assert x.grad.shape == () and x.grad.item() == 2.0  # softmax of one value is constant: its gradient is 0


# ---- pow ----------------------------------------------------------------------------------------------------------
def test_x_to_the_0_has_gradient_0_at_0_as_in_pytorch():
    x = tg.Tensor(np.array([0.0, 1.5, -2.0]), requires_grad=True)
    y = x ** 0
    np.testing.assert_array_equal(y.numpy(), [1.0, 1.0, 1.0])
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.0])
    assert y.tape()[0].ctx.saved == {}  # nothing to save for a constant


@pytest.mark.skipif(torch is None, reason=TORCH_MISSING)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 0 ** -1: inf, as in PyTorch
@pytest.mark.parametrize("p", [0, 1, 2, 3, 0.5, -1, 2.5, -0.5])
def test_pow_at_the_edges_matches_pytorch(p):
    values = np.array([0.0, 1.0, -2.0, 0.5, 3.0])  # (not -0.0: PyTorch's -0.0 ** -0.5 is -inf, IEEE's +inf)
    x = tg.Tensor(values, requires_grad=True)
    (x ** p).sum().backward()
    tx = torch.tensor(values, requires_grad=True)
    (tx ** p).sum().backward()
    np.testing.assert_allclose((x ** p).numpy(), (tx ** p).detach().numpy(), rtol=1e-15, equal_nan=True)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-15, equal_nan=True)


def test_integers_to_negative_integer_powers_are_refused():
    with pytest.raises(ValueError, match=r"pow: integers to negative integer powers .*int64 \*\* -1"):
        _ = tg.Tensor(np.arange(3)) ** -1


# ---- view and reshape ---------------------------------------------------------------------------------------------
def test_view_of_a_non_contiguous_tensor_raises_as_pytorch_and_reshape_copies():
    x = leaf(2, 3)
    t = x.T  # [3, 2], a transposed view
    with pytest.raises(RuntimeError, match=r"view size is not compatible with input tensor's size and stride.*"
                                           r"Use \.reshape\(\.\.\.\) instead"):
        t.view(6)
    flat = t.reshape(6)
    assert not np.shares_memory(flat.data, x.data)
    np.testing.assert_array_equal(flat.numpy(), x.data.T.reshape(6))
    v = x.view(3, 2)
    assert np.shares_memory(v.data, x.data) and v.tape()[-1].op == "view"
    assert np.shares_memory(t.view(3, 1, 2).data, x.data)  # a new axis of size 1 needs no copy
    if torch is not None:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            torch.zeros(2, 3).T.view(6)


# ---- in-place changes through views --------------------------------------------------------------------------------
IN_PLACE = {"add_": lambda v: v.add_(1.0), "sub_": lambda v: v.sub_(1.0), "mul_": lambda v: v.mul_(2.0),
            "copy_": lambda v: v.copy_(tg.Tensor(np.zeros(2))), "zero_": lambda v: v.zero_()}


@pytest.mark.parametrize("method", list(IN_PLACE))
def test_an_in_place_change_through_an_old_view_of_a_leaf_that_requires_grad_raises(method):
    x = tg.Tensor(np.arange(3.0), name="x")
    early = x[:2]  # taken before requires_grad was set
    x.requires_grad_()
    with tg.no_grad():
        quiet = x[1:]  # taken under no_grad
    for view in (early, quiet):
        with pytest.raises(RuntimeError, match=rf"{method}: a view of a leaf Variable that requires grad is being used "
                                               r"in an in-place operation.*'x' \[3\]"):
            IN_PLACE[method](view)
    np.testing.assert_array_equal(x.data, [0.0, 1.0, 2.0])  # refused: nothing changed
    assert x._version == 0
    with tg.no_grad():  # as an optimizer changes a parameter: allowed, and the leaf sees it
        IN_PLACE[method](early)
    assert x._version == 1
    if torch is not None:
        tx = torch.arange(3.0)
        tv = tx[:2]
        tx.requires_grad_()
        with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an "
                                               "in-place operation"):
            {"add_": lambda: tv.add_(1.0), "sub_": lambda: tv.sub_(1.0), "mul_": lambda: tv.mul_(2.0),
             "copy_": lambda: tv.copy_(torch.zeros(2)), "zero_": lambda: tv.zero_()}[method]()


def test_a_detached_tensor_may_change_its_leaf_as_in_pytorch():
    x = leaf(3)
    y = x.exp()  # saves its output, not x
    z = x * 2.0  # saves nothing
    x.detach().add_(1.0)  # the same array, not a view: allowed (PyTorch allows it too)
    assert x._version == 1
    (y.sum() + z.sum()).backward()  # neither saved x itself
    w = x * x
    x.detach().mul_(0.5)
    with pytest.raises(RuntimeError, match="changed in place"):
        w.sum().backward()


# ---- integers and mixed dtypes, as PyTorch promotes -------------------------------------------------------------
def test_exp_log_tanh_of_integers_are_float32_as_in_pytorch():
    ints = np.array([1, 2, 3])
    for name, fn in (("exp", np.exp), ("log", np.log), ("tanh", np.tanh)):
        out = getattr(tg.Tensor(ints), name)()
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.numpy(), fn(ints.astype(np.float32)), rtol=1e-6)
        if torch is not None:
            assert str(getattr(torch.tensor(ints), name)().dtype) == "torch.float32"


@pytest.mark.parametrize("name, call", [
    ("gelu", lambda x: F.gelu(x)), ("softmax", lambda x: F.softmax(x)), ("log_softmax", lambda x: F.log_softmax(x)),
    ("layer_norm", lambda x: F.layer_norm(x, tg.Tensor(np.ones(3)), tg.Tensor(np.zeros(3)))),
    ("cross_entropy", lambda x: F.cross_entropy(x, np.array([0, 1]))), ("mean", lambda x: x.mean()),
    ("dropout", lambda x: F.dropout(x, 0.5))])
def test_float_only_ops_refuse_integers_naming_the_op_and_dtype(name, call):
    with pytest.raises(TypeError, match=rf"{name}: needs floating-point input, got dtype int64 \(shape \[2, 3\]\)"):
        call(tg.Tensor(np.arange(6).reshape(2, 3)))


def test_mixed_dtypes_promote_as_pytorch():
    w = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    assert (tg.Tensor(np.arange(3)) * w).dtype == np.float32  # NumPy alone: float64
    assert (tg.Tensor(np.arange(3)) / tg.Tensor(np.arange(1, 4))).dtype == np.float32
    assert (tg.Tensor(np.ones(3, bool)) + w).dtype == np.float32
    h = tg.Tensor(np.ones(3, np.float16), requires_grad=True)
    s = tg.Tensor(np.array(2.0), requires_grad=True)  # 0-d float64: a dimensioned float16 decides, as in PyTorch
    out = h * s
    assert out.dtype == np.float16
    out.sum().backward()
    assert s.grad.dtype == np.float64 and s.grad.item() == 3.0 and h.grad.dtype == np.float16
    assert (h * tg.Tensor(np.ones(3))).dtype == np.float64  # both dimensioned: the wider


def test_to_changes_the_dtype_on_the_graph():
    x = leaf(3, dtype=np.float32)
    assert x.to(np.float32) is x
    y = x.to(np.float64)
    assert y.dtype == np.float64 and y.requires_grad
    (y * 3.0).sum().backward()
    assert x.grad.dtype == np.float32 and (x.grad == 3.0).all()
    assert not x.to(np.int64).requires_grad


def test_products_of_two_dtypes_are_refused_as_in_pytorch():
    with pytest.raises(TypeError, match=r"matmul: operands \[2, 3\] float32 and \[3, 2\] float64 must have one dtype"):
        _ = leaf(2, 3, dtype=np.float32) @ leaf(3, 2)
    with pytest.raises(TypeError, match=r"linear: operands .* must have one dtype"):
        F.linear(leaf(2, 3, dtype=np.float32), leaf(4, 3))


def test_subtracting_bools_is_refused_as_in_pytorch():
    mask = tg.Tensor(np.array([True, False]))
    for call in (lambda: mask - mask, lambda: 1.0 - mask, lambda: leaf(2) - mask, lambda: leaf(2) - True):
        with pytest.raises(TypeError, match="sub: cannot subtract with a bool operand"):
            call()


# ---- detach shares the version counter ------------------------------------------------------------------------------
def test_a_change_through_detach_is_caught_in_backward_as_pytorchs():
    x = leaf(3)
    for which in ("leaf", "output"):  # a leaf's data (saved by the product), an op's output (saved by exp)
        y = x.exp()
        z = (y * x).exp()
        saved = x if which == "leaf" else y
        d = saved.detach()
        before = saved._version
        d.mul_(2.0)
        assert d._version == saved._version == before + 1  # one counter for the tensor and its detach()
        with pytest.raises(RuntimeError, match=r"saved .* changed in place afterwards .* Run backward\(\) before"):
            z.sum().backward()
        with tg.no_grad():
            d.mul_(0.5)


# ---- contiguous -----------------------------------------------------------------------------------------------------
def test_contiguous_makes_a_permuted_tensor_viewable_as_pytorchs_and_keeps_a_laid_out_one():
    x = leaf(2, 3, 4)
    flat = x.permute(2, 0, 1).contiguous().view(-1)  # nanoGPT's y.transpose(1, 2).contiguous().view(B, T, C)
    np.testing.assert_array_equal(flat.numpy(), x.data.transpose(2, 0, 1).reshape(-1))
    (flat * np.arange(24.0)).sum().backward()
    np.testing.assert_array_equal(x.grad, np.arange(24.0).reshape(4, 2, 3).transpose(1, 2, 0))
    assert x.contiguous() is x and x[:, 1:2].contiguous() is not x
    tg.use_backend("meta")
    try:
        m = tg.Tensor(np.zeros((2, 3), np.float32)).T.contiguous().view(6)
        assert m.shape == (6,)
    finally:
        tg.use_backend("numpy")


# ---- .grad of a tensor an op made ------------------------------------------------------------------------------------
def test_reading_grad_of_a_non_leaf_warns_as_pytorch_and_a_leafs_is_quiet():
    x = leaf(3)
    h = x * 2.0
    words = (r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed "
             r".*'tensor' \[3\] was made by 'scale'.*h = h\.detach\(\)\.requires_grad_\(\)")
    with pytest.warns(UserWarning, match=words):
        assert h.grad is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert x.grad is None  # a leaf: quiet
        h.sum().backward()
        assert x.grad is not None
        with tg.Ledger():  # a Ledger entered now reads every live tensor's gradient without a word
            pass


# ---- grad mode as a bare decorator ----------------------------------------------------------------------------------
def test_no_grad_and_enable_grad_decorate_with_or_without_parentheses_as_pytorchs():
    @tg.no_grad
    def quiet():
        return tg.is_grad_enabled()

    @tg.enable_grad
    def loud():
        return tg.is_grad_enabled()

    assert quiet.__name__ == "quiet" and quiet() is False and tg.is_grad_enabled()
    with tg.no_grad():
        assert loud() is True and not tg.is_grad_enabled()
    with pytest.raises(TypeError, match=r"no_grad: takes no argument .* got False; .* tg.set_grad_enabled\(flag\)"):
        tg.no_grad(False)
    assert tg.is_grad_enabled()


# ---- grad mode in generators and coroutines -------------------------------------------------------------------------
def test_no_grad_on_a_generator_holds_inside_each_resumption_only():
    @tg.no_grad()
    def gen():
        got = yield tg.is_grad_enabled()
        while got is not None:
            got = yield (tg.is_grad_enabled(), got)
        return "done"

    steps = gen()
    assert tg.is_grad_enabled()
    assert next(steps) is False
    assert tg.is_grad_enabled()  # the caller's mode between resumptions
    assert steps.send(5) == (False, 5)
    assert tg.is_grad_enabled()
    with pytest.raises(StopIteration) as stop:
        steps.send(None)
    assert stop.value.value == "done" and tg.is_grad_enabled()


def test_a_decorated_generator_records_nothing_and_sees_thrown_exceptions_inside_its_mode():
    x = leaf(3)

    @tg.no_grad()
    def doubled(t):
        try:
            while True:
                t = t * 2.0
                yield t
        except KeyError:
            yield tg.is_grad_enabled()

    steps = doubled(x)
    assert not next(steps).requires_grad
    assert steps.throw(KeyError()) is False
    steps.close()
    assert tg.is_grad_enabled()

    @tg.enable_grad()
    def recording(t):
        yield t * 2.0

    with tg.no_grad():
        assert next(recording(x)).requires_grad


def test_no_grad_on_a_coroutine_holds_across_awaits_and_not_outside():
    seen = []

    @tg.no_grad()
    async def quiet():
        for _ in range(3):
            seen.append(("quiet", tg.is_grad_enabled()))
            await asyncio.sleep(0)
        return "quiet done"

    @tg.enable_grad()
    async def loud():
        for _ in range(3):
            seen.append(("loud", tg.is_grad_enabled()))
            await asyncio.sleep(0)

    async def main():
        with tg.no_grad():
            return await asyncio.gather(quiet(), loud())

    assert asyncio.run(main())[0] == "quiet done"
    assert {("quiet", False), ("loud", True)} == set(seen) and len(seen) == 6
    assert tg.is_grad_enabled()


def test_a_decorated_function_keeps_its_name_and_value():
    @tg.no_grad()
    def double(t):
        """Doubles."""
        return t * 2.0

    out = double(leaf(2))
    assert not out.requires_grad and double.__name__ == "double" and double.__doc__ == "Doubles."
    assert tg.is_grad_enabled()


def test_set_grad_enabled_as_a_call_a_block_and_a_decorator():
    assert tg.is_grad_enabled()
    tg.set_grad_enabled(False)
    try:
        assert not tg.is_grad_enabled() and not (leaf(2) * 2.0).requires_grad
        with tg.set_grad_enabled(True):
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
    finally:
        tg.set_grad_enabled(True)
    assert tg.is_grad_enabled()

    @tg.set_grad_enabled(False)
    def quiet():
        return tg.is_grad_enabled()

    assert tg.is_grad_enabled()  # decorating changes nothing until the function runs
    assert quiet() is False and tg.is_grad_enabled()
    if torch is not None:
        with torch.set_grad_enabled(False):
            assert not torch.is_grad_enabled()


def test_grad_mode_is_restored_after_an_error_and_a_reused_block_nests():
    with pytest.raises(ZeroDivisionError):
        with tg.no_grad():
            _ = 1 / 0
    assert tg.is_grad_enabled()
    block = tg.no_grad()
    with block:
        with tg.enable_grad():
            with block:
                assert not tg.is_grad_enabled()
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()


# ---- refused calls leave nothing behind ---------------------------------------------------------------------------
def test_refused_calls_leave_the_engine_as_it_was():
    x = tg.Tensor(np.arange(6.0).reshape(2, 3), name="x")
    early = x[0]
    x.requires_grad_()
    before = dict(vars(state.local))
    gc.collect()  # earlier tests' garbage freed now, not while the ledger below compares what is held
    refused = [lambda: x.permute(0, 1, 5), lambda: F.softmax(x, axis=2), lambda: x.T.view(6), lambda: x + [1, 2, 3],
               lambda: tg.Tensor(x), lambda: early.add_(1.0), lambda: x == x.T, lambda: F.gelu(tg.Tensor(np.arange(3))),
               lambda: x.sum(axis=(0, 0)), lambda: x @ x]
    with tg.Ledger() as led:
        live = led.live_bytes(untouched=True)  # all that is held (x.T runs before view refuses: x is used, not new)
        for call in refused:
            with pytest.raises((TypeError, ValueError, IndexError, RuntimeError)):
                call()
        gc.collect()
        assert led.live_bytes(untouched=True) == live
    assert dict(vars(state.local)) == before
    np.testing.assert_array_equal(x.data, np.arange(6.0).reshape(2, 3))
    (F.softmax(x, axis=1) * tg.Tensor(np.arange(6.0).reshape(2, 3))).sum().backward()
    assert x.grad.shape == (2, 3) and np.isfinite(x.grad).all()
