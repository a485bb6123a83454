"""The replay stops early, as PyTorch's does: the ops at the end of a segment that backward does not need are
served, not run again.

An op at the end of a segment that saved only its own inputs (a linear: x and W; an add: nothing) and whose
outputs no op that runs in the replay reads need not run: its saves are its replayed inputs, and its outputs
are zero-byte stand-ins. A GPT block's last linear and residual add are not run again.

`Flows` is the feature a checkpoint adds (checkpoint.py, `early_stop=True`): an observer of the segment's
forward noting which op read which op's outputs (by the arrays' identity); `replay()` walks back from the last
op and gives the observer that serves the ops at the end.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from .. import backend
from ..engine.observe import Observer, SegmentObserver


@dataclass
class Flow:
    """One op of the forward: which ops of the segment made its inputs (per input, the op's index or None) and the
    arrays it returns as they are, which input each of its saves is (or None: it saved an array it made), its
    outputs' shapes and dtypes (None for a non-array), and the plain values its Context held."""

    made_by: list
    through: list  # ops of the segment whose outputs this one hands on as its own (a checkpoint's outputs)
    saved: dict
    outputs: tuple
    was_tuple: bool
    attributes: dict

    def servable(self) -> bool:
        """It saved only its own inputs and holds no array besides: it can be served without running."""
        is_array = backend.current().is_array
        return (None not in self.saved.values() and None not in self.outputs
                and not any(is_array(v) for v in self.attributes.values()))


class Flows(SegmentObserver):
    """The segment's forward, as the early stop needs it."""

    def __init__(self):
        super().__init__()
        self.flows: list[Flow] = []
        self.producers: dict[int, tuple] = {}  # id(output array) -> (weak reference, op index)
        self.pinned: set[int] = set()  # ops whose readers cannot be known (outputs without weak references)

    def on_op(self, call, outputs) -> None:
        if not self.mine():
            return
        index = len(self.flows)
        hits = [self.producers.get(id(a)) for a in call.arrays]
        made_by = [hit[1] if hit is not None and hit[0]() is a else None for hit, a in zip(hits, call.arrays)]
        saved = {key: next((j for j, x in enumerate(call.arrays) if x is a), None) for key, a in call.ctx.saved.items()}
        outs = [getattr(o, "data", o) for o in (outputs if isinstance(outputs, tuple) else (outputs,))]
        is_array = backend.current().is_array
        through = [hit[1] for o in outs for hit in [self.producers.get(id(o))] if hit is not None and hit[0]() is o]
        metas = tuple((o.shape, o.dtype) if is_array(o) else None for o in outs)
        self.flows.append(Flow(made_by, through, saved, metas, isinstance(outputs, tuple), call.ctx.attributes()))
        for o in outs:
            try:
                self.producers[id(o)] = (weakref.ref(o), index)
            except TypeError:  # no weak references: its readers are not known, so the replay runs everything
                self.pinned.add(index)

    def replay(self, saved: dict) -> Observer:
        """Walking back from the last op: an op runs if an op that runs reads its outputs; one that can be served
        and whose outputs nothing that runs reads is served (and reads only the inputs it saved)."""
        needed, served = set(self.pinned), {}
        for index in range(len(self.flows) - 1, -1, -1):
            flow = self.flows[index]
            if index in needed or not flow.servable():
                needed.update(p for p in [*flow.made_by, *flow.through] if p is not None)
            else:
                served[index] = flow
                needed.update(flow.made_by[j] for j in flow.saved.values() if flow.made_by[j] is not None)
        self.producers.clear()
        return StopEarly(served)


class StopEarly(SegmentObserver):
    """The replay's end: each op past the early stop is served with its replayed inputs as its saves."""

    def __init__(self, served: dict):
        super().__init__()
        self.served, self.index = served, -1

    def on_op_start(self, call) -> None:
        if not self.mine():
            return
        self.index += 1
        flow = self.served.get(self.index)
        if flow is None or call.given is not None:
            return
        zeros = backend.zeros_view
        outs = tuple(zeros(*meta) for meta in flow.outputs)
        call.given, call.given_by = (outs if flow.was_tuple else outs[0]), self
        call.ctx.set_attributes(flow.attributes)
        call.ctx.flops = (0, call.ctx.flops[1])
        if call.ctx.saving:
            call.ctx.saved = {key: call.arrays[j] for key, j in flow.saved.items()}
