"""One table of every public op and Tensor method, checked against PyTorch: this engine's OpInfo (in the
spirit of PyTorch's OpInfo and tinygrad's helper_test_op).

A `Row` says how to call an op here (`ours`) and in PyTorch (`theirs`), and draws its arguments with
hypothesis (`args`): shapes that are 0-d, one element, empty, broadcast against each other, laid out
non-contiguously (a transposed or a strided view), and the axes, sizes and constants the op takes, now
and then out of range or not fitting: where PyTorch raises, this engine must raise too. Each row runs

  * in float64 against PyTorch: forward values and the gradients of sum(out * w) for a random w (a plain
    sum hides transposes and broadcasts), over hypothesis' draws, which must include every edge case the
    row allows (`edges`);
  * in float16 and float32, and in the dtype mixes PyTorch promotes (float16 * float64, int64 * float32,
    bool, ...): the result has PyTorch's dtype, values and gradients agree to that dtype's rounding, and
    each gradient has its leaf's dtype;
  * in float64 against central differences of our own forward (no PyTorch needed).

`test_every_op_has_a_row` fails when an op has none: a Function in tinygrad_ckpt.ops, a function of
`functional`, or a Tensor method or operator. Each row's fixed `examples` also run on every backend in
test_ops.py (finite differences, float32 kept, float16 runs).
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import ops
from tinygrad_ckpt.checks import BFLOAT16
from tinygrad_ckpt.engine.function import Function

try:
    import torch
except ImportError:  # the torch comparisons skip; central differences and completeness still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason=TORCH_MISSING)

f16, f32, f64, i32, i64, b8 = np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_
INTS = [(i64,), (b8,)]  # an integer and a bool tensor in a one-input op
BINARY_MIXES = [(f16, f64), (f64, f16), (f16, f32), (i64, f32), (f32, i64), (i32, f16), (b8, f32), (f32, b8),
                (i64, i64), (i32, i64), (b8, b8), (b8, i64)]
TOL = {f64: 1e-10, f32: 2e-5, f16: 2e-2}  # of the largest magnitude (or 1), per dtype compared
EDGES = frozenset({"0-d", "1-element", "empty", "non-contiguous"})
LAYOUTS = ("contiguous", "transposed", "strided", "strided")  # strided: any shape of 2 or more elements
SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


@dataclass
class Row:
    """One op. `ours(*tensors, **consts)` and `theirs(torch, *tensors, **consts)` return a tensor or a tuple of them;
    `args(draw)` returns (input shapes, consts); `examples` are fixed (shapes, consts). `covers`: the Tensor methods
    and functional functions the row calls. `domain`: normal, positive (0.5 to 2), zeros (some exactly 0) or ties
    (-1, 0 or 1). `mixes`: dtype combinations run besides the all-float16 and all-float32 ones. `grad=False`: inputs
    never require grad (in-place methods); `inplace`: the op writes its first input; `constants`: inputs read as
    plain arrays (an array on the left of an operator)."""

    name: str
    ours: Callable
    theirs: Callable | None
    args: Callable
    examples: list
    covers: tuple = ()
    domain: str = "normal"
    mixes: list = field(default_factory=list)
    floats: bool = True
    grad: bool = True
    inplace: bool = False
    edges: frozenset = EDGES
    constants: tuple = ()  # inputs the op reads as plain arrays (no gradient reaches them)

    def __repr__(self) -> str:
        return self.name

    def dtype_cases(self) -> list:
        n = len(self.examples[0][0])
        return ([(f16,) * n, (f32,) * n] if self.floats and n else []) + list(self.mixes)


# ---- drawing arguments --------------------------------------------------------------------------------------------
EDGE_SHAPES = [(), (1,), (0,), (1, 1), (2, 0), (4,), (2, 3), (3, 1, 2)]
EDGE_PAIRS = [((), ()), ((), (2, 3)), ((3, 1), ()), ((1,), (0,)), ((2, 1), (1, 3)), ((3,), (2, 3)), ((2, 3), (2, 3)),
              ((2,), (3,))]  # the last two do not broadcast: both must raise


def shape(d, min_dims=0, max_dims=3, min_side=0):
    edges = [s for s in EDGE_SHAPES if min_dims <= len(s) <= max_dims and all(n >= min_side for n in s)]
    return d(st.one_of(st.sampled_from(edges), hnp.array_shapes(min_dims=min_dims, max_dims=max_dims,
                                                                min_side=min_side, max_side=3)))


def pair(d):
    """Two shapes that broadcast together (and now and then two that do not)."""
    drawn = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=0, max_side=3)
    return list(d(st.one_of(st.sampled_from(EDGE_PAIRS), drawn.map(lambda b: b.input_shapes))))


def axis(d, shape):
    """An axis of `shape` (a 0-d tensor has one, -1 or 0), now and then one out of range."""
    n = max(len(shape), 1)
    return d(st.sampled_from(list(range(-n, n)) * 3 + [n, -n - 1]))


def unary(d):
    return [shape(d)], {}


def with_axis(d):
    s = shape(d)
    return [s], {"axis": axis(d, s)}


def reduction(d, tuples=True):
    s = shape(d)
    n = max(len(s), 1)
    choices = [st.none(), st.just("int")] + ([st.lists(st.integers(-n, n - 1), min_size=1, max_size=2)] if tuples
                                            else [])
    picked = d(st.one_of(*choices))
    picked = axis(d, s) if picked == "int" else tuple(picked) if isinstance(picked, list) else picked
    return [s], {"axis": picked, "keepdims": d(st.booleans())}


def _dims(axis, a):
    return tuple(range(a.ndim)) if axis is None else axis


def reshaped(d):
    """A shape and another with as many elements (maybe with one -1), in either argument form, of the input or of its
    transpose (which view refuses where the layout would need a copy)."""
    s = shape(d)
    n = math.prod(s)
    targets = [t for k in range(4) for t in np.ndindex(*(7,) * k) if math.prod(t) == n]
    target = list(d(st.sampled_from(targets)))
    if target and n and d(st.booleans()):
        target[d(st.integers(0, len(target) - 1))] = -1
    return [s], {"target": tuple(target), "packed": d(st.booleans()), "transposed": d(st.booleans())}


def _reshape(a, target, packed, transposed, method="reshape"):
    a = a.transpose() if transposed else a
    return getattr(a, method)(target) if packed else getattr(a, method)(*target)


def _torch_reshape(t, a, target, packed, transposed, method="reshape"):
    a = a.permute(tuple(reversed(range(a.ndim)))) if transposed else a
    return getattr(a, method)(target)


def permutation(d):
    s = shape(d)
    order = [a - len(s) if d(st.booleans()) else a for a in d(st.permutations(range(len(s))))]
    broken = d(st.sampled_from(["none"] * 6 + ["out of range", "repeated", "short"]))
    if broken == "out of range":  # permute(0, 1, 5) of a 3-d tensor (5 % 3 would be a permutation)
        order = order[:-1] + [len(s) + 2] if order else [0]
    elif broken == "repeated" and order:
        order[-1] = order[0] if len(order) > 1 else order[0] + 1
    elif broken == "short" and order:
        order = order[:-1]
    return [s], {"order": tuple(order), "packed": d(st.booleans())}


def two_axes(d):
    s = shape(d)
    return [s], {"axis1": axis(d, s), "axis2": axis(d, s)}


def basic_index(d):
    s = shape(d)
    parts = []
    for n in s[:d(st.integers(0, len(s)))]:
        kind = d(st.sampled_from(["int", "slice", "new", "all"]))
        if kind == "int":
            parts.append(d(st.sampled_from(list(range(-n, n)) + [n, -n - 1] * 2)))  # n and -n-1 are out of range
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-n - 1, n + 1))
            parts.append(slice(d(bound), d(bound), d(st.one_of(st.none(), st.integers(1, 3)))))
        else:
            parts.append(None if kind == "new" else slice(None))
    if d(st.booleans()):
        parts.insert(d(st.integers(0, len(parts))), Ellipsis)
    return [s], {"index": tuple(parts)}


def array_index(d):
    s = shape(d, min_dims=1)
    k = d(st.integers(0, len(s) - 1))
    n = s[k]
    top = n if math.prod(s) else n - 1  # n is out of range (PyTorch checks no index into an empty tensor)
    ids = d(hnp.arrays(np.int64, shape(d, max_dims=2), elements=st.integers(-n, top) if n else st.just(0)))
    return [s], {"axis": k, "ids": ids, "as_tensor": d(st.booleans())}


def _array_indexed(a, axis, ids, as_tensor):
    return a[(slice(None),) * axis + (tg.Tensor(ids) if as_tensor else ids,)]


def mask_index(d):
    s = shape(d, min_dims=1)
    lead = s[:d(st.integers(1, len(s)))]
    return [s], {"mask": d(hnp.arrays(np.bool_, lead))}


def split_args(d):
    s = shape(d)
    k = axis(d, s)
    length = s[k] if -len(s) <= k < len(s) else 0
    if d(st.booleans()):
        sizes = d(st.integers(0 if not length else 1, 3))
    else:
        cut = sorted(d(st.lists(st.integers(0, length), max_size=2)))
        sizes = [b - a for a, b in zip([0] + cut, cut + [length])]
        if d(st.integers(0, 5)) == 0:
            sizes[-1] += 1  # do not add up: both raise
    return [s], {"size": sizes, "dim": k, "read": d(st.sampled_from([None, 0, -1]))}


def _split(a, size, dim, read):
    pieces = a.split(size, dim=dim)
    return pieces if read is None else pieces[read] * 1.5  # a piece nobody reads gets a zero gradient


def products(d):
    """matmul operands, batched and broadcast, either 1-d (a row on the left, a column on the right)."""
    (batch_a, batch_b) = pair(d) if d(st.booleans()) else [(), ()]
    m, k, n = (d(st.integers(0, 3)) for _ in range(3))
    a = (k,) if d(st.integers(0, 3)) == 0 else tuple(batch_a[-1:]) + (m, k)
    b = (k,) if d(st.integers(0, 3)) == 0 else tuple(batch_b) + (k + (d(st.integers(0, 5)) == 0), n)
    return [a, b], {}


def in_place(d):
    target = shape(d)
    other = tuple(n if d(st.integers(0, 2)) else 1 for n in target[d(st.integers(0, len(target))):])
    if d(st.integers(0, 7)) == 0:
        other = (2,) + other  # larger than the target: both raise
    return [target, other], {}


def layer_norm_args(d):
    s = shape(d)
    n = s[-1] if s else 1
    return [s, (n,), (n,)], {"eps": d(st.sampled_from([1e-5, 0.1]))}


def linear_args(d, bias=True):
    lead = shape(d, max_dims=2)
    n_in, n_out = d(st.integers(0, 3)), d(st.integers(0, 3))
    return [lead + (n_in,) if d(st.integers(0, 7)) else (), (n_out, n_in)] + ([(n_out,)] if bias else []), {}


def embedding_args(d):
    """A [rows, dim] table (a 1-element one a quarter of the time) and ids, one out of range a quarter of the time
    (both refuse): drawn often enough that 25 examples meet both edges whatever hypothesis' seed."""
    rows, dim = (1, 1) if d(st.integers(0, 3)) == 0 else (d(st.integers(1, 4)), d(st.integers(0, 3)))
    ids = d(hnp.arrays(np.int64, shape(d, max_dims=2), elements=st.integers(0, rows - 1)))
    if ids.size and d(st.integers(0, 3)) == 0:
        ids.reshape(-1)[0] = rows
    return [(rows, dim)], {"ids": ids}


