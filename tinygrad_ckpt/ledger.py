"""The memory ledger: one event for every allocation and release of a buffer the engine holds.

    with tg.Ledger() as led:
        loss = model(x, y)[1]; loss.backward(); opt.step()
    print(led.summary()); led.peak_bytes("activation"); led.timeline(); led.lifetimes()

What is counted is *buffers*, not tensors: views and tensors sharing memory resolve to the one
array that owns it (`backend.buffer`) and are counted once. A buffer is "allocated" the first
time the engine holds it, and "released" when its memory is really freed: a weak-reference
finalizer on the owning array fires then, never when the engine merely thinks it is done.

Each buffer has one category at a time, the strongest of the roles it plays:
parameter > optimizer > gradient > activation (saved by the tape) > other (live tensors).
A forward output starts as "other", becomes "activation" when an op saves it, and returns to
"other" if the tape lets it go while a tensor still holds it.

The ledger also counts FLOPs per phase ("forward", "backward", "recompute", "optimizer"), records
one op slice per op for the Chrome trace, and can enforce a capacity like a GPU that cannot grow.
A ledger is an observer (observe.py): entering it installs it in the observer slot of the thread
that entered it, and it records what that thread's engine does; other threads are not observed.
The core never calls it by name, and nothing costs anything while no ledger is active.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import gc
import json
import math
import numbers
import os
import time
import tracemalloc
import weakref
from dataclasses import asdict, dataclass, field

import numpy as np

from . import backend, explorer, memory_viz, state
from .checks import number, one_of
from .observe import Observer
from .palette import layer_of
from .tape import edge_name
from .units import format_bytes, parse_bytes

CATEGORIES = ("parameter", "optimizer", "gradient", "activation", "other")
PHASES = ("forward", "backward", "recompute", "optimizer")
_PRIORITY = {c: i for i, c in enumerate(CATEGORIES)}  # lower index wins



def current() -> Ledger | None:
    """The ledger active in this thread, or None."""
    return next((o for o in state.local.observers if isinstance(o, Ledger)), None)


class OutOfMemoryError(RuntimeError):
    """An allocation would exceed the ledger's capacity (like a GPU that cannot grow)."""


@dataclass(slots=True)
class Event:
    seq: int
    step: int
    phase: str
    action: str  # existing | allocated | saved | recomputed | restored | unsaved | released | retagged | op
    nbytes: int
    category: str
    name: str  # scoped name of the op (or the tensor) responsible
    shape: tuple = ()
    dtype: str = ""
    buffer: int = -1  # ledger-wide buffer id (stable, never reused)
    live: int = 0  # total live bytes after this event
    from_category: str = ""  # for a move between categories (saved / unsaved)
    flops: int = 0  # FLOPs of this op (action "op")
    time: float = 0.0  # seconds since the ledger started

    @property
    def allocates(self) -> bool:
        """A buffer's first event: its memory counts from here (a tape that existed when the ledger started
        also has "existing" save events, which move a buffer between categories like "saved")."""
        return self.action in ("existing", "allocated") and not self.from_category


@dataclass(slots=True)
class _Buffer:
    id: int
    nbytes: int
    category: str
    name: str
    roles: set = field(default_factory=set)  # non-activation roles played
    saves: int = 0  # how many live tape saves hold it
    finalizer: object = None


@dataclass
class Lifetime:
    """One saved buffer: when it was saved, read by backward, and freed; how long it sat idle."""

    name: str
    nbytes: int
    shape: tuple
    dtype: str
    buffer: int
    created: int  # step of the first save
    first_used: int | None = None  # step of the first backward that read it
    last_used: int | None = None
    released: int | None = None  # step its memory was freed
    idle_fraction: float | None = None  # share of its backward pass (in steps) spent before first use
    idle_fraction_flops: float | None = None  # the same, weighted by backward FLOPs


