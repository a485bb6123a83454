"""Debugging aids: stop in pdb before a tape entry's backward, and find the first NaN/Inf.

    tg.debug.break_before("softmax")      # or TINYGRAD_CKPT_BREAK=softmax in the environment
    loss.backward()                       # pdb opens inside tape.backward_steps; try `p entry`,
                                          # `p entry.ctx`, `p [g.shape for g in grad_outs]`

A pattern matches an entry's op kind ("softmax") or any part of its scoped name ("h.3.attn").

`detect_anomaly()` also fingerprints every saved array when it is saved and checks it again before
backward reads it, which catches a change made behind the engine's back (`tensor.data[...] = ...`).
"""

from __future__ import annotations

import math
import sys
import zlib

from . import backend, state


def break_before(*patterns: str) -> None:
    """Open pdb before the backward of every tape entry whose op or scoped name matches."""
    state.breakpoints.extend(patterns)


def clear_breakpoints() -> None:
    state.breakpoints.clear()


def matches(op: str, name: str, pattern: str) -> bool:
    """Does `pattern` name this op: its kind ("softmax"), its scoped name, a part of it ("attn"), or a dotted
    piece of it ("h.3.attn")?"""
    return pattern == op or pattern == name or pattern in name.split(".") or ("." in pattern and pattern in name)


def should_break(entry) -> bool:
    return any(matches(entry.op, entry.name, p) for p in state.breakpoints)


def enter_debugger(entry) -> None:
    """Stop in the backward loop's frame, where `entry`, `grad_outs` and the tape are in scope."""
    import pdb

    print(f"tinygrad_ckpt: stopping before the backward of {entry!r}", file=sys.stdout)
    pdb.Pdb().set_trace(sys._getframe(1))


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
