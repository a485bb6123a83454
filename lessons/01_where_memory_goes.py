"""Lesson 1: where training memory goes.

What you will see: one full training step of a small GPT (forward, backward, AdamW step), every
buffer counted by the ledger into parameters, optimizer states, gradients and activations (the
arrays the tape saves for backward), plus "other" (inputs, outputs, temporaries). The step is run
for growing batch sizes and sequence lengths: the training state (parameters, gradients, AdamW's
two moments: 16 bytes per parameter in float32) stays put while activations grow with B and
faster than linearly with T, until they are most of the peak.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): training memory splits into parameters, optimizer states, gradients and activations, and
once batches are large or sequences long, the activations are the biggest of the four.

Read: tinygrad_ckpt/memory/ledger.py (Ledger: how buffers are counted, CATEGORIES, timeline),
tinygrad_ckpt/optim.py (AdamW's m and v, allocated on the first step), tinygrad_ckpt/nn/__init__.py (GPT),
tinygrad_ckpt/scale/estimate.py (gpt_parameter_count, training_state_terms).

Run: python lessons/01_where_memory_goes.py [--quick] [--out figures]
Figures: {out}/01_where_memory_goes_split.png (what is live at the peak, per config) and
{out}/01_where_memory_goes_timeline.png (memory over one step, smallest and largest config).
"""

from __future__ import annotations

import time

import _common as C
import numpy as np

from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.ledger import CATEGORIES
from tinygrad_ckpt.scale import estimate

SLUG = "01_where_memory_goes"


def sizes(quick: bool) -> dict:
    if quick:
        return dict(vocab=256, d_model=64, n_head=4, n_layer=2,
                    batch_series=dict(seq_len=32, batches=(1, 4, 16)),
                    seq_series=dict(batch=2, seq_lens=(16, 64, 128)))
    return dict(vocab=512, d_model=128, n_head=4, n_layer=4,
                batch_series=dict(seq_len=64, batches=(1, 4, 16, 32)),
                seq_series=dict(batch=2, seq_lens=(32, 128, 256, 512)))


def measure(cfg: dict, batch: int, seq_len: int) -> dict:
    """One steady-state training step under the ledger; what is live at the peak, and each category's peak."""
    block_size = max(cfg["seq_series"]["seq_lens"] + (cfg["batch_series"]["seq_len"],))  # same model everywhere
    model = C.make_gpt(cfg["vocab"], block_size, cfg["n_layer"], cfg["n_head"], cfg["d_model"], seed=0)
    idx, targets = C.token_batch(cfg["vocab"], batch, seq_len, seed=1)
    led, loss = C.measured_step(model, idx, targets)
    tl = led.timeline()
    i = int(np.argmax(tl["total"]))
    shape = estimate.GPTShape(cfg["n_layer"], cfg["d_model"], cfg["n_head"], seq_len, batch,
                              vocab_size=cfg["vocab"], block_size=block_size)
    return dict(
        label=f"B={batch}, T={seq_len}", batch=batch, seq_len=seq_len, loss=loss, led=led,
        at_peak={c: int(tl[c][i]) for c in CATEGORIES}, peak=int(tl["total"][i]), peak_phase=str(tl["phase"][i]),
        peak_moment=moment(led, int(tl["step"][i]), str(tl["phase"][i])),
        peaks={c: led.peak_bytes(c) for c in CATEGORIES},
        n_params=estimate.gpt_parameter_count(shape),
        block_activation_estimate=cfg["n_layer"] * estimate.engine_activation_bytes_per_layer(shape),
    )


def moment(led, step: int, phase: str) -> str:
    """Where in the step a peak falls: "start of backward", "40% into backward", "end of backward", ..."""
    if phase != "backward":
        return phase
    start, end = next((a, b) for a, b in led.backward_passes() if a - 1 <= step <= b)
    done = (step - start + 1) / (end - start + 1)
    return "start of backward" if done < 0.05 else "end of backward" if done > 0.95 else f"{done:.0%} into backward"


