"""Ctrl-C and errors during a pooled update: no worker writes after the exception has left, and an optimizer step
is whole (every parameter updated, or none), so a checkpoint saved in a KeyboardInterrupt handler is not torn."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import optim
from tinygrad_ckpt.backend import threads as pool


@pytest.fixture
def three_threads(monkeypatch):
    """Arrays of a few thousand elements split into blocks over three threads (the caller and two workers)."""
    monkeypatch.setattr(pool, "MIN_ELEMENTS", 256)
    monkeypatch.setattr(pool, "BLOCK_ELEMENTS", 256)
    previous = pool.set_threads(3)
    yield
    pool.set_threads(previous)


@pytest.mark.parametrize("where", ["caller", "worker"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_no_worker_writes_after_an_error_leaves_rows(where, error, three_threads):
    """Three shares of 64 rows, 8 blocks each: the caller's (rows 0-63), worker 1's, worker 2's (128-191). The
    first block of the caller's or of worker 1's share raises; worker 2 writes its blocks slowly. The old rows()
    let the error out at once, while worker 2 still had blocks to write."""
    x = np.arange(3 * 2048, dtype=np.float64).reshape(3 * 64, 32)
    out = np.zeros_like(x)
    first_failing = 0 if where == "caller" else 64
    writes, lock = [], threading.Lock()

    def kernel(o, xb):
        row = int(xb[0, 0]) // 32
        if row == first_failing:
            raise error("stop")
        if row >= 128:
            time.sleep(0.02)
        o[...] = xb + 1
        with lock:
            writes.append(time.perf_counter())

    with pytest.raises(error):
        pool.rows(kernel, out, x)
    left = time.perf_counter()
    snapshot = out.copy()
    time.sleep(0.3)
    assert all(t < left for t in writes) and np.array_equal(out, snapshot)
    assert np.array_equal(out[128:], x[128:] + 1)  # the share no error touched was written whole


def _model_and_reference():
    tg.manual_seed(0)
    params = [tg.Tensor(np.random.default_rng(i).standard_normal((64, 32)).astype(np.float32), requires_grad=True,
                        name=f"p{i}") for i in range(4)]
    copies = [tg.Tensor(p.data.copy(), requires_grad=True, name=p.name) for p in params]
    for group in (params, copies):
        for i, p in enumerate(group):
            p.grad = np.full(p.shape, 0.1 * (i + 1), np.float32)
    return params, copies


def _interrupt_during(monkeypatch, nth: int):
    """Send this process SIGINT from inside the nth pooled update call (on the thread that runs that block)."""
    calls = {"n": 0}
    real_rows = pool.rows

    def rows(kernel, *arrays, **kw):
        calls["n"] += 1
        if calls["n"] == nth:
            signal.raise_signal(signal.SIGINT)
        real_rows(kernel, *arrays, **kw)

    monkeypatch.setattr(pool, "rows", rows)


@pytest.mark.parametrize("kind", ["adamw", "sgd_momentum"])
def test_ctrl_c_inside_a_step_is_delivered_after_every_parameter_is_updated(kind, three_threads, monkeypatch):
    params, copies = _model_and_reference()
    make = {"adamw": lambda ps: optim.AdamW(ps, lr=0.1), "sgd_momentum": lambda ps: optim.SGD(ps, 0.1, 0.9)}[kind]
    opt, reference = make(params), make(copies)
    reference.step()
    if kind == "adamw":
        _interrupt_during(monkeypatch, nth=2)  # AdamW updates through rows(): SIGINT during the second parameter
    else:
        real_update = opt.update

        def update(p, g):
            if p is params[1]:
                signal.raise_signal(signal.SIGINT)
            real_update(p, g)
        monkeypatch.setattr(opt, "update", update)
    with pytest.raises(KeyboardInterrupt):
        opt.step()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert opt.step_count == 1
    for p, q in zip(params, copies):  # the old step stopped after p0: p1..p3 were not updated
        assert np.array_equal(p.data, q.data), p.name


def test_a_held_ctrl_c_goes_to_the_handler_that_was_there(three_threads, monkeypatch):
    params, copies = _model_and_reference()
    opt = optim.AdamW(params, lr=0.1)
    heard = []

    def handler(signum, frame):  # e.g. save a checkpoint and carry on
        heard.append([p.data.copy() for p in params])

    previous = signal.signal(signal.SIGINT, handler)
    try:
        _interrupt_during(monkeypatch, nth=1)
        opt.step()  # this handler does not raise: the step returns normally
        assert signal.getsignal(signal.SIGINT) is handler and len(heard) == 1
    finally:
        signal.signal(signal.SIGINT, previous)
    reference = optim.AdamW(copies, lr=0.1)
    reference.step()
    for saved, q in zip(heard[0], copies):  # what the handler saw (a checkpoint it would write) is the whole step
        assert np.array_equal(saved, q.data)


def test_a_step_on_another_thread_works_and_leaves_the_handler_alone():
    params, copies = _model_and_reference()
    opt, errors = optim.AdamW(params, lr=0.1), []

    def run():
        try:
            opt.step()
        except BaseException as exc:  # signal.signal would raise ValueError off the main thread
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert errors == [] and opt.step_count == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
