"""Blocks of rows and the thread pool for the big elementwise ops (backend/threads.py): results and gradients
bit for bit those of one call on the whole arrays, on arrays big enough to be split, and the thread count's
errors."""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn, ops, optim
from tinygrad_ckpt.backend import threads as pool


@pytest.fixture
def small_chunks(monkeypatch):
    """Split arrays of a few thousand elements into blocks of ~200, so the tests stay small and the threads
    really run."""
    monkeypatch.setattr(pool, "MIN_ELEMENTS", 256)
    monkeypatch.setattr(pool, "BLOCK_ELEMENTS", 200)
    previous = pool.set_threads(1)
    yield
    pool.set_threads(previous)


def _run(fn, arrays, threads):
    pool.set_threads(threads)
    tensors = [tg.Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(np.cos(np.arange(out.size, dtype=np.float32)).reshape(out.shape).astype(out.dtype))
    return [out.numpy()] + [t.grad for t in tensors]


MASK = np.triu(np.ones((24, 24), dtype=bool), k=1)
CASES = {
    "gelu": (lambda x: F.gelu(x), [(6, 24, 40)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(6, 24, 40)]),
    "softmax": (lambda x: F.softmax(x), [(6, 24, 40)]),
    "softmax_axis0": (lambda x: F.softmax(x, axis=0), [(6, 24, 40)]),  # not split: runs whole
    "masked_fill": (lambda x: ops.MaskedFill.apply(x, MASK, value=float("-inf")).exp(), [(4, 3, 24, 24)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), [(6, 24, 40), (40,), (40,)]),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_op_is_bit_equal_on_every_thread_count(name, dtype, small_chunks, rng, monkeypatch):
    fn, shapes = CASES[name]
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    with monkeypatch.context() as m:
        m.setattr(pool, "BLOCK_ELEMENTS", 1 << 30)
        one = _run(fn, arrays, threads=1)  # one call on the whole arrays
    for threads in (1, 2, 3, 7):
        many = _run(fn, arrays, threads=threads)
        for i, (a, b) in enumerate(zip(one, many)):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: output/grad {i} with {threads} threads")


def test_the_split_really_happens(small_chunks, monkeypatch):
    """The kernel runs once per share, on as many threads as asked (and once, whole, for one thread), and per
    block of rows within a share."""
    monkeypatch.setattr(pool, "BLOCK_ELEMENTS", 1 << 30)
    calls = []

    def kernel(out, x):
        calls.append(out.shape)
        out[...] = x * 2

    x = np.arange(64 * 40, dtype=np.float32).reshape(64, 40)
    out = np.empty_like(x)
    pool.set_threads(4)
    pool.rows(kernel, out, x)
    assert sorted(calls) == [(16, 40)] * 4
    np.testing.assert_array_equal(out, x * 2)
    calls.clear()
    pool.set_threads(1)
    pool.rows(kernel, out, x)
    assert calls == [(64, 40)]
    calls.clear()
    monkeypatch.setattr(pool, "BLOCK_ELEMENTS", 400)  # 10 rows of 40
    pool.rows(kernel, out, x)
    assert calls == [(10, 40)] * 6 + [(4, 40)]
    calls.clear()
    pool.set_threads(2)
    pool.rows(kernel, out, x)
    assert sorted(calls) == sorted(([(10, 40)] * 3 + [(2, 40)]) * 2)  # two shares of 32 rows, each in blocks
    np.testing.assert_array_equal(out, x * 2)


def test_adamw_steps_are_bit_equal_on_every_thread_count(small_chunks):
    params = []
    for threads in (1, 3):
        pool.set_threads(threads)
        tg.manual_seed(0)
        model = nn.GPT(11, 8, 1, 2, 32)
        opt = optim.AdamW(model.parameters(), lr=1e-2)
        idx = np.random.default_rng(0).integers(0, 11, (4, 8))
        for _ in range(3):
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad()
        params.append({n: p.numpy().copy() for n, p in model.named_parameters()})
    for name in params[0]:
        np.testing.assert_array_equal(params[0][name], params[1][name], err_msg=name)


def test_thread_count_errors_and_environment(monkeypatch):
    with pytest.raises(ValueError, match=r"set_threads: n must be a positive int, got 0"):
        pool.set_threads(0)
    with pytest.raises(ValueError, match=r"got True"):
        pool.set_threads(True)
    monkeypatch.setenv("TINYGRAD_CKPT_THREADS", "3")
    assert pool._default_threads() == 3
    monkeypatch.setenv("TINYGRAD_CKPT_THREADS", "many")
    with pytest.raises(ValueError, match=r"TINYGRAD_CKPT_THREADS must be a positive integer, got 'many'"):
        pool._default_threads()
    monkeypatch.delenv("TINYGRAD_CKPT_THREADS")
    assert pool._default_threads() >= 1


def test_two_user_threads_share_the_pool_while_the_count_changes(small_chunks, rng):
    """Each user thread gets its own exact result, while a third changes the thread count under them."""
    import threading

    x = rng.standard_normal((64, 40)).astype(np.float32)
    pool.set_threads(1)
    expected = F.softmax(tg.Tensor(x)).numpy()
    pool.set_threads(3)
    results, errors = [], []

    def work():
        try:
            for _ in range(30):
                results.append(F.softmax(tg.Tensor(x)).numpy())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(2)]
    for w in workers:
        w.start()
    for n in (2, 4, 1, 3) * 5:
        pool.set_threads(n)
    for w in workers:
        w.join()
    assert errors == [] and len(results) == 60
    for r in results:
        np.testing.assert_array_equal(r, expected)


def test_row_sums_and_dots_match_numpy_reductions_and_any_block_of_rows(rng, monkeypatch):
    """backend.row_sums / row_dots (layer norm's and softmax's row reductions): NumPy's sums to float32
    rounding, kept as [..., 1], the same bits for any block of rows, float16 summed in float32, and NumPy 1.x's
    einsum fallback for vecdot."""
    from tinygrad_ckpt.backend import numpy_backend

    be = tg.backend.current()
    a = rng.standard_normal((3, 50, 257)).astype(np.float32)
    b = rng.standard_normal((3, 50, 257)).astype(np.float32)
    sums, dots = be.row_sums(a), be.row_dots(a, b)
    assert sums.shape == dots.shape == (3, 50, 1) and sums.dtype == dots.dtype == np.float32
    np.testing.assert_allclose(sums, a.astype(np.float64).sum(-1, keepdims=True), rtol=0, atol=2e-5)
    np.testing.assert_allclose(dots, (a.astype(np.float64) * b).sum(-1, keepdims=True), rtol=0, atol=5e-5)
    rows_a, rows_b = a.reshape(150, 257), b.reshape(150, 257)
    assert np.array_equal(be.row_sums(rows_a[7:40]), sums.reshape(150, 1)[7:40])
    assert np.array_equal(be.row_dots(rows_a[7:40], rows_b[7:40]), dots.reshape(150, 1)[7:40])
    half = a.astype(np.float16)
    assert be.row_sums(half).dtype == np.float32
    np.testing.assert_allclose(be.row_sums(half), half.astype(np.float32).sum(-1, keepdims=True), rtol=1e-6)
    monkeypatch.setattr(numpy_backend, "_vecdot", None)
    np.testing.assert_allclose(be.row_dots(a, b), dots, rtol=1e-5, atol=1e-5)
