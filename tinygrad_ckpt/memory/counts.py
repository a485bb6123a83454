"""The ledger's byte counters: live, peak, allocated and freed bytes per category, as events change them.

live[c] is what category c holds now; the total adds every category, and "used" is the total less
"untouched" (what the recorded code used). Peaks are kept twice: over the iterations before the one in
progress (`peak`, `peak_total`, `peak_used`) and during it (`it_peak`, ...), so that a bounded ledger can close
an iteration and still know the whole run's peaks. `real` counts allocations and releases of memory only:
a move between categories is freed in one and allocated in the other, but neither in `real`.
"""

from __future__ import annotations

import numpy as np

from .events import CATEGORIES, UNTOUCHED

_CATEGORY = {c: i for i, c in enumerate(CATEGORIES)}


class ByteCounts:
    """Bytes per category code (events.CATEGORIES); see the module docstring."""

    def __init__(self):
        n = len(CATEGORIES)
        self.live, self.peak, self.it_peak = [0] * n, [0] * n, [0] * n
        self.allocated, self.freed = [0] * n, [0] * n  # into / out of each category (moves included)
        self.total = self.peak_total = self.it_peak_total = 0
        self.peak_used = self.it_peak_used = 0
        self.real = [0, 0]  # bytes allocated, freed: real memory only

    def add(self, category: int, nbytes: int) -> None:
        """`nbytes` more (or fewer) live in `category`; the peaks of the iteration follow."""
        live = self.live[category] = self.live[category] + nbytes
        if live > self.it_peak[category]:
            self.it_peak[category] = live
        self.total += nbytes
        if self.total > self.it_peak_total:
            self.it_peak_total = self.total
        if self.total - self.live[UNTOUCHED] > self.it_peak_used:
            self.it_peak_used = self.total - self.live[UNTOUCHED]

    def allocate(self, category: int, nbytes: int) -> None:
        """A new buffer of `nbytes` in `category` (real memory)."""
        self.allocated[category] += nbytes
        self.real[0] += nbytes
        self.add(category, nbytes)

    def release(self, category: int, nbytes: int) -> None:
        """A buffer's memory is freed."""
        self.live[category] -= nbytes
        self.total -= nbytes
        self.freed[category] += nbytes
        self.real[1] += nbytes

    def move(self, old: int, new: int, nbytes: int) -> None:
        """A buffer leaves category `old` for `new`: freed there, allocated here; no real memory."""
        self.live[old] -= nbytes
        self.total -= nbytes  # add puts it back
        self.freed[old] += nbytes
        self.allocated[new] += nbytes
        self.add(new, nbytes)

    def retag(self, source: int, target: int, nbytes: int, finished: bool) -> None:
        """A buffer held all along counts in `target` instead of `source` (it leaves "untouched"): its bytes move in
        the live, allocated and peak counts, and in the peaks of finished iterations if there are any."""
        for counts in (self.live, self.it_peak, self.allocated, *((self.peak,) if finished else ())):
            counts[source] -= nbytes
            counts[target] += nbytes
        self.it_peak_used += nbytes
        if finished:
            self.peak_used += nbytes

    def close_iteration(self) -> None:
        """The iteration in progress ends: fold its peaks into the run's, and start the next one's at what is live."""
        self.peak = [max(a, b) for a, b in zip(self.peak, self.it_peak)]
        self.peak_total = max(self.peak_total, self.it_peak_total)
        self.peak_used = max(self.peak_used, self.it_peak_used)
        self.it_peak, self.it_peak_total = list(self.live), self.total
        self.it_peak_used = self.total - self.live[UNTOUCHED]

    def live_bytes(self, category: str | None, untouched: bool) -> int:
        if category is not None:
            return self.live[_CATEGORY[category]]
        return self.total if untouched else self.total - self.live[UNTOUCHED]

    def peak_bytes(self, category: str | None, untouched: bool) -> int:
        if category is not None:
            c = _CATEGORY[category]
            return max(self.peak[c], self.it_peak[c])
        if untouched:
            return max(self.peak_total, self.it_peak_total)
        return max(self.peak_used, self.it_peak_used)


def check_whole(method: str, category, untouched) -> None:
    """untouched=True asks for the total of every category: refuse it with a category."""
    if not isinstance(untouched, (bool, np.bool_)):
        raise TypeError(f"{method}: untouched must be True or False, got {untouched!r}")
    if untouched and category is not None:
        raise ValueError(f"{method}: untouched=True adds the untouched bytes to the total of every category; give "
                         f"it without a category (or ask for {method}('untouched'))")
