"""The only package that knows which array library runs the math: NumPy (default), CuPy or "meta".

Everything else asks it for the array namespace (`xp()`), for the byte size and the identity of
the buffer behind an array (so views are counted once), for `erf`, and for random numbers.
Backends are registered by name; choose one with `use_backend("cupy")` or the environment
variable `TINYGRAD_CKPT_BACKEND` (one choice for the whole process).

Random numbers are counter based: the state is `(seed, counter)`, kept per thread in state.py;
every draw uses a fresh generator seeded with `[seed, counter]` and bumps the counter. Saving and
restoring the state (what a checkpoint does to replay dropout) is copying two integers.
"""

from __future__ import annotations

import os

import numpy as np

from .. import state
from ..checks import HALF_DTYPES
from . import allocator
from .numpy_backend import Backend

# glibc keeps freed arrays for the next step (allocator.py), unless TINYGRAD_CKPT_TUNE=0 (state.tune_process)
KEEPS_FREED_MEMORY = state.tune_process and allocator.keep_freed_memory()
if KEEPS_FREED_MEMORY:
    state.process_settings["malloc"] = f"M_MMAP_THRESHOLD={allocator.MMAP_THRESHOLD}, " \
                                       f"M_TRIM_THRESHOLD={allocator.TRIM_THRESHOLD}"


def _cupy() -> Backend:
    from .cupy_backend import CupyBackend  # imported on demand: CuPy is optional

    return CupyBackend()


def _meta() -> Backend:
    from .meta import MetaBackend  # imported on first use: a learner's NumPy run never loads it

    return MetaBackend()


BACKENDS = {"numpy": Backend, "cupy": _cupy, "meta": _meta}  # name -> factory


def _make(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]()


def current() -> Backend:
    """The active backend (state.backend): the one TINYGRAD_CKPT_BACKEND names (default NumPy) until
    `use_backend` picks another; made on first use, so a missing CuPy is an error there, not at import."""
    if state.backend is None:
        state.backend = _make(os.environ.get("TINYGRAD_CKPT_BACKEND", "numpy"))
    return state.backend


def xp():
    """The array namespace of the active backend (numpy, cupy, or the meta namespace)."""
    return current().xp


def use_backend(name: str) -> Backend:
    """Switch the active backend for arrays created from now on; returns the new backend."""
    if state.backend is None or name != state.backend.name:
        state.backend = _make(name)
    return state.backend


def unbroadcast(grad, shape):
    """Sum `grad` down to `shape`: the adjoint of NumPy broadcasting (leading axes, then size-1 axes)."""
    shape = tuple(shape)
    if tuple(grad.shape) == shape:
        return grad
    extra = len(grad.shape) - len(shape)
    axes = tuple(range(extra)) + tuple(
        extra + i for i, n in enumerate(shape) if n == 1 and grad.shape[extra + i] != 1
    )
    if not axes:
        return grad.reshape(shape)
    wide = np.float32 if grad.dtype in HALF_DTYPES else None  # half precision adds up in float32, as PyTorch's
    summed = grad.sum(axis=axes, keepdims=True, dtype=wide)
    return (summed if wide is None else summed.astype(grad.dtype)).reshape(shape)


def zeros_view(shape, dtype):
    """An array of zeros of `shape` that holds no memory of its own (one 0-d zero, broadcast): a stand-in for an
    output nothing reads."""
    xp = current().xp
    return xp.broadcast_to(xp.zeros((), dtype=dtype), shape)


def broadcasts_to(shape, target) -> bool:
    """Can an array of `shape` be broadcast to `target` (NumPy's rule, read from the right)?"""
    if len(shape) > len(target):
        return False
    return all(n == m or n == 1 for n, m in zip(reversed(shape), reversed(target)))


def backend_of(a) -> str | None:
    """Name of the backend an array belongs to, or None for Python scalars."""
    if isinstance(a, np.ndarray):
        return "numpy"
    module = type(a).__module__
    if module.startswith("cupy"):
        return "cupy"
    if module == f"{__name__}.meta":
        return "meta"
    return None


def manual_seed(seed: int) -> None:
    """Seed this thread's random numbers (initialisation and dropout)."""
    state.local.seed, state.local.counter = int(seed), 0


def get_rng_state() -> tuple[int, int]:
    return state.local.seed, state.local.counter


def set_rng_state(rng: tuple[int, int]) -> None:
    state.local.seed, state.local.counter = rng


def next_generator():
    """A fresh generator for one draw; advances this thread's counter."""
    st = state.local
    gen = current().generator(st.seed, st.counter)
    st.counter += 1
    return gen


def next_stream() -> tuple[int, int]:
    """Reserve one draw, (seed, counter), advancing the counter, for an op that draws in pieces and again in its
    backward: `stream_generator(stream, i, j)` is then the same generator for piece (i, j) every time."""
    st = state.local
    stream = (st.seed, st.counter)
    st.counter += 1
    return stream


def stream_generator(stream: tuple[int, int], *keys: int):
    """The generator of one piece of a reserved draw (see next_stream)."""
    return current().generator(*stream, *keys)