def cross_entropy_args(d):
    n, c = d(st.integers(1, 4)), d(st.integers(1, 4))
    ignore = d(st.sampled_from([-1, -100]))
    targets = d(hnp.arrays(np.int64, (n,), elements=st.sampled_from(list(range(c)) + [ignore])))
    targets[0] = d(st.integers(0, c - 1))  # not all ignored: there PyTorch gives NaN and this engine 0 (documented)
    if d(st.integers(0, 3)) == 0:
        return [(c,)], {"targets": targets[:1].reshape(()), "ignore_index": ignore}  # one example, unbatched
    return [(n, c)], {"targets": targets, "ignore_index": ignore}


def masked_fill_args(d):
    x, mask = pair(d)
    return [x], {"mask": d(hnp.arrays(np.bool_, mask)), "value": d(st.sampled_from([-2.0, 0.5, -math.inf])),
                 "scale": d(st.sampled_from([1.0, 0.5]))}


def attention_args(d, chunked):
    """q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv]; now and then no batch, no query or no key."""
    def size():
        return d(st.integers(0, 3)) if d(st.integers(0, 5)) == 0 else d(st.integers(1, 3))

    b, h, tq, tk, dim = size(), d(st.integers(1, 2)), size(), size(), d(st.integers(1, 3))
    causal = d(st.booleans())
    tq = min(tq, tk) if causal else tq  # causal with more queries than keys hides every key from the first ones
    consts = {"causal": causal}
    if chunked:
        consts["block_size"] = d(st.integers(1, 4))
    return [(b, h, tq, dim), (b, h, tk, dim), (b, h, tk, d(st.integers(1, 3)))], consts


def _torch_attention(t, q, k, v, causal, block_size=None):
    """Attention written out, the causal mask aligned bottom-right as this engine's (functional.causal_mask)."""
    tq, tk = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(t.ones(tq, tk, dtype=t.bool).triu(1 + tk - tq), float("-inf"))
    return t.softmax(scores, dim=-1) @ v


def gqa_attention_args(d, chunked):
    """attention_args with k and v of fewer heads: a divisor of q's (grouped-query; 1 head: multi-query)."""
    shapes, consts = attention_args(d, chunked)
    (b, _, tq, dim), (_, _, tk, _), (_, _, _, dv) = shapes
    kv = d(st.integers(1, 2))
    h = kv * d(st.integers(2, 3))
    return [(b, h, tq, dim), (b, kv, tk, dim), (b, kv, tk, dv)], consts


def _sdpa_gqa(q, k, v, causal, block_size=None):
    impl = {} if block_size is None else {"impl": "chunked", "block_size": block_size}
    return F.scaled_dot_product_attention(q, k, v, causal=causal, enable_gqa=True, **impl)


def _torch_attention_gqa(t, q, k, v, causal, block_size=None):
    group = q.shape[1] // k.shape[1]  # query head h attends with key/value head h // group, as PyTorch's enable_gqa
    return _torch_attention(t, q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), causal)


def rms_norm_args(d):
    s = shape(d)
    return [s, (s[-1] if s else 1,)], {"eps": d(st.sampled_from([1e-5, 0.1]))}


