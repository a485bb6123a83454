"""Activation checkpointing: run a segment without keeping its interior, replay it in backward.

    y = tg.checkpoint(block, x)          # same value as block(x)

Forward runs `fn` in "discard" mode: every op computes as usual and outputs still require grad,
but nothing is saved and nothing is recorded. One tape entry (`[checkpoint]`) is recorded instead,
holding only the segment's inputs and the RNG state. When backward reaches it, the entry replays
`fn` onto a private sub-tape (ledger phase "recompute"), backpropagates through that sub-tape
(parameters inside accumulate their gradients directly, whether or not the inputs require grad),
and drops it. Replayed ops draw the same random numbers, so gradients are bitwise identical.

While the forward runs, every op that would have been recorded is *observed*: the shapes, dtypes
and a float64 checksum of what it would have saved. The replay is compared against that list;
the first op that differs is named in a `CheckpointError` (PyTorch compares metadata only).

A `policy` makes the segment selective: for each op it decides "save" (keep what the op saves,
and its output, as if not checkpointed) or "recompute", and says why. Saved ops are served from
that stash during the replay instead of running again.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from . import backend, ledger
from .function import Context, Function
from .tape import STATE, Tape, current_tape, name_scope, recording_mode, scoped_name
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


save_nothing = SaveNothing()
save_matmuls = SaveMatmuls()
korthikanti_selective = KorthikantiSelective()


# ---- what a segment observes and stashes ------------------------------------------------------
def _checksum(a):
    be = backend.current()
    if be.name == "meta" or not be.is_array(a):
        return None
    return float(a.sum(dtype="float64")) if a.dtype.kind in "fciub" else None


def _same(x, y) -> bool:
    return x == y or (x is not None and y is not None and math.isnan(x) and math.isnan(y))


@dataclass
class Observation:
    index: int
    op: str
    name: str
    saves: tuple  # (key, shape, dtype, checksum)
    rng: tuple


class Segment:
    """Bookkeeping for one checkpointed segment: the forward's observations and the policy stash."""

    def __init__(self, policy: Policy | None, check: str):
        self.policy = policy
        self.check = check  # "values" | "metadata" | "none"
        self.observed: dict[int, Observation] = {}  # op index -> what it saved (forward or replay)
        self.stash: dict[int, tuple] = {}  # op index -> (outputs, own saves, input refs, decision, was_tuple, attrs)
        self.consumed: set[int] = set()  # ids of stashed outputs read by recomputed ops
        self.implicit: dict[int, Tensor] = {}  # recorded tensors from outside read inside
        self.count = 0
        self.replaying = False
        self.rng_from: Segment | None = None  # replay: the forward whose per-op RNG states to reuse

    def _observe(self, index, cls, name, ctx, rng) -> None:
        saves = tuple(
            (k, tuple(a.shape), str(a.dtype), _checksum(a) if self.check == "values" else None)
            for k, a in ctx.saved.items() if backend.current().is_array(a)
        )
        self.observed[index] = Observation(index, cls.kind(), name, saves, rng)

    def run_op(self, cls, name, ctx, arrays, params, inputs):
        """Called by Function.apply for every op inside the segment (forward or replay)."""
        index = self.count
        self.count += 1
        if not self.replaying:
            return self._forward_op(index, cls, name, ctx, arrays, params, inputs)
        return self._replay_op(index, cls, name, ctx, arrays, params)

    def _forward_op(self, index, cls, name, ctx, arrays, params, inputs):
        for x in inputs:
            if isinstance(x, Tensor) and x.requires_grad and x._tape is not None:
                self.implicit.setdefault(x._uid, x)  # recorded outside, read in here
        rng = backend.get_rng_state()
        out = cls.forward(ctx, *arrays, **params)
        if not ctx.saving:
            return out
        self._observe(index, cls, name, ctx, rng)
        decision = self.policy.decide(cls.kind(), name) if self.policy is not None else None
        if decision is not None and decision.save:
            self._stash(index, name, ctx, arrays, out, decision)
        else:
            self._mark_consumed(arrays)  # a recomputed op reads all its inputs again in the replay
        ctx.saved = {}
        return out

    def _stash(self, index, name, ctx, arrays, out, decision) -> None:
        """Keep what a "save" op saved. A saved array that is one of the op's own inputs is kept by
        reference to that input (like JAX, the residual is the producer's output, not a copy)."""
        outs = out if isinstance(out, tuple) else (out,)
        refs, own = {}, {}
        for key, a in ctx.saved.items():
            position = next((j for j, x in enumerate(arrays) if x is a), None)
            if position is None:
                own[key] = a
            else:
                refs[key] = position
        self._mark_consumed([arrays[j] for j in refs.values()])
        attrs = {k: v for k, v in vars(ctx).items() if k not in ("saved", "saving", "needs_input_grad")}
        self.stash[index] = (outs, own, refs, decision, isinstance(out, tuple), attrs)
        led = ledger.current()
        if led is not None:
            led.save(f"{name}[kept: {decision.reason}]", {**own, **{f"out{i}": o for i, o in enumerate(outs)}})

    def _mark_consumed(self, arrays) -> None:
        ids = {id(a) for a in arrays}
        for outs, *_ in self.stash.values():
            self.consumed.update(id(o) for o in outs if id(o) in ids)

    def _replay_op(self, index, cls, name, ctx, arrays, params):
        if index in self.stash:  # kept by the policy: served, not recomputed
            outs, own, refs, _, was_tuple, attrs = self.stash[index]
            vars(ctx).update(attrs)  # the plain attributes its forward set (shapes, flags)
            saved = {**own, **{key: arrays[j] for key, j in refs.items()}}
            ctx.saved = saved if ctx.saving else {}
            ctx.served = True
            ctx.flops = (0, attrs["flops"][1])
            out = outs if was_tuple else outs[0]
        else:
            forward_obs = self.rng_from.observed.get(index) if self.rng_from is not None else None
            if forward_obs is not None:
                backend.set_rng_state(forward_obs.rng)  # the same random numbers as in forward
            out = cls.forward(ctx, *arrays, **params)
        if ctx.saving:
            self._observe(index, cls, name, ctx, None)
        return out

    def finish_forward(self) -> dict:
        """After the forward: drop stashed outputs no recomputed op reads; return the stash's arrays."""
        led = ledger.current()
        kept = {}
        for index, (outs, own, *rest) in self.stash.items():
            new_outs = []
            for i, o in enumerate(outs):
                if id(o) in self.consumed or any(o is s for s in own.values()):
                    new_outs.append(o)
                    kept[f"stash{index}.out{i}"] = o
                else:
                    new_outs.append(_placeholder(o))
                    if led is not None:
                        led.unsave(f"stash{index}", {"out": o})
            self.stash[index] = (tuple(new_outs), own, *rest)
            kept.update({f"stash{index}.{k}": a for k, a in own.items()})
        return kept

    def compare(self, replay: Segment) -> None:
        """Raise CheckpointError at the first op whose replay saved something different."""
        if self.check == "none":
            return
        fwd, rep = list(self.observed.values()), list(replay.observed.values())
        for a, b in zip(fwd, rep):
            if a.index != b.index or a.name != b.name or len(a.saves) != len(b.saves):
                raise CheckpointError(
                    f"checkpoint replay diverged at op '{b.name}' ({b.op}): the forward ran '{a.name}' ({a.op}) "
                    f"saving {len(a.saves)} arrays here, the replay saved {len(b.saves)}. The segment must run the "
                    "same ops in the same order each time (no branches on state that changed)." + _TIP
                )
            for (ka, sa, da, ca), (_kb, sb, db, cb) in zip(a.saves, b.saves):
                if sa != sb or da != db:
                    raise CheckpointError(
                        f"checkpoint replay diverged at op '{a.name}' ({a.op}): saved '{ka}' was {list(sa)} {da} "
                        f"in forward but {list(sb)} {db} in the replay." + _TIP
                    )
                if not _same(ca, cb):
                    raise CheckpointError(
                        f"checkpoint replay diverged at op '{a.name}' ({a.op}): saved '{ka}' {list(sa)} {da} has "
                        f"checksum {ca!r} in forward but {cb!r} in the replay: the segment is not deterministic "
                        "(randomness with preserve_rng_state=False, or global state that changed)." + _TIP
                    )
        if len(fwd) != len(rep):
            extra = (fwd if len(fwd) > len(rep) else rep)[min(len(fwd), len(rep))]
            raise CheckpointError(
                f"checkpoint replay diverged at op '{extra.name}' ({extra.op}): the forward had {len(fwd)} ops "
                f"that save, the replay {len(rep)}." + _TIP
            )


