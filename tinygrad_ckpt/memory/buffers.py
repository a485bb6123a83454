"""The buffers the engine holds, as a ledger sees them: each one's category, its bytes, its saves and its release.

`Holdings` turns what the engine does with arrays (holds one for a tensor, saves it for backward, lets it go, frees
it) into the changes of a buffer's category (categories.py) and the byte counts (counts.py), and tells the ledger
each event through `emit(action, nbytes, category, origin, buffer, from_category)`. It places every new buffer with
the allocator plugged in, if any, and keeps the lifetimes of the buffers saved for backward.
"""

from __future__ import annotations

from .. import backend
from ..engine.tape import edge_name
from .categories import Buffer, BufferRef, category_of, touch
from .counts import ByteCounts
from .events import (
    ACTIVATION,
    ALLOCATED,
    EXISTING,
    GRADIENT,
    OTHER,
    RELEASED,
    RETAGGED,
    UNSAVED,
    UNTOUCHED,
    EventLog,
    Lifetimes,
)


class Holdings:
    """The live buffers (id of the owning array -> categories.Buffer) and what follows from them: the byte counts,
    the lifetimes of the saved ones, how many are untouched. `log`: the ledger's events (for origins, seqs and op
    steps); `window`: its iteration window; `placement`: the simulated allocator's (None: none)."""

    def __init__(self, log: EventLog, window, placement, emit):
        self.log, self.window, self.placement, self.emit = log, window, placement, emit
        self.buffers: dict[int, Buffer] = {}
        self.counts = ByteCounts()
        self.lives = Lifetimes()  # one row per saved buffer
        self.untouched = 0  # buffers untouched now (while there are none, reads are not looked up)
        self._next_id = 0

    def of(self, a) -> Buffer | None:
        """The live buffer of array `a`, if the ledger knows it."""
        be = backend.current()
        return self.buffers.get(id(be.buffer(a)[0])) if be.is_array(a) else None

    def track(self, a, category: int, origin: int, action: int = ALLOCATED) -> Buffer | None:
        """The engine holds array `a` in `category`; a new buffer is an allocation."""
        be = backend.current()
        if not be.is_array(a):
            return None
        owner, nbytes = be.buffer(a)
        buf = self.buffers.get(id(owner))
        if buf is None:
            return self._new(owner, int(nbytes), category, origin, action)
        if buf.existing is not None:
            if action == EXISTING:  # the scan found another role of it
                buf.roles |= 0 if category == ACTIVATION else 1 << category
                return buf
            self.touch(buf)
        if category != ACTIVATION and not buf.roles >> category & 1:
            buf.roles |= 1 << category
            old = self.move(buf, category_of(buf))
            if old != buf.category:
                self.emit(RETAGGED, buf.nbytes, buf.category, origin, buf.id, old)
        return buf

    def _new(self, owner, nbytes: int, category: int, origin: int, action: int) -> Buffer:
        """A buffer not held before: an allocation (or, from the scan, an untouched one)."""
        key = id(owner)
        buf = self.buffers[key] = Buffer(self._next_id, nbytes, category, origin)
        self._next_id += 1
        buf.ref = BufferRef(owner, self.free)
        buf.ref.key = key
        if action == EXISTING:  # held before the ledger started: untouched until the recorded code uses it
            category, buf.category, buf.existing = UNTOUCHED, UNTOUCHED, [self.log.next_seq]
            self.untouched += 1
        self.counts.allocate(category, buf.nbytes)
        if self.placement is not None:
            self.placement.malloc(buf.id, buf.nbytes, self.log.next_seq)
        self.emit(action, buf.nbytes, category, origin, buf.id)
        return buf

    def move(self, buf: Buffer, category: int) -> int:
        """`buf` counts in `category` from now; returns the category it leaves."""
        old = buf.category
        if old != category:
            self.counts.move(old, category, buf.nbytes)
            buf.category = category
        return old

    def touch(self, buf: Buffer) -> None:
        """The recorded code uses a buffer held before the ledger started, for the first time (categories.touch)."""
        self.untouched -= 1
        touch(buf, self.counts, self.window, self.log, self.lives)

    def touch_arrays(self, arrays) -> None:
        """The recorded code reads or writes these arrays: touch those still untouched."""
        for a in arrays:
            buf = self.of(a)
            if buf is not None and buf.existing is not None:
                self.touch(buf)

    def free(self, ref: BufferRef) -> None:
        """The buffer's owning array is being freed (its weak reference calls back)."""
        buf = self.buffers.pop(ref.key, None)
        if buf is None:
            return
        if buf.existing is not None:
            self.untouched -= 1
        self.counts.release(buf.category, buf.nbytes)
        if self.placement is not None:
            self.placement.free(buf.id, self.log.next_seq)
        self.emit(RELEASED, buf.nbytes, buf.category, buf.origin, buf.id)
        if buf.life >= 0:
            self.lives.released[buf.life] = self.log.steps

    def hold(self, a, category: int, tensor: str, role: str, op: str, action: int = ALLOCATED) -> None:
        """A tensor's buffer: its data (role ""), its gradient ("grad") or an optimizer state (role: the state's
        key, op: the optimizer), named "x", "x.grad", "x:adamw.m"."""
        if backend.current().is_array(a):
            name = f"{tensor}:{op}.{role}" if op else f"{tensor}.{role}" if role else tensor
            self.track(a, category, self.log.origin(a, tensor, name, op, "", role, tensor, ""), action)

    def hold_outputs(self, outputs: tuple, name: str, kind: str, scope: str) -> None:
        """The outputs (tensors or arrays) of op `name` of kind `kind`, run in module `scope`."""
        be = backend.current()
        for out in outputs:
            a = getattr(out, "data", out)
            if be.is_array(a):
                self.track(a, OTHER, self.log.origin(a, name, name, kind, scope, "output", "", ""))

    def hold_gradients(self, entry, grad_ins) -> None:
        """The gradients tape entry `entry`'s backward produced, one per input (None: none)."""
        for i, (edge, g) in enumerate(zip(entry.inputs, grad_ins)):
            if g is None:
                continue
            if edge is not None:  # named after the tensor it is the gradient of
                self.hold(g, GRADIENT, edge_name(edge), "grad", "")
            else:  # an input that needs no gradient got one all the same
                self.hold(g, GRADIENT, entry.name, f"grad{i}", "")

    def saved_origin(self, a, key: str, name: str, op: str, scope: str, kept: str, role_of) -> int:
        """The origin of array `key` kept for backward by op `name` (see holder_fields), named "op:key", or
        "op[kept: why]:key" for what a policy kept."""
        label = f"{name}[kept: {kept}]:{key}" if kept else f"{name}:{key}"
        return self.log.origin(a, name, label, op, scope, role_of(key) if role_of else key, "", kept)

    def save_all(self, fields: tuple, saved: dict, action: int) -> None:
        """The op of `fields` (holder_fields) keeps these arrays for backward from now."""
        for key, a in saved.items():
            if backend.current().is_array(a):
                self.save(a, self.saved_origin(a, key, *fields), action)

    def release_all(self, fields: tuple, saved: dict) -> None:
        """The op of `fields` lets go of these arrays."""
        for key, a in saved.items():
            buf = self.of(a)
            if buf is not None:
                self.unsave(buf, self.saved_origin(a, key, *fields))

    def save(self, a, origin: int, action: int) -> None:
        """Array `a` is held for backward from now by one more save (action: SAVED, RECOMPUTED, RESTORED, EXISTING)."""
        buf = self.track(a, ACTIVATION, origin, EXISTING if action == EXISTING else ALLOCATED)
        buf.saves += 1
        if buf.existing is not None:  # a save the scan found, of a buffer not touched yet: it stays untouched
            buf.existing.append(self.log.next_seq)
            self.emit(action, buf.nbytes, UNTOUCHED, origin, buf.id, UNTOUCHED)
            return
        old = self.move(buf, category_of(buf))
        self.emit(action, buf.nbytes, buf.category, origin, buf.id, old)
        if buf.life < 0 and buf.category == ACTIVATION:
            buf.life = self.lives.add(buf.id, buf.nbytes, origin, self.log.steps)

    def unsave(self, buf: Buffer, origin: int) -> None:
        """One save of `buf` is let go (its entry's backward ran, or its tape was dropped)."""
        buf.saves -= 1
        if buf.existing is not None:  # a graph that existed, dropped unused
            buf.existing.append(self.log.next_seq)
            self.emit(UNSAVED, buf.nbytes, UNTOUCHED, origin, buf.id, UNTOUCHED)
            return
        old = self.move(buf, category_of(buf))
        self.emit(UNSAVED, buf.nbytes, buf.category, origin, buf.id, old)

    def used(self, arrays) -> None:
        """A backward is about to read these saved arrays: touch the untouched, note the use in the lifetimes."""
        for a in arrays:
            buf = self.of(a)
            if buf is not None and buf.existing is not None:
                self.touch(buf)  # a graph that existed before the ledger: its backward reads it
            if buf is not None and buf.life >= 0:
                self.lives.used(buf.life, self.log.steps)


def holder_fields(holder) -> tuple:
    """(name, op, scope, kept, role_of) of what holds saves: a tape entry, whose keys are the roles (kept "",
    role_of None), or what a checkpoint's policy kept (a policies.KeptOp: kept is its reason, role_of its role())."""
    reason = getattr(holder, "reason", None)
    if reason is None:
        return holder.name, holder.op, holder.scope, "", None
    return holder.name, holder.op, holder.scope, reason or "kept by the policy", holder.role
