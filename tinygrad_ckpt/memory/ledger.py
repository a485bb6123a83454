"""The memory ledger: one event for every allocation and release of a buffer the engine holds.

    with tg.Ledger() as led:
        loss = model(x, y)[1]; loss.backward(); opt.step()
    print(led.summary()); led.peak_bytes("activation"); led.timeline(); led.lifetimes()

What is counted is *buffers*, not tensors: views sharing memory resolve to the array that owns it
(`backend.buffer`), counted once. A buffer is "released" when its memory is really freed (a weak reference
to the owning array calls back). Each event says what it is about in fields (events.Origin).
The Ledger records; its collaborators each hold one idea: categories.py (a buffer's category, the "untouched"
rule), counts.py (bytes per category and peaks), window.py (the iterations a bounded ledger keeps),
capacity.py (the capacity and the allocator plugged in), queries.py (timeline, lifetimes, summary) and
exports.py. A ledger is an observer (engine/observe.py) of the thread that entered it; nothing costs
anything while no ledger is active.
"""

from __future__ import annotations

import contextlib
import time
import tracemalloc

import numpy as np

from .. import state
from ..checks import one_of
from ..engine.observe import Observer
from ..units import format_bytes, parse_capacity
from . import exports, queries
from .buffers import Holdings, holder_fields
from .capacity import ALLOCATORS, OutOfMemoryError, out_of_memory, placement_for, reserved_line
from .categories import scan_existing
from .counts import check_whole
from .events import (
    BACKWARD,
    CATEGORIES,
    FORWARD,
    NO_CATEGORY,
    OP,
    OPTIMIZER,
    PHASES,
    RECOMPUTE,
    RECOMPUTED,
    RESTORED,
    SAVED,
    EventLog,
    Iteration,
    Lifetime,
    code,
)
from .window import IterationWindow, check_keep

__all__ = ["CATEGORIES", "PHASES", "Ledger", "OutOfMemoryError", "current", "numpy_traced_bytes"]
_CATEGORY = {c: i for i, c in enumerate(CATEGORIES)}
_PHASE = {p: i for i, p in enumerate(PHASES)}


def current() -> Ledger | None:
    """The ledger active in this thread, or None."""
    return next((o for o in state.local.observers if isinstance(o, Ledger)), None)


