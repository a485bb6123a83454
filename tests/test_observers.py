"""One hook mechanism: each thread's list of observers. The ledger, anomaly checks, breakpoints and a checkpoint's
segment all observe; Function.apply and backward_steps read in one screen and call only them."""

import ast
import inspect
import textwrap
import threading

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import state
from tinygrad_ckpt.engine import observe
from tinygrad_ckpt.engine.function import Function
from tinygrad_ckpt.engine.tape import backward_steps


class Recorder(observe.Observer):
    def __init__(self):
        self.calls = []

    def on_op_start(self, call):
        self.calls.append(("start", call.name if call is not None else None))

    def on_op(self, call, outputs):
        self.calls.append(("op", call.name, call.entry is not None))

    def on_backward(self, entry):
        self.calls.append(("backward", entry.name))


def test_an_observer_sees_every_op_and_backward_step_and_is_removed_after():
    x = tg.Tensor(np.ones(3), requires_grad=True)
    with observe.observing(Recorder()) as rec:
        (x.exp() * 2.0).sum().backward()
    assert rec.calls == [("start", "exp"), ("op", "exp", True), ("start", "scale"), ("op", "scale", True),
                         ("start", "sum"), ("op", "sum", True), ("backward", "sum"), ("backward", "scale"),
                         ("backward", "exp")]
    assert state.local.observers == []


def test_observers_are_told_newest_first_and_an_error_removes_the_observer():
    order = []

    class Named(observe.Observer):
        def __init__(self, name):
            self.name = name

        def on_op(self, call, outputs):
            order.append(self.name)

    with observe.observing(Named("old")), observe.observing(Named("new")):
        tg.Tensor(np.ones(2)).exp()
    assert order == ["new", "old"]
    with pytest.raises(KeyError), observe.observing(Named("gone")):
        raise KeyError("half-way")
    assert state.local.observers == []


def test_an_observer_can_stop_an_op_recording():
    class NoRecord(observe.Observer):
        def on_op_start(self, call):
            call.record = False

    x = tg.Tensor(np.ones(3), requires_grad=True)
    with observe.observing(NoRecord()):
        y = x.exp()
    assert y.requires_grad and y._entry is None and len(y.tape()) == 0


def test_a_ledger_exited_on_another_thread_leaves_the_entering_thread_unobserved():
    led = tg.Ledger()
    led.__enter__()
    assert tg.ledger.current() is led
    worker = threading.Thread(target=led.__exit__, args=(None, None, None))
    worker.start()
    worker.join()
    assert tg.ledger.current() is None and state.local.observers == []
    before = len(led.events)
    tg.Tensor(np.ones(3), requires_grad=True).exp().sum().backward()  # the engine works as before, unobserved
    assert len(led.events) == before


def test_observers_are_per_thread():
    seen = {}

    def work():
        with tg.Ledger() as led:
            tg.Tensor(np.ones(4), requires_grad=True).exp()
        seen["worker"] = len(led.ops)

    with tg.Ledger() as main:
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert seen["worker"] == 1 and len(main.ops) == 0


def _body_lines(fn) -> int:
    """Lines of a function's body, without its docstring."""
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant) \
        else node.body
    return body[-1].end_lineno - body[0].lineno + 1


def test_apply_and_backward_steps_read_in_one_screen():
    assert _body_lines(Function.apply.__func__) <= 12
    assert _body_lines(backward_steps) <= 40
