"""The replay check: does a checkpoint's replay reproduce its forward? (PyTorch compares metadata only.)

While the forward runs, `Observations` notes what every op saved and returned: shapes and dtypes
("metadata"), and with "values" a fingerprint of the bits. The replay is observed the same way (`Comparison`)
and the first op that differs is named in a `CheckpointError`.

A fingerprint is the wrapping sum of an array's words, so a change to any one element changes it (and -0.0 differs
from 0.0: the replay must be bit for bit); a NumPy array of at most 4 KiB is hashed instead (a 64-bit hash: a change
shows but for a 2^-64 chance). Each array is read once per pass: a layer norm's output, which the next linear keeps
as its input, is fingerprinted once, and a view saved out of a buffer not much bigger than itself (attention's q, kᵀ
and v, out of one qkv buffer) by that whole buffer. Arrays made before the segment (parameters, arguments) are not
recomputed, so they are checked by shape and dtype (a change to them in place is caught by the checkpoint's version
check). Of each op's own outputs, the first 64 elements are fingerprinted, enough to name the first op whose values
drift; an output an op saves is checked whole with its saves. An op served in the replay (kept by a policy, past the
early stop) returns stand-ins: its saves are checked, not its outputs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from .. import backend, state
from ..checks import kind
from ..engine.observe import Observer, SegmentObserver
from ..engine.tensor import Tensor


class CheckpointError(RuntimeError):
    """The replay of a checkpointed segment did not reproduce its forward."""


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SMALL = 4096  # bytes: an array this small is fingerprinted by hashing a copy of its bytes
_TIP = " Pass determinism_check='none' to skip this check (the op sequence is still checked)."


def checksum(a, xp, sample: bool = False) -> int | None:
    """A fingerprint of an array's bits (see the module); `sample`: of its first row's first 64 elements."""
    if kind(a.dtype) not in "fciub":
        return None
    if a.size == 0:
        return 0
    if sample and a.ndim:
        a = a[(0,) * (a.ndim - 1)][:64]
    if a.nbytes <= _SMALL and xp is np:  # a hash of the bytes themselves: cheaper than setting up a reduction
        return hash(a.tobytes())
    if a.flags.c_contiguous and a.nbytes % 8 == 0:
        words = a.reshape(-1).view(np.uint64)
    elif a.dtype.itemsize in _UNSIGNED:
        words = a.view(_UNSIGNED[a.dtype.itemsize])
    else:
        words = xp.ascontiguousarray(a).reshape(-1).view(np.uint8)
    return int(words.sum(dtype=words.dtype))


@dataclass
class Observation:
    """One op of a segment as it ran: its name, and per save and per output (key, shape, dtype, fingerprint)."""

    name: str
    op: str
    saves: tuple
    outputs: tuple | None  # None: served (its outputs are stand-ins)


class Observations(SegmentObserver):
    """What each op of one pass (the forward, or a replay) saved and returned; `values`: fingerprints too."""

    def __init__(self, values: bool, start: int):
        super().__init__()
        be = backend.current()
        self.values = values and be.has_values  # the meta backend has no values to fingerprint
        self.start = start  # tensors numbered from here were made inside the segment
        self.observed: list[Observation] = []
        self.seen: dict[int, tuple] = {}  # id(array) -> (weak reference, fingerprint): each array read once
        self.be = be

    def on_op(self, call, outputs) -> None:
        if not self.mine():
            return
        values, is_array = self.values, self.be.is_array
        older = {id(x.data) for x in call.inputs if isinstance(x, Tensor) and x._uid < self.start} if values else ()
        saved = call.ctx.saved
        saves = tuple((k, tuple(a.shape), a.dtype, self.full(a) if values and id(a) not in older else None)
                      for k, a in saved.items() if is_array(a))
        outs = None
        if call.given is None:
            kept = {id(a) for a in saved.values()}
            outs = tuple((i, tuple(o.shape), o.dtype, self.sample(o) if values else None)
                         for i, o in enumerate(getattr(o, "data", o) for o in _tuple(outputs))
                         if is_array(o) and id(o) not in kept)
        self.observed.append(Observation(call.name, call.kind, saves, outs))

    def full(self, a) -> int | None:
        owner, nbytes = self.be.buffer(a)
        if owner is not a and nbytes <= 4 * a.nbytes and owner.flags.c_contiguous:
            a = owner
        hit = self.seen.get(id(a))
        if hit is not None and hit[0]() is a:
            return hit[1]
        value = checksum(a, self.be.xp)
        try:
            self.seen[id(a)] = (weakref.ref(a), value)
        except TypeError:  # an array type without weak references: read again next time
            pass
        return value

    def sample(self, a) -> int | None:
        """An output's fingerprint; None for a view (its values were checked with the op that made them)."""
        return checksum(a, self.be.xp, sample=True) if self.be.owns_data(a) else None

    def replay(self, saved: dict) -> Observer:
        return Comparison(self)


