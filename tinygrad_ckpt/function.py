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

`Function.apply` is the only place that unwraps Tensors into arrays and wraps results back. It
decides whether the op is recorded: an op is recorded when gradients are enabled and some input
requires grad. Only then does `ctx.save` keep anything, so an op run under `no_grad` (or inside a
checkpointed segment's forward) saves nothing at all.
"""

from __future__ import annotations

from . import backend, debug, ledger
from .tape import STATE, current_tape, scoped_name


class Context:
    """Per-call scratch space: `save(name=array)` for backward, plus any plain attributes."""

    def __init__(self, needs_input_grad: tuple, saving: bool):
        self.needs_input_grad = needs_input_grad
        self.saving = saving
        self.saved: dict = {}
        self.flops = (0, 0)  # (forward, backward) floating-point operations, set by the op

    def save(self, **arrays) -> None:
        """Keep arrays for backward (only when the op is being recorded)."""
        if self.saving:
            self.saved.update(arrays)

    def saved_bytes(self) -> int:
        seen, total = set(), 0
        for a in self.saved.values():
            if backend.current().is_array(a):
                owner, nbytes = backend.current().buffer(a)
                if id(owner) not in seen:
                    seen.add(id(owner))
                    total += nbytes
        return total

    def release(self, name: str = "") -> None:
        led = ledger.current()
        if led is not None and self.saved:
            led.unsave(name, self.saved)
        self.saved.clear()
        if "segment" in self.__dict__:  # a checkpoint entry: let go of its stash and replay state too
            self.segment = None

    def __repr__(self) -> str:
        saves = ", ".join(f"{k}: {list(v.shape)} {v.dtype}" for k, v in self.saved.items() if hasattr(v, "shape"))
        return f"Context(saved={{{saves}}}, flops={self.flops})"


class Function:
    """Base class of every op. Subclasses define `forward(ctx, *arrays, **params)` and `backward`."""

    op: str = ""  # op kind shown on the tape; defaults to the lower-cased class name

    @staticmethod
    def forward(ctx, *arrays, **params):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, grad_out):
        raise NotImplementedError

    @classmethod
    def kind(cls) -> str:
        return cls.op or cls.__name__.lower()

    @classmethod
    def apply(cls, *inputs, **params):
        from .tensor import Tensor

        arrays = [x.data if isinstance(x, Tensor) else x for x in inputs]
        _check_same_backend(cls.kind(), arrays)
        grad_inputs = [isinstance(x, Tensor) and x.requires_grad for x in inputs]
        requires_grad = STATE.grad_enabled and any(grad_inputs)
        recording = requires_grad and STATE.mode == "record"
        segment = STATE.segment  # inside a checkpointed segment: it observes (and may serve) every op
        ctx = Context(tuple(g and requires_grad for g in grad_inputs), saving=recording or (
            segment is not None and requires_grad))
        name = scoped_name(cls.kind())
        led = ledger.current()
        if led is not None:
            led.begin_forward()
        if segment is not None:
            out = segment.run_op(cls, name, ctx, arrays, params, inputs)
        else:
            out = cls.forward(ctx, *arrays, **params)
        outs = out if isinstance(out, tuple) else (out,)
        debug.check_forward(name, outs)

        if recording:
            tape = current_tape()
            for x in inputs:
                if isinstance(x, Tensor) and x.requires_grad and x._tape is None:
                    tape.add_leaf(x)
            slots = tuple(x._uid if isinstance(x, Tensor) and x.requires_grad else None for x in inputs)
            results = tuple(Tensor.from_op(o, True, tape) for o in outs)
            if led is not None:
                led.forward_op(cls.kind(), name, ctx, outs)  # may raise OutOfMemoryError: nothing recorded yet
            tape.record(
                cls, cls.kind(), name, ctx, slots, tuple(r._uid for r in results),
                tuple(_meta(a) for a in arrays), tuple(_meta(o) for o in outs),
            )
        else:
            results = tuple(Tensor.from_op(o, requires_grad, None) for o in outs)
            if led is not None:
                led.forward_op(cls.kind(), name, ctx, outs)
        return results if isinstance(out, tuple) else results[0]


def _meta(a):
    shape = getattr(a, "shape", ())
    dtype = getattr(a, "dtype", type(a).__name__)
    return tuple(shape), dtype


def _check_same_backend(op: str, arrays) -> None:
    names = {backend.backend_of(a) for a in arrays} - {None}
    active = backend.current().name
    if len(names) > 1 or (names and active not in names):
        shapes = ", ".join(f"{backend.backend_of(a)}{list(getattr(a, 'shape', ()))}" for a in arrays)
        raise TypeError(
            f"{op}: inputs live on different backends ({shapes}) while the active backend is '{active}'. "
            f"Move them to one backend first (e.g. create the tensors after tg.use_backend('{active}'))."
        )
