"""Debugging aids, each an observer (observe.py): stop in pdb before a tape entry's backward, and find the
first NaN/Inf or the first saved array changed behind the engine's back.

    tg.debug.break_before("softmax")      # or TINYGRAD_CKPT_BREAK=softmax in the environment
    loss.backward()                       # pdb opens inside tape.backward_steps; try `p entry`,
                                          # `p entry.ctx`, `p [g.shape for g in grad_outs]`, `n`

A pattern matches an entry's op kind ("softmax") or whole dotted parts of its scoped name ("attn",
"h.3.attn"; "h.1" is not "h.10"; engine/names.py). A pattern that has not matched by the end of a backward pass is
reported once, with the closest names it could have meant. `q` at a stop ends the program quietly.
Breakpoints belong to the thread that set them (every thread starts with TINYGRAD_CKPT_BREAK's).

`detect_anomaly()` also fingerprints every saved array when it is saved and checks it again before
backward reads it, which catches a change made behind the engine's back (`tensor.data[...] = ...`).
"""

from __future__ import annotations

import math
import os
import pdb
import sys
import warnings
import weakref
import zlib

from . import backend, state
from .checks import kind
from .engine.names import closest_names, matches
from .engine.observe import Observer, observing


class Breakpoints(Observer):
    """Opens pdb before the backward of every entry that a pattern matches; at the end of each backward pass,
    warns once about each pattern that has stopped nothing yet."""

    def __init__(self, patterns=()):
        self.patterns: list[str] = list(patterns)
        self.fired: set[str] = set()  # patterns that stopped a backward (or were reported as never)
        self.seen: set[str] = set()  # op kinds and names backward went through
        self.depth = 0  # backward passes running (a checkpoint's replay runs one inside another)

    def __repr__(self) -> str:
        return f"<breakpoints before {', '.join(self.patterns) or 'nothing'}>"

    def on_backward(self, entry) -> None:
        hits = [p for p in self.patterns if matches(entry.op, entry.name, p)]
        self.seen.update((entry.op, entry.name))
        if hits:
            self.fired.update(hits)
            enter_debugger(entry)

    def begin_phase(self, name: str) -> None:
        self.depth += name == "backward"

    def end_phase(self, name: str) -> None:
        if name != "backward":
            return
        self.depth -= 1
        if self.depth == 0:
            for pattern in [p for p in self.patterns if p not in self.fired]:
                close = closest_names(pattern, self.seen)
                hint = f"; the closest names backward went through: {', '.join(close)}" if close else ""
                warnings.warn(f"break_before({pattern!r}) matched no tape entry in this backward pass{hint}. A pattern "
                              "is an op kind (softmax) or whole dotted parts of a scoped name (transformer.h.1.attn).",
                              stacklevel=6)  # the caller of loss.backward()
                self.fired.add(pattern)


def _breakpoints(create: bool = False) -> Breakpoints | None:
    """This thread's Breakpoints observer (made and installed if `create`)."""
    found = next((o for o in state.local.observers if isinstance(o, Breakpoints)), None)
    if found is None and create:
        found = Breakpoints()
        state.local.observers.insert(0, found)  # oldest: a ledger's events come before pdb stops
    return found


def break_before(*patterns) -> None:
    """Open pdb before the backward of every tape entry whose op or scoped name matches (this thread). Each
    pattern is a string; a list or tuple of them counts as its strings (`break_before(["softmax", "gelu"])`).
    All are checked before any is added: a bad one raises here and leaves the breakpoints as they were."""
    flat = [p for group in patterns for p in (group if isinstance(group, (list, tuple)) else [group])]
    for p in flat:
        if not isinstance(p, str):
            raise TypeError(f"break_before: a pattern must be a string (an op kind such as 'softmax' or a scoped "
                            f"name such as 'transformer.h.1.attn'), got {p!r} ({type(p).__name__})")
        if not p.strip() or p != p.strip():
            raise ValueError(f"break_before: pattern {p!r} is empty or has spaces around it; write e.g. 'softmax'")
    found = _breakpoints(create=bool(flat))
    for p in flat:
        if p not in found.patterns:  # a pattern set twice stops once
            found.patterns.append(p)


def breakpoints() -> list[str]:
    """This thread's breakpoint patterns."""
    found = _breakpoints()
    return list(found.patterns) if found is not None else []


