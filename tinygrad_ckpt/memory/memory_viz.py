"""A ledger's events as a PyTorch memory snapshot: the pickle that PyTorch's memory_viz opens.

    led.to_memory_viz("step.pickle")     # open it at pytorch.org/memory_viz (the page reads it locally)

The snapshot is the dict `torch.cuda.memory._snapshot()` returns ("segments", "device_traces"). Every buffer
the ledger saw is an "alloc" when the engine starts holding it and a "free_requested" then "free_completed"
when its memory is really released, so replaying the trace gives the ledger's live bytes event by event.
Addresses are made up (first-fit in one segment, 512-byte boundaries) unless the ledger was made with
allocator="pytorch-cuda", whose placements, segment events and segments are used; sizes are exact. A
buffer's frames are its history, one per role: `category:op step:scoped name (action, phase)`.
Written with pickle protocol 4: memory_viz's JavaScript unpickler refuses 5. In full: docs/house.md.
"""

from __future__ import annotations

import bisect
import pickle

from .cuda_memory import BASE_ADDRESS  # well below 2**53: memory_viz reads addresses as JavaScript numbers

PROTOCOL = 4
ALIGNMENT = 512


def _reserved(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


class FirstFit:
    """Made-up addresses for buffers: the lowest free gap that fits, else the end of the segment."""

    def __init__(self):
        self.gaps: list[tuple[int, int]] = []  # (offset, size), sorted, neighbours merged
        self.top = 0  # the segment's size: the highest end ever used

    def alloc(self, nbytes: int) -> int:
        size = _reserved(nbytes)
        for i, (start, gap) in enumerate(self.gaps):
            if gap >= size:
                self.gaps[i:i + 1] = [(start + size, gap - size)] if gap > size else []
                return start
        start = self.gaps.pop()[0] if self.gaps and sum(self.gaps[-1]) == self.top else self.top
        self.top = start + size
        return start

    def free(self, start: int, nbytes: int) -> None:
        size = _reserved(nbytes)
        i = bisect.bisect(self.gaps, (start, 0))
        if i < len(self.gaps) and start + size == self.gaps[i][0]:
            size += self.gaps.pop(i)[1]
        if i and sum(self.gaps[i - 1]) == start:
            self.gaps[i - 1] = (self.gaps[i - 1][0], self.gaps[i - 1][1] + size)
        else:
            self.gaps.insert(i, (start, size))


class _Held:
    """A buffer the engine holds: where it sits, its history, how long it held each category."""

    def __init__(self, ev, offset: int, index: int):
        self.offset, self.nbytes = offset, ev.nbytes
        self.frames = [_frame(ev)]
        self.category, self.since, self.held = ev.category, index, {}
        self.alloc = {"action": "alloc", "addr": BASE_ADDRESS + offset, "size": ev.nbytes, "stream": 0,
                      "frames": self.frames, "category": ev.category, "time_us": _us(ev)}

    def become(self, category: str, index: int) -> None:
        self.held[self.category] = self.held.get(self.category, 0) + index - self.since
        self.category, self.since = category, index
        self.alloc["category"] = max(self.held, key=self.held.get)


def _frame(ev) -> dict:
    return {"filename": ev.category, "line": ev.step, "name": f"{ev.name} ({ev.action}, {ev.phase})"}


def _us(ev) -> int:
    return int(ev.time * 1e6)


def snapshot(events, placement=None) -> dict:
    """The memory_viz snapshot of a ledger's events (records with the fields of ledger.Event); `placement`: the
    ledger's cuda_allocator.Placement, if it has one (real segments and addresses)."""
    space, trace, held = FirstFit(), [], {}
    segment_events = iter(placement.segment_events if placement is not None else ())
    pending = next(segment_events, None)
    for index, ev in enumerate(events):
        while pending is not None and pending[0] <= ev.seq:  # the segment the allocator got for this buffer
            trace.append(pending[1] | {"frames": [], "category": "unknown", "time_us": _us(ev)})
            pending = next(segment_events, None)
        if ev.buffer < 0 or (ev.nbytes == 0 and ev.buffer not in held):
            continue  # an op marker, or an empty buffer
        if ev.allocates:
            if placement is not None and ev.buffer not in placement.addresses:
                continue  # the allocator ran out of memory for it
            offset = placement.addresses[ev.buffer] - BASE_ADDRESS if placement is not None else space.alloc(ev.nbytes)
            buf = held[ev.buffer] = _Held(ev, offset, index)
            trace.append(buf.alloc)
        elif ev.action == "released":
            buf = held.pop(ev.buffer, None)
            if buf is None:  # allocated before the first event a bounded ledger kept
                continue
            buf.frames.append(_frame(ev))
            buf.become(ev.category, index)
            if placement is None:
                space.free(buf.offset, buf.nbytes)
            for action in ("free_requested", "free_completed"):
                trace.append({"action": action, "addr": buf.alloc["addr"], "size": buf.nbytes, "stream": 0,
                              "frames": buf.frames, "category": buf.alloc["category"], "time_us": _us(ev)})
        elif ev.buffer in held:  # saved, unsaved, recomputed, restored, retagged: another role
            buf = held[ev.buffer]
            buf.frames.append(_frame(ev))
            buf.become(ev.category, index)
    for buf in held.values():
        buf.become(buf.category, len(events))
    # memory_viz adds "unknown" to its categories with a misspelt name (and throws) unless one entry has it:
    # the marker of the moment the snapshot was taken carries it.
    trace.append({"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "frames": [], "category": "unknown",
                  "time_us": _us(events[-1]) if len(events) else 0})
    live = sorted(held.values(), key=lambda b: b.offset)
    if placement is not None:
        return {"segments": _allocator_segments(placement, live), "device_traces": [trace]}
    return {"segments": _segments(space.top, live), "device_traces": [trace]}


def _allocator_segments(placement, live: list) -> list:
    """The allocator's segments at the end, each live block with its buffer's frames."""
    frames = {BASE_ADDRESS + buf.offset: buf.frames for buf in live}
    segments = placement.allocator.snapshot()
    for seg in segments:
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                block["frames"] = frames.get(block["address"], [])
    return segments


def _segments(size: int, live: list) -> list:
    """The one segment at the end: live buffers as active blocks, the gaps between them inactive."""
    if size == 0:
        return []
    blocks, cursor = [], 0

    def gap(end):
        if end > cursor:
            blocks.append({"address": BASE_ADDRESS + cursor, "size": end - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})

    for buf in live:
        gap(buf.offset)
        blocks.append({"address": BASE_ADDRESS + buf.offset, "size": buf.nbytes, "requested_size": buf.nbytes,
                       "state": "active_allocated", "frames": buf.frames})
        cursor = buf.offset + buf.nbytes
    gap(size)
    allocated = sum(buf.nbytes for buf in live)
    return [{"device": 0, "address": BASE_ADDRESS, "total_size": size, "allocated_size": allocated,
             "active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large",
             "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}]


def write(snap: dict, path) -> None:
    """Pickle the snapshot to `path` with protocol 4."""
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=PROTOCOL)
