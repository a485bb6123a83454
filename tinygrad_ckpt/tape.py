"""The tape: a list of plain records, one per differentiable op, and the backward loop over it.

A `TapeEntry` holds the op's `Function` class, its `Context` (the arrays it saved, by name) and the
*slots* (integer ids) of its input and output tensors: never the tensors themselves, so the tape
keeps no data alive except what ops saved (design invariant 1). Leaf tensors are reached through
weak references, to accumulate their `.grad`.

`Tape.backward_steps` is the whole backward pass: a generator over entries in reverse order. Each
step pops the gradients of the entry's outputs, calls `fn.backward(ctx, *grad_outs)`, releases the
entry's saved arrays, and adds the input gradients into the slots they belong to. Step through it
with `python -m pdb` or `tg.debug.break_before("softmax")`.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

from . import debug, ledger
from .estimate import format_bytes


class State:
    """Recording state shared by the engine (one per process)."""

    def __init__(self):
        self.grad_enabled = True
        self.mode = "record"  # "record": keep saves on the tape; "discard": checkpoint forward, keep nothing
        self.scope: list[str] = []
        self.tape_ref = None  # weak reference to the tape new entries go to
        self.segment = None  # the checkpointed segment being run or replayed (checkpoint.Segment), if any


STATE = State()


def scoped_name(op: str) -> str:
    return ".".join([*STATE.scope, op])


@contextlib.contextmanager
def name_scope(name: str):
    """Prefix the names of ops recorded inside with `name` (modules do this automatically)."""
    if not name:
        yield
        return
    STATE.scope.append(name)
    try:
        yield
    finally:
        STATE.scope.pop()


@contextlib.contextmanager
def no_grad():
    """Run ops without recording: nothing is saved, outputs do not require grad."""
    previous = STATE.grad_enabled
    STATE.grad_enabled = False
    try:
        yield
    finally:
        STATE.grad_enabled = previous


@contextlib.contextmanager
def recording_mode(mode: str, tape: Tape | None = None, segment=None):
    """Temporarily change what ops do with their saves ("record" or "discard"), where entries go,
    and which checkpointed segment observes the ops."""
    saved = (STATE.mode, STATE.tape_ref, STATE.segment, STATE.grad_enabled)
    STATE.mode, STATE.segment, STATE.grad_enabled = mode, segment, True
    if tape is not None:
        STATE.tape_ref = weakref.ref(tape)
    try:
        yield
    finally:
        STATE.mode, STATE.tape_ref, STATE.segment, STATE.grad_enabled = saved


def current_tape() -> Tape:
    """The tape new entries are appended to; a new one once the last was consumed or dropped."""
    tape = STATE.tape_ref() if STATE.tape_ref is not None else None
    if tape is None or tape.closed:
        tape = Tape()
        STATE.tape_ref = weakref.ref(tape)
    return tape


def _fmt_meta(meta) -> str:
    shape, dtype = meta
    return f"{list(shape)} {dtype}"


@dataclass(eq=False)
class TapeEntry:
    """One recorded op: what ran, under which name, on which slots, and what it saved."""

    index: int
    op: str  # op kind, e.g. "gelu"
    name: str  # scoped name, e.g. "h.3.mlp.gelu"
    fn: type  # the Function class whose backward runs
    ctx: object  # the Context: saved arrays by name, plus plain attributes
    inputs: tuple  # slot per input (None where no gradient flows)
    outputs: tuple  # slot per output
    in_meta: tuple = field(repr=False, default=())  # (shape, dtype) per input
    out_meta: tuple = field(repr=False, default=())
    released: bool = False

    def saved_bytes(self) -> int:
        """Bytes this entry's saved arrays occupy (views of one buffer counted once)."""
        return self.ctx.saved_bytes()

    def release(self) -> None:
        """Drop the saved arrays (after this entry's backward ran)."""
        self.ctx.release(self.name)
        self.released = True

    def __repr__(self) -> str:
        ins = ", ".join(_fmt_meta(m) for m in self.in_meta)
        outs = ", ".join(_fmt_meta(m) for m in self.out_meta)
        if self.released:
            saves = "released"
        else:
            saves = ", ".join(
                f"{k} {list(v.shape)} {v.dtype}" for k, v in self.ctx.saved.items()
            ) or "nothing"
            saves += f" ({format_bytes(self.saved_bytes())})"
        return f"#{self.index} {self.name} [{self.op}] ({ins}) -> ({outs}) saves {saves}"


