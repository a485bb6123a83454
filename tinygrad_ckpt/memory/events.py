"""The ledger's records, stored compactly: its events, its op slices and its saved buffers' lifetimes.

A ledger records hundreds of events per training step, so it keeps them as columns of machine numbers
(`array.array`: 40 bytes an event) instead of one Python object each (about 400 bytes). What an event is
about, its *origin* (display name, op kind, module path, layer, role, tensor, policy reason, shape, dtype),
repeats every step: origins are interned in a table and an event holds one index into it.

`EventLog` is a read-only sequence: `log[i]`, `log[a:b]`, `for e in log` and `len(log)` build `Event`
records on access, so code reads `e.nbytes`, `e.op`, `e.role` as from a list. `log.ops` does the same
for the op slices (dicts, as `led.ops` always gave), and `Lifetimes` for the saved buffers.

Imports nothing of the package: the ledger fills these tables, the exporters and plots read them.
"""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# the roles a buffer plays, strongest first; then "untouched": alive before the ledger started and never read, written,
# saved or given a gradient by what it recorded (another model, an unused layer), drawn apart and left out of its peaks
CATEGORIES = ("parameter", "optimizer", "gradient", "activation", "other", "untouched")
PHASES = ("forward", "backward", "recompute", "optimizer")
ACTIONS = ("existing", "allocated", "saved", "recomputed", "restored", "unsaved", "released", "retagged", "op")
OP = ACTIONS.index("op")
EXISTING, ALLOCATED, SAVED, RECOMPUTED, RESTORED, UNSAVED, RELEASED, RETAGGED = range(8)  # ACTIONS' codes
FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER = range(4)  # PHASES' codes
PARAMETER, OPTIMIZER_STATE, GRADIENT, ACTIVATION, OTHER, UNTOUCHED = range(6)  # CATEGORIES' codes, strongest first
NO_CATEGORY = len(CATEGORIES)  # an op marker belongs to no category
_CATEGORY_OR_NONE = (*CATEGORIES, "")
_FROM = ("", *CATEGORIES)  # from_category code 0: no move


class Origin(NamedTuple):
    """What an event is about; one per distinct origin, shared by the events of every step."""

    name: str  # display only: "transformer.h.0.ln_1.layer_norm:rstd"; read the fields below, never parse it
    op: str  # op kind ("layer_norm"), or the optimizer ("adamw") for its states and updates; "" for a tensor
    scope: str  # module path the op ran in ("transformer.h.0.ln_1"; "" at the top or for a tensor)
    layer: str  # layer_of(the op's scoped name or the tensor's): "transformer.h.0", "cross_entropy", "x"
    role: str  # a save's key ("rstd", "input0"), "output", "grad", an optimizer state's key ("m"), "" (a tensor)
    tensor: str  # the tensor a buffer belongs to (parameter, input, gradient, optimizer state); else ""
    kept: str  # why a checkpoint's policy kept this op's arrays; "" when no policy did
    shape: tuple
    dtype: str


def layer_of(path: str) -> str:
    """The layer of an op's scoped name or a tensor's name (a dotted path): the path up to its first index,
    else the path less its last part (the op or the attribute), else the path itself.

    'transformer.h.3.mlp.gelu' -> 'transformer.h.3', 'transformer.h.0-3.checkpoint' -> 'transformer.h.0-3',
    'transformer.ln_f.layer_norm' -> 'transformer.ln_f', 'transformer.wte.weight' -> 'transformer.wte', and
    an op outside any module names itself: 'cross_entropy' -> 'cross_entropy'. The ledger calls it once per
    event origin (events.Origin.layer); everything else reads that field.
    """
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part[:1].isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or parts[0]


def within(scope: str, module: str) -> bool:
    """Is module path `scope` the module `module` or inside it ("" contains every path)?"""
    return not module or scope == module or scope.startswith(module + ".")


