"""Naming ops by pattern: a pattern names an op by its kind ("softmax") or by a run of whole dotted parts of its
scoped name ("attn", "h.3.attn"; "h.1" is not "h.10"). The debugger's breakpoints and the name-based save
policies both read patterns this way, so the rule lives here once."""

from __future__ import annotations

import difflib


def matches(op: str, name: str, pattern: str) -> bool:
    """Does `pattern` name this op: its kind ("softmax") or a run of whole dotted parts of its scoped name
    ("attn", "h.3.attn", the whole name), so that "h.1" names h.1's ops and not h.10's?"""
    if pattern == op:
        return True
    parts, wanted = name.split("."), pattern.split(".")
    n = len(wanted)
    return any(parts[i:i + n] == wanted for i in range(len(parts) - n + 1))


def closest_names(pattern: str, names) -> list[str]:
    """Up to four of the op kinds and dotted parts of `names` that look most like `pattern` (for a warning)."""
    parts = {".".join(name.split(".")[i:j]) for name in names
             for i in range(name.count(".") + 1) for j in range(i + 1, name.count(".") + 2)}
    return difflib.get_close_matches(pattern, sorted(p for p in parts if not p[:1].isdigit()), n=4, cutoff=0.5)
