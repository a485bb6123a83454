"""The meta (shape-only) backend: NumPy's shapes, dtypes, layouts, views and scalars without data,
so that a meta run's ledger equals a NumPy run's event for event, and the seed's 7B model trains
for one step in seconds."""

from __future__ import annotations

import gc
import operator
import time
import tracemalloc
import weakref

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn, ops, optim
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.backend.meta import MetaArray, MetaBackend, MetaScalar, NoDataError, _is_c_contiguous
from tinygrad_ckpt.backend.meta import xp as mx


@pytest.fixture
def meta():
    tg.use_backend("meta")
    try:
        yield backend.current()
    finally:
        tg.use_backend("numpy")


def meta_of(a: np.ndarray) -> MetaArray:
    """A meta array with a's shape, dtype and strides (an owner)."""
    return MetaArray(a.shape, a.dtype, a.strides)


# ---- the array itself ------------------------------------------------------------------------------
def test_meta_array_basics(meta):
    a = mx.zeros((2, 3, 4), dtype=np.float16)
    assert type(a).__module__ == "tinygrad_ckpt.backend.meta" and backend.backend_of(a) == "meta"
    assert (a.shape, a.dtype, a.ndim, a.size, a.nbytes) == ((2, 3, 4), np.float16, 3, 24, 48)
    assert a.base is None and a.T.shape == (4, 3, 2) and a.T.base is a
    view = a[:, 1:, ::2]
    assert view.base is a and view[0].base is a  # views keep their owner, not the view in between
    assert meta.buffer(view) == (a, 48) and meta.buffer(a) == (a, 48)
    ref = weakref.ref(a)
    del a
    assert ref() is not None  # the view keeps its owner alive, as NumPy's .base does
    del view
    gc.collect()
    assert ref() is None
    assert isinstance(meta, MetaBackend) and meta.name == "meta"


def test_meta_has_no_values(meta):
    a = mx.ones((2, 2))
    for fn in (bool, float, int, lambda x: x.item(), meta.to_numpy, lambda x: x.sum().item()):
        with pytest.raises(NoDataError, match="no values"):
            fn(a)
    with pytest.raises(TypeError, match="no data"):
        np.asarray(a)
    t = tg.Tensor(mx.ones((2,)), requires_grad=True)
    with pytest.raises(NoDataError):
        t.numpy()
    assert "shape=[2]" in repr(t)


def test_tensor_creation_and_random_on_meta(meta):
    t = tg.Tensor([[1.0, 2.0]])
    assert isinstance(t.data, MetaArray) and t.shape == (1, 2) and t.dtype == np.float32
    ids = meta.asarray(np.arange(6).reshape(2, 3))
    assert ids.shape == (2, 3) and ids.dtype == np.int64
    gen = backend.next_generator()
    assert gen.random((3, 4), dtype=np.float32).dtype == np.float32
    assert gen.standard_normal((5,), dtype=np.float32).shape == (5,)
    with pytest.raises(TypeError):
        gen.random((2,), dtype=np.float16)  # as NumPy's Generator
    assert meta.erf(mx.zeros(3, dtype=np.float32)).dtype == np.float32


@pytest.mark.parametrize("expr", [
    "a + b", "a * 2.0", "a / 2", "i / 2", "i * 2.0", "h * 2.0", "h * np.float32(2)", "h + a", "m * a",
    "m + m", "i ** 2", "i ** 0.5", "a > 0", "-a", "xp.exp(h)", "xp.exp(i)", "xp.exp(m)", "xp.sqrt(a)",
    "xp.where(m, a, 0)", "xp.where(m, i, 0)", "a.sum()", "i.sum(axis=0)", "m.sum()", "h.mean(axis=1)",
    "i.mean()", "a.max(axis=0)", "a.argmax()", "a.argmax(axis=1)", "a @ a.T", "h @ a.T", "i @ i.T",
    "a.astype(np.float16)", "xp.asarray(1.5, dtype=a.dtype)", "xp.zeros((), dtype=h.dtype)",
])
def test_dtypes_shapes_and_scalars_follow_numpy(meta, expr):
    """Same shape, dtype (NEP 50 promotion) and array-or-scalar result as NumPy."""
    real = {"a": np.ones((3, 4), np.float32), "b": np.ones((4,), np.float32), "i": np.ones((3, 4), np.int64),
            "h": np.ones((3, 4), np.float16), "m": np.ones((3, 4), bool)}
    fake = {k: meta.asarray(v) for k, v in real.items()}
    expected = eval(expr, {"np": np, "xp": np, **real})
    got = eval(expr, {"np": np, "xp": mx, **fake})
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert isinstance(got, MetaScalar) == isinstance(expected, np.generic)


