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

`Function.apply` is the only place that unwraps Tensors into arrays and wraps results back. An op
is recorded (a `TapeEntry` is made) when gradients are enabled and some input requires grad; only
then does `ctx.save` keep anything, so an op run under `no_grad` saves nothing at all.

A checkpointed segment has one hook on the ops it runs: while `state.local.segment` is set, apply
asks it to run the forward (`segment.run(fn, name, ctx, arrays, params, inputs)`), and records an
entry only if `segment.records` (a segment's first forward keeps nothing; its replay records).
"""

from __future__ import annotations

from . import backend, debug, state
from .tape import TapeEntry, key_of
from .tensor import Tensor


class Context:
    """Per-call scratch space: `save(name=array)` for backward, plus plain attributes the op sets."""

    def __init__(self, needs_input_grad: tuple, saving: bool):
        self.needs_input_grad = needs_input_grad
        self.saving = saving
        self.saved: dict = {}
        self.flops = (0, 0)  # (forward, backward) floating-point operations, set by the op
        self.non_differentiable = ()  # indices of outputs that never require grad

    def save(self, **arrays) -> None:
        """Keep arrays for backward (only when the op is being recorded)."""
        if self.saving:
            self.saved.update(arrays)

    def mark_non_differentiable(self, *indices: int) -> None:
        """These outputs never require grad (e.g. integer results)."""
        self.non_differentiable = indices

    def __repr__(self) -> str:
        saves = ", ".join(f"{k}: {list(v.shape)} {v.dtype}" for k, v in self.saved.items() if hasattr(v, "shape"))
        return f"Context(saved={{{saves}}}, flops={self.flops})"


class Function:
    """Base class of every op. Subclasses define `forward(ctx, *arrays, **params)` and `backward`."""

    op: str = ""  # op kind shown on the tape; defaults to the lower-cased class name
    begins_early = False  # True: its caller told the observer when it began (a checkpoint, before its segment)

    @staticmethod
    def forward(ctx, *arrays, **params):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grad_outs):
        raise NotImplementedError

    @classmethod
    def call_backward(cls, ctx, grad_outs: list) -> tuple:
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
        st = state.local
        arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
        _check_same_backend(cls.kind(), arrays)
        needs_grad = tuple(st.grad_enabled and isinstance(x, Tensor) and x.requires_grad for x in inputs)
        requires_grad = any(needs_grad)
        ctx = Context(needs_grad, saving=requires_grad)
        name = st.prefix + cls.kind()
        if st.observer is not None and not cls.begins_early:
            st.observer.on_op_start()
        segment = st.segment
        if segment is None:
            out = cls.forward(ctx, *arrays, **params)
        else:
            out = segment.run(cls, name, ctx, arrays, params, inputs)
        outs = _as_arrays(ctx, out if isinstance(out, tuple) else (out,))
        entry = None
        if requires_grad and (segment is None or segment.records):
            edges = tuple(key_of(x) if needed else None for x, needed in zip(inputs, needs_grad))
            entry = TapeEntry(cls, name, ctx, edges, tuple(map(_meta, arrays)), tuple(map(_meta, outs)))
        if st.anomaly:
            debug.check_forward(name, outs, entry, params)
        linked = [requires_grad and i not in ctx.non_differentiable for i in range(len(outs))]
        is_array = backend.current().is_array
        results = tuple(Tensor._from_op(o, rg, entry if rg else None, i) if is_array(o) else o
                        for i, (o, rg) in enumerate(zip(outs, linked)))  # a non-array output passes through
        if st.observer is not None:
            st.observer.on_op(cls.kind(), name, ctx, outs)  # may raise OutOfMemoryError: the entry then dies
        return results if isinstance(out, tuple) else results[0]


def _meta(a):
    """(shape, dtype) of an array; None for anything else (a non-array output, a Python number argument)."""
    return (tuple(a.shape), a.dtype) if hasattr(a, "dtype") and hasattr(a, "shape") else None


def _as_arrays(ctx, outs: tuple) -> tuple:
    """The outputs (and saves) as backend arrays: NumPy hands back a scalar for a 0-d result, which becomes a 0-d
    array here, once, so that an output and its save stay one buffer."""
    as_array = backend.current().as_array
    converted = {id(o): as_array(o) for o in outs}
    if ctx.saved:
        ctx.saved = {k: converted.get(id(v)) if id(v) in converted else as_array(v) for k, v in ctx.saved.items()}
    return tuple(converted[id(o)] for o in outs)


def _check_same_backend(op: str, arrays) -> None:
    names = {backend.backend_of(a) for a in arrays} - {None}
    active = backend.current().name
    if len(names) > 1 or (names and active not in names):
        shapes = ", ".join(f"{backend.backend_of(a)}{list(getattr(a, 'shape', ()))}" for a in arrays)
        raise TypeError(
            f"{op}: inputs live on different backends ({shapes}) while the active backend is '{active}'. "
            f"Move them to one backend first (e.g. create the tensors after tg.use_backend('{active}'))."
        )
