"""Observers: how tools watch the engine (and a checkpointed segment steers its ops) without the core knowing them.

Each thread has a list of observers (`state.local.observers`, newest last); `observing(o)` adds one for
a `with` block. The core calls these methods on every observer of the thread, newest first, and does
nothing else for them:

    on_alloc(array, category, tensor, role, op)
                                          the engine now holds this buffer for the tensor named `tensor`: its
                                          data (role ""; category "other" or "parameter"), its .grad or a
                                          summed gradient (role "grad"; "gradient"), or an optimizer state
                                          (role: the state's key "m", op: the optimizer "adamw"; "optimizer")
    on_op_start(call)                     an op is about to run; `call` (function.OpCall) says which, on
                                          what, under which name. An observer may set `call.record =
                                          False` (no tape entry: a segment's first forward) or give the op's
                                          outputs (`call.given`, and `call.given_by` = itself, with
                                          `call.ctx.saved`) instead of running it (a checkpoint's replay)
    on_op(call, outputs)                  its forward ran: `call.entry` is its tape entry (None when not
                                          recorded), `call.ctx.saved` what it keeps for backward (if
                                          recorded), `call.ctx.flops` its cost; may raise (a capacity exceeded)
    on_save(holder, arrays) / on_release(holder, arrays)
                                          arrays kept for backward from now / no longer, by a tape entry or
                                          another holder with the same fields (op, name, scope): an entry's
                                          backward ran, its graph was dropped, a policy kept an op's saves (a
                                          policies.KeptOp also has `reason` and `role(key)`)
    on_backward(entry)                    entry's backward is about to run (pdb stops here: tg.debug)
    on_backward_done(entry, grad_ins)     it ran; `grad_ins` are the gradients it produced; may raise
    on_update(kind, name, flops, arrays)  an update outside the tape ran (an optimizer step on parameter
                                          `name`), after on_op_start(None); `arrays` are those it read and
                                          wrote (the parameter's data, its gradient, its states); may raise
    on_use(arrays)                        the engine read or wrote these arrays outside an op: an in-place
                                          method, a gradient added into a .grad, a .grad dropped or replaced
    begin_phase(name) / end_phase(name)   the events in between belong to a phase ("backward",
                                          "recompute", "optimizer"); phases nest
    begin_span(label) / end_span(label)   what runs in between is one named stretch of the phase it is in
                                          (a checkpointed segment's forward)

`Observer` below does nothing; subclass it and override what you need.
"""

from __future__ import annotations

import contextlib

from .. import state


class Observer:
    def on_alloc(self, array, category: str, tensor: str, role: str = "", op: str = "") -> None: ...

    def on_op_start(self, call) -> None: ...

    def on_op(self, call, outputs) -> None: ...

    def on_save(self, holder, arrays: dict) -> None: ...

    def on_release(self, holder, arrays: dict) -> None: ...

    def on_backward(self, entry) -> None: ...

    def on_backward_done(self, entry, grad_ins) -> None: ...

    def on_update(self, kind: str, name: str, flops: int, arrays=()) -> None: ...

    def on_use(self, arrays) -> None: ...

    def begin_phase(self, name: str) -> None: ...

    def end_phase(self, name: str) -> None: ...

    def begin_span(self, label: str) -> None: ...

    def end_span(self, label: str) -> None: ...


class SegmentObserver(Observer):
    """An observer of one checkpointed segment's forward or replay (checkpoint.py and its features). It is made
    just before the segment runs, and is told about the ops of checkpoints nested inside too: `mine()` says
    whether the op at hand is one of its own segment's."""

    def __init__(self):
        self.depth = state.local.segments + 1

    def mine(self) -> bool:
        return state.local.segments == self.depth


def observers() -> list:
    """This thread's observers, newest first (the order the core tells them in)."""
    return state.local.observers[::-1]


@contextlib.contextmanager
def observing(observer: Observer):
    """Tell `observer` about this thread's engine while the block runs (newest first, before older ones)."""
    stack = state.local.observers
    stack.append(observer)
    try:
        yield observer
    finally:
        stack.remove(observer)


@contextlib.contextmanager
def phase(name: str):
    """Tell this thread's observers that what runs inside belongs to phase `name`."""
    watching = observers()
    for o in watching:
        o.begin_phase(name)
    try:
        yield
    finally:
        for o in watching:
            o.end_phase(name)


@contextlib.contextmanager
def span(label: str):
    """Tell this thread's observers that what runs inside is one named stretch (it stays in its phase)."""
    watching = observers()
    for o in watching:
        o.begin_span(label)
    try:
        yield
    finally:
        for o in watching:
            o.end_span(label)


def alloc(array, category: str, tensor: str, role: str = "", op: str = "") -> None:
    """Tell this thread's observers that the engine now holds `array`, in `role` for tensor `tensor`."""
    for o in observers():
        o.on_alloc(array, category, tensor, role, op)


def saved(holder, arrays: dict) -> None:
    """Tell this thread's observers that `holder` keeps `arrays` for backward from now."""
    for o in observers():
        o.on_save(holder, arrays)


def released(holder, arrays: dict) -> None:
    """Tell this thread's observers that `holder` no longer keeps `arrays`."""
    for o in observers():
        o.on_release(holder, arrays)


@contextlib.contextmanager
def update(kind: str, name: str, flops: int, arrays=()):
    """Tell this thread's observers that what runs inside updates `name` in place, costing `flops`, reading and
    writing `arrays`."""
    watching = observers()
    for o in watching:
        o.on_op_start(None)
    yield
    for o in watching:
        o.on_update(kind, name, flops, arrays)


def used(*arrays) -> None:
    """Tell this thread's observers that the engine read or wrote these arrays outside an op (see on_use)."""
    for o in observers():
        o.on_use(arrays)