def test_shape_errors_match_numpy(meta):
    for left, right, op in [((2, 3), (4,), operator.add), ((2, 3), (4, 5), operator.matmul),
                            ((5, 2, 3), (4, 3, 6), operator.matmul), ((3,), (2,), operator.sub)]:
        with pytest.raises(ValueError) as real:
            op(np.ones(left, np.float32), np.ones(right, np.float32))
        with pytest.raises(ValueError) as fake:
            op(mx.ones(left, np.float32), mx.ones(right, np.float32))
        if op is not operator.matmul or len(left) == 2:
            assert str(fake.value) == str(real.value)
    with pytest.raises(ValueError, match="cannot reshape array of size 6 into shape"):
        mx.ones((2, 3)).reshape(4, 2)
    with pytest.raises(IndexError, match="out of bounds"):
        mx.ones((2, 3))[5]
    with pytest.raises(ValueError, match="non-broadcastable output"):
        a = mx.ones((3,))
        a += mx.ones((2, 3))
    with pytest.raises(TypeError):  # NumPy: boolean subtract is not supported
        mx.ones(3, dtype=bool) - mx.ones(3, dtype=bool)
    with pytest.raises(TypeError):  # NumPy: cannot cast float64 into int64 in place
        i = mx.ones(3, dtype=np.int64)
        i += 1.5


def test_engine_shape_errors_are_the_same_on_meta(meta):
    """Tensor-level errors come from the ops' own checks, identical on both backends."""
    def errors():
        out = []
        for fn in (lambda: tg.Tensor(np.ones((2, 3))) @ tg.Tensor(np.ones((4, 5))),
                   lambda: tg.Tensor(np.ones((2, 3))) + tg.Tensor(np.ones((4,)))):
            with pytest.raises(ValueError) as err:
                fn()
            out.append(str(err.value))
        return out

    on_meta = errors()
    tg.use_backend("numpy")
    assert errors() == on_meta


def test_mixing_numpy_and_meta_raises_type_error(meta):
    m = tg.Tensor(mx.ones((2, 2)), requires_grad=True)
    n = np.ones((2, 2), np.float32)
    with pytest.raises(TypeError, match="different backends"):
        tg.ops.Add.apply(m, n)
    with pytest.raises(TypeError, match="cannot mix a NumPy array"):
        m.data + n
    with pytest.raises(TypeError, match="cannot mix a NumPy array"):
        n + m.data
    with pytest.raises(TypeError):
        m.data @ n