def rotary_args(d):
    """x [..., T, D] (D even) and a table [2, P, D] with P >= T; now and then positions [T] (or [B, T])."""
    lead = shape(d, max_dims=2, min_side=1)
    t, dim = d(st.integers(0, 4)), 2 * d(st.integers(0, 3))
    positions = d(st.integers(t, t + 3))
    consts = {}
    if d(st.booleans()):
        rows = (lead[0], t) if len(lead) == 2 and d(st.booleans()) else (t,)
        consts["positions"] = d(hnp.arrays(np.int64, rows, elements=st.integers(0, positions - 1))) if positions \
            else np.zeros(rows, np.int64)
    return [lead + (t, dim), (2, positions, dim)], consts


def _torch_rotary(t, x, table, positions=None):
    cos, sin = table.detach()[0], table.detach()[1]  # the table is a constant: no gradient reaches it
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
        if positions.ndim == 2:
            cos, sin = cos[:, None], sin[:, None]
    else:
        cos, sin = cos[:x.shape[-2]], sin[:x.shape[-2]]
    half = x.shape[-1] // 2
    return x * cos + t.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def several(d, n=2, stacked=False):
    """n tensors that fit together along an axis (or, for stack, of one shape); now and then ones that do not. (No
    1-d base of length 0: PyTorch's cat skips such tensors whatever their shape, a legacy rule not copied here.)"""
    base = list(shape(d, max_dims=3, min_side=1 if not stacked else 0))
    k = axis(d, base) if base else 0
    shapes = []
    for _ in range(n):
        s = list(base)
        if s and not stacked and -len(s) <= k < len(s):
            s[k] = d(st.integers(0, 3))
        shapes.append(tuple(s))
    if n > 1 and base and d(st.integers(0, 7)) == 0:
        shapes[-1] = shapes[-1][:-1] + (shapes[-1][-1] + 1,)  # does not fit: both raise
    if stacked:
        k = d(st.sampled_from(list(range(-len(base) - 1, len(base) + 1)) + [len(base) + 1]))
    return shapes, {"dim": k}


def _cat(*tensors, dim):
    return F.cat(list(tensors), dim=dim)


def _stack(*tensors, dim):
    return F.stack(list(tensors), dim=dim)


def routing_args(d):
    n, e = d(st.integers(0, 4)), d(st.integers(1, 4))
    return [(n, e)], {"k": d(st.integers(1, e + (d(st.integers(0, 7)) == 0)))}  # k > experts: both raise


def _torch_routing(t, logits, k):
    weights, indices = t.topk(t.softmax(logits, dim=-1), k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), indices


def moe_args(d):
    n, e, dim = d(st.integers(0, 5)), d(st.integers(1, 4)), d(st.integers(1, 3))
    return [(n, dim), (n, e)], {"k": d(st.integers(1, e))}


def _moe(x, logits, k):
    """Route, dispatch, a different function per expert (tanh(x)·(e + 1)), combine."""
    weights, indices = F.topk_routing(logits, k)
    picks = ops.moe.expert_picks(indices.data, logits.shape[1])
    outputs = [xe.tanh() * (e + 1.0) for e, xe in enumerate(F.moe_dispatch(x, picks, k))]
    return F.moe_combine(weights, outputs, picks)


def _torch_moe(t, x, logits, k):
    weights, chosen = t.topk(t.softmax(logits, dim=-1), k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    out = t.zeros_like(x)
    for e in range(logits.shape[1]):
        token, slot = t.where(chosen == e)
        out = out.index_add(0, token, x[token].tanh() * (e + 1.0) * weights[token, slot, None])
    return out


def _fixed_dropout(x, p):
    tg.set_rng_state((5, 0))  # one mask on every call, so central differences see one function
    return F.dropout(x, p, training=True)


def _fixed_chunked_dropout(q, k, v, causal, block_size):
    tg.set_rng_state((5, 0))
    return F.scaled_dot_product_attention(q, k, v, causal=causal, dropout_p=0.3, impl="chunked", block_size=block_size)


def _sdpa(q, k, v, causal, block_size=None):
    impl = {} if block_size is None else {"impl": "chunked", "block_size": block_size}
    return F.scaled_dot_product_attention(q, k, v, causal=causal, **impl)


def _scalar_args(nonzero=False):
    values = [2.5, -3.0, 0.5, 2, -1] + ([] if nonzero else [0, True])
    return lambda d: ([shape(d)], {"c": d(st.sampled_from(values))})


def _binary(name, op, domain="normal", examples=((3, 4), (3, 4)), covers=()):
    """a op b and ndarray-on-the-left (np_array op b: NumPy defers to the Tensor's reflected operator)."""
    return [
        Row(name, op, lambda t, a, b: op(a, b), lambda d: (pair(d), {}), [(list(s), {}) for s in examples],
            covers[:1], domain, BINARY_MIXES, edges=EDGES | {"broadcast"}),
        Row(f"ndarray_{name}", lambda a, b: op(a.data, b), lambda t, a, b: op(a.detach(), b),
            lambda d: (pair(d), {}), [([(2, 1), (1, 3)], {})], covers[1:], domain, BINARY_MIXES,
            edges=EDGES | {"broadcast"}, constants=(0,)),
    ]


_TARGETS = np.array([0, 4, -1, 2, -1, 1])  # two ignored rows
_MASK = np.random.default_rng(7).random((3, 4)) < 0.4
_IDS = np.array([[1, 3, 3], [0, 6, 1]])
_COMPARE = lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b)  # noqa: E731