_TIP = " Pass determinism_check='none' to skip this check."


def _placeholder(a):
    """A zero-byte stand-in with the shape and dtype of a dropped stashed output (never read)."""
    xp = backend.xp()
    return xp.broadcast_to(xp.zeros((), dtype=a.dtype), a.shape)


# ---- the checkpoint entry ---------------------------------------------------------------------
class Checkpoint(Function):
    """The tape entry of a checkpointed segment. Saves the segment's inputs (and, with a policy,
    what the policy keeps); its backward replays the segment and backpropagates through it."""

    op = "checkpoint"
    takes_grad_list = True  # backward gets the tape's list of incoming gradients, and empties it

    @staticmethod
    def backward(ctx, grad_outs: list):
        led = ledger.current()
        sub = Tape()
        replay_inputs = [
            Tensor.from_op(ctx.saved[f"input{i}"], rg, None) for i, rg in enumerate(ctx.input_requires_grad)
        ]
        args, kwargs = _rebuild(ctx.structure, replay_inputs)
        segment = Segment(ctx.policy, ctx.check)
        segment.replaying, segment.stash = True, ctx.segment.stash
        segment.rng_from = ctx.segment if ctx.rng_state is not None else None
        outer_rng = backend.get_rng_state()
        phase = led.phase("recompute") if led is not None else contextlib.nullcontext()
        scope, STATE.scope = STATE.scope, list(ctx.scope)
        try:
            with phase, recording_mode("record", tape=sub, segment=segment):
                if ctx.rng_state is not None:
                    backend.set_rng_state(ctx.rng_state)
                out = ctx.fn(*args, **kwargs)
        finally:
            STATE.scope = scope
            backend.set_rng_state(outer_rng)
        outputs = _flatten(out)
        if len(outputs) != len(grad_outs):
            raise CheckpointError(
                f"checkpoint '{ctx.name}': the replay returned {len(outputs)} tensors, the forward {len(grad_outs)}"
            )
        ctx.segment.compare(segment)
        grads = {o._uid: g for o, g in zip(outputs, grad_outs) if o.requires_grad and g is not None}
        grad_outs.clear()  # from here the sub-tape alone holds them, and frees each once consumed
        slots = [t._uid for t in replay_inputs] + list(ctx.implicit_uids)
        del out, outputs, args, kwargs, replay_inputs
        steps = sub.backward_steps(grads, capture=slots)
        del grads
        while True:
            try:
                next(steps)
            except StopIteration as done:
                captured = done.value
                break
        return tuple(captured.get(uid) for uid in slots)


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


