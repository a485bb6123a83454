"""What a graph keeps for backward, as a table (`print_saved`) and as a drawing (`draw_tape`).

    rows = tg.print_saved(F.gelu, x)      # one line per array the graph of gelu(x) saves
    tg.draw_tape(loss, "tape.png")        # loss.tape(): entries, their saves and bytes, edges

Both read only the tape entries of a tensor's graph (`tensor.tape()`), like JAX's
`print_saved_residuals` reads a jaxpr. A saved array is a *parameter* or an *input* when it is the
buffer of a leaf tensor (saving it costs nothing extra while that tensor lives), otherwise an
*activation*: an array the graph alone keeps alive. A buffer saved by several entries is listed each
time and counted once (`same_as`). A checkpoint entry keeps only its segment's inputs; the drawing
groups it with the ops its block ran and did not keep (replayed in backward).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from .. import backend
from ..engine.tensor import Tensor
from ..recompute.replay_check import Observations
from ..units import format_bytes


@dataclass(frozen=True)
class SavedArray:
    """One array a tape entry saved for backward."""

    entry: int  # index of the entry in tensor.tape()
    name: str  # the entry's scoped name, e.g. "h.0.mlp.gelu"
    op: str  # the entry's op kind
    saved: str  # the name the op saved it under (ctx.save(x=...))
    shape: tuple
    dtype: str
    nbytes: int  # bytes of the buffer behind it (a view counts its whole base)
    kind: str  # "parameter" | "input" (a leaf tensor's own buffer) | "activation"
    same_as: int | None  # index of an earlier row with the same buffer (then counted there), else None


def _tape_of(tensor, caller: str):
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{caller}: expected a Tensor (e.g. the loss), got {type(tensor).__name__}; pass the output "
                        "of the ops whose graph you want to see")
    tape = tensor.tape()
    if len(tape) == 0:
        why = ("it requires no grad: make an input with requires_grad=True, or leave tg.no_grad()"
               if not tensor.requires_grad else "it is a leaf tensor: pass a result of ops on it")
        raise ValueError(f"{caller}: tensor {tensor.name or ''!r} {list(tensor.shape)} has no graph ({why})")
    return tape


def _leaves(entries, inputs=()) -> dict:
    """id(buffer) -> (kind, name) for leaf tensors the entries read, and for `inputs`."""
    be, found = backend.current(), {}
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    tensors += [edge() for e in entries for edge in e.inputs if edge is not None and edge.is_leaf]
    for t in tensors:
        if t is not None and be.is_array(t.data):
            found[id(be.buffer(t.data)[0])] = ("parameter" if t.is_parameter else "input", t.name or "")
    return found


def saved_arrays(tensor, inputs=()) -> list[SavedArray]:
    """Every array `tensor`'s graph saves for backward, in tape order (entries already run by backward
    without retain_graph saved nothing anymore). `inputs`: tensors to call "input" even when they
    require no grad (the graph does not point at those)."""
    entries = _tape_of(tensor, "saved_arrays").entries
    be, leaves, first, rows = backend.current(), _leaves(entries, inputs), {}, []
    for i, entry in enumerate(entries):
        for key, a in entry.ctx.saved.items():
            if not be.is_array(a):
                continue
            owner, nbytes = be.buffer(a)
            kind = leaves.get(id(owner), ("activation", ""))[0]
            rows.append(SavedArray(i, entry.name, entry.op, key, tuple(a.shape), str(a.dtype), int(nbytes), kind,
                                   first.get(id(owner))))
            first.setdefault(id(owner), len(rows) - 1)
    return rows


def print_saved(fn, *args, **kwargs) -> list[SavedArray]:
    """Run fn(*args, **kwargs) and print every array its graph saves for backward: entry, scoped name,
    saved name, shape, dtype, bytes and whether it is a parameter, an input or a fresh activation.
    Returns the rows (`SavedArray`). fn must return a Tensor (or a tuple/list whose first item is one)."""
    if not callable(fn):
        raise TypeError(f"print_saved: fn must be callable, got {type(fn).__name__}: print_saved(fn, *args)")
    out = fn(*args, **kwargs)
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        out = out[0]
    if not isinstance(out, Tensor):
        raise TypeError(f"print_saved: {getattr(fn, '__name__', fn)!r} returned {type(out).__name__}, not a Tensor")
    rows = saved_arrays(out, inputs=[*args, *kwargs.values()])
    print(format_saved(rows))
    return rows


def format_saved(rows: list[SavedArray]) -> str:
    """The table print_saved prints, with a total of the bytes held beyond parameters."""
    table = [("entry", "name", "saved", "shape", "dtype", "bytes", "kind")]
    for r in rows:
        kind = r.kind if r.same_as is None else f"{r.kind} (= row {r.same_as})"
        table.append((f"#{r.entry}", r.name, r.saved, str(list(r.shape)), r.dtype, format_bytes(r.nbytes), kind))
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) if k != 5 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths))).rstrip()
             for row in table]
    fresh = sum(r.nbytes for r in rows if r.same_as is None and r.kind == "activation")
    held = sum(r.nbytes for r in rows if r.same_as is None and r.kind == "input")
    lines.append(f"{len(rows)} saved arrays: {format_bytes(fresh)} of activations, {format_bytes(held)} of inputs "
                 "kept alive, parameters by reference")
    return "\n".join(lines)


# ---- the drawing ------------------------------------------------------------------------------
KIND_COLORS = {"parameter": "#4C72B0", "input": "#A5A5A5", "activation": "#C44E52"}


def _interior(entry) -> list[str]:
    """For a checkpoint entry: one line per op its segment ran and will replay (and what it would have saved,
    as its replay check observed it)."""
    replay = getattr(entry.ctx, "replay", None)
    if replay is None:
        return []
    check = next((f for f in replay.features if isinstance(f, Observations)), None)
    if check is None:
        return [f"{name} [{kind}]" for name, kind, *_ in replay.segment.ops]
    lines = []
    for obs in check.observed:
        saves = ", ".join(f"{key} {list(shape)}" for key, shape, _, _ in obs.saves)
        lines.append(f"{obs.name} [{obs.op}]" + (f" would save {saves}" if saves else ""))
    return lines


def _graph(tensor):
    """(entries, per entry its rows, per entry its input edges as ("entry", i) | ("leaf", label))."""
    tape = _tape_of(tensor, "draw_tape")
    rows = saved_arrays(tensor)
    per_entry = [[r for r in rows if r.entry == i] for i in range(len(tape))]
    index = {e.seq: i for i, e in enumerate(tape)}
    edges = []
    for e in tape:
        ins = []
        for edge, meta in zip(e.inputs, e.in_meta):
            if edge is not None and not edge.is_leaf:
                ins.append(("entry", index[edge.entry.seq]))
            elif edge is not None:
                leaf = edge()
                ins.append(("leaf", f"{leaf.name if leaf is not None and leaf.name else 'leaf'} {list(meta[0])}"))
        edges.append(ins)
    return tape.entries, per_entry, edges


def _save_line(r: SavedArray) -> str:
    note = f" (= {r.kind} buffer)" if r.kind != "activation" else ""
    note = note if r.same_as is None else " (counted above)"
    return f"{r.saved} {list(r.shape)} {r.dtype} {format_bytes(r.nbytes)}{note}"


def draw_tape(tensor, path=None, engine: str = "auto", max_interior: int = 12):
    """Draw `tensor.tape()`: one box per entry (index, scoped name, op, each saved array with its shape
    and bytes, the leaf tensors it reads), arrows from the entries it reads, and each checkpoint entry as a group
    with the ops its block ran but did not keep. engine: "graphviz" (needs the `graphviz` package and
    the `dot` program), "matplotlib", or "auto" (graphviz when both are installed). Writes `path` if
    given (its suffix is the format: .png, .svg, .pdf). Returns the graphviz.Digraph or the matplotlib
    Figure (both display in a notebook)."""
    if engine not in ("auto", "graphviz", "matplotlib"):
        raise ValueError(f"draw_tape: engine must be 'auto', 'graphviz' or 'matplotlib', got {engine!r}")
    has_graphviz = _graphviz_available()
    if engine == "graphviz" and not has_graphviz:
        raise RuntimeError("draw_tape: engine='graphviz' needs the graphviz Python package and the `dot` program "
                           "(pip install graphviz; apt install graphviz); use engine='matplotlib' otherwise")
    entries, rows, edges = _graph(tensor)
    if engine == "graphviz" or (engine == "auto" and has_graphviz):
        return _draw_graphviz(entries, rows, edges, path, max_interior)
    return _draw_matplotlib(entries, rows, edges, path, max_interior)


def _graphviz_available() -> bool:
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def _title(i: int, entry) -> str:
    return f"#{i} {entry.name} [{entry.op}]"


def _shown(lines: list[str], most: int) -> list[str]:
    return lines if len(lines) <= most else lines[:most] + [f"... {len(lines) - most} more"]


def _draw_graphviz(entries, rows, edges, path, max_interior):
    import html

    import graphviz

    dot = graphviz.Digraph("tape", graph_attr={"rankdir": "TB", "fontname": "Helvetica", "fontsize": "11"},
                           node_attr={"fontname": "Helvetica", "fontsize": "10", "shape": "plain"})
    fresh = sum(r.nbytes for rs in rows for r in rs if r.same_as is None and r.kind != "parameter")
    dot.attr(label=f"{len(entries)} tape entries holding {format_bytes(fresh)} beyond the parameters. Saved arrays: "
                   "red = an activation, gray = an input's own buffer, blue = a parameter's own buffer; "
                   "'from': the leaf tensors an entry reads", labelloc="b")
    for i, entry in enumerate(entries):
        cells = [f'<tr><td align="left"><b>{html.escape(_title(i, entry))}</b></td></tr>']
        inputs = [source for kind, source in edges[i] if kind != "entry"]  # leaf tensors: named inside the entry, so
        if inputs:  # the parameters do not stand in one row across the top of the drawing
            cells.append(f'<tr><td align="left"><font color="#4C72B0">from {html.escape(", ".join(inputs))}'
                         "</font></td></tr>")
        cells += [f'<tr><td align="left"><font color="{KIND_COLORS[r.kind]}">{html.escape(_save_line(r))}</font>'
                  "</td></tr>" for r in rows[i]] or ['<tr><td align="left"><font color="gray">saves nothing</font>'
                                                     "</td></tr>"]
        label = f'<<table border="1" cellborder="0" cellspacing="2" bgcolor="white">{"".join(cells)}</table>>'
        interior = _interior(entry) if entry.op == "checkpoint" else []
        if interior:
            with dot.subgraph(name=f"cluster_{i}") as group:
                group.attr(label=f"checkpoint {entry.name}: replayed in backward", labelloc="t", style="dashed",
                           color="#2F4F4F")
                group.node(f"e{i}", label)
                inner = html.escape("\n".join(_shown(interior, max_interior))).replace("\n", '<br align="left"/>')
                group.node(f"e{i}_in", f'<<font color="gray">{inner}<br align="left"/></font>>', shape="note",
                           color="gray")
                group.edge(f"e{i}_in", f"e{i}", style="dotted", arrowhead="none")
        else:
            dot.node(f"e{i}", label)
        for kind, source in edges[i]:
            if kind == "entry":
                dot.edge(f"e{source}", f"e{i}")
    if path is not None:
        path = str(path)
        stem, _, fmt = path.rpartition(".")
        dot.render(outfile=path, format=fmt or "png", cleanup=True)
        _remove_source(stem)
    return dot


def _remove_source(stem: str) -> None:
    """graphviz writes the DOT source next to the image (as `stem`, or stem.gv); the image is what was asked for."""
    import os

    for candidate in (stem, stem + ".gv"):
        if os.path.isfile(candidate):
            os.remove(candidate)


def _box_lines(i: int, entry, rows, max_interior) -> tuple[list[str], list[str]]:
    """(lines, colors) of one entry's box: its title, what it saves (each colored by kind) and, for a checkpoint,
    what its replay runs."""
    lines, colors = [_title(i, entry)], ["black"]
    for r in rows:
        lines.append("  " + _save_line(r))
        colors.append(KIND_COLORS[r.kind])
    if not rows:
        lines.append("  saves nothing")
        colors.append("gray")
    if entry.op == "checkpoint":
        interior = _shown(_interior(entry), max_interior)
        lines += [f"  replayed in backward: {line}" if k == 0 else f"    {line}" for k, line in enumerate(interior)]
        colors += ["gray"] * len(interior)
    return lines, colors


def _draw_arcs(ax, edges, centers) -> None:
    """An arc right of the boxes from each producing entry to the entry that reads its output."""
    for i, ins in enumerate(edges):
        for kind, source in ins:
            if kind == "entry":
                bulge = 0.2 + 0.12 * min(i - source, 8)  # how far right of the boxes the arc reaches
                rad = bulge / (centers[i] - centers[source])
                ax.annotate("", xy=(9.8, centers[i]), xytext=(9.8, centers[source]),
                            arrowprops=dict(arrowstyle="->", color="gray", lw=0.8,
                                            connectionstyle=f"arc3,rad={-rad:.3f}"))


def _draw_matplotlib(entries, rows, edges, path, max_interior):
    from matplotlib.patches import FancyBboxPatch, Patch

    from . import plots

    blocks = [_box_lines(i, entry, rows[i], max_interior) for i, entry in enumerate(entries)]
    line_h, gap = 0.22, 0.25  # inches
    heights = [len(lines) * line_h + 0.15 for lines, _ in blocks]
    total = sum(heights) + gap * (len(blocks) + 1)
    fig, ax = plots.new_figure(figsize=(11, max(2.0, total)))
    ax.set_xlim(0, 11.2)
    ax.set_ylim(total, 0)
    ax.axis("off")
    y, centers = gap, []
    for i, ((lines, colors), h) in enumerate(zip(blocks, heights)):
        checkpoint = entries[i].op == "checkpoint"
        ax.add_patch(FancyBboxPatch((2.6, y), 7.2, h, boxstyle="round,pad=0.02",
                                    fc="#F2F5F2" if checkpoint else "white", ec="#2F4F4F" if checkpoint else "black",
                                    ls="--" if checkpoint else "-", lw=1))
        for k, (text, color) in enumerate(zip(lines, colors)):
            ax.text(2.7, y + 0.12 + (k + 0.5) * line_h, text, va="center", ha="left", color=color, family="monospace",
                    fontsize=8, fontweight="bold" if k == 0 else "normal")
        leaves = [source for kind, source in edges[i] if kind == "leaf"]
        if leaves:
            ax.text(2.5, y + 0.12 + 0.5 * line_h, "\n".join(_shown(leaves, 4)), va="top", ha="right", fontsize=7,
                    color="#555555")
        centers.append(y + 0.12 + 0.5 * line_h)
        y += h + gap
    _draw_arcs(ax, edges, centers)
    handles = [Patch(color=c, label=k) for k, c in KIND_COLORS.items()]
    ax.legend(handles=handles, loc="upper left", fontsize=8, title="saved array is", title_fontsize=8)
    if path is not None:
        plots.save(fig, str(path))
    return fig
