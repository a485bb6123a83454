"""Lesson 4: the ledger.

What you will see: one training step of a deep, narrow GPT recorded event by event. Memory over
time stacked by category, with the forward, backward and optimizer phases shaded and the peak
marked; the lifetime of every saved activation (saved -> idle -> read by backward -> freed), one
row per layer and one per buffer of layer 1; and the idle fraction of layer 1's activations: the
share of the backward pass that runs before backward reaches them. The seed says ~97% for 32
layers, i.e. (n - 1)/n; the ledger measures it for several depths. The step's summary table is
printed, and the whole step is exported as a Chrome trace (open it in chrome://tracing or Perfetto).

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): training reserves each layer's activations in forward and holds them idle until
backward reaches that layer: "for a 32-layer model, early-layer activations are idle for roughly 97%
of the backward pass". The ledger measures the reservation and the idle share.

Read: tinygrad_ckpt/memory/ledger.py (events, timeline, lifetimes: each one's idle_fraction,
summary, to_chrome_trace), tinygrad_ckpt/engine/tape.py (backward_steps: where saved arrays are released),
tinygrad_ckpt/memory/plots.py (plot_memory_timeline, plot_lifetimes).

Run: python lessons/04_the_ledger.py [--quick] [--out figures]
Figures: {out}/04_the_ledger_timeline.png, {out}/04_the_ledger_lifetimes.png,
{out}/04_the_ledger_idle.png; trace: {out}/04_the_ledger_trace.json.
Page: {out}/04_the_ledger_explorer.html (the same step in the interactive memory explorer:
open it in a browser).
"""

from __future__ import annotations

import time

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt.memory import plots

SLUG = "04_the_ledger"


def sizes(quick: bool) -> dict:
    base = dict(vocab=64, d_model=32, n_head=4, seq_len=32, batch=2)
    if quick:
        return dict(base, n_layer=8, depths=(2, 4, 8))
    return dict(base, n_layer=12, depths=(2, 4, 8, 16, 32))


def layer1_idle(led) -> dict:
    """When backward first reads any of layer 1's (transformer.h.0's) saved buffers, as a share of the backward pass."""
    lives = [lf for lf in led.lifetimes()
             if lf.layer == "transformer.h.0" and lf.idle_fraction is not None]
    first = min(lives, key=lambda lf: lf.first_used)
    weights = np.array([lf.nbytes for lf in lives], dtype=float)
    return dict(steps=first.idle_fraction, flops=first.idle_fraction_flops, first_reader=first.name,
                bytes_weighted=float(np.dot(weights, [lf.idle_fraction for lf in lives]) / weights.sum()),
                layer_bytes=int(weights.sum()))