def test_in_place_ops_return_self_and_setitem_is_shape_only(meta):
    a = mx.zeros((2, 3), dtype=np.float32)
    b = a
    a += 1
    a *= mx.ones((3,), dtype=np.float32)
    assert a is b
    a[0] = 1.0
    a[:, 1:] = mx.ones((2, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="could not broadcast"):
        a[0] = mx.ones((4,))
    s = a.sum()
    s2 = s
    s += 1  # NumPy scalars are immutable: a new scalar
    assert isinstance(s, MetaScalar) and s is not s2
    with pytest.raises(ValueError, match="read-only"):
        mx.broadcast_to(mx.ones(3), (2, 3))[0] = 1.0


def test_boolean_masks_need_values_and_flags(meta):
    a = mx.ones((4, 3), dtype=np.float32)
    with pytest.raises(NoDataError):  # how many elements a mask selects depends on its values
        a[a > 0]
    assert _is_c_contiguous(a.shape, a.strides, a.itemsize) and not _is_c_contiguous(a.T.shape, a.T.strides, 4)
    assert a.flags.owndata and not a.T.flags.owndata and a.flags.writeable
    assert not mx.broadcast_to(a, (2, 4, 3)).flags.writeable and not a.sum().flags.writeable
    assert meta.owns_data(a) and not meta.owns_data(a.T) and not meta.owns_data(mx.broadcast_to(mx.zeros(()), (2,)))


# ---- layouts, views and scalars against NumPy, on random programs ----------------------------------
def _random_program(rng, steps=20):
    """A list of (description, function on (xp, arrays) -> new array) steps over a few starting arrays."""
    ops = []

    def pick(arrs):
        return int(rng.integers(len(arrs)))

    for _ in range(steps):
        kind = rng.choice(["transpose", "slice", "reshape", "binary", "unary", "astype", "sum", "matmul",
                           "index", "swap", "broadcast", "take", "getitem_int", "where", "keepdims_binary",
                           "fancy", "newaxis", "copy", "squeeze"])
        seed = int(rng.integers(1 << 30))
        ops.append((kind, seed))
    return ops


def _apply(kind, seed, arrays, xp):
    """Apply one random step deterministically (same choices for NumPy and meta)."""
    r = np.random.default_rng(seed)
    i = int(r.integers(len(arrays)))
    a = arrays[i]
    nd = a.ndim
    if nd == 0:
        return None
    if kind == "transpose":
        return a.transpose(tuple(r.permutation(nd)))
    if kind == "swap":
        return a.swapaxes(int(r.integers(nd)), int(r.integers(nd)))
    if kind == "slice":
        ax = int(r.integers(nd))
        index = [slice(None)] * nd
        index[ax] = slice(int(r.integers(0, 2)), None, int(r.integers(1, 3)))
        return a[tuple(index)]
    if kind == "getitem_int":
        index = tuple(int(r.integers(n)) if n and r.random() < 0.5 else slice(None) for n in a.shape)
        return a[index]
    if kind == "reshape":
        shape = list(a.shape)
        if len(shape) >= 2 and r.random() < 0.5:  # merge two neighbours
            j = int(r.integers(len(shape) - 1))
            shape[j:j + 2] = [shape[j] * shape[j + 1]]
        else:  # split one axis or add a 1
            j = int(r.integers(len(shape)))
            n = shape[j]
            f = next((f for f in (2, 3) if n % f == 0), None)
            shape[j:j + 1] = [f, n // f] if f else [n, 1]
        return a.reshape(shape)
    if kind == "binary":
        other = arrays[int(r.integers(len(arrays)))]
        if other.shape != a.shape:
            other = 2.0 if r.random() < 0.5 else np.float32(2)
        return (a * other) if r.random() < 0.5 else (other - a if nd % 2 else a + other)
    if kind == "unary":
        return xp.exp(a) if r.random() < 0.5 else -a
    if kind == "astype":
        return a.astype(np.float64 if a.dtype != np.float64 else np.float32)
    if kind == "sum":
        axis = int(r.integers(nd)) if r.random() < 0.8 else None
        return a.sum(axis=axis, keepdims=bool(r.random() < 0.5))
    if kind == "matmul":
        if nd < 2:
            return None
        perm = list(range(nd))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return a @ a.transpose(perm)
    if kind == "broadcast":
        return xp.broadcast_to(a, (2, *a.shape)).reshape(-1)
    if kind == "index":
        ax = int(r.integers(nd))
        ids = np.array([0, a.shape[ax] - 1]) if a.shape[ax] else np.array([], dtype=np.int64)
        ids = ids if xp is np else backend.current().asarray(ids)
        index = [slice(None)] * nd
        index[ax] = ids
        return a[tuple(index)]
    if kind == "take":
        ax = int(r.integers(nd))
        return xp.expand_dims(a.argmax(axis=ax), ax) if a.shape[ax] else None
    if kind == "where":
        other = arrays[int(r.integers(len(arrays)))]
        other = other if other.shape == a.shape else 0.0
        return xp.where(a > 0, other, a)
    if kind == "keepdims_binary":
        return a - a.max(axis=int(r.integers(nd)), keepdims=True) if a.size else None
    if kind == "fancy":  # integer arrays and ints on several axes, adjacent or not
        index = []
        for n in a.shape:
            u = r.random()
            index.append(slice(None) if u < 0.4 or not n else int(r.integers(n)) if u < 0.6
                         else _ids(xp, r.integers(0, n, size=(2, 1) if u < 0.8 else (3,))))
        return a[tuple(index)]
    if kind == "newaxis":
        index = [slice(None)] * nd
        index.insert(int(r.integers(nd + 1)), None)
        return a[tuple(index)]
    if kind == "copy":
        return a.copy()
    if kind == "squeeze":
        ones = tuple(i for i, n in enumerate(a.shape) if n == 1)
        return a.squeeze(ones[:int(r.integers(len(ones) + 1))])
    raise AssertionError(kind)


def _ids(xp, ids):
    return ids if xp is np else backend.current().asarray(ids)


@pytest.mark.parametrize("trial", range(100))
def test_layouts_views_and_scalars_match_numpy(meta, trial):
    """Random chains of views, copies and ops: same shape, dtype, strides, scalar-ness and buffer
    sharing (which result is a view of which earlier buffer) as NumPy."""
    rng = np.random.default_rng(trial)
    starts = [np.ones(tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 5)))), np.float32)
              for _ in range(2)]
    real = list(starts)
    fake = [meta_of(a) for a in starts]
    owners = {id(backend.Backend().buffer(a)[0]): f for a, f in zip(real, fake)}
    keep = []  # keep every owner alive so ids are not reused
    for kind, seed in _random_program(rng):
        r = _apply(kind, seed, real, np)
        f = _apply(kind, seed, fake, mx)
        assert (r is None) == (f is None)
        if r is None:
            continue
        where = f"{kind} on trial {trial}"
        assert isinstance(f, MetaScalar) == isinstance(r, np.generic), where
        assert f.shape == r.shape and f.dtype == r.dtype, where
        if isinstance(r, np.generic):
            continue
        big = [i for i, n in enumerate(r.shape) if n > 1]
        if r.size:  # NumPy gives zero-size arrays arbitrary strides
            assert [f.strides[i] for i in big] == [r.strides[i] for i in big], (where, f.strides, r.strides)
        assert _is_c_contiguous(f.shape, f.strides, f.itemsize) == r.flags.c_contiguous, where
        assert _is_c_contiguous(f.shape[::-1], f.strides[::-1], f.itemsize) == r.flags.f_contiguous, where
        for flag in ("writeable", "owndata"):
            assert getattr(f.flags, flag) == getattr(r.flags, flag), (where, flag)
        r_owner = backend.Backend().buffer(r)[0]
        f_owner = MetaBackend().buffer(f)[0]
        if id(r_owner) in owners:
            assert owners[id(r_owner)] is f_owner, f"{where}: NumPy shares a buffer, meta does not"
        else:
            assert all(f_owner is not o for o in owners.values()), f"{where}: meta shares a buffer, NumPy does not"
            owners[id(r_owner)] = f_owner
            keep.append(r_owner)
        assert f_owner.nbytes == r_owner.nbytes, where
        if r.size:  # zero-size arrays hold no bytes; NumPy's strides for them are arbitrary
            real.append(r)
            fake.append(f)


