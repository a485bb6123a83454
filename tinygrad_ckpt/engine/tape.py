"""The tape: one plain record per differentiable op, linked into graphs, and the backward loop.

A `TapeEntry` holds the op's `Function` class, its `Context` (the arrays it saved, by name) and one
*edge* per input: an `OpEdge(producer entry, output index)` for a tensor an op made, a `LeafEdge` (a weak
reference) for a leaf tensor (whose `.grad` it feeds), or None where no gradient flows. An entry never holds
an input tensor or its data, only what the op saved (design invariant 1).

A graph belongs to its tensors: a tensor made by an op holds its entry, and an entry holds the
entries it reads from. What no live tensor can reach is freed by Python, saves included, whether
backward ran or not. `loss.tape()` lists the entries `loss` depends on, sorted by the sequence
number each got when recorded: the familiar tape, one per graph.

`backward_steps` is the whole backward pass: a generator over those entries in reverse order. Each step pops the
gradients of the entry's outputs, calls its backward, releases its saves (unless retain_graph) and routes the input
gradients along the edges. Step through it with `python -m pdb` or `tg.debug.break_before("softmax")`.
"""

from __future__ import annotations

import os
import weakref
from typing import NamedTuple

from .. import backend, state
from ..units import format_bytes
from . import observe


class TapeEntry:
    """One recorded op: what ran, under which name (and module path), reading which tensors, and what it saved."""

    __slots__ = ("seq", "op", "name", "scope", "fn", "ctx", "inputs", "in_meta", "out_meta", "released",
                 "__weakref__")

    def __init__(self, fn, name: str, scope: str, ctx, inputs: tuple, in_meta: tuple, out_meta: tuple):
        self.seq = state.next_sequence()  # recording order, across all graphs
        self.op, self.name, self.scope, self.fn, self.ctx = fn.kind(), name, scope, fn, ctx  # scope: the module path
        self.inputs = inputs  # per input: OpEdge(entry, output index) | LeafEdge (weak) | None
        self.in_meta, self.out_meta = in_meta, out_meta  # (shape, dtype) per input / output
        self.released = False  # True once backward consumed the saves

    def saved_bytes(self) -> int:
        """Bytes this entry's saved arrays occupy (views of one buffer counted once)."""
        return _buffer_bytes([self])

    def release(self) -> None:
        """Drop the saved arrays (after this entry's backward ran, or when the graph is dropped)."""
        saved = self.ctx.saved
        if saved:
            observe.released(self, saved)
            self.ctx.saved = {}
            self.released = True

    def __del__(self):  # the graph was dropped: tell the observers its saves are gone too
        if self.ctx.saved and state.local.observers:
            self.release()

    def check_saves(self) -> None:
        """Raise if backward cannot use this entry: saves consumed, or changed in place since recorded."""
        if self.released:
            raise RuntimeError(
                f"backward through '{self.name}' [{self.op}] a second time: the first backward() released what it "
                "saved. Pass retain_graph=True to the first backward() to go through the graph again, or run the "
                "forward pass again."
            )
        if state.changed:
            be = backend.current()
            for key, a in self.ctx.saved.items():
                change = state.changed_since(be.buffer(a)[0], self.seq) if be.is_array(a) else None
                if change is not None:
                    raise RuntimeError(changed_error(self.name, self.op, f"saved '{key}'", a, change))

    def input_names(self) -> list[str]:
        return [edge_name(edge) for edge in self.inputs]

    def __repr__(self) -> str:
        names = self.input_names()
        ins = [f"{n} {_fmt_meta(m)}" if n else _fmt_meta(m) for n, m in zip(names, self.in_meta)]
        leaves = [n for n, edge in zip(names, self.inputs) if edge is not None and edge.is_leaf]
        if len(leaves) > 3:  # a checkpoint reads a block's parameters: say so once
            common = ".".join(os.path.commonprefix([n.split(".") for n in leaves])) or "leaves"
            ins = [i for i, edge in zip(ins, self.inputs) if edge is None or not edge.is_leaf]
            ins.append(f"{len(leaves)} tensors {common}.*")
        ins = ", ".join(ins)
        outs = ", ".join(_fmt_meta(m) for m in self.out_meta)
        if self.released:
            saves = "released"
        else:
            saves = ", ".join(f"{k} {_fmt_meta((v.shape, v.dtype))}" for k, v in self.ctx.saved.items()
                              if hasattr(v, "shape")) or "nothing"
            saves += f" ({format_bytes(self.saved_bytes())})"
        return f"{self.name} [{self.op}] ({ins}) -> ({outs}) saves {saves}"


