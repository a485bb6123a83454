"""`Function`: an op as a pair of static methods on raw arrays, and `Context`: what it saves.

    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            out = xp().exp(x)
            ctx.save(out=out)            # backward reads exp(x) itself: d/dx e^x = e^x
            return out
        @staticmethod
        def backward(ctx, grad_out):
            return grad_out * ctx.saved["out"]

`Function.apply` is the only place that unwraps Tensors into arrays and wraps results back. An op is recorded (a
`TapeEntry` is made) when gradients are enabled and some input requires grad; only then does `ctx.save` keep
anything (under `no_grad` nothing). Each call is an `OpCall` record, which this thread's observers see (observe.py).
"""

from __future__ import annotations

from .. import backend, state
from .tape import TapeEntry, edge_of
from .tensor import Tensor


class Context:
    """Per-call scratch space: `save(name=array)` for backward, plus plain attributes the op sets.

    What every op may read: `needs_input_grad` (per input), `in_shapes` (per input: its shape, None for a
    non-array), `saving` (saves are kept), `flops` = (forward, backward), which the op sets."""

    def __init__(self, needs_input_grad: tuple, in_shapes: tuple, saving: bool):
        self.needs_input_grad = needs_input_grad
        self.in_shapes = in_shapes
        self.saving = saving
        self.saved: dict = {}
        self.flops = (0, 0)
        self.non_differentiable = ()  # indices of outputs that never require grad

    def save(self, **arrays) -> None:
        """Keep arrays for backward (only when the op is being recorded)."""
        if self.saving:
            self.saved.update(arrays)

    def attributes(self) -> dict:
        """The plain values the op's forward set on the Context (shapes, flags, flops): a checkpoint's replay that
        serves an op instead of running it gives them back with `set_attributes`."""
        return {k: v for k, v in vars(self).items() if k not in _CORE}

    def set_attributes(self, values: dict) -> None:
        vars(self).update(values)

    def mark_non_differentiable(self, *indices: int) -> None:
        """These outputs never require grad (e.g. integer results)."""
        self.non_differentiable = indices

    def __repr__(self) -> str:
        saves = ", ".join(f"{k}: {list(v.shape)} {v.dtype}" for k, v in self.saved.items() if hasattr(v, "shape"))
        return f"Context(saved={{{saves}}}, flops={self.flops})"


_CORE = ("needs_input_grad", "in_shapes", "saving", "saved")


class OpCall:
    """One op being applied, as observers see it: the Function, its kind, scoped name and module path (`scope`),
    the inputs (Tensors and constants) and their arrays, its keyword parameters and Context; `record` (make a tape
    entry, when a gradient can flow) and `given` (outputs an observer gives instead of running forward, and
    `given_by`, that observer), which observers may change in on_op_start; `entry` once recorded."""

    __slots__ = ("fn", "kind", "name", "scope", "inputs", "arrays", "params", "ctx", "record", "given", "given_by",
                 "entry")

    def __init__(self, fn, inputs: tuple, params: dict):
        st = state.local
        self.fn, self.kind, self.inputs, self.params = fn, fn.kind(), inputs, params
        self.name = st.prefix + self.kind
        self.scope = st.prefix[:-1]  # the module path the op runs in: prefix "h.3.mlp." -> "h.3.mlp" ("" at the top)
        self.arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
        _check_same_backend(self.kind, self.arrays)
        needs = tuple(st.grad_enabled and isinstance(x, Tensor) and x.requires_grad for x in inputs)
        self.record = any(needs)
        self.ctx = Context(needs, tuple(getattr(a, "shape", None) for a in self.arrays), self.record)
        self.given = self.given_by = self.entry = None

    def __repr__(self) -> str:
        return f"<call of {self.name} [{self.kind}]{' (recorded)' if self.record else ''}>"


class Function:
    """Base class of every op. Subclasses define `forward(ctx, *arrays, **params)` and `backward`."""

    op: str = ""  # op kind shown on the tape; defaults to the lower-cased class name

    @staticmethod
    def forward(ctx, *arrays, **params):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grad_outs):
        raise NotImplementedError

    @classmethod
    def input_grads(cls, ctx, grad_outs: list) -> tuple:
        """What the backward loop calls: `backward(ctx, *grad_outs)` as a tuple, one gradient per input.
        (A Function that replays a segment overrides this, to free `grad_outs` as soon as it can.)"""
        grad_ins = cls.backward(ctx, *grad_outs)
        return grad_ins if isinstance(grad_ins, tuple) else (grad_ins,)

    @classmethod
    def kind(cls) -> str:
        return cls.op or cls.__name__.lower()

    @classmethod
    def apply(cls, *inputs, **params):
        """Unwrap the inputs, run forward on raw arrays, record an entry if a gradient can flow, wrap the outputs."""
        call = OpCall(cls, inputs, params)
        observers = state.local.observers
        for o in reversed(observers):
            o.on_op_start(call)  # an observer may stop it recording, or give its outputs (a checkpoint's replay)
        out = cls.forward(call.ctx, *call.arrays, **params) if call.given is None else call.given
        outputs = _wrap(call, out)
        for o in reversed(observers):
            o.on_op(call, outputs)  # may raise OutOfMemoryError: the entry then dies
        return outputs


def _wrap(call: OpCall, out):
    """The forward's results as Tensors on the tape: an entry recorded if `call.record` (else what the op saved dies
    with its Context), NumPy's scalars made 0-d arrays (their saves too, once, so an output and its save stay one
    buffer); a non-array output passes through."""
    ctx, be = call.ctx, backend.current()
    outs = out if isinstance(out, tuple) else (out,)
    if be.any_scalar(outs) or be.any_scalar(ctx.saved.values()):
        arrays = {id(o): be.as_array(o) for o in outs}
        outs = tuple(arrays[id(o)] for o in outs)
        ctx.saved = {k: arrays.get(id(v)) if id(v) in arrays else be.as_array(v) for k, v in ctx.saved.items()}
    if call.record:
        edges = tuple(edge_of(x) if needed else None for x, needed in zip(call.inputs, ctx.needs_input_grad))
        call.entry = TapeEntry(call.fn, call.name, call.scope, ctx, edges, tuple(map(_meta, call.arrays)),
                               tuple(map(_meta, outs)))
    grad, cut = any(ctx.needs_input_grad), ctx.non_differentiable
    results = tuple(Tensor._from_op(o, grad and i not in cut, call.entry if grad and i not in cut else None, i)
                    if be.is_array(o) else o for i, o in enumerate(outs))
    return results if isinstance(out, tuple) else results[0]


def _meta(a):
    """(shape, dtype) of an array; None for anything else (a non-array output, a Python number argument)."""
    return (tuple(a.shape), a.dtype) if hasattr(a, "dtype") and hasattr(a, "shape") else None


def _check_same_backend(op: str, arrays) -> None:
    names = {backend.backend_of(a) for a in arrays} - {None}
    active = backend.current().name
    if len(names) > 1 or (names and active not in names):
        shapes = ", ".join(f"{backend.backend_of(a)}{list(getattr(a, 'shape', ()))}" for a in arrays)
        raise TypeError(
            f"{op}: inputs live on different backends ({shapes}) while the active backend is '{active}'. "
            f"Move them to one backend first (e.g. create the tensors after tg.use_backend('{active}'))."
        )