ROWS = [
    # ---- elementwise: tensors broadcast against each other, and NumPy arrays on the left
    *_binary("add", lambda a, b: a + b, examples=[((3, 4), (3, 4)), ((3, 1, 4), (5, 4)), ((4,), (2, 3, 4))],
             covers=("__add__", "__radd__")),
    *_binary("sub", lambda a, b: a - b, examples=[((3, 1, 4), (5, 4)), ((2, 3), (2, 1))],
             covers=("__sub__", "__rsub__")),
    *_binary("mul", lambda a, b: a * b, examples=[((3, 1, 4), (5, 4)), ((2, 3), (2, 1))],
             covers=("__mul__", "__rmul__")),
    *_binary("div", lambda a, b: a / b, "positive", [((3, 1, 4), (5, 4))], ("__truediv__", "__rtruediv__")),
    *_binary("compare", _COMPARE, "ties", [((3, 4), (4,))],
             ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")),
    # ---- Python numbers on either side (a number takes the tensor's dtype, as in PyTorch)
    Row("add_scalar", lambda a, c: (a + c, c + a), lambda t, a, c: (a + c, c + a), _scalar_args(),
        [([(3, 4)], {"c": 2.5})], ("__add__", "__radd__"), mixes=INTS),
    Row("sub_scalar", lambda a, c: (a - c, c - a), lambda t, a, c: (a - c, c - a), _scalar_args(),
        [([(3, 4)], {"c": 1.5})], ("__sub__", "__rsub__"), mixes=INTS),
    Row("mul_scalar", lambda a, c: (a * c, c * a), lambda t, a, c: (a * c, c * a), _scalar_args(),
        [([(3, 4)], {"c": 0.5}), ([(3, 4)], {"c": -3.0})], ("__mul__", "__rmul__"), mixes=INTS),
    Row("div_scalar", lambda a, c: (a / c, c / a), lambda t, a, c: (a / c, c / a), _scalar_args(nonzero=True),
        [([(3, 4)], {"c": 4.0}), ([(3, 4)], {"c": 2.0})], ("__truediv__", "__rtruediv__"), "positive", INTS),
    Row("compare_scalar", lambda a, c: (a == c, a < c, a >= c), lambda t, a, c: (a == c, a < c, a >= c),
        _scalar_args(), [([(3, 4)], {"c": 0})], domain="ties", mixes=INTS),
    # ---- one tensor
    Row("neg", lambda a: -a, lambda t, a: -a, unary, [([(2, 3)], {})], ("__neg__",), mixes=INTS),
    Row("pow_int", lambda a, p: a**p, lambda t, a, p: a**p,
        lambda d: ([shape(d)], {"p": d(st.sampled_from([0, 1, 2, 3]))}),
        [([(3, 4)], {"p": 2}), ([(3, 4)], {"p": 3})], ("__pow__",), "zeros", INTS),
    Row("pow_real", lambda a, p: a**p, lambda t, a, p: a**p,
        lambda d: ([shape(d)], {"p": d(st.sampled_from([-2, -1, -1.5, -0.5, 0.5, 1.5, 2.5]))}),
        [([(3, 4)], {"p": 0.5}), ([(3, 4)], {"p": -1.5})], ("__pow__",), "positive", [(i64,)]),
    Row("exp", lambda a: a.exp(), lambda t, a: a.exp(), unary, [([(3, 4)], {})], ("exp",), mixes=INTS),
    Row("log", lambda a: a.log(), lambda t, a: a.log(), unary, [([(3, 4)], {})], ("log",), "positive", INTS),
    Row("tanh", lambda a: a.tanh(), lambda t, a: a.tanh(), unary, [([(3, 4)], {})], ("tanh",), mixes=INTS),
    Row("to", lambda a, dtype: a.to(dtype), lambda t, a, dtype: a.to(t.from_numpy(np.zeros(0, dtype)).dtype),
        lambda d: ([shape(d)], {"dtype": d(st.sampled_from([f16, f32, f64, i64, b8]))}),
        [([(3, 4)], {"dtype": f32}), ([(2, 3)], {"dtype": f64})], ("to",), mixes=INTS),
    # ---- reductions
    Row("sum", lambda a, axis, keepdims: a.sum(axis=axis, keepdims=keepdims),
        lambda t, a, axis, keepdims: a.sum(dim=_dims(axis, a), keepdim=keepdims), reduction,
        [([(2, 3, 4)], {"axis": None, "keepdims": False}), ([(2, 3, 4)], {"axis": None, "keepdims": True}),
         ([(2, 3, 4)], {"axis": 0, "keepdims": False}), ([(2, 3, 4)], {"axis": -1, "keepdims": True}),
         ([(2, 3, 4)], {"axis": (0, 2), "keepdims": False}), ([(2, 3, 4)], {"axis": (0, -1), "keepdims": True})],
        ("sum",), mixes=INTS),
    Row("mean", lambda a, axis, keepdims: a.mean(axis=axis, keepdims=keepdims),
        lambda t, a, axis, keepdims: a.mean(dim=_dims(axis, a), keepdim=keepdims), reduction,
        [([(2, 3, 4)], {"axis": None, "keepdims": False}), ([(2, 3, 4)], {"axis": 1, "keepdims": False}),
         ([(2, 3, 4)], {"axis": -1, "keepdims": True}), ([(2, 3, 4)], {"axis": (1, 2), "keepdims": False}),
         ([(2, 3, 4)], {"axis": (0, 2), "keepdims": True})], ("mean",), mixes=INTS),
    Row("max", lambda a, axis, keepdims: a.max(axis=axis, keepdims=keepdims),
        lambda t, a, axis, keepdims: a.amax(dim=_dims(axis, a), keepdim=keepdims),
        functools.partial(reduction, tuples=False),
        [([(2, 3, 4)], {"axis": None, "keepdims": False}), ([(2, 3, 4)], {"axis": None, "keepdims": True}),
         ([(2, 3, 4)], {"axis": 1, "keepdims": False}), ([(2, 3, 4)], {"axis": -1, "keepdims": True})],
        ("max",), mixes=INTS),
    # ---- movement
    Row("reshape", _reshape, _torch_reshape, reshaped,
        [([(2, 3, 4)], {"target": (6, 4), "packed": False, "transposed": False}),
         ([(2, 3, 4)], {"target": (-1,), "packed": False, "transposed": False}),
         ([(2, 3, 4)], {"target": (4, -1), "packed": True, "transposed": False}),
         ([(2, 3, 4)], {"target": (4, 6), "packed": False, "transposed": True})], ("reshape",), mixes=INTS),
    Row("view", functools.partial(_reshape, method="view"), functools.partial(_torch_reshape, method="view"),
        reshaped,
        [([(2, 3, 4)], {"target": (3, 8), "packed": False, "transposed": False})],
        ("view",), mixes=INTS),
    Row("contiguous", lambda a, order: a.permute(order).contiguous().view(-1),
        lambda t, a, order: a.permute(order).contiguous().view(-1), lambda d: [[s := shape(d)], {"order": tuple(
            d(st.permutations(range(len(s)))))}],
        [([(2, 3, 4)], {"order": (2, 0, 1)}), ([(2, 3, 4)], {"order": (0, 1, 2)})], ("contiguous",), mixes=INTS),
    Row("permute", lambda a, order, packed: a.permute(order) if packed else a.permute(*order),
        lambda t, a, order, packed: a.permute(order), permutation,
        [([(2, 3, 4)], {"order": (2, 0, 1), "packed": False}), ([(2, 3, 4)], {"order": (-1, 0, 1), "packed": True})],
        ("permute",), mixes=INTS),
    Row("transpose", lambda a, axis1, axis2: a.transpose(axis1, axis2),
        lambda t, a, axis1, axis2: a.transpose(axis1, axis2),
        two_axes, [([(2, 3, 4)], {"axis1": 0, "axis2": 2})], ("transpose",), mixes=INTS),
    Row("reversed", lambda a: (a.transpose(), a.T), lambda t, a: (a.permute(tuple(reversed(range(a.ndim)))),) * 2,
        unary,
        [([(2, 3, 4)], {}), ([(3, 5)], {})], ("transpose", "T"), mixes=INTS),
    Row("swapaxes", lambda a, axis1, axis2: a.swapaxes(axis1, axis2),
        lambda t, a, axis1, axis2: a.swapaxes(axis1, axis2),
        two_axes, [([(2, 3, 4)], {"axis1": -1, "axis2": -2})], ("swapaxes",), mixes=INTS),
    Row("getitem", lambda a, index: a[index], lambda t, a, index: a[index], basic_index,
        [([(4, 5)], {"index": (slice(1, 3), slice(None, None, 2))}), ([(4, 5)], {"index": (slice(None), 1)}),
         ([(2, 3, 4)], {"index": (Ellipsis, None, slice(1, None))}), ([(3, 4)], {"index": (-1,)})],
        ("__getitem__",), mixes=INTS),
    Row("getitem_array", _array_indexed, lambda t, a, axis, ids, as_tensor: a[(slice(None),) * axis + (ids,)],
        array_index, [([(4, 3)], {"axis": 0, "ids": np.array([0, 2, 2, 1, 0]), "as_tensor": False}),
                      ([(2, 4)], {"axis": 1, "ids": np.array([1, 1, 3]), "as_tensor": True}),
                      ([(3, 2)], {"axis": 0, "ids": np.array([[0, 1], [1, 1]]), "as_tensor": False})],
        ("__getitem__",), mixes=INTS, edges=EDGES - {"0-d"}),
    Row("getitem_mask", lambda a, mask: a[mask], lambda t, a, mask: a[mask], mask_index,
        [([(3, 4)], {"mask": _MASK[:, 0]})], ("__getitem__",), mixes=INTS, edges=EDGES - {"0-d"}),
    Row("split", _split, lambda t, a, size, dim, read: _split(a, size, dim, read), split_args,
        [([(3, 5)], {"size": 2, "dim": 1, "read": None}), ([(2, 3, 4)], {"size": [1, 3], "dim": -1, "read": None}),
         ([(6, 3)], {"size": 2, "dim": 0, "read": 1}), ([(2, 3, 12)], {"size": 4, "dim": 2, "read": None})],
        ("split",), mixes=INTS),
    # ---- products
    Row("matmul", lambda a, b: a @ b, lambda t, a, b: a @ b, products,
        [([(3, 4), (4, 5)], {}), ([(2, 3, 4), (2, 4, 5)], {}), ([(2, 3, 4), (4, 5)], {}), ([(4, 5), (2, 5, 3)], {}),
         ([(3, 1, 2, 4), (5, 4, 6)], {}), ([(4,), (4, 2)], {}), ([(2, 3, 4), (4,)], {})], ("__matmul__",),
        mixes=[(f32, f64), (i64, f32), (i64, i64)], edges=EDGES - {"0-d"}),
    Row("ndarray_matmul", lambda a, b: a.data @ b, lambda t, a, b: a.detach() @ b, products,
        [([(3, 4), (4, 2)], {})], ("__rmatmul__",), edges=EDGES - {"0-d"}, constants=(0,)),
    Row("linear", lambda x, w, b: F.linear(x, w, b), lambda t, x, w, b: t.nn.functional.linear(x, w, b), linear_args,
        [([(2, 3, 4), (5, 4), (5,)], {}), ([(3, 4), (2, 4), (2,)], {})], ("linear",), mixes=[(f32, f64, f64)],
        edges=EDGES - {"0-d"}),
    Row("linear_no_bias", lambda x, w: F.linear(x, w), lambda t, x, w: t.nn.functional.linear(x, w),
        functools.partial(linear_args, bias=False), [([(2, 3, 4), (5, 4)], {})], ("linear",), mixes=[(f32, f64)],
        edges=EDGES - {"0-d"}),
    # ---- in place (no gradient: a tensor that requires grad refuses them)
    *[Row(f"{m}", lambda a, b, m=m: getattr(a, m)(b), lambda t, a, b, m=m: getattr(a, m)(b),
          in_place, [([(3, 4), (4,)], {})], (m,), mixes=BINARY_MIXES, grad=False, inplace=True)
      for m in ("add_", "sub_", "mul_", "copy_")],
    Row("zero_", lambda a: a.zero_(), lambda t, a: a.zero_(), unary, [([(3, 4)], {})], ("zero_",), mixes=INTS,
        grad=False, inplace=True),
    # ---- the transformer's ops
    Row("gelu", lambda a: F.gelu(a), lambda t, a: t.nn.functional.gelu(a), unary, [([(3, 7)], {})], ("gelu",),
        mixes=INTS),
    Row("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"),
        lambda t, a: t.nn.functional.gelu(a, approximate="tanh"), unary, [([(3, 7)], {})], ("gelu",), mixes=INTS),
    Row("softmax", lambda a, axis: F.softmax(a, axis=axis), lambda t, a, axis: t.softmax(a, dim=axis), with_axis,
        [([(2, 3, 5)], {"axis": -1}), ([(4, 3)], {"axis": 0})], ("softmax",), mixes=INTS),
    Row("log_softmax", lambda a, axis: F.log_softmax(a, axis=axis), lambda t, a, axis: t.log_softmax(a, dim=axis),
        with_axis, [([(3, 5)], {"axis": -1}), ([(2, 4, 3)], {"axis": 1})], ("log_softmax",), mixes=INTS),
    Row("layer_norm", lambda x, w, b, eps: F.layer_norm(x, w, b, eps=eps),
        lambda t, x, w, b, eps: t.nn.functional.layer_norm(x, x.shape[-1:], w, b, eps=eps), layer_norm_args,
        [([(2, 3, 6), (6,), (6,)], {"eps": 1e-5}), ([(4, 5), (5,), (5,)], {"eps": 0.1})], ("layer_norm",),
        mixes=[(f32, f64, f64)]),
    Row("cross_entropy", lambda x, targets, ignore_index: F.cross_entropy(x, targets, ignore_index=ignore_index),
        lambda t, x, targets, ignore_index: t.nn.functional.cross_entropy(x, targets, ignore_index=ignore_index),
        cross_entropy_args, [([(6, 5)], {"targets": _TARGETS, "ignore_index": -1}),
                             ([(4, 3)], {"targets": np.array([2, -100, 0, 1]), "ignore_index": -100})],
        ("cross_entropy",), edges=EDGES - {"0-d", "empty"}),
    Row("embedding", lambda w, ids: F.embedding(ids, w), lambda t, w, ids: t.nn.functional.embedding(ids, w),
        embedding_args, [([(7, 5)], {"ids": _IDS})], ("embedding",), edges=EDGES - {"0-d"}),
    Row("masked_fill", lambda x, mask, value, scale: ops.MaskedFill.apply(x, mask, value=value, scale=scale),
        lambda t, x, mask, value, scale: (x * scale).masked_fill(mask, value), masked_fill_args,
        [([(3, 4)], {"mask": _MASK, "value": -2.0, "scale": 1.0}), ([(2, 3, 4)], {"mask": _MASK, "value": 0.5,
                                                                                  "scale": 1.0}),
         ([(1, 4)], {"mask": _MASK, "value": -1.0, "scale": 1.0})]),
    Row("attention", _sdpa, _torch_attention, functools.partial(attention_args, chunked=False),
        [([(2, 2, 5, 4)] * 3, {"causal": True}), ([(1, 2, 4, 3)] * 3, {"causal": False}),
         ([(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)], {"causal": True}),
         ([(1, 2, 2, 3), (1, 2, 0, 3), (1, 2, 0, 3)], {"causal": False})], ("scaled_dot_product_attention",),
        edges=frozenset({"1-element", "empty", "non-contiguous"})),
    Row("attention_chunked", _sdpa, _torch_attention, functools.partial(attention_args, chunked=True),
        [([(2, 2, 5, 4)] * 3, {"causal": True, "block_size": 2}),
         ([(1, 2, 4, 3)] * 3, {"causal": False, "block_size": 3}),
         ([(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)], {"causal": True, "block_size": 2}),
         ([(1, 2, 2, 3), (1, 2, 0, 3), (1, 2, 0, 3)], {"causal": False, "block_size": 2})],  # no key: an empty sum
        ("scaled_dot_product_attention",), edges=frozenset({"1-element", "empty", "non-contiguous"})),
    Row("attention_chunked_dropout", _fixed_chunked_dropout, None, functools.partial(attention_args, chunked=True),
        [([(1, 2, 5, 3)] * 3, {"causal": True, "block_size": 2})], ("scaled_dot_product_attention",),
        edges=frozenset()),
    # ---- the Llama family's ops
    Row("sqrt", lambda a: a.sqrt(), lambda t, a: a.sqrt(), unary, [([(3, 4)], {})], ("sqrt",), "positive", INTS),
    Row("rsqrt", lambda a: a.rsqrt(), lambda t, a: a.rsqrt(), unary, [([(3, 4)], {})], ("rsqrt",), "positive", INTS),
    Row("sigmoid", lambda a: (a.sigmoid(), F.sigmoid(a)), lambda t, a: (a.sigmoid(), a.sigmoid()), unary,
        [([(3, 4)], {})], ("sigmoid",), mixes=INTS),
    Row("relu", lambda a: (a.relu(), F.relu(a)), lambda t, a: (a.relu(), a.relu()), unary, [([(3, 4)], {})],
        ("relu",), mixes=INTS),
    Row("silu", lambda a: F.silu(a), lambda t, a: t.nn.functional.silu(a), unary, [([(3, 7)], {})], ("silu",),
        mixes=INTS),
    Row("rms_norm", lambda x, w, eps: F.rms_norm(x, w, eps=eps),
        lambda t, x, w, eps: t.nn.functional.rms_norm(x, x.shape[-1:], w, eps=eps), rms_norm_args,
        [([(2, 3, 6), (6,)], {"eps": 1e-5}), ([(4, 5), (5,)], {"eps": 0.1})], ("rms_norm",)),
    Row("rotary", lambda x, table, positions=None: F.rotary_embedding(x, table, positions), _torch_rotary,
        rotary_args, [([(2, 3, 5, 4), (2, 6, 4)], {}), ([(2, 2, 3, 6), (2, 4, 6)], {"positions": np.array([3, 0, 2])}),
                      ([(2, 2, 3, 6), (2, 4, 6)], {"positions": np.array([[1, 2, 3], [0, 0, 1]])})],
        ("rotary_embedding",), edges=frozenset({"empty", "non-contiguous"}), constants=(1,)),
    Row("cat", _cat, lambda t, *a, dim: t.cat(a, dim=dim), several,
        [([(2, 3), (2, 1)], {"dim": 1}), ([(1, 3, 2), (2, 3, 2)], {"dim": 0}), ([(3,), (2,)], {"dim": -1})],
        ("cat",), mixes=BINARY_MIXES, edges=EDGES - {"0-d"}),
    Row("cat_three", _cat, lambda t, *a, dim: t.cat(a, dim=dim), functools.partial(several, n=3),
        [([(2, 3), (2, 1), (2, 4)], {"dim": -1}), ([(1,), (2,), (3,)], {"dim": 0})], ("cat",), edges=EDGES - {"0-d"}),
    Row("stack", _stack, lambda t, *a, dim: t.stack(a, dim=dim), functools.partial(several, stacked=True),
        [([(2, 3), (2, 3)], {"dim": 1}), ([(3,), (3,)], {"dim": 0}), ([(2, 3), (2, 3)], {"dim": -1})],
        ("stack",), mixes=BINARY_MIXES, edges=EDGES),
    Row("attention_gqa", _sdpa_gqa, _torch_attention_gqa, functools.partial(gqa_attention_args, chunked=False),
        [([(2, 4, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)], {"causal": True}),
         ([(1, 3, 4, 3), (1, 1, 4, 3), (1, 1, 4, 2)], {"causal": False})], ("scaled_dot_product_attention",),
        edges=frozenset({"empty", "non-contiguous"})),
    Row("attention_chunked_gqa", _sdpa_gqa, _torch_attention_gqa, functools.partial(gqa_attention_args, chunked=True),
        [([(2, 4, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4)], {"causal": True, "block_size": 2}),
         ([(1, 3, 4, 3), (1, 1, 6, 3), (1, 1, 6, 2)], {"causal": True, "block_size": 4})],
        ("scaled_dot_product_attention",), edges=frozenset({"empty", "non-contiguous"})),
    Row("topk_routing", lambda logits, k: F.topk_routing(logits, k), _torch_routing, routing_args,
        [([(6, 4)], {"k": 2}), ([(3, 5)], {"k": 1}), ([(4, 3)], {"k": 3})], ("topk_routing",), floats=False,
        mixes=[(f32,)], edges=EDGES - {"0-d"}),
    Row("moe", _moe, _torch_moe, moe_args, [([(6, 3), (6, 4)], {"k": 2}), ([(5, 2), (5, 3)], {"k": 1})],
        ("moe_dispatch", "moe_combine", "topk_routing"), floats=False, mixes=[(f32, f32)],
        edges=EDGES - {"0-d"}),
    Row("dropout", _fixed_dropout, None, lambda d: ([shape(d)], {"p": d(st.sampled_from([0.0, 0.3, 0.9]))}),
        [([(4, 6)], {"p": 0.3})], ("dropout",), edges=frozenset()),
    Row("causal_mask", lambda tq, tk: tg.Tensor(F.causal_mask(tq, tk)),
        lambda t, tq, tk: t.ones(tq, tk, dtype=t.bool).triu(1 + tk - tq),
        lambda d: ([], {"tq": d(st.integers(0, 4)), "tk": d(st.integers(0, 4))}), [([], {"tq": 3, "tk": 5})],
        (), grad=False, edges=frozenset()),  # (functional.causal_mask is ops._util's, which MaskedFill calls too)
]

