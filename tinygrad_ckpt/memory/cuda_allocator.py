"""PyTorch's CUDA caching allocator, simulated: where "reserved" comes from, and why it exceeds "allocated".

PyTorch does not give a dead tensor's memory back to CUDA: its caching allocator keeps the segment it got
from cudaMalloc (reserved) and hands pieces of it to later tensors (allocated). This module replays the
allocator's rules in plain Python, so the ledger's stream of buffers says what a CUDA run would reserve:

    alloc = CachingAllocator("expandable_segments:True")     # PYTORCH_CUDA_ALLOC_CONF's syntax
    block = alloc.malloc(12 * MiB); alloc.free(block)
    alloc.reserved, alloc.allocated, alloc.peak_reserved, alloc.snapshot()
    trace = simulate(led.events)     # reserved and allocated bytes after every ledger event

Each rule follows a function of PyTorch's c10/cuda/CUDACachingAllocator.cpp (read at v2.x, commit 001074d;
later releases keep these rules and move the settings to c10/core/AllocatorConfig.cpp, read at 065861f):

  rounding      a request is rounded up to a multiple of 512 B, or to a power-of-two division if asked
                (round_size, roundup_power2_next_division)
  pools         up to 1 MiB from the small pool, above from the large pool (get_pool, kSmallSize)
  segments      a new segment is 2 MiB for a small request, 20 MiB for 1-10 MiB, else the request rounded
                up to 2 MiB (get_allocation_size: kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge)
  best fit      the smallest cached block of the stream that fits, the lowest address among equals
                (get_free_block, BlockComparatorSize)
  splitting     the rest is split off if >= 512 B are left (small pool or expandable segments), if > 1 MiB
                are left (large pool) (should_split, alloc_found_block)
  freeing       a freed block merges with free neighbours and stays cached (free_block, try_merge_blocks)
  empty_cache   every segment with nothing allocated goes back to CUDA (release_cached_blocks, release_blocks)
  out of memory a failed cudaMalloc frees cached oversize blocks and retries, then frees every unsplit cached
                segment and retries; then raises (malloc, alloc_block, release_available_cached_blocks)
  max_split_size  blocks this large are never split and serve only requests within 20 MiB of their size
                (get_free_block, should_split; the 20 MiB is kLargeBuffer at 001074d, later releases make it
                the max_non_split_rounding_mb option)
  expandable_segments  one segment per pool and stream, grown by mapping 2 MiB (small) / 20 MiB (large) pages
                (find_expandable_block, map_block, unmap_block, try_allocate_expandable_block)

Facts carried over, code written anew. Left out: cross-stream uses (`record_stream` events), CUDA graphs'
private pools, `garbage_collection_threshold` (it acts only under a per-process memory fraction), the
free-memory callbacks. Addresses are simulated (the one cudaMalloc would return is the driver's): each
segment gets the next free range above BASE_ADDRESS; sizes and offsets inside a segment are PyTorch's.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

import numpy as np

from ..units import format_bytes

MiB = 2**20
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded to at least this
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment; an expandable small segment's page
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: the segment of a 1-10 MiB request; an expandable large segment's page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own size
ROUND_LARGE = 2 * MiB  # kRoundLarge: that segment's size is rounded up to this
POWER2_INTERVALS = 16  # roundup_power2_divisions has one value per [2^k, 2^(k+1)) MiB, k = 0..15 (AllocatorConfig.cpp)
BASE_ADDRESS = 0x7000_0000_0000  # below 2**53: memory_viz reads addresses as JavaScript numbers
DEFAULT_DEVICE_BYTES = 2**40  # sizes an expandable segment's address range when no capacity is given


@dataclass(frozen=True)
class Settings:
    """The PYTORCH_CUDA_ALLOC_CONF options that decide where bytes go (c10/core/AllocatorConfig.cpp).

    max_split_size: blocks this large or larger are never split (max_split_size_mb; None = no limit, the
    default). max_non_split_rounding: how much larger than the request such a block may be
    (max_non_split_rounding_mb, default 20 MiB). roundup_power2_divisions: 0 (off, the default) or a power of
    two, one for all sizes, or a mapping {MiB: divisions, ">": divisions} as PyTorch's list form.
    expandable_segments: grow one segment per pool instead of making many."""

    max_split_size: int | None = None
    max_non_split_rounding: int = LARGE_BUFFER
    roundup_power2_divisions: object = 0  # kept as the 16 per-interval values
    expandable_segments: bool = False

    def __post_init__(self):
        for name, floor in (("max_split_size", LARGE_BUFFER), ("max_non_split_rounding", LARGE_BUFFER)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < floor):
                raise ValueError(f"{name} must be at least {format_bytes(floor)} (PyTorch refuses less), got {value!r}")
        object.__setattr__(self, "roundup_power2_divisions", _divisions(self.roundup_power2_divisions))

    @classmethod
    def parse(cls, conf: str) -> Settings:
        """Settings from PYTORCH_CUDA_ALLOC_CONF's text, e.g. "expandable_segments:True,max_split_size_mb:128"
        or "roundup_power2_divisions:[256:1,512:2,>:4]" (AllocatorConfig::parseArgs)."""
        options = {}
        for key, value in re.findall(r"(\w+)\s*:\s*(\[[^\]]*\]|[^,]+)", conf):
            value = value.strip()
            if key == "max_split_size_mb":
                options["max_split_size"] = int(value) * MiB
            elif key == "max_non_split_rounding_mb":
                options["max_non_split_rounding"] = int(value) * MiB
            elif key == "expandable_segments":
                if value not in ("True", "False"):
                    raise ValueError(f"expandable_segments takes True or False, got {value!r}")
                options["expandable_segments"] = value == "True"
            elif key == "roundup_power2_divisions":
                pairs = re.findall(r"([0-9]+|>)\s*:\s*([0-9]+)", value)
                options[key] = {(k if k == ">" else int(k)): int(v) for k, v in pairs} if value.startswith("[") \
                    else int(value)
            elif key not in ("backend", "garbage_collection_threshold", "release_lock_on_cudamalloc"):
                raise ValueError(f"unknown allocator option {key!r}: the simulation knows max_split_size_mb, "
                                 "max_non_split_rounding_mb, roundup_power2_divisions, expandable_segments")
        return cls(**options)


def _divisions(value) -> tuple:
    """The 16 per-interval division counts (parseRoundUpPower2Divisions: the first MiB key also covers the
    intervals below it, ">" every interval after the last key)."""
    if isinstance(value, tuple) and len(value) == POWER2_INTERVALS:
        out = list(value)
    elif isinstance(value, int):
        out = [value] * POWER2_INTERVALS
    elif isinstance(value, dict):
        out, last = [0] * POWER2_INTERVALS, -1
        for key, n in value.items():
            if key == ">":
                out[last + 1:] = [n] * (POWER2_INTERVALS - last - 1)
                continue
            if key <= 0 or key & (key - 1):
                raise ValueError(f"roundup_power2_divisions: intervals are powers of two in MiB, got {key}")
            index = min(key.bit_length() - 1, POWER2_INTERVALS - 1)
            if last < 0:
                out[:index] = [n] * index
            out[index], last = n, index
    else:
        raise ValueError(f"roundup_power2_divisions takes an int or a {{MiB: divisions}} mapping, got {value!r}")
    if any(n < 0 or n & (n - 1) for n in out):
        raise ValueError(f"roundup_power2_divisions must be 0 or powers of two, got {value!r}")
    return tuple(out)


DEFAULT = Settings()


def round_size(nbytes: int, settings: Settings = DEFAULT) -> int:
    """What a request of `nbytes` occupies (round_size): at least 512 B, then a multiple of 512 B; with
    roundup_power2_divisions n for its interval and nbytes > 512·n, the next of n equal steps between two
    powers of two instead (roundup_power2_next_division): with n = 4, 5000 B -> 5120 B (steps of 1024 B
    between 4096 and 8192), while 1200 B <= 512·4 keeps the plain rounding, 1536 B."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    n = settings.roundup_power2_divisions[min(max(nbytes.bit_length() - 1 - 20, 0), POWER2_INTERVALS - 1)]
    if n > 1 and nbytes > MIN_BLOCK_SIZE * n:
        if nbytes & (nbytes - 1) == 0:
            return nbytes
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor >> (n.bit_length() - 1)
        return -(-nbytes // step) * step
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request that no cached block serves (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(eq=False)
class Block:
    """A range of one segment, handed to a tensor (allocated) or cached; `requested` is what the tensor asked
    for, before rounding. Blocks of a segment are a chain in address order (struct Block: prev, next); with
    expandable segments a block is either mapped (backed by memory) or a stretch of unmapped address space."""

    address: int
    size: int
    segment: Segment
    requested: int = 0
    allocated: bool = False
    mapped: bool = True
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    @property
    def stream(self) -> int:
        return self.segment.stream

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "cached" if self.mapped else "unmapped"
        return f"Block({self.address:#x}, {format_bytes(self.size)}, {state})"


@dataclass(eq=False)
class Segment:
    """One cudaMalloc, or with expandable segments one reserved address range mapped page by page."""

    address: int
    size: int  # bytes; for an expandable segment, its whole address range
    pool: str  # "small" | "large"
    stream: int = 0
    page: int = 0  # an expandable segment's page (0: not expandable)
    head: Block | None = field(default=None, repr=False)

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


class _Ordered:
    """Blocks kept sorted by a key (std::set with a comparator): insert, erase, lower_bound. A block's key
    must not change while it is inside."""

    def __init__(self, key):
        self.key, self.keys, self.items = key, [], {}

    def add(self, block: Block) -> None:
        k = self.key(block)
        bisect.insort(self.keys, k)
        self.items[k] = block

    def remove(self, block: Block) -> None:
        k = self.key(block)
        del self.keys[bisect.bisect_left(self.keys, k)], self.items[k]

    def lower_bound(self, key) -> int:
        return bisect.bisect_left(self.keys, key)

    def __getitem__(self, i: int) -> Block:
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
        self.blocks = _Ordered(lambda b: (b.stream, b.size, b.address))
        self.unmapped = _Ordered(lambda b: (b.stream, b.address))

    @property
    def small(self) -> bool:
        return self.name == "small"


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

    def __init__(self, settings: Settings | str | None = None, capacity_bytes: int | None = None):
        self.settings = Settings.parse(settings) if isinstance(settings, str) else settings or DEFAULT
        self.capacity = capacity_bytes
        self.small, self.large = Pool("small"), Pool("large")
        self.segments: list[Segment] = []
        self.allocated = self.requested = self.reserved = 0
        self.peak_allocated = self.peak_requested = self.peak_reserved = 0
        self.num_alloc_retries = self.num_ooms = 0
        self.history: list[dict] = []
        self._top = BASE_ADDRESS  # the next simulated cudaMalloc address

    # --- the public calls -------------------------------------------------------------------------------

    def malloc(self, nbytes: int, stream: int = 0) -> Block:
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
        if self._should_split(block, size):
            block = self._split(block, size, pool)
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        self._record("alloc", block.address, nbytes, stream)
        return block

    def free(self, block: Block) -> None:
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
        """The segments as `torch.cuda.memory._snapshot()["segments"]` lists them (snapshot): address,
        total_size, allocated/active/requested sizes, segment_type, blocks with address, size, requested_size
        and state; an expandable segment is one entry per contiguous mapped range. Frames are empty."""
        out = []
        for seg in sorted(self.segments, key=lambda s: s.address):
            run = []
            for block in list(seg.blocks()) + [None]:
                if block is not None and block.mapped:
                    run.append(block)
                elif run:
                    out.append(_segment_entry(seg, run))
                    run = []
        return out

    def memory_stats(self) -> dict:
        """The counters of `torch.cuda.memory_stats()` this model keeps, under the same keys."""
        return {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak_allocated,
                "requested_bytes.all.current": self.requested, "requested_bytes.all.peak": self.peak_requested,
                "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.peak_reserved,
                "segment.all.current": len(self.snapshot()), "num_alloc_retries": self.num_alloc_retries,
                "num_ooms": self.num_ooms}

    # --- finding a block ----------------------------------------------------------------------------------

    def _get_free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
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

    def _should_split(self, block: Block, size: int) -> bool:
        """should_split: small pool (or expandable segments) if at least 512 B are left; large pool if the
        request is below max_split_size and more than 1 MiB is left."""
        remaining = block.size - size
        if block.segment.pool == "small" or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        limit = self.settings.max_split_size
        return (limit is None or size < limit) and remaining > SMALL_SIZE

    def _split(self, block: Block, size: int, pool: Pool) -> Block:
        """alloc_found_block: the first `size` bytes become the tensor's block; the rest stays cached."""
        front = Block(block.address, size, block.segment, prev=block.prev, next=block)
        if block.prev is not None:
            block.prev.next = front
        else:
            block.segment.head = front
        block.prev = front
        block.address += size
        block.size -= size
        pool.blocks.add(block)
        return front

    # --- getting memory from CUDA and giving it back --------------------------------------------------------

    def _alloc_block(self, pool: Pool, size: int, alloc_size: int, stream: int) -> Block | None:
        """alloc_block: a new segment of alloc_size from cudaMalloc (None when the device is full); with
        expandable segments, map pages instead."""
        if self.settings.expandable_segments:
            return self._try_allocate_expandable_block(pool, size, stream)
        if not self._fits(alloc_size):
            return None
        seg = Segment(self._reserve_address(alloc_size), alloc_size, pool.name, stream)
        seg.head = Block(seg.address, alloc_size, seg)
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

    def _release_block(self, block: Block, pool: Pool) -> None:
        """release_block: cudaFree a whole cached segment."""
        pool.blocks.remove(block)
        self.segments.remove(block.segment)
        self._grow(-block.size)
        self._record("segment_free", block.address, block.size, block.stream)

    # --- expandable segments ------------------------------------------------------------------------------

    def _try_allocate_expandable_block(self, pool: Pool, size: int, stream: int) -> Block | None:
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

    def _find_expandable_block(self, pool: Pool, size: int, stream: int) -> Block:
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
        seg.head = Block(seg.address, span, seg, mapped=False)
        self.segments.append(seg)
        pool.unmapped.add(seg.head)
        return seg.head

    def _map_block(self, block: Block, size: int, pool: Pool) -> bool:
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
            rest = Block(address + mapped, block.size - mapped, block.segment, mapped=False, prev=block,
                         next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = mapped
            pool.unmapped.add(rest)
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.blocks.add(block)
        self._grow(mapped)
        self._record("segment_map", address, mapped, block.stream)
        return True

    def _unmap_block(self, block: Block, pool: Pool) -> None:
        """unmap_block: unmap the whole pages inside a free block; the partial pages at its ends stay
        mapped as free blocks."""
        seg, page = block.segment, block.segment.page
        begin = seg.address + -(-(block.address - seg.address) // page) * page
        end = seg.address + (block.address + block.size - seg.address) // page * page
        if begin >= end:
            return
        pool.blocks.remove(block)
        if begin > block.address:
            before = Block(block.address, begin - block.address, seg, prev=block.prev, next=block)
            if block.prev is not None:
                block.prev.next = before
            else:
                seg.head = before
            block.prev = before
            pool.blocks.add(before)
        if end < block.address + block.size:
            after = Block(end, block.address + block.size - end, seg, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.blocks.add(after)
        block.address, block.size, block.mapped = begin, end - begin, False
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.unmapped.add(block)
        self._grow(-(end - begin))
        self._record("segment_unmap", begin, end - begin, block.stream)

    # --- small helpers --------------------------------------------------------------------------------------

    def _merge(self, dst: Block, src: Block | None, pool: Pool) -> int:
        """try_merge_blocks: absorb a free neighbour of the same kind (both mapped or both unmapped) into
        dst, which is in neither set; returns the bytes absorbed."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        (pool.blocks if src.mapped else pool.unmapped).remove(src)
        if dst.prev is src:
            dst.address, dst.prev = src.address, src.prev
            if src.prev is not None:
                src.prev.next = dst
            else:
                dst.segment.head = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size
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


def _segment_entry(seg: Segment, blocks: list) -> dict:
    """One segment of a memory_viz snapshot (SegmentInfo / BlockInfo as torch.cuda.memory._snapshot writes)."""
    active = [b for b in blocks if b.allocated]
    return {"device": 0, "address": blocks[0].address, "total_size": sum(b.size for b in blocks),
            "allocated_size": sum(b.size for b in active), "active_size": sum(b.size for b in active),
            "requested_size": sum(b.requested for b in active), "stream": seg.stream, "segment_type": seg.pool,
            "segment_pool_id": (0, 0), "is_expandable": seg.expandable, "frames": [],
            "blocks": [{"address": b.address, "size": b.size, "requested_size": b.requested if b.allocated else 0,
                        "state": "active_allocated" if b.allocated else "inactive", "frames": []} for b in blocks]}


class Placement:
    """A ledger's buffers placed by a CachingAllocator as the engine takes and frees them (what
    `Ledger(allocator="pytorch-cuda")` runs, and `simulate` replays): a buffer's first event is a malloc of its
    nbytes, its real release a free. Keeps where each buffer was placed, the reserved bytes after every event
    (`after_event`, one per event the ledger emits) and the segment events (memory_viz's segment_alloc / free /
    map / unmap and oom, each with the seq of the event it came with). A malloc that runs out of memory places
    nothing and is kept in `oom` (the AllocatorOutOfMemory) for the caller to raise where it can."""

    SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom")

    def __init__(self, settings: Settings | str | None = None, capacity_bytes: int | None = None):
        self.allocator = CachingAllocator(settings, capacity_bytes)
        self.blocks: dict[int, Block] = {}  # buffer id -> its block, while held
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


def simulate(events, settings: Settings | str | None = None, capacity_bytes: int | None = None) -> Trace:
    """Replay a ledger's events (records with seq, action, nbytes, buffer; from_category if they have one)
    through a Placement: a buffer's first event ("existing" or "allocated", not a move from another category)
    is a malloc of its nbytes, its "released" a free; other actions move a buffer between categories and
    change nothing here."""
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
