"""The memory explorer: one self-contained HTML page to look at ledgers in a browser.

    led.to_html("step.html")                                              # one ledger
    plain.to_html("compare.html", compare=ckpt, labels=("plain", "checkpointed"))

The page is explorer.html next to this file (hand-written canvas drawing, inline CSS and JavaScript, no
library, nothing fetched: it opens from file://) with the data of each ledger inlined as JSON: memory over
op steps stacked by category, phases shaded, peaks marked, untouched memory a hatched band on top, and the
lifetimes of the saved buffers; hover, click, search, pan and zoom (docs/explorer.md). Each pixel column
draws the event with the most live bytes, so the peak is never lost.

This module sits below the ledger: it turns a ledger's plain data (events, op slices, lifetimes, timeline,
backward passes; "reserved" under allocator="pytorch-cuda") into that JSON and writes the page, and knows
nothing of the Ledger class.
"""

from __future__ import annotations

import json
import os
from importlib import resources

import numpy as np

from .events import ACTIONS as EVENT_ACTIONS
from .events import CATEGORIES, PHASES
from .palette import CATEGORY_COLORS, CATEGORY_LABELS, LIFETIME_COLORS, LIFETIME_LABELS, PHASE_COLORS, UNTOUCHED_HATCH

ACTIONS = tuple(a for a in EVENT_ACTIONS if a != "op")  # the page's events are memory events only
DEFAULT_TITLE = "tinygrad_ckpt memory explorer"


class _Strings:
    """A table of strings sent once; the columns hold their indices. A name is sent with its layer (the
    record's `layer` field), which the page highlights by."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.layers: dict[int, str] = {}

    def __call__(self, text: str, layer: str | None = None) -> int:
        i = self.index.setdefault(text, len(self.index))
        if layer is not None:
            self.layers.setdefault(i, layer)
        return i

    def table(self) -> list[str]:
        return list(self.index)


def run_data(label: str, events, ops, lifetimes, timeline: dict, backward_passes) -> dict:
    """One ledger as the page reads it: columns of its memory events (op markers left out), the deltas of
    its timeline per category, its ops, its saved buffers' lifetimes, where its peak is (of what the run used:
    every category but "untouched", as Ledger.peak_bytes()) and how much it held untouched."""
    strings = _Strings()
    events = list(events)
    keep = np.array([ev.action != "op" for ev in events], dtype=bool)
    mem = [ev for ev in events if ev.action != "op"]
    held = np.asarray(timeline["total"])[keep]
    untouched = np.asarray(timeline["untouched"])[keep]
    total = held - untouched  # what the run used
    peak = int(np.argmax(total)) if len(total) else -1
    data = {  # the columns in this order: names enter the string table as they are met
        "label": label,
        "events": _event_columns(mem, strings),
        # live bytes per category after each event (the ledger's timeline), sent as differences
        "live": {c: np.diff(np.asarray(timeline[c])[keep], prepend=0).tolist() for c in CATEGORIES},
        "ops": _op_columns(ops, strings),
        "lifetimes": _lifetime_columns(lifetimes, strings),
        "backward_passes": [list(p) for p in backward_passes],
        "peak": {"event": peak, "bytes": int(total[peak]) if peak >= 0 else 0},
        "end_bytes": int(total[-1]) if len(total) else 0,
        "held_peak": int(held.max()) if len(held) else 0,  # untouched included: the top of what is drawn
        "untouched": int(untouched.max()) if len(untouched) else 0,  # held before the ledger, never used
    }
    if "reserved" in timeline:  # Ledger(allocator=...): what PyTorch's caching allocator would reserve
        reserved = np.asarray(timeline["reserved"])[keep]
        data["reserved"] = np.diff(reserved, prepend=0).tolist()
        data["reserved_peak"] = int(reserved.max()) if len(reserved) else 0
    data["names"] = strings.table()
    data["layers"] = [strings.layers.get(i, "") for i in range(len(data["names"]))]
    return data


_CATEGORY = {name: i for i, name in enumerate(CATEGORIES)}
_PHASE = {name: i for i, name in enumerate(PHASES)}
_ACTION = {name: i for i, name in enumerate(ACTIONS)}


def _event_columns(mem, strings) -> dict:
    """The memory events as columns (categories, phases and actions by their index; names in the string table)."""
    return {
        "step": [ev.step for ev in mem],
        "action": [_ACTION[ev.action] for ev in mem],
        "category": [_CATEGORY[ev.category] for ev in mem],
        "from": [_CATEGORY.get(ev.from_category, -1) for ev in mem],
        "nbytes": [ev.nbytes for ev in mem],
        "name": [strings(ev.name, ev.layer) for ev in mem],
        "buffer": [ev.buffer for ev in mem],
        "phase": [_PHASE[ev.phase] for ev in mem],
    }


def _op_columns(ops, strings) -> dict:
    return {
        "name": [strings(op["name"], op["layer"]) for op in ops],
        "op": [strings(op["op"]) for op in ops],
        "phase": [_PHASE[op["phase"]] for op in ops],
        "flops": [int(op["flops"]) for op in ops],
    }


def _lifetime_columns(lifetimes, strings) -> dict:
    """The saved buffers' lifetimes as columns (-1 for a step that never came)."""
    return {
        "name": [strings(lf.name, lf.layer) for lf in lifetimes],
        "nbytes": [lf.nbytes for lf in lifetimes],
        "shape": [strings(f"{list(lf.shape)} {lf.dtype}") for lf in lifetimes],
        "buffer": [lf.buffer for lf in lifetimes],
        "created": [lf.created for lf in lifetimes],
        "first_used": [_or(lf.first_used, -1) for lf in lifetimes],
        "last_used": [_or(lf.last_used, -1) for lf in lifetimes],
        "released": [_or(lf.released, -1) for lf in lifetimes],
        "idle": [_round(lf.idle_fraction) for lf in lifetimes],
        "idle_flops": [_round(lf.idle_fraction_flops) for lf in lifetimes],
    }


def _or(value, default):
    return default if value is None else value


def _round(value):
    return None if value is None else round(float(value), 4)


def page(runs: list[dict], title: str = DEFAULT_TITLE) -> str:
    """The HTML page for these runs (run_data dicts): the template with the data inlined."""
    data = {
        "title": title,
        "categories": [{"name": c, "color": CATEGORY_COLORS[c], "label": CATEGORY_LABELS[c]} for c in CATEGORIES],
        "untouched_hatch": UNTOUCHED_HATCH,
        "phases": [{"name": p, "color": PHASE_COLORS[p]} for p in PHASES],
        "lifetime_colors": LIFETIME_COLORS,
        "lifetime_labels": LIFETIME_LABELS,
        "actions": list(ACTIONS),
        "runs": runs,
    }
    # "<" escaped, so no name can close the <script> element the JSON sits in
    text = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    template = resources.files(__package__).joinpath("explorer.html").read_text(encoding="utf-8")
    return template.replace("__TITLE__", _html_escape(title)).replace("__EXPLORER_DATA__", text)


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def write_html(path, runs: list[dict], title: str = DEFAULT_TITLE) -> str:
    """Write page(runs, title) to `path` (UTF-8); returns the path."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(page(runs, title))
    return os.fspath(path)
