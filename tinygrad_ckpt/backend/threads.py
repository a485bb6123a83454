"""Every core for the big elementwise ops: run a kernel on row chunks on a small thread pool.

NumPy releases the GIL inside a ufunc loop over a large array, so threads running the same kernel on
different rows of an array do run at once. An op writes its math once as a kernel on arrays,
`kernel(out, *inputs)` (writing into `out`), and calls `rows(kernel, out, *inputs)`: on NumPy, with
more than one thread and a big enough array, every array is viewed as [rows, *last `inner` axes] and
each thread runs the kernel on its own block of rows; otherwise the kernel runs once on the whole
arrays. Elementwise math and reductions along the kept axes do the same arithmetic either way, so
the results are bit for bit those of one thread (tests/test_threads.py).

Threads: `TINYGRAD_CKPT_THREADS` if set, else the cores this process may use; `set_threads(n)`.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

MIN_ELEMENTS = 1 << 16  # below this a chunk's work is smaller than handing it to a thread
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
    """kernel(*arrays), split by rows over the thread pool when that pays (see the module).

    Every array must have the same leading axes (all but the last `inner`); per-row values such as a
    [..., 1] statistic fit. Arrays that broadcast differently (a weight [d], a mask [T, T]) go into
    the kernel through a closure, and must line up with the last `inner` axes."""
    n = _threads
    first = arrays[0]
    if (n == 1 or not isinstance(first, np.ndarray) or first.size < 2 * MIN_ELEMENTS
            or not all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.ndim >= inner for a in arrays)):
        kernel(*arrays)
        return
    lead = first.shape[:first.ndim - inner]
    count = math.prod(lead)
    if any(a.shape[:a.ndim - inner] != lead for a in arrays):
        kernel(*arrays)
        return
    views = [a.reshape((count,) + a.shape[a.ndim - inner:]) for a in arrays]
    parts = min(n, count, first.size // MIN_ELEMENTS)
    if parts < 2:
        kernel(*arrays)
        return
    bounds = [count * i // parts for i in range(parts + 1)]
    chunks = [[v[lo:hi] for v in views] for lo, hi in zip(bounds, bounds[1:])]
    pool = _workers(parts - 1)
    futures = [pool.submit(kernel, *c) for c in chunks[1:]]
    kernel(*chunks[0])  # the calling thread takes the first chunk
    for f in futures:
        f.result()


def _workers(count: int) -> ThreadPoolExecutor:
    """The pool, with at least `count` workers (a bigger one replaces it; the old one's threads finish their work)."""
    global _pool, _pool_size
    if _pool is None or _pool_size < count:
        _pool, _pool_size = ThreadPoolExecutor(max_workers=count, thread_name_prefix="tinygrad_ckpt"), count
    return _pool
