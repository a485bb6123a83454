"""The CuPy backend: the same interface on GPU arrays (`pip install -e ".[gpu]"`)."""

from __future__ import annotations

import numpy as np

from .numpy_backend import Backend


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self):
        try:
            import cupy
        except ImportError as exc:
            raise ImportError('the "cupy" backend needs CuPy, which is not installed: pip install -e ".[gpu]" on a '
                              "machine with a CUDA GPU (or use the numpy backend)") from exc

        self.xp = cupy
        self.array_type = cupy.ndarray
        self._cupy = cupy

    def is_array(self, a) -> bool:
        return isinstance(a, self._cupy.ndarray)

    def buffer(self, a):
        """(owner, nbytes): views resolve to the array that owns the allocation (CuPy's memory objects take
        no weak references; arrays do), and nbytes is the pool's block, the request rounded up to 512 bytes:
        what `cupy.get_default_memory_pool().used_bytes()` counts."""
        while a.base is not None:
            a = a.base
        return a, a.data.mem.size

    def as_array(self, a):
        return self._cupy.asarray(a) if isinstance(a, np.generic) else a

    def owns_data(self, a) -> bool:
        return a.base is None

    def to_numpy(self, a) -> np.ndarray:
        return self._cupy.asnumpy(a)

    def asarray(self, data, dtype=None):
        return self._cupy.asarray(data, dtype=dtype)

    def erf(self, x):
        from cupyx.scipy.special import erf

        return erf(x)

    def scatter_add_rows(self, target, ids, rows) -> None:
        """target[ids[k]] += rows[k], in a fixed order: CuPy's add.at adds with atomics, whose order (and so the
        last bits of a sum) changes from run to run. Sort the ids stably, sum each run of one id with add.reduceat,
        then add each sum once: the same bits every time, so checkpointed gradients stay bitwise equal."""
        cp = self._cupy
        order = cp.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = cp.flatnonzero(cp.concatenate([cp.ones(1, dtype=bool), sorted_ids[1:] != sorted_ids[:-1]]))
        target[sorted_ids[starts]] += cp.add.reduceat(rows[order], starts, axis=0)

    def generator(self, seed: int, counter: int, *keys: int):
        if keys:  # one piece of a draw: a seed mixed from all the numbers
            mixed = np.random.SeedSequence([seed, counter, *keys]).generate_state(1)[0]
            return self._cupy.random.default_rng(int(mixed))
        return self._cupy.random.default_rng(seed * 1_000_003 + counter)

    def synchronize(self):
        self._cupy.cuda.Device().synchronize()
