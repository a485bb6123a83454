"""Lesson 12: when one GPU is not enough.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): a 7B model with Adam "simply cannot fit in a single 80 GB A100" once its
activations (the chapter's "64 GB") are counted; lesson 9 shows checkpointing alone does not rescue it.
Measured here: what splitting it over 8 GPUs leaves on each.

What this lesson adds: the seed's 7B model, which no checkpointing plan fits into one 80 GB GPU (lesson 9),
fits on each of 8 GPUs with 8-way tensor parallelism, and sequence parallelism and selective recomputation cut
each device's activations exactly as Korthikanti et al. 2022 (Table 2) say: sbh(10 + 24/t + 5as/(ht)) per
layer with tensor parallelism alone, (sbh/t)(34 + 5as/h) with sequence parallelism, 34·sbh/t with both and
selective recomputation, plus the terms this engine keeps and the paper does not (named and measured below).

What you will see: one device's share of the model (Megatron's column- and row-parallel linears: 4 of the 32
heads and 2048 of the 16384 hidden units of each MLP; the vocabulary split 8 ways) trained for one step on the
shape-only meta backend, under six plans: tensor parallelism alone, with sequence parallelism, with selective
recomputation, with both, and with full recomputation (every layer) without and with sequence parallelism.
For each, the ledger's per-device parameters, gradients, AdamW states (float32, as the seed), activations and
total peak, with a fits / does-not-fit verdict at 80 GB; one layer's saves against Table 2, term by term; and,
since at the seed's batch of 4 every plan fits, the largest batch each plan fits into 80 GB per device.

Which run these numbers describe: one device of a Megatron-style split, as this engine runs it: float16
weights, activations and gradients (no autocast, no float32 master copy or main gradients), AdamW's m and v in
float32, explicit attention, this engine's saves (set beside the paper's term by term), allocated bytes (no
allocator reserve, no communication buffers). `tinygrad-ckpt estimate --precision mixed-bf16 --attention flash
--saves megatron` takes the same split as Megatron runs it (lesson 14).

Read: tinygrad_ckpt/scale/parallel.py (the sharded modules and the collectives as one device sees them),
tinygrad_ckpt/scale/measure.py (ParallelStep), tinygrad_ckpt/scale/estimate.py (korthikanti_parallel_terms),
tinygrad_ckpt/scale/report.py (compare_layer; `tinygrad-ckpt estimate --tensor-parallel 8 --sequence-parallel`).

Run: python lessons/12_when_one_gpu_is_not_enough.py [--quick] [--out figures]
(--quick: 4 of the 32 layers, everything else as the seed.)
Figure: {out}/12_when_one_gpu_is_not_enough.png (each plan's per-device peak, split by category, against 80 GB).
"""

from __future__ import annotations

import _common as C
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.ledger import CATEGORIES
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale import report
from tinygrad_ckpt.scale.measure import ParallelStep
from tinygrad_ckpt.scale.parallel import Parallelism

SLUG = "12_when_one_gpu_is_not_enough"
GB = 10**9
CAPACITY = 80 * GB
T_PARALLEL = 8
PLANS = {  # label: (sequence parallel, checkpoint)
    "TP": (False, None), "TP + SP": (True, None), "TP + selective": (False, "selective"),
    "TP + SP + selective": (True, "selective"), "TP + full recompute": (False, "every_layer"),
    "TP + SP + full recompute": (True, "every_layer"),
}


def seed_shape(quick: bool) -> est.GPTShape:
    return est.GPTShape(n_layer=4 if quick else 32, d_model=4096, n_head=32, seq_len=2048, batch=4,
                        vocab_size=32000, dtype="float16", dropout=0.1)


