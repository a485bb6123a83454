"""The one module that knows which array library runs the math: NumPy (default), CuPy or "meta".

Everything else asks this module for the array namespace (`xp()`), for the byte size and the
identity of the buffer behind an array (so views are counted once), for `erf`, and for random
numbers. Choose with `use_backend("cupy")` or the environment variable `TINYGRAD_CKPT_BACKEND`.

Random numbers are counter based: the state is just `(seed, counter)`; every draw uses a fresh
generator seeded with `[seed, counter]` and bumps the counter. Saving and restoring the state
(what a checkpoint does to replay dropout) is therefore copying two integers.
"""

from __future__ import annotations

import os

import numpy as np

_NAMES = ("numpy", "cupy", "meta")


class Backend:
    """A backend: its name, its array namespace and the few things that differ between libraries."""

    name = "numpy"

    def __init__(self):
        self.xp = np

    def is_array(self, a) -> bool:
        return isinstance(a, np.ndarray)

    def buffer(self, a):
        """(owner, nbytes) of the memory behind `a`: views resolve to the array that owns the data."""
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a, a.nbytes

    def owns_data(self, a) -> bool:
        """True if `a` is a writeable array owning its memory (not a view or a broadcast)."""
        return a.base is None and a.flags.writeable

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def asarray(self, data, dtype=None):
        return np.asarray(data, dtype=dtype)

    def erf(self, x):
        """erf: a float32 rational approximation (ops/fast_erf.py, within 1e-7) for float32, SciPy otherwise."""
        if x.dtype == np.float32:
            from .ops.fast_erf import erf_float32

            return erf_float32(x)
        from scipy.special import erf

        return erf(x)

    def generator(self, seed: int, counter: int):
        return np.random.default_rng([seed, counter])

    def synchronize(self):
        pass


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


def _make(name: str) -> Backend:
    if name == "numpy":
        return Backend()
    if name == "cupy":
        return CupyBackend()
    if name == "meta":
        from .meta import MetaBackend

        return MetaBackend()
    raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(_NAMES)}")


_current: Backend = _make(os.environ.get("TINYGRAD_CKPT_BACKEND", "numpy"))
_rng = {"seed": 0, "counter": 0}


def current() -> Backend:
    return _current


def xp():
    """The array namespace of the active backend (numpy, cupy, or the meta namespace)."""
    return _current.xp


def use_backend(name: str) -> Backend:
    """Switch the active backend for arrays created from now on; returns the new backend."""
    global _current
    if name != _current.name:
        _current = _make(name)
    return _current


def backend_of(a) -> str | None:
    """Name of the backend an array belongs to, or None for Python scalars."""
    if isinstance(a, np.ndarray):
        return "numpy"
    module = type(a).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module.startswith("tinygrad_ckpt.meta"):
        return "meta"
    return None


def manual_seed(seed: int) -> None:
    """Seed the engine's random numbers (initialisation and dropout)."""
    _rng["seed"], _rng["counter"] = int(seed), 0


def get_rng_state() -> tuple[int, int]:
    return _rng["seed"], _rng["counter"]


def set_rng_state(state: tuple[int, int]) -> None:
    _rng["seed"], _rng["counter"] = state


def next_generator():
    """A fresh generator for one draw; advances the counter."""
    gen = _current.generator(_rng["seed"], _rng["counter"])
    _rng["counter"] += 1
    return gen
