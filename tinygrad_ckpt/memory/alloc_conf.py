"""PYTORCH_CUDA_ALLOC_CONF, and the sizes PyTorch's CUDA caching allocator gives a request (cuda_allocator.py).

    Settings.parse("expandable_segments:True,max_split_size_mb:128")     # AllocatorConfig::parseArgs
    round_size(5000)  # 5120: what a request occupies;  allocation_size(4 * MiB)  # 20 MiB: the segment it gets

rounding   a request is rounded up to a multiple of 512 B, or to a power-of-two division if asked (round_size,
           roundup_power2_next_division)
pools      up to 1 MiB from the small pool, above from the large pool (get_pool, kSmallSize)
segments   a new segment is 2 MiB for a small request, 20 MiB for 1-10 MiB, else the request rounded up to 2 MiB
           (get_allocation_size: kSmallBuffer, kLargeBuffer, kMinLargeAlloc, kRoundLarge)
Read in c10/cuda/CUDACachingAllocator.cpp (v2.x, commit 001074d) and c10/core/AllocatorConfig.cpp (065861f).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import format_bytes
from . import alloc_conf_text

MiB = 2**20
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded to at least this
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: a small-pool segment; an expandable small segment's page
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: the segment of a 1-10 MiB request; an expandable large segment's page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own size
ROUND_LARGE = 2 * MiB  # kRoundLarge: that segment's size is rounded up to this
POWER2_INTERVALS = 16  # roundup_power2_divisions has one value per [2^k, 2^(k+1)) MiB, k = 0..15 (AllocatorConfig.cpp)


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
    def parse(cls, conf: str, who: str = "alloc_conf") -> Settings:
        """Settings from PYTORCH_CUDA_ALLOC_CONF's text, e.g. "expandable_segments:True,max_split_size_mb:128"
        or "roundup_power2_divisions:[256:1,512:2,>:4]" (AllocatorConfig::parseArgs; the syntax is
        alloc_conf_text.py's). What PyTorch refuses is refused, naming `who` (the call or flag), the option and
        its value; options PyTorch accepts that change no placement (alloc_conf_text.NO_EFFECT) are checked and
        have no effect."""
        found = {}
        for key, value in alloc_conf_text.options(conf, who).items():
            read = _READERS[key]
            try:
                found[key] = read(value)
            except ValueError as exc:
                raise ValueError(f"{alloc_conf_text.lead(who)}{key}:{_shown(value)} is refused: {exc} "
                                 f"(e.g. '{alloc_conf_text.example(key)}')") from None
        return cls(**{_FIELDS[k]: v for k, v in found.items() if k in _FIELDS})


_FIELDS = {"max_split_size_mb": "max_split_size", "max_non_split_rounding_mb": "max_non_split_rounding",
           "roundup_power2_divisions": "roundup_power2_divisions", "expandable_segments": "expandable_segments"}


def _shown(value) -> str:
    return "[" + ",".join(f"{k}:{v}" for k, v in value) + "]" if isinstance(value, list) else value


def _whole(text, floor: int = 0) -> int:
    """A whole number written in decimal digits, at least `floor`."""
    if not isinstance(text, str) or not text.isdigit():
        raise ValueError(f"{_shown(text)!r} is not a whole number")
    if int(text) < floor:
        raise ValueError(f"it must be at least {floor} (PyTorch refuses less)")
    return int(text)


def _power_of_two(text, zero: bool = False) -> int:
    n = _whole(text)
    if n & (n - 1) or (n == 0 and not zero):
        raise ValueError(f"it must be a power of two{' or 0' if zero else ''}, as PyTorch requires")
    return n


def _flag(text) -> bool:
    if text not in ("True", "False"):
        raise ValueError("it takes True or False (spelt so), as PyTorch requires")
    return text == "True"


def _mib_at_least_large_buffer(text) -> int:
    """A size in MiB of at least kLargeBuffer (20 MiB), in bytes."""
    if _whole(text) * MiB < LARGE_BUFFER:
        raise ValueError(f"it must be at least {format_bytes(LARGE_BUFFER)} (PyTorch refuses less)")
    return int(text) * MiB


def _divisions_text(value):
    """roundup_power2_divisions: one power of two, or [(MiB interval or '>', divisions 0 or a power of two), ...]."""
    if not isinstance(value, list):
        return _power_of_two(value)
    return {(k if k == ">" else _power_of_two(k)): _power_of_two(v, zero=True) for k, v in value}


def _backend(text) -> str:
    if text == "cudaMallocAsync":
        raise ValueError("the simulation is PyTorch's native caching allocator; cudaMallocAsync leaves placement "
                         "to the CUDA driver, which is not simulated (use backend:native or leave it out)")
    if text != "native":
        raise ValueError("unknown allocator backend: the options are native and cudaMallocAsync")
    return text


def _threshold(text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{_shown(text)!r} is not a number") from None
    if not 0 < value < 1:
        raise ValueError("it must lie strictly between 0.0 and 1.0, as PyTorch requires")
    return value


def _threads(text) -> int:
    n = _power_of_two(text)
    if n > 128:
        raise ValueError("it must be at most 128 (PyTorch's pinned_max_register_threads)")
    return n


_READERS = {"max_split_size_mb": _mib_at_least_large_buffer, "max_non_split_rounding_mb": _mib_at_least_large_buffer,
            "roundup_power2_divisions": _divisions_text, "expandable_segments": _flag, "backend": _backend,
            "garbage_collection_threshold": _threshold, "release_lock_on_cudamalloc": _flag,
            "release_lock_on_hipmalloc": _flag, "pinned_use_cuda_host_register": _flag,
            "pinned_use_hip_host_register": _flag, "pinned_num_register_threads": _threads,
            "pinned_use_background_threads": _flag, "pinned_reserve_segment_size_mb": lambda t: _whole(t, 1),
            "graph_capture_record_stream_reuse": _flag}


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
