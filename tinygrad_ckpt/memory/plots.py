"""Figures drawn from ledger data only: memory over time, lifetimes of saved activations, and what
each layer saves.

    from tinygrad_ckpt import plots
    fig, ax = plots.new_figure()
    plots.plot_memory_timeline(ax, led, title="one training step")
    plots.save(fig, "figures/step.png")

Every function takes a `Ledger` (or numbers derived from one) and an Axes; nothing here runs the
engine. Figures are plain `matplotlib.figure.Figure` objects drawn by the Agg canvas, so nothing
opens a window and importing this module changes no global matplotlib state. Colors are fixed per
category, phase and op kind (palette.py), so the same thing looks the same in every lesson and in the
HTML explorer.
"""

from __future__ import annotations

import os

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..units import format_bytes
from .ledger import CATEGORIES, PHASES
from .palette import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    LIFETIME_COLORS,
    LIFETIME_LABELS,
    PHASE_COLORS,
    RECOMPUTE_MARK,
    UNTOUCHED_HATCH,
)

OP_COLORS = {
    "linear": "#4C72B0", "matmul": "#55A868", "softmax": "#C44E52", "gelu": "#DD8452",
    "layer_norm": "#8172B3", "masked_fill": "#937860", "dropout": "#DA8BC3", "mul": "#8C8C8C",
    "embedding": "#CCB974", "cross_entropy": "#64B5CD", "checkpoint": "#2F4F4F",
}
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


# ---------------------------------------------------------------- byte units

def byte_unit(nbytes: float) -> tuple[float, str]:
    """(divisor, unit) that shows `nbytes` as a number between 1 and 1024: (1024**2, "MiB")."""
    n, i = abs(float(nbytes)), 0
    while n >= 1024 and i < len(_BINARY_UNITS) - 1:
        n, i = n / 1024, i + 1
    return float(1024**i), _BINARY_UNITS[i]


def unit_divisor(unit: str) -> float:
    """Bytes per `unit` ("B", "KiB", "MiB", ...)."""
    return float(1024 ** _BINARY_UNITS.index(unit))


# ---------------------------------------------------------------- figures