@dataclass(slots=True)
class Event:
    """One ledger event. The first fields are the ledger's contract (seq, step, phase, action, nbytes,
    category, name, ...); op, scope, layer, role, tensor and kept say what it is about (see Origin)."""

    seq: int  # its place among all events of the run (stable, also when older events were dropped)
    step: int  # ops recorded before it, this one included for an "op" event
    phase: str
    action: str  # existing | allocated | saved | recomputed | restored | unsaved | released | retagged | op
    nbytes: int
    category: str  # "" for an op marker
    name: str  # display name (Origin.name)
    shape: tuple = ()
    dtype: str = ""
    buffer: int = -1  # ledger-wide buffer id (stable, never reused); -1 for an op marker
    live: int = 0  # total live bytes after this event
    from_category: str = ""  # for a move between categories (saved / unsaved / retagged, an existing save)
    flops: int = 0  # FLOPs of this op (action "op")
    time: float = 0.0  # seconds since the ledger started
    op: str = ""
    scope: str = ""
    layer: str = ""
    role: str = ""
    tensor: str = ""
    kept: str = ""

    @property
    def allocates(self) -> bool:
        """A buffer's first event: its memory counts from here (a tape that existed when the ledger started
        also has "existing" save events, which move a buffer between categories like "saved")."""
        return self.action in ("existing", "allocated") and not self.from_category


def code(action: int, phase: int, category: int, from_category: int, origin: int) -> int:
    """An event's small fields packed into one int: origin index, from-category, category, phase, action."""
    return origin << 16 | from_category << 12 | category << 8 | phase << 4 | action


@functools.cache
def _dtype_name(dtype) -> str:
    return str(dtype)


class EventLog(Sequence):
    """The events, as columns (time, nbytes, live, buffer, packed codes), and the op slices (`ops`).

    `first` is the seq of the first event still kept (a bounded ledger drops older ones, `drop`), so
    `log[0].seq == log.first`; an event's step is the number of "op" events up to it."""

    def __init__(self):
        self.origins: list[Origin] = []
        self.origin_index: dict = {}  # the ledger's key for an origin -> its index in `origins`
        self.time, self.nbytes, self.live, self.buffer, self.code = (array("d"), array("q"), array("q"),
                                                                     array("q"), array("q"))
        self.op_seq, self.op_t0, self.op_flops = array("q"), array("d"), array("q")  # per op slice
        self.first = 0  # seq of log[0]
        self.first_op = 0  # ops dropped before ops[0]
        self.ops = Ops(self)

    def __len__(self) -> int:
        return len(self.code)

    def append(self, time: float, nbytes: int, live: int, buffer: int, code: int) -> None:
        """One more event: when (seconds since the ledger started), its bytes, the bytes live after it, its buffer
        (-1: none) and its packed fields (events.code)."""
        self.time.append(time)
        self.nbytes.append(nbytes)
        self.live.append(live)
        self.buffer.append(buffer)
        self.code.append(code)

    def append_op(self, seq: int, t0: float, flops: int) -> None:
        """One more op slice: the seq of its "op" event, when it began, its FLOPs."""
        self.op_seq.append(seq)
        self.op_t0.append(t0)
        self.op_flops.append(flops)

    @property
    def next_seq(self) -> int:
        """The seq the next event will have (events recorded so far, dropped ones included)."""
        return self.first + len(self.code)

    @property
    def steps(self) -> int:
        """Op slices recorded so far, dropped ones included."""
        return self.first_op + len(self.op_seq)

    def origin(self, a, path: str, name: str, op: str, scope: str, role: str, tensor: str, kept: str) -> int:
        """The index of an event's origin (Origin), made once: `path` (an op's scoped name or a tensor's name)
        gives the layer; array `a` (or None) the shape and dtype."""
        shape, dtype = (a.shape, a.dtype) if a is not None else ((), "")
        key = (name, op, scope, role, tensor, kept, shape, dtype)
        i = self.origin_index.get(key)
        if i is None:
            i = self.origin_index[key] = len(self.origins)
            self.origins.append(Origin(name, op, scope, layer_of(path), role, tensor, kept, tuple(shape),
                                       _dtype_name(dtype) if a is not None else ""))
        return i

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._event(k, self._op_at(k)) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError("event index out of range")
        return self._event(i, self._op_at(i))

    def __iter__(self):
        op, n_ops, op_seq = 0, len(self.op_seq), self.op_seq
        for i in range(len(self.code)):
            while op < n_ops and op_seq[op] <= self.first + i:
                op += 1
            yield self._event(i, op - 1)

    def _op_at(self, i: int) -> int:
        """Index (in op_seq) of the last op at or before event i; -1 if none is kept."""
        return bisect_right(self.op_seq, self.first + i) - 1

    def _event(self, i: int, op: int) -> Event:
        c = self.code[i]
        o = self.origins[c >> 16]
        action = c & 15
        flops = self.op_flops[op] if action == OP else 0
        return Event(self.first + i, self.first_op + op + 1, PHASES[c >> 4 & 15], ACTIONS[action], self.nbytes[i],
                     _CATEGORY_OR_NONE[c >> 8 & 15], o.name, o.shape, o.dtype, self.buffer[i], self.live[i],
                     _FROM[c >> 12 & 15], flops, self.time[i], o.op, o.scope, o.layer, o.role, o.tensor, o.kept)

    def columns(self) -> dict:
        """NumPy copies of the columns, decoded: seq, step, action, phase, category, from_category (codes:
        indices into ACTIONS, PHASES, CATEGORIES; from_category -1 for none, category -1 for an op), nbytes,
        live, buffer, time, origin (index into `origins`)."""
        packed = np.array(self.code, dtype=np.int64)
        seq = np.arange(self.first, self.first + len(packed), dtype=np.int64)
        return {
            "seq": seq,
            "step": np.searchsorted(np.array(self.op_seq, dtype=np.int64), seq, side="right") + self.first_op,
            "action": packed & 15, "phase": packed >> 4 & 15,
            "category": np.where((packed >> 8 & 15) == NO_CATEGORY, -1, packed >> 8 & 15),
            "from_category": (packed >> 12 & 15) - 1, "origin": packed >> 16,
            "nbytes": np.array(self.nbytes, dtype=np.int64), "live": np.array(self.live, dtype=np.int64),
            "buffer": np.array(self.buffer, dtype=np.int64), "time": np.array(self.time, dtype=np.float64),
        }

    def retag(self, seq: int, category: int) -> bool:
        """Event `seq` counts in `category` instead of the one it was recorded in (a move it records, from one
        category to another, becomes none): a buffer alive before the ledger, touched later by the recorded code,
        counts in its real category from the start. False if the event was dropped already."""
        i = seq - self.first
        if i < 0:
            return False
        c = self.code[i]
        moved = c >> 12 & 15
        self.code[i] = c & ~0xFF00 | ((category + 1) << 12 if moved else 0) | category << 8
        return True

    def drop(self, events: int, ops: int) -> None:
        """Forget the first `events` events and the first `ops` op slices (a bounded ledger's oldest step)."""
        for column in (self.time, self.nbytes, self.live, self.buffer, self.code):
            del column[:events]
        for column in (self.op_seq, self.op_t0, self.op_flops):
            del column[:ops]
        self.first += events
        self.first_op += ops


