"""The iteration window of a ledger: which training iterations it remembers in full, and a summary of the others.

An iteration begins with the first forward op after a backward or optimizer phase. When one ends, its summary
(events.Iteration: ops, events, FLOPs, bytes per category and their peaks) joins the log; a bounded ledger
(`keep_iterations=N`) then forgets the events, op slices and lifetimes of the oldest beyond the last N, and keeps
what was live before its first kept event (`base_live`) and the FLOPs dropped (`base_flops`), so that its
timeline stays exact.
"""

from __future__ import annotations

import numbers

import numpy as np

from .events import CATEGORIES, PHASES, Iteration, IterationLog


def check_keep(keep_iterations) -> int | None:
    """keep_iterations as given to Ledger: None (keep every event) or a positive int."""
    if keep_iterations is None:
        return None
    wanted = "None (keep every event) or a positive int (the training iterations whose events are kept)"
    if isinstance(keep_iterations, bool) or not isinstance(keep_iterations, numbers.Integral):
        raise TypeError(f"Ledger: keep_iterations must be {wanted}, got {keep_iterations!r}")
    if keep_iterations < 1:
        raise ValueError(f"Ledger: keep_iterations must be {wanted}, got {keep_iterations!r}")
    return int(keep_iterations)


class IterationWindow:
    """The finished iterations' log, where the one in progress began, and what a bounded ledger dropped."""

    def __init__(self, keep: int | None):
        self.keep = keep
        self.log = IterationLog()  # one summary per finished training iteration
        self.start = (0, 0, [0] * len(PHASES))  # where the one in progress began: (op step, event seq, FLOPs)
        self.ended = False  # a backward or optimizer phase ended: the next forward op begins an iteration
        self.base_live = [0] * len(CATEGORIES)  # live bytes before the first event kept
        self.base_flops = 0  # FLOPs of the ops no longer kept

    @property
    def finished(self) -> bool:
        return len(self.log) > 0

    def row(self, counts, step: int, seq: int, flops: dict) -> list:
        """The iteration in progress as a row of IterationLog (counts: the ledger's ByteCounts)."""
        first, first_seq, first_flops = self.start
        return [first, step - first, seq - first_seq, *(now - then for now, then in zip(flops.values(), first_flops)),
                *counts.live, *counts.it_peak, counts.it_peak_used, counts.it_peak_total]

    def close(self, counts, step: int, seq: int, flops: dict) -> list[Iteration]:
        """The iteration in progress ends: log it, fold its peaks into the run's; returns the iterations that now fall
        out of a bounded window, oldest first (their events are to be forgotten)."""
        self.ended = False
        self.log.append(self.row(counts, step, seq, flops))
        counts.close_iteration()
        self.start = (step, seq, list(flops.values()))
        dropped = []
        while self.keep is not None and len(self.log) + 1 - self.log.first_kept > self.keep:
            dropped.append(self.log[self.log.first_kept])
            self.log.first_kept += 1
        return dropped

    def forget(self, old: Iteration, log, placement, lives, buffers) -> int:
        """Drop iteration `old`'s events and op slices from `log`, its reserved bytes from `placement` and the lifetimes
        that ended within it (renumbering the rows the live `buffers` point at); returns its last op step."""
        log.drop(old.events, old.ops)
        if placement is not None:
            placement.drop(old.events, log.first)
        self.base_live = list(old.live.values())
        self.base_flops += sum(old.flops.values())
        end = old.first_step + old.ops  # the next iteration's first op is step end + 1; its saves are made at end
        gone = (np.array(lives.created, dtype=np.int64) < end) & (np.array(lives.released, dtype=np.int64) >= 0)
        if gone.any():
            rows = lives.keep(~gone)
            for buf in buffers:
                if buf.life >= 0:
                    buf.life = int(rows[buf.life])
        return end

    def retag(self, source: int, target: int, nbytes: int, before_kept: bool) -> None:
        """A buffer held all along counts in `target` instead of `source`: in every finished iteration's row, and in
        the bytes live before the first kept event if it was held then (`before_kept`)."""
        if self.finished:
            self.log.retag(source, target, nbytes)
        if before_kept:
            self.base_live[source] -= nbytes
            self.base_live[target] += nbytes

    def iterations(self, counts, step: int, seq: int, flops: dict) -> list[Iteration]:
        """Every iteration's summary, the one in progress last."""
        return [*self.log, self.log.record(len(self.log), self.row(counts, step, seq, flops))]