def changed_error(name: str, op: str, what: str, a, change) -> str:
    """The message for an array an op kept (or read) that was changed in place since (PyTorch's rule)."""
    return (f"'{name}' [{op}] {what} {_fmt_meta((a.shape, a.dtype))} for backward, but tensor '{change[2]}' that "
            f"holds it was changed in place afterwards (now at version {change[1]}), e.g. by an optimizer step or an "
            "in-place method. Run backward() before changing it, or run the forward pass again.")


def _fmt_meta(meta) -> str:
    if meta is None:
        return "-"
    shape, dtype = meta
    return f"{list(shape)} {dtype}"


class OpEdge(NamedTuple):
    """An edge to a tensor an op made: its producer entry and which of the entry's outputs it is. Equal edges
    name the same tensor, so backward keys its waiting gradients by them."""

    entry: TapeEntry
    index: int
    is_leaf = False

    @property
    def name(self) -> str:
        """The producer's name, with the output index for an op of several outputs."""
        entry = self.entry
        return entry.name if len(entry.out_meta) == 1 else f"{entry.name}[{self.index}]"

    def alive(self) -> bool:
        return True  # the edge itself keeps its entry alive

    def __repr__(self) -> str:
        return f"<edge to {self.name} [{self.entry.op}]>"


class LeafEdge(weakref.ref):
    """An edge to a leaf tensor, by weak reference (call it for the tensor, or None once the leaf is gone): the
    gradient arriving here adds into the leaf's `.grad`, and the entry does not keep the leaf alive."""

    __slots__ = ()
    is_leaf = True

    @property
    def name(self) -> str:
        leaf = self()
        return (leaf.name or "leaf") if leaf is not None else "(dead leaf)"

    def alive(self) -> bool:
        return self() is not None

    def __eq__(self, other) -> bool:  # the same leaf (weakref.ref's own == would compare the tensors' values)
        if not isinstance(other, LeafEdge):
            return NotImplemented
        leaf = self()
        return self is other or (leaf is not None and leaf is other())

    __hash__ = weakref.ref.__hash__  # the leaf's (by identity)

    def __repr__(self) -> str:
        return f"<edge to leaf {self.name}>"


def edge_name(edge) -> str:
    """The name of the tensor an edge points at ("" for None). Its gradient is named this + ".grad"."""
    return "" if edge is None else edge.name


def _buffer_bytes(entries) -> int:
    be, owners = backend.current(), {}
    for entry in entries:
        for a in entry.ctx.saved.values():
            if be.is_array(a):
                owner, nbytes = be.buffer(a)
                owners[id(owner)] = nbytes
    return sum(owners.values())


class Tape:
    """The entries a tensor depends on, in forward order (what `tensor.tape()` returns)."""

    def __init__(self, entries: list[TapeEntry]):
        self.entries = entries
        state.new_tape(self)  # it keeps its entries' saves alive: a Ledger entered later counts them

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __getitem__(self, i):
        return self.entries[i]

    def saved_bytes(self) -> int:
        """Bytes all entries hold together; a buffer saved by several entries counts once."""
        return _buffer_bytes(self.entries)

    def __repr__(self) -> str:
        lines = [f"Tape with {len(self.entries)} entries ({format_bytes(self.saved_bytes())} saved)"]
        lines += [f"  #{i} {e!r}" for i, e in enumerate(self.entries)]
        return "\n".join(lines)


