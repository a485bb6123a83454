"""The memory ledger: one event for every allocation and release of a buffer the engine holds.

    with tg.Ledger() as led:
        loss = model(x, y)[1]; loss.backward(); opt.step()
    print(led.summary()); led.peak_bytes("activation"); led.timeline(); led.lifetimes()

What is counted is *buffers*, not tensors: views and tensors sharing memory resolve to the one
array that owns it (`backend.buffer`) and are counted once. A buffer is "allocated" the first
time the engine holds it, and "released" when its memory is really freed: a weak reference to the
owning array calls back then, never when the engine merely thinks it is done.

Each buffer has one category at a time, the strongest of the roles it plays:
parameter > optimizer > gradient > activation (saved by the tape) > other (live tensors).
A forward output starts as "other", becomes "activation" when an op saves it, and returns to
"other" if the tape lets it go while a tensor still holds it.

What the engine held before the ledger started is "untouched" until the recorded code reads it (an op's
input), writes it (an in-place change, an optimizer's update, a gradient added into .grad), saves it or
takes its gradient. Then it counts in its real category, and from the start (as if the ledger had known it
would be used: its first events are moved there), so a plain step's numbers are what they would be without
this rule. What the code never touches (another model still referenced, a layer that never ran, garbage
not yet collected) stays "untouched": drawn apart, and left out of `peak_bytes()` and `live_bytes()`, so
that comparing two runs compares what each used. Everything together (`untouched=True`, the timeline's
"total") is what the process holds, as tracemalloc sees it.

Every event says what it is about in fields (events.Origin): the op kind, its module path, its layer,
the role of the array (a save's key, "output", "grad", an optimizer state's key), the tensor it belongs
to, and the reason a checkpoint's policy kept it. `name` is for display only; no code parses it.

The ledger also counts FLOPs per phase ("forward", "backward", "recompute", "optimizer"), records
one op slice per op for the Chrome trace, and can enforce a capacity like a GPU that cannot grow.
Events are stored as columns (events.py, about 50 bytes an event); `Ledger(keep_iterations=N)` keeps
the events of the last N training iterations only, and a summary of each older one.
A ledger is an observer (observe.py): entering it adds it to the observers of the thread that
entered it, and it records what that thread's engine does; other threads are not observed.
The core never calls it by name, and nothing costs anything while no ledger is active.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import time
import tracemalloc
import weakref

import numpy as np

from .. import backend, state
from ..checks import number, one_of
from ..engine.observe import Observer
from ..engine.tape import edge_name, graph
from ..units import format_bytes, parse_bytes
from . import cuda_allocator, exports
from .events import (
    CATEGORIES,
    NO_CATEGORY,
    OP,
    PHASES,
    EventLog,
    Iteration,
    IterationLog,
    Lifetime,
    Lifetimes,
    Origin,
    layer_of,
)

EXISTING, ALLOCATED, SAVED, RECOMPUTED, RESTORED, UNSAVED, RELEASED, RETAGGED = range(8)
FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER = range(4)
PARAMETER, OPTIMIZER_STATE, GRADIENT, ACTIVATION, OTHER, UNTOUCHED = range(6)  # categories (roles strongest first)
_CATEGORY = {c: i for i, c in enumerate(CATEGORIES)}
_PHASE = {p: i for i, p in enumerate(PHASES)}


def current() -> Ledger | None:
    """The ledger active in this thread, or None."""
    return next((o for o in state.local.observers if isinstance(o, Ledger)), None)


class OutOfMemoryError(RuntimeError):
    """An allocation would exceed the ledger's capacity (like a GPU that cannot grow)."""


class _Buffer:
    """A buffer the engine holds: its id, size, category, the roles it plays (a bit per category) and how many
    live tape saves hold it; the origin of its first event, its row in the lifetimes (-1: never saved), the
    weak reference that reports its release, and while it is untouched the seqs of its events so far."""

    __slots__ = ("id", "nbytes", "category", "roles", "saves", "origin", "life", "ref", "existing")

    def __init__(self, id: int, nbytes: int, category: int, origin: int):
        self.id, self.nbytes, self.category, self.origin = id, nbytes, category, origin
        self.roles = 0 if category == ACTIVATION else 1 << category
        self.saves, self.life, self.ref, self.existing = 0, -1, None, None