class Ops(Sequence):
    """The op slices of an EventLog, one dict each: name, op, scope, layer, phase, step, t0, t1, flops
    (t0, t1: seconds since the ledger started; t1 is the time of its "op" event)."""

    def __init__(self, log: EventLog):
        self.log = log

    def __len__(self) -> int:
        return len(self.log.op_seq)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        log = self.log
        i = log.op_seq[k] - log.first
        c = log.code[i]
        o = log.origins[c >> 16]
        return {"name": o.name, "op": o.op, "scope": o.scope, "layer": o.layer, "phase": PHASES[c >> 4 & 15],
                "step": log.first_op + (k if k >= 0 else k + len(self)) + 1, "t0": log.op_t0[k], "t1": log.time[i],
                "flops": log.op_flops[k]}


@dataclass
class Lifetime:
    """One saved buffer: when it was saved, read by backward, and freed; how long it sat idle. Steps are op
    steps (Event.step); op, scope, layer, role and kept are its first saver's (see Origin)."""

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
    op: str = ""
    scope: str = ""
    layer: str = ""
    role: str = ""
    kept: str = ""


class Lifetimes:
    """The saved buffers' lifetimes as columns (-1 where a step has not happened); `row` numbers are
    stable until `keep` compacts the table."""

    COLUMNS = ("buffer", "nbytes", "origin", "created", "first_used", "last_used", "released")

    def __init__(self):
        for name in self.COLUMNS:
            setattr(self, name, array("q"))

    def __len__(self) -> int:
        return len(self.buffer)

    def add(self, buffer: int, nbytes: int, origin: int, created: int) -> int:
        """A new saved buffer; returns its row."""
        for column, value in zip(self.COLUMNS, (buffer, nbytes, origin, created, -1, -1, -1)):
            getattr(self, column).append(value)
        return len(self.buffer) - 1

    def used(self, row: int, step: int) -> None:
        if self.first_used[row] < 0:
            self.first_used[row] = step
        self.last_used[row] = step

    def record(self, row: int, origins: list[Origin]) -> Lifetime:
        o = origins[self.origin[row]]

        def step(column):
            value = getattr(self, column)[row]
            return None if value < 0 else value

        return Lifetime(o.name, self.nbytes[row], o.shape, o.dtype, self.buffer[row], self.created[row],
                        step("first_used"), step("last_used"), step("released"), op=o.op, scope=o.scope,
                        layer=o.layer, role=o.role, kept=o.kept)

    def keep(self, rows: np.ndarray) -> np.ndarray:
        """Keep only these rows (a bool mask); returns the new row of each old one (-1: dropped)."""
        for name in self.COLUMNS:
            column = getattr(self, name)
            kept = np.array(column, dtype=np.int64)[rows]
            setattr(self, name, array("q", kept.tobytes()))
        return np.where(rows, np.cumsum(rows) - 1, -1)


