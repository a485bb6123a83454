"""Debugging aids: stop in pdb before a tape entry's backward, and find the first NaN/Inf.

    tg.debug.break_before("softmax")      # or TINYGRAD_CKPT_BREAK=softmax in the environment
    loss.backward()                       # pdb opens inside tape.backward_steps; try `p entry`,
                                          # `p entry.ctx`, `p [g.shape for g in grad_outs]`, `n`

A pattern matches an entry's op kind ("softmax") or whole dotted parts of its scoped name ("attn",
"h.3.attn"; "h.1" is not "h.10"). A pattern that has not matched by the end of a backward pass is
reported once, with the closest names it could have meant. `q` at a stop ends the program quietly.

`detect_anomaly()` also fingerprints every saved array when it is saved and checks it again before
backward reads it, which catches a change made behind the engine's back (`tensor.data[...] = ...`).
"""

from __future__ import annotations

import difflib
import math
import pdb
import sys
import warnings
import zlib

from . import backend, state


def break_before(*patterns: str) -> None:
    """Open pdb before the backward of every tape entry whose op or scoped name matches. Each pattern is a string;
    a list or tuple of them counts as its strings (`break_before(["softmax", "gelu"])`). All are checked before
    any is added: a bad one raises here and leaves the breakpoints as they were."""
    flat = []
    for p in patterns:
        flat.extend(p if isinstance(p, (list, tuple)) else [p])
    for p in flat:
        if not isinstance(p, str):
            raise TypeError(f"break_before: a pattern must be a string (an op kind such as 'softmax' or a scoped "
                            f"name such as 'transformer.h.1.attn'), got {p!r} ({type(p).__name__})")
        if not p.strip() or p != p.strip():
            raise ValueError(f"break_before: pattern {p!r} is empty or has spaces around it; write e.g. 'softmax'")
    for p in flat:
        if p not in state.breakpoints:  # a pattern set twice stops once
            state.breakpoints.append(p)


def clear_breakpoints() -> None:
    state.breakpoints.clear()
    _fired.clear()
    _seen.clear()


_fired: set[str] = set()  # patterns that stopped a backward at least once (or were reported as never)
_seen: set[str] = set()  # op kinds and names backward went through while patterns were set


def matches(op: str, name: str, pattern: str) -> bool:
    """Does `pattern` name this op: its kind ("softmax") or a run of whole dotted parts of its scoped name
    ("attn", "h.3.attn", the whole name), so that "h.1" names h.1's ops and not h.10's?"""
    if pattern == op:
        return True
    parts, wanted = name.split("."), pattern.split(".")
    n = len(wanted)
    return any(parts[i:i + n] == wanted for i in range(len(parts) - n + 1))


def should_break(entry) -> bool:
    hits = [p for p in state.breakpoints if matches(entry.op, entry.name, p)]
    _fired.update(hits)
    _seen.update((entry.op, entry.name))
    return bool(hits)


def report_unfired() -> None:
    """At the end of a backward pass: warn once about each pattern that has stopped nothing yet."""
    for pattern in [p for p in state.breakpoints if p not in _fired]:
        parts = {".".join(name.split(".")[i:j]) for name in _seen
                 for i in range(name.count(".") + 1) for j in range(i + 1, name.count(".") + 2)}
        parts = {p for p in parts if not p[:1].isdigit()}
        close = difflib.get_close_matches(pattern, sorted(parts), n=4, cutoff=0.5)
        hint = f"; the closest names backward went through: {', '.join(close)}" if close else ""
        warnings.warn(f"break_before({pattern!r}) matched no tape entry in this backward pass{hint}. A pattern is "
                      "an op kind (softmax) or whole dotted parts of a scoped name (transformer.h.1.attn).",
                      stacklevel=5)  # the caller of loss.backward()
        _fired.add(pattern)


class _QuietPdb(pdb.Pdb):
    """pdb, except that `q` at a stop ends the program without a BdbQuit traceback."""

    def do_quit(self, arg):
        self.set_quit()
        raise SystemExit(0)

    do_q = do_exit = do_quit


def enter_debugger(entry) -> None:
    """Stop in the backward loop's frame, where `entry`, `grad_outs` and the tape are in scope. Under
    `python -m pdb` the running session stops there (its `q` and `c` work as usual); else a new one."""
    print(f"tinygrad_ckpt: stopping before the backward of {entry!r}", file=sys.stdout)
    running = getattr(sys.gettrace(), "__self__", None)
    debugger = running if isinstance(running, pdb.Pdb) else _QuietPdb()
    debugger.set_trace(sys._getframe(1))


def detect_anomaly():
    """Raise at the first op (by scoped name) whose forward or backward produces NaN or Inf, and at the
    first backward that reads a saved array changed since it was saved (this thread only)."""
    return state.patched(anomaly=True)


def _bad(a, infs_allowed: bool = False) -> bool:
    be = backend.current()
    if not be.has_values or a is None or a.dtype.kind not in "fc":
        return False
    return bool(be.xp.isnan(a).any()) if infs_allowed else not bool(be.xp.isfinite(a).all())


def check_forward(name: str, outputs, entry, params) -> None:
    """Under detect_anomaly, after an op's forward: no NaN out, no Inf either unless the op was asked for one
    (masked_fill(value=-inf) fills the causal mask on purpose), and fingerprint what it saved."""
    infs_allowed = any(isinstance(v, float) and math.isinf(v) for v in params.values())
    for i, out in enumerate(outputs):
        if _bad(out, infs_allowed):
            raise FloatingPointError(
                f"anomaly: forward of '{name}' produced NaN/Inf in output {i} of shape {list(out.shape)}; "
                "inspect its inputs (e.g. log of a non-positive value, overflow in exp)."
            )
    if entry is not None:
        entry.fingerprints = {k: _fingerprint(a) for k, a in entry.ctx.saved.items()}


def check_backward(entry, grad_ins) -> None:
    for i, g in enumerate(grad_ins):
        if _bad(g):
            raise FloatingPointError(
                f"anomaly: backward of '{entry.name}' ({entry.op}) produced NaN/Inf in the gradient of "
                f"input {i} of shape {list(g.shape)}; its saved arrays are {list(entry.ctx.saved)}."
            )


def _fingerprint(a):
    be = backend.current()
    if not be.is_array(a) or not be.has_values:
        return None
    return zlib.crc32(be.to_numpy(a).tobytes())


def check_fingerprints(entry) -> None:
    """Raise if an array `entry` saved no longer holds what it held when saved."""
    for key, a in entry.ctx.saved.items():
        before = entry.fingerprints.get(key)
        if before is not None and _fingerprint(a) != before:
            raise RuntimeError(
                f"'{entry.name}' [{entry.op}] saved '{key}' {list(a.shape)} {a.dtype} for backward, but its values "
                "changed afterwards (a write such as tensor.data[...] = ..., which the engine cannot see). Make the "
                "change after backward(), or on a copy."
            )