# rows whose draws include arguments PyTorch refuses (shapes that do not broadcast, axes out of range, a view that
# needs a copy, ...): at least one such draw must come, and both must raise
for _row in ROWS:
    if _row.name in {"add", "sub", "mul", "div", "compare", "ndarray_add", "ndarray_sub", "ndarray_mul", "ndarray_div",
                     "ndarray_compare", "sum", "mean", "max", "view", "permute", "transpose", "swapaxes", "getitem",
                     "getitem_array", "split", "matmul", "ndarray_matmul", "add_", "sub_", "mul_", "copy_", "softmax",
                     "rms_norm", "cat", "cat_three", "stack", "topk_routing",
                     "log_softmax", "layer_norm", "linear", "linear_no_bias", "embedding"}:
        _row.edges = _row.edges | {"refused"}

# Tensor attributes that are not ops: data access and autograd (test_autograd_contract.py, test_tensor_semantics.py)
NOT_OPS = {"data", "requires_grad", "name", "grad", "is_leaf", "is_parameter", "tape", "backward", "backward_steps",
           "detach", "requires_grad_", "zero_grad", "shape", "dtype", "ndim", "size", "nbytes", "numpy", "item",
           "grad_dtype"}
PROTOCOL = {"__module__", "__doc__", "__slots__", "__init__", "__weakref__", "__hash__", "__array_ufunc__", "__repr__",
            "__len__", "__iter__", "__bool__", "__array__", "__firstlineno__", "__static_attributes__",
            "__annotations__", "__qualname__", "__dict__"}


