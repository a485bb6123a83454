"""PyTorch's CUDA caching allocator, simulated: where "reserved" comes from, and why it exceeds "allocated".

PyTorch does not give a dead tensor's memory back to CUDA: its caching allocator keeps the segment it got from
cudaMalloc (reserved) and hands pieces of it to later tensors (allocated). This module replays the allocator's
rules in plain Python (each method names the function of c10/cuda/CUDACachingAllocator.cpp it follows, read at
v2.x, commit 001074d), so the ledger's stream of buffers says what a CUDA run would reserve:

    alloc = CachingAllocator("expandable_segments:True")     # PYTORCH_CUDA_ALLOC_CONF's syntax (alloc_conf.py)
    block = alloc.malloc(12 * MiB); alloc.free(block)
    alloc.reserved, alloc.allocated, alloc.peak_reserved, alloc.snapshot()
    trace = trace_events(led.events) # reserved and allocated bytes after every ledger event

Its memory (segments, blocks, pools) is cuda_memory.py. Facts carried over, code written anew. Left out:
cross-stream uses (`record_stream`), CUDA graphs' private pools, `garbage_collection_threshold`, the free-memory
callbacks. Addresses are simulated; sizes and offsets inside a segment are PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..units import format_bytes, parse_capacity
from .alloc_conf import (  # noqa: F401 (MiB, MIN_BLOCK_SIZE, allocation_size: re-exported for the allocator's users)
    DEFAULT,
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    MiB,
    Settings,
    allocation_size,
    round_size,
)
from .cuda_memory import BASE_ADDRESS, MemoryBlock, Pool, Segment, snapshot

DEFAULT_DEVICE_BYTES = 2**40  # sizes an expandable segment's address range when no capacity is given

def settings_of(settings, who: str) -> Settings:
    """`settings` as given to `who`: Settings, PYTORCH_CUDA_ALLOC_CONF's text or None (PyTorch's defaults)."""
    if settings is None:
        return DEFAULT
    if isinstance(settings, str):
        return Settings.parse(settings, who=f"{who}: settings")
    if not isinstance(settings, Settings):
        raise TypeError(f"{who}: settings must be a Settings, a string in PYTORCH_CUDA_ALLOC_CONF's syntax (such as "
                        f"'expandable_segments:True') or None, got {settings!r}")
    return settings


class AllocatorOutOfMemory(MemoryError):
    """The simulated device had no room even after the cache was emptied (malloc's "CUDA out of memory")."""

    def __init__(self, nbytes: int, alloc_size: int, allocated: int, reserved: int, capacity: int):
        self.nbytes, self.alloc_size, self.allocated, self.reserved = nbytes, alloc_size, allocated, reserved
        super().__init__(
            f"CUDA out of memory (simulated). Tried to allocate {format_bytes(alloc_size)} for a request of "
            f"{nbytes:,} B. The device holds {format_bytes(capacity)} for tensors; of it "
            f"{format_bytes(allocated)} is allocated by PyTorch, and {format_bytes(reserved - allocated)} is "
            "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
            "expandable_segments:True to avoid fragmentation.")


class CachingAllocator:
    """One device's caching allocator (DeviceCachingAllocator): `malloc`, `free`, `empty_cache`, the bytes
    allocated (blocks handed out, rounded), requested (as asked) and reserved (segments), their peaks.

    capacity_bytes: what cudaMalloc can get in all (a device's usable bytes); None: no limit. `history` holds
    memory_viz trace entries (alloc, free_requested, free_completed, segment_alloc / free / map / unmap, oom)
    with real sizes and the simulated addresses."""

    def __init__(self, settings: Settings | str | None = None, capacity_bytes: int | str | None = None):
        self.settings = settings_of(settings, "CachingAllocator")
        self.capacity = parse_capacity(capacity_bytes, "CachingAllocator: capacity_bytes")  # as Ledger reads it
        self.small, self.large = Pool("small"), Pool("large")
        self.segments: list[Segment] = []
        self.allocated = self.requested = self.reserved = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = 0
        self.num_alloc_retries = self.num_ooms = 0
        self.history: list[dict] = []
        self._top = BASE_ADDRESS  # the next simulated cudaMalloc address

    # --- the public calls -------------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> MemoryBlock:
        """A block for `nbytes` (DeviceCachingAllocator::malloc): the best cached fit, else a new segment,
        else (out of device memory) free cached segments and retry; split off what the request leaves."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ValueError(f"malloc takes a positive byte count (PyTorch allocates nothing for 0 B), got {nbytes!r}")
        nbytes = int(nbytes)
        size = round_size(nbytes, self.settings)
        pool = self.small if size <= SMALL_SIZE else self.large
        block = self._get_free_block(pool, size, stream)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None and self._release_available_cached_blocks(pool, size, stream):
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                self.num_alloc_retries += 1
                self.empty_cache()
                block = self._alloc_block(pool, size, alloc_size, stream)
            if block is None:
                self.num_ooms += 1
                free = 0 if self.capacity is None else self.capacity - self.reserved
                self._record("oom", free, size, stream)  # TraceEntry::OOM carries the device's free bytes
                raise AllocatorOutOfMemory(nbytes, alloc_size, self.allocated, self.reserved, self.capacity)
        if self._should_split(block, size):  # alloc_found_block: the rest stays cached
            block = block.cut(size)
            pool.blocks.add(block.next)
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        self._record("alloc", block.address, nbytes, stream)
        return block

    def free(self, block: MemoryBlock) -> None:
        """Return a block to its pool (free, free_block): it merges with free neighbours; nothing goes back
        to CUDA."""
        if not block.allocated:
            raise ValueError(f"{block} is not allocated: freed twice?")
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        for action in ("free_requested", "free_completed"):
            self._record(action, block.address, block.requested, block.stream)
        pool = self._pool(block.segment)
        for neighbour in (block.prev, block.next):
            self._merge(block, neighbour, pool)
        pool.blocks.add(block)

    def empty_cache(self) -> None:
        """Give every segment with nothing allocated back to CUDA; with expandable segments, unmap every
        whole free page (release_cached_blocks -> release_blocks, large pool then small)."""
        for pool in (self.large, self.small):
            to_unmap = []
            for block in pool.blocks:
                if block.segment.expandable:
                    to_unmap.append(block)
                elif not block.is_split:
                    self._release_block(block, pool)
            for block in to_unmap:
                self._unmap_block(block, pool)
                if not block.is_split and not block.mapped:  # the whole range is unmapped: drop the segment
                    pool.unmapped.remove(block)
                    self.segments.remove(block.segment)

    def snapshot(self) -> list[dict]:
        """The segments as `torch.cuda.memory._snapshot()["segments"]` lists them (cuda_memory.snapshot)."""
        return snapshot(self.segments)

    def memory_stats(self) -> dict:
        """The counters of `torch.cuda.memory_stats()` this model keeps, under the same keys."""
        return {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak_allocated,
                "requested_bytes.all.current": self.requested, "requested_bytes.all.peak": self.peak_requested,
                "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.peak_reserved,
                "segment.all.current": len(self.snapshot()), "num_alloc_retries": self.num_alloc_retries,
                "num_ooms": self.num_ooms}

    # --- finding a block ----------------------------------------------------------------------------------

    def _get_free_block(self, pool: Pool, size: int, stream: int) -> MemoryBlock | None:
        """get_free_block: the first cached block of this stream in (size, address) order with size >= the
        request; an expandable block counts what it could grow into, so a block that ends before unmapped space
        is passed over for a smaller-growth one. An oversize block (>= max_split_size) serves only requests
        that are themselves oversize and at most max_non_split_rounding smaller."""
        blocks, i = pool.blocks, pool.blocks.lower_bound((stream, size, -1))
        if i == len(blocks) or blocks[i].stream != stream:
            return None
        if blocks[i].segment.expandable:
            if self.settings.expandable_segments:
                def can_grow_to(b):
                    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
                while (blocks[i].segment.expandable and i + 1 < len(blocks) and blocks[i + 1].stream == stream
                       and can_grow_to(blocks[i + 1]) < can_grow_to(blocks[i])):
                    i += 1
            else:  # expandable segments switched off after some were made: only ordinary blocks
                while i < len(blocks) and blocks[i].segment.expandable and blocks[i].stream == stream:
                    i += 1
                if i == len(blocks) or blocks[i].stream != stream:
                    return None
        block, limit = blocks[i], self.settings.max_split_size
        if limit is not None and size < limit <= block.size:
            return None  # do not hand an oversize block to an ordinary request
        if limit is not None and size >= limit and block.size >= size + self.settings.max_non_split_rounding:
            return None  # an oversize block may be larger than an oversize request, but only this much
        blocks.remove(block)
        return block

    def _should_split(self, block: MemoryBlock, size: int) -> bool:
        """should_split: small pool (or expandable segments) if at least 512 B are left; large pool if the
        request is below max_split_size and more than 1 MiB is left."""
        remaining = block.size - size
        if block.segment.pool == "small" or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        limit = self.settings.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    # --- getting memory from CUDA and giving it back --------------------------------------------------------

    def _alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> MemoryBlock | None:
        """alloc_block: a new segment of alloc_size from cudaMalloc (None when the device is full); with
        expandable segments, map pages instead."""
        if self.settings.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._fits(alloc_size):
            return None
        seg = Segment(self._reserve_address(alloc_size), alloc_size, pool.name, stream)
        seg.head = MemoryBlock(seg.address, alloc_size, seg)
        self.segments.append(seg)
        self._grow(alloc_size)
        self._record("segment_alloc", seg.address, alloc_size, stream)
        return seg.head

    def _release_available_cached_blocks(self, pool: Pool, size: int, stream: int) -> bool:
        """release_available_cached_blocks (only under max_split_size): free the smallest cached oversize
        block that covers the request, else oversize blocks from the largest down until enough is freed. (Split
        or expandable blocks are skipped here: PyTorch assumes an oversize cached block is a whole segment.)"""
        limit = self.settings.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        blocks = pool.blocks
        i = blocks.lower_bound((stream, key, -1))
        releasable = (lambda b: b.stream == stream and not b.is_split and not b.segment.expandable)
        if i < len(blocks) and releasable(blocks[i]):
            self._release_block(blocks[i], pool)
            return True
        released, i = 0, i - 1
        while released < key and i >= 0 and blocks[i].size >= limit and releasable(blocks[i]):
            released += blocks[i].size
            self._release_block(blocks[i], pool)
            i -= 1
        return released >= key

    def _release_block(self, block: MemoryBlock, pool: Pool) -> None:
        """release_block: cudaFree a whole cached segment."""
        pool.blocks.remove(block)
        self.segments.remove(block.segment)
        self._grow(-block.size)
        self._record("segment_free", block.address, block.size, block.stream)

    # --- expandable segments ------------------------------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: Pool, size: int, stream: int) -> MemoryBlock | None:
        """try_allocate_expandable_block: at the lowest address with room (free then unmapped space), map
        pages until one free block holds `size`; None when the device is full."""
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:  # a free block followed by unmapped space: map some, it merges
            following = candidate.next
            if not self._map_block(following, min(size - candidate.size, following.size), pool):
                return None
            candidate = following
        pool.blocks.remove(candidate)
        return candidate

    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> MemoryBlock:
        """find_expandable_block: the lowest unmapped range (with the free block before it) that reaches
        `size`, else a new segment: an address range of 9/8 the device's memory, nothing mapped."""
        def allocatable(b):
            return b is not None and not b.allocated

        for candidate in list(pool.unmapped):
            if candidate.stream != stream:
                continue
            if allocatable(candidate.prev):
                candidate = candidate.prev
            room, b = 0, candidate
            while room < size and allocatable(b):
                room, b = room + b.size, b.next
            if room >= size:
                return candidate
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        device = self.capacity if self.capacity is not None else DEFAULT_DEVICE_BYTES
        span = -(-(device + device // 8) // page) * page
        seg = Segment(self._reserve_address(span), span, pool.name, stream, page=page)
        seg.head = MemoryBlock(seg.address, span, seg, mapped=False)
        self.segments.append(seg)
        pool.unmapped.add(seg.head)
        return seg.head

    def _map_block(self, block: MemoryBlock, size: int, pool: Pool) -> bool:
        """map_block: back the first `size` bytes of an unmapped block with whole pages; the rest stays
        unmapped; the new memory merges with a free block before or after it."""
        page = block.segment.page
        mapped = -(-size // page) * page
        if not self._fits(mapped):
            return False
        address = block.address
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            pool.unmapped.add(block.cut_back(block.size - mapped, mapped=False))
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.blocks.add(block)
        self._grow(mapped)
        self._record("segment_map", address, mapped, block.stream)
        return True

    def _unmap_block(self, block: MemoryBlock, pool: Pool) -> None:
        """unmap_block: unmap the whole pages inside a free block; the partial pages at its ends stay
        mapped as free blocks."""
        seg, page = block.segment, block.segment.page
        begin = seg.address + -(-(block.address - seg.address) // page) * page
        end = seg.address + (block.address + block.size - seg.address) // page * page
        if begin >= end:
            return
        pool.blocks.remove(block)
        if begin > block.address:
            pool.blocks.add(block.cut(begin - block.address))
        if end < block.address + block.size:
            pool.blocks.add(block.cut_back(block.address + block.size - end, mapped=True))
        block.mapped = False
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.unmapped.add(block)
        self._grow(-(end - begin))
        self._record("segment_unmap", begin, end - begin, block.stream)

    # --- small helpers --------------------------------------------------------------------------------------

    def _merge(self, dst: MemoryBlock, src: MemoryBlock | None, pool: Pool) -> int:
        """try_merge_blocks: absorb a free neighbour of the same kind (both mapped or both unmapped) into
        dst, which is in neither set; returns the bytes absorbed."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        (pool.blocks if src.mapped else pool.unmapped).remove(src)
        dst.absorb(src)
        return src.size

    def _pool(self, segment: Segment) -> Pool:
        return self.small if segment.pool == "small" else self.large

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _reserve_address(self, nbytes: int) -> int:
        address = self._top
        self._top += -(-nbytes // ROUND_LARGE) * ROUND_LARGE
        return address

    def _record(self, action: str, address: int, size: int, stream: int) -> None:
        self.history.append({"action": action, "addr": address, "size": size, "stream": stream})


class Placement:
    """A ledger's buffers placed by a CachingAllocator as the engine takes and frees them (what
    `Ledger(allocator="pytorch-cuda")` runs, and `trace_events` replays): a buffer's first event is a malloc of its
    nbytes, its real release a free. Keeps where each buffer was placed, the reserved bytes after every event
    (`after_event`, one per event the ledger emits) and the segment events (memory_viz's segment_alloc / free /
    map / unmap and oom, each with the seq of the event it came with). A malloc that runs out of memory places
    nothing and is kept in `oom` (the AllocatorOutOfMemory) for the caller to raise where it can."""

    SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")

    def __init__(self, settings: Settings | str | None = None, capacity_bytes: int | None = None):
        self.allocator = CachingAllocator(settings, capacity_bytes)
        self.blocks: dict[int, MemoryBlock] = {}  # buffer id -> its block, while held
        self.addresses: dict[int, int] = {}  # buffer id -> its block's address (every buffer placed)
        self.after_event: list[int] = []  # reserved bytes after each event
        self.segment_events: list[tuple[int, dict]] = []  # (seq, memory_viz trace entry)
        self.oom: AllocatorOutOfMemory | None = None

    def malloc(self, buffer: int, nbytes: int, seq: int) -> None:
        """The engine holds a new buffer of `nbytes` (0 B take no memory: PyTorch allocates nothing for them)."""
        if nbytes <= 0 or buffer in self.blocks:
            return
        try:
            block = self.blocks[buffer] = self.allocator.malloc(int(nbytes))
            self.addresses[buffer] = block.address
        except AllocatorOutOfMemory as error:
            self.oom = error
        self._keep_segment_events(seq)

    def free(self, buffer: int, seq: int) -> None:
        """The buffer's memory is released (nothing happens for one never placed)."""
        block = self.blocks.pop(buffer, None)
        if block is not None:
            self.allocator.free(block)
            self._keep_segment_events(seq)

    def _keep_segment_events(self, seq: int) -> None:
        history = self.allocator.history  # alloc and free entries are the ledger's own events: not kept twice
        self.segment_events += [(seq, e) for e in history if e["action"] in self.SEGMENT_ACTIONS]
        history.clear()

    def drop(self, events: int, first_seq: int) -> None:
        """Forget the reserved bytes of the first `events` events and the segment events before `first_seq`
        (a bounded ledger's oldest iteration)."""
        del self.after_event[:events]
        self.segment_events = [(q, e) for q, e in self.segment_events if q >= first_seq]


@dataclass
class Trace:
    """A ledger's events replayed through the allocator: bytes reserved, allocated (blocks, rounded) and
    requested (as the ledger counts them) after each event replayed, to draw beside the ledger's timeline;
    the peaks; the segments at the end (memory_viz's form); where each buffer was placed; and where the run
    ran out of memory, when a capacity was given (the arrays then stop at that event)."""

    reserved: np.ndarray
    allocated: np.ndarray
    requested: np.ndarray
    peak_reserved: int
    peak_allocated: int
    segments: list
    addresses: dict  # ledger buffer id -> its block's address
    allocator: CachingAllocator
    oom: dict | None = None

    @property
    def fits(self) -> bool:
        return self.oom is None


def trace_events(events, settings: Settings | str | None = None,
                 capacity_bytes: int | str | None = None) -> Trace:
    """Replay a ledger's events (records with seq, action, nbytes, buffer; from_category if they have one)
    through a Placement: a buffer's first event ("existing" or "allocated", not a move from another category)
    is a malloc of its nbytes, its "released" a free; other actions move a buffer between categories and
    change nothing here. A bounded ledger's events (`Ledger(keep_iterations=...)`) are refused: the buffers it
    allocated in the iterations it dropped cannot be placed afterwards, so the replay would miss them."""
    first = getattr(events, "first", 0)  # an EventLog's first kept seq: > 0 when a bounded ledger dropped some
    if first > 0:
        raise ValueError(
            f"trace_events: these are a bounded ledger's events (Ledger(keep_iterations=...)), from seq {first} on: "
            "the buffers it allocated in the iterations it dropped cannot be replayed, so the reserved and allocated "
            "bytes would be understated. Use Ledger(allocator='pytorch-cuda', keep_iterations=...), which places "
            "every buffer as it happens (led.timeline()['reserved'], led.summary()), or an unbounded Ledger")
    settings = settings_of(settings, "trace_events")
    capacity_bytes = parse_capacity(capacity_bytes, "trace_events: capacity_bytes")
    placed, rows, oom = Placement(settings, capacity_bytes), [], None
    alloc = placed.allocator
    for index, ev in enumerate(events):
        if ev.buffer >= 0:
            if ev.action in ("existing", "allocated") and not getattr(ev, "from_category", ""):
                placed.malloc(ev.buffer, ev.nbytes, ev.seq)
                if placed.oom is not None:
                    oom = {"event": index, "seq": ev.seq, "name": ev.name, "nbytes": ev.nbytes,
                           "reserved": alloc.reserved, "allocated": alloc.allocated, "message": str(placed.oom)}
                    break
            elif ev.action == "released":
                placed.free(ev.buffer, ev.seq)
        rows.append((alloc.reserved, alloc.allocated, alloc.requested))
    table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    return Trace(reserved=table[:, 0], allocated=table[:, 1], requested=table[:, 2],
                 peak_reserved=alloc.peak_reserved, peak_allocated=alloc.peak_allocated,
                 segments=alloc.snapshot(), addresses=placed.addresses, allocator=alloc, oom=oom)