def edge_of(tensor) -> OpEdge | LeafEdge:
    """The edge to a tensor, which is also how backward names it: its producer entry and output index, or a
    weak reference to it if it is a leaf."""
    return OpEdge(tensor._entry, tensor._index) if tensor._entry is not None else LeafEdge(tensor)


def graph(tensors, stop=frozenset()) -> list[TapeEntry]:
    """The entries the tensors depend on, in forward order; edges in `stop` are not followed."""
    found, todo = {}, [t._entry for t in tensors if t._entry is not None]
    while todo:
        entry = todo.pop()
        if entry.seq not in found:
            found[entry.seq] = entry
            todo += [edge.entry for edge in entry.inputs if edge is not None and not edge.is_leaf and edge not in stop]
    return [found[seq] for seq in sorted(found)]


def backward_steps(tensors, grads, retain_graph: bool = False, capture=None):
    """Backpropagate from `tensors` seeded with `grads` (both lists are taken over and emptied, so that
    nothing keeps a consumed gradient or a root's data alive); a generator that yields each entry just
    before its backward runs.

    Gradients reaching a leaf add into its `.grad`. With `capture` (a set of edges: the inputs of
    a replayed segment), gradients reaching those tensors are collected instead and returned as the
    generator's value, and the graph behind them is not entered.
    """
    store = _Gradients(capture)
    store.add_all([edge_of(t) for t in tensors], grads, shared={id(g) for g in grads})  # the caller's seeds
    entries = graph(tensors, capture or frozenset())
    tensors.clear()
    grads.clear()
    observers = state.local.observers
    with observe.phase("backward"):
        for entry in reversed(entries):
            grad_outs = store.pop_outputs(entry)
            if grad_outs is None:
                continue  # no gradient flows through this entry
            entry.check_saves()
            yield entry
            shared = {*map(id, grad_outs), *map(id, entry.ctx.saved.values())}  # held elsewhere: not added into
            for o in reversed(observers):
                o.on_backward(entry)  # tg.debug.break_before opens pdb here, before the backward runs
            grad_ins = checked_gradients(entry, entry.fn.input_grads(entry.ctx, grad_outs))
            del grad_outs
            if not retain_graph:
                entry.release()
            for o in reversed(observers):
                o.on_backward_done(entry, grad_ins)
            store.add_all(entry.inputs, grad_ins, shared)
            grad_ins = None  # drop our references now, so consumed gradients free at once
    return store.captured


def checked_gradients(entry, grad_ins) -> tuple:
    """What an entry's backward returned, as PyTorch's engine takes it: one gradient (or None) per input, each a
    backend array of its input's shape (a gradient the input broadcast to is summed down to it) in its input's
    dtype (cast, as PyTorch casts). Anything else raises, naming the op and the input's index."""
    fn = entry.fn.__name__
    if len(grad_ins) != len(entry.inputs) and all(g is None for g in grad_ins[len(entry.inputs):]):
        grad_ins = grad_ins[:len(entry.inputs)]  # extra Nones (an optional input left out) are allowed, as in PyTorch
    if len(grad_ins) != len(entry.inputs):
        raise RuntimeError(f"{fn}.backward ('{entry.name}') returned {len(grad_ins)} gradient(s), expected "
                           f"{len(entry.inputs)}: one per input of forward (None for an input without one)")
    be = backend.current()
    out = []
    for i, (g, edge, meta) in enumerate(zip(grad_ins, entry.inputs, entry.in_meta)):
        if g is None or edge is None:  # no gradient, or an input that needs none: dropped, as in PyTorch
            out.append(None)
            continue
        shape, dtype = meta
        if g.__class__ is be.array_type and g.shape == shape and g.dtype == dtype:  # the usual case, at once
            out.append(g)
            continue
        g = be.as_array(g)
        if not be.is_array(g):
            raise TypeError(f"{fn}.backward ('{entry.name}') returned a {type(g).__name__} as the gradient of input "
                            f"{i}; return a {be.name} array of shape {list(shape)} (or None)")
        if tuple(g.shape) != shape:
            if not backend.broadcasts_to(shape, tuple(g.shape)):
                raise RuntimeError(f"{fn}.backward ('{entry.name}') returned an invalid gradient at index {i}: got "
                                   f"{list(g.shape)} but expected shape compatible with {list(shape)}")
            g = backend.unbroadcast(g, shape)
        out.append(g if g.dtype == dtype else g.astype(dtype))
    return tuple(out)