# ---- the ledger: a meta run equals a NumPy run ------------------------------------------------------
def _events(led):
    """Existing buffers as a multiset (their gc scan order is arbitrary), then every event in order."""
    rows = [(e.action, e.nbytes, e.category, e.phase, e.name, e.shape, e.dtype, e.step, e.flops, e.from_category)
            for e in led.events]
    existing = sorted(r for r in rows if r[0] == "existing")
    return existing, [r for r in rows if r[0] != "existing"]


def _train(backend_name, *, steps=2, dropout=0.0, opt="adamw", checkpoint=None, B=2, T=8, V=37, L=2, H=2, d=16,
           dtype=None):
    tg.use_backend(backend_name)
    tg.manual_seed(0)
    model = nn.GPT(V, T, L, H, d, dropout=dropout, checkpoint=checkpoint)
    if dtype is not None:
        model.to(dtype)
    optimizer = {"adamw": lambda p: optim.AdamW(p), "sgd": lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
                 None: lambda p: None}[opt](model.parameters())
    data = np.random.default_rng(0)
    idx = backend.current().asarray(data.integers(0, V, (B, T)))
    targets = backend.current().asarray(data.integers(0, V, (B, T)))
    gc.collect()
    with tg.Ledger() as led:
        for _ in range(steps):
            _, loss = model(idx, targets)
            loss.backward()
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            del loss, _
    tg.use_backend("numpy")
    return led


