"""A ledger's capacity and its allocator: the most the engine may hold, like a GPU that cannot grow.

units.parse_capacity reads a capacity ("80GB", 2**30); `placement_for` plugs in the simulated allocator a ledger asks
for (allocator="pytorch-cuda": cuda_allocator.Placement, imported only then); `out_of_memory` is the error an op
raises when the engine would hold more than the capacity, or when that allocator could not get a segment.
"""

from __future__ import annotations

from ..units import format_bytes
from .events import CATEGORIES

ALLOCATORS = ("pytorch-cuda",)


class OutOfMemoryError(RuntimeError):
    """An allocation would exceed the ledger's capacity (like a GPU that cannot grow)."""


def placement_for(allocator: str | None, alloc_conf: str, capacity: int | None):
    """Where the allocator a ledger asks for places each buffer (None: no allocator); its settings checked here."""
    if allocator is not None and allocator not in ALLOCATORS:
        raise ValueError(f"Ledger: allocator must be None or one of {ALLOCATORS} (PyTorch's CUDA caching "
                         f"allocator, simulated), got {allocator!r}")
    if not isinstance(alloc_conf, str):
        raise TypeError(f"Ledger: alloc_conf must be a string in PYTORCH_CUDA_ALLOC_CONF's syntax, such as "
                        f"'expandable_segments:True', got {alloc_conf!r}")
    if alloc_conf and allocator is None:
        raise ValueError(f"Ledger: alloc_conf={alloc_conf!r} configures an allocator: pass "
                         "allocator='pytorch-cuda' as well")
    if allocator is None:
        return None
    from .cuda_allocator import Placement, Settings  # plugged in only when asked for

    return Placement(Settings.parse(alloc_conf, who="Ledger: alloc_conf"), capacity)


def out_of_memory(where: str, placement, capacity: int | None, counts, request: int, buffers, origins):
    """The error of op `where` ("'name' (phase)"): the allocator's, if it could not get a segment, else the
    capacity's, with the live bytes by category and the largest holders (buffers: the live ones)."""
    if placement is not None and placement.oom is not None:
        error, placement.oom = placement.oom, None
        return OutOfMemoryError(
            f"out of memory in {where}: PyTorch's caching allocator (simulated) could not get a segment: {error} "
            "Try activation checkpointing, a smaller batch or sequence, alloc_conf='expandable_segments:True', or "
            "a larger capacity.")
    live = counts.live
    holders = sorted(buffers, key=lambda b: -b.nbytes)[:5]
    by_cat = ", ".join(f"{c} {format_bytes(live[i], digits=2)}" for i, c in enumerate(CATEGORIES) if live[i])
    biggest = "; ".join(f"{origins[b.origin].name} ({CATEGORIES[b.category]}, {format_bytes(b.nbytes, digits=2)})"
                        for b in holders)
    would, added, limit = (format_bytes(n, digits=2) for n in (counts.total, request, capacity))
    return OutOfMemoryError(
        f"out of memory in {where}: the engine would hold {would} (this op added {added}) but the capacity is "
        f"{limit}. Live by category: {by_cat}. Largest holders: {biggest}. Try activation checkpointing "
        "(tg.checkpoint / GPT(checkpoint='sqrt')), a smaller batch or sequence, or a larger capacity.")


def reserved_line(placement, alloc_conf: str) -> str:
    """The summary's line on what the simulated allocator reserved."""
    alloc = placement.allocator
    conf = f", {alloc_conf}" if alloc_conf else ""
    return (f"reserved (PyTorch's CUDA caching allocator, simulated{conf}): current "
            f"{format_bytes(alloc.reserved, digits=2)}, peak {format_bytes(alloc.peak_reserved, digits=2)}; "
            f"in blocks {format_bytes(alloc.allocated, digits=2)}, peak "
            f"{format_bytes(alloc.peak_allocated, digits=2)}; {len(alloc.snapshot())} segment(s)")
