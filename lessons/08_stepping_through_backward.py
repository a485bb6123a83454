"""Lesson 8: stepping through backward, one tape entry at a time.

What you will see: a 2-block GPT whose block 0 runs plainly and whose block 1 is checkpointed. The
backward pass is a generator, `loss.backward_steps()`: it yields each tape entry just before that
entry's backward runs. The lesson drives it by hand and prints, for every step, the entry (index,
op, scoped name, shapes, what it saved) and the activation bytes the ledger counts before and
after. Plain entries free their saves as they go; the one `checkpoint` entry first replays block 1
(its ops appear in the ledger as phase "recompute", their saves as "recomputed"), so activations
rise inside that step before they fall. Then the exact pdb commands to watch the same thing
interactively, with `tg.debug.break_before("softmax")` or `--break checkpoint`.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): "every intermediate tensor produced during the forward pass gets retained in
memory until its gradient has been computed", as backward walks the graph in reverse. Watched here one
tape entry at a time, including a checkpoint entry that recomputes before it can free.

Read: tinygrad_ckpt/engine/tape.py (backward_steps: the whole backward loop), tinygrad_ckpt/debug.py
(break_before), tinygrad_ckpt/recompute/checkpoint.py (Checkpoint.input_grads: the replay into a private graph).

Run: python lessons/08_stepping_through_backward.py [--quick] [--out figures]
     python -m pdb lessons/08_stepping_through_backward.py --quick --break softmax   (interactive)
Figure: {out}/08_stepping_through_backward.png (live activation bytes per backward step, the
checkpoint replay marked).
"""

from __future__ import annotations

import argparse
import inspect
import time

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.recompute.checkpoint import Checkpoint
from tinygrad_ckpt.recompute.planner import Plan, Segment

SLUG = "08_stepping_through_backward"
CHECKPOINT_WIDTH = 6.0  # the checkpoint entry's step is drawn this many steps wide in the figure


def sizes(quick: bool) -> dict:
    # the same small model either way: the point is to read every step
    return dict(vocab=16, seq_len=8, batch=2, n_layer=2, n_head=2, d_model=16)


def replay_line() -> tuple[str, int]:
    """(file, line) in Checkpoint.input_grads just after the replay, where `outputs` hold the replayed graph."""
    lines, start = inspect.getsourcelines(Checkpoint.input_grads)
    path = inspect.getsourcefile(Checkpoint.input_grads)
    for i, line in enumerate(lines):
        if "replay.rerun(" in line:
            return path, start + i + 1
    return path, start


def pdb_recipes(line: int) -> dict[str, list[tuple[str, str, str]]]:
    """The pdb sessions section 3 prints, per --break pattern: (command, what it shows, a regular expression
    its output matches at --quick sizes). tests/test_pdb_recipes.py types them exactly as printed."""
    return {
        "softmax": [
            ("w", "where: inside Checkpoint.input_grads, block 1's softmax is REPLAYED", r"input_grads"),
            ("p entry", "the tape entry: op, scoped name, shapes, what it saved",
             r"transformer\.h\.1\.attn\.softmax \[softmax\]"),
            ("p entry.ctx", "what it kept for backward: its output only", r"saved=\{out: \[2, 2, 8, 8\] float32\}"),
            ("p [g.shape for g in grad_outs]", "the gradient arriving from the op above", r"\[\(2, 2, 8, 8\)\]"),
            ("p observers", "who watches this thread: the breakpoints and the ledger", r"Ledger \(recording\)"),
            ("p observers[1].live_bytes('activation')", "the ledger, counted now", r"^\d+"),
            ("n", "run this entry's backward (grad_ins = ... input_grads(...))", r"del grad_outs"),
            ("p [g.shape for g in grad_ins]", "what it returned: one gradient per input", r"\[\(2, 2, 8, 8\)\]"),
            ("c", "on to block 0's softmax, on the main tape", r"stopping before the backward of transformer\.h\.0"),
            ("p entry.name", "", r"'transformer\.h\.0\.attn\.softmax'"),
            ("c", "run to the end of the lesson", r"wrote "),
        ],
        "checkpoint": [
            ("p entry", "the checkpoint entry: it holds block 1", r"transformer\.h\.1\.checkpoint \[checkpoint\]"),
            ("p entry.ctx.saved.keys()", "what it kept: only the block's input", r"dict_keys\(\['input0'\]\)"),
            ("p entry.ctx.replay", "how backward will run block 1 again",
             r"<replay of transformer\.h\.1: 1 argument\(s\), its RNG state>"),
            ("s", "step into Checkpoint.input_grads", r"--Call--"),
            (f"b {line}", "a breakpoint just after the replay", rf"Breakpoint 1 at .*checkpoint\.py:{line}"),
            ("c", "the replay runs: its ops are the ledger's phase 'recompute'", r"input_grads\(\)"),
            ("p outputs[0].tape()", "the replayed graph: block 1's entries, each saving again",
             r"Tape with \d+ entries"),
            ("p [e.phase for e in state.local.observers[1].events[-3:]]", "the ledger's latest events", r"'recompute'"),
            ("c", "run to the end of the lesson", r"wrote "),
        ],
    }


