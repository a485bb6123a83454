"""Everything the engine remembers between calls, in one place.

Per thread (one `threading.local`, as PyTorch keeps its grad mode), so two threads never see each
other's settings: `grad_enabled` (off inside `no_grad()`), `prefix` (the name scope, "h.3.mlp."),
`observers` (a Ledger, a checkpointed segment, anomaly checks, breakpoints: observe.py), `segments` (how
many checkpointed segments run now, one inside another), `autocast` (amp.py), `saves` (whose choice of saved
arrays the ops follow: "engine", "pytorch" or "megatron"), `op_variants` (that framework's ops, {engine op:
variant}, which scale/save_profiles.saves_like fills) and `seed`, `counter` (draw n uses a
generator seeded with [seed, n]). A new thread starts with gradients on, no scope, seed 0, and the observers of
`thread_start` (tg.debug's breakpoints from TINYGRAD_CKPT_BREAK).

Per process: the active backend, the creation number of every tensor, the sequence number of every entry
and of every in-place change (so an entry knows a saved buffer changed after it), the leaves that require
grad by buffer, and weak references to every live tensor, optimizer and printed tape (what a Ledger entered
now finds). What each field holds, in full: docs/house.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import os
import threading
import types
import weakref

# Importing the package changes two process-wide settings, for speed, unless TINYGRAD_CKPT_TUNE=0: OpenBLAS's idle
# spin (backend/threads.py) and glibc's malloc thresholds (backend/allocator.py); `process_settings` says what it set.
tune_process = os.environ.get("TINYGRAD_CKPT_TUNE", "1") != "0"
process_settings: dict = {}

thread_start: list = []  # factories of the observers every new thread starts with
backend = None  # the active backend (backend.current() makes it on first use)


class ThreadState(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.prefix = ""
        self.observers: list = [make() for make in thread_start]
        self.segments = 0
        self.autocast = None
        self.saves = "engine"
        self.op_variants: dict = {}
        self.seed, self.counter = 0, 0

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"<this thread's engine state: {fields}>"


local = ThreadState()

_tensors = itertools.count()  # next() is atomic in CPython: safe across threads
_sequence = itertools.count()
changed: dict[int, tuple[int, int, str]] = {}  # id(buffer) -> (sequence number, version, tensor name)
grad_leaves = weakref.WeakValueDictionary()  # id(buffer) -> a leaf requiring grad on it (in-place checks)


def next_tensor() -> int:
    """A number larger than every tensor's creation number so far: a checkpoint tells tensors made inside it from
    older ones."""
    return next(_tensors)


# ---- what is alive: weak references, so remembering keeps nothing alive ---------------------------------------
_tensor_refs: list = []  # a weak reference to every tensor made, oldest first; dead ones are dropped now and then
_tidy_at = 1024  # drop the dead references when there are more than this (twice the live ones after the last tidy)
_tidying = threading.Lock()
_optimizers = weakref.WeakValueDictionary()  # creation order -> optimizer
_tapes = weakref.WeakValueDictionary()  # creation order -> a Tape (tensor.tape()) someone may hold after its tensors
_others = itertools.count()


def new_tensor(tensor) -> int:
    """Remember a new tensor weakly (`live_tensors`) and return its creation number (Tensor._init calls this once
    per tensor: a weak reference and an append, about 0.1 µs)."""
    _tensor_refs.append(weakref.ref(tensor))
    if len(_tensor_refs) > _tidy_at:
        _tidy()
    return next(_tensors)


def _tidy() -> None:
    """Drop the references of dead tensors (amortized: each tidy at least halves what is left to tidy)."""
    global _tidy_at
    if not _tidying.acquire(blocking=False):  # another thread tidies now
        return
    try:
        n = len(_tensor_refs)  # references appended meanwhile (other threads) sit after n and stay
        alive = [r for r in _tensor_refs[:n] if r() is not None]
        _tensor_refs[:n] = alive
        _tidy_at = max(1024, 2 * len(alive))
    finally:
        _tidying.release()


def live_tensors() -> list:
    """Every tensor alive now, oldest first (garbage not yet collected included: its memory is still held)."""
    return [t for t in (r() for r in list(_tensor_refs)) if t is not None]


def new_optimizer(optimizer) -> None:
    _optimizers[next(_others)] = optimizer


def live_optimizers() -> list:
    """Every optimizer alive now, oldest first."""
    return list(_optimizers.values())


def new_tape(tape) -> None:
    _tapes[next(_others)] = tape


def live_tapes() -> list:
    """Every Tape (`tensor.tape()`) alive now: it holds its entries, and their saves, after its tensors are gone."""
    return list(_tapes.values())


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


class Patched:
    """Attributes of this thread's state set for a `with` block, then restored. Reusable and re-entrant, as PyTorch's
    mode objects are (nanoGPT's `ctx = autocast(...)` entered once per step, or inside itself): each entry keeps
    what it replaced, and its exit puts that back."""

    def __init__(self, values: dict):
        self.values, self._before = values, []

    def __enter__(self) -> None:
        self._before.append({k: getattr(local, k) for k in self.values})
        for k, v in self.values.items():
            setattr(local, k, v)

    def __exit__(self, *exc) -> None:
        for k, v in self._before.pop().items():
            setattr(local, k, v)

    def __repr__(self) -> str:
        return f"<patched {self.values}, entered {len(self._before)} time(s) now>"


def patched(**values) -> Patched:
    """Set attributes of this thread's state for the duration of a `with` block, then restore them."""
    return Patched(values)


SAVES = {
    "engine": "this engine's own: a norm keeps its output, dropout a mask of 1 bit an element",
    "pytorch": "PyTorch's autograd on CUDA: a norm keeps its input, mean and 1/std, dropout a mask of 1 byte",
    "megatron": "Korthikanti et al. 2022, Table 2: a norm keeps its input only, dropout a 1-byte mask, the causal "
                "mask is made again in backward",
}


def op_variant(fn):
    """The op to run for the engine op `fn` under the saves mode in force: its variant, or `fn` itself."""
    return local.op_variants.get(fn, fn)


def name_scope(name: str):
    """Prefix the names of ops recorded inside with `name` (modules do this when called)."""
    return patched(prefix=f"{local.prefix}{name}.") if name else contextlib.nullcontext()


# ---- grad mode: a context manager and a decorator, as PyTorch's -------------------------------------------------
class GradMode:
    """Recording on (`enabled`) or off for a `with` block, or for every call of a function it decorates. Decorating a
    generator function or an `async def`, the mode holds inside each resumption and not between them (PyTorch's
    decorators do the same for generators), so code that drives the generator keeps its own mode."""

    def __init__(self, enabled: bool):
        self.enabled, self._before = bool(enabled), []

    def __enter__(self):
        self._before.append(local.grad_enabled)
        local.grad_enabled = self.enabled

    def __exit__(self, *exc):
        local.grad_enabled = self._before.pop()

    def __call__(self, fn):
        mode = self.enabled
        if inspect.iscoroutinefunction(fn):
            async def call(*args, **kwargs):
                return await _resumed(mode, fn(*args, **kwargs))
        elif inspect.isgeneratorfunction(fn):
            def call(*args, **kwargs):
                return (yield from _resumed(mode, fn(*args, **kwargs)))
        else:
            def call(*args, **kwargs):
                with GradMode(mode):
                    return fn(*args, **kwargs)
        return functools.wraps(fn)(call)


@types.coroutine
def _resumed(mode: bool, steps):
    """Drive a generator or coroutine with the grad mode set to `mode` while it runs, restored while it waits."""
    sent, thrown = None, None
    while True:
        with GradMode(mode):
            try:
                out = steps.send(sent) if thrown is None else steps.throw(thrown)
            except StopIteration as stop:
                return stop.value
        sent, thrown = None, None
        try:
            sent = yield out
        except GeneratorExit:
            steps.close()
            raise
        except BaseException as exc:  # thrown in by the caller: passed on inside the mode
            thrown = exc


def no_grad(fn=None):
    """Run ops without recording: nothing is saved, outputs do not require grad (this thread only). As PyTorch's,
    `@tg.no_grad` decorates a function as `@tg.no_grad()` does."""
    return _grad_mode("no_grad", False, fn)


def enable_grad(fn=None):
    """Record again inside a `no_grad()` block (this thread only); `@tg.enable_grad` decorates as
    `@tg.enable_grad()`."""
    return _grad_mode("enable_grad", True, fn)


def _grad_mode(call: str, enabled: bool, fn):
    """GradMode(enabled), or, given a function (the mode used as a bare decorator), that function under it."""
    if fn is None:
        return GradMode(enabled)
    if not callable(fn) or isinstance(fn, bool):
        raise TypeError(f"{call}: takes no argument (`with tg.{call}():`), or the function it decorates "
                        f"(`@tg.{call}`), got {fn!r}; to choose the mode with a flag, use tg.set_grad_enabled(flag)")
    return GradMode(enabled)(fn)


class set_grad_enabled(GradMode):  # noqa: N801  (PyTorch's name)
    """`set_grad_enabled(mode)` turns recording on or off at once (this thread); used in `with` or as a decorator, only
    for that block or function, as PyTorch's."""

    def __init__(self, mode: bool):
        super().__init__(mode)
        self._before.append(local.grad_enabled)
        local.grad_enabled = self.enabled

    def __enter__(self):
        pass  # set already, by the call

    def __call__(self, fn):
        local.grad_enabled = self._before.pop()  # a decorator changes nothing until the function runs
        return super().__call__(fn)


def is_grad_enabled() -> bool:
    """Whether ops record on this thread now."""
    return local.grad_enabled