def _policy(name):
    import importlib

    return getattr(importlib.import_module("tinygrad_ckpt.recompute.policies"), name)


CONFIGS = {
    "plain": dict(),
    "dropout": dict(dropout=0.1),
    "sgd_momentum": dict(opt="sgd", L=3),
    "no_optimizer_float64": dict(opt=None, dtype=np.float64),
    "float16": dict(dtype=np.float16, opt=None),
    "odd_sizes": dict(B=3, T=5, V=11, H=3, d=12, dropout=0.2),
    "every_layer": dict(checkpoint="every_layer"),
    "sqrt_dropout": dict(checkpoint="sqrt", L=4, dropout=0.1),
    "two_segments": dict(checkpoint=2, L=4),
    "selective": dict(checkpoint="korthikanti_selective", dropout=0.1),
    "save_matmuls": dict(checkpoint="save_matmuls"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float16 AdamW/LayerNorm overflow in NumPy's values
@pytest.mark.parametrize("config", list(CONFIGS))
def test_meta_ledger_equals_numpy_ledger(config):
    kwargs = dict(CONFIGS[config])
    if kwargs.get("checkpoint") in ("korthikanti_selective", "save_matmuls"):
        kwargs["checkpoint"] = _policy(kwargs["checkpoint"])
    real = _train("numpy", **kwargs)
    fake = _train("meta", **kwargs)
    assert _events(fake) == _events(real)
    assert fake.flops_by_phase == real.flops_by_phase
    assert fake.peak_bytes() == real.peak_bytes()
    for c in ("parameter", "gradient", "optimizer", "activation", "other"):
        assert fake.peak_bytes(c) == real.peak_bytes(c)
    assert fake.saved_breakdown(by="name") == real.saved_breakdown(by="name")
    if kwargs.get("checkpoint"):
        assert fake.flops("recompute") > 0


def _every_op(backend_name):
    """Each op in tinygrad_ckpt/ops, forward and backward (gradients accumulating), under a Ledger:
    the ops and index kinds a GPT step does not reach (Max, Pow, Log, tanh GELU, advanced GetItem, ...)."""
    tg.use_backend(backend_name)
    tg.manual_seed(0)
    be, data = backend.current(), np.random.default_rng(0)

    def leaf(*shape):
        return tg.Tensor(be.asarray(data.random(shape, dtype=np.float32) + 0.5), requires_grad=True)

    ids = be.asarray(data.integers(0, 2, (3,)))
    with tg.Ledger() as led:
        x, y, w, q, logits = leaf(2, 3, 4), leaf(4), leaf(5, 4), leaf(1, 2, 3, 4), leaf(6, 5)
        kv, kv4 = leaf(1, 2, 3, 4), leaf(1, 4, 3, 4)
        routed = F.topk_routing(logits, 2, ops.moe.balanced_indices(6, 2, 5))
        picks = ops.moe.expert_picks(routed[1].data, 5)
        dispatched = F.moe_dispatch(x.reshape(6, 4), picks, 2)
        outs = [x + y, x - y, 1.0 - x, x * y, x * 0.5, x / y, 2.0 / x, -x, x ** 2, x ** 0.5, x.exp(), x.log(),
                x.tanh(), x.sum(), x.sum(axis=(0, 2), keepdims=True), x.mean(axis=-1), x.max(), x.max(axis=1),
                x.max(axis=2, keepdims=True), x.reshape(6, 4), x.permute(2, 0, 1), x.swapaxes(0, 2), x.T, x[0, 1:],
                x[..., ::2], x[:, None], x[0, 1, 2], x[ids], x[:, ids], x[ids, :, ids], x @ w.T, F.linear(x, w),
                F.linear(x, w, w[:, 0]), F.gelu(x), F.gelu(x, approximate="tanh"), F.softmax(x), F.log_softmax(x, 1),
                F.layer_norm(x, y, y), F.dropout(x, 0.5), F.embedding(be.asarray(data.integers(0, 5, (2, 3))), w),
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.1),
                F.cross_entropy(logits, be.asarray(data.integers(0, 5, (6,)))),
                F.cross_entropy(logits, be.asarray(data.integers(-1, 5, (6,))), ignore_index=-1),
                # the Llama family's ops (routing as the meta backend assumes it: balanced, so shapes agree)
                x.sqrt(), x.rsqrt(), x.sigmoid(), x.relu(), F.silu(x), F.rms_norm(x, y), F.cat([x, x[:, :1]], dim=1),
                F.stack([x, x], dim=-1), F.rotary_embedding(q, ops.rotary.rotary_table(4, 5)),
                F.rotary_embedding(q, ops.rotary.rotary_table(4, 5), be.asarray(np.array([[0, 2, 4]]))),
                F.scaled_dot_product_attention(kv4, kv[:, :1], kv[:, :1], enable_gqa=True),
                F.scaled_dot_product_attention(kv4, kv[:, :1], kv[:, :1], enable_gqa=True, impl="chunked",
                                               block_size=2),
                routed[0], F.moe_combine(F.topk_routing(logits, 2, ops.moe.balanced_indices(6, 2, 5))[0],
                                         [e * 2.0 for e in dispatched], picks)]
        for out in outs:
            out.sum().backward()
        del outs, out
    tg.use_backend("numpy")
    return led


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_meta_ledger_equals_numpy_ledger_for_every_op():
    real, fake = _every_op("numpy"), _every_op("meta")
    assert _events(fake) == _events(real)
    assert fake.flops_by_phase == real.flops_by_phase and fake.peak_bytes() == real.peak_bytes()


# ---- the seed configuration at full size ------------------------------------------------------------
SEED = dict(n_layer=32, d_model=4096, n_head=32, seq=2048, batch=4, vocab=32000)


def _seed_step(checkpoint):
    tg.use_backend("meta")
    tg.manual_seed(0)
    t0 = time.perf_counter()
    tracemalloc.start()
    try:
        model = nn.GPT(SEED["vocab"], SEED["seq"], SEED["n_layer"], SEED["n_head"], SEED["d_model"],
                       checkpoint=checkpoint).to(np.float16)
        opt = optim.AdamW(model.parameters())
        xp = backend.xp()
        idx = xp.zeros((SEED["batch"], SEED["seq"]), dtype=np.int64)
        with tg.Ledger() as led:
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()
        del model, opt, loss, _
        traced_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        tg.use_backend("numpy")
    return led, time.perf_counter() - t0, traced_peak


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [None, "every_layer"])
def test_seed_7b_config_runs_on_meta_in_seconds(checkpoint):
    led, seconds, traced = _seed_step(checkpoint)
    B, T, d, L, V = SEED["batch"], SEED["seq"], SEED["d_model"], SEED["n_layer"], SEED["vocab"]
    n_params = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d
    assert led.peak_bytes("parameter") == 2 * n_params  # float16, tied lm_head counted once
    assert led.peak_bytes("optimizer") == 2 * 2 * n_params  # AdamW m, v in the parameters' dtype
    matmul_forward = L * (24 * B * T * d * d + 4 * B * T * T * d) + 2 * B * T * d * V
    assert matmul_forward < led.flops("forward") < 1.05 * matmul_forward
    if checkpoint is None:
        assert led.flops("recompute") == 0
    else:
        # every block again up to its tail (the last linear, 8·B·T·d² of the block's 24·B·T·d², and the add)
        replay_matmuls = L * (16 * B * T * d * d + 4 * B * T * T * d)
        assert replay_matmuls < led.flops("recompute") < 1.05 * replay_matmuls
    assert seconds < 60
    assert traced < 500 * 2**20
    # captured: shown with -rP
    print(f"[meta seed 7B, checkpoint={checkpoint}] {seconds:.2f} s, traced peak {traced / 2**20:.1f} MiB, "
          f"activation peak {led.peak_bytes('activation') / 2**30:.2f} GiB, total peak "
          f"{led.peak_bytes() / 2**30:.2f} GiB, FLOPs fwd {led.flops('forward'):.3e} "
          f"bwd {led.flops('backward'):.3e} recompute {led.flops('recompute'):.3e}")
