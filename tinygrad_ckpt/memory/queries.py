"""What a ledger's records say, computed when asked: functions over its event log (events.EventLog) and lifetimes.

timeline: the live bytes per category after every event kept; backward_passes: the runs of backward ops;
lifetimes: each saved buffer's created / used / released steps and how long it sat idle; saved_breakdown: the
bytes saved for backward per layer, module, op or name; flops_by_layer; summary: the ledger's table.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..checks import one_of
from ..units import format_bytes
from .events import ALLOCATED, BACKWARD, CATEGORIES, EXISTING, PHASES, RECOMPUTE, RELEASED, UNTOUCHED, Lifetime


def timeline(log, base_live: list, base_flops: int, placement=None) -> dict:
    """Ledger.timeline() of the events in `log`, counted from the bytes live before its first event (`base_live`) and
    the FLOPs before it; with a placement, "reserved" after each event. The "existing" events the ledger's entry
    scan wrote (one per buffer alive then) all show the state after the last of them: that work was held from the
    start, so no column ramps up to it."""
    col = log.columns()
    action, cat, src, nbytes = col["action"], col["category"], col["from_category"], col["nbytes"]
    allocates = ((action == EXISTING) | (action == ALLOCATED)) & (src < 0)
    released = (action == RELEASED) & ~allocates
    moves = ~allocates & ~released & (src >= 0) & (src != cat)
    out = {"seq": col["seq"], "step": col["step"]}
    flops = np.zeros(len(action), dtype=np.int64)
    flops[np.array(log.op_seq, dtype=np.int64) - log.first] = np.array(log.op_flops)
    out["flops"] = base_flops + np.cumsum(flops)
    total = np.zeros(len(action), dtype=np.int64)
    for c, name in enumerate(CATEGORIES):
        into, out_of = (allocates | moves) & (cat == c), (released & (cat == c)) | (moves & (src == c))
        out[name] = base_live[c] + np.cumsum(np.where(into, nbytes, 0) - np.where(out_of, nbytes, 0))
        total += out[name]
    out["total"] = total
    if placement is not None:  # what PyTorch's allocator would have reserved (Ledger(allocator=...))
        out["reserved"] = np.array(placement.after_event, dtype=np.int64)
    existing = np.flatnonzero(action == EXISTING)
    if len(existing) > 1:  # the entry scan's rows: all at the state after it
        at_entry = existing[-1]
        for name in (*CATEGORIES, "total", "reserved"):
            if name in out:
                out[name][existing[:-1]] = out[name][at_entry]
    out["phase"] = np.array(PHASES, dtype=object)[col["phase"]]
    out["time"] = col["time"]
    return out


def op_columns(log) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, phase code, FLOPs) of every op slice kept in `log`."""
    codes = np.array(log.code, dtype=np.int64)[np.array(log.op_seq, dtype=np.int64) - log.first]
    steps = np.arange(log.first_op + 1, log.first_op + 1 + len(codes), dtype=np.int64)
    return steps, codes >> 4 & 15, np.array(log.op_flops, dtype=np.int64)


def backward_passes(log) -> list[tuple[int, int]]:
    """(first step, last step) of each run of backward/recompute ops in `log`."""
    steps, phases, _ = op_columns(log)
    runs, start, last = [], None, None
    for step, phase in zip(steps.tolist(), phases.tolist()):
        if phase in (BACKWARD, RECOMPUTE):
            if start is None:
                start = step
            last = step
        elif start is not None:
            runs.append((start, last))
            start = None
    if start is not None:
        runs.append((start, last))
    return runs


