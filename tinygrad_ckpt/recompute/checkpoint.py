"""Activation checkpointing: run a segment without keeping its interior, replay it in backward.

    y = tg.checkpoint(block, x)          # the same value as block(x)

Forward: `fn` runs once under a `SegmentForward` observer (engine/observe.py): its ops compute as usual but
no tape entry is made, so nothing they save is kept; the RNG state before each op and the outside tensors its
ops read are noted. Then one ordinary op, `Checkpoint`, is recorded; it saves only the arguments' data.

Backward: the Checkpoint entry checks that no outside tensor the segment read was changed in place, then
replays `fn` on fresh leaves, each op with the RNG state it had in the forward (ledger phase "recompute"),
and backpropagates through that private graph: the gradients are bitwise identical, dropout included.

Opt-in features, each an observer of the segment in its own module: `policy=` (policies.py), `early_stop=True`
(early_stop.py), `determinism_check=` (replay_check.py, which always checks the op sequence). Blocks under a
plan: plans.py. In full: docs/house.md.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass

from .. import backend, state
from ..engine import observe
from ..engine.function import Function
from ..engine.observe import SegmentObserver
from ..engine.tape import backward_steps, changed_error, edge_of, graph, run_steps
from ..engine.tensor import Tensor
from .early_stop import Flows
from .policies import KeepByPolicy, as_policy
from .replay_check import CheckpointError, Observations, SegmentReplay
from .trees import Argument, flatten, tree_map


class SegmentForward(SegmentObserver):
    """A segment's first forward: its ops record nothing; it notes, per op, the name and the RNG states before and
    after it, and every tensor made before the segment that an op read (or that the segment returns)."""

    def __init__(self):
        super().__init__()
        self.start = state.next_tensor()  # tensors numbered from here on were made inside
        self.seq = state.next_sequence()  # an in-place change numbered after this came after the segment began
        self.rng = backend.get_rng_state()  # where the replay starts drawing (ops of nested checkpoints draw first)
        self.ops: list[list] = []  # per op: [scoped name, kind, RNG state before it, RNG state after it]
        self.outside: dict[int, Tensor] = {}

    def on_op_start(self, call) -> None:
        call.record = False
        if not self.mine():  # an op of a checkpoint nested inside: that checkpoint's own segment watches it
            return
        self.ops.append([call.name, call.kind, backend.get_rng_state(), None])
        for x in call.inputs:
            if isinstance(x, Tensor) and x._uid < self.start:
                self.outside.setdefault(id(x), x)

    def on_op(self, call, outputs) -> None:
        if self.mine():
            self.ops[-1][3] = backend.get_rng_state()


@dataclass
class Replay:
    """How to run a segment again: the function, where its tensor arguments go (and their names and whether they
    require grad), the outside tensors it read (weakly, with the sequence number it began at), the forward's
    ops (names, RNG states), name scope, features, and the modes it ran under (autocast's dtype, whose saves):
    the replay runs under the same, as torch.utils.checkpoint restores autocast's state."""

    fn: object
    structure: object
    arguments: tuple  # per tensor argument: (its edge or None, requires grad, name)
    outside: tuple  # per outside tensor read: (weak reference, id of its buffer then)
    inputs: tuple  # the edges of the entry's inputs past the arguments: outside tensors that require grad
    segment: SegmentForward
    rng: bool
    prefix: str
    features: list
    name: str  # what the segment holds ("transformer.h.0", "transformer.h.0-3", a function's name)
    modes: dict  # {"autocast": half dtype or None, "saves": "engine" | "pytorch" | "megatron", "op_variants"} of
    # the forward

    def __repr__(self) -> str:
        rng = "its RNG state" if self.rng else "no RNG state"
        return f"<replay of {self.name or 'a segment'}: {len(self.arguments)} argument(s), {rng}>"

    def check_versions(self) -> None:
        """The plain graph's rule for what the segment read from outside: changed in place since, it refuses."""
        be = backend.current()
        for ref, buffer in self.outside:
            tensor = ref()
            if tensor is None:
                continue
            owner = be.buffer(tensor.data)[0]
            change = state.changed_since(owner, self.segment.seq)
            if change is not None or id(owner) != buffer:
                change = change or (state.next_sequence(), "new", tensor.name or "tensor")
                raise RuntimeError(changed_error(f"{self.name}.checkpoint", "checkpoint", "read", tensor.data, change))

    def rerun(self, saved: dict):
        """Replay the segment on fresh leaves holding the saved arguments; returns (leaves, outputs, the sequence
        number before the replay's first entry)."""
        leaves = [Tensor._from_op(saved[f"input{i}"], rg, None, 0) for i, (_, rg, _) in enumerate(self.arguments)]
        for leaf, (_, _, name) in zip(leaves, self.arguments):
            leaf.name = name
        args, kwargs = tree_map(lambda slot: leaves[slot.position], self.structure, Argument)
        watching = [f.replay(saved) for f in self.features] + [SegmentReplay(self.segment.ops, self.rng)]
        outer_rng, start = backend.get_rng_state(), state.next_sequence()
        try:
            if self.rng:
                backend.set_rng_state(self.segment.rng)
            with contextlib.ExitStack() as stack:
                for o in watching:
                    stack.enter_context(observe.observing(o))
                stack.enter_context(state.patched(prefix=self.prefix, grad_enabled=True,
                                                  segments=state.local.segments + 1, **self.modes))
                stack.enter_context(observe.phase("recompute"))
                out = self.fn(*args, **kwargs)
        finally:
            backend.set_rng_state(outer_rng)
        for o in watching:
            getattr(o, "done", lambda: None)()
        return leaves, flatten(out), start


class Checkpoint(Function):
    """The entry of a checkpointed segment. Its forward already ran (see `checkpoint`): here it saves the tensor
    arguments (and what a policy kept) and hands on the outputs. Its backward replays the segment and
    backpropagates through the replay."""

    op = "checkpoint"

    @staticmethod
    def forward(ctx, *arrays, replay: Replay, outputs, kept):
        ctx.save(**{f"input{i}": a for i, a in enumerate(arrays[:len(replay.arguments)])}, **kept)
        ctx.replay = replay
        ctx.mark_non_differentiable(*[i for i, o in enumerate(outputs) if not o.requires_grad])
        return tuple(o.data for o in outputs)

    @classmethod
    def input_grads(cls, ctx, grad_outs: list) -> tuple:
        replay = ctx.replay
        replay.check_versions()
        leaves, outputs, start = replay.rerun(ctx.saved)
        if len(outputs) != len(grad_outs):
            raise CheckpointError(f"the replay of a checkpointed segment returned {len(outputs)} tensors, "
                                  f"its forward {len(grad_outs)}")
        n = len(leaves)
        positions = {edge_of(t): i for i, t in enumerate(leaves) if t.requires_grad}  # where a captured gradient goes
        positions.update({k: i for i, (k, _, _) in enumerate(replay.arguments) if _alive(k)})
        # outside tensors made by ops are boundaries: their gradients are captured and returned; parameters (leaves)
        # take theirs in .grad during the replay, op by op as in the plain run (the same sums, bit for bit)
        positions.update({k: n + j for j, k in enumerate(replay.inputs) if not k.is_leaf})
        grads = [None] * (n + len(replay.inputs))
        roots, seeds, o, g = [], [], None, None
        for o, g in zip(outputs, grad_outs):
            if g is None or not o.requires_grad:
                continue
            through = positions.get(edge_of(o))
            if through is not None:  # an argument or outside tensor returned as it is: its gradient passes through
                grads[through] = g if grads[through] is None else grads[through] + g
            else:
                roots.append(o)
                seeds.append(g)
        del o, g  # the loop's last pair: no reference may outlive its use
        grad_outs.clear()  # from here the replay's backward alone holds them, and frees each once consumed
        stray = [e for e in graph(roots, positions) if e.seq < start]
        if stray:
            raise CheckpointError(
                f"the replay of a checkpointed segment read '{stray[-1].name}', a tensor from outside that its "
                "forward did not read. The segment must read the same tensors each time it runs."
            )
        del outputs  # the replayed outputs' data can go once their entries no longer need it
        captured = run_steps(backward_steps(roots, seeds, capture=set(positions)))  # leaves stay alive till here
        for key, i in positions.items():
            g = captured.get(key)
            if g is not None:
                grads[i] = g if grads[i] is None else grads[i] + g
        return tuple(grads)


def _alive(edge) -> bool:
    """An edge still names a tensor (a weak reference to a leaf dies with the leaf)."""
    return edge is not None and edge.alive()


def checkpoint(fn, *args, name: str | None = None, preserve_rng_state: bool = True, policy=None,
               determinism_check: str = "values", early_stop: bool = True, use_reentrant: bool | None = None,
               **kwargs):
    """fn(*args, **kwargs), keeping only the tensor arguments now and replaying `fn` in backward.

    name: what the entry says it holds; it is named `<name>.checkpoint` on the tape (default: the module's path,
    e.g. "transformer.h.3", or the function's name). preserve_rng_state: replay with the RNG states the forward
    had (dropout masks match). policy: what to keep instead of recomputing (policies.as_policy: a Policy such as
    tg.save_matmuls, a function (op, name) -> bool, or a collection of op kinds / name patterns); None recomputes
    everything. early_stop: the replay does not run the ops at the end that backward does not need (PyTorch's
    default). determinism_check: what the replay must reproduce besides its op sequence (always checked):
    "values" (shapes, dtypes and fingerprints of what each op saves and a sample of what it returns),
    "metadata" (shapes and dtypes) or "none". use_reentrant: only False (or None) exists here: PyTorch's
    non-reentrant semantics. Under tg.no_grad() this is a plain call.

    Longer than the house's ~50 lines on purpose: the segment operator a learner steps through in pdb, top to bottom
    (the forward under the observers, what the entry records, Checkpoint.apply), each step using what the one before
    made; split, it would read as jumps between helpers passing a dozen values along.
    """
    _check_arguments(fn, determinism_check, use_reentrant, name)
    policy = as_policy(policy)
    st = state.local
    if not st.grad_enabled:
        return fn(*args, **kwargs)
    tensors: list[Tensor] = []
    structure = tree_map(lambda t: tensors.append(t) or Argument(len(tensors) - 1), (args, kwargs))
    held = name or getattr(fn, "_name", "") or getattr(fn, "__name__", "").strip("<>")
    segment = SegmentForward()
    keep = KeepByPolicy(policy) if policy is not None else None
    check = Observations(determinism_check == "values", segment.start) if determinism_check != "none" else None
    features = [f for f in (keep, Flows() if early_stop else None, check) if f is not None]
    with contextlib.ExitStack() as stack:
        for o in [segment, *features]:
            stack.enter_context(observe.observing(o))
        stack.enter_context(state.patched(segments=st.segments + 1))
        stack.enter_context(observe.span(f"{st.prefix}{held}{'.' if held else ''}checkpoint"))
        out = fn(*args, **kwargs)
    outputs = flatten(out)
    if not outputs:
        raise TypeError(f"checkpoint: {getattr(fn, '__name__', fn)!r} returned {type(out).__name__}, not a Tensor: "
                        "the function must return a Tensor or a tuple/list/dict of Tensors.")
    for o in outputs:
        if o._uid < segment.start:  # returned from outside as it is: its gradient passes through the entry
            segment.outside.setdefault(id(o), o)
    explicit = {id(t) for t in tensors}
    inputs = [t for t in segment.outside.values() if t.requires_grad and id(t) not in explicit]
    be = backend.current()
    replay = Replay(fn, structure, tuple((edge_of(t) if t.requires_grad else None, t.requires_grad,
                                          edge_of(t).name) for t in tensors),
                    tuple((weakref.ref(t), id(be.buffer(t.data)[0])) for t in segment.outside.values()
                          if id(t) not in explicit),
                    tuple(edge_of(t) for t in inputs), segment, preserve_rng_state, st.prefix, features, held,
                    {"autocast": st.autocast, "saves": st.saves, "op_variants": st.op_variants})
    segment.outside = {}  # the entry's edges reach them now; the segment must not hold their data
    kept = keep.arrays_to_keep() if keep is not None else {}
    with state.name_scope(held):
        results = Checkpoint.apply(*tensors, *inputs, replay=replay, outputs=outputs, kept=kept)
    if keep is not None:
        keep.let_go()
    results = iter(results if isinstance(results, tuple) else (results,))
    return tree_map(lambda t: next(results), out)


def _check_arguments(fn, determinism_check: str, use_reentrant, name) -> None:
    """Raise, naming the argument, for what checkpoint() cannot run."""
    if not callable(fn):
        hint = " (pass the function and its arguments: tg.checkpoint(block, h), not tg.checkpoint(block(h)))" \
            if isinstance(fn, Tensor) else ""
        raise TypeError(f"checkpoint: fn must be a callable, got {type(fn).__name__}{hint}")
    if name is not None and _takes_name(fn):
        label = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(f"checkpoint: name={name!r} is checkpoint's own (the entry '{name}.checkpoint'), but fn "
                        f"{label!r} takes a parameter 'name' too, which would get its default, not {name!r}. Pass fn's "
                        f"through functools.partial: tg.checkpoint(functools.partial({label}, name={name!r}), x), "
                        f"and add name={name!r} after it only to name the entry as well")
    if determinism_check not in ("values", "metadata", "none"):
        raise ValueError(f"checkpoint: determinism_check must be 'values', 'metadata' or 'none', got "
                         f"{determinism_check!r}")
    if use_reentrant:
        raise ValueError("checkpoint: use_reentrant=True is not implemented; this engine checkpoints with PyTorch's "
                         "non-reentrant semantics. Pass use_reentrant=False (or leave it out).")


def _takes_name(fn) -> bool:
    """fn has a parameter called `name` (not merely **kwargs), which checkpoint's own `name=` would shadow."""
    if isinstance(fn, functools.partial) and "name" in fn.keywords:  # fn's own name is given already
        return False
    try:
        parameter = inspect.signature(fn).parameters.get("name")
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return parameter is not None and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)


__all__ = ["checkpoint", "CheckpointError", "Checkpoint"]