# ---- running a case ---------------------------------------------------------------------------------------------
@dataclass
class Case:
    shapes: list
    consts: dict
    layouts: tuple
    seed: int

    def edges(self) -> set:
        found = set()
        for s, layout in zip(self.shapes, self.layouts):
            size = math.prod(s)
            found |= {"0-d"} if s == () else set()
            found |= {"1-element"} if size == 1 else {"empty"} if size == 0 else set()
            if layout != "contiguous" and size > 1 and not _laid_out(np.zeros(s), layout).flags.c_contiguous:
                found.add("non-contiguous")
        if len(self.shapes) == 2 and tuple(self.shapes[0]) != tuple(self.shapes[1]):
            found.add("broadcast")
        return found


def _values(rng, shape, dtype, domain):
    kind = np.dtype(dtype).kind
    if kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if kind in "iu":
        low, high = {"positive": (1, 4), "ties": (-1, 2), "zeros": (-1, 2)}.get(domain, (-3, 4))
        return np.asarray(rng.integers(low, high, size=shape)).astype(dtype)
    x = {"positive": lambda: rng.uniform(0.5, 2.0, shape), "ties": lambda: rng.integers(-1, 2, shape) * 1.0,
         "zeros": lambda: rng.standard_normal(shape) * (rng.random(shape) < 0.6)}.get(
        domain, lambda: rng.standard_normal(shape))()
    return np.asarray(x).astype(dtype)