def drive(model, batch, led) -> tuple[list[dict], dict]:
    """Run the forward, then the backward generator by hand, recording each step."""
    _, loss = model(*batch)
    tape = loss.tape()
    forward = dict(entries=len(tape.entries), activation=led.live_bytes("activation"),
                   events=len(led.events))
    steps: list[dict] = []
    for entry in loss.backward_steps():  # yields each entry just before its backward runs
        if steps:  # the previous entry's backward has run by now
            steps[-1].update(after=led.live_bytes("activation"), event_stop=len(led.events))
        steps.append(dict(index=tape.entries.index(entry), op=entry.op, name=entry.name, repr=repr(entry),
                          saved={k: (list(a.shape), str(a.dtype)) for k, a in entry.ctx.saved.items()
                                 if hasattr(a, "shape")},
                          before=led.live_bytes("activation"), event_start=len(led.events)))
    steps[-1].update(after=led.live_bytes("activation"), event_stop=len(led.events))
    del entry, tape, loss
    return steps, forward


def annotate_steps(steps: list[dict], led) -> None:
    """Per step: ops replayed, 'recomputed' saves, the highest activation bytes inside the step."""
    tl = led.timeline()
    for s in steps:
        events = led.events[s["event_start"]:s["event_stop"]]
        s["recompute_ops"] = sum(1 for e in events if e.action == "op" and e.phase == "recompute")
        recomputed = [e for e in events if e.action == "recomputed"]
        s["recomputed_saves"] = len(recomputed)
        s["recomputed_bytes"] = sum(e.nbytes for e in recomputed)
        s["recomputed_ops"] = [(e.scope, e.op) for e in recomputed]
        window = tl["activation"][s["event_start"]:s["event_stop"]]
        s["inside_peak"] = int(window.max()) if len(window) else s["before"]


