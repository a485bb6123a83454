"""Observers: how tools watch the engine (and a checkpointed segment steers its ops) without the core knowing them.

Each thread has a list of observers (`state.local.observers`, newest last); `observing(o)` adds one for
a `with` block. The core calls these methods on every observer of the thread, newest first, and does
nothing else for them:

    on_alloc(array, category, tensor, role, op)           the engine now holds this buffer
    on_op_start(call) / on_op(call, outputs)              an op is about to run / its forward ran (may steer, raise)
    on_save(holder, arrays) / on_release(holder, arrays)  arrays kept for backward from now / no longer
    on_backward(entry) / on_backward_done(entry, grad_ins)  an entry's backward is about to run / ran
    on_update(kind, name, flops, arrays), on_use(arrays)  an update outside the tape; arrays read or written
    begin_phase / end_phase, begin_span / end_span        a phase ("backward", ...) or a named stretch of one

What each method receives and may do, in full: docs/house.md. `Observer` below does nothing; subclass it and
override what you need.
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