def split_figure(batch_runs, seq_runs, path) -> None:
    fig, axes = plots.new_figure(1, 2, figsize=(11, 4.6))
    shown = [c for c in CATEGORIES if any(r["at_peak"][c] for r in batch_runs + seq_runs)]
    for ax, runs, title, xlabel in (
        (axes[0], batch_runs, f"batch grows (T = {batch_runs[0]['seq_len']})", "batch size B"),
        (axes[1], seq_runs, f"sequence grows (B = {seq_runs[0]['batch']})", "sequence length T"),
    ):
        unit = plots.byte_unit(max(r["peak"] for r in runs))[1]
        div = plots.unit_divisor(unit)
        xs = np.arange(len(runs))
        bottom = np.zeros(len(runs))
        for c in shown:
            vals = np.array([r["at_peak"][c] for r in runs]) / div
            ax.bar(xs, vals, bottom=bottom, color=plots.CATEGORY_COLORS[c], width=0.65,
                   label=plots.CATEGORY_LABELS[c])
            bottom += vals
        for x, r, top in zip(xs, runs, bottom):
            share = r["at_peak"]["activation"] / r["peak"]
            ax.text(x, top, f"{C.format_bytes(r['peak'])}\n{share:.0%} activations", ha="center",
                    va="bottom", fontsize=8)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(r["batch"] if runs is batch_runs else r["seq_len"]) for r in runs])
        ax.set_ylim(0, bottom.max() * 1.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"live at the step's peak ({unit})")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle("What is live at the peak of one training step (forward, backward, AdamW step)")
    plots.save(fig, path)