def lifetimes(log, lives) -> list[Lifetime]:
    """Each row of `lives` (events.Lifetimes) as a Lifetime, with its idle fraction in the backward pass that first
    used it: in steps, and in that pass's FLOPs."""
    runs = backward_passes(log)
    steps, phases, op_flops = op_columns(log)
    backward = phases == BACKWARD
    bw_steps = steps[backward]
    bw_flops = np.concatenate([[0], np.cumsum(op_flops[backward])])  # bw_flops[k]: FLOPs of the first k

    def flops_until(step):  # backward FLOPs of the steps <= step
        return int(bw_flops[np.searchsorted(bw_steps, step, side="right")])

    out = []
    for row in range(len(lives)):
        life = lives.record(row, log.origins)
        out.append(life)
        if life.first_used is None:
            continue
        for start, end in runs:
            if start - 1 <= life.first_used <= end:
                span = end - start + 1
                life.idle_fraction = (life.first_used - (start - 1)) / span
                done = flops_until(life.first_used) - flops_until(start - 1)
                total = flops_until(end) - flops_until(start - 1)
                life.idle_fraction_flops = done / total if total else None
                break
    return out


def saved_breakdown(origins: list, lives, by: str, depth: int | None) -> dict:
    """Ledger.saved_breakdown() of the saved buffers `lives` (their origins: `origins`)."""
    one_of("saved_breakdown", "by", by, ("layer", "module", "op", "name"))
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 1):
        kind = ValueError if isinstance(depth, numbers.Integral) and not isinstance(depth, bool) else TypeError
        raise kind(f"saved_breakdown: depth must be None or a positive int (dot-separated parts of the module "
                   f"name to keep), got {depth!r}")
    out: dict[str, int] = {}
    for origin, nbytes in zip(lives.origin, lives.nbytes):
        o = origins[origin]
        if by == "module":
            parts = o.scope.split(".") if o.scope else ["(top)"]
            key = ".".join(parts[:depth] if depth else parts)
        else:
            key = {"name": o.name, "layer": o.layer, "op": o.op}[by]
        out[key] = out.get(key, 0) + nbytes
    return out


def flops_by_layer(ops, phase: str) -> dict:
    """FLOPs of the op slices `ops` of one phase, per layer."""
    one_of("flops_by_layer", "phase", phase, PHASES)
    out: dict[str, int] = {}
    for op in ops:
        if op["phase"] == phase:
            out[op["layer"]] = out.get(op["layer"], 0) + op["flops"]
    return out


def summary(counts, flops_by_phase: dict, reserved: str | None, footer: list[str]) -> str:
    """Ledger.summary()'s table of the byte counts (counts.ByteCounts), the allocator's `reserved` line if any, the
    FLOPs, and the `footer` lines that only the ledger knows (what it recorded and kept)."""
    rows = [f"{'category':<16}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
    rows.append("-" * len(rows[0]))

    def row(label, *values):
        return f"{label:<16}" + "".join(f"{format_bytes(v, digits=2):>14}" for v in values)

    for i, c in enumerate(CATEGORIES):
        rows.append(row(c, counts.live[i], counts.peak_bytes(c, False), counts.allocated[i], counts.freed[i]))
    rows.append("-" * len(rows[0]))
    rows.append(row("total", counts.live_bytes(None, False), counts.peak_bytes(None, False)))
    rows.append(row("with untouched", counts.live_bytes(None, True), counts.peak_bytes(None, True), *counts.real))
    rows += ["", untouched_line(counts), *([reserved] if reserved is not None else [])]
    rows.append("FLOPs  " + "  ".join(f"{p} {flops_by_phase[p]:.3e}" for p in PHASES))
    rows += footer
    return "\n".join(rows)


def untouched_line(counts) -> str:
    """One line on the bytes held before the ledger started that the recorded code never used."""
    held = counts.allocated[UNTOUCHED]
    if not held:
        return "untouched: none (every buffer held before the ledger started was used by what it recorded)"
    return (f"untouched: {format_bytes(held, digits=2)} held before the ledger started was never read or "
            f"written by what it recorded ({format_bytes(counts.live[UNTOUCHED], digits=2)} still held), left "
            "out of the total and its peak")