def figure(steps: list[dict], led, path: str, cfg: dict) -> None:
    """Live activation (and gradient) bytes at every ledger event of the backward, grouped by step;
    the checkpoint entry's step is drawn wider, since its replay happens inside it."""
    tl = led.timeline()
    widths = [CHECKPOINT_WIDTH if s["op"] == "checkpoint" else 1.0 for s in steps]
    lefts = np.r_[0.0, np.cumsum(widths)[:-1]]
    xs, act, grad = [], [], []
    for s, left, w in zip(steps, lefts, widths):
        start, stop = s["event_start"], s["event_stop"]
        n = max(stop - start, 1)
        xs += [left] + [left + w * (j - start + 1) / n for j in range(start, stop)]
        act += [s["before"]] + list(tl["activation"][start:stop])
        grad += [int(tl["gradient"][start - 1]) if start else 0] + list(tl["gradient"][start:stop])
    xs, act, grad = np.array(xs), np.array(act), np.array(grad)
    unit = plots.byte_unit(max(act.max(), grad.max()))[1]
    div = plots.unit_divisor(unit)
    fig, ax = plots.new_figure(figsize=(13, 5.4))
    for s, left, w in zip(steps, lefts, widths):
        if s["op"] == "checkpoint":
            ax.axvspan(left, left + w, color=plots.PHASE_COLORS["recompute"], lw=0, zorder=0)
            ax.annotate(f"{s['name']} (#{s['index']}): replays block 1\n({s['recompute_ops']} ops in phase "
                        f"\"recompute\",\n{s['recomputed_saves']} \"recomputed\" saves), then runs\n"
                        "the replay's backward",
                        (left + w / 2, s["inside_peak"] / div), xytext=(0.3, 0.96), textcoords="axes fraction",
                        fontsize=8, va="top", arrowprops=dict(arrowstyle="-", color="grey", lw=0.8),
                        bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="none", alpha=0.9))
    ax.fill_between(xs, 0, act / div, step="post", color=plots.CATEGORY_COLORS["activation"], alpha=0.85, lw=0,
                    label="activations (saved for backward)")
    ax.step(xs, grad / div, where="post", color=plots.CATEGORY_COLORS["gradient"], lw=1.4,
            label="gradients (parameters' and in flight)")
    ax.set_xlim(0, lefts[-1] + widths[-1])
    ax.set_ylim(0, max(act.max(), grad.max()) / div * 1.6)  # room above the curves for the checkpoint's note
    ax.set_xticks(lefts + np.array(widths) / 2)
    ax.set_xticklabels([f"#{s['index']} {s['name']}" for s in steps], rotation=90, fontsize=7)
    for left in lefts[1:]:
        ax.axvline(left, color="white", lw=0.5, zorder=1)
    ax.set_xlabel("backward step: one tape entry each, in the order backward_steps() yields them "
                  f"(the checkpoint's step drawn {CHECKPOINT_WIDTH:g}× wider)")
    ax.set_ylabel(f"live bytes ({unit})")
    ax.set_title(f"Stepping through backward: a {cfg['n_layer']}-block GPT, block 0 plain, block 1 checkpointed",
                 fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    plots.save(fig, path)


def main(quick: bool = False, out: str = "figures", break_at: str | None = None) -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    print("Lesson 8: stepping through backward")
    C.claim(__doc__)
    print(f"A GPT with {cfg['n_layer']} blocks (d_model {cfg['d_model']}, {cfg['n_head']} heads, B={cfg['batch']}, "
          f"T={cfg['seq_len']}), run with a planner Plan: block 0 plain, block 1 checkpointed.")
    plan = Plan([Segment(0, 1), Segment(1, 2, checkpoint=True)])
    tg.manual_seed(0)
    model = nn.GPT(cfg["vocab"], cfg["seq_len"], cfg["n_layer"], cfg["n_head"], cfg["d_model"], checkpoint=plan)
    batch = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    if break_at:
        tg.debug.break_before(break_at)
        print(f"tg.debug.break_before({break_at!r}): pdb opens before each matching entry's backward.")
    C.fresh()
    try:
        with tg.Ledger() as led:
            steps, forward = drive(model, batch, led)
    finally:
        if break_at:
            tg.debug.clear_breakpoints()
    annotate_steps(steps, led)

    C.heading("1. After the forward")
    print(f"the tape holds {forward['entries']} entries; the ledger counts {C.format_bytes(forward['activation'])} of "
          "activations (arrays saved for backward).")
    print("Block 1 is a single entry, op \"checkpoint\": it saved only the block's input.")

    C.heading("2. The backward, one step at a time: for entry in loss.backward_steps(): ...")
    print("Each step: the entry as it prints (before its backward runs), then the activation bytes the ledger "
          "counts\nbefore the step and after its backward ran and its saves were released. A buffer saved by "
          "several entries\n(an output the next op keeps too) counts once, and goes when its last holder lets it "
          "go: a step shows +0 B\nwhen another entry still holds what it saved, and the last holder's step shows "
          "the whole buffer.")
    for s in steps:
        print(f"#{s['index']} {s['repr']}")
        change = s["after"] - s["before"]
        sign = "+" if change >= 0 else "-"
        fb = C.format_bytes
        line = f"    activations {fb(s['before'])} -> {fb(s['after'])} ({sign}{fb(abs(change))})"
        if s["recompute_ops"]:
            line += (f"; inside the step: {s['recompute_ops']} ops replayed (phase \"recompute\"), "
                     f"{s['recomputed_saves']} \"recomputed\" saves ({fb(s['recomputed_bytes'])}), activations up to "
                     f"{fb(s['inside_peak'])}")
        print(line)
    ck = next(s for s in steps if s["op"] == "checkpoint")
    soft = next(s for s in steps if s["op"] == "softmax")
    freed_by_plain = [s["before"] - s["after"] for s in steps if s["op"] != "checkpoint"]
    names = list(dict.fromkeys(f"{scope}.{op}" if scope else op for scope, op in ck["recomputed_ops"]))
    print(f"\nThe softmax entry {soft['name']} (#{soft['index']}) saved {soft['saved']}: its backward reads the "
          "output, then releases it.")
    print(f"The checkpoint entry {ck['name']} (#{ck['index']}) saved {ck['saved']}: when it runs, it replays block 1 "
          f"into a private\ngraph ({ck['recompute_ops']} ops, each saving again: {', '.join(names[:4])}, ...), "
          f"backpropagates through it and drops it.\nActivations went {C.format_bytes(ck['before'])} -> "
          f"{C.format_bytes(ck['inside_peak'])} "
          f"(inside the replay) -> {C.format_bytes(ck['after'])} in that one step; every plain step only frees "
          f"(largest: {C.format_bytes(max(freed_by_plain))}).")
    replays_elsewhere = sum(s["recompute_ops"] for s in steps if s["op"] != "checkpoint")
    print(f"Recompute ops outside the checkpoint's step: {replays_elsewhere}. Activations left after the last step: "
          f"{C.format_bytes(steps[-1]['after'])}.")

    C.heading("3. The same in pdb")
    path, line = replay_line()
    for pattern, recipe in pdb_recipes(line).items():
        print(f"python lessons/{SLUG}.py --quick --break {pattern}")
        for cmd, what, _ in recipe:
            print(f"  (Pdb) {cmd:<52} # {what}")
    print("q at any stop ends the program. Without this lesson: tg.debug.break_before('softmax') in code, or "
          "TINYGRAD_CKPT_BREAK=softmax\nin the environment; a pattern is an op kind or whole dotted parts of a "
          "scoped name ('transformer.h.1.attn', not 'h.1' for h.10).")

    fig_path = C.fig_path(out, f"{SLUG}.png")
    figure(steps, led, fig_path, cfg)
    elapsed = time.perf_counter() - t0
    print(f"\nwrote {fig_path}  ({elapsed:.1f} s)")
    return dict(
        config=cfg,
        forward_entries=forward["entries"],
        forward_activation=forward["activation"],
        steps=[{k: v for k, v in s.items() if k != "recomputed_ops"} for s in steps],
        n_steps=len(steps),
        checkpoint_step=ck["index"],
        checkpoint_saved=list(ck["saved"]),
        checkpoint_recompute_ops=ck["recompute_ops"],
        checkpoint_recomputed_saves=ck["recomputed_saves"],
        checkpoint_before=ck["before"],
        checkpoint_inside_peak=ck["inside_peak"],
        checkpoint_after=ck["after"],
        recompute_ops_elsewhere=replays_elsewhere,
        softmax_saved=list(soft["saved"]),
        final_activation=steps[-1]["after"],
        total_recompute_ops=sum(1 for op in led.ops if op["phase"] == "recompute"),
        pdb_breakpoint=f"{path}:{line}",
        figures=[fig_path],
        seconds=elapsed,
    )


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"{r['n_steps']} backward steps; the checkpoint step replays {r['checkpoint_recompute_ops']} ops, "
            f"activations {C.format_bytes(r['checkpoint_before'])} -> {C.format_bytes(r['checkpoint_inside_peak'])}"
            f" -> {C.format_bytes(r['checkpoint_after'])} inside it",
            f"pdb: python lessons/{SLUG}.py --quick --break softmax (recipes printed by the lesson)"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (the same here)")
    parser.add_argument("--out", default=None, help="folder for the figure (default: figures/, or a scratch "
                                                    "folder with --quick)")
    parser.add_argument("--break", dest="break_at", default=None, metavar="PATTERN",
                        help="open pdb before the backward of entries matching PATTERN (e.g. softmax, checkpoint)")
    args = parser.parse_args()
    main(quick=args.quick, out=C.output_folder(args.out, args.quick), break_at=args.break_at)