def checkpoint(fn, *args, preserve_rng_state: bool = True, policy: Policy | None = None,
               determinism_check: str = "values", **kwargs):
    """fn(*args, **kwargs), keeping only the inputs now and replaying `fn` in backward.

    preserve_rng_state: replay with the RNG state the forward had (dropout masks match).
    policy: a Policy (save_nothing, save_matmuls, korthikanti_selective, or your own) to keep some
    ops' saves; None recomputes everything. determinism_check: "values" (shapes, dtypes and
    checksums of what the replay saves must match), "metadata" (shapes and dtypes), or "none".
    Under tg.no_grad() this is a plain call.
    """
    if determinism_check not in ("values", "metadata", "none"):
        raise ValueError(
            f"checkpoint: determinism_check must be 'values', 'metadata' or 'none', got {determinism_check!r}"
        )
    if not STATE.grad_enabled:
        return fn(*args, **kwargs)
    outer = STATE.segment
    if STATE.mode == "discard":  # inside an enclosing checkpoint's forward: a plain call, observed as one op
        if outer is not None:
            outer.count += 1
        with recording_mode("discard", segment=None):
            return fn(*args, **kwargs)

    tensors: list[Tensor] = []
    structure = _structure((args, kwargs), tensors)
    name = scoped_name("checkpoint")
    segment = Segment(policy, determinism_check)
    rng_state = backend.get_rng_state() if preserve_rng_state else None
    led = ledger.current()
    if led is not None:
        led.begin_forward()
    if outer is not None:  # a checkpoint met during an enclosing replay: one op of that replay
        outer.count += 1
    with recording_mode("discard", segment=segment):
        out = fn(*args, **kwargs)
    outputs = _flatten(out)
    if not outputs:
        raise TypeError(
            f"checkpoint: {getattr(fn, '__name__', fn)!r} returned {type(out).__name__}, not a Tensor: the function "
            "must return a Tensor or a tuple/list/dict of Tensors."
        )
    if not any(o.requires_grad for o in outputs):
        return out
    kept = segment.finish_forward()

    implicit = [t for uid, t in segment.implicit.items() if all(uid != x._uid for x in tensors)]
    ctx = Context(tuple(t.requires_grad for t in tensors + implicit), saving=True)
    ctx.save(**{f"input{i}": t.data for i, t in enumerate(tensors + implicit)})
    ctx.fn, ctx.structure, ctx.policy, ctx.check, ctx.segment = fn, structure, policy, determinism_check, segment
    ctx.input_requires_grad = tuple(t.requires_grad for t in tensors)
    ctx.implicit_uids = tuple(t._uid for t in implicit)
    ctx.rng_state, ctx.scope, ctx.name = rng_state, list(STATE.scope), name
    tape = current_tape()
    for t in tensors + implicit:
        if t.requires_grad and t._tape is None:
            tape.add_leaf(t)
    results = {id(o): Tensor.from_op(o.data, o.requires_grad, tape) for o in outputs}
    if led is not None:
        led.forward_op("checkpoint", name, ctx, [o.data for o in outputs])
    ctx.saved.update(kept)
    tape.record(
        Checkpoint, "checkpoint", name, ctx,
        tuple(t._uid if t.requires_grad else None for t in tensors + implicit),
        tuple(results[id(o)]._uid for o in outputs),
        tuple((t.shape, t.dtype) for t in tensors + implicit), tuple((o.shape, o.dtype) for o in outputs),
    )
    return _tree_map(lambda t: results.get(id(t), t), out)


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
    for seg in plan.segments:
        chunk = blocks[seg.start:seg.stop]
        if not seg.checkpoint:
            for block in chunk:
                x = block(x)
        else:
            inner = seg.inner
            x = checkpoint(_ChunkRunner(chunk, inner, seg.start, kwargs), x, **kwargs)
    return x