def _laid_out(a, layout):
    """The same values in another layout: the last two axes' transpose of a contiguous array, or every other
    element of a larger one."""
    if layout == "transposed" and a.ndim >= 2:
        return np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2)
    if layout == "strided":
        big = np.zeros(a.shape + (2,), a.dtype)
        big[..., 0] = a
        return big[..., 0]
    return a


def inputs(row, case, dtypes):
    """Fresh input arrays (one call per side, so an in-place op on one side cannot reach the other)."""
    rng = np.random.default_rng(case.seed)
    return [_laid_out(_values(rng, s, dt, row.domain), layout)
            for s, dt, layout in zip(case.shapes, dtypes, case.layouts)]


def _torch_const(v):
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v.astype(np.int64) if v.dtype.kind in "iu" else v)
    return v


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _np_dtype(torch_dtype):
    return torch.empty(0, dtype=torch_dtype).numpy().dtype


def _close(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, PyTorch {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    e = expected.astype(np.float64)
    finite = np.abs(e[np.isfinite(e)])
    scale = max(1.0, float(finite.max(initial=0.0)))
    np.testing.assert_allclose(actual.astype(np.float64), e, rtol=0, atol=TOL[expected.dtype.type] * scale,
                               equal_nan=True, err_msg=what)


def against_torch(row, case, dtypes) -> str | None:
    """Run one case here and in PyTorch: the same dtypes, values and gradients, or both refuse it ("refused")."""
    mine, theirs = inputs(row, case, dtypes), inputs(row, case, dtypes)
    before = [a.copy() for a in mine]
    t_in = [torch.from_numpy(a).requires_grad_(row.grad and a.dtype.kind == "f") for a in theirs]
    try:
        t_out = _tuple(row.theirs(torch, *t_in, **{k: _torch_const(v) for k, v in case.consts.items()}))
    except Exception as exc:  # noqa: BLE001  (PyTorch refuses: so must we)
        with pytest.raises((TypeError, ValueError, IndexError, RuntimeError)):
            row.ours(*[tg.Tensor(a, requires_grad=row.grad and a.dtype.kind == "f") for a in mine], **case.consts)
        assert tg.is_grad_enabled(), f"PyTorch raised {exc!r}; so did we, but grad mode was left off"
        return "refused"
    tensors = [tg.Tensor(a, requires_grad=row.grad and a.dtype.kind == "f") for a in mine]
    try:
        outs = _tuple(row.ours(*tensors, **case.consts))
    except TypeError:
        if all(r.numel() == 0 for r in t_out):  # PyTorch checks no dtype where there is nothing to compute: we do
            return None
        raise
    assert len(outs) == len(t_out)
    for i, (o, r) in enumerate(zip(outs, t_out)):
        assert isinstance(o.data, np.ndarray), f"output {i} is a {type(o.data).__name__}, not an array"
        assert o.dtype == _np_dtype(r.dtype), f"output {i}: dtype {o.dtype}, PyTorch {r.dtype}"
        assert o.requires_grad == r.requires_grad, f"output {i}: requires_grad {o.requires_grad}"
        if not o.requires_grad:
            assert o._entry is None, f"output {i} needs no grad but was recorded"
        _close(o.numpy(), r.detach().numpy(), f"{row.name}: output {i} (inputs {dtypes})")
    if row.grad and any(o.requires_grad for o in outs):
        rng = np.random.default_rng(case.seed + 1)
        weights = [rng.standard_normal(o.shape).astype(o.dtype) for o in outs]
        live = [(o, r, w) for o, r, w in zip(outs, t_out, weights) if r.requires_grad]
        functools.reduce(lambda acc, x: acc + (x[0] * tg.Tensor(x[2])).sum(), live, 0.0).backward()
        functools.reduce(lambda acc, x: acc + (x[1] * torch.from_numpy(x[2])).sum(), live, 0.0).backward()
        for i, (t, r) in enumerate(zip(tensors, t_in)):
            if r.grad is None or t.grad is None:  # no gradient reached it: zeros stand for none
                assert r.grad is None or not r.grad.any(), f"input {i}: no gradient, PyTorch {r.grad}"
                assert t.grad is None or not t.grad.any(), f"input {i}: gradient {t.grad}, PyTorch none"
                continue
            assert isinstance(t.grad, np.ndarray) and t.grad.dtype == t.dtype and t.grad.shape == t.shape
            _close(t.grad, r.grad.numpy(), f"{row.name}: gradient of input {i} (inputs {dtypes})")
    if not row.inplace:
        for i, (a, b) in enumerate(zip(mine, before)):
            np.testing.assert_array_equal(a, b, err_msg=f"input {i} was written")
    return None


def _numeric(loss, arrays, eps=1e-6):
    """Central differences of loss(arrays) for every element (of any layout), in float64."""
    grads = []
    for a in arrays:
        g = np.zeros(a.shape)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + eps
            up = loss()
            a[idx] = old - eps
            down = loss()
            a[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def against_central_differences(row, case) -> None:
    arrays = inputs(row, case, (f64,) * len(case.shapes))
    try:
        with tg.no_grad():
            outs = _tuple(row.ours(*[tg.Tensor(a) for a in arrays], **case.consts))
    except (TypeError, ValueError, IndexError, RuntimeError):
        return  # a case the op refuses (against_torch checks PyTorch refuses it too)
    if any(o.dtype != f64 for o in outs):
        return  # nothing to differentiate (integers, bools) or too coarse to (float16)
    rng = np.random.default_rng(case.seed + 1)
    weights = [rng.standard_normal(o.shape) * np.isfinite(o.numpy()) for o in outs]  # an infinite output weighs 0

    def loss():
        with tg.no_grad():
            outs = _tuple(row.ours(*[tg.Tensor(a) for a in arrays], **case.consts))
        return sum(float((np.where(w != 0, o.numpy(), 0) * w).sum()) for o, w in zip(outs, weights))

    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    outs = _tuple(row.ours(*tensors, **case.consts))
    functools.reduce(lambda acc, ow: acc + (ow[0] * tg.Tensor(ow[1])).sum(), zip(outs, weights), 0.0).backward()
    for i, (t, expected) in enumerate(zip(tensors, _numeric(loss, arrays))):
        if i in row.constants:
            assert t.grad is None
            continue
        got = np.zeros(t.shape) if t.grad is None else t.grad
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=f"{row.name}: input {i}")


def drawn(row, data) -> Case:
    shapes, consts = row.args(data.draw)
    layouts = tuple(data.draw(st.sampled_from(LAYOUTS)) for _ in shapes)
    return Case([tuple(s) for s in shapes], consts, layouts, data.draw(st.integers(0, 2**16)))


def fixed(example, layouts=None) -> Case:
    shapes, consts = example
    return Case([tuple(s) for s in shapes], consts, layouts or ("contiguous",) * len(shapes), 0)


TORCH_ROWS = [r for r in ROWS if r.theirs is not None]
GRAD_ROWS = [r for r in ROWS if r.grad and r.name not in ("compare", "ndarray_compare", "compare_scalar")]
EXAMPLES = [(r, i) for r in TORCH_ROWS for i in range(len(r.examples))]
DTYPE_CASES = [(r, dts) for r in TORCH_ROWS for dts in r.dtype_cases()]


def _dtype_id(dts):
    return "*".join(np.dtype(d).name for d in dts)


# ---- the tests ----------------------------------------------------------------------------------------------------
@needs_torch
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the loss of a -inf output (masked_fill) is NaN
@pytest.mark.parametrize("row", TORCH_ROWS, ids=repr)
def test_float64_against_torch(row):
    """Hypothesis' shapes, axes and constants in float64, each edge case the row allows among them (and, where it
    draws arguments PyTorch refuses, one of those)."""
    seen = set()

    @settings(max_examples=25, **SETTINGS)
    @given(st.data())
    def check(data):
        case = drawn(row, data)
        seen.update(case.edges())
        seen.add(against_torch(row, case, (f64,) * len(case.shapes)))

    check()
    assert row.edges - seen == set(), f"{row.name}: hypothesis never drew {sorted(row.edges - seen)}"


@needs_torch
@pytest.mark.parametrize("dtype", [f64, f32], ids=["float64", "float32"])
@pytest.mark.parametrize("row, index", EXAMPLES, ids=[f"{r.name}-{i}" for r, i in EXAMPLES])
def test_examples_against_torch(row, index, dtype):
    against_torch(row, fixed(row.examples[index]), (dtype,) * len(row.examples[index][0]))


@needs_torch
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 overflows where PyTorch's does
@pytest.mark.parametrize("row, dtypes", DTYPE_CASES, ids=[f"{r.name}-{_dtype_id(d)}" for r, d in DTYPE_CASES])
def test_dtypes_against_torch(row, dtypes):
    @settings(max_examples=4, **SETTINGS)
    @given(st.data())
    def check(data):
        against_torch(row, drawn(row, data), dtypes)

    check()


@pytest.mark.parametrize("row", GRAD_ROWS, ids=repr)
def test_float64_gradients_against_central_differences(row):
    @settings(max_examples=4, **SETTINGS)
    @given(st.data())
    def check(data):
        against_central_differences(row, drawn(row, data))

    check()
    against_central_differences(row, fixed(row.examples[0]))


HALF_DTYPES = [f16, BFLOAT16]
HALF_TOL = {np.dtype(f16): 2 ** -10, BFLOAT16: 2 ** -8}  # of the largest magnitude: about one rounding of the result
HALF_CASES = {  # beside each row's examples, sizes where a sum kept in half precision drifts (bfloat16: 256 + 1 = 256)
    "sum": [([(64, 48)], {"axis": None, "keepdims": False}), ([(64, 48)], {"axis": 0, "keepdims": True})],
    "mean": [([(64, 48)], {"axis": None, "keepdims": False}), ([(64, 48)], {"axis": (0, 1), "keepdims": True})],
    "cross_entropy": [([(8, 4000)], {"targets": np.arange(8) * 499, "ignore_index": -1})],
}
HALF_ROWS = [r for r in ROWS if r.name in HALF_CASES]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=["float16", "bfloat16"])
@pytest.mark.parametrize("row", HALF_ROWS, ids=repr)
def test_half_precision_reductions_against_float64(row, dtype):
    """sum, mean and cross-entropy of half-precision inputs accumulate in float32, as PyTorch's kernels: the result
    (in the input's dtype) and each gradient (in its leaf's) are the float64 reference of the same values within about
    one rounding to that dtype."""
    for example in row.examples + HALF_CASES[row.name]:
        case = fixed(example)
        halves = [a.astype(dtype) for a in inputs(row, case, (f64,) * len(case.shapes))]
        results = []
        for arrays in (halves, [a.astype(f64) for a in halves]):  # ours, then the reference of the same values
            tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
            out = row.ours(*tensors, **case.consts)
            weight = np.random.default_rng(1).standard_normal(out.shape).astype(arrays[0].dtype)
            (out * tg.Tensor(weight)).sum().backward()
            results.append((out, [t.grad for t in tensors]))
        (out, grads), (expected, expected_grads) = results
        assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
        for got, want, what in [(out.numpy(), expected.numpy(), "output"), *zip(grads, expected_grads, ["grad"] * 9)]:
            scale = max(1.0, float(np.abs(want).max(initial=0)))
            np.testing.assert_allclose(got.astype(f64), want, rtol=0, atol=HALF_TOL[np.dtype(dtype)] * scale,
                                       err_msg=f"{row.name} {what} in {np.dtype(dtype)}: {case.shapes} {case.consts}")


def op_functions() -> set:
    """Every Function subclass defined in a module of tinygrad_ckpt.ops."""
    found = set()
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        found |= {obj for obj in vars(module).values() if isinstance(obj, type) and issubclass(obj, Function)
                  and obj is not Function and obj.__module__ == module.__name__}
    return found


def public_names() -> tuple[set, set]:
    """(Tensor methods and operators, functional's functions) that are ops."""
    tensor = {n for n in vars(tg.Tensor) if not n.startswith("_") or (n.startswith("__") and n.endswith("__"))}
    functional = {n for n, v in vars(F).items() if callable(v) and not n.startswith("_")
                  and getattr(v, "__module__", None) == F.__name__}
    return tensor - NOT_OPS - PROTOCOL, functional


def test_every_op_has_a_row(monkeypatch):
    """Every Function of tinygrad_ckpt.ops shows on the tape of some row, and every Tensor method and operator and
    every function of functional is claimed by a row that calls it: a new op without a row fails here."""
    methods, functions = public_names()
    assert {"__add__", "__eq__", "__matmul__", "exp", "split", "view", "T"} <= methods
    assert {"gelu", "softmax", "scaled_dot_product_attention"} <= functions
    called = set()

    def spy(name, fn):
        if isinstance(fn, property):
            return property(lambda self: (called.add(name), fn.fget(self))[1])
        return functools.wraps(fn)(lambda *args, **kwargs: (called.add(name), fn(*args, **kwargs))[1])

    for name in methods:
        monkeypatch.setattr(tg.Tensor, name, spy(name, vars(tg.Tensor)[name]))
    for name in functions:
        monkeypatch.setattr(F, name, spy(name, getattr(F, name)))
    kinds = set()
    for row in ROWS:
        for example in row.examples:
            called.clear()
            case = fixed(example)
            tensors = [tg.Tensor(a, requires_grad=row.grad) for a in inputs(row, case, (f64,) * len(case.shapes))]
            outs = _tuple(row.ours(*tensors, **case.consts))
            kinds |= {e.op for o in outs for e in o.tape()}
            assert set(row.covers) <= called, f"{row.name} claims {sorted(set(row.covers) - called)} but never calls it"
    wanted = {f.kind() for f in op_functions()}
    assert len(wanted) >= 30
    assert wanted - kinds == set(), "Functions with no row"
    claimed = {name for row in ROWS for name in row.covers}
    assert (methods | functions) - claimed == set(), "Tensor methods or functional functions with no row"


def test_rows_are_named_once_and_examples_fit():
    assert len({r.name for r in ROWS}) == len(ROWS)
    for row in ROWS:
        assert all(len(shapes) == len(row.examples[0][0]) for shapes, _ in row.examples), row.name
        assert all(len(d) == len(row.examples[0][0]) for d in row.dtype_cases()), row.name