@dataclass
class Iteration:
    """One training iteration as a bounded ledger remembers it after its events are gone: its ops and events,
    its FLOPs per phase, the bytes held per category at its end, and the highest during it ("total": every category
    but "untouched", as Ledger.peak_bytes(); "held": all of them, as peak_bytes(untouched=True)). An iteration
    begins with the first forward op after a backward or optimizer phase."""

    index: int
    first_step: int  # op steps before it (its ops are first_step + 1 ..)
    ops: int
    events: int
    flops: dict  # phase -> FLOPs
    live: dict  # category -> bytes at its end (now, for the iteration in progress)
    peak: dict  # category, "total" and "held" -> highest bytes during it
    kept: bool  # its events are still in led.events


class IterationLog(Sequence):
    """The iterations' summaries, one row of ints each: first step, ops, events, FLOPs per phase, live bytes per
    category at the end, peak per category, peak total and peak held. The iteration in progress is not a row yet."""

    FIELDS = 3 + len(PHASES) + len(CATEGORIES) + len(CATEGORIES) + 2

    def __init__(self):
        self.rows = array("q")
        self.first_kept = 0  # iterations before this one have had their events dropped

    def __len__(self) -> int:
        return len(self.rows) // self.FIELDS

    def append(self, row: list) -> None:
        """One finished iteration: [first step, ops, events, *FLOPs per phase, *live, *peak per category, peak total,
        peak held]."""
        self.rows.extend(row)

    def retag(self, source: int, target: int, nbytes: int) -> None:
        """A buffer held through every iteration so far in category `source` counts in `target` instead: move its
        bytes in each row's live and peak columns (exact: it was there all along) and add them to the peak total
        when it leaves "untouched"."""
        p, c = len(PHASES), len(CATEGORIES)
        live, peak = 3 + p, 3 + p + c
        untouched = CATEGORIES.index("untouched")
        for row in range(0, len(self.rows), self.FIELDS):
            for start in (row + live, row + peak):
                self.rows[start + source] -= nbytes
                self.rows[start + target] += nbytes
            self.rows[row + peak + c] += nbytes * ((source == untouched) - (target == untouched))

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        k = k + len(self) if k < 0 else k
        if not 0 <= k < len(self):
            raise IndexError("iteration index out of range")
        return self.record(k, self.rows[k * self.FIELDS:(k + 1) * self.FIELDS].tolist())

    def record(self, k: int, row: list) -> Iteration:
        p, c = len(PHASES), len(CATEGORIES)
        first_step, ops, events = row[:3]
        flops, live, peak = row[3:3 + p], row[3 + p:3 + p + c], row[3 + p + c:]
        return Iteration(k, first_step, ops, events, dict(zip(PHASES, flops)), dict(zip(CATEGORIES, live)),
                         {**dict(zip(CATEGORIES, peak)), "total": peak[-2], "held": peak[-1]}, k >= self.first_kept)
