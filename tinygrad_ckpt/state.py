"""Everything the engine remembers between calls, in one place.

Per thread (one `threading.local`, as PyTorch keeps its grad mode), so two threads never see each
other's settings:

    grad_enabled   ops record entries when an input requires grad (off inside `no_grad()`)
    prefix         the name scope as a dotted prefix ("h.3.mlp."); ops are named prefix + kind
    segment        the checkpointed segment whose ops run now, or None (the one hook a segment
                   has on ops: see `Function.apply`)
    observer       who is told about buffers, saves and ops (a Ledger), or None (see observe.py)
    anomaly        `detect_anomaly()` is on: NaN/Inf checks and fingerprints of saved arrays
    seed, counter  the random-number state: draw n uses a generator seeded with [seed, n]

A new thread starts with gradients on, no scope, no observer and seed 0.

Per process: the breakpoints of `tg.debug`, the sequence number every entry gets when recorded,
and the record of buffers changed in place (each change also takes a sequence number, so an entry
knows a saved buffer changed after it was recorded when the change's number is larger).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref


class ThreadState(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.prefix = ""
        self.segment = None
        self.observer = None
        self.anomaly = False
        self.seed, self.counter = 0, 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"<this thread's engine state: {fields}>"


local = ThreadState()

breakpoints: list[str] = [p for p in os.environ.get("TINYGRAD_CKPT_BREAK", "").split(",") if p]

_sequence = itertools.count()  # next() is atomic in CPython: safe across threads
changed: dict[int, tuple[int, int, str]] = {}  # id(buffer) -> (sequence number, version, tensor name)


def next_sequence() -> int:
    """A number larger than every number handed out before (entries and in-place changes share them)."""
    return next(_sequence)


def mark_changed(buffer, name: str) -> int:
    """Record that `buffer` (the object owning an array's memory) was written in place; returns its version."""
    key = id(buffer)
    previous = changed.get(key)
    if previous is None:  # forget the buffer when it dies, so a new one reusing the id starts clean
        weakref.finalize(buffer, changed.pop, key, None)
    version = (previous[1] if previous else 0) + 1
    changed[key] = (next_sequence(), version, name)
    return version


@contextlib.contextmanager
def patched(**values):
    """Set attributes of this thread's state for the duration of a `with` block, then restore them."""
    old = {k: getattr(local, k) for k in values}
    for k, v in values.items():
        setattr(local, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(local, k, v)


def no_grad():
    """Run ops without recording: nothing is saved, outputs do not require grad (this thread only)."""
    return patched(grad_enabled=False)


def enable_grad():
    """Record again inside a `no_grad()` block (this thread only)."""
    return patched(grad_enabled=True)


def name_scope(name: str):
    """Prefix the names of ops recorded inside with `name` (modules do this when called)."""
    return patched(prefix=f"{local.prefix}{name}.") if name else contextlib.nullcontext()