def new_figure(nrows: int = 1, ncols: int = 1, figsize=(9, 4.5), **subplot_kw):
    """A constrained-layout Figure on the Agg canvas and its axes (squeezed like plt.subplots)."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, **subplot_kw)
    return fig, axes


def save(fig, path, dpi: int = 120) -> str:
    """Write `fig` to `path` (folders created), nothing clipped; returns the path."""
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return os.fspath(path)


# ---------------------------------------------------------------- memory over time

def _timeline_x(tl: dict, actions, x: str):
    """x coordinates of the memory events, and the axis label. Op markers are left out, and so are
    the "existing" events that count what was alive when the ledger started (but the last), so the
    plot starts from that state instead of ramping up to it."""
    keep = actions != "op"
    existing = np.flatnonzero(actions == "existing")
    if len(existing) > 1:
        keep[existing[:-1]] = False
    if x == "event":
        return np.arange(int(keep.sum())), keep, "ledger event (each allocation, save, release)"
    if x == "step":
        steps = tl["step"][keep].astype(float)
        # spread the events of one step evenly over [step, step + 1) so none hide behind another
        out = steps.copy()
        if len(steps):
            starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
            ends = np.r_[starts[1:], len(steps)]
            for s, e in zip(starts, ends):
                out[s:e] += np.arange(e - s) / (e - s)
        return out, keep, "op step (forward ops, then backward ops)"
    if x == "flops":
        return tl["flops"][keep].astype(float), keep, "cumulative FLOPs"
    if x == "time":
        return tl["time"][keep] * 1e3, keep, "time since the ledger started (ms)"
    raise ValueError(f"plot_memory_timeline: x must be 'event', 'step', 'flops' or 'time', got {x!r}")


def timeline_data(led, x: str = "event") -> dict:
    """The ledger's timeline without the op markers: x, its label, phase, one array per category, "total" (all of
    them) and "used" (all but "untouched": what the recorded code used, whose peak is led.peak_bytes())."""
    tl = led.timeline()
    actions = np.array([ev.action for ev in led.events], dtype=object)
    xs, keep, label = _timeline_x(tl, actions, x)
    out = {c: tl[c][keep] for c in (*CATEGORIES, "total")}
    out.update(x=xs, xlabel=label, phase=tl["phase"][keep], used=out["total"] - out["untouched"])
    return out


def untouched_note(leds, labels) -> str | None:
    """A line saying how the ledgers differ in untouched bytes (held before each started, never used by its run),
    or None when they hold the same."""
    held = [led.peak_bytes("untouched") for led in leds]
    if len(set(held)) < 2:
        return None
    each = "; ".join(f"{label}: {format_bytes(n)}" for label, n in zip(labels, held))
    return (f"Not the same untouched memory ({each}): held before the ledger started, never used by the run;\n"
            "hatched grey on top, left out of the peaks")


def _phase_runs(phases) -> list[tuple[str, int, int]]:
    """(phase, first index, last index + 1) for each run of equal phases."""
    runs, start = [], 0
    for i in range(1, len(phases) + 1):
        if i == len(phases) or phases[i] != phases[start]:
            runs.append((phases[start], start, i))
            start = i
    return runs


def plot_memory_timeline(ax, led, title: str | None = None, peak: bool = True, shade_phases: bool = True,
                         x: str = "event", unit: str | None = None, legend: bool | str = True,
                         ymax: float | None = None) -> dict:
    """Live bytes over time stacked by category, phases shaded, the peak marked and labelled. What was held before
    the ledger started and never used by the run ("untouched") is a hatched grey band on top, apart: the peak
    marked is led.peak_bytes(), of what the run used.

    The forward, backward and optimizer phases are shaded bands; each replay of a checkpoint (phase
    "recompute", inside the backward) is marked along the top edge, so that a backward of many replays
    reads as one band instead of dozens of stripes.

    x: "event" (index of the ledger's memory events), "step" (op steps), "flops" or "time".
    unit: "KiB", "MiB", ... (default: chosen from the peak). legend: True (right of the axes),
    "below", or False. ymax: a y limit in `unit` (for panels that share one axis).
    Returns {"unit", "peak_bytes", "peak_x", "peak_phase", "handles"}.
    """
    d = timeline_data(led, x)
    xs, total = d["x"], d["used"]
    if len(xs) == 0:
        raise ValueError("plot_memory_timeline: the ledger recorded no memory events")
    peak_i = int(np.argmax(total))
    if unit is None:
        unit = byte_unit(total[peak_i])[1]
    div = unit_divisor(unit)
    # one extra point so the last step is drawn to the end
    xe = np.r_[xs, xs[-1] + (xs[-1] - xs[0]) * 0.002 + 1e-9]
    phase_handles = _shade_phases(ax, d["phase"], xe) if shade_phases else []
    handles = _stack_categories(ax, d, xe, div)[::-1] + phase_handles  # legend top-down in stacking order
    ax.step(xe, np.r_[total, total[-1]] / div, where="post", color="black", lw=0.6, zorder=3)

    peak_bytes = int(total[peak_i])
    top = ymax if ymax is not None else max(peak_bytes, int(d["total"].max())) / div * 1.22
    ax.set_ylim(0, top)
    ax.set_xlim(xe[0], xe[-1])
    if peak:
        _mark_peak(ax, xs[peak_i], peak_bytes, div, xe, d["phase"][peak_i])
    ax.set_xlabel(d["xlabel"])
    ax.set_ylabel(f"live memory ({unit})")
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3, zorder=1)
    if legend:
        if legend == "below":
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8,
                      frameon=False)
        else:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return {"unit": unit, "peak_bytes": peak_bytes, "peak_x": float(xs[peak_i]),
            "peak_phase": str(d["phase"][peak_i]), "handles": handles}


def _shade_phases(ax, phases, xe) -> list:
    """Shade each phase's run of events (a replay inside backward counts as backward) and mark each replay along
    the top edge; the legend handles of what was shaded."""
    seen = set()
    bands = ["backward" if p == "recompute" else p for p in phases]
    for phase, s, e in _phase_runs(bands):
        ax.axvspan(xe[s], xe[e], color=PHASE_COLORS.get(phase, "#EEEEEE"), lw=0, zorder=0)
        seen.add(phase)
    for phase, s, e in _phase_runs(phases):
        if phase == "recompute":
            ax.axvspan(xe[s], xe[e], ymin=0.965, ymax=1.0, color=RECOMPUTE_MARK, lw=0, zorder=1)
            seen.add(phase)
    handles = [Patch(color=PHASE_COLORS[p], label=f"{p} phase") for p in PHASES if p in seen and p != "recompute"]
    if "recompute" in seen:
        handles.append(Patch(color=RECOMPUTE_MARK, label="recompute (replays, marked along the top)"))
    return handles


def _stack_categories(ax, d: dict, xe, div: float) -> list:
    """Fill each category's live bytes on top of the ones before (untouched hatched, apart); their handles, bottom
    first."""
    bottom = np.zeros(len(d["x"]))
    handles = []
    for c in CATEGORIES:
        values = d[c] / div
        if not np.any(values):
            continue
        top = bottom + values
        apart = dict(facecolor=CATEGORY_COLORS[c], hatch="////", edgecolor=UNTOUCHED_HATCH) if c == "untouched" \
            else dict(color=CATEGORY_COLORS[c])
        ax.fill_between(xe, np.r_[bottom, bottom[-1]], np.r_[top, top[-1]], step="post", lw=0, zorder=2, **apart)
        handles.append(Patch(label=CATEGORY_LABELS[c], **apart))
        bottom = top
    return handles


def _mark_peak(ax, px, peak_bytes: int, div: float, xe, phase) -> None:
    """A dashed line at the peak, a marker on it, and its size and phase written on the side with room."""
    py = peak_bytes / div
    ax.axhline(py, color="black", lw=0.8, ls="--", zorder=3)
    ax.plot([px], [py], marker="v", color="black", ms=7, zorder=4)
    left = (px - xe[0]) > 0.5 * (xe[-1] - xe[0])
    ax.annotate(f"peak {format_bytes(peak_bytes)}\n({phase})", (px, py),
                xytext=(-10 if left else 10, 6), textcoords="offset points",
                ha="right" if left else "left", va="bottom", fontsize=9, zorder=5,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85))


def plot_timelines_side_by_side(leds, titles, path=None, x: str = "event", suptitle: str | None = None,
                                figsize=None):
    """One memory timeline per ledger, side by side on one shared y-axis (e.g. without vs with
    checkpointing), one legend below; a line under the title says when the ledgers differ in untouched bytes
    (untouched_note). Saves to `path` if given; returns the Figure."""
    leds, titles = list(leds), list(titles)
    if len(leds) != len(titles):
        raise ValueError("plot_timelines_side_by_side: give one title per ledger")
    n = len(leds)
    fig, axes = new_figure(1, n, figsize=figsize or (4.6 * n + 1.0, 4.4), sharey=True)
    axes = np.atleast_1d(axes)
    top = max(led.peak_bytes(untouched=True) for led in leds)
    unit = byte_unit(top)[1]
    ymax = top / unit_divisor(unit) * 1.22
    handles = {}
    for i, (ax, led, title) in enumerate(zip(axes, leds, titles)):
        info = plot_memory_timeline(ax, led, title=title, x=x, unit=unit, legend=False, ymax=ymax)
        for h in info["handles"]:
            handles[h.get_label()] = h
        if i:
            ax.set_ylabel("")
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=min(len(handles), 4),
               fontsize=8, frameon=False)
    note = untouched_note(leds, titles)
    if suptitle or note:
        fig.suptitle("\n".join(t for t in (suptitle, note) if t), **({"fontsize": 10} if note else {}))
    if path is not None:
        save(fig, path)
    return fig


# ---------------------------------------------------------------- lifetimes

def lifetime_rows(led, by: str = "layer") -> list[dict]:
    """Rows for plot_lifetimes: name, layer, nbytes, created, first_used, last_used, released (steps; None
    where it never happened), in forward order. by="layer" merges a layer's buffers, "buffer" keeps them."""
    rows: dict[str, dict] = {}
    for life in sorted(led.lifetimes(), key=lambda lf: (lf.created, lf.buffer)):
        key = life.layer if by == "layer" else life.name
        r = rows.get(key)
        if r is None:
            rows[key] = dict(name=key, layer=life.layer, nbytes=life.nbytes, created=life.created,
                             first_used=life.first_used, last_used=life.last_used, released=life.released, count=1)
            continue
        r["nbytes"] += life.nbytes
        r["count"] += 1
        r["created"] = min(r["created"], life.created)
        if life.first_used is not None:
            r["first_used"] = life.first_used if r["first_used"] is None else min(r["first_used"], life.first_used)
            r["last_used"] = life.last_used if r["last_used"] is None else max(r["last_used"], life.last_used)
        r["released"] = None if (r["released"] is None or life.released is None) else max(r["released"],
                                                                                         life.released)
    if by not in ("layer", "buffer"):
        raise ValueError(f"lifetime_rows: by must be 'layer' or 'buffer', got {by!r}")
    return list(rows.values())


def plot_lifetimes(ax, led, by: str = "layer", title: str | None = None, max_rows: int = 60,
                   legend: bool | str = True, names=None) -> list[dict]:
    """Gantt chart of saved activations: one row per layer (or per buffer), created -> idle -> used -> freed.

    Light: saved while the forward pass goes on; orange: the backward pass is running but has not
    reached it yet (the idle reservation checkpointing targets); green: read by backward until freed;
    grey: still held when the ledger stopped. x is the op step. `names` keeps only those rows.
    Returns the rows drawn (see lifetime_rows).
    """
    rows = lifetime_rows(led, by)
    if names is not None:
        keep = set(names)
        rows = [r for r in rows if r["name"] in keep]
    if len(rows) > max_rows:
        step = -(-len(rows) // max_rows)
        rows = rows[::step]
    passes = led.backward_passes()
    bw_start = passes[0][0] - 1 if passes else led.step
    end = led.step
    for i, r in enumerate(rows):
        for kind, a, b in _lifetime_segments(r, bw_start, end):
            if b > a:
                ax.barh(len(rows) - 1 - i, b - a, left=a, height=0.72, color=LIFETIME_COLORS[kind], lw=0)
    ax.axvline(bw_start, color="black", lw=0.8, ls="--")
    ax.text(bw_start, len(rows) - 0.3, " backward starts", fontsize=8, va="bottom", ha="left")
    ax.set_yticks(range(len(rows)))
    labels = [r["name"] for r in rows][::-1]
    ax.set_yticklabels(labels, fontsize=8 if len(rows) <= 30 else 6)
    ax.set_ylim(-0.6, len(rows) + 0.6)
    ax.set_xlim(0, end + 1)
    ax.set_xlabel("op step (forward ops, then backward ops)")
    ax.set_ylabel("saved by layer" if by == "layer" else "saved buffer")
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    if legend:
        kinds = ["waiting", "idle", "used"] + (["held"] if any(r["released"] is None for r in rows) else [])
        handles = [Patch(color=LIFETIME_COLORS[k], label=LIFETIME_LABELS[k]) for k in kinds]
        if legend == "below":
            ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=len(handles),
                      fontsize=8, frameon=False)
        else:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return rows


def _lifetime_segments(r: dict, bw_start: int, end: int) -> list[tuple[str, int, int]]:
    """(kind, from step, to step) of one lifetime row: waiting through the forward, idle in the backward until
    first read, used until freed, held if never freed."""
    created = r["created"]
    first = r["first_used"]
    freed = r["released"] if r["released"] is not None else None
    stop = freed if freed is not None else end
    idle_from = max(created, bw_start)
    segments = [("waiting", created, min(idle_from, first if first is not None else stop))]
    if first is not None:
        used_until = (freed if freed is not None else r["last_used"]) + 1
        segments += [("idle", idle_from, first), ("used", first, used_until)]
        if freed is None:
            segments.append(("held", r["last_used"] + 1, end))
    else:
        segments.append(("held", idle_from, end))
    return segments


# ---------------------------------------------------------------- saved-tensor breakdown

def saved_by_layer_and_op(led) -> dict[str, dict[str, int]]:
    """{layer: {op kind: bytes}} of everything the tape saved (each buffer once, under its first saver)."""
    out: dict[str, dict[str, int]] = {}
    for life in sorted(led.lifetimes(), key=lambda lf: (lf.created, lf.buffer)):
        per_op = out.setdefault(life.layer, {})
        per_op[life.op] = per_op.get(life.op, 0) + life.nbytes
    return out


def _stacking_order(breakdown: dict, order=None) -> list[str]:
    """The parts of a breakdown, bottom-up: `order`'s first (then the rest as met), else the largest first."""
    parts: list[str] = []
    for per_part in breakdown.values():
        parts += [k for k in per_part if k not in parts]
    if order is not None:
        return [k for k in order if k in parts] + [k for k in parts if k not in order]
    parts.sort(key=lambda k: -sum(b.get(k, 0) for b in breakdown.values()))
    return parts


def plot_saved_breakdown(ax, breakdown, title: str | None = None, unit: str | None = None,
                         legend: bool | str = True, xlabel: str = "layer", totals: bool = True,
                         normalize: bool = False, colors: dict | None = None, order=None,
                         legend_title: str = "op that saved it") -> dict:
    """Stacked bars of saved bytes: one bar per key of `breakdown` ({bar: {part: bytes}}, or a Ledger,
    read with saved_by_layer_and_op: parts are op kinds), stacked by part with fixed colors.

    normalize: bar heights are shares of each bar's total (%), the totals still printed in bytes.
    colors: {part: color} overriding OP_COLORS; order: the parts bottom-up (default: largest first).
    Returns {"unit": unit or "%"}.
    """
    if not isinstance(breakdown, dict):
        breakdown = saved_by_layer_and_op(breakdown)
    bars = list(breakdown)
    parts = _stacking_order(breakdown, order)
    sums = np.array([sum(breakdown[b].values()) for b in bars], dtype=float)
    if normalize:
        unit, scale = "%", np.where(sums > 0, 100.0 / np.maximum(sums, 1), 0.0)
    else:
        unit = unit or byte_unit(sums.max(initial=0))[1]
        scale = np.full(len(bars), 1.0 / unit_divisor(unit))
    colors = {**OP_COLORS, **(colors or {})}
    palette = iter(["#17BECF", "#BCBD22", "#7F7F7F", "#E377C2", "#9467BD", "#8C564B", "#1F77B4"])
    xs = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    handles = []
    for k in parts:
        vals = np.array([breakdown[b].get(k, 0) for b in bars], dtype=float) * scale
        color = colors.get(k) or next(palette, "#333333")
        ax.bar(xs, vals, bottom=bottom, color=color, width=0.7, lw=0)
        handles.append(Patch(color=color, label=k))
        bottom += vals
    if totals:  # each bar's total in bytes, on top of it
        for xi, top, total in zip(xs, bottom, sums):
            ax.text(xi, top, format_bytes(total), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    many = len(bars) > 8
    ax.set_xticklabels(bars, rotation=45 if many else 0, ha="right" if many else "center", fontsize=8)
    ax.set_ylim(0, max(bottom.max(initial=0), 1e-12) * (1.08 if normalize else 1.15))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of what is saved (%)" if normalize else f"saved for backward ({unit})")
    if title:
        ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    if legend:
        _parts_legend(ax, handles[::-1], below=legend == "below", title=legend_title)
    return {"unit": unit}


def _parts_legend(ax, handles, below: bool, title: str) -> None:
    """The stacked parts' legend, top part first: in rows under the axes, or in a column to their right."""
    if below:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=min(4, len(handles)),
                  fontsize=8, frameon=False)
    else:
        ax.legend(handles=handles, title=title, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                  title_fontsize=8, frameon=False)