class _ChunkRunner:
    """A callable running blocks[start:stop] (by an inner plan, if any); readable in tracebacks."""

    def __init__(self, chunk, inner, offset, kwargs):
        self.chunk, self.inner, self.offset, self.kwargs = chunk, inner, offset, kwargs
        self.__name__ = f"blocks[{offset}:{offset + len(chunk)}]"

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

    n = len(blocks)
    if isinstance(spec, Policy):
        for block in blocks:
            x = checkpoint(block, x, policy=spec)
        return x
    if spec == "every_layer":
        plan = planner.every_layer_plan(n)
    elif spec == "sqrt":
        plan = planner.sqrt_plan(n)
    elif isinstance(spec, int) and not isinstance(spec, bool):
        plan = planner.sequential_plan(n, spec)
    elif isinstance(spec, planner.Plan):
        plan = spec
    else:
        raise ValueError(
            f"GPT(checkpoint={spec!r}): use None, 'every_layer', 'sqrt', a number of segments, a Policy "
            "(e.g. tinygrad_ckpt.checkpoint.korthikanti_selective) or a planner Plan."
        )
    return run_plan(blocks, x, plan)


__all__ = [
    "checkpoint", "checkpoint_sequential", "run_plan", "run_checkpointed", "CheckpointError", "Policy",
    "Decision", "save_nothing", "save_matmuls", "korthikanti_selective", "name_scope",
]