class _Ref(weakref.ref):
    """A weak reference to a buffer's owning array that remembers the ledger's key for it."""

    __slots__ = ("key",)


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

    ALLOCATORS = ("pytorch-cuda",)

    def __init__(self, capacity_bytes: int | str | None = None, trace_numpy: bool = False,
                 keep_iterations: int | None = None, allocator: str | None = None, alloc_conf: str = ""):
        self.capacity_bytes = capacity_bytes  # validated by the property below
        if allocator is not None and allocator not in self.ALLOCATORS:
            raise ValueError(f"Ledger: allocator must be None or one of {self.ALLOCATORS} (PyTorch's CUDA caching "
                             f"allocator, simulated), got {allocator!r}")
        if not isinstance(alloc_conf, str):
            raise TypeError(f"Ledger: alloc_conf must be a string in PYTORCH_CUDA_ALLOC_CONF's syntax, such as "
                            f"'expandable_segments:True', got {alloc_conf!r}")
        if alloc_conf and allocator is None:
            raise ValueError(f"Ledger: alloc_conf={alloc_conf!r} configures an allocator: pass "
                             "allocator='pytorch-cuda' as well")
        self.allocator, self.alloc_conf = allocator, alloc_conf
        # where PyTorch's allocator would place each buffer (None: no allocator); settings checked here
        self.placement = cuda_allocator.Placement(alloc_conf or None, self._capacity) if allocator else None
        if not isinstance(trace_numpy, (bool, np.bool_)):
            raise TypeError(f"Ledger: trace_numpy must be True or False, got {trace_numpy!r}")
        if keep_iterations is not None:
            wanted = "None (keep every event) or a positive int (the training iterations whose events are kept)"
            if isinstance(keep_iterations, bool) or not isinstance(keep_iterations, numbers.Integral):
                raise TypeError(f"Ledger: keep_iterations must be {wanted}, got {keep_iterations!r}")
            if keep_iterations < 1:
                raise ValueError(f"Ledger: keep_iterations must be {wanted}, got {keep_iterations!r}")
            keep_iterations = int(keep_iterations)
        self.keep_iterations = keep_iterations
        self._entered = False
        self._observers = None  # while recording: the observer list of the thread that entered it
        self.trace_numpy = trace_numpy  # record tracemalloc's NumPy bytes at every op boundary
        self.events = EventLog()  # a sequence of Event records (built on access)
        self.ops = self.events.ops  # a sequence of op slices (dicts: name, op, scope, layer, phase, step, t0, t1, ...)
        self._lives = Lifetimes()  # one row per saved buffer
        self._live = [0] * len(CATEGORIES)
        self._peak = [0] * len(CATEGORIES)  # over the iterations before this one
        self._allocated = [0] * len(CATEGORIES)  # into each category (moves included)
        self._freed = [0] * len(CATEGORIES)
        self._total = self._peak_total = 0  # live bytes over all categories; their peak before this iteration
        self._peak_used = 0  # the peak before this iteration of the bytes the recorded code used (all but untouched)
        self._untouched = 0  # buffers untouched now (while there are none, reads are not looked up)
        self._real = [0, 0]  # bytes allocated, freed: real memory only (a move between categories is neither)
        self.flops_by_phase = dict.fromkeys(PHASES, 0)
        self.step = 0  # ops recorded
        self.seq = 0  # events recorded (led.events keeps the last ones in a bounded ledger)
        self._buffers: dict[int, _Buffer] = {}  # id(owner) -> record, for live buffers
        self._next_buffer = 0
        self._phases: list[tuple[int, float]] = []  # (phase, when it began); empty: forward
        self._phase = FORWARD
        self._span_stack: list[float] = []  # when each open span began
        self.spans: list[dict] = []  # one per phase run (a backward, a replay, an optimizer step) or named span (a
        # checkpointed segment's forward): name, phase, t0, t1, and the seq of the next event
        self._iterations = IterationLog()  # one summary per finished training iteration
        self._iteration = self._iteration_start()  # where the one in progress began
        self._it_peak, self._it_peak_total, self._it_peak_used = list(self._live), 0, 0  # its peaks
        self._phase_ended = False  # a backward or optimizer phase ended: the next forward op begins an iteration
        self._base_live = [0] * len(CATEGORIES)  # live bytes before the first event kept
        self._base_flops = 0  # FLOPs of the ops no longer kept
        self._t0 = time.perf_counter()
        self._starts: list[tuple] = []  # per op begun and not yet recorded: (time, live bytes, traced bytes)
        self.traced: list[tuple] = []  # (step, NumPy bytes per tracemalloc, ledger live bytes untouched included, op's
        # transient peak)

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
        if getattr(self, "placement", None) is not None:  # the simulated device's capacity too
            self.placement.allocator.capacity = value

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
        self._scan_existing()  # all of it untouched, until the recorded code uses it
        return self

    def __exit__(self, *exc) -> None:
        if self._observers is not None and self in self._observers:
            self._observers.remove(self)
        self._observers = None
        for buf in self._buffers.values():
            buf.ref = None  # no more release events

    def _scan_existing(self) -> None:
        """Count what the engine already holds when the ledger starts, from the weak registries in state.py: every
        live tensor's data and .grad, every optimizer's states, and the saves of the graphs those tensors (or a
        Tape someone holds) reach."""
        tensors = state.live_tensors()
        for t in tensors:
            name = t.name or "tensor"
            self._hold(t.data, PARAMETER if t.is_parameter else OTHER, name, "", "", EXISTING)
            if t.grad is not None:
                self._hold(t.grad, GRADIENT, name, "grad", "", EXISTING)
        for opt in state.live_optimizers():
            for p in opt.params:
                for k, a in opt.state.get(id(p), {}).items():
                    self._hold(a, OPTIMIZER_STATE, p.name or "param", k, opt.kind, EXISTING)
        entries = {e.seq: e for e in graph(tensors)}
        for tape in state.live_tapes():
            entries.update((e.seq, e) for e in tape.entries)
        for seq in sorted(entries):
            entry = entries[seq]
            if entry.ctx.saved:
                self._save(entry.name, entry.op, entry.scope, "", None, entry.ctx.saved, EXISTING)

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
        self._phase = _PHASE[name]
        self._phases.append((self._phase, time.perf_counter()))

    def end_phase(self, name: str) -> None:
        phase, t0 = self._phases.pop()
        self._phase = self._phases[-1][0] if self._phases else FORWARD
        self._phase_ended |= phase in (BACKWARD, OPTIMIZER)
        self.spans.append({"name": PHASES[phase], "phase": PHASES[phase], "t0": t0 - self._t0,
                           "t1": time.perf_counter() - self._t0, "seq": self.seq})

    def begin_span(self, label: str) -> None:
        self._span_stack.append(time.perf_counter())

    def end_span(self, label: str) -> None:
        t0 = self._span_stack.pop()
        self.spans.append({"name": label, "phase": self.current_phase, "t0": t0 - self._t0,
                           "t1": time.perf_counter() - self._t0, "seq": self.seq})

    @property
    def current_phase(self) -> str:
        return PHASES[self._phase]

    # ---- recording -----------------------------------------------------------------------
    def _origin(self, a, path: str, name: str, op: str, scope: str, role: str, tensor: str, kept: str) -> int:
        """The index of an event's origin (events.Origin), made once: `path` (an op's scoped name or a tensor's
        name) gives the layer; `a` the shape and dtype."""
        shape, dtype = (a.shape, a.dtype) if a is not None else ((), "")
        key = (name, op, scope, role, tensor, kept, shape, dtype)
        i = self.events.origin_index.get(key)
        if i is None:
            i = self.events.origin_index[key] = len(self.events.origins)
            self.events.origins.append(Origin(name, op, scope, layer_of(path), role, tensor, kept, tuple(shape),
                                              _dtype_name(dtype) if a is not None else ""))
        return i

    def _emit(self, action: int, nbytes: int, category: int, origin: int, buffer: int = -1, from_category: int = -1,
              phase: int | None = None) -> None:
        log = self.events
        log.time.append(time.perf_counter() - self._t0)
        log.nbytes.append(nbytes)
        log.live.append(self._total)
        log.buffer.append(buffer)
        log.code.append(origin << 16 | (from_category + 1) << 12 | category << 8
                        | (self._phase if phase is None else phase) << 4 | action)
        if self.placement is not None:
            self.placement.after_event.append(self.placement.allocator.reserved)
        self.seq += 1

    def _add(self, category: int, nbytes: int) -> None:
        live = self._live[category] = self._live[category] + nbytes
        if live > self._it_peak[category]:
            self._it_peak[category] = live
        self._total += nbytes
        if self._total > self._it_peak_total:
            self._it_peak_total = self._total
        if self._total - self._live[UNTOUCHED] > self._it_peak_used:
            self._it_peak_used = self._total - self._live[UNTOUCHED]

    def _move(self, buf: _Buffer, category: int) -> int:
        old = buf.category
        if old != category:
            self._live[old] -= buf.nbytes
            self._total -= buf.nbytes  # _add puts it back
            self._freed[old] += buf.nbytes
            self._allocated[category] += buf.nbytes
            buf.category = category
            self._add(category, buf.nbytes)
        return old

    @staticmethod
    def _category_of(buf: _Buffer) -> int:
        """The strongest role a buffer plays (the lowest category code among its roles)."""
        roles = buf.roles | (1 << ACTIVATION if buf.saves else 0)
        return (roles & -roles).bit_length() - 1 if roles else OTHER

    def _track(self, a, category: int, origin: int, action: int = ALLOCATED) -> _Buffer | None:
        """Note that the engine holds array `a` in `category`; a new buffer is an allocation."""
        be = backend.current()
        if not be.is_array(a):
            return None
        owner, nbytes = be.buffer(a)
        key = id(owner)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = _Buffer(self._next_buffer, int(nbytes), category, origin)
            self._next_buffer += 1
            buf.ref = _Ref(owner, self._on_free)
            buf.ref.key = key
            if action == EXISTING:  # held before the ledger started: untouched until the recorded code uses it
                category, buf.category, buf.existing = UNTOUCHED, UNTOUCHED, [self.seq]
                self._untouched += 1
            self._allocated[category] += buf.nbytes
            self._real[0] += buf.nbytes
            self._add(category, buf.nbytes)
            if self.placement is not None:
                self.placement.malloc(buf.id, buf.nbytes, self.seq)
            self._emit(action, buf.nbytes, category, origin, buf.id)
            return buf
        if buf.existing is not None:
            if action == EXISTING:  # the scan found another role of it
                buf.roles |= 0 if category == ACTIVATION else 1 << category
                return buf
            self._touch(buf)
        if category != ACTIVATION and not buf.roles >> category & 1:
            buf.roles |= 1 << category
            old = self._move(buf, self._category_of(buf))
            if old != buf.category:
                self._emit(RETAGGED, buf.nbytes, buf.category, origin, buf.id, old)
        return buf

    def _hold(self, a, category: int, tensor: str, role: str, op: str, action: int = ALLOCATED) -> None:
        """A tensor's buffer: its data (role ""), its gradient ("grad") or an optimizer state (role: the state's
        key, op: the optimizer), named "x", "x.grad", "x:adamw.m"."""
        if backend.current().is_array(a):
            name = f"{tensor}:{op}.{role}" if op else f"{tensor}.{role}" if role else tensor
            self._track(a, category, self._origin(a, tensor, name, op, "", role, tensor, ""), action)

    def _touch(self, buf: _Buffer) -> None:
        """The recorded code uses, for the first time, a buffer held before the ledger started: it leaves "untouched"
        for the strongest of its roles, there from the start (its events, the peaks, the bounded ledger's iteration
        rows and bytes before its first kept event are moved: it was held all along, so each moves by its size)."""
        seqs, buf.existing = buf.existing, None
        self._untouched -= 1
        c, n = self._category_of(buf), buf.nbytes
        buf.category = c
        finished = len(self._iterations) > 0
        for counts in (self._live, self._it_peak, self._allocated, *((self._peak,) if finished else ())):
            counts[UNTOUCHED] -= n
            counts[c] += n
        self._it_peak_used += n
        if finished:
            self._peak_used += n
            self._iterations.retag(UNTOUCHED, c, n)
        log = self.events
        if seqs[0] < log.first:  # its first events were dropped (a bounded ledger)
            self._base_live[UNTOUCHED] -= n
            self._base_live[c] += n
        for seq in seqs:
            log.retag(seq, c)
        if c == ACTIVATION and buf.life < 0:  # saved by a graph that existed: a lifetime from the start
            saves = [log.code[q - log.first] for q in seqs if q >= log.first and log.code[q - log.first] >> 12 & 15]
            buf.life = self._lives.add(buf.id, n, saves[0] >> 16 if saves else buf.origin, 0)

    def _touch_arrays(self, arrays) -> None:
        """The recorded code reads or writes these arrays: touch those still untouched."""
        be = backend.current()
        for a in arrays:
            if be.is_array(a):
                buf = self._buffers.get(id(be.buffer(a)[0]))
                if buf is not None and buf.existing is not None:
                    self._touch(buf)

    def _on_free(self, ref: _Ref) -> None:
        """The buffer's owning array is being freed (its weak reference calls back)."""
        buf = self._buffers.pop(ref.key, None)
        if buf is None:
            return
        if buf.existing is not None:
            self._untouched -= 1
        self._live[buf.category] -= buf.nbytes
        self._total -= buf.nbytes
        self._freed[buf.category] += buf.nbytes
        self._real[1] += buf.nbytes
        if self.placement is not None:
            self.placement.free(buf.id, self.seq)
        self._emit(RELEASED, buf.nbytes, buf.category, buf.origin, buf.id)
        if buf.life >= 0:
            self._lives.released[buf.life] = self.step

    def _saved_origin(self, a, key: str, name: str, op: str, scope: str, kept: str, role_of) -> int:
        """The origin of array `key` kept for backward by op `name` (see _holder), named "op:key", or
        "op[kept: why]:key" for what a policy kept."""
        label = f"{name}[kept: {kept}]:{key}" if kept else f"{name}:{key}"
        return self._origin(a, name, label, op, scope, role_of(key) if role_of else key, "", kept)

    def _save(self, name: str, op: str, scope: str, kept: str, role_of, saved: dict, action: int = SAVED) -> None:
        """Op `name` (a tape entry, or what a policy kept: see _holder) holds these arrays for backward from now."""
        if action == SAVED and self._phase == RECOMPUTE:
            action = RECOMPUTED
        for key, a in saved.items():
            if not backend.current().is_array(a):
                continue
            origin = self._saved_origin(a, key, name, op, scope, kept, role_of)
            buf = self._track(a, ACTIVATION, origin, EXISTING if action == EXISTING else ALLOCATED)
            buf.saves += 1
            if buf.existing is not None:  # a save the scan found, of a buffer not touched yet: it stays untouched
                buf.existing.append(self.seq)
                self._emit(action, buf.nbytes, UNTOUCHED, origin, buf.id, UNTOUCHED)
                continue
            old = self._move(buf, self._category_of(buf))
            self._emit(action, buf.nbytes, buf.category, origin, buf.id, old)
            if buf.life < 0 and buf.category == ACTIVATION:
                buf.life = self._lives.add(buf.id, buf.nbytes, origin, self.step)

    def on_save(self, holder, saved: dict) -> None:
        """`holder` (a tape entry, or what a checkpoint's policy kept) now holds these arrays for backward."""
        self._save(*_holder(holder), saved)

    def on_release(self, holder, saved: dict) -> None:
        """The tape let go of these arrays (the entry's backward ran, or the tape was dropped)."""
        fields = _holder(holder)
        be = backend.current()
        for key, a in saved.items():
            if not be.is_array(a):
                continue
            buf = self._buffers.get(id(be.buffer(a)[0]))
            if buf is None:
                continue
            buf.saves -= 1
            if buf.existing is not None:  # a graph that existed, dropped unused
                buf.existing.append(self.seq)
                self._emit(UNSAVED, buf.nbytes, UNTOUCHED, self._saved_origin(a, key, *fields), buf.id, UNTOUCHED)
                continue
            old = self._move(buf, self._category_of(buf))
            self._emit(UNSAVED, buf.nbytes, buf.category, self._saved_origin(a, key, *fields), buf.id, old)

    # ---- the observer callbacks (observe.py) ------------------------------------------------------
    def on_alloc(self, array, category: str, tensor: str, role: str = "", op: str = "") -> None:
        self._hold(array, _CATEGORY[category], tensor, role, op)

    def on_op_start(self, call) -> None:
        """An op begins (a checkpoint's begins before the ops of its segment, so its slice wraps theirs)."""
        if self._phase_ended and not self._phases and call is not None:
            self._next_iteration()
        traced = 0
        if self.trace_numpy and tracemalloc.is_tracing():
            tracemalloc.reset_peak()
            traced = tracemalloc.get_traced_memory()[0]
        self._starts.append((time.perf_counter(), self._total, traced))

    def on_op(self, call, outputs) -> None:
        """After an op's forward: count its FLOPs, its outputs and what it saved; enforce capacity."""
        kind, name, scope, ctx = call.fn.kind(), call.name, call.scope, call.ctx
        transient = 0  # what the op allocated and freed again inside, per tracemalloc
        if self.trace_numpy and tracemalloc.is_tracing():
            transient = tracemalloc.get_traced_memory()[1] - self._starts[-1][2]
        if self._untouched:
            self._touch_arrays(call.arrays)  # it read its inputs (an op refused before it ran touches nothing)
        be = backend.current()
        for out in outputs if isinstance(outputs, tuple) else (outputs,):
            a = getattr(out, "data", out)
            if be.is_array(a):
                self._track(a, OTHER, self._origin(a, name, name, kind, scope, "output", "", ""))
        if call.entry is not None:
            self._save(name, kind, scope, "", None, ctx.saved,
                       RESTORED if getattr(call.given_by, "restores", False) else SAVED)
        self._record_op(self._origin(None, name, name, kind, scope, "", "", ""), self._phase, ctx.flops[0], transient)

    def on_backward(self, entry) -> None:
        self._starts.append((time.perf_counter(), self._total, 0))
        be = backend.current()
        for a in entry.ctx.saved.values():
            if be.is_array(a):
                buf = self._buffers.get(id(be.buffer(a)[0]))
                if buf is not None and buf.existing is not None:
                    self._touch(buf)  # a graph that existed before the ledger: its backward reads it
                if buf is not None and buf.life >= 0:
                    self._lives.used(buf.life, self.step)

    def on_backward_done(self, entry, grad_ins) -> None:
        for i, (edge, g) in enumerate(zip(entry.inputs, grad_ins)):
            if g is None:
                continue
            if edge is not None:  # named after the tensor it is the gradient of
                self._hold(g, GRADIENT, edge_name(edge), "grad", "")
            else:  # an input that needs no gradient got one all the same
                self._hold(g, GRADIENT, entry.name, f"grad{i}", "")
        origin = self._origin(None, entry.name, entry.name, entry.op, entry.scope, "", "", "")
        self._record_op(origin, BACKWARD, entry.ctx.flops[1])

    def on_update(self, kind: str, name: str, flops: int, arrays=()) -> None:
        if self._untouched:
            self._touch_arrays(arrays)  # what the update read and wrote: the parameter, its gradient, its states
        self._record_op(self._origin(None, name, name, kind, "", "", name, ""), self._phase, flops)

    def on_use(self, arrays) -> None:
        if self._untouched:
            self._touch_arrays(arrays)

    def _record_op(self, origin: int, phase: int, flops: int, transient: int = 0) -> None:
        """One op ran (a forward, a backward or an update): a step, its FLOPs, a trace slice; then the capacity."""
        t0, live_at_start, _ = self._starts.pop() if self._starts else (time.perf_counter(), self._total, 0)
        self.step += 1
        self.flops_by_phase[PHASES[phase]] += flops
        log = self.events
        log.op_seq.append(self.seq)
        log.op_t0.append(t0 - self._t0)
        log.op_flops.append(flops)
        self._emit(OP, 0, NO_CATEGORY, origin, phase=phase)
        if self.trace_numpy and tracemalloc.is_tracing():
            self.traced.append((self.step, numpy_traced_bytes(), self._total, transient))
        self._check_capacity(origin, self._total - live_at_start)

    def _check_capacity(self, origin: int, request: int) -> None:
        if self.placement is not None and self.placement.oom is not None:
            error, self.placement.oom = self.placement.oom, None
            raise OutOfMemoryError(
                f"out of memory in '{self.events.origins[origin].name}' ({self.current_phase}): PyTorch's caching "
                f"allocator (simulated) could not get a segment: {error} Try activation checkpointing, a smaller "
                "batch or sequence, alloc_conf='expandable_segments:True', or a larger capacity.")
        total = self._total
        if self.capacity_bytes is None or total <= self.capacity_bytes:
            return
        names = self.events.origins
        holders = sorted(self._buffers.values(), key=lambda b: -b.nbytes)[:5]
        by_cat = ", ".join(f"{c} {format_bytes(self._live[i], digits=2)}" for i, c in enumerate(CATEGORIES)
                           if self._live[i])
        biggest = "; ".join(f"{names[b.origin].name} ({CATEGORIES[b.category]}, {format_bytes(b.nbytes, digits=2)})"
                            for b in holders)
        would, added, capacity = (format_bytes(n, digits=2) for n in (total, request, self.capacity_bytes))
        raise OutOfMemoryError(
            f"out of memory in '{names[origin].name}' ({self.current_phase}): the engine would hold {would} "
            f"(this op added {added}) but the capacity is {capacity}. "
            f"Live by category: {by_cat}. Largest holders: {biggest}. "
            "Try activation checkpointing (tg.checkpoint / GPT(checkpoint='sqrt')), a smaller batch or "
            "sequence, or a larger capacity."
        )

    # ---- training iterations (what a bounded ledger keeps) ------------------------------------
    def _iteration_start(self) -> tuple:
        """Where an iteration begins: (op step, event seq, FLOPs per phase so far)."""
        return self.step, self.seq, list(self.flops_by_phase.values())

    def _iteration_row(self) -> list:
        """The iteration in progress as a row of IterationLog."""
        step, seq, flops = self._iteration
        return [step, self.step - step, self.seq - seq, *(now - then for now, then in zip(self.flops_by_phase.values(),
                                                                                            flops)),
                *self._live, *self._it_peak, self._it_peak_used, self._it_peak_total]

    def _next_iteration(self) -> None:
        """The forward of a new training iteration begins: summarize the last one, drop the oldest if bounded."""
        self._phase_ended = False
        self._iterations.append(self._iteration_row())
        self._peak = [max(a, b) for a, b in zip(self._peak, self._it_peak)]
        self._peak_total = max(self._peak_total, self._it_peak_total)
        self._peak_used = max(self._peak_used, self._it_peak_used)
        self._iteration = self._iteration_start()
        self._it_peak, self._it_peak_total = list(self._live), self._total
        self._it_peak_used = self._total - self._live[UNTOUCHED]
        if self.keep_iterations is not None:
            while len(self._iterations) + 1 - self._iterations.first_kept > self.keep_iterations:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        """Forget the events, op slices, lifetimes, spans and NumPy traces of the oldest iteration still kept."""
        old = self._iterations[self._iterations.first_kept]
        self._iterations.first_kept += 1
        self.events.drop(old.events, old.ops)
        if self.placement is not None:
            self.placement.drop(old.events, self.events.first)
        self._base_live = list(old.live.values())
        self._base_flops += sum(old.flops.values())
        end = old.first_step + old.ops  # the next iteration's first op is step end + 1; its saves are made at end
        lives = self._lives
        gone = (np.array(lives.created, dtype=np.int64) < end) & (np.array(lives.released, dtype=np.int64) >= 0)
        if gone.any():
            rows = lives.keep(~gone)
            for buf in self._buffers.values():
                if buf.life >= 0:
                    buf.life = int(rows[buf.life])
        self.spans = [s for s in self.spans if s["seq"] > self.events.first]
        self.traced = [t for t in self.traced if t[0] > end]

    def iterations(self) -> list[Iteration]:
        """A summary of every training iteration so far, the one in progress last (events.Iteration): ops,
        events, FLOPs per phase, bytes per category at its end and its peaks (per category, "total" as peak_bytes(),
        "held" as peak_bytes(untouched=True)). An iteration begins with the first
        forward op after a backward or optimizer phase (forward, backward, optimizer step, zero_grad)."""
        return [*self._iterations, self._iterations.record(len(self._iterations), self._iteration_row())]

    # ---- queries ---------------------------------------------------------------------------
    def live_bytes(self, category: str | None = None, untouched: bool = False) -> int:
        """Live bytes now, of one category or of all but "untouched" together (what the recorded code uses);
        untouched=True: of all of them (what the process holds, as tracemalloc sees it)."""
        one_of("live_bytes", "category", category, CATEGORIES, none="every category but 'untouched'")
        _whole("live_bytes", category, untouched)
        if category is not None:
            return self._live[_CATEGORY[category]]
        return self._total if untouched else self._total - self._live[UNTOUCHED]

    def peak_bytes(self, category: str | None = None, untouched: bool = False) -> int:
        """Highest live bytes seen (the whole run, also in a bounded ledger), of one category or of all but
        "untouched" together: the peak of what the recorded code used, so that another model still referenced
        does not make a run look worse. untouched=True: the peak of everything held, untouched bytes included
        (what tracemalloc would see at its highest; a capacity is checked against this)."""
        one_of("peak_bytes", "category", category, CATEGORIES, none="every category but 'untouched'")
        _whole("peak_bytes", category, untouched)
        if category is not None:
            c = _CATEGORY[category]
            return max(self._peak[c], self._it_peak[c])
        if untouched:
            return max(self._peak_total, self._it_peak_total)
        return max(self._peak_used, self._it_peak_used)

    def flops(self, phase: str | None = None) -> int:
        """FLOPs recorded: all phases, or one of "forward", "backward", "recompute", "optimizer"."""
        one_of("flops", "phase", phase, PHASES, none="all phases")
        return sum(self.flops_by_phase.values()) if phase is None else self.flops_by_phase[phase]

    def timeline(self) -> dict:
        """Equal-length NumPy arrays, one entry per event kept: seq, step, cumulative flops, phase, time, the
        live bytes of each category after the event, and their total, "untouched" included (what the process
        holds; total - untouched is what the run used, whose highest is peak_bytes()); exact in a bounded ledger
        too: counted from the bytes held before its first kept event. With an allocator, "reserved": the bytes
        PyTorch's caching allocator would hold in segments after each event (>= what the buffers take)."""
        col = self.events.columns()
        action, cat, src, nbytes = col["action"], col["category"], col["from_category"], col["nbytes"]
        allocates = ((action == EXISTING) | (action == ALLOCATED)) & (src < 0)
        released = (action == RELEASED) & ~allocates
        moves = ~allocates & ~released & (src >= 0) & (src != cat)
        out = {"seq": col["seq"], "step": col["step"]}
        flops = np.zeros(len(action), dtype=np.int64)
        flops[np.array(self.events.op_seq, dtype=np.int64) - self.events.first] = np.array(self.events.op_flops)
        out["flops"] = self._base_flops + np.cumsum(flops)
        total = np.zeros(len(action), dtype=np.int64)
        for c, name in enumerate(CATEGORIES):
            into, out_of = (allocates | moves) & (cat == c), (released & (cat == c)) | (moves & (src == c))
            out[name] = self._base_live[c] + np.cumsum(np.where(into, nbytes, 0) - np.where(out_of, nbytes, 0))
            total += out[name]
        out["total"] = total
        out["phase"] = np.array(PHASES, dtype=object)[col["phase"]]
        out["time"] = col["time"]
        if self.placement is not None:  # what PyTorch's allocator would have reserved (Ledger(allocator=...))
            out["reserved"] = np.array(self.placement.after_event, dtype=np.int64)
        return out

    def _op_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(step, phase code, FLOPs) of every op slice kept."""
        log = self.events
        codes = np.array(log.code, dtype=np.int64)[np.array(log.op_seq, dtype=np.int64) - log.first]
        steps = np.arange(log.first_op + 1, log.first_op + 1 + len(codes), dtype=np.int64)
        return steps, codes >> 4 & 15, np.array(log.op_flops, dtype=np.int64)

    def backward_passes(self) -> list[tuple[int, int]]:
        """(first step, last step) of each run of backward/recompute ops."""
        steps, phases, _ = self._op_columns()
        runs, start, last = [], None, None
        for step, phase in zip(steps.tolist(), phases.tolist()):
            if phase in (BACKWARD, RECOMPUTE):
                if start is None:
                    start = step
                last = step
            elif start is not None:
                runs.append((start, last))
                start = None
        if start is not None:
            runs.append((start, last))
        return runs

    def lifetimes(self) -> list[Lifetime]:
        """Every buffer the tape saved (kept ones, in a bounded ledger): created, first/last used by backward,
        released, idle fraction (in steps and in backward FLOPs)."""
        runs = self.backward_passes()
        steps, phases, op_flops = self._op_columns()
        backward = phases == BACKWARD
        bw_steps = steps[backward]
        bw_flops = np.concatenate([[0], np.cumsum(op_flops[backward])])  # bw_flops[k]: FLOPs of the first k

        def flops_until(step):  # backward FLOPs of the steps <= step
            return int(bw_flops[np.searchsorted(bw_steps, step, side="right")])

        out = []
        for row in range(len(self._lives)):
            life = self._lives.record(row, self.events.origins)
            out.append(life)
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
        return out

    def saved_breakdown(self, by: str = "layer", depth: int | None = None) -> dict:
        """Bytes saved for backward, each buffer counted once (under its first saver).

        by="layer": per layer (`layer_of`: "transformer.h.3", "transformer.ln_f", "cross_entropy");
        by="module": per module path ("transformer.h.3.mlp"; cut to `depth` dot-separated parts if
        given); by="op": per op kind; by="name": per saved array.
        """
        one_of("saved_breakdown", "by", by, ("layer", "module", "op", "name"))
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 1):
            kind = ValueError if isinstance(depth, numbers.Integral) and not isinstance(depth, bool) else TypeError
            raise kind(f"saved_breakdown: depth must be None or a positive int (dot-separated parts of the module "
                       f"name to keep), got {depth!r}")
        out: dict[str, int] = {}
        origins = self.events.origins
        for origin, nbytes in zip(self._lives.origin, self._lives.nbytes):
            o = origins[origin]
            if by == "module":
                parts = o.scope.split(".") if o.scope else ["(top)"]
                key = ".".join(parts[:depth] if depth else parts)
            else:
                key = {"name": o.name, "layer": o.layer, "op": o.op}[by]
            out[key] = out.get(key, 0) + nbytes
        return out

    def flops_by_layer(self, phase: str = "forward") -> dict:
        """FLOPs of the ops of one phase, per layer (events.Origin.layer)."""
        one_of("flops_by_layer", "phase", phase, PHASES)
        out: dict[str, int] = {}
        for op in self.ops:
            if op["phase"] == phase:
                out[op["layer"]] = out.get(op["layer"], 0) + op["flops"]
        return out

    def summary(self) -> str:
        """A fixed-width table: current / peak / allocated / freed bytes per category, and FLOPs (the whole run,
        also in a bounded ledger).

        A buffer moving between categories (an output saved by the tape) leaves one and enters the
        other: it counts as freed there and allocated here. The total row is what the recorded code used
        (every category but "untouched", as live_bytes() and peak_bytes()); the row under it adds the untouched
        bytes and counts real memory only (what tracemalloc sees), and a line says how many were untouched.
        """
        rows = [f"{'category':<16}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"]
        rows.append("-" * len(rows[0]))

        def row(label, *values):
            return f"{label:<16}" + "".join(f"{format_bytes(v, digits=2):>14}" for v in values)

        for i, c in enumerate(CATEGORIES):
            rows.append(row(c, self._live[i], self.peak_bytes(c), self._allocated[i], self._freed[i]))
        rows.append("-" * len(rows[0]))
        rows.append(row("total", self.live_bytes(), self.peak_bytes()))
        rows.append(row("with untouched", self.live_bytes(untouched=True), self.peak_bytes(untouched=True),
                        *self._real))
        rows.append("")
        rows.append(self._untouched_line())
        if self.placement is not None:
            rows.append(self._reserved_line())
        rows.append("FLOPs  " + "  ".join(f"{p} {self.flops_by_phase[p]:.3e}" for p in PHASES))
        rows.append(f"events {self.seq}  ops {self.step}  steps {self.step}")
        if self.keep_iterations is not None:
            rows.append(f"kept: the events of the last {self.keep_iterations} training iteration(s) of "
                        f"{len(self._iterations) + 1}, {len(self.events)} events")
        return "\n".join(rows)

    def _reserved_line(self) -> str:
        alloc = self.placement.allocator
        conf = f", {self.alloc_conf}" if self.alloc_conf else ""
        return (f"reserved (PyTorch's CUDA caching allocator, simulated{conf}): current "
                f"{format_bytes(alloc.reserved, digits=2)}, peak {format_bytes(alloc.peak_reserved, digits=2)}; "
                f"in blocks {format_bytes(alloc.allocated, digits=2)}, peak "
                f"{format_bytes(alloc.peak_allocated, digits=2)}; {len(alloc.snapshot())} segment(s)")

    def _untouched_line(self) -> str:
        """One line on the bytes held before the ledger started that the recorded code never used."""
        held = self._allocated[UNTOUCHED]
        if not held:
            return "untouched: none (every buffer held before the ledger started was used by what it recorded)"
        return (f"untouched: {format_bytes(held, digits=2)} held before the ledger started was never read or "
                f"written by what it recorded ({format_bytes(self._live[UNTOUCHED], digits=2)} still held), left "
                "out of the total and its peak")

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
        exports.check_path("to_html", path)  # every argument is checked before the file is opened
        others = [] if compare is None else list(compare) if isinstance(compare, (list, tuple)) else [compare]
        for i, other in enumerate(others):
            if not isinstance(other, Ledger):
                raise TypeError(f"to_html: compare must be a Ledger or a list of Ledgers, got {type(other).__name__}"
                                + (f" at position {i}" if isinstance(compare, (list, tuple)) else ""))
        return exports.html(path, [self, *others], labels, title)

    def to_jsonl(self, path) -> None:
        """Every event as one JSON object per line."""
        exports.write_jsonl(self, path)


def _whole(method: str, category, untouched) -> None:
    if not isinstance(untouched, (bool, np.bool_)):
        raise TypeError(f"{method}: untouched must be True or False, got {untouched!r}")
    if untouched and category is not None:
        raise ValueError(f"{method}: untouched=True adds the untouched bytes to the total of every category; give "
                         f"it without a category (or ask for {method}('untouched'))")


def _holder(holder) -> tuple:
    """(name, op, scope, kept, role_of) of what holds saves: a tape entry, whose keys are the roles (kept "",
    role_of None), or what a checkpoint's policy kept (a policies.KeptOp: kept is its reason, role_of its role())."""
    reason = getattr(holder, "reason", None)
    if reason is None:
        return holder.name, holder.op, holder.scope, "", None
    return holder.name, holder.op, holder.scope, reason or "kept by the policy", holder.role


@functools.cache
def _dtype_name(dtype) -> str:
    return str(dtype)


def numpy_traced_bytes() -> int:
    """Bytes of NumPy array data alive now, as tracemalloc sees them (NumPy reports to its own domain)."""
    snapshot = tracemalloc.take_snapshot()
    domain = np.lib.tracemalloc_domain
    return sum(t.size for t in snapshot.traces if t.domain == domain)
