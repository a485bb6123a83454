"""The memory of the simulated CUDA caching allocator: segments, the blocks they are cut into, the pools of cached
blocks, and the segments as a memory_viz snapshot lists them (cuda_allocator.py moves blocks between these).

A segment is one cudaMalloc (or, with expandable segments, one address range mapped page by page); its blocks are a
chain in address order (struct Block: prev, next), each handed to a tensor (allocated) or cached. Addresses are
simulated: each segment gets the next free range above BASE_ADDRESS.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ..units import format_bytes

BASE_ADDRESS = 0x7000_0000_0000  # below 2**53: memory_viz reads addresses as JavaScript numbers


@dataclass(eq=False)
class MemoryBlock:
    """A range of one segment, handed to a tensor (allocated) or cached; `requested` is what the tensor asked
    for, before rounding. Blocks of a segment are a chain in address order (struct Block: prev, next); with
    expandable segments a block is either mapped (backed by memory) or a stretch of unmapped address space."""

    address: int
    size: int
    segment: Segment
    requested: int = 0
    allocated: bool = False
    mapped: bool = True
    prev: MemoryBlock | None = field(default=None, repr=False)
    next: MemoryBlock | None = field(default=None, repr=False)

    @property
    def stream(self) -> int:
        return self.segment.stream

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def cut(self, size: int) -> MemoryBlock:
        """Split off this block's first `size` bytes as a new (mapped, free) block before it; returns that one."""
        front = MemoryBlock(self.address, size, self.segment, prev=self.prev, next=self)
        if self.prev is not None:
            self.prev.next = front
        else:
            self.segment.head = front
        self.prev = front
        self.address += size
        self.size -= size
        return front

    def cut_back(self, size: int, mapped: bool) -> MemoryBlock:
        """Split off this block's last `size` bytes as a new free block after it; returns that one."""
        back = MemoryBlock(self.address + self.size - size, size, self.segment, mapped=mapped, prev=self,
                           next=self.next)
        if self.next is not None:
            self.next.prev = back
        self.next = back
        self.size -= size
        return back

    def absorb(self, src: MemoryBlock) -> None:
        """Take in `src`, a neighbour in the chain (try_merge_blocks): this block grows over it."""
        if self.prev is src:
            self.address, self.prev = src.address, src.prev
            if src.prev is not None:
                src.prev.next = self
            else:
                self.segment.head = self
        else:
            self.next = src.next
            if src.next is not None:
                src.next.prev = self
        self.size += src.size

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "cached" if self.mapped else "unmapped"
        return f"MemoryBlock({self.address:#x}, {format_bytes(self.size)}, {state})"


@dataclass(eq=False)
class Segment:
    """One cudaMalloc, or with expandable segments one reserved address range mapped page by page."""

    address: int
    size: int  # bytes; for an expandable segment, its whole address range
    pool: str  # "small" | "large"
    stream: int = 0
    page: int = 0  # an expandable segment's page (0: not expandable)
    head: MemoryBlock | None = field(default=None, repr=False)

    @property
    def expandable(self) -> bool:
        return self.page > 0

    def blocks(self):
        block = self.head
        while block is not None:
            yield block
            block = block.next

    @property
    def reserved(self) -> int:
        return sum(b.size for b in self.blocks() if b.mapped)


class Ordered:
    """Blocks kept sorted by a key (std::set with a comparator): insert, erase, lower_bound. A block's key
    must not change while it is inside."""

    def __init__(self, key):
        self.key, self.keys, self.items = key, [], {}

    def add(self, block: MemoryBlock) -> None:
        k = self.key(block)
        bisect.insort(self.keys, k)
        self.items[k] = block

    def remove(self, block: MemoryBlock) -> None:
        k = self.key(block)
        del self.keys[bisect.bisect_left(self.keys, k)], self.items[k]

    def lower_bound(self, key) -> int:
        return bisect.bisect_left(self.keys, key)

    def __getitem__(self, i: int) -> MemoryBlock:
        return self.items[self.keys[i]]

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self):
        return iter([self.items[k] for k in self.keys])


class Pool:
    """The cached (free, mapped) blocks of one pool by (stream, size, address), the best-fit order of
    BlockComparatorSize; and expandable segments' unmapped ranges by (stream, address) (struct BlockPool)."""

    def __init__(self, name: str):
        self.name = name
        self.blocks = Ordered(lambda b: (b.stream, b.size, b.address))
        self.unmapped = Ordered(lambda b: (b.stream, b.address))

    @property
    def small(self) -> bool:
        return self.name == "small"


def snapshot(segments: list[Segment]) -> list[dict]:
    """The segments as `torch.cuda.memory._snapshot()["segments"]` lists them (snapshot): address, total_size,
    allocated/active/requested sizes, segment_type, blocks with address, size, requested_size and state; an
    expandable segment is one entry per contiguous mapped range. Frames are empty."""
    out = []
    for seg in sorted(segments, key=lambda s: s.address):
        run = []
        for block in list(seg.blocks()) + [None]:
            if block is not None and block.mapped:
                run.append(block)
            elif run:
                out.append(_segment_entry(seg, run))
                run = []
    return out


def _segment_entry(seg: Segment, blocks: list) -> dict:
    """One segment of a memory_viz snapshot (SegmentInfo / BlockInfo as torch.cuda.memory._snapshot writes)."""
    active = [b for b in blocks if b.allocated]
    return {"device": 0, "address": blocks[0].address, "total_size": sum(b.size for b in blocks),
            "allocated_size": sum(b.size for b in active), "active_size": sum(b.size for b in active),
            "requested_size": sum(b.requested for b in active), "stream": seg.stream, "segment_type": seg.pool,
            "segment_pool_id": (0, 0), "is_expandable": seg.expandable, "frames": [],
            "blocks": [{"address": b.address, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                        "state": "active_allocated" if b.allocated else "inactive", "frames": []} for b in blocks]}