def clear_breakpoints() -> None:
    """Remove this thread's breakpoints."""
    found = _breakpoints()
    if found is not None:
        state.local.observers.remove(found)


_ENVIRONMENT = [p for p in os.environ.get("TINYGRAD_CKPT_BREAK", "").split(",") if p]
if _ENVIRONMENT:
    state.thread_start.append(lambda: Breakpoints(_ENVIRONMENT))
    _breakpoints(create=True).patterns.extend(_ENVIRONMENT)


class _QuietPdb(pdb.Pdb):
    """pdb, except that `q` at a stop ends the program without a BdbQuit traceback."""

    def do_quit(self, arg):
        self.set_quit()
        raise SystemExit(0)

    do_q = do_exit = do_quit


def enter_debugger(entry) -> None:
    """Stop in the backward loop's frame (tape.backward_steps, two calls up), at the line that runs `entry`'s
    backward, where `entry`, `grad_outs` and the tape are in scope. Under `python -m pdb` the running session
    stops there (its `q` and `c` work as usual); else a new one."""
    print(f"tinygrad_ckpt: stopping before the backward of {entry!r}", file=sys.stdout)
    frame = sys._getframe(2)
    running = getattr(sys.gettrace(), "__self__", None)
    debugger = running if isinstance(running, pdb.Pdb) else _QuietPdb()
    debugger.reset()  # bdb's set_trace, but stopping at a later line of that frame: past the observers' loop
    f = frame
    while f is not None:
        f.f_trace = debugger.trace_dispatch
        debugger.botframe = f
        f = f.f_back
    debugger.set_until(frame, frame.f_lineno + 1)
    sys.settrace(debugger.trace_dispatch)


class AnomalyCheck(Observer):
    """detect_anomaly()'s observer: NaN/Inf in any forward or backward, and saved arrays changed since saved."""

    def __init__(self):
        self.fingerprints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # entry -> {save: checksum}

    def on_op(self, call, outputs) -> None:
        """No NaN out, no Inf either unless the op was asked for one (masked_fill(value=-inf) fills the causal
        mask on purpose); then fingerprint what the entry saved."""
        infs_allowed = any(isinstance(v, float) and math.isinf(v) for v in call.params.values())
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        for i, out in enumerate(outs):
            if _bad(getattr(out, "data", None), infs_allowed):
                raise FloatingPointError(
                    f"anomaly: forward of '{call.name}' produced NaN/Inf in output {i} of shape {list(out.shape)}; "
                    "inspect its inputs (e.g. log of a non-positive value, overflow in exp)."
                )
        if call.entry is not None:
            self.fingerprints[call.entry] = {k: _fingerprint(a) for k, a in call.ctx.saved.items()}

    def on_backward(self, entry) -> None:
        """Raise if an array `entry` saved no longer holds what it held when saved."""
        before = self.fingerprints.get(entry, {})
        for key, a in entry.ctx.saved.items():
            if before.get(key) is not None and _fingerprint(a) != before[key]:
                raise RuntimeError(
                    f"'{entry.name}' [{entry.op}] saved '{key}' {list(a.shape)} {a.dtype} for backward, but its "
                    "values changed afterwards (a write such as tensor.data[...] = ..., which the engine cannot see). "
                    "Make the change after backward(), or on a copy."
                )

    def on_backward_done(self, entry, grad_ins) -> None:
        for i, g in enumerate(grad_ins):
            if _bad(g):
                raise FloatingPointError(
                    f"anomaly: backward of '{entry.name}' ({entry.op}) produced NaN/Inf in the gradient of "
                    f"input {i} of shape {list(g.shape)}; its saved arrays are {list(entry.ctx.saved)}."
                )


def detect_anomaly():
    """Raise at the first op (by scoped name) whose forward or backward produces NaN or Inf, and at the
    first backward that reads a saved array changed since it was saved (this thread only)."""
    return observing(AnomalyCheck())


def _bad(a, infs_allowed: bool = False) -> bool:
    be = backend.current()
    if not be.has_values or a is None or not hasattr(a, "dtype") or kind(a.dtype) not in "fc":
        return False
    return bool(be.xp.isnan(a).any()) if infs_allowed else not bool(be.xp.isfinite(a).all())


def _fingerprint(a):
    be = backend.current()
    if not be.is_array(a) or not be.has_values:
        return None
    return zlib.crc32(be.to_numpy(a).tobytes())
