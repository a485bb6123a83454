"""A ledger's records written out for other tools: what `Ledger.to_chrome_trace / to_csv / to_jsonl /
to_memory_viz / to_html` call.

    chrome_trace(led, "trace.json")    # chrome://tracing or ui.perfetto.dev: op slices nested in their phases
    write_csv(led, "events.csv")       # one row per event, a column per Event field
    write_jsonl(led, "events.jsonl")   # one JSON object per event
    memory_viz(led, "step.pickle")     # pytorch.org/memory_viz (memory_viz.py builds the snapshot)
    html("step.html", [led, other])    # the memory explorer page (explorer.py builds it)

Each reads only what a ledger offers everyone (events, ops, spans, timeline, lifetimes, backward passes), so
it sits below the ledger and knows nothing of how it records. A bounded ledger (`keep_iterations`) exports
the events it kept.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict

import numpy as np

from . import explorer
from . import memory_viz as viz
from .events import CATEGORIES, EXISTING, OP, Event


def check_path(method: str, path):
    """A file name, or TypeError naming the method: an int would be taken by open() as a file descriptor."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{method}: path must be a file name (str or os.PathLike), got {type(path).__name__} "
                        f"{path!r}")
    return path


def entry_state_first(actions):
    """The indices of the memory events to draw a curve through: every one but the "op" markers and the "existing"
    events before the last of them. Those count, one buffer each, what was alive when the ledger was entered: it was
    held from the start, so a curve begins at the state after the last of them instead of ramping up to it."""
    keep = actions != OP
    existing = np.flatnonzero(actions == EXISTING)
    keep[existing[:-1]] = False
    return keep.nonzero()[0]


def chrome_trace(led, path=None) -> dict:
    """Chrome trace / Perfetto JSON: one slice ("X") per op and per phase run or span, and a counter track ("C")
    of the live bytes per category at every memory event (what was alive at entry from the first: entry_state_first);
    microseconds since the ledger started."""
    if path is not None:
        check_path("to_chrome_trace", path)
    trace = [{"ph": "M", "pid": 1, "tid": 1, "name": "process_name", "args": {"name": "tinygrad_ckpt"}}]
    for span in led.spans:
        trace.append({"ph": "X", "pid": 1, "tid": 1, "name": span["name"], "cat": "phase",
                      "ts": span["t0"] * 1e6, "dur": (span["t1"] - span["t0"]) * 1e6, "args": {}})
    for op in led.ops:
        trace.append({"ph": "X", "pid": 1, "tid": 1, "name": op["name"], "cat": op["phase"],
                      "ts": op["t0"] * 1e6, "dur": (op["t1"] - op["t0"]) * 1e6,
                      "args": {"op": op["op"], "flops": op["flops"], "step": op["step"]}})
    tl = led.timeline()
    memory = entry_state_first(led.events.columns()["action"])
    live = {c: tl[c][memory].tolist() for c in CATEGORIES}
    for k, t in enumerate(tl["time"][memory].tolist()):
        trace.append({"ph": "C", "pid": 1, "tid": 1, "name": "memory", "ts": t * 1e6,
                      "args": {c: live[c][k] for c in CATEGORIES}})
    doc = {"traceEvents": trace, "displayTimeUnit": "ms"}
    if path is not None:
        with open(path, "w") as f:
            json.dump(doc, f)
    return doc


def write_csv(led, path) -> None:
    """Every event, one row each, under a header of the Event fields."""
    names = list(Event.__slots__)
    with open(check_path("to_csv", path), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for ev in led.events:
            writer.writerow([getattr(ev, k) for k in names])


def write_jsonl(led, path) -> None:
    """Every event as one JSON object per line."""
    with open(check_path("to_jsonl", path), "w") as f:
        for ev in led.events:
            f.write(json.dumps({k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(ev).items()}))
            f.write("\n")


def memory_viz(led, path=None) -> dict:
    """PyTorch's memory snapshot of the ledger's events (memory_viz.py), pickled (protocol 4) to `path` if given."""
    snap = viz.snapshot(led.events, getattr(led, "placement", None))
    if path is not None:
        viz.write(snap, check_path("to_memory_viz", path))
    return snap


def html(path, led, compare=None, labels=None, title: str | None = None) -> str:
    """The explorer page of ledger `led` and those in `compare` (one, or a list; of led's class) side by side
    (labels: one string each; default "ledger 1", ...)."""
    check_path("to_html", path)  # every argument is checked before the file is opened
    others = [] if compare is None else list(compare) if isinstance(compare, (list, tuple)) else [compare]
    for i, other in enumerate(others):
        if not isinstance(other, type(led)):
            raise TypeError(f"to_html: compare must be a Ledger or a list of Ledgers, got {type(other).__name__}"
                            + (f" at position {i}" if isinstance(compare, (list, tuple)) else ""))
    ledgers = [led, *others]
    if title is not None and not isinstance(title, str):
        raise TypeError(f"to_html: title must be a string (or None for the default), got {type(title).__name__}")
    if labels is None:
        labels = [f"ledger {i + 1}" for i in range(len(ledgers))] if len(ledgers) > 1 else ["ledger"]
    labels = [labels] if isinstance(labels, str) else list(labels)
    if len(labels) != len(ledgers) or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"to_html: labels must be {len(ledgers)} string(s), one per ledger (this one and "
                         f"{len(ledgers) - 1} to compare), got {labels!r}")
    runs = [explorer.run_data(label, led.events, led.ops, led.lifetimes(), led.timeline(), led.backward_passes())
            for label, led in zip(labels, ledgers)]
    return explorer.write_html(path, runs, explorer.DEFAULT_TITLE if title is None else title)
