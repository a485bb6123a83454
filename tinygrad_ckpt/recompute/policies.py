"""Selective recomputation: a policy decides, op by op, what a checkpointed segment keeps instead of replaying.

    tg.checkpoint(block, x, policy=tg.korthikanti_selective)   # keep all but the attention core

A `Policy` answers `decide(op, name)` with a `Decision` (save or recompute, and why) for every op of the
segment's forward, by op kind ("matmul") and scoped name ("transformer.h.3.attn.softmax"). An op it saves
keeps its outputs and what it saved, as if it were not checkpointed (like JAX, a save that is the op's own
input is kept once, by the op that made it); the replay serves it from there instead of running it. An op
that needs no gradient saves nothing, so saving it keeps its outputs (a named constant is not recomputed).

`KeepByPolicy` is the feature a checkpoint adds for `policy=` (checkpoint.py): an observer of the
segment's forward; `replay(saved)` gives the observer that serves the kept ops in the replay.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass

import numpy as np

from .. import backend
from ..engine import observe
from ..engine.names import closest_names, matches
from ..engine.observe import Observer, SegmentObserver


@dataclass(frozen=True)
class Decision:
    save: bool
    reason: str


class Policy:
    """Decides per op, by op kind and scoped name, whether a checkpointed segment keeps its saves."""

    name = "policy"

    def decide(self, op: str, name: str) -> Decision:
        raise NotImplementedError

    def finish(self) -> None:
        """Called when a replay begins, after every forward: a policy may report what it never matched."""

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
    to recompute; keep everything else. The core is every op run directly in an attention module, `attn`
    (nanoGPT) or `self_attn` (Llama), not in its projections (c_attn, q_proj, ...) or dropout; in a Llama the
    rotary positions are kept too (as Megatron applies them before its recomputed core attention), so the
    rotated q and k are what the core's replay reads, and the projections' own outputs need not be kept."""

    name = "korthikanti_selective"
    cores = ("attn", "self_attn")

    def decide(self, op, name):
        parts = name.split(".")
        if op in _VIEWS:
            return Decision(False, "view: free to recompute")
        if len(parts) >= 2 and parts[-2] in self.cores and op != "rotary":
            return Decision(False, "attention core: O(T²) bytes, cheap to recompute")
        return Decision(True, "outside the attention core: keep")


class SaveThese(Policy):
    """Keep the ops named in a collection: op kinds ("matmul") or scoped-name patterns ("attn", "h.0.mlp"), as
    JAX's save_only_these_names does (patterns match as tg.debug.break_before's do). A pattern that has matched
    no op by the first replay is reported once, with the closest names the segments ran."""

    def __init__(self, patterns):
        self.patterns = tuple(sorted(patterns))
        self.name = f"save {', '.join(self.patterns)}"
        self.matched: set[str] = set()
        self.seen: set[str] = set()  # op kinds and names asked about

    def decide(self, op, name):
        self.seen.update((op, name))
        hit = next((p for p in self.patterns if matches(op, name, p)), None)
        if hit is None:
            return Decision(False, "not named: recompute")
        self.matched.add(hit)
        return Decision(True, f"named in the policy ({hit!r})")

    def finish(self) -> None:
        for pattern in [p for p in self.patterns if p not in self.matched]:
            close = closest_names(pattern, self.seen)
            hint = f"; the closest names the segment ran: {', '.join(close)}" if close else ""
            warnings.warn(f"checkpoint policy {{{pattern!r}}} matched no op, so it keeps nothing for it{hint}. A "
                          "pattern is an op kind (linear) or whole dotted parts of a scoped name "
                          "(transformer.h.1.attn).", stacklevel=2)
            self.matched.add(pattern)  # reported once


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
        try:
            inspect.signature(policy).bind("linear", "h.0.mlp.c_fc.linear")
        except TypeError:
            raise TypeError(f"checkpoint: policy={getattr(policy, '__name__', policy)!r} must take two arguments, "
                            "(op kind, scoped name), e.g. lambda op, name: op == 'linear'") from None
        except ValueError:  # no signature to read (a builtin): asked as it is
            pass
        return CallablePolicy(policy)
    if isinstance(policy, (list, tuple, set, frozenset)) and policy and all(isinstance(p, str) for p in policy):
        return SaveThese(policy)
    raise TypeError(f"checkpoint: policy={policy!r} is not a policy: pass a tg.Policy (tg.save_matmuls, "
                    "tg.korthikanti_selective), a function (op, name) -> bool, or a non-empty collection of op kinds "
                    "/ name patterns to keep, e.g. {'matmul', 'linear'}")


# ---- the feature: keep in the forward, serve in the replay -----------------------------------------------
@dataclass
class KeptOp:
    """An op the policy kept: its name, kind and module path (what the ledger says of what it holds), why, and
    how to serve it in the replay: per output a key into the kept arrays (or a stand-in, for an output no
    recomputed op reads), per save a key or ("input", j) for the op's j-th input, and the plain values its
    Context held."""

    index: int  # the op's place in the segment
    op: str
    name: str
    scope: str
    reason: str
    outputs: list
    saves: dict
    was_tuple: bool
    attributes: dict

    def role(self, key: str) -> str:
        """What kept array `key` is to the op: one of its outputs ("output") or the save of that name."""
        return "output" if key in self.outputs else next(role for role, k in self.saves.items() if k == key)


