"""The observer slot: how a tool (the Ledger) watches the engine without reaching into it.

The core never imports the tool. It calls these methods on `state.local.observer` (one slot per
thread) when something is installed there, and does nothing otherwise:

    on_alloc(array, category, name)       the engine now holds this buffer: a tensor made by the user
                                          ("other" or "parameter"), a .grad or a summed gradient
                                          ("gradient"), an optimizer state ("optimizer")
    on_op_start()                         an op's forward or backward is about to run
    on_op(kind, name, ctx, outputs)       an op's forward ran: `ctx.saved` is what it keeps for backward,
                                          `ctx.flops` its cost; may raise (a capacity exceeded)
    on_save(name, arrays) / on_release(name, arrays)
                                          arrays kept for backward from now / no longer (an entry's
                                          backward ran, or its graph was dropped)
    on_backward(entry)                    entry's backward is about to run
    on_backward_done(entry, grad_ins)     it ran; `grad_ins` are the gradients it produced; may raise
    on_update(kind, name, flops)          an update outside the tape ran (an optimizer step on parameter
                                          `name`), after on_op_start; may raise
    begin_phase(name) / end_phase(name)   the events in between belong to a phase ("backward",
                                          "recompute", "optimizer"); phases nest

`Observer` below does nothing; subclass it and override what you need.
"""

from __future__ import annotations

import contextlib

from . import state


class Observer:
    def on_alloc(self, array, category: str, name: str) -> None: ...

    def on_op_start(self) -> None: ...

    def on_op(self, kind: str, name: str, ctx, outputs) -> None: ...

    def on_save(self, name: str, arrays: dict) -> None: ...

    def on_release(self, name: str, arrays: dict) -> None: ...

    def on_backward(self, entry) -> None: ...

    def on_backward_done(self, entry, grad_ins) -> None: ...

    def on_update(self, kind: str, name: str, flops: int) -> None: ...

    def begin_phase(self, name: str) -> None: ...

    def end_phase(self, name: str) -> None: ...


@contextlib.contextmanager
def phase(name: str):
    """Tell this thread's observer (if any) that what runs inside belongs to phase `name`."""
    observer = state.local.observer
    if observer is None:
        yield
        return
    observer.begin_phase(name)
    try:
        yield
    finally:
        observer.end_phase(name)


def op_start() -> None:
    """Tell this thread's observer (if any) that an op begins (one that records itself later: a checkpoint)."""
    observer = state.local.observer
    if observer is not None:
        observer.on_op_start()


def alloc(array, category: str, name: str) -> None:
    """Tell this thread's observer (if any) that the engine now holds `array`."""
    observer = state.local.observer
    if observer is not None:
        observer.on_alloc(array, category, name)


@contextlib.contextmanager
def update(kind: str, name: str, flops: int):
    """Tell this thread's observer (if any) that what runs inside updates `name` in place, costing `flops`."""
    observer = state.local.observer
    if observer is not None:
        observer.on_op_start()
    yield
    if observer is not None:
        observer.on_update(kind, name, flops)
