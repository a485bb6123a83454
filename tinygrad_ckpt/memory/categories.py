"""A buffer's category, and the "untouched" rule for what the engine held before a ledger started.

Each buffer has one category at a time, the strongest of the roles it plays:
parameter > optimizer > gradient > activation (saved by the tape) > other (live tensors).
What the engine held before the ledger started is "untouched" until the recorded code reads, writes or saves
it, or takes its gradient (`touch`). Then it counts in its real category, and from the start (its first events,
the peaks and the iteration rows move there), so a plain step's numbers are what they would be without this
rule. What the code never touches stays "untouched": left out of peak_bytes() and live_bytes().
"""

from __future__ import annotations

import weakref

from .. import state
from ..engine.tape import graph
from .events import ACTIVATION, EXISTING, GRADIENT, OPTIMIZER_STATE, OTHER, PARAMETER, UNTOUCHED


class Buffer:
    """A buffer the engine holds: its id, size, category, the roles it plays (a bit per category) and how many
    live tape saves hold it; the origin of its first event, its row in the lifetimes (-1: never saved), the
    weak reference that reports its release, and while it is untouched the seqs of its events so far."""

    __slots__ = ("id", "nbytes", "category", "roles", "saves", "origin", "life", "ref", "existing")

    def __init__(self, id: int, nbytes: int, category: int, origin: int):
        self.id, self.nbytes, self.category, self.origin = id, nbytes, category, origin
        self.roles = 0 if category == ACTIVATION else 1 << category
        self.saves, self.life, self.ref, self.existing = 0, -1, None, None


class BufferRef(weakref.ref):
    """A weak reference to a buffer's owning array that remembers the ledger's key for it."""

    __slots__ = ("key",)


def category_of(buf: Buffer) -> int:
    """The strongest role a buffer plays (the lowest category code among its roles)."""
    roles = buf.roles | (1 << ACTIVATION if buf.saves else 0)
    return (roles & -roles).bit_length() - 1 if roles else OTHER


def touch(buf: Buffer, counts, window, log, lives) -> None:
    """The recorded code uses, for the first time, a buffer held before the ledger started: it leaves "untouched"
    for the strongest of its roles, there from the start. Its events in `log`, the `counts`, the `window`'s iteration
    rows and bytes before its first kept event move: it was held all along, so each moves by its size."""
    seqs, buf.existing = buf.existing, None
    c, n = category_of(buf), buf.nbytes
    buf.category = c
    counts.retag(UNTOUCHED, c, n, window.finished)
    window.retag(UNTOUCHED, c, n, seqs[0] < log.first)  # its first events may have been dropped (a bounded ledger)
    for seq in seqs:
        log.retag(seq, c)
    if c == ACTIVATION and buf.life < 0:  # saved by a graph that existed: a lifetime from the start
        saves = [log.code[q - log.first] for q in seqs if q >= log.first and log.code[q - log.first] >> 12 & 15]
        buf.life = lives.add(buf.id, n, saves[0] >> 16 if saves else buf.origin, 0)


def scan_existing(hold, save) -> None:
    """Tell `hold(array, category, tensor, role, op, action)` and `save((name, op, scope, kept, role_of), saved,
    action)` what the engine holds now, from the weak registries in state.py: every live tensor's data and .grad,
    every optimizer's states, and the saves of the graphs those tensors (or a Tape someone holds) reach."""
    tensors = state.live_tensors()
    for t in tensors:
        name = t.name or "tensor"
        hold(t.data, PARAMETER if t.is_parameter else OTHER, name, "", "", EXISTING)
        if t._grad is not None:  # not .grad: reading it on a tensor an op made warns
            hold(t._grad, GRADIENT, name, "grad", "", EXISTING)
    for opt in state.live_optimizers():
        for p in opt.params:
            for k, a in opt.state.get(id(p), {}).items():
                hold(a, OPTIMIZER_STATE, p.name or "param", k, opt.kind, EXISTING)
    entries = {e.seq: e for e in graph(tensors)}
    for tape in state.live_tapes():
        entries.update((e.seq, e) for e in tape.entries)
    for seq in sorted(entries):
        entry = entries[seq]
        if entry.ctx.saved:
            save((entry.name, entry.op, entry.scope, "", None), entry.ctx.saved, EXISTING)
