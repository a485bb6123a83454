"""Activation checkpointing: run a segment without keeping its interior, replay it in backward.

    y = tg.checkpoint(block, x)          # same value as block(x)

`checkpoint` runs `fn` once with a `Segment` installed as this thread's segment hook (see
function.py): every op computes as usual and its outputs still require grad, but nothing is saved
and no entry is recorded. Then one ordinary op is recorded, `Checkpoint`, whose inputs are the
segment's tensor arguments plus every older tensor the segment read that requires grad
(parameters, tensors in a closure); it saves only the arguments' data and the RNG state. When
backward reaches it, it replays `fn` (ledger phase "recompute") into a private graph and
backpropagates through that graph: gradients for the arguments and for older tensors made by ops
are captured there and returned; parameters receive theirs in `.grad` during the replay, op by op,
as in the plain run. Replayed ops draw the same random numbers, so gradients are bitwise identical.

While the forward runs, the segment notes what every op would have saved: shapes, dtypes and a
checksum of its bits. The replay is compared against that list; the first op that differs is named in
a `CheckpointError` (PyTorch compares metadata only).

A `policy` makes the segment selective: for each op it decides "save" (keep what the op saves,
and its outputs, as if not checkpointed) or "recompute", and says why. Saved ops are served from
that stash during the replay instead of running again.

The replay stops early, as PyTorch's does: the forward notes which op read which op's outputs, and an
op at the end that saved only its own inputs (a linear: x and W; an add: nothing) and whose outputs
no op that runs reads is served too, its saves being its replayed inputs (`Segment._stop_early`).
A GPT block's last linear and residual add are not run again.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from . import backend, debug, observe, state
from .function import Function
from .tape import backward_steps, edge_name, graph, key_of, run
from .tensor import Tensor


class CheckpointError(RuntimeError):
    """The replay of a checkpointed segment did not reproduce its forward."""


# ---- policies ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    save: bool
    reason: str


class Policy:
    """Decides per op, by op kind and scoped name, whether a checkpointed segment keeps its saves."""

    name = "policy"

    def decide(self, op: str, name: str) -> Decision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


_VIEWS = {"reshape", "permute", "swapaxes", "getitem"}
_MATMULS = {"matmul", "linear"}


class SaveNothing(Policy):
    name = "save_nothing"

    def decide(self, op, name):
        return Decision(False, "full recompute: nothing inside the segment is kept")


class SaveMatmuls(Policy):
    """Keep matrix-product results (like JAX's dots_saveable); recompute the cheap ops between them."""

    name = "save_matmuls"

    def decide(self, op, name):
        if op in _MATMULS:
            return Decision(True, "matmul: 2·m·k·n FLOPs to recompute, keep it")
        return Decision(False, "elementwise/view: cheap to recompute")


class KorthikantiSelective(Policy):
    """Korthikanti et al. 2022: recompute only the attention core (scores, scale, mask, softmax,
    attention dropout, attention-weighted values), whose [B, H, T, T] tensors are large but cheap
    to recompute; keep everything else. The core is every op run directly in an `attn` module
    (not in its c_attn / c_proj / resid_dropout children)."""

    name = "korthikanti_selective"

    def decide(self, op, name):
        parts = name.split(".")
        if op in _VIEWS:
            return Decision(False, "view: free to recompute")
        if len(parts) >= 2 and parts[-2] == "attn":
            return Decision(False, "attention core: O(T²) bytes, cheap to recompute")
        return Decision(True, "outside the attention core: keep")


class SaveThese(Policy):
    """Keep the ops named in a collection: op kinds ("matmul") or scoped-name patterns ("attn", "h.0.mlp"), as
    JAX's save_only_these_names does (patterns match as tg.debug.break_before's do)."""

    def __init__(self, patterns):
        self.patterns = tuple(sorted(patterns))
        self.name = f"save {', '.join(self.patterns)}"

    def decide(self, op, name):
        hit = next((p for p in self.patterns if debug.matches(op, name, p)), None)
        return Decision(True, f"named in the policy ({hit!r})") if hit else Decision(False, "not named: recompute")


class CallablePolicy(Policy):
    """A function (op, name) -> bool or Decision, asked for every op of the segment."""

    def __init__(self, fn):
        self.fn, self.name = fn, getattr(fn, "__name__", repr(fn))

    def decide(self, op, name):
        answer = self.fn(op, name)
        if isinstance(answer, Decision):
            return answer
        if isinstance(answer, (bool, np.bool_)):
            return Decision(bool(answer), f"{self.name} said {'save' if answer else 'recompute'}")
        raise TypeError(f"checkpoint policy {self.name}({op!r}, {name!r}) returned {answer!r}; a policy function "
                        "must return True (keep), False (recompute) or a tg.Decision")


save_nothing = SaveNothing()
save_matmuls = SaveMatmuls()
korthikanti_selective = KorthikantiSelective()


def as_policy(policy) -> Policy | None:
    """What `checkpoint(..., policy=)` accepts: None, a Policy, a function (op, name) -> bool or Decision, or a
    collection of op kinds / scoped-name patterns to keep. Anything else is a TypeError, here at the call."""
    if policy is None or isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        hint = f"tg.{policy}" if policy in ("save_nothing", "save_matmuls", "korthikanti_selective") else "a Policy"
        raise TypeError(f"checkpoint: policy={policy!r} is a string; pass {hint}, or a collection of op kinds / "
                        f"name patterns to keep such as {{{policy!r}}}")
    if isinstance(policy, type):
        raise TypeError(f"checkpoint: policy={policy.__name__} is a class; pass an instance, e.g. {policy.__name__}()")
    if callable(policy):
        return CallablePolicy(policy)
    if isinstance(policy, (list, tuple, set, frozenset)) and policy and all(isinstance(p, str) for p in policy):
        return SaveThese(policy)
    raise TypeError(f"checkpoint: policy={policy!r} is not a policy: pass a tg.Policy (tg.save_matmuls, "
                    "tg.korthikanti_selective), a function (op, name) -> bool, or a non-empty collection of op kinds "
                    "/ name patterns to keep, e.g. {'matmul', 'linear'}")


# ---- what a segment observes and keeps ----------------------------------------------------------
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SMALL = 4096  # bytes: an array this small is fingerprinted by hashing a copy of its bytes


def _checksum(a, xp, sample: bool = False) -> int | None:
    """A fingerprint of an array's bits: the wrapping sum of its words, so a change to any one element changes it
    (and -0.0 differs from 0.0: the replay must be bit for bit). A contiguous array is summed as 8-byte words,
    a strided view (kᵀ) as unsigned integers of its own width, where it lies (no copy); a NumPy array of at
    most 4 KiB is fingerprinted by Python's hash of its bytes instead (a 64-bit hash: a change shows but for
    a 2^-64 chance), a quarter of the sum's cost at that size. `sample`: of the first
    (at most) 64 elements of the first row, which the op has just written: cheap enough to take of every op's
    output, and enough to name the first op whose values drift (its saves, and the saves after it, are checked
    whole)."""
    if a.dtype.kind not in "fciub":
        return None
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


class _Fingerprints:
    """The checksums one pass of a segment takes, each array read once: an array saved by two ops (a layer norm's
    output, which the next linear keeps as its input) is fingerprinted once. A view saved out of a buffer not
    much bigger than itself (attention's q, kᵀ and v, out of one qkv buffer) is fingerprinted by that whole
    buffer, read once and in order instead of three strided reads: the segment computed the buffer, so all of
    it must replay bit for bit. Arrays are remembered weakly, never kept alive."""

    def __init__(self):
        self.seen: dict[int, tuple] = {}  # id(array) -> (weak reference, checksum)
        self.backend = backend.current()

    def full(self, a) -> int | None:
        be = self.backend
        owner, nbytes = be.buffer(a)
        if owner is not a and nbytes <= 4 * a.nbytes and owner.flags.c_contiguous:
            a = owner
        hit = self.seen.get(id(a))
        if hit is not None and hit[0]() is a:
            return hit[1]
        value = _checksum(a, be.xp)
        try:
            self.seen[id(a)] = (weakref.ref(a), value)
        except TypeError:  # an array type without weak references: read again next time
            pass
        return value

    def sample(self, a) -> int | None:
        """An op output's fingerprint; None for a view (reshape, transpose, split), whose values the op that
        produced them was checked for already."""
        be = self.backend
        return _checksum(a, be.xp, sample=True) if be.owns_data(a) else None


@dataclass
class Observation:
    """One op of a segment as it ran: its name, what it saved and its outputs (shapes, dtypes, checksums of
    the saves and of a sample of each output), and the RNG state before it."""

    index: int
    op: str
    name: str
    saves: tuple
    outputs: tuple
    rng: tuple | None


@dataclass
class Flow:
    """One op of a segment's forward, as the early stop needs it (`Segment._stop_early`): which ops made its
    inputs, which inputs it saved, its context (plain attributes by then) and its outputs' shapes and dtypes."""

    made_by: list  # per input array: the index of the op of this segment that returned it, or None
    saved: dict  # save name -> the position of the input it is, or None (it saved an array it made)
    ctx: object
    outputs: tuple  # per output (shape, dtype), or None for an output that is not an array
    was_tuple: bool

    def reads(self, positions=None):
        """The ops whose outputs it read (at `positions` only, if given)."""
        made_by = self.made_by if positions is None else (self.made_by[j] for j in positions)
        return (p for p in made_by if p is not None)

    def serving(self) -> Kept | None:
        """How to serve it without running it, possible when it saved only its own inputs and set only plain
        attributes (a linear: x and W; an add: nothing): its saves are its replayed inputs, its outputs
        placeholders. None when not possible."""
        attrs = _attributes(self.ctx)
        be = backend.current()
        if None in self.saved.values() or None in self.outputs or any(be.is_array(v) for v in attrs.values()):
            return None
        return Kept([Placeholder(*o) for o in self.outputs], {k: ("input", j) for k, j in self.saved.items()},
                    self.was_tuple, attrs, Decision(False, "not needed: the replay stops before it"), tail=True)


@dataclass(frozen=True)
class Placeholder:
    """An output nothing in the replay reads, by shape and dtype: served as a zero-byte stand-in."""

    shape: tuple
    dtype: object

    @classmethod
    def of(cls, a) -> Placeholder:
        return cls(tuple(a.shape), a.dtype)

    def make(self):
        xp = backend.xp()
        return xp.broadcast_to(xp.zeros((), dtype=self.dtype), self.shape)


@dataclass
class Kept:
    """How the replay serves one op instead of running it (an op a policy kept, or one past the early stop:
    `tail`): per output a key into the kept arrays (or a Placeholder for an output no recomputed op
    reads), per save a key or ("input", j) for the op's j-th input (like JAX, a residual that is the
    producer's output is kept once, by the producer), and the plain attributes its forward set."""

    outputs: list
    saves: dict
    was_tuple: bool
    attrs: dict
    decision: Decision
    tail: bool = False  # served by the early stop: its saves are its inputs, nothing was kept

    def serve(self, kept: dict, arrays):
        outs = tuple(kept[k] if isinstance(k, str) else k.make() for k in self.outputs)
        saves = {name: arrays[k[1]] if isinstance(k, tuple) else kept[k] for name, k in self.saves.items()}
        return (outs if self.was_tuple else outs[0]), saves


class Segment:
    """The hook a checkpointed segment installs on the ops it runs: during its first forward (`records`
    False: observe, keep what the policy says, record nothing) or during a replay (`records` True)."""

    def __init__(self, policy: Policy | None, check: str, explicit=(), forward: Segment | None = None,
                 kept: dict | None = None):
        self.policy, self.check = policy, check  # check: "values" | "metadata" | "none"
        self.records = forward is not None
        self.forward = forward  # replay: the forward's segment (its observations and what it kept)
        self.kept = kept if kept is not None else {}  # key -> array kept by the policy
        self.observed: dict[int, Observation] = {}  # op index -> what it saved
        self.stash: dict[int, Kept] = {}  # op index -> what the policy kept of it
        self.reports: dict[str, str] = {}  # kept key -> the name it was reported to the observer under
        self.consumed: set[int] = set()  # ids of kept outputs read by recomputed ops
        self.explicit = {id(t) for t in explicit}
        self.implicit: dict[int, Tensor] = {}  # older tensors requiring grad read inside (not arguments)
        self.start = Tensor._next_uid()  # tensors made from here on were made inside
        self.count = 0  # ops run so far: their index
        self.nested = 0  # >0 while an inner checkpoint runs as a plain call inside this forward
        self.fingerprints = _Fingerprints()  # the value check's checksums, one read per buffer
        self.flow: dict[int, Flow] = {}  # op index -> what it read and saved (forward only, till it finishes)
        self.producers: dict[int, tuple] = {}  # id(output array) -> (weak reference, op index)
        self.pinned: set[int] = set()  # ops whose outputs an inner checkpoint read
        be = backend.current()
        self.is_array = be.is_array
        self.values = check == "values" and be.has_values  # fingerprint values (the meta backend has none)

    def __repr__(self) -> str:
        role = "replay" if self.records else "forward"
        policy = f", policy {self.policy.name}" if self.policy is not None else ""
        kept = f", keeps {', '.join(self.kept)}" if self.kept else ""
        return f"<checkpoint segment ({role}): {self.count} ops so far, check {self.check!r}{policy}{kept}>"

    def run(self, fn, name, ctx, arrays, params, inputs):
        """Called by Function.apply for every op inside the segment: run (or serve) its forward."""
        if self.records:
            return self._replay_op(fn, name, ctx, arrays, params, inputs)
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad and x._uid < self.start and id(x) not in self.explicit:
                self.implicit.setdefault(id(x), x)
        if self.nested:  # inside an inner checkpoint's forward: counted as one op (run_nested)
            self.pinned.update(p for p in self._producers_of(arrays) if p is not None)
            out = fn.forward(ctx, *arrays, **params)
            ctx.saved = {}
            return out
        return self._forward_op(fn, name, ctx, arrays, params, inputs)

    def run_nested(self, fn, args, kwargs):
        """A checkpoint met inside this segment's forward: a plain call, one op of this segment (in the
        replay it runs as a real checkpoint, recorded as one Checkpoint op)."""
        self.count += self.nested == 0  # a checkpoint inside that one is part of the same op
        self.nested += 1
        try:
            return fn(*args, **kwargs)
        finally:
            self.nested -= 1

    def _observe(self, index, fn, name, ctx, out, rng, inputs, outputs=None) -> None:
        """Note what op `index` saved and returned (`outputs`: already described, for an op served from the stash).
        With values: inputs made before the segment (parameters, arguments) are not recomputed, so their saves
        are checked by shape and dtype (the replay reads the very arrays the forward read; a change shows in the
        outputs), and an output the op saves is fingerprinted whole with its saves instead of sampled."""
        outs = out if isinstance(out, tuple) else (out,)
        is_array, values = self.is_array, self.values
        older = {id(x.data) for x in inputs if isinstance(x, Tensor) and x._uid < self.start} if values else ()
        full = self.fingerprints.full
        saves = tuple((k, tuple(a.shape), a.dtype, full(a) if values and id(a) not in older else None)
                      for k, a in ctx.saved.items() if is_array(a))
        if outputs is None:
            saved = {id(a) for a in ctx.saved.values()} if values else ()
            sample = self.fingerprints.sample
            outputs = tuple((i, tuple(o.shape), o.dtype, sample(o) if values else None)
                            for i, o in enumerate(outs) if is_array(o) and id(o) not in saved)
        self.observed[index] = Observation(index, fn.kind(), name, saves, outputs, rng)

    def _forward_op(self, fn, name, ctx, arrays, params, inputs):
        index, self.count = self.count, self.count + 1
        rng = backend.get_rng_state()
        out = fn.forward(ctx, *arrays, **params)
        self._observe(index, fn, name, ctx, out, rng, inputs)
        self._note_flow(index, ctx, arrays, out)
        if ctx.saving:
            decision = self.policy.decide(fn.kind(), name) if self.policy is not None else None
            if decision is not None and decision.save:
                self._keep(index, name, ctx, arrays, out, decision)
            else:
                self._mark_consumed(arrays)  # a recomputed op reads all its inputs again in the replay
            ctx.saved = {}
        return out

    def _producers_of(self, arrays) -> list:
        """Per array, the index of the op of this segment that returned it, or None (made before it)."""
        hits = [self.producers.get(id(a)) for a in arrays]
        return [hit[1] if hit is not None and hit[0]() is a else None for hit, a in zip(hits, arrays)]

    def _note_flow(self, index, ctx, arrays, out) -> None:
        """What op `index` read and saved, for the early stop; its outputs are remembered weakly."""
        outs = out if isinstance(out, tuple) else (out,)
        is_array = self.is_array
        self.flow[index] = Flow(self._producers_of(arrays), {key: _position(a, arrays) for key, a in ctx.saved.items()},
                                ctx, tuple((o.shape, o.dtype) if is_array(o) else None for o in outs),
                                isinstance(out, tuple))
        for o in outs:
            try:
                self.producers[id(o)] = (weakref.ref(o), index)
            except TypeError:  # no weak references: its readers are not known, so the replay runs everything
                self.pinned.add(index)

    def _stop_early(self) -> None:
        """Serve, in the replay, the ops at the end whose outputs no op that runs reads (PyTorch's early stop:
        the replay ends once every array backward needs is back): walking back from the last op, an op runs
        if a running op reads its output; one that saved only its inputs and whose output nothing running
        reads is served (its saves are its replayed inputs, its outputs placeholders)."""
        needed = set(self.pinned)
        for index in sorted(self.flow, reverse=True):
            flow = self.flow[index]
            served = None if index in needed or index in self.stash else flow.serving()
            if served is None:
                needed.update(flow.reads())
            else:
                self.stash[index] = served
                needed.update(flow.reads(flow.saved.values()))
        self.flow.clear()
        self.producers.clear()

    def _keep(self, index, name, ctx, arrays, out, decision) -> None:
        """Keep what a "save" op saved and its outputs; report them to the observer as saved."""
        outs = out if isinstance(out, tuple) else (out,)
        new: dict[str, object] = {}
        saves = {}
        for key, a in ctx.saved.items():
            position = _position(a, arrays)
            if position is None:
                saves[key] = f"kept{index}.{key}"
                new[saves[key]] = a
            else:
                saves[key] = ("input", position)
        self._mark_consumed([arrays[k[1]] for k in saves.values() if isinstance(k, tuple)])
        outputs = []
        for i, o in enumerate(outs):
            outputs.append(f"kept{index}.out{i}")
            new[outputs[-1]] = o
        self.stash[index] = Kept(outputs, saves, isinstance(out, tuple), _attributes(ctx), decision)
        self.kept.update(new)
        report = f"{name}[kept: {decision.reason}]"
        self.reports.update(dict.fromkeys(new, report))
        observer = state.local.observer
        if observer is not None:
            observer.on_save(report, new)

    def _mark_consumed(self, arrays) -> None:
        if not self.kept:  # nothing kept (no policy, or it kept nothing yet): nothing to mark
            return
        ids = {id(a) for a in arrays}
        self.consumed.update(id(self.kept[k]) for kept in self.stash.values() for k in kept.outputs
                             if isinstance(k, str) and id(self.kept[k]) in ids)

    def _replay_op(self, fn, name, ctx, arrays, params, inputs):
        index, self.count = self.count, self.count + 1
        kept, seen = self.forward.stash.get(index), self.forward.observed.get(index)
        if kept is not None:  # kept by the policy: served, not recomputed
            out, saves = kept.serve(self.kept, arrays)
            vars(ctx).update(kept.attrs)  # the plain attributes its forward set (shapes, flags)
            ctx.saved = saves if ctx.saving else {}
            ctx.served = not kept.tail  # the ledger calls a policy's saves "restored" (a tail op's are its inputs)
            ctx.flops = (0, kept.attrs["flops"][1])
        else:
            if seen is not None and seen.rng is not None:
                backend.set_rng_state(seen.rng)  # the same random numbers as in the forward
            out = fn.forward(ctx, *arrays, **params)
        if fn is not Checkpoint:  # (an inner checkpoint's forward ran as one unobserved op of this segment's)
            served = seen.outputs if kept is not None and seen is not None else None  # (placeholders returned)
            self._observe(index, fn, name, ctx, out, None, inputs, outputs=served)
        return out

    def finish_forward(self, preserve_rng: bool) -> list[Tensor]:
        """After the forward: drop kept outputs that no recomputed op reads (a placeholder stays); returns the
        older tensors the segment read, which become the entry's inputs (this segment lets go of them)."""
        if not preserve_rng:
            for seen in self.observed.values():
                seen.rng = None
        observer = state.local.observer
        for kept in self.stash.values():
            for i, key in enumerate(kept.outputs):
                a = self.kept[key]
                if id(a) not in self.consumed and all(a is not self.kept.get(k) for k in kept.saves.values()
                                                       if isinstance(k, str)):
                    kept.outputs[i] = Placeholder.of(a)
                    del self.kept[key]
                    if observer is not None:
                        observer.on_release(self.reports.pop(key), {key: a})
        self._stop_early()
        implicit = list(self.implicit.values())
        self.implicit.clear()  # the entry's edges reach them now; this segment must not hold their data
        return implicit

    def hand_over(self) -> None:
        """The Checkpoint entry holds the kept arrays now: end this segment's own report of them."""
        observer = state.local.observer
        if observer is not None:
            for key, report in self.reports.items():
                observer.on_release(report, {key: self.kept[key]})
        self.reports.clear()
        self.kept = {}

    def compare(self, replay: Segment) -> None:
        """Raise CheckpointError at the first op of the replay that differs from the forward: another op (always
        checked), or, with determinism_check "metadata" / "values", other shapes and dtypes / values of what it
        saved or returned."""
        fwd, rep = self.observed, replay.observed
        for i in sorted(set(fwd) | set(rep)):
            a, b = fwd.get(i), rep.get(i)
            if a is None or b is None or a.name != b.name:
                ran = f"'{a.name}' ({a.op})" if a else "nothing"
                got = f"'{b.name}' ({b.op})" if b else "nothing"
                raise CheckpointError(
                    f"checkpoint replay diverged at op {i}: the forward ran {ran}, the replay {got}. The segment "
                    "must run the same ops in the same order each time (no branches on state that changed); this "
                    "is checked whatever determinism_check says."
                )
            if self.check != "none":
                _compare(a, b, "saved", a.saves, b.saves)
                _compare(a, b, "output", a.outputs, b.outputs)


def _compare(a: Observation, b: Observation, what: str, before: tuple, after: tuple) -> None:
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


_TIP = " Pass determinism_check='none' to skip this check (the op sequence is still checked)."


def _position(a, arrays) -> int | None:
    """Which of an op's input arrays `a` is (by identity), or None."""
    return next((j for j, x in enumerate(arrays) if x is a), None)


def _attributes(ctx) -> dict:
    """The plain attributes an op's forward set on its context (shapes, flags, FLOPs): restored when it is served."""
    return {k: v for k, v in vars(ctx).items() if k not in ("saved", "saving", "needs_input_grad")}


# ---- the checkpoint op ----------------------------------------------------------------------------
@dataclass
class Replay:
    """How to run a segment again: the function, where its tensor arguments go, the RNG state and name
    scope of the forward, and the forward's segment (observations, what the policy kept)."""

    fn: object
    structure: object
    requires_grad: tuple  # per tensor argument
    arg_keys: tuple  # per tensor argument: its key_of (a replay that reads it from a closure reaches it)
    implicit_keys: tuple  # per older tensor read inside: its key_of
    rng: tuple | None
    prefix: str
    segment: Segment
    name: str  # what the segment holds ("transformer.h.0", "transformer.h.0-3", a function's name)
    arg_names: tuple  # per tensor argument: the name of the tensor it was (its replay leaf takes it)

    def __repr__(self) -> str:
        rng = "its RNG state" if self.rng is not None else "no RNG state"
        return f"<replay of {self.name or 'a segment'}: {len(self.requires_grad)} argument(s), {rng}>"

    def run(self, kept: dict):
        """Replay the segment on fresh leaves holding the saved arguments; returns (leaves, outputs, the
        sequence number before the replay's first entry)."""
        leaves = [Tensor._from_op(kept[f"input{i}"], rg, None, 0) for i, rg in enumerate(self.requires_grad)]
        for leaf, name in zip(leaves, self.arg_names):
            leaf.name = name
        args, kwargs = _rebuild(self.structure, leaves)
        segment = Segment(self.segment.policy, self.segment.check, forward=self.segment, kept=kept)
        outer_rng, start = backend.get_rng_state(), state.next_sequence()
        try:
            with state.patched(segment=segment, prefix=self.prefix, grad_enabled=True), observe.phase("recompute"):
                if self.rng is not None:
                    backend.set_rng_state(self.rng)
                out = self.fn(*args, **kwargs)
        finally:
            backend.set_rng_state(outer_rng)
        self.segment.compare(segment)
        return leaves, _flatten(out), start


class Checkpoint(Function):
    """The entry of a checkpointed segment. Its forward already ran (see `checkpoint`): here it saves
    the tensor arguments (and what a policy kept) and hands on the outputs. Its backward replays the
    segment and backpropagates through the replay."""

    op = "checkpoint"
    begins_early = True

    @staticmethod
    def forward(ctx, *arrays, replay: Replay, outputs):
        ctx.save(**{f"input{i}": a for i, a in enumerate(arrays[:len(replay.requires_grad)])}, **replay.segment.kept)
        ctx.replay = replay
        ctx.mark_non_differentiable(*[i for i, o in enumerate(outputs) if not o.requires_grad])
        return tuple(o.data for o in outputs)

    @classmethod
    def call_backward(cls, ctx, grad_outs: list) -> tuple:
        replay = ctx.replay
        leaves, outputs, start = replay.run(ctx.saved)
        if len(outputs) != len(grad_outs):
            raise CheckpointError(f"the replay of a checkpointed segment returned {len(outputs)} tensors, "
                                  f"its forward {len(grad_outs)}")
        roots = [o for o, g in zip(outputs, grad_outs) if g is not None and o.requires_grad]
        seeds = [g for o, g in zip(outputs, grad_outs) if g is not None and o.requires_grad]
        grad_outs.clear()  # from here the replay's backward alone holds them, and frees each once consumed
        n = len(leaves)
        positions = {key_of(t): i for i, t in enumerate(leaves) if t.requires_grad}
        positions.update({k: i for i, k in enumerate(replay.arg_keys) if _alive(k)})
        # older tensors made by ops are boundaries; parameters (leaves) take their gradients during the replay,
        # op by op as in the plain run, so this entry returns None for them
        positions.update({k: n + j for j, k in enumerate(replay.implicit_keys) if isinstance(k, tuple)})
        stray = [e for e in graph(roots, positions) if e.seq < start]
        if stray:
            raise CheckpointError(
                f"the replay of a checkpointed segment read '{stray[-1].name}', a tensor from outside that its "
                "forward did not read. The segment must read the same tensors each time it runs."
            )
        del outputs  # the replayed outputs' data can go once their entries no longer need it
        captured = run(backward_steps(roots, seeds, capture=set(positions)))  # leaves stay alive till here
        grads = [None] * (n + len(replay.implicit_keys))
        for key, i in positions.items():
            g = captured.get(key)
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g
        return tuple(grads)


def _alive(key) -> bool:
    """A key_of key still names a tensor (a weak reference to a leaf dies with the leaf)."""
    return key is not None and (isinstance(key, tuple) or key() is not None)


def _tree_map(fn, obj, leaf_type=Tensor):
    """obj with fn applied to every leaf of `leaf_type` inside tuples, lists and dicts."""
    if isinstance(obj, leaf_type):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(_tree_map(fn, item, leaf_type) for item in obj)
    if isinstance(obj, dict):
        return {k: _tree_map(fn, v, leaf_type) for k, v in obj.items()}
    return obj


def _flatten(obj) -> list[Tensor]:
    found: list[Tensor] = []
    _tree_map(found.append, obj)
    return found


@dataclass(frozen=True)
class _Slot:
    """Stands for the n-th tensor argument in the structure a checkpoint entry keeps (no Tensor held)."""

    position: int


def _structure(obj, tensors: list):
    """obj with every Tensor replaced by a _Slot, appending the tensors to `tensors`."""

    def slot(t):
        tensors.append(t)
        return _Slot(len(tensors) - 1)

    return _tree_map(slot, obj)


def _rebuild(structure, tensors):
    args, kwargs = _tree_map(lambda s: tensors[s.position], structure, _Slot)
    return args, kwargs


def checkpoint(fn, *args, name: str | None = None, preserve_rng_state: bool = True, policy=None,
               determinism_check: str = "values", use_reentrant: bool | None = None, **kwargs):
    """fn(*args, **kwargs), keeping only the tensor arguments now and replaying `fn` in backward.

    name: what the entry says it holds; it is named `<name>.checkpoint` on the tape (default: the module's
    path, e.g. "transformer.h.3", or the function's name). preserve_rng_state:
    replay with the RNG state the forward had (dropout masks match). policy: what to keep instead of
    recomputing (see `as_policy`: a Policy such as tg.save_matmuls, a function (op, name) -> bool, or a
    collection of op kinds / name patterns); None recomputes everything. determinism_check: what the replay
    must reproduce besides its op sequence (always checked): "values" (shapes, dtypes and checksums of what
    each op saves and a sample of what it returns), "metadata" (shapes and dtypes) or "none".
    use_reentrant: accepted for PyTorch's signature; only False (or None) exists here: PyTorch's
    non-reentrant semantics (parameters get gradients even when no argument requires grad, arguments may be
    returned as they are). Under tg.no_grad() this is a plain call.
    """
    if determinism_check not in ("values", "metadata", "none"):
        raise ValueError(
            f"checkpoint: determinism_check must be 'values', 'metadata' or 'none', got {determinism_check!r}"
        )
    if use_reentrant:
        raise ValueError("checkpoint: use_reentrant=True is not implemented; this engine checkpoints with PyTorch's "
                         "non-reentrant semantics. Pass use_reentrant=False (or leave it out).")
    policy = as_policy(policy)
    st = state.local
    if not st.grad_enabled:
        return fn(*args, **kwargs)
    if st.segment is not None and not st.segment.records:  # inside an enclosing checkpoint's forward
        return st.segment.run_nested(fn, args, kwargs)

    tensors: list[Tensor] = []
    structure = _structure((args, kwargs), tensors)
    segment = Segment(policy, determinism_check, explicit=tensors)
    rng = backend.get_rng_state()
    observe.op_start()  # the Checkpoint op begins here: its trace slice wraps the segment's ops
    with state.patched(segment=segment):
        out = fn(*args, **kwargs)
    outputs = _flatten(out)
    if not outputs:
        raise TypeError(
            f"checkpoint: {getattr(fn, '__name__', fn)!r} returned {type(out).__name__}, not a Tensor: the function "
            "must return a Tensor or a tuple/list/dict of Tensors."
        )
    implicit = segment.finish_forward(preserve_rng_state)
    held = name or getattr(fn, "_name", "") or getattr(fn, "__name__", "").strip("<>")
    replay = Replay(fn, structure, tuple(t.requires_grad for t in tensors),
                    tuple(key_of(t) if t.requires_grad else None for t in tensors),
                    tuple(key_of(t) for t in implicit), rng if preserve_rng_state else None, st.prefix, segment,
                    held, tuple(edge_name(key_of(t)) for t in tensors))
    with state.name_scope(held):
        results = Checkpoint.apply(*tensors, *implicit, replay=replay, outputs=outputs)
    segment.hand_over()
    results = iter(results if isinstance(results, tuple) else (results,))
    return _tree_map(lambda t: next(results), out)


# ---- plans over a chain of blocks -------------------------------------------------------------
def checkpoint_sequential(blocks, segments: int, x, **kwargs):
    """Split `blocks` into `segments` chunks and checkpoint every chunk but the last, which runs
    plainly (its backward starts right away, so checkpointing it would only recompute), like
    torch.utils.checkpoint.checkpoint_sequential."""
    from .planner import sequential_plan

    blocks = list(blocks)
    return run_plan(blocks, x, sequential_plan(len(blocks), segments, last_plain=True), **kwargs)


def run_plan(blocks, x, plan, **kwargs):
    """Run `blocks` over x following a planner Plan (nested checkpoints for nested plans)."""
    return plan.run(blocks, x, lambda chunk, seg, x: checkpoint(_ChunkRunner(chunk, seg.inner, seg.start, kwargs),
                                                               x, **kwargs))


class _ChunkRunner:
    """A callable running blocks[start:stop] (by an inner plan, if any), named after its blocks ("h.4",
    "h.4-7") on the tape and in tracebacks."""

    def __init__(self, chunk, inner, offset, kwargs):
        self.chunk, self.inner, self.offset, self.kwargs = chunk, inner, offset, kwargs
        first, last = (getattr(b, "_name", "") for b in (chunk[0], chunk[-1]))
        span = f"{offset}:{offset + len(chunk)}"
        self._name = (first if len(chunk) == 1 else f"{first}-{last.rsplit('.', 1)[-1]}") if first else f"blocks.{span}"
        self.__name__ = f"blocks[{span}]"

    def __repr__(self) -> str:
        return f"<blocks {self._name}>"

    def __call__(self, x):
        if self.inner is None:
            for block in self.chunk:
                x = block(x)
            return x
        return run_plan(self.chunk, x, _shift(self.inner, self.offset), **self.kwargs)


def _shift(plan, offset):
    """The same plan with layer numbers counted from `offset` (inner plans use absolute numbers)."""
    if plan is None:
        return None
    from .planner import Plan
    from .planner import Segment as PlanSegment

    return Plan([PlanSegment(s.start - offset, s.stop - offset, s.checkpoint, _shift(s.inner, offset))
                 for s in plan.segments])


def run_checkpointed(blocks, x, spec):
    """GPT's checkpoint switch: None, "every_layer", "sqrt", an int k (k segments), a Policy
    (selective recomputation inside every block) or a planner Plan."""
    from . import planner

    if isinstance(spec, Policy):
        for block in blocks:
            x = checkpoint(block, x, policy=spec)
        return x
    return run_plan(blocks, x, planner.plan_for(len(blocks), spec))


__all__ = [
    "checkpoint", "checkpoint_sequential", "run_plan", "run_checkpointed", "CheckpointError", "Policy",
    "Decision", "as_policy", "save_nothing", "save_matmuls", "korthikanti_selective",
]