def timeline_figure(small, large, path) -> None:
    fig, axes = plots.new_figure(1, 2, figsize=(12, 4.6))
    handles = {}
    for ax, r in zip(axes, (small, large)):
        top = max(r["at_peak"], key=r["at_peak"].get)
        info = plots.plot_memory_timeline(ax, r["led"], title=f"{r['label']}: {plots.CATEGORY_LABELS[top]} "
                                          "largest at the peak", legend=False)
        ax.title.set_fontsize(10)
        handles.update({h.get_label(): h for h in info["handles"]})
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("Memory over one training step, stacked by category")
    plots.save(fig, path)


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    print("Lesson 1: where training memory goes")
    C.claim(__doc__)
    print(f"A GPT with {cfg['n_layer']} layers, d_model {cfg['d_model']}, {cfg['n_head']} heads, vocabulary "
          f"{cfg['vocab']}, float32, trained with AdamW. Each configuration runs one warm-up step (AdamW\n"
          "allocates its moments on the first step), then one steady-state step under tg.Ledger():\n"
          "forward, backward, optimizer step, zero_grad.")

    bs, ss = cfg["batch_series"], cfg["seq_series"]
    batch_runs = [measure(cfg, b, bs["seq_len"]) for b in bs["batches"]]
    seq_runs = [measure(cfg, ss["batch"], t) for t in ss["seq_lens"]]

    first = batch_runs[0]
    P = first["n_params"]
    C.heading("The training state, measured against the formula")
    print(f"parameters: P = {P:,} (estimate.gpt_parameter_count, nanoGPT layout, lm_head tied to wte)")
    rows = [
        ("parameters", C.format_bytes(first["peaks"]["parameter"]), f"{first['peaks']['parameter'] / P:.1f}",
         "4 B/param (float32)"),
        ("AdamW m and v", C.format_bytes(first["peaks"]["optimizer"]), f"{first['peaks']['optimizer'] / P:.1f}",
         "2 × 4 B/param"),
        ("gradients (peak)", C.format_bytes(first["peaks"]["gradient"]), f"{first['peaks']['gradient'] / P:.1f}",
         "4 B/param + gradients of activations in flight"),
    ]
    print(C.table(rows, ["category", "ledger", "bytes/param", "expected"], ["<", ">", ">", "<"]))

    C.heading("What is live at the peak of the step")
    rows = []
    for r in batch_runs + seq_runs:
        a = r["at_peak"]
        rows.append((r["label"], *(C.format_bytes(a[c]) for c in ("parameter", "optimizer", "gradient",
                                                                   "activation", "other")),
                     C.format_bytes(r["peak"]), r["peak_moment"], f"{a['activation'] / r['peak']:.0%}"))
    print(C.table(rows, ["config", "params", "AdamW", "grads", "activations", "other", "peak", "when",
                         "act. share"]))
    print("\nThe peak moves. With little data it is the END of backward: every activation is freed by then and\n"
          "every gradient alive (the tied wte/lm_head weight briefly twice, while its two gradients are summed),\n"
          "so activations show 0 B there. With more data it comes EARLY in backward, when the activations are\n"
          "still alive and few gradients exist (the logits' first): the grads column is what is alive at that moment,\n"
          f"not the gradients' own peak ({C.format_bytes(first['peaks']['gradient'])} in every configuration).")

    C.heading("Activations as B and T grow (peak of the activation category)")
    for runs, key in ((batch_runs, "batch"), (seq_runs, "seq_len")):
        prev = None
        for r in runs:
            act = r["peaks"]["activation"]
            note = ""
            if prev is not None:
                note = (f"   {key} ×{r[key] / prev[key]:.0f} -> activations ×"
                        f"{act / prev['peaks']['activation']:.2f}")
            print(f"  {r['label']:<14} {C.format_bytes(act):>10}  (blocks alone, estimate: "
                  f"{C.format_bytes(r['block_activation_estimate'])}){note}")
            prev = r
    small, large = batch_runs[0], max(batch_runs + seq_runs, key=lambda r: r["peak"])

    def state(r):
        return sum(r["at_peak"][c] for c in ("parameter", "optimizer", "gradient"))

    print()
    print(f"At {small['label']} the training state (params + AdamW + grads) is {state(small) / small['peak']:.0%} "
          f"of the peak and activations {small['at_peak']['activation'] / small['peak']:.0%}.")
    print(f"At {large['label']} activations are {large['at_peak']['activation'] / large['peak']:.0%} of a "
          f"{C.format_bytes(large['peak'])} peak, reached during {large['peak_phase']}: activations dominate.")
    print("Activations grow linearly with B; with T they grow faster than linearly (attention's [B, H, T, T]\n"
          "softmax output, lesson 3). The training state does not depend on B or T at all.")

    split_path = C.fig_path(out, f"{SLUG}_split.png")
    timeline_path = C.fig_path(out, f"{SLUG}_timeline.png")
    split_figure(batch_runs, seq_runs, split_path)
    timeline_figure(small, large, timeline_path)
    print(f"\nwrote {split_path}\nwrote {timeline_path}  ({time.perf_counter() - t0:.1f} s)")

    def pack(r):
        return {k: r[k] for k in ("label", "batch", "seq_len", "at_peak", "peak", "peak_phase", "peak_moment",
                                  "peaks", "block_activation_estimate")}

    return dict(
        n_params=P,
        param_bytes=first["peaks"]["parameter"],
        optimizer_bytes=first["peaks"]["optimizer"],
        gradient_peak_bytes=first["peaks"]["gradient"],
        batch_runs=[pack(r) for r in batch_runs],
        seq_runs=[pack(r) for r in seq_runs],
        smallest=pack(small),
        largest=pack(large),
        largest_activation_share=large["at_peak"]["activation"] / large["peak"],
        smallest_state_share=state(small) / small["peak"],
        figures=[split_path, timeline_path],
    )


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    small, large = r["smallest"], r["largest"]
    return [f"training state: {C.format_bytes(r['param_bytes'] + r['optimizer_bytes'])} for {r['n_params']:,} "
            "parameters (4 B + 8 B AdamW each), whatever B and T",
            f"{small['label']}: activations {small['at_peak']['activation'] / small['peak']:.0%} of the peak; "
            f"{large['label']}: {r['largest_activation_share']:.0%} of a {C.format_bytes(large['peak'])} peak"]


if __name__ == "__main__":
    C.cli(main, __doc__)