def forward_backward(cfg: dict, n_layer: int):
    """Ledger of one forward + backward of an n_layer GPT (no optimizer: only backward matters here)."""
    model = C.make_gpt(cfg["vocab"], cfg["seq_len"], n_layer, cfg["n_head"], cfg["d_model"], seed=0)
    idx, targets = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    C.fresh()
    with tg.Ledger() as led:
        _, loss = model(idx, targets)
        loss.backward()
    return led


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    n = cfg["n_layer"]
    print("Lesson 4: the ledger")
    C.claim(__doc__)
    print(f"A deep, narrow GPT: {n} layers, d_model {cfg['d_model']}, {cfg['n_head']} heads, B={cfg['batch']}, "
          f"T={cfg['seq_len']}, vocabulary {cfg['vocab']}; one warm-up step, then one AdamW step under tg.Ledger().")
    model = C.make_gpt(cfg["vocab"], cfg["seq_len"], n, cfg["n_head"], cfg["d_model"], seed=0)
    idx, targets = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    led, loss = C.measured_step(model, idx, targets)

    C.heading("led.summary()")
    summary = led.summary()
    print(summary)
    tl = led.timeline()
    i = int(np.argmax(tl["total"]))
    passes = led.backward_passes()
    print(f"\n{len(led.events)} events; the peak, {C.format_bytes(led.peak_bytes())}, comes at event {i} during "
          f"{tl['phase'][i]}: params + AdamW + every layer's activations + the first gradients.")

    C.heading("Lifetimes of the saved activations, per layer (op steps)")
    rows_l = plots.lifetime_rows(led, by="layer")
    idle1 = layer1_idle(led)
    bw0, bw1 = passes[0]
    span = bw1 - bw0 + 1
    rows = []
    for r in rows_l:
        idle = (r["first_used"] - (bw0 - 1)) / span if r["first_used"] is not None else float("nan")
        rows.append((r["name"], r["count"], C.format_bytes(r["nbytes"]), r["created"], r["first_used"],
                     r["released"] if r["released"] is not None else "held", f"{idle:.0%}"))
    print(C.table(rows, ["layer", "buffers", "saved", "saved at", "first read", "freed at", "idle"]))
    print(f"backward runs from op step {bw0} to {bw1} ({span} backward ops). 'idle' is the share of those that "
          "ran before\nthe layer's first saved buffer was read. ('held': still referenced after backward, by "
          "the caller's arrays.)")
    expected = (n - 1) / n
    print(f"\nLayer 1 (transformer.h.0): {C.format_bytes(idle1['layer_bytes'])} saved; backward first reads it "
          f"({idle1['first_reader']}) after {idle1['steps']:.1%} of the backward ops\n"
          f"({idle1['flops']:.1%} of the backward FLOPs); byte-weighted over its buffers {idle1['bytes_weighted']:.1%}."
          f"\n(n-1)/n for n = {n}: {expected:.1%}. The rest of the difference is the head (lm_head, ln_f, "
          "cross-entropy),\nwhose backward runs first, and the embeddings, whose backward runs after layer 1's.")

    C.heading("Idle fraction of layer 1 against depth")
    sweep = []
    for depth in cfg["depths"]:
        r = idle1 if depth == n else layer1_idle(forward_backward(cfg, depth))  # reuse the step above
        sweep.append(dict(n_layer=depth, idle=r["steps"], idle_flops=r["flops"], expected=(depth - 1) / depth))
    print(C.table([(s["n_layer"], f"{s['idle']:.1%}", f"{s['idle_flops']:.1%}", f"{s['expected']:.1%}",
                    f"{s['idle'] - s['expected']:+.1%}") for s in sweep],
                  ["layers n", "idle (ops)", "idle (FLOPs)", "(n-1)/n", "ops - (n-1)/n"]))
    if any(s["n_layer"] == 32 for s in sweep):
        s32 = next(s for s in sweep if s["n_layer"] == 32)
        print(f"The seed's 32-layer claim, '~97%': measured {s32['idle']:.1%} of backward ops "
              f"({s32['idle_flops']:.1%} of backward FLOPs); 31/32 = {31 / 32:.1%}.")
    else:
        print("The seed's 32-layer claim (~97% = 31/32) is measured in the full run (without --quick).")

    # ---------------------------------------------------------------- figures and trace
    paths = []
    fig, ax = plots.new_figure(figsize=(11, 4.6))
    plots.plot_memory_timeline(ax, led, title=f"One training step of a GPT with {n} layers (d={cfg['d_model']}, "
                               f"B={cfg['batch']}, T={cfg['seq_len']}), stacked by category")
    paths.append(plots.save(fig, C.fig_path(out, f"{SLUG}_timeline.png")))

    layer_names = [r["name"] for r in rows_l]
    h0_rows = [r["name"] for r in plots.lifetime_rows(led, by="buffer")
               if r["layer"] == "transformer.h.0"]
    fig, axes = plots.new_figure(2, 1, figsize=(11, 3.2 + 0.22 * (len(layer_names) + len(h0_rows))), sharex=True,
                                 gridspec_kw=dict(height_ratios=[len(layer_names), len(h0_rows)]))
    plots.plot_lifetimes(axes[0], led, by="layer", title="Lifetimes of saved activations, one row per layer "
                         "(forward order, top to bottom)", names=layer_names)
    plots.plot_lifetimes(axes[1], led, by="buffer", title="Layer 1 (transformer.h.0), one row per saved buffer",
                         names=h0_rows, legend=False)
    axes[0].set_xlabel("")
    paths.append(plots.save(fig, C.fig_path(out, f"{SLUG}_lifetimes.png")))

    fig, ax = plots.new_figure(figsize=(8, 4.4))
    ns = np.array([s["n_layer"] for s in sweep])
    grid = np.linspace(ns.min(), max(ns.max(), 32), 200)
    ax.plot(grid, (grid - 1) / grid, color="gray", lw=1.5, label="(n - 1)/n")
    ax.plot(ns, [s["idle"] for s in sweep], "o-", color="#E07B39", label="measured: share of backward ops")
    ax.plot(ns, [s["idle_flops"] for s in sweep], "s--", color="#4C72B0", ms=5,
            label="measured: share of backward FLOPs")
    ax.plot([32], [0.97], "*", color="#C44E52", ms=14, label="seed: ~97% for 32 layers")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(ns.tolist()) | {32})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.yaxis.set_major_formatter(lambda val, _: f"{val:.0%}")
    ax.set_ylim(0.4, 1.02)
    ax.set_xlabel("number of layers n")
    ax.set_ylabel("backward done before layer 1 is read")
    ax.set_title("How long layer 1's activations sit idle during backward")
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(alpha=0.3)
    paths.append(plots.save(fig, C.fig_path(out, f"{SLUG}_idle.png")))

    trace_path = C.fig_path(out, f"{SLUG}_trace.json")
    trace = led.to_chrome_trace(trace_path)
    explorer = led.to_html(C.fig_path(out, f"{SLUG}_explorer.html"), labels=[f"one training step, {n} layers"])
    print(f"wrote {explorer} (open it in a browser: hover, click a layer, search, zoom)")
    print(f"\nwrote {paths[0]}\nwrote {paths[1]}\nwrote {paths[2]}")
    print(f"wrote {trace_path} ({len(trace['traceEvents'])} trace events: one slice per op, one memory counter "
          f"per event)  ({time.perf_counter() - t0:.1f} s)")
    return dict(n_layer=n, loss=loss, peak_bytes=led.peak_bytes(), peak_phase=str(tl["phase"][i]),
                n_events=len(led.events), backward=passes[0], summary=summary, idle_layer1=idle1["steps"],
                idle_layer1_flops=idle1["flops"], idle_layer1_bytes_weighted=idle1["bytes_weighted"],
                expected_idle=expected, sweep=sweep, layers=rows_l, trace=trace_path, figures=paths,
                explorer=explorer)


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"{r['n_layer']} layers: layer 1's activations sit idle for {r['idle_layer1']:.0%} of backward "
            f"((n-1)/n = {r['expected_idle']:.0%}; the chapter's ~97% is n = 32)",
            f"peak {C.format_bytes(r['peak_bytes'])} during {r['peak_phase']}; {r['n_events']:,} ledger events, "
            f"trace in {r['trace']}"]


if __name__ == "__main__":
    C.cli(main, __doc__)
