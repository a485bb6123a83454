"""Where NumPy's big arrays come from: glibc's malloc, told to keep freed memory for the next step.

By default glibc serves a request of 128 KiB or more with a fresh mmap, raises that threshold as such
blocks are freed, and hands free memory at the top of its heap back to the kernel once more than
twice the threshold lies there. A training step frees and reallocates its activations and
temporaries every time, so each new array touches pages the kernel must map and zero again: about
9,000 page faults a step on the 4-layer benchmark stack (4, 128, 256, 4), 15% of its time at one
thread (176 -> 148 ms; PyTorch, which frees less, loses less).

`keep_freed_memory()` (run when the backend loads) fixes the two thresholds instead: arrays up to
`MMAP_THRESHOLD` come from the heap, and up to `TRIM_THRESHOLD` of freed memory stays mapped for reuse,
as PyTorch's caching allocator keeps GPU memory. The ledger and tracemalloc count arrays, not pages, so
no number the lessons show changes; the process's resident size stays near its highest. Linux with glibc
only (elsewhere nothing happens). To keep glibc's defaults, set TINYGRAD_CKPT_TUNE=0 before importing the
package (`state.process_settings` says what import set); to undo later, `mallopt` the thresholds back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # from <malloc.h>


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (above); True if glibc took both."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 (glibc, not musl: musl has no mallopt thresholds)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