class Comparison(Observations):
    """The replay, observed as the forward was; `done()` raises at the first op whose observation differs."""

    def __init__(self, forward: Observations):
        super().__init__(forward.values, state.next_tensor())  # the replay's leaves are older than its ops
        self.forward = forward

    def done(self) -> None:
        for a, b in zip(self.forward.observed, self.observed):
            _compare(a, "saved", a.saves, b.saves)
            if b.outputs is not None and a.outputs is not None:
                _compare(a, "output", a.outputs, b.outputs)


def _tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _compare(a: Observation, what: str, before: tuple, after: tuple) -> None:
    if before == after:  # the usual case: one tuple comparison, nothing to name
        return
    if len(before) != len(after):
        raise CheckpointError(f"checkpoint replay diverged at op '{a.name}' ({a.op}): it {what} {len(before)} arrays "
                              f"in forward but {len(after)} in the replay." + _TIP)
    for (key, shape, dtype, value), (_, shape2, dtype2, value2) in zip(before, after):
        if shape != shape2 or dtype != dtype2:
            raise CheckpointError(f"checkpoint replay diverged at op '{a.name}' ({a.op}): {what} '{key}' was "
                                  f"{list(shape)} {dtype} in forward but {list(shape2)} {dtype2} in the replay." + _TIP)
        if value != value2:
            raise CheckpointError(
                f"checkpoint replay diverged at op '{a.name}' ({a.op}): {what} '{key}' {list(shape)} {dtype} has "
                f"checksum {value!r} in forward but {value2!r} in the replay: the segment is not deterministic "
                "(randomness with preserve_rng_state=False, or global state that changed)." + _TIP
            )


class SegmentReplay(SegmentObserver):
    """A replay: each op must be the one the forward ran at that point, and it runs with the forward's RNG states
    (an op served instead of run draws nothing, so the state after it is set too)."""

    def __init__(self, ops: list, rng: bool):
        super().__init__()
        self.ops, self.rng, self.index = ops, rng, -1

    def on_op_start(self, call) -> None:
        if not self.mine():
            return
        self.index += 1
        ran = "'{}' ({})".format(*self.ops[self.index][:2]) if self.index < len(self.ops) else "nothing"
        if ran != f"'{call.name}' ({call.kind})":
            raise CheckpointError(f"checkpoint replay diverged at op {self.index}: the forward ran {ran}, the replay "
                                  f"'{call.name}' ({call.kind}). The segment must run the same ops in the same "
                                  "order each time (no branches on state that changed); this is checked whatever "
                                  "determinism_check says.")
        if self.rng:
            backend.set_rng_state(self.ops[self.index][2])  # the same random numbers as in the forward

    def on_op(self, call, outputs) -> None:
        if self.rng and self.mine():
            backend.set_rng_state(self.ops[self.index][3])

    def done(self) -> None:
        if self.index + 1 != len(self.ops):
            raise CheckpointError(f"checkpoint replay diverged: the forward ran {len(self.ops)} ops, the replay "
                                  f"{self.index + 1}. The segment must run the same ops each time.")
