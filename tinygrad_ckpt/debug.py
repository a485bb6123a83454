"""Debugging aids: stop in pdb before a tape entry's backward, and find the first NaN/Inf.

    tg.debug.break_before("softmax")      # or TINYGRAD_CKPT_BREAK=softmax in the environment
    loss.backward()                       # pdb opens inside Tape.backward_steps; try `p entry`,
                                          # `p entry.ctx.saved`, `p [g.shape for g in grad_outs]`

A pattern matches an entry's op kind ("softmax") or any part of its scoped name ("h.3.attn").
"""

from __future__ import annotations

import contextlib
import os
import sys

_patterns: list[str] = [p for p in os.environ.get("TINYGRAD_CKPT_BREAK", "").split(",") if p]
_anomaly = {"on": False}


def break_before(*patterns: str) -> None:
    """Open pdb before the backward of every tape entry whose op or scoped name matches."""
    _patterns.extend(patterns)


def clear_breakpoints() -> None:
    _patterns.clear()


def matches(entry, pattern: str) -> bool:
    return pattern == entry.op or pattern == entry.name or pattern in entry.name.split(".") or (
        "." in pattern and pattern in entry.name
    )


def should_break(entry) -> bool:
    return bool(_patterns) and any(matches(entry, p) for p in _patterns)


def enter_debugger(entry) -> None:
    """Stop in the backward loop's frame, where `entry`, `grad_outs` and the tape are in scope."""
    import pdb

    print(f"tinygrad_ckpt: stopping before the backward of {entry!r}", file=sys.stdout)
    pdb.Pdb().set_trace(sys._getframe(1))


@contextlib.contextmanager
def detect_anomaly():
    """Raise at the first op (by scoped name) whose forward or backward produces NaN or Inf."""
    previous = _anomaly["on"]
    _anomaly["on"] = True
    try:
        yield
    finally:
        _anomaly["on"] = previous


def _bad(a) -> bool:
    from .backend import current

    if current().name == "meta" or a is None or a.dtype.kind not in "fc":
        return False
    return not bool(current().xp.isfinite(a).all())


def check_forward(name: str, outputs) -> None:
    if _anomaly["on"]:
        for i, out in enumerate(outputs):
            if _bad(out):
                raise FloatingPointError(
                    f"anomaly: forward of '{name}' produced NaN/Inf in output {i} of shape {list(out.shape)}; "
                    "inspect its inputs (e.g. log of a non-positive value, overflow in exp)."
                )


def check_backward(entry, grad_ins) -> None:
    if _anomaly["on"]:
        for i, g in enumerate(grad_ins):
            if _bad(g):
                raise FloatingPointError(
                    f"anomaly: backward of '{entry.name}' ({entry.op}) produced NaN/Inf in the gradient of "
                    f"input {i} of shape {list(g.shape)}; its saved arrays are {list(entry.ctx.saved)}."
                )