def run_steps(steps):
    """Drive a `backward_steps` generator to its end and return its value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Gradients:
    """Where gradients wait during one backward: by edge until their entry runs, in leaves' `.grad`,
    or captured for the caller.

    Whether an array may be added into is decided in one place, `add_all`: an array is *private* when this
    backward made it and no one else holds it: an op's fresh result (owning its data) that is not one of the
    arrays the entry was handed or keeps (its output gradients, its saves; the caller's seeds) nor returned
    for two inputs (add passes its grad_out to both). A private array waiting here is added into in place (and a
    leaf takes it as its `.grad`); any other is copied or summed into a new array first.
    """

    def __init__(self, capture):
        self.capture = capture
        self.pending: dict = {}
        self.captured: dict = {}
        self.owned: set[int] = set()  # ids of the private arrays waiting here (pending or captured)

    def __repr__(self) -> str:
        waiting = ", ".join(f"{k.name}.grad" for k in list(self.pending)[:4])
        more = f", +{len(self.pending) - 4} more" if len(self.pending) > 4 else ""
        captured = f"; {len(self.captured)} captured for the caller" if self.capture is not None else ""
        return f"<gradients waiting for their entry: {len(self.pending)} ({waiting}{more}){captured}>"

    def pop_outputs(self, entry):
        if len(entry.out_meta) == 1:  # the usual case, at once
            g = self.pending.pop(OpEdge(entry, 0), None)
            self.owned.discard(id(g))
            return None if g is None else [g]
        grads = [self.pending.pop(OpEdge(entry, k), None) for k in range(len(entry.out_meta))]
        if all(g is None for g in grads):
            return None
        if self.owned:
            self.owned.difference_update(id(g) for g in grads)
        zeros = backend.xp().zeros
        return [g if g is not None or meta is None else zeros(meta[0], dtype=meta[1])
                for g, meta in zip(grads, entry.out_meta)]

    def add_all(self, edges, grads, shared) -> None:
        """Route the gradients an entry's backward produced (a loop in the generator would keep the last alive).
        `shared`: ids of the arrays someone else holds (see the class)."""
        owns_data = backend.current().owns_data
        for edge, g in zip(edges, grads):
            if edge is not None and g is not None:
                once = len(grads) == 1 or sum(h is g for h in grads) == 1
                self.add(edge, g, once and id(g) not in shared and owns_data(g))

    def add(self, edge, g, private: bool) -> None:
        if self.capture is not None and edge in self.capture:
            self._sum(self.captured, edge, g, private)
        elif not edge.is_leaf:  # a tensor an op made: its gradient waits for its entry
            self._sum(self.pending, edge, g, private)
        else:
            leaf = edge()
            if leaf is not None:
                leaf._accumulate_grad(g if private else g.copy())

    def _sum(self, where: dict, edge, g, private: bool) -> None:
        if edge not in where:
            where[edge] = g
            if private:
                self.owned.add(id(g))
            return
        total = where[edge]
        if id(total) in self.owned:
            total += g
            return
        total = total + g
        observe.alloc(total, "gradient", edge.name, "grad")
        where[edge] = total
        self.owned.add(id(total))
