"""Everything the engine remembers between calls, in one place.

Per thread (one `threading.local`, as PyTorch keeps its grad mode), so two threads never see each
other's settings:

    grad_enabled   ops record entries when an input requires grad (off inside `no_grad()`)
    prefix         the name scope as a dotted prefix ("h.3.mlp."); ops are named prefix + kind
    observers      who is told about ops, saves, buffers and backward steps, newest last: a Ledger, a
                   checkpointed segment, anomaly checks, breakpoints (see observe.py)
    segments       how many checkpointed segments run now, one inside another (forwards or replays): a
                   segment's observers act on the ops of their own depth only
    seed, counter  the random-number state: draw n uses a generator seeded with [seed, n]

A new thread starts with gradients on, no scope, seed 0, and the observers of `thread_start`
(tg.debug's breakpoints from TINYGRAD_CKPT_BREAK).

Per process: the active backend (backend.use_backend), the creation number of every tensor, the
sequence number every entry gets when recorded, and the record of buffers changed in place (each
change also takes a sequence number, so an entry knows a saved buffer changed after it was recorded
when the change's number is larger).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref

thread_start: list = []  # factories of the observers every new thread starts with
backend = None  # the active backend (backend.current() makes it on first use)


class ThreadState(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.prefix = ""
        self.observers: list = [make() for make in thread_start]
        self.segments = 0
        self.seed, self.counter = 0, 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"<this thread's engine state: {fields}>"


local = ThreadState()

_tensors = itertools.count()  # next() is atomic in CPython: safe across threads
_sequence = itertools.count()
changed: dict[int, tuple[int, int, str]] = {}  # id(buffer) -> (sequence number, version, tensor name)


def next_tensor() -> int:
    """The creation number of a new tensor: a checkpoint tells tensors made inside it from older ones."""
    return next(_tensors)


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


def changed_since(buffer, seq: int):
    """(sequence number, version, tensor name) of the last in-place change to `buffer` if it came after `seq`."""
    change = changed.get(id(buffer))
    return change if change is not None and change[0] > seq else None


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
