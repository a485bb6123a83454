"""Every core, and the cache, for the big elementwise ops: run a kernel on blocks of rows.

An op writes its math once as a kernel on arrays, `kernel(out, *inputs)` (writing into `out`), and
calls `rows(kernel, out, *inputs)`. On NumPy, for a big enough array, every array is viewed as
[rows, *last `inner` axes] and the kernel runs on cache-sized blocks of rows (`BLOCK_ELEMENTS`) over a small
thread pool (NumPy releases the GIL inside a ufunc loop); otherwise once on the whole arrays. The results are
bit for bit those of one call on the whole arrays (tests/test_threads.py).

Threads: `TINYGRAD_CKPT_THREADS` if set, else the cores this process may use; `set_threads(n)`.
Importing tinygrad_ckpt before NumPy sets `OPENBLAS_THREAD_TIMEOUT=14` unless it is set already, so OpenBLAS's
idle threads sleep a few µs after a product instead of spinning about 0.1 s (TINYGRAD_CKPT_TUNE=0: no
process-wide setting; `state.process_settings` lists them). Measurements and why: docs/house.md.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

BLOCK_ELEMENTS = 1 << 17  # a block's float32 arrays (512 KiB each) and temporaries stay in L2 (measured: 2^15..2^19)
# a thread's share must be at least this, a block: with 2^16 layer norm on [4, 128, 256] split in two ran slower
# at 2 threads than on one (forward 277 -> 201 µs, backward 450 -> 318 µs, once unsplit; softmax +30 µs)
MIN_ELEMENTS = 1 << 17
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def _default_threads() -> int:
    env = os.environ.get("TINYGRAD_CKPT_THREADS")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"TINYGRAD_CKPT_THREADS must be a positive integer, got {env!r}")
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_threads = _default_threads()


def threads() -> int:
    """How many threads the big elementwise ops use."""
    return _threads


def set_threads(n: int) -> int:
    """Use n threads (1: everything on the calling thread); returns the previous count. The pool only grows, so
    work another thread has handed it meanwhile still runs."""
    global _threads
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"set_threads: n must be a positive int, got {n!r}")
    previous, _threads = _threads, n
    return previous


def rows(kernel, *arrays, inner: int = 1) -> None:
    """kernel(*arrays), on blocks of rows over the thread pool when that pays (see the module).

    Every array must have the same leading axes (all but the last `inner`); per-row values such as a
    [..., 1] statistic fit. Arrays that broadcast differently (a weight [d], a mask [T, T]) go into
    the kernel through a closure, and must line up with the last `inner` axes. A 0-d array is one row of one
    value (a view of shape [1]: NumPy's arithmetic hands back scalars for 0-d arrays, which kernels cannot write)."""
    if not arrays[0].shape:
        arrays = tuple(a.reshape(1) for a in arrays)
    first = arrays[0]
    parts = min(_threads, first.size // MIN_ELEMENTS)  # threads worth using
    if (not isinstance(first, np.ndarray) or (first.size <= BLOCK_ELEMENTS and parts < 2)
            or not all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.ndim >= inner for a in arrays)):
        kernel(*arrays)
        return
    lead = first.shape[:first.ndim - inner]
    count = math.prod(lead)
    if any(a.shape[:a.ndim - inner] != lead for a in arrays):
        kernel(*arrays)
        return
    views = [a.reshape((count,) + a.shape[a.ndim - inner:]) for a in arrays]
    step = max(1, BLOCK_ELEMENTS * count // first.size)  # rows per block

    def run(lo, hi):
        for start in range(lo, hi, step):
            kernel(*[v[start:min(start + step, hi)] for v in views])

    parts = min(parts, count)
    if parts < 2:
        run(0, count)
        return
    bounds = [count * i // parts for i in range(parts + 1)]
    pool = _workers(parts - 1)
    futures = [pool.submit(run, lo, hi) for lo, hi in zip(bounds[1:], bounds[2:])]
    try:
        run(bounds[0], bounds[1])  # the calling thread takes the first share
    finally:
        _join(futures)
    for f in futures:
        f.result()


def _join(futures) -> None:
    """Wait until every share is done, through a Ctrl-C too (raised once they are): when an error or a
    KeyboardInterrupt leaves `rows`, no worker is still writing into its arrays."""
    interrupted = None
    while True:
        try:
            wait(futures)
            break
        except KeyboardInterrupt as exc:
            interrupted = exc
    if interrupted is not None:
        raise interrupted


def _workers(count: int) -> ThreadPoolExecutor:
    """The pool, with at least `count` workers (a bigger one replaces it; the old one's threads finish their work)."""
    global _pool, _pool_size
    if _pool is None or _pool_size < count:
        _pool, _pool_size = ThreadPoolExecutor(max_workers=count, thread_name_prefix="tinygrad_ckpt"), count
    return _pool