class Tape:
    """Entries in forward order, plus weak references to the leaf tensors they read."""

    def __init__(self):
        self.entries: list[TapeEntry] = []
        self.leaves: dict[int, weakref.ref] = {}
        self.closed = False

    def __repr__(self) -> str:
        lines = [f"Tape with {len(self.entries)} entries ({format_bytes(self.saved_bytes())} saved)"]
        lines += [f"  {e!r}" for e in self.entries]
        return "\n".join(lines)

    def __len__(self) -> int:
        return len(self.entries)

    def saved_bytes(self) -> int:
        """Bytes all entries hold together; a buffer saved by several entries counts once."""
        from .backend import current

        owners = {}
        for entry in self.entries:
            for a in entry.ctx.saved.values():
                if current().is_array(a):
                    owner, nbytes = current().buffer(a)
                    owners[id(owner)] = nbytes
        return sum(owners.values())

    def record(self, fn, op, name, ctx, inputs, outputs, in_meta, out_meta) -> TapeEntry:
        entry = TapeEntry(len(self.entries), op, name, fn, ctx, inputs, outputs, in_meta, out_meta)
        self.entries.append(entry)
        return entry

    def add_leaf(self, tensor) -> None:
        if tensor._uid not in self.leaves:
            self.leaves[tensor._uid] = weakref.ref(tensor)

    def release(self) -> None:
        """Free everything the tape still holds and close it for good."""
        for entry in self.entries:
            if not entry.released:
                entry.release()
        self.closed = True

    def backward_steps(self, grads: dict, retain_graph: bool = False, capture=()):
        """Run backward from `grads` ({slot: gradient array}, taken over: the dict is emptied);
        yields each entry before its backward.

        Gradients reaching leaf tensors accumulate into their `.grad`; gradients for the slots in
        `capture` are collected instead and available as the generator's return value.
        """
        led = ledger.current()
        store = _Gradients(grads, self.leaves, capture, led)
        grads.clear()  # the store holds them now; this frame must not keep a consumed gradient alive
        with led.backward_pass() if led is not None else contextlib.nullcontext():
            for entry in reversed(self.entries):
                grad_outs = [store.pop(slot) for slot in entry.outputs]
                if all(g is None for g in grad_outs):
                    continue  # nothing flows through this entry
                if entry.released:
                    raise RuntimeError(
                        f"backward reached tape entry #{entry.index} '{entry.name}' whose saved arrays were "
                        "already released by an earlier backward(). Run the forward pass again, or pass "
                        "retain_graph=True to the first backward() if you need to go through the graph twice."
                    )
                grad_outs = [g if g is not None else _zeros(m) for g, m in zip(grad_outs, entry.out_meta)]
                if led is not None:
                    led.begin_backward(entry)
                yield entry
                if debug.should_break(entry):
                    debug.enter_debugger(entry)
                if getattr(entry.fn, "takes_grad_list", False):
                    # a checkpoint entry empties the list once its sub-tape holds the gradients, so a
                    # nested replay does not keep one incoming gradient alive per level
                    grad_ins = entry.fn.backward(entry.ctx, grad_outs)
                else:
                    grad_ins = entry.fn.backward(entry.ctx, *grad_outs)
                grad_ins = grad_ins if isinstance(grad_ins, tuple) else (grad_ins,)
                del grad_outs
                debug.check_backward(entry, grad_ins)
                if not retain_graph:
                    entry.release()
                if led is not None:
                    led.end_backward(entry, grad_ins)
                store.add_all(entry, grad_ins)
                grad_ins = None  # drop our references now, so consumed gradients free at once
        if not retain_graph:
            self.closed = True  # new ops go to a new tape; entries backward did not reach stay usable
        return store.captured


class _Gradients:
    """Where gradients wait during backward: by slot, into leaves' .grad, or captured for a caller.

    The first gradient into a slot may be an array someone else also holds (add passes grad_out
    to both inputs), so it is never added into; the first sum allocates, later sums add in place.
    """

    def __init__(self, grads, leaves, capture, led):
        self.pending = dict(grads)
        self.leaves, self.capture, self.led = leaves, set(capture), led
        self.owned: set[int] = set()  # slots whose array we allocated (safe to add into)
        self.handed: set[int] = set()  # ids of arrays already given to a leaf as its .grad
        self.captured: dict[int, object] = {}

    def pop(self, slot):
        return self.pending.pop(slot, None)

    def add_all(self, entry, grad_ins) -> None:
        for slot, g in zip(entry.inputs, grad_ins):
            if slot is not None and g is not None:
                self.add(slot, g, entry)

    def add(self, slot, g, entry) -> None:
        from .tensor import accumulate_grad  # tensor imports tape; keep the cycle lazy

        if slot in self.capture:
            previous = self.captured.get(slot)
            self.captured[slot] = g if previous is None else _summed(previous, g, self.led, entry)
        elif slot in self.leaves:
            leaf = self.leaves[slot]()
            if leaf is not None:
                accumulate_grad(leaf, g, shared=id(g) in self.handed)
                self.handed.add(id(g))
        elif slot not in self.pending:
            self.pending[slot] = g
        elif slot in self.owned:
            self.pending[slot] += g
        else:
            self.pending[slot] = _summed(self.pending[slot], g, self.led, entry)
            self.owned.add(slot)


def _summed(a, b, led, entry):
    """a + b as a new array (the first gradient into a slot may be shared, so never add into it)."""
    total = a + b
    if led is not None:
        led.track(total, "gradient", f"{entry.name}.grad")
    return total


def _zeros(meta):
    from .backend import xp

    shape, dtype = meta
    return xp().zeros(shape, dtype=dtype)