class Ledger(Observer):
    """Records memory events and FLOPs while active (a context manager). See the module docstring.

    capacity_bytes: the most the engine may hold (OutOfMemoryError beyond it); trace_numpy: also record
    tracemalloc's NumPy bytes at every op boundary (slow); keep_iterations: keep the events, op slices and
    lifetimes of the last N training iterations only (an iteration begins with the first forward op after a
    backward or optimizer phase), and a summary of each older one (`iterations()`). Peaks, FLOPs and summary()
    cover the whole run either way. allocator="pytorch-cuda": also place every buffer, as the engine takes and
    frees it, with PyTorch's CUDA caching allocator simulated (cuda_allocator.Placement; `alloc_conf` in
    PYTORCH_CUDA_ALLOC_CONF's syntax): the reserved bytes join the summary, timeline()["reserved"], the explorer
    and the memory_viz export (its segments and addresses), and a capacity is then also the device's, checked as
    cudaMalloc would (OutOfMemoryError when a segment cannot be had)."""

    ALLOCATORS = ALLOCATORS

    def __init__(self, capacity_bytes: int | str | None = None, trace_numpy: bool = False,
                 keep_iterations: int | None = None, allocator: str | None = None, alloc_conf: str = ""):
        self._capacity = parse_capacity(capacity_bytes)
        self.allocator, self.alloc_conf = allocator, alloc_conf
        # where PyTorch's allocator would place each buffer (None: no allocator); settings checked here
        self.placement = placement_for(allocator, alloc_conf, self._capacity)
        if not isinstance(trace_numpy, (bool, np.bool_)):
            raise TypeError(f"Ledger: trace_numpy must be True or False, got {trace_numpy!r}")
        self.keep_iterations = check_keep(keep_iterations)
        self.trace_numpy = trace_numpy  # record tracemalloc's NumPy bytes at every op boundary
        self._entered = False
        self._observers = None  # while recording: the observer list of the thread that entered it
        self.events = EventLog()  # a sequence of Event records (built on access)
        self.ops = self.events.ops  # a sequence of op slices (dicts: name, op, scope, layer, phase, step, t0, t1, ...)
        self._window = IterationWindow(self.keep_iterations)
        self._held = Holdings(self.events, self._window, self.placement, self._emit)  # the buffers, their bytes
        self._counts = self._held.counts
        self.flops_by_phase = dict.fromkeys(PHASES, 0)
        self.step = 0  # ops recorded
        self.seq = 0  # events recorded (led.events keeps the last ones in a bounded ledger)
        self._phases: list[tuple[int, float]] = []  # (phase, when it began); empty: forward
        self._phase = FORWARD
        self._span_stack: list[float] = []  # when each open span began
        self.spans: list[dict] = []  # per phase run or named span: name, phase, t0, t1, the seq of the next event
        self._t0 = time.perf_counter()
        self._starts: list[tuple] = []  # per op begun and not yet recorded: (time, live bytes, traced bytes)
        self.traced: list[tuple] = []  # (step, NumPy bytes per tracemalloc, live bytes all told, op's transient peak)

    def __repr__(self) -> str:
        status = "recording" if self._observers is not None else ("done" if self._entered else "not started")
        capacity = f", capacity {format_bytes(self.capacity_bytes)}" if self.capacity_bytes is not None else ""
        return (f"<Ledger ({status}): {len(self.events)} events, {len(self.ops)} ops, "
                f"peak {format_bytes(self.peak_bytes())}{capacity}>")

    # ---- activation --------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int | None:
        """The most the engine may hold before an op raises OutOfMemoryError (None: no limit)."""
        return self._capacity

    @capacity_bytes.setter
    def capacity_bytes(self, value) -> None:
        self._capacity = parse_capacity(value)
        if self.placement is not None:  # the simulated device's capacity too
            self.placement.allocator.capacity = self._capacity

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
        # No gc.collect(): garbage not yet collected is memory really held, so it is counted (untouched, as the code
        # never uses it), and its collection is a real release. Entering costs a walk over the weak registries only.
        scan_existing(self._held.hold, self._held.save_all)  # all of it untouched, until the recorded code uses it
        return self

    def __exit__(self, *exc) -> None:
        if self._observers is not None and self in self._observers:
            self._observers.remove(self)
        self._observers = None
        for buf in self._held.buffers.values():
            buf.ref = None  # no more release events

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
        """Ops from now on belong to phase `name` (one of PHASES), until end_phase(name)."""
        one_of("Ledger.begin_phase", "name", name, PHASES)
        self._phase = _PHASE[name]
        self._phases.append((self._phase, time.perf_counter()))

    def end_phase(self, name: str) -> None:
        """The phase begun last, `name`, ends: ops belong to the one around it again (forward if none)."""
        _check_closing("Ledger.end_phase", name, PHASES[self._phases[-1][0]] if self._phases else None, "phase")
        phase, t0 = self._phases.pop()
        self._phase = self._phases[-1][0] if self._phases else FORWARD
        self._window.ended |= phase in (BACKWARD, OPTIMIZER)
        self.spans.append({"name": PHASES[phase], "phase": PHASES[phase], "t0": t0 - self._t0,
                           "t1": time.perf_counter() - self._t0, "seq": self.seq})

    def begin_span(self, label: str) -> None:
        self._span_stack.append(time.perf_counter())

    def end_span(self, label: str) -> None:
        _check_closing("Ledger.end_span", label, "" if self._span_stack else None, "span")
        t0 = self._span_stack.pop()
        self.spans.append({"name": label, "phase": self.current_phase, "t0": t0 - self._t0,
                           "t1": time.perf_counter() - self._t0, "seq": self.seq})

    @property
    def current_phase(self) -> str:
        return PHASES[self._phase]

    # ---- recording -----------------------------------------------------------------------
    def _emit(self, action: int, nbytes: int, category: int, origin: int, buffer: int = -1, from_category: int = -1,
              phase: int | None = None) -> None:
        packed = code(action, self._phase if phase is None else phase, category, from_category + 1, origin)
        self.events.append(time.perf_counter() - self._t0, nbytes, self._counts.total, buffer, packed)
        if self.placement is not None:
            self.placement.after_event.append(self.placement.allocator.reserved)
        self.seq += 1

    def _save(self, fields: tuple, saved: dict, action: int = SAVED) -> None:
        """The op of `fields` (buffers.holder_fields) keeps these arrays for backward from now."""
        self._held.save_all(fields, saved, RECOMPUTED if action == SAVED and self._phase == RECOMPUTE else action)

    def on_save(self, holder, saved: dict) -> None:
        """`holder` (a tape entry, or what a checkpoint's policy kept) now holds these arrays for backward."""
        self._save(holder_fields(holder), saved)

    def on_release(self, holder, saved: dict) -> None:
        """The tape let go of these arrays (the entry's backward ran, or the tape was dropped)."""
        self._held.release_all(holder_fields(holder), saved)

    # ---- the observer callbacks (observe.py) ------------------------------------------------------
    def on_alloc(self, array, category: str, tensor: str, role: str = "", op: str = "") -> None:
        self._held.hold(array, _CATEGORY[category], tensor, role, op)

    def on_op_start(self, call) -> None:
        """An op begins (a checkpoint's begins before the ops of its segment, so its slice wraps theirs)."""
        if self._window.ended and not self._phases and call is not None:
            self._next_iteration()
        traced = 0
        if self.trace_numpy and tracemalloc.is_tracing():
            tracemalloc.reset_peak()
            traced = tracemalloc.get_traced_memory()[0]
        self._starts.append((time.perf_counter(), self._counts.total, traced))

    def on_op(self, call, outputs) -> None:
        """After an op's forward: count its FLOPs, its outputs and what it saved; enforce capacity."""
        kind, name, scope, ctx = call.fn.kind(), call.name, call.scope, call.ctx
        transient = 0  # what the op allocated and freed again inside, per tracemalloc
        if self.trace_numpy and tracemalloc.is_tracing():
            transient = tracemalloc.get_traced_memory()[1] - self._starts[-1][2]
        if self._held.untouched:
            self._held.touch_arrays(call.arrays)  # it read its inputs (an op refused before it ran touches nothing)
        self._held.hold_outputs(outputs if isinstance(outputs, tuple) else (outputs,), name, kind, scope)
        if call.entry is not None:
            restored = getattr(call.given_by, "restores", False)
            self._save((name, kind, scope, "", None), ctx.saved, RESTORED if restored else SAVED)
        origin = self.events.origin(None, name, name, kind, scope, "", "", "")
        self._record_op(origin, self._phase, ctx.flops[0], transient)

    def on_backward(self, entry) -> None:
        self._starts.append((time.perf_counter(), self._counts.total, 0))
        self._held.used(entry.ctx.saved.values())

    def on_backward_done(self, entry, grad_ins) -> None:
        self._held.hold_gradients(entry, grad_ins)
        origin = self.events.origin(None, entry.name, entry.name, entry.op, entry.scope, "", "", "")
        self._record_op(origin, BACKWARD, entry.ctx.flops[1])

    def on_update(self, kind: str, name: str, flops: int, arrays=()) -> None:
        if self._held.untouched:
            self._held.touch_arrays(arrays)  # what the update read and wrote: the parameter, its gradient, its states
        self._record_op(self.events.origin(None, name, name, kind, "", "", name, ""), self._phase, flops)

    def on_use(self, arrays) -> None:
        if self._held.untouched:
            self._held.touch_arrays(arrays)

    def _record_op(self, origin: int, phase: int, flops: int, transient: int = 0) -> None:
        """One op ran (a forward, a backward or an update): a step, its FLOPs, a trace slice; then the capacity."""
        counts = self._counts
        t0, live_at_start, _ = self._starts.pop() if self._starts else (time.perf_counter(), counts.total, 0)
        self.step += 1
        self.flops_by_phase[PHASES[phase]] += flops
        self.events.append_op(self.seq, t0 - self._t0, flops)
        self._emit(OP, 0, NO_CATEGORY, origin, phase=phase)
        if self.trace_numpy and tracemalloc.is_tracing():
            self.traced.append((self.step, numpy_traced_bytes(), counts.total, transient))
        if ((self.placement is not None and self.placement.oom is not None)
                or (self._capacity is not None and counts.total > self._capacity)):
            raise out_of_memory(f"'{self.events.origins[origin].name}' ({self.current_phase})", self.placement,
                                self._capacity, counts, counts.total - live_at_start, self._held.buffers.values(),
                                self.events.origins)

    # ---- training iterations (window.py: what a bounded ledger keeps) ------------------------------
    def _next_iteration(self) -> None:
        """The forward of a new training iteration begins: summarize the last one, forget the oldest if bounded."""
        for old in self._window.close(self._counts, self.step, self.seq, self.flops_by_phase):
            end = self._window.forget(old, self.events, self.placement, self._held.lives, self._held.buffers.values())
            self.spans = [s for s in self.spans if s["seq"] > self.events.first]
            self.traced = [t for t in self.traced if t[0] > end]

    def iterations(self) -> list[Iteration]:
        """A summary of every training iteration so far, the one in progress last (events.Iteration): ops,
        events, FLOPs per phase, bytes per category at its end and its peaks (per category, "total" as peak_bytes(),
        "held" as peak_bytes(untouched=True)). An iteration begins with the first
        forward op after a backward or optimizer phase (forward, backward, optimizer step, zero_grad)."""
        return self._window.iterations(self._counts, self.step, self.seq, self.flops_by_phase)

    # ---- queries (queries.py) -----------------------------------------------------------------
    def live_bytes(self, category: str | None = None, untouched: bool = False) -> int:
        """Live bytes now, of one category or of all but "untouched" together (what the recorded code uses);
        untouched=True: of all of them (what the process holds, as tracemalloc sees it). What was alive when the
        ledger was entered (parameters, a graph's saves) is "untouched" until the recorded code uses it, so at
        entry live_bytes() counts none of it and live_bytes(untouched=True) all of it; once used, a buffer counts
        in its category, and from the ledger's first event (timeline(), the peaks)."""
        one_of("live_bytes", "category", category, CATEGORIES, none="every category but 'untouched'")
        check_whole("live_bytes", category, untouched)
        return self._counts.live_bytes(category, untouched)

    def peak_bytes(self, category: str | None = None, untouched: bool = False) -> int:
        """Highest live bytes seen (the whole run, also in a bounded ledger), of one category or of all but
        "untouched" together: the peak of what the recorded code used, so that another model still referenced
        does not make a run look worse. untouched=True: the peak of everything held, untouched bytes included
        (what tracemalloc would see at its highest; a capacity is checked against this)."""
        one_of("peak_bytes", "category", category, CATEGORIES, none="every category but 'untouched'")
        check_whole("peak_bytes", category, untouched)
        return self._counts.peak_bytes(category, untouched)

    def flops(self, phase: str | None = None) -> int:
        """FLOPs recorded: all phases, or one of "forward", "backward", "recompute", "optimizer"."""
        one_of("flops", "phase", phase, PHASES, none="all phases")
        return sum(self.flops_by_phase.values()) if phase is None else self.flops_by_phase[phase]

    def timeline(self) -> dict:
        """Equal-length NumPy arrays, one entry per event kept: seq, step, cumulative flops, phase, time, the
        live bytes of each category after the event, and their total, "untouched" included (what the process
        holds; total - untouched is what the run used, whose highest is peak_bytes()); exact in a bounded ledger
        too: counted from the bytes held before its first kept event. What was alive at entry is held from the first
        row (the entry scan's rows all show the state after it). With an allocator, "reserved": the bytes PyTorch's
        caching allocator would hold in segments after each event (>= what the buffers take)."""
        return queries.timeline(self.events, self._window.base_live, self._window.base_flops, self.placement)

    def backward_passes(self) -> list[tuple[int, int]]:
        """(first step, last step) of each run of backward/recompute ops."""
        return queries.backward_passes(self.events)

    def lifetimes(self) -> list[Lifetime]:
        """Every buffer the tape saved (kept ones, in a bounded ledger): created, first/last used by backward,
        released, idle fraction (in steps and in backward FLOPs)."""
        return queries.lifetimes(self.events, self._held.lives)

    def saved_breakdown(self, by: str = "layer", depth: int | None = None) -> dict:
        """Bytes saved for backward, each buffer counted once (under its first saver).

        by="layer": per layer (`layer_of`: "transformer.h.3", "transformer.ln_f", "cross_entropy");
        by="module": per module path ("transformer.h.3.mlp"; cut to `depth` dot-separated parts if
        given); by="op": per op kind; by="name": per saved array.
        """
        return queries.saved_breakdown(self.events.origins, self._held.lives, by, depth)

    def flops_by_layer(self, phase: str = "forward") -> dict:
        """FLOPs of the ops of one phase, per layer (events.Origin.layer)."""
        return queries.flops_by_layer(self.ops, phase)

    def summary(self) -> str:
        """A fixed-width table: current / peak / allocated / freed bytes per category, and FLOPs (the whole run,
        also in a bounded ledger).

        A buffer moving between categories (an output saved by the tape) leaves one and enters the
        other: it counts as freed there and allocated here. The total row is what the recorded code used
        (every category but "untouched", as live_bytes() and peak_bytes()); the row under it adds the untouched
        bytes and counts real memory only (what tracemalloc sees), and a line says how many were untouched.
        """
        reserved = reserved_line(self.placement, self.alloc_conf) if self.placement is not None else None
        footer = [f"events {self.seq}  ops {self.step}  steps {self.step}"]
        if self.keep_iterations is not None:
            footer.append(f"kept: the events of the last {self.keep_iterations} training iteration(s) of "
                          f"{len(self._window.log) + 1}, {len(self.events)} events")
        return queries.summary(self._counts, self.flops_by_phase, reserved, footer)

    # ---- exports (exports.py) ---------------------------------------------------------------------
    def to_chrome_trace(self, path=None) -> dict:
        """Chrome trace / Perfetto JSON: one slice ("X") per op and per phase run, nested as they ran (a
        checkpoint's slice wraps its segment's forward ops; a backward wraps each checkpoint's replay, which
        wraps the recomputed ops), and a counter track ("C") of the live bytes per category.
        Timestamps in microseconds since the ledger started."""
        return exports.chrome_trace(self, path)

    def to_csv(self, path) -> None:
        """Every event, one row each, under a header of the Event fields."""
        exports.write_csv(self, path)

    def to_memory_viz(self, path=None) -> dict:
        """PyTorch's memory snapshot of what this ledger recorded (memory_viz.py): open the pickle at
        pytorch.org/memory_viz. Written with pickle protocol 4 when `path` is given; returns the dict."""
        return exports.memory_viz(self, path)

    def to_html(self, path, compare=None, labels=None, title: str | None = None) -> str:
        """One self-contained interactive page (explorer.py): memory over op steps by category, lifetimes of
        the saved buffers, hover, highlight, search, pan and zoom; nothing fetched, opens from file://.

        compare: another Ledger, or a list of them, shown beside this one on one y axis (plain against
        checkpointed); labels: one per ledger (default "ledger 1", ...). Returns the path written.
        """
        return exports.html(path, self, compare, labels, title)

    def to_jsonl(self, path) -> None:
        """Every event as one JSON object per line."""
        exports.write_jsonl(self, path)



def _check_closing(call: str, name: str, open_name: str | None, what: str) -> None:
    """end_phase / end_span of `name` while `open_name` is the one begun last (None: none is open; "": any)."""
    if open_name is None:
        with_block = f", or use `with led.phase({name!r}):`" if what == "phase" else ""
        raise RuntimeError(f"{call}({name!r}): no {what} is open (begin_{what} was not called, or each one has "
                           f"ended already): call begin_{what}({name!r}) first{with_block}")
    if open_name and name != open_name:
        raise RuntimeError(f"{call}({name!r}): the {what} begun last is {open_name!r}; end that one first "
                           f"({what}s nest: end_{what} closes the one begun last)")


def numpy_traced_bytes() -> int:
    """Bytes of NumPy array data alive now, as tracemalloc sees them (NumPy reports to its own domain)."""
    snapshot = tracemalloc.take_snapshot()
    domain = np.lib.tracemalloc_domain
    return sum(t.size for t in snapshot.traces if t.domain == domain)
