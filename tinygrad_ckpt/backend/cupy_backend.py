"""The CuPy backend: the same interface on GPU arrays (`pip install -e ".[gpu]"`)."""

from __future__ import annotations

import numpy as np

from .numpy_backend import Backend


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self):
        import cupy

        self.xp = cupy
        self._cupy = cupy

    def is_array(self, a) -> bool:
        return isinstance(a, self._cupy.ndarray)

    def buffer(self, a):
        mem = a.data.mem  # the pool allocation behind every view of it
        return mem, mem.size

    def owns_data(self, a) -> bool:
        return a.base is None

    def to_numpy(self, a) -> np.ndarray:
        return self._cupy.asnumpy(a)

    def asarray(self, data, dtype=None):
        return self._cupy.asarray(data, dtype=dtype)

    def erf(self, x):
        from cupyx.scipy.special import erf

        return erf(x)

    def generator(self, seed: int, counter: int):
        return self._cupy.random.default_rng(seed * 1_000_003 + counter)

    def synchronize(self):
        self._cupy.cuda.Device().synchronize()