def main(quick: bool = False, out: str = "figures") -> dict:
    shape = seed_shape(quick)
    s, b, h, a, L = shape.seq_len, shape.batch, shape.d_model, shape.n_head, shape.n_layer
    print("Lesson 12: when one GPU is not enough")
    C.claim(__doc__)
    print(f"The seed's model: {L} layers{' (--quick: 4 of 32)' if quick else ''}, d = {h}, {a} heads, T = {s}, "
          f"B = {b}, float16, dropout {shape.dropout} (the paper assumes dropout), AdamW with float32 m and v;\n"
          f"on 8 GPUs with {T_PARALLEL}-way tensor parallelism, measured for one device on the meta backend.\n"
          "The run is this engine's own: float16 throughout (no float32 master weights or main gradients), explicit "
          "attention, this\nengine's saves, allocated bytes (`estimate --precision mixed-bf16 --attention flash "
          "--saves megatron` for Megatron's).")

    C.heading("1. Each plan, per device")
    runs, rows = {}, []
    for label, (sp, ckpt) in PLANS.items():
        par = Parallelism(tensor=T_PARALLEL, sequence=sp)
        step = ParallelStep(shape, par)
        led, seconds = step.measure(ckpt)
        tl = led.timeline()
        i = int(np.argmax(tl["total"]))
        comparison = report.compare_layer(led, shape, par, ckpt == "selective") if ckpt != "every_layer" else None
        runs[label] = dict(peak=led.peak_bytes(), at_peak={c: int(tl[c][i]) for c in CATEGORIES},
                           category_peaks={c: led.peak_bytes(c) for c in CATEGORIES}, seconds=seconds,
                           comparison=comparison, fits=led.peak_bytes() <= CAPACITY)
        del step, led
        cp = runs[label]["category_peaks"]
        rows.append((label, *(C.format_bytes(cp[c], True) for c in ("parameter", "gradient", "optimizer",
                                                                   "activation")),
                     C.format_bytes(runs[label]["peak"], True), "fits" if runs[label]["fits"] else "NO"))
    print(C.table(rows, ["plan (t = 8)", "parameters", "gradients", "AdamW m, v", "activations", "peak",
                         "80 GB?"]))

    C.heading("2. One layer's activations against Korthikanti et al. 2022, Table 2")
    rows = []
    for label, run in runs.items():
        c = run["comparison"]
        if c is None:
            continue
        extra = "; ".join(f"{lbl} {n:+,}" for lbl, n, _ in c.explained if n)
        rows.append((label, c.formula_text, f"{c.formula:,}", f"{c.measured:,}", extra, f"{c.unexplained:+,}"))
    print(C.table(rows, ["plan", "Table 2", "formula (B)", "measured (B)", "named differences", "left"]))
    print("(each named difference is measured from the ledger: 'layer norms' is what this engine's layer norms keep\n"
          "(the normalised input and a 1/std per token) minus the paper's layer-norm inputs; 'causal mask' the bool\n"
          "[T, T] mask the paper's attention does not keep; 'dropout masks' the engine's masks minus the paper's\n"
          "1 byte an element; and, with selective recomputation but without sequence parallelism, the block input\n"
          "the checkpoint keeps whole where the paper counts c_proj's input split by t)")
    tp = runs["TP"]["category_peaks"]["activation"]
    for label in ("TP + SP", "TP + selective", "TP + SP + selective"):
        act = runs[label]["category_peaks"]["activation"]
        print(f"{label}: activations {C.format_bytes(act, True)}, {act / tp:.0%} of tensor parallelism alone")
    fits = [label for label, r in runs.items() if r["fits"]]
    print(f"\nfit 80 GB per device at B = {b}: {', '.join(fits) if fits else 'none'}"
          + (f"; do not: {', '.join(lbl for lbl in runs if lbl not in fits)}" if len(fits) < len(runs) else ""))

    C.heading("3. How large a batch each plan fits in 80 GB per device")
    batches = (4, 8, 16) if quick else (4, 8, 16, 32, 64)
    largest, rows = {}, []
    for label, (sp, ckpt) in PLANS.items():
        peaks = {}
        for batch in batches:
            sized = est.GPTShape(**{**vars(shape), "batch": batch})
            step = ParallelStep(sized, Parallelism(tensor=T_PARALLEL, sequence=sp))
            peaks[batch] = step.measure(ckpt)[0].peak_bytes()
            del step
            if peaks[batch] > CAPACITY:
                break
        fitting = [bb for bb, pk in peaks.items() if pk <= CAPACITY]
        largest[label] = max(fitting) if fitting else None
        rows.append((label, *(C.format_bytes(peaks[bb], True) if bb in peaks else "" for bb in batches),
                     largest[label] if largest[label] is not None else "none"))
    print(C.table(rows, ["plan (t = 8)", *(f"B = {bb}" for bb in batches), "largest B that fits"]))

    path = C.fig_path(out, f"{SLUG}.png")
    fig, ax = plots.new_figure(1, 1, figsize=(10, 5.2))
    labels = list(runs)
    for x, label in enumerate(labels):
        bottom = 0.0
        for c in CATEGORIES:
            value = runs[label]["at_peak"][c] / GB
            ax.bar(x, value, bottom=bottom, color=plots.CATEGORY_COLORS[c], width=0.7, lw=0)
            bottom += value
        ax.text(x, bottom + 0.5, f"{runs[label]['peak'] / GB:.1f}", ha="center", va="bottom", fontsize=8)
    ax.axhline(CAPACITY / GB, color="#B2182B", ls=(0, (5, 3)), lw=1.4)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([lbl.replace(" + ", "\n+ ") for lbl in labels], fontsize=8)
    ax.set_ylabel("per-device peak of one training step (GB = 10⁹ bytes)")
    ax.set_ylim(0, max(max(r["peak"] for r in runs.values()), CAPACITY) / GB * 1.12)
    ax.grid(axis="y", alpha=0.3)
    shown = [c for c in CATEGORIES if c != "untouched" or any(r["at_peak"][c] for r in runs.values())]  # (none here)
    handles = [Patch(color=plots.CATEGORY_COLORS[c], label=plots.CATEGORY_LABELS[c]) for c in shown][::-1]
    handles.append(Line2D([], [], color="#B2182B", ls=(0, (5, 3)), lw=1.4, label="80 GB per device"))
    ax.legend(handles=handles, fontsize=8, frameon=False, loc="upper right")
    ax.set_title(f"The seed's 7B model on 8 GPUs (t = {T_PARALLEL}): one device, measured on the meta backend "
                 f"({L} layers, d={h}, T={s}, B={b}, float16)", fontsize=10)
    plots.save(fig, path)
    print(f"\nfigure: {path}")
    return {"config": dict(n_layer=L, d_model=h, n_head=a, seq_len=s, batch=b, tensor=T_PARALLEL),
            "runs": runs, "largest_batch": largest, "figures": [path]}


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    c = r["config"]
    runs, best = r["runs"], min(r["runs"], key=lambda label: r["runs"][label]["peak"])
    return [f"{c['n_layer']} layers on {c['tensor']} GPUs, per-device peak at B = {c['batch']}: TP alone "
            f"{runs['TP']['peak'] / 1e9:.1f} GB, {best} {runs[best]['peak'] / 1e9:.1f} GB",
            f"largest batch fitting 80 GB per device: TP alone {r['largest_batch']['TP']}, "
            f"{best} {r['largest_batch'][best]}"]


if __name__ == "__main__":
    C.cli(main, __doc__)