class Ledger(Observer):
    """Records memory events and FLOPs while active (a context manager). See the module docstring."""

    def __init__(self, capacity_bytes: int | str | None = None, trace_numpy: bool = False):
        self.capacity_bytes = capacity_bytes  # validated by the property below
        if not isinstance(trace_numpy, (bool, np.bool_)):
            raise TypeError(f"Ledger: trace_numpy must be True or False, got {trace_numpy!r}")
        self._entered = False
        self._observers = None  # while recording: the observer list of the thread that entered it
        self.trace_numpy = trace_numpy  # record tracemalloc's NumPy bytes at every op boundary
        self.events: list[Event] = []
        self.ops: list[dict] = []  # one slice per op: name, op, phase, step, t0, t1, flops
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self._total = 0  # live bytes over all categories
        self.allocated_total = dict.fromkeys(CATEGORIES, 0)
        self.freed_total = dict.fromkeys(CATEGORIES, 0)
        self.flops_by_phase = dict.fromkeys(PHASES, 0)
        self.step = 0
        self._buffers: dict[int, _Buffer] = {}  # id(owner) -> record
        self._next_buffer = 0
        self._phase_stack: list[tuple[str, float]] = []  # (phase, when it began)
        self._span_stack: list[float] = []  # when each open span began
        self.spans: list[dict] = []  # one per phase run (a backward, a replay, an optimizer step) or named span (a
        # checkpointed segment's forward): name, phase, t0, t1
        self._lifetimes: dict[int, Lifetime] = {}  # buffer id -> lifetime (saved buffers)
        self._t0 = time.perf_counter()
        self._starts: list[tuple] = []  # per op begun and not yet recorded: (time, live bytes, traced bytes)
        self.traced: list[tuple] = []  # (step, NumPy bytes per tracemalloc, ledger live bytes, op's transient peak)

    def __repr__(self) -> str:
        status = "recording" if self._observers is not None else ("done" if self._entered else "not started")
        capacity = f", capacity {format_bytes(self.capacity_bytes)}" if self.capacity_bytes is not None else ""
        return (f"<Ledger ({status}): {len(self.events)} events, {len(self.ops)} ops, "
                f"peak {format_bytes(self.peak_total)}{capacity}>")

    # ---- activation --------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int | None:
        """The most the engine may hold before an op raises OutOfMemoryError (None: no limit)."""
        return self._capacity

    @capacity_bytes.setter
    def capacity_bytes(self, value) -> None:
        if value is not None:
            wanted = "a positive number of bytes or a size such as '80GB' or '74.5 GiB'"
            if not (number(value) or isinstance(value, str)):
                raise TypeError(f"Ledger: capacity_bytes must be {wanted}, got {value!r}")
            try:
                size = parse_bytes(value) if isinstance(value, str) else value
            except ValueError:
                raise ValueError(f"Ledger: capacity_bytes must be {wanted}, got {value!r}") from None
            if not 1 <= size < math.inf:  # NaN fails too; None (not inf) means no limit
                raise ValueError(f"Ledger: capacity_bytes must be {wanted} (None for no limit), got {value!r}")
            value = int(size)
        self._capacity = value

    def __enter__(self) -> Ledger:
        if self._entered:
            raise RuntimeError("this Ledger has recorded already: a Ledger records one `with` block; make a new one")
        if current() is not None:
            raise RuntimeError(f"this thread is already observed by {current()!r}: one Ledger per thread "
                               "at a time (nesting is refused); exit the first one before entering another")
        self._entered = True
        self._observers = state.local.observers  # the entering thread's list: exiting elsewhere still leaves it
        self._observers.append(self)
        self._t0 = time.perf_counter()
        gc.collect()  # unreachable cycles still in memory would be counted as live, then vanish
        self._scan_existing()
        return self

    def __exit__(self, *exc) -> None:
        if self._observers is not None and self in self._observers:
            self._observers.remove(self)
        self._observers = None
        for buf in self._buffers.values():
            if buf.finalizer is not None:
                buf.finalizer.detach()

    def _scan_existing(self) -> None:
        """Count what the engine already holds when the ledger starts (parameters, grads, states, tapes)."""
        from .optim import Optimizer
        from .tape import TapeEntry
        from .tensor import Tensor

        for obj in gc.get_objects():
            kind = type(obj)  # type(), not isinstance(): no attribute lookups on foreign objects
            if issubclass(kind, Tensor):
                self.track(obj.data, "parameter" if obj.is_parameter else "other", obj.name or "tensor",
                           action="existing")
                if obj.grad is not None:
                    self.track(obj.grad, "gradient", f"{obj.name or 'tensor'}.grad", action="existing")
            elif issubclass(kind, Optimizer):
                for p in obj.params:
                    for k, a in obj.state.get(id(p), {}).items():
                        self.track(a, "optimizer", obj.state_name(p, k), action="existing")
            elif issubclass(kind, TapeEntry) and obj.ctx.saved:
                self._save(obj.name, obj.ctx.saved, action="existing")

    # ---- phases --------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str):
        """Attribute the ops inside to a phase ("recompute", "optimizer")."""
        one_of("phase", "name", name, PHASES)
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase(name)

    def begin_phase(self, name: str) -> None:
        self._phase_stack.append((name, time.perf_counter()))

    def end_phase(self, name: str) -> None:
        name, t0 = self._phase_stack.pop()
        self.spans.append({"name": name, "phase": name, "t0": t0 - self._t0, "t1": time.perf_counter() - self._t0})

    def begin_span(self, label: str) -> None:
        self._span_stack.append(time.perf_counter())

    def end_span(self, label: str) -> None:
        t0 = self._span_stack.pop()
        self.spans.append({"name": label, "phase": self.current_phase, "t0": t0 - self._t0,
                           "t1": time.perf_counter() - self._t0})

    @property
    def current_phase(self) -> str:
        return self._phase_stack[-1][0] if self._phase_stack else "forward"

    # ---- recording -----------------------------------------------------------------------
    def _emit(self, action, nbytes, category, name, a=None, buf=None, from_category="", flops=0) -> Event:
        ev = Event(len(self.events), self.step, self.current_phase, action, nbytes, category, name,
                   tuple(a.shape) if a is not None else (), _dtype_name(a.dtype) if a is not None else "",
                   buf.id if buf is not None else -1, self._total, from_category, flops,
                   time.perf_counter() - self._t0)
        self.events.append(ev)
        return ev

    def _add(self, category: str, nbytes: int) -> None:
        self.live[category] += nbytes
        if self.live[category] > self.peak[category]:
            self.peak[category] = self.live[category]
        self._total += nbytes
        if self._total > self.peak_total:
            self.peak_total = self._total

    def _move(self, buf: _Buffer, category: str) -> str:
        old = buf.category
        if old != category:
            self.live[old] -= buf.nbytes
            self._total -= buf.nbytes  # _add puts it back
            self.freed_total[old] += buf.nbytes
            self.allocated_total[category] += buf.nbytes
            buf.category = category
            self._add(category, buf.nbytes)
        return old

    def _category_of(self, buf: _Buffer) -> str:
        roles = set(buf.roles)
        if buf.saves:
            roles.add("activation")
        return min(roles, key=_PRIORITY.__getitem__) if roles else "other"

    def track(self, a, role: str, name: str, action: str = "allocated") -> _Buffer | None:
        """Note that the engine holds array `a` in `role`; a new buffer is an allocation."""
        be = backend.current()
        if not be.is_array(a):
            return None
        owner, nbytes = be.buffer(a)
        key = id(owner)
        buf = self._buffers.get(key)
        if buf is None:
            buf = _Buffer(self._next_buffer, int(nbytes), role, name)
            if role != "activation":
                buf.roles.add(role)
            self._next_buffer += 1
            self._buffers[key] = buf
            buf.finalizer = weakref.finalize(owner, self._on_free, key)
            self.allocated_total[role] += buf.nbytes
            self._add(role, buf.nbytes)
            self._emit(action, buf.nbytes, role, name, a, buf)
        elif role != "activation" and role not in buf.roles:
            buf.roles.add(role)
            old = self._move(buf, self._category_of(buf))
            if old != buf.category:
                self._emit("retagged", buf.nbytes, buf.category, name, a, buf, from_category=old)
        return buf

    def _on_free(self, key: int) -> None:
        buf = self._buffers.pop(key, None)
        if buf is None:
            return
        self.live[buf.category] -= buf.nbytes
        self._total -= buf.nbytes
        self.freed_total[buf.category] += buf.nbytes
        self._emit("released", buf.nbytes, buf.category, buf.name, None, buf)
        life = self._lifetimes.get(buf.id)
        if life is not None:
            life.released = self.step

    def on_save(self, holder, saved: dict) -> None:
        """`holder` (a tape entry, or what a checkpoint's policy kept) now holds these arrays for backward."""
        self._save(_holder_name(holder), saved)

    def _save(self, name: str, saved: dict, action: str = "saved") -> None:
        if action == "saved" and self.current_phase == "recompute":
            action = "recomputed"
        for key, a in saved.items():
            buf = self.track(a, "activation", f"{name}:{key}", "existing" if action == "existing" else "allocated")
            if buf is None:
                continue
            buf.saves += 1
            old = self._move(buf, self._category_of(buf))
            self._emit(action, buf.nbytes, buf.category, f"{name}:{key}", a, buf, from_category=old)
            if buf.id not in self._lifetimes and buf.category == "activation":
                self._lifetimes[buf.id] = Lifetime(f"{name}:{key}", buf.nbytes, tuple(a.shape), str(a.dtype),
                                                   buf.id, self.step)

    def on_release(self, holder, saved: dict) -> None:
        """The tape let go of these arrays (the entry's backward ran, or the tape was dropped)."""
        name = _holder_name(holder)
        be = backend.current()
        for key, a in saved.items():
            if not be.is_array(a):
                continue
            buf = self._buffers.get(id(be.buffer(a)[0]))
            if buf is None:
                continue
            buf.saves -= 1
            old = self._move(buf, self._category_of(buf))
            self._emit("unsaved", buf.nbytes, buf.category, f"{name}:{key}", a, buf, from_category=old)

    # ---- the observer callbacks (observe.py) ------------------------------------------------------
    def on_alloc(self, array, category: str, name: str) -> None:
        self.track(array, category, name)

    def on_op_start(self, call) -> None:
        """An op begins (a checkpoint's begins before the ops of its segment, so its slice wraps theirs)."""
        traced = 0
        if self.trace_numpy and tracemalloc.is_tracing():
            tracemalloc.reset_peak()
            traced = tracemalloc.get_traced_memory()[0]
        self._starts.append((time.perf_counter(), self._total, traced))

    def on_op(self, call, outputs) -> None:
        """After an op's forward: count its FLOPs, its outputs and what it saved; enforce capacity."""
        kind, name, ctx = call.fn.kind(), call.name, call.ctx
        phase = self.current_phase
        transient = 0  # what the op allocated and freed again inside, per tracemalloc
        if self.trace_numpy and tracemalloc.is_tracing():
            transient = tracemalloc.get_traced_memory()[1] - self._starts[-1][2]
        for out in outputs if isinstance(outputs, tuple) else (outputs,):
            self.track(getattr(out, "data", out), "other", name)
        if call.entry is not None:
            self._save(name, ctx.saved, action="restored" if getattr(call.given_by, "restores", False) else "saved")
        self._record_op(kind, name, phase, ctx.flops[0], transient)

    def on_backward(self, entry) -> None:
        self._starts.append((time.perf_counter(), self._total, 0))
        be = backend.current()
        for a in entry.ctx.saved.values():
            if be.is_array(a):
                buf = self._buffers.get(id(be.buffer(a)[0]))
                life = self._lifetimes.get(buf.id) if buf is not None else None
                if life is not None:
                    if life.first_used is None:
                        life.first_used = self.step
                    life.last_used = self.step

    def on_backward_done(self, entry, grad_ins) -> None:
        for i, (edge, g) in enumerate(zip(entry.inputs, grad_ins)):
            if g is not None:  # named after the tensor it is the gradient of
                self.track(g, "gradient", f"{edge_name(edge)}.grad" if edge is not None else f"{entry.name}.grad{i}")
        self._record_op(entry.op, entry.name, "backward", entry.ctx.flops[1])

    def on_update(self, kind: str, name: str, flops: int) -> None:
        self._record_op(kind, name, self.current_phase, flops)

    def _record_op(self, kind: str, name: str, phase: str, flops: int, transient: int = 0) -> None:
        """One op ran (a forward, a backward or an update): a step, its FLOPs, a trace slice; then the capacity."""
        t0, live_at_start, _ = self._starts.pop() if self._starts else (time.perf_counter(), self._total, 0)
        self.step += 1
        self.flops_by_phase[phase] += flops
        self._emit("op", 0, "", name, flops=flops)
        self.ops.append({"name": name, "op": kind, "phase": phase, "step": self.step,
                         "t0": t0 - self._t0, "t1": time.perf_counter() - self._t0, "flops": flops})
        if self.trace_numpy and tracemalloc.is_tracing():
            self.traced.append((self.step, numpy_traced_bytes(), self.live_bytes(), transient))
        self._check_capacity(name, self._total - live_at_start)

    def _check_capacity(self, name: str, request: int) -> None:
        total = self._total
        if self.capacity_bytes is None or total <= self.capacity_bytes:
            return
        holders = sorted(self._buffers.values(), key=lambda b: -b.nbytes)[:5]
        by_cat = ", ".join(f"{c} {format_bytes(self.live[c], digits=2)}" for c in CATEGORIES if self.live[c])
        biggest = "; ".join(f"{b.name} ({b.category}, {format_bytes(b.nbytes, digits=2)})" for b in holders)
        would, added, capacity = (format_bytes(n, digits=2) for n in (total, request, self.capacity_bytes))
        raise OutOfMemoryError(
            f"out of memory in '{name}' ({self.current_phase}): the engine would hold {would} "
            f"(this op added {added}) but the capacity is {capacity}. "
            f"Live by category: {by_cat}. Largest holders: {biggest}. "
            "Try activation checkpointing (tg.checkpoint / GPT(checkpoint='sqrt')), a smaller batch or "
            "sequence, or a larger capacity."
        )

    # ---- queries ---------------------------------------------------------------------------
    def live_bytes(self, category: str | None = None) -> int:
        """Live bytes now, over all categories together or for one category."""
        one_of("live_bytes", "category", category, CATEGORIES, none="all categories")
        return self._total if category is None else self.live[category]

    def peak_bytes(self, category: str | None = None) -> int:
        """Highest live bytes seen, over all categories together or for one category."""
        one_of("peak_bytes", "category", category, CATEGORIES, none="all categories")
        return self.peak_total if category is None else self.peak[category]

    def flops(self, phase: str | None = None) -> int:
        """FLOPs recorded: all phases, or one of "forward", "backward", "recompute", "optimizer"."""
        one_of("flops", "phase", phase, PHASES, none="all phases")
        return sum(self.flops_by_phase.values()) if phase is None else self.flops_by_phase[phase]

    def timeline(self) -> dict:
        """Equal-length NumPy arrays, one entry per event: seq, step, cumulative flops, phase, the
        live bytes of each category after the event, and their total."""
        n = len(self.events)
        out = {k: np.zeros(n, dtype=np.int64) for k in ("seq", "step", "flops", "total", *CATEGORIES)}
        out["phase"] = np.empty(n, dtype=object)
        out["time"] = np.zeros(n)
        live = dict.fromkeys(CATEGORIES, 0)
        flops = 0
        for i, ev in enumerate(self.events):
            if ev.allocates:
                live[ev.category] += ev.nbytes
            elif ev.action == "released":
                live[ev.category] -= ev.nbytes
            elif ev.from_category and ev.from_category != ev.category:
                live[ev.from_category] -= ev.nbytes
                live[ev.category] += ev.nbytes
            flops += ev.flops
            out["seq"][i], out["step"][i], out["flops"][i] = ev.seq, ev.step, flops
            out["phase"][i], out["time"][i] = ev.phase, ev.time
            for c in CATEGORIES:
                out[c][i] = live[c]
            out["total"][i] = sum(live.values())
        return out

    def backward_passes(self) -> list[tuple[int, int]]:
        """(first step, last step) of each run of backward/recompute ops."""
        runs, start, last = [], None, None
        for op in self.ops:
            if op["phase"] in ("backward", "recompute"):
                if start is None:
                    start = op["step"]
                last = op["step"]
            elif start is not None:
                runs.append((start, last))
                start = None
        if start is not None:
            runs.append((start, last))
        return runs

    def lifetimes(self) -> list[Lifetime]:
        """Every buffer the tape saved: created, first/last used by backward, released, idle fraction."""
        runs = self.backward_passes()
        backward = [op for op in self.ops if op["phase"] == "backward"]
        bw_steps = np.array([op["step"] for op in backward], dtype=np.int64)
        bw_flops = np.cumsum([0] + [op["flops"] for op in backward])  # bw_flops[k]: FLOPs of the first k

        def flops_until(step):  # backward FLOPs of the steps <= step
            return int(bw_flops[np.searchsorted(bw_steps, step, side="right")])

        for life in self._lifetimes.values():
            if life.first_used is None:
                continue
            for start, end in runs:
                if start - 1 <= life.first_used <= end:
                    span = end - start + 1
                    life.idle_fraction = (life.first_used - (start - 1)) / span
                    done = flops_until(life.first_used) - flops_until(start - 1)
                    total = flops_until(end) - flops_until(start - 1)
                    life.idle_fraction_flops = done / total if total else None
                    break
        return list(self._lifetimes.values())

    def saved_breakdown(self, by: str = "layer", depth: int | None = None) -> dict:
        """Bytes saved for backward, each buffer counted once (under its first saver).

        by="layer": per layer (`layer_of`: "transformer.h.3", "transformer.ln_f", "cross_entropy");
        by="module": per scoped module name ("transformer.h.3.mlp"; cut to `depth` dot-separated parts if
        given); by="op": per op kind; by="name": per saved array.
        """
        one_of("saved_breakdown", "by", by, ("layer", "module", "op", "name"))
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 1):
            kind = ValueError if isinstance(depth, numbers.Integral) and not isinstance(depth, bool) else TypeError
            raise kind(f"saved_breakdown: depth must be None or a positive int (dot-separated parts of the module "
                       f"name to keep), got {depth!r}")
        out: dict[str, int] = {}
        for life in self._lifetimes.values():
            op_name = life.name.split(":")[0]
            if by == "name":
                key = life.name
            elif by == "layer":
                key = layer_of(life.name)
            elif by == "op":
                key = op_name.rsplit(".", 1)[-1]
            else:
                parts = op_name.split(".")[:-1] or ["(top)"]
                key = ".".join(parts[:depth] if depth else parts)
            out[key] = out.get(key, 0) + life.nbytes
        return out

    def flops_by_layer(self, phase: str = "forward") -> dict:
        """FLOPs of the ops of one phase, per layer (`layer_of` of the op's name)."""
        one_of("flops_by_layer", "phase", phase, PHASES)
        out: dict[str, int] = {}
        for op in self.ops:
            if op["phase"] == phase:
                key = layer_of(op["name"])
                out[key] = out.get(key, 0) + op["flops"]
        return out

    def summary(self) -> str:
        """A fixed-width table: current / peak / allocated / freed bytes per category, and FLOPs.

        A buffer moving between categories (an output saved by the tape) leaves one and enters the
        other: it counts as freed there and allocated here. The total row counts real memory only.
        """
        rows = [f"{'category':<12}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
        rows.append("-" * len(rows[0]))
        def row(label, *values):
            return f"{label:<12}" + "".join(f"{format_bytes(v, digits=2):>14}" for v in values)

        for c in CATEGORIES:
            rows.append(row(c, self.live[c], self.peak[c], self.allocated_total[c], self.freed_total[c]))
        rows.append("-" * len(rows[0]))
        real_alloc = sum(e.nbytes for e in self.events if e.allocates)
        real_freed = sum(e.nbytes for e in self.events if e.action == "released")
        rows.append(row("total", self.live_bytes(), self.peak_total, real_alloc, real_freed))
        rows.append("")
        rows.append("FLOPs  " + "  ".join(f"{p} {self.flops_by_phase[p]:.3e}" for p in PHASES))
        rows.append(f"events {len(self.events)}  ops {len(self.ops)}  steps {self.step}")
        return "\n".join(rows)

    # ---- exports ---------------------------------------------------------------------------
    def to_chrome_trace(self, path=None) -> dict:
        """Chrome trace / Perfetto JSON: one slice ("X") per op and per phase run, nested as they ran (a
        checkpoint's slice wraps its segment's forward ops; a backward wraps each checkpoint's replay, which
        wraps the recomputed ops), and a counter track ("C") of the live bytes per category.
        Timestamps in microseconds since the ledger started."""
        if path is not None:
            _path("to_chrome_trace", path)
        trace = [{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "tinygrad_ckpt"}}]
        for span in self.spans:
            trace.append({"ph": "X", "pid": 1, "tid": 1, "name": span["name"], "cat": "phase",
                          "ts": span["t0"] * 1e6, "dur": (span["t1"] - span["t0"]) * 1e6, "args": {}})
        for op in self.ops:
            trace.append({"ph": "X", "pid": 1, "tid": 1, "name": op["name"], "cat": op["phase"],
                          "ts": op["t0"] * 1e6, "dur": (op["t1"] - op["t0"]) * 1e6,
                          "args": {"op": op["op"], "flops": op["flops"], "step": op["step"]}})
        tl = self.timeline()
        for i, ev in enumerate(self.events):
            if ev.action != "op":
                trace.append({"ph": "C", "pid": 1, "tid": 1, "name": "memory", "ts": ev.time * 1e6,
                              "args": {c: int(tl[c][i]) for c in CATEGORIES}})
        doc = {"traceEvents": trace, "displayTimeUnit": "ms"}
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc

    def to_csv(self, path) -> None:
        """Every event, one row each, under a header of the Event fields."""
        names = list(Event.__slots__)
        with open(_path("to_csv", path), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(names)
            for ev in self.events:
                writer.writerow([getattr(ev, k) for k in names])

    def to_memory_viz(self, path=None) -> dict:
        """PyTorch's memory snapshot of what this ledger recorded (memory_viz.py): open the pickle at
        pytorch.org/memory_viz. Written with pickle protocol 4 when `path` is given; returns the dict."""
        snap = memory_viz.snapshot(self.events)
        if path is not None:
            memory_viz.write(snap, _path("to_memory_viz", path))
        return snap

    def to_html(self, path, compare=None, labels=None, title: str | None = None) -> str:
        """One self-contained interactive page (explorer.py): memory over op steps by category, lifetimes of
        the saved buffers, hover, highlight, search, pan and zoom; nothing fetched, opens from file://.

        compare: another Ledger, or a list of them, shown beside this one on one y axis (plain against
        checkpointed); labels: one per ledger (default "ledger 1", ...). Returns the path written.
        """
        _path("to_html", path)  # every argument is checked before the file is opened
        if title is not None and not isinstance(title, str):
            raise TypeError(f"to_html: title must be a string (or None for the default), got {type(title).__name__}")
        others = [] if compare is None else list(compare) if isinstance(compare, (list, tuple)) else [compare]
        for i, other in enumerate(others):
            if not isinstance(other, Ledger):
                raise TypeError(f"to_html: compare must be a Ledger or a list of Ledgers, got {type(other).__name__}"
                                + (f" at position {i}" if isinstance(compare, (list, tuple)) else ""))
        ledgers = [self, *others]
        if labels is None:
            labels = [f"ledger {i + 1}" for i in range(len(ledgers))] if others else ["ledger"]
        labels = [labels] if isinstance(labels, str) else list(labels)
        if len(labels) != len(ledgers) or not all(isinstance(label, str) for label in labels):
            raise ValueError(f"to_html: labels must be {len(ledgers)} string(s), one per ledger (this one and "
                             f"{len(others)} to compare), got {labels!r}")
        runs = [explorer.run_data(label, led.events, led.ops, led.lifetimes(), led.timeline(), led.backward_passes())
                for label, led in zip(labels, ledgers)]
        return explorer.write_html(path, runs, explorer.DEFAULT_TITLE if title is None else title)

    def to_jsonl(self, path) -> None:
        """Every event as one JSON object per line."""
        with open(_path("to_jsonl", path), "w") as f:
            for ev in self.events:
                f.write(json.dumps({k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(ev).items()}))
                f.write("\n")


def _path(method: str, path):
    """A file name, or TypeError naming the method: an int would be taken by open() as a file descriptor."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{method}: path must be a file name (str or os.PathLike), got {type(path).__name__} "
                        f"{path!r}")
    return path


def _holder_name(holder) -> str:
    """How events name what a holder keeps: a tape entry by its op's scoped name; an op a checkpoint's policy kept
    by that name and the reason."""
    reason = getattr(holder, "reason", None)
    return f"{holder.name}[kept: {reason}]" if reason is not None else holder.name


@functools.cache
def _dtype_name(dtype) -> str:
    return str(dtype)


def numpy_traced_bytes() -> int:
    """Bytes of NumPy array data alive now, as tracemalloc sees them (NumPy reports to its own domain)."""
    snapshot = tracemalloc.take_snapshot()
    domain = np.lib.tracemalloc_domain
    return sum(t.size for t in snapshot.traces if t.domain == domain)