class KeepByPolicy(SegmentObserver):
    """The segment's forward under a policy: each op the policy saves is kept (and reported to the observers as
    saved, by a `KeptOp` holder); after the forward, outputs that no recomputed op reads are let go. A recomputed
    view reads no data: what it views is read only where a recomputed op (or a kept op's save) reads the view."""

    def __init__(self, policy: Policy):
        super().__init__()
        self.policy = policy
        self.kept: dict[int, KeptOp] = {}  # op index -> how to serve it
        self.arrays: dict[str, object] = {}  # key -> kept array
        self.outputs: dict[int, str] = {}  # id(kept output) -> its key (held in `arrays`: the id stays its own)
        self.read: set[str] = set()  # keys of kept outputs that the replay reads (recomputed ops, kept saves)
        self.views: dict[int, tuple] = {}  # id(a recomputed view's output) -> (it, keys of the kept outputs it views)
        self.index = -1

    def on_op_start(self, call) -> None:
        self.index += self.mine()

    def on_op(self, call, outputs) -> None:
        if not self.mine():
            return
        ctx = call.ctx
        decision = self.policy.decide(call.kind, call.name)
        if not decision.save:
            if call.kind in _VIEWS:  # recomputed, it reads nothing: what reads the view reads what it views
                keys = self._keys(call.arrays)
                for o in (outputs if isinstance(outputs, tuple) else (outputs,)) if keys else ():
                    view = getattr(o, "data", o)
                    self.views[id(view)] = (view, keys)  # held, so its id stays its own until the forward ends
            else:
                self._reads(call.arrays)  # a recomputed op reads all its inputs again
            return
        outs = outputs if isinstance(outputs, tuple) else (outputs,)
        arrays = {}
        saves = {}
        for key, a in ctx.saved.items():
            position = next((j for j, x in enumerate(call.arrays) if x is a), None)
            saves[key] = ("input", position) if position is not None else f"kept{self.index}.{key}"
            if position is None:
                arrays[saves[key]] = a
            else:
                self._reads([a])
        keys = []
        for i, o in enumerate(outs):
            keys.append(f"kept{self.index}.out{i}")
            arrays[keys[-1]] = getattr(o, "data", o)
            self.outputs[id(arrays[keys[-1]])] = keys[-1]
        self.kept[self.index] = KeptOp(self.index, call.kind, call.name, call.scope, decision.reason, keys, saves,
                                     isinstance(outputs, tuple), ctx.attributes())
        self.arrays.update(arrays)
        observe.saved(self.kept[self.index], arrays)

    def _keys(self, arrays) -> set:
        """Keys of the kept outputs `arrays` are, or view."""
        keys = set()
        for a in arrays:
            keys |= {self.outputs[id(a)]} if id(a) in self.outputs else self.views.get(id(a), (None, set()))[1]
        return keys

    def _reads(self, arrays) -> None:
        self.read.update(self._keys(arrays))

    def arrays_to_keep(self) -> dict:
        """The arrays the checkpoint entry must save: kept saves, and kept outputs a recomputed op reads (the others
        become stand-ins; the observers hear they are let go)."""
        for kept in self.kept.values():
            own_saves = [self.arrays[k] for k in kept.saves.values() if isinstance(k, str)]
            for i, key in enumerate(kept.outputs):
                a = self.arrays[key]
                if key not in self.read and all(a is not s for s in own_saves):
                    observe.released(kept, {key: self.arrays.pop(key)})
                    kept.outputs[i] = (tuple(a.shape), a.dtype)
        self.outputs.clear()
        self.views.clear()
        return self.arrays

    def owners(self) -> dict:
        """{key of a kept array: (the op that kept it, the array's role: a save's name or "out0", ...)}: what each
        array among a checkpoint entry's saves is (its keys are "input0", ... and these)."""
        found = {}
        for kept in self.kept.values():
            found.update({k: (kept, role) for role, k in kept.saves.items() if isinstance(k, str)})
            found.update({k: (kept, f"out{i}") for i, k in enumerate(kept.outputs) if isinstance(k, str)})
        return found

    def let_go(self) -> None:
        """The checkpoint entry holds the kept arrays now: this feature no longer does."""
        for kept in self.kept.values():
            observe.released(kept, {k: self.arrays[k] for k in [*kept.saves.values(), *kept.outputs]
                                    if isinstance(k, str) and k in self.arrays})
        self.arrays = {}

    def replay(self, saved: dict) -> Observer:
        self.policy.finish()
        return ServeKept(self.kept, saved)


class ServeKept(SegmentObserver):
    """The replay under a policy: each kept op is served (its outputs and saves handed back), not run."""

    restores = True  # what it serves was kept in the forward: the ledger calls those saves "restored"

    def __init__(self, kept: dict, saved: dict):
        super().__init__()
        self.kept, self.saved, self.index = kept, saved, -1

    def on_op_start(self, call) -> None:
        if not self.mine():
            return
        self.index += 1
        kept = self.kept.get(self.index)
        if kept is None or call.given is not None:
            return
        zeros = backend.zeros_view
        outs = tuple(self.saved[k] if isinstance(k, str) else zeros(*k) for k in kept.outputs)
        call.given, call.given_by = (outs if kept.was_tuple else outs[0]), self
        call.ctx.set_attributes(kept.attributes)
        call.ctx.flops = (0, call.ctx.flops[1])
        if call.ctx.saving:
            call.ctx.saved = {name: call.arrays[k[1]] if isinstance(k, tuple) else self.saved[k]
                              for name, k in kept.saves.items()}
