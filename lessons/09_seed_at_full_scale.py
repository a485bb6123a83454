"""Lesson 9: the seed at full scale: its 7B example measured, number by number, on the meta backend.

What you will see: the seed's worked example (32 layers, d = 4096, T = 2048, B = 4, float16) built as
a GPT on the shape-only meta backend, so one training step of the full-size model runs in about a
second with an exact memory ledger. The lesson puts each of the seed's numbers beside its own
arithmetic and beside the measurement: the activation formula 32 × 12·B·T·d × 2 bytes gives 25.8 GB,
not the 64 GB the seed prints; the ledger measures 60.7 GiB, near 64 only by coincidence (14·E plus a
B·H·T² attention term per layer, which 12·B·T·d leaves out). Parameters, AdamW states and gradients
are measured too, and then every checkpointing plan (none, every layer, √n segments, Korthikanti's
selective recomputation, and the planner's optimum under a budget), each measured, with a fits /
does-not-fit verdict at 40 GB and 80 GB. With float32 Adam states nothing fits 80 GB: checkpointing
removes the activations, and what is left is the optimizer. The lesson then measures what does fit:
AdamW states in float16, plain SGD, and a smaller batch.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): for a 7B model (32 layers, d=4096, T=2048, B=4, float16), "64 GB just for
activations", 14 GB of parameters and 56 GB of Adam states: it "simply cannot fit in a single 80 GB
A100" without intervention. Measured here, at that size, on the shape-only backend.

Which run these numbers describe: this engine's own step, as `tinygrad-ckpt estimate` takes it by default:
float16 weights, activations and gradients throughout (no autocast, no float32 master copy), AdamW's m and v
in float32, explicit attention (the [B, H, T, T] weights kept), this engine's saves (a layer norm keeps its
output and 1/std, dropout a 1-bit mask), and allocated bytes (no caching allocator's reserve). Lesson 14 takes
a model of this size as PyTorch AMP with flash attention and as Megatron run it, with the allocator and the
device's real capacity.

Read: tinygrad_ckpt/backend/meta.py (the shape-only backend), tinygrad_ckpt/scale/measure.py (SteadyStep: the one
measured training step, also behind `tinygrad-ckpt estimate`), tinygrad_ckpt/app/cli.py (`tinygrad-ckpt estimate`,
the same measurement as a command), tinygrad_ckpt/scale/estimate.py (seed_activation_example,
engine_activation_terms, training_state_terms), tinygrad_ckpt/recompute/planner.py (LayerCost, plan_chain,
minimum_peak_bytes), tinygrad_ckpt/optim.py (state_dtype).

Run: python lessons/09_seed_at_full_scale.py [--quick] [--out figures]
(--quick: 4 of the seed's 32 layers, same width, sequence and batch; every number is measured the same way.)
Figures: {out}/09_seed_at_full_scale_per_layer.png (one layer's saves: the seed's 12·B·T·d vs the
engine's terms vs the ledger), {out}/09_seed_at_full_scale_timeline.png (full-size memory timelines,
shared y-axis, 40 GB and 80 GB marked) and {out}/09_seed_at_full_scale_plans.png (the peak of every
plan for every optimizer set-up, split by category, against 40 GB and 80 GB).
Page: {out}/09_seed_at_full_scale_explorer.html (the same step in the interactive memory explorer:
open it in a browser).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import _common as C
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.ledger import CATEGORIES
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import SteadyStep, layer_costs

SLUG = "09_seed_at_full_scale"
GB, GiB = 10**9, 2**30
CAPACITIES = {"40 GB": 40 * GB, "80 GB": 80 * GB}  # the seed's "40-80 GB" GPUs, in its decimal units
A100_80_REPORTED = 81920 * 2**20  # nvidia-smi's total for an A100 80GB: 81920 MiB = 80 GiB (85.9 GB)
N_HEAD, VOCAB = 32, 32000  # the seed names neither; 32 heads of 128 and LLaMA-7B's vocabulary


class Setup(NamedTuple):
    """How the training step keeps its optimizer state, and the batch size."""

    key: str
    label: str
    optimizer: str  # "adamw" or "sgd"
    state_dtype: object = None  # AdamW: np.float32 (the seed) or None (the parameters' dtype, float16)
    batch: int = 4


SETUPS = (
    Setup("adamw_fp32", "AdamW, float32 m and v (the seed)", "adamw", np.float32),
    Setup("adamw_fp16", "AdamW, float16 m and v (the parameters' dtype)", "adamw", None),
    Setup("sgd", "SGD, no optimizer state", "sgd"),
    Setup("adamw_fp32_b1", "AdamW, float32 m and v, batch 1", "adamw", np.float32, 1),
)
FIXED_PLANS = ("none", "every_layer", "sqrt", "selective")
PLAN_LABELS = {"none": "none", "every_layer": "every layer", "sqrt": "√n segments", "selective": "selective (K22)",
               "planner 80 GB": "planner ≤ 80 GB", "planner 40 GB": "planner ≤ 40 GB"}


def seed_shape(quick: bool, batch: int = 4) -> est.GPTShape:
    return est.GPTShape(n_layer=4 if quick else 32, d_model=4096, n_head=N_HEAD, seq_len=2048, batch=batch,
                        vocab_size=VOCAB, dtype="float16")


# ---------------------------------------------------------------- one measured step on meta

class Run:
    """What one steady-state training step measured (the ledger itself only where a figure needs it).
    (Plain classes here, not dataclasses: the lesson is also loaded by path, outside sys.modules.)"""

    def __init__(self, plan_text, led, seconds, keep_ledger):
        tl = led.timeline()
        i = int(np.argmax(tl["total"]))
        self.plan_text, self.seconds = plan_text, seconds
        self.total_peak = int(tl["total"][i])
        self.at_peak = {c: int(tl[c][i]) for c in CATEGORIES}  # bytes live at the moment of the total peak
        self.peak_phase = str(tl["phase"][i])
        self.category_peaks = {c: led.peak_bytes(c) for c in CATEGORIES}
        self.block_forward_flops = sum(f for layer, f in led.flops_by_layer().items()
                                       if layer.startswith("transformer.h."))
        self.recompute_flops = led.flops("recompute")
        self.recompute_ratio = self.recompute_flops / self.block_forward_flops  # extra forwards of the blocks
        self.led = led if keep_ledger else None

    def fits(self, capacity: int) -> bool:
        return self.total_peak <= capacity


class MetaTrainer:
    """The seed's GPT for one set-up, one training step already taken (tinygrad_ckpt.scale.measure.SteadyStep, the
    same measurement as `tinygrad-ckpt estimate`): `measure(checkpoint)` runs one more step under a Ledger."""

    def __init__(self, shape: est.GPTShape, setup: Setup):
        self.shape, self.setup = shape, setup
        self.step = SteadyStep(shape, setup.optimizer, setup.state_dtype)

    def measure(self, checkpoint, keep_ledger: bool = False) -> Run:
        """checkpoint: "none", "every_layer", "sqrt", "selective" (Korthikanti) or a planner Plan."""
        C.fresh()
        led, seconds = self.step.measure(checkpoint)
        text = checkpoint.describe() if isinstance(checkpoint, planner.Plan) else str(checkpoint)
        return Run(text, led, seconds, keep_ledger)


def compact(plan: planner.Plan) -> str:
    """'[0:6)plain [6:19)ckpt [19:32)plain' -> 'plain 6, ckpt 13, plain 13' (layers per segment; equal
    neighbours merged: '7 × ckpt 4')."""
    parts = [("ckpt" if seg.checkpoint else "plain", seg.stop - seg.start) for seg in plan.segments]
    out, i = [], 0
    while i < len(parts):
        j = i
        while j < len(parts) and parts[j] == parts[i]:
            j += 1
        kind, size = parts[i]
        out.append(f"{j - i} × {kind} {size}" if j - i > 1 else f"{kind} {size}")
        i = j
    return ", ".join(out)


def search_plan(trainer: MetaTrainer, costs, capacity: int, cache: dict):
    """The least-recompute planner plan whose MEASURED total peak fits `capacity`, or None.

    plan_chain budgets activations only (parameters, optimizer states and gradients are not in its
    model, and gradients grow while activations shrink in backward), so the lesson bisects the
    activation budget between the least any one-level plan needs and keeping everything, measuring the
    plan at each budget, and keeps the fitting plan with the least recompute. Plans are one level deep
    (max_depth=1); `cache` maps a plan to its measured Run. Returns (run or None, least-memory run, trail)."""
    trail = []

    def run_at(budget):
        plan = planner.plan_chain(costs, budget, max_depth=1)
        key = plan.describe()
        if key not in cache:
            cache[key] = trainer.measure(plan)
            cache[key].plan_text = compact(plan)
        run = cache[key]
        trail.append((budget, run))
        return run

    lo = planner.minimum_peak_bytes(costs, max_depth=1)
    hi = sum(c.saved_bytes for c in costs)
    least = run_at(lo)
    if not least.fits(capacity):
        return None, least, trail
    best = run_at(hi)
    if best.fits(capacity):
        return best, least, trail
    best, tolerance = least, max(1, costs[0].saved_bytes // 2)
    while hi - lo > tolerance:
        mid = (lo + hi) // 2
        run = run_at(mid)
        if run.fits(capacity):
            lo = mid
            if run.recompute_flops <= best.recompute_flops:
                best = run
        else:
            hi = mid
    return best, least, trail


# ---------------------------------------------------------------- figures

CAP_COLORS = {"40 GB": "#E69F00", "80 GB": "#B2182B"}


def capacity_lines(ax, div: float) -> list:
    """Dashed lines at 40 GB and 80 GB (y in units of `div` bytes); returns legend handles for them."""
    handles = []
    for name, cap in CAPACITIES.items():
        ax.axhline(cap / div, color=CAP_COLORS[name], lw=1.4, ls=(0, (5, 3)), zorder=6)
        label = name if div == GB else f"{name} = {cap / GiB:.1f} GiB"
        handles.append(Line2D([], [], color=CAP_COLORS[name], lw=1.4, ls=(0, (5, 3)),
                              label=f"{label} (decimal GB, as the seed)"))
    return handles


def per_layer_figure(path, shape, terms, h0) -> None:
    """One block's saves as three horizontal bars: the seed's 12·B·T·d, engine_activation_terms, the ledger."""
    B, T, d, H, v = shape.batch, shape.seq_len, shape.d_model, shape.n_head, shape.value_bytes
    E = B * T * d
    t2_keys = ("attn.softmax_out", "attn.causal_mask")
    f_t2 = sum(terms[k] for k in t2_keys)
    f_e = sum(terms.values()) - f_t2
    m_t2 = sum(n for (module, op, _), n in h0.items() if module == "attn" and op in ("softmax", "masked_fill"))
    m_e = sum(h0.values()) - m_t2
    e_label = f"14·E·{v} B + 2·B·T·{v} B" if f_e == 14 * E * v + 2 * B * T * v else f"{f_e / (E * v):.2f}·E·{v} B"
    t2_label = f"B·H·T²·{v} B + T² B (mask)"
    rows = [
        ("seed: 12·B·T·d·2 bytes", [(12 * E * v, "#A6BDDB", f"12·E·{v} B")]),
        ("engine_activation_terms", [(f_e, "#4C72B0", e_label), (f_t2, "#C44E52", t2_label)]),
        ("measured: ledger, block h.0", [(m_e, "#4C72B0", "B·T·d terms"), (m_t2, "#C44E52", "T² terms")]),
    ]
    fig, ax = plots.new_figure(figsize=(10, 3.3))
    div = GiB
    for y, (_, parts) in enumerate(rows):
        left = 0
        for nbytes, color, label in parts:
            ax.barh(y, nbytes / div, left=left / div, color=color, height=0.62)
            ax.text((left + nbytes / 2) / div, y, f"{label}\n{C.format_bytes(nbytes)}", ha="center", va="center",
                    fontsize=8, color="white" if color != "#A6BDDB" else "black")
            left += nbytes
        ax.text(left / div, y, f"  {C.format_bytes(left)}\n  {left:,} B", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, max(sum(p[0] for p in parts) for _, parts in rows) / div * 1.2)
    ax.set_xlabel(f"bytes one block saves for backward (GiB);  E = B·T·d = {E:,} values")
    ax.legend(handles=[Patch(color="#4C72B0", label="terms ∝ B·T·d: Linear and GELU inputs; q, k, v"),
                       Patch(color="#C44E52", label="terms ∝ T²: attention weights [B,H,T,T], causal mask"),
                       Patch(color="#A6BDDB", label="the seed's formula (no T² term)")],
              loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, fontsize=8, frameon=False)
    ax.set_title(f"One layer of the seed's model (B={B}, T={T}, d={d}, H={H}, float16): what it saves for backward",
                 fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    plots.save(fig, path)


def timeline_figure(path, runs, titles, shape) -> None:
    """Full-size memory timelines side by side on one y-axis (GiB), 40 GB and 80 GB marked."""
    fig, axes = plots.new_figure(1, len(runs), figsize=(5.0 * len(runs) + 1.0, 4.8), sharey=True)
    top = max(r.total_peak for r in runs) / GiB * 1.15
    handles = {}
    for i, (ax, run, title) in enumerate(zip(axes, runs, titles)):
        info = plots.plot_memory_timeline(ax, run.led, title=title, x="step", unit="GiB", legend=False, ymax=top)
        for h in info["handles"]:
            handles[h.get_label()] = h
        for h in capacity_lines(ax, GiB):
            handles[h.get_label()] = h
        if i:
            ax.set_ylabel("")
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"One steady-state training step of the seed's model at full size, measured on the meta backend "
                 f"({shape.n_layer} layers, d={shape.d_model}, T={shape.seq_len}, B={shape.batch}, float16)",
                 fontsize=10)
    plots.save(fig, path)


def plans_figure(path, table: dict, least: dict, shape) -> None:
    """One panel per set-up: the total peak of each plan (GB), stacked by what is live at that moment."""
    setups = [s for s in SETUPS if s.key in table]
    fig, axes = plots.new_figure(1, len(setups), figsize=(3.5 * len(setups) + 1.4, 5.0), sharey=True)
    axes = np.atleast_1d(axes)
    shown_runs = [r for runs in table.values() for r in runs.values() if r is not None] + list(least.values())
    top = max(max(r.total_peak for r in shown_runs), CAPACITIES["80 GB"]) / GB * 1.12
    names = list(PLAN_LABELS)
    for i, (ax, setup) in enumerate(zip(axes, setups)):
        runs = table[setup.key]
        for x, name in enumerate(names):
            run = runs.get(name)
            shown = run if run is not None else least.get(setup.key)
            if shown is None:
                continue
            bottom = 0.0
            for c in CATEGORIES:
                val = shown.at_peak[c] / GB
                ax.bar(x, val, bottom=bottom, color=plots.CATEGORY_COLORS[c], width=0.72, lw=0,
                       alpha=1.0 if run is not None else 0.3, hatch=None if run is not None else "////",
                       edgecolor="white")
                bottom += val
            ax.text(x, bottom + top * 0.006, f"{shown.total_peak / GB:.1f}" if run is not None else "no plan\nfits",
                    ha="center", va="bottom", fontsize=7, zorder=8,
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.85))
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([PLAN_LABELS[n] for n in names], rotation=40, ha="right", fontsize=8)
        ax.set_ylim(0, top)
        ax.set_title(setup.label.replace(" (", "\n(").replace(", batch", "\nbatch"), fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        cap_handles = capacity_lines(ax, GB)
        if i == 0:
            ax.set_ylabel("total peak of one training step (GB = 10⁹ bytes)")
    shown = [c for c in CATEGORIES if c != "untouched" or any(r.at_peak[c] for r in shown_runs)]  # (none here)
    handles = [Patch(color=plots.CATEGORY_COLORS[c], label=plots.CATEGORY_LABELS[c]) for c in shown][::-1]
    if any(r is None for runs in table.values() for r in runs.values()):
        handles.append(Patch(facecolor="#DDDDDD", hatch="////", edgecolor="white",
                             label="no planner plan fits: its least-memory plan, measured"))
    fig.legend(handles=handles + cap_handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Peak memory of each checkpointing plan, measured ({shape.n_layer} layers, d={shape.d_model}, "
                 f"T={shape.seq_len}, float16); bars split by what is live at the peak, its value in GB on top",
                 fontsize=10)
    plots.save(fig, path)


# ---------------------------------------------------------------- the lesson

def fb(n: float) -> str:
    return f"{C.format_bytes(n)} ({C.format_bytes(n, decimal=True)})"


SAVED_AS = {"ln_1.rstd": ("ln_1", "layer_norm", "rstd"),  # formula term -> (module in the block, op, role) of its save
            "attn.c_attn.input": ("ln_1", "layer_norm", "out"), "attn.qkv": ("attn", "matmul", "b"),
            "attn.causal_mask": ("attn", "masked_fill", "mask"), "attn.softmax_out": ("attn", "softmax", "out"),
            "attn.c_proj.input": ("attn.c_proj", "linear", "x"),
            "ln_2.rstd": ("ln_2", "layer_norm", "rstd"), "mlp.c_fc.input": ("ln_2", "layer_norm", "out"),
            "mlp.gelu.input": ("mlp", "gelu", "x"), "mlp.c_proj.input": ("mlp", "gelu", "out")}


def block_saves(led, block: str = "transformer.h.0") -> dict:
    """{(module in the block, op, role): bytes} of what the block's ops saved (each buffer once, under its first
    saver: the ledger's lifetimes)."""
    modules = {f"{block}.{module}": module for module, _, _ in SAVED_AS.values()}
    out = {}
    for lf in led.lifetimes():
        if lf.layer == block:
            key = (modules.get(lf.scope, lf.scope), lf.op, lf.role)
            out[key] = out.get(key, 0) + lf.nbytes
    return out


def main(quick: bool = False, out: str = "figures") -> dict:
    t_start = time.perf_counter()
    shape = seed_shape(quick)
    B, T, d, H, L, v = shape.batch, shape.seq_len, shape.d_model, shape.n_head, shape.n_layer, shape.value_bytes
    E = B * T * d
    print("Lesson 9: the seed at full scale")
    C.claim(__doc__)
    print(f"The seed's example: {L} layers, d = {d}, T = {T}, B = {B}, float16"
          + (" (--quick: 4 of its 32 layers, everything else as the seed)." if quick else "."))
    print(f"The seed names neither the number of heads nor the vocabulary: this lesson uses {H} heads (head dim "
          f"{d // H}) and a\nvocabulary of {VOCAB:,} (LLaMA-7B's, whose width and depth these are). The model is "
          "nanoGPT's (learned positions,\n4d GELU MLP, tied lm_head), built on the meta backend: shapes and dtypes, "
          "no data, an exact ledger.")
    print("The run measured is this engine's own: float16 throughout (no autocast, no float32 master weights), "
          "float32 AdamW states,\nexplicit attention, this engine's saves, allocated bytes (lesson 14: the same "
          "kind of model as PyTorch AMP and Megatron run it).")

    # ---- 1. the seed's arithmetic
    C.heading("1. The seed's activation arithmetic")
    ex = est.seed_activation_example(n_head=N_HEAD)
    seed_formula, seed_printed = ex["seed_formula"], ex["seed_printed"]
    print(f"32 × 12 × 4 × 2048 × 4096 × 2 bytes = {seed_formula:,} B = {fb(seed_formula)}.")
    print(f"The seed prints \"≈ 64 GB\": {seed_printed / seed_formula:.2f}× what its own formula gives. "
          "That number does not follow from its formula.")

    # ---- 2. what the ledger measures
    C.heading("2. What the ledger measures for activations")
    # One model at a time: a Ledger counts every buffer alive when it starts, other models' too.
    seed_trainer = MetaTrainer(shape, SETUPS[0])
    plain_seed = seed_trainer.measure("none", keep_ledger=True)
    led = plain_seed.led
    act_peak = led.peak_bytes("activation")
    seed_formula_config = est.seed_activation_bytes_total(L, B, T, d, v)
    terms = est.engine_activation_terms(shape)
    engine_layer = sum(terms.values())
    h0 = block_saves(led)
    measured_layer = sum(h0.values())
    by_layer = led.saved_breakdown(by="layer")
    blocks = sum(n for k, n in by_layer.items() if k.startswith("transformer.h."))
    outside = {k: n for k, n in by_layer.items() if not k.startswith("transformer.h.")}
    print(f"one steady-state AdamW step, measured in {plain_seed.seconds:.1f} s: activation peak {fb(act_peak)}")
    print(f"the seed's formula for this model ({L} × 12·B·T·d × 2 B): {fb(seed_formula_config)}; "
          f"measured / formula = {act_peak / seed_formula_config:.2f}")
    t2_keys = ("attn.softmax_out", "attn.causal_mask")
    rows = []
    for k, n in terms.items():
        kind = "T²" if k in t2_keys else ("B·T" if k.endswith("rstd") else f"{n / (E * v):g}·E")
        saved_as = SAVED_AS.get(k)
        rows.append((k, kind, f"{n:,}", f"{h0.get(saved_as, 0):,}",
                     f"{saved_as[0]}.{saved_as[1]}:{saved_as[2]}" if saved_as else ""))
    rows.append(("total", "", f"{engine_layer:,}", f"{measured_layer:,}", ""))
    print(f"\nOne block (h.0), term by term: engine_activation_terms vs led.lifetimes() of layer transformer.h.0 "
          f"(E = B·T·d = {E:,}):")
    print(C.table(rows, ["term", "scales as", "formula (B)", "measured (B)", "saved as transformer.h.0.<name>"]))
    tt_sum = sum(terms[k] for k in t2_keys)
    e_sum = sum(n for k, n in terms.items() if k not in t2_keys and not k.endswith("rstd"))
    seed_layer = est.seed_activation_bytes_per_layer(B, T, d, v)
    print(f"\nper layer: E-terms {e_sum / (E * v):g}·E·2 B = {fb(e_sum)}; T² terms = {fb(tt_sum)}\n"
          f"  (the softmax output, B·H·T² = {B * H * T * T:,} values, and a bool T² causal mask);")
    print(f"the seed's 12·E·2 B = {fb(seed_layer)}. Measured per block: {fb(measured_layer)} "
          f"({measured_layer / seed_layer:.2f}× the seed's).")
    print(f"all {L} blocks: {fb(blocks)}; outside the blocks: "
          + ", ".join(f"{k} {C.format_bytes(n)}"
                      for k, n in outside.items() if n >= 2**20)
          + f";\n{fb(sum(by_layer.values()))} saved in all: the activation peak.")
    same = B * H * T * T == 16 * E
    print("\nWhy the seed's formula is short: its prose lists the attention weights [B, H, T, T], but 12·B·T·d has "
          "no term for\nthem. They grow with T², and at T = 2048 they are bigger than everything else in the layer "
          "together"
          + (f"\n(B·H·T² = {B * H * T * T:,} = 16·E exactly here, because H·T = {H * T:,} = 16·d)." if same else "."))
    print("And 14·E rather than 12·E: each Linear keeps its input (after a LayerNorm, the LayerNorm's output, which "
          "the\nLayerNorm keeps too, to recover x̂ from), q, k, v are one 3·E buffer, the merged heads another E, "
          "and the MLP\nkeeps two 4·E arrays.")
    print(f"Is the measured {C.format_bytes(act_peak)} the seed's 64 GB? No. In the seed's decimal units it is "
          f"{C.format_bytes(act_peak, True)}, and it is built\nfrom terms the seed's formula does not have (its "
          f"12·E alone gives {C.format_bytes(seed_formula_config, True)}). A 14·E + B·H·T² layer is "
          f"{C.format_bytes(measured_layer)} at this shape,\nso {L} of them make {C.format_bytes(blocks)}: that "
          "this lands near the seed's printed 64 is a coincidence.")
    t2 = {}
    for Tx in (1024, 2048, 4096, 8192):
        tx = est.engine_activation_terms(est.GPTShape(n_layer=L, d_model=d, n_head=H, seq_len=Tx, batch=B,
                                                      vocab_size=VOCAB, dtype="float16"))
        t2[Tx] = (tx["attn.softmax_out"] + tx["attn.causal_mask"]) / sum(tx.values())
    print("share of the T² terms in a layer (formula): "
          + ", ".join(f"T = {Tx}: {share:.0%}" for Tx, share in t2.items()))

    # ---- 3. parameters, optimizer, gradients
    C.heading("3. Parameters, AdamW states, gradients: the seed's other numbers")
    P = est.gpt_parameter_count(shape)
    cp = plain_seed.category_peaks
    seven = est.training_state_terms(7 * 10**9, "adamw", "float16")
    print(f"parameters: {P:,} ({P / 1e9:.2f} B: nanoGPT layout, vocabulary {VOCAB:,}, learned positions; the "
          "seed's \"7B\" is a round number)")
    rows = [
        ("parameters, float16", "14 GB", f"7e9 × 2 B = {C.format_bytes(seven['parameters'], True)}",
         fb(cp["parameter"])),
        ("AdamW m and v, float32", "56 GB",
         f"7e9 × 8 B = {C.format_bytes(seven['adam_m'] + seven['adam_v'], True)}", fb(cp["optimizer"])),
        ("gradients, float16", "(not counted)", f"7e9 × 2 B = {C.format_bytes(seven['gradients'], True)}",
         fb(cp["gradient"]) + " at most"),
        ("activations", "64 GB", f"12·B·T·d·L·2 = {C.format_bytes(seed_formula_config, True)}",
         fb(cp["activation"]) + " at most"),
        ("total", "134 GB (14+56+64)", "", fb(plain_seed.total_peak) + " peak"),
    ]
    print(C.table(rows, ["", "seed prints", "seed's own arithmetic", "measured (ledger, one step)"]))
    print(f"The parameter and Adam numbers follow (for 7e9 parameters; this model has {P / 1e9:.2f} B: "
          f"{C.format_bytes(P * v, True)} and {C.format_bytes(8 * P, True)}).")
    print(f"Gradients, which the seed leaves out, add {C.format_bytes(P * v, True)}; the measured gradient peak "
          f"({C.format_bytes(cp['gradient'], True)}) also holds\nactivation gradients in flight. The categories "
          f"peak at different moments: the total peak,\n{fb(plain_seed.total_peak)}, comes early in the "
          f"{plain_seed.peak_phase} pass, when\n"
          + ", ".join(f"{plots.CATEGORY_LABELS[c].split(' (')[0]} {C.format_bytes(n)}"
                      for c, n in plain_seed.at_peak.items() if n) + " are live.")

    # ---- 4. every plan, every set-up
    C.heading("4. Every checkpointing plan, measured, for each way of keeping the optimizer state")
    keep = {("adamw_fp32", "none"), ("adamw_fp32", "every_layer"), ("adamw_fp16", "every_layer")}
    table: dict[str, dict[str, Run | None]] = {}
    least: dict[str, Run] = {}
    trails: dict[str, dict[str, list]] = {}
    costs_by_batch: dict[int, list] = {}
    for setup in SETUPS:
        trainer = seed_trainer if setup.key == SETUPS[0].key else MetaTrainer(seed_shape(quick, setup.batch), setup)
        seed_trainer = None
        sh = trainer.shape
        runs: dict[str, Run | None] = {}
        for name in FIXED_PLANS:
            if setup.key == SETUPS[0].key and name == "none":
                runs[name] = plain_seed
            else:
                runs[name] = trainer.measure(name, keep_ledger=name in ("none", "every_layer")
                                             or (setup.key, name) in keep)
        if setup.batch not in costs_by_batch:  # per-layer costs depend on the shape, not on the optimizer
            costs_by_batch[setup.batch] = layer_costs(runs["none"].led, runs["every_layer"].led,
                                                      [f"transformer.h.{k}" for k in range(sh.n_layer)],
                                                      sh.batch * sh.seq_len * sh.d_model * sh.value_bytes)
        for name in ("none", "every_layer"):
            if (setup.key, name) not in keep:
                runs[name].led = None
        costs = costs_by_batch[setup.batch]
        n = sh.n_layer
        cache = {planner.no_checkpoint_plan(n).describe(): runs["none"],
                 planner.every_layer_plan(n).describe(): runs["every_layer"],
                 planner.sqrt_plan(n).describe(): runs["sqrt"]}
        trails[setup.key] = {}
        for cap_name, cap in CAPACITIES.items():
            run, low, trail = search_plan(trainer, costs, cap, cache)
            runs[f"planner {cap_name}"] = run
            least[setup.key] = low
            trails[setup.key][cap_name] = trail
        table[setup.key] = runs
        del trainer, cache

    costs = costs_by_batch[B]
    c0 = costs[0]
    print(f"planner costs, measured from the plain step (block h.0): f = {c0.forward_flops:.4e} FLOPs, "
          f"a = {c0.saved_bytes:,} B saved, b = B·T·d·2 = {c0.input_bytes:,} B input;\nfrom the every-layer step: "
          f"t = {c0.tail_flops:.4e} FLOPs ({c0.tail_flops / c0.forward_flops:.0%} of f), the tail a replay stops "
          "before (the block's last linear and residual add).")
    print("plan_chain budgets activations only; the lesson bisects its budget, measures each plan's TOTAL peak on "
          "meta,\nand keeps the least-recompute plan that fits (one level of checkpoints, max_depth=1).")
    el_formula = L * c0.input_bytes + c0.saved_bytes
    print(f"every layer keeps the {L} block inputs ({L} × {C.format_bytes(c0.input_bytes)}) and, in each replay, "
          f"one block's saves ({C.format_bytes(c0.saved_bytes)}):\n{C.format_bytes(el_formula)} by formula, "
          f"{C.format_bytes(table[SETUPS[0].key]['every_layer'].category_peaks['activation'])} measured.")
    verdict = lambda r, cap: "fits" if r.fits(cap) else "NO"  # noqa: E731
    for setup in SETUPS:
        runs = table[setup.key]
        print(f"\n{setup.label}  (B = {setup.batch})")
        rows = []
        for name in PLAN_LABELS:
            r = runs[name]
            if r is None:
                rows.append((PLAN_LABELS[name], "", "no plan fits", "", "", "", "",
                             f"least-memory plan peaks at {C.format_bytes(least[setup.key].total_peak, True)}"))
                continue
            rows.append((PLAN_LABELS[name], C.format_bytes(r.category_peaks["activation"]), fb(r.total_peak),
                         C.format_bytes(r.at_peak["optimizer"]), f"{r.recompute_ratio:.0%}",
                         verdict(r, CAPACITIES["40 GB"]), verdict(r, CAPACITIES["80 GB"]),
                         r.plan_text if name.startswith("planner") else ""))
        print(C.table(rows, ["plan", "activation peak", "total peak", "optimizer", "recompute",
                             "≤ 40 GB", "≤ 80 GB", "planner's plan (layers per segment)"]))
    print("\n(recompute: FLOPs replayed in backward, as a share of the blocks' forward FLOPs.)")

    # ---- 5. verdicts
    C.heading("5. Which set-ups fit, and why")
    s1 = table["adamw_fp32"]
    el = s1["every_layer"]
    static = el.at_peak["parameter"] + el.at_peak["optimizer"] + el.at_peak["gradient"]
    over80 = el.total_peak - CAPACITIES["80 GB"]
    print(f"Seed set-up, every layer checkpointed: total peak {fb(el.total_peak)}: "
          + ("fits 80 GB." if over80 <= 0 else f"does NOT fit 80 GB ({C.format_bytes(over80, True)} over)."))
    print(f"At that peak (the end of backward): parameters {C.format_bytes(el.at_peak['parameter'])}, AdamW "
          f"states {C.format_bytes(el.at_peak['optimizer'])},\ngradients {C.format_bytes(el.at_peak['gradient'])} "
          f"(together {fb(static)}), activations {C.format_bytes(el.at_peak['activation'])}, other "
          f"{C.format_bytes(el.at_peak['other'])}.")
    fits = {cap_name: {k: [n for n, r in runs.items() if r is not None and r.fits(cap)] for k, runs in table.items()}
            for cap_name, cap in CAPACITIES.items()}
    cheapest = {c: {} for c in CAPACITIES}
    for setup in SETUPS:
        print(f"{setup.label}:")
        for cap_name in CAPACITIES:
            names = fits[cap_name][setup.key]
            runs = table[setup.key]
            if not names:
                print(f"  ≤ {cap_name}: nothing fits")
                continue
            best = min(names, key=lambda n: (runs[n].recompute_ratio, runs[n].total_peak))
            cheapest[cap_name][setup.key] = best
            print(f"  ≤ {cap_name}: " + ", ".join(f"{PLAN_LABELS[n]} ({runs[n].recompute_ratio:.0%})" for n in names))
            print(f"      least recompute: {PLAN_LABELS[best]}, {fb(runs[best].total_peak)}")
    print("(in brackets: recompute, as a share of the blocks' forward FLOPs)")
    if not fits["80 GB"]["adamw_fp32"]:
        print(f"With float32 Adam states no plan fits 80 GB: checkpointing takes the activations from "
              f"{C.format_bytes(s1['none'].category_peaks['activation'])} down to "
              f"{C.format_bytes(el.category_peaks['activation'])},\nand what is left over the line is the "
              f"optimizer ({C.format_bytes(el.at_peak['optimizer'])}), which checkpointing cannot touch. The "
              "seed is right that\na 7B model with Adam does not fit 80 GB without an intervention; activation "
              "checkpointing alone is not\nthe one that makes it fit.")
    for cap_name, cap in CAPACITIES.items():
        print(f"Cheapest fit under {cap_name}:" + ("" if cheapest[cap_name] else " none"))
        for k, n in cheapest[cap_name].items():
            r = table[k][n]
            print(f"  {next(s.label for s in SETUPS if s.key == k)}: {PLAN_LABELS[n]}, "
                  f"{C.format_bytes(r.total_peak, True)} ({r.recompute_ratio:.0%} recompute, "
                  f"{C.format_bytes(cap - r.total_peak, True)} to spare)")
    if any(cap - table[k][n].total_peak < GB for cap_name, cap in CAPACITIES.items()
           for k, n in cheapest[cap_name].items()):
        print("  (a margin under 1 GB fits on paper only: the CUDA context and allocator slack take some hundreds "
              "of MB on a real GPU)")
    no40 = [s for s in SETUPS if not fits["40 GB"][s.key]]
    if no40:
        print("Why the others do not fit 40 GB:")
    for setup in no40:
        r = table[setup.key]["every_layer"]
        floor = r.at_peak["parameter"] + r.at_peak["optimizer"] + r.at_peak["gradient"]
        print(f"  {setup.label}: parameters + optimizer + gradients = {C.format_bytes(floor, True)}"
              + (", over 40 GB before any activation" if floor > CAPACITIES["40 GB"] else ""))
    print("The planner only cuts the chain into whole layers; selective recomputation (per op: the attention "
          "core, the T² half\nof each layer, replayed for about 8% of the forward) is outside its search space, "
          "and where it fits\nit is the cheaper plan.")
    print("float16 Adam states halve the optimizer's memory but not for free: the seed keeps them at 32 bits for "
          "numerical\nstability (small squared gradients in v underflow in float16). Practice uses bf16 or 8-bit "
          "states where 32 bits\ndo not fit; NumPy has no bf16, but bf16 has float16's size, so the memory measured "
          "here is the same.")
    a100 = el.total_peak <= A100_80_REPORTED
    if over80 > 0:
        print(f"GB or GiB? The seed's 80 GB is decimal ({C.format_bytes(80 * GB)}); nvidia-smi reports an A100 "
              f"80GB as 81920 MiB = 80 GiB ({C.format_bytes(A100_80_REPORTED, True)}).\nAgainst 80 GiB the seed "
              "set-up with every layer checkpointed "
              + (f"would squeeze in, with {C.format_bytes(A100_80_REPORTED - el.total_peak)} left\nfor the CUDA "
                 "context, allocator fragmentation and kernel workspaces, which the ledger does not see." if a100
                 else "still does not fit."))

    # ---- figures
    per_layer_path = C.fig_path(out, f"{SLUG}_per_layer.png")
    timeline_path = C.fig_path(out, f"{SLUG}_timeline.png")
    plans_path = C.fig_path(out, f"{SLUG}_plans.png")
    per_layer_figure(per_layer_path, shape, terms, h0)
    timeline_runs = [s1["none"], s1["every_layer"], table["adamw_fp16"]["every_layer"]]
    timeline_titles = ["AdamW (float32 m, v), no checkpointing", "AdamW (float32 m, v), every layer",
                       "AdamW (float16 m, v), every layer"]
    timeline_figure(timeline_path, timeline_runs, timeline_titles, shape)
    explorer = timeline_runs[0].led.to_html(C.fig_path(out, f"{SLUG}_explorer.html"),
                                            compare=[r.led for r in timeline_runs[1:]], labels=timeline_titles)
    print(f"wrote {explorer} (open it in a browser: hover, click a layer, search, zoom)")
    plans_figure(plans_path, table, least, shape)
    elapsed = time.perf_counter() - t_start
    n_measured = len({id(r) for runs in table.values() for r in runs.values() if r is not None}
                     | {id(r) for tr in trails.values() for t in tr.values() for _, r in t})
    print(f"\n{n_measured} training steps measured on meta.\nwrote {per_layer_path}\nwrote {timeline_path}\n"
          f"wrote {plans_path}  ({elapsed:.1f} s)")

    def per_run(fn):
        return {k: {n: (fn(r) if r is not None else None) for n, r in runs.items()} for k, runs in table.items()}

    return dict(
        config=dict(n_layer=L, d_model=d, n_head=H, seq_len=T, batch=B, vocab=VOCAB, dtype=shape.dtype),
        capacities=dict(CAPACITIES),
        seed_formula_bytes=seed_formula,
        seed_printed_bytes=seed_printed,
        seed_formula_config_bytes=seed_formula_config,
        seed_layer_bytes=seed_layer,
        activation_peak=act_peak,
        engine_layer_bytes=engine_layer,
        measured_layer_bytes=measured_layer,
        layer_e_bytes=e_sum,
        layer_t2_bytes=tt_sum,
        t2_share_by_T=t2,
        n_params=P,
        category_peaks_plain=cp,
        total_peak_plain=plain_seed.total_peak,
        peaks=per_run(lambda r: r.total_peak),
        activation_peaks=per_run(lambda r: r.category_peaks["activation"]),
        at_peak=per_run(lambda r: dict(r.at_peak)),
        recompute_ratio=per_run(lambda r: r.recompute_ratio),
        tail_share=sum(c.tail_flops for c in costs) / sum(c.forward_flops for c in costs),
        plan_text=per_run(lambda r: r.plan_text),
        least_memory_peaks={k: r.total_peak for k, r in least.items()},
        planner_trails={k: {c: [(b, r.total_peak) for b, r in t] for c, t in tr.items()} for k, tr in trails.items()},
        fits=fits,
        cheapest_fit=cheapest,
        fits_80_gib_every_layer=a100,
        figures=[per_layer_path, timeline_path, plans_path],
        explorer=explorer,
        seconds=elapsed,
    )


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    c = r["config"]
    return [f"{c['n_layer']} layers at d={c['d_model']}, T={c['seq_len']}, B={c['batch']}: one block keeps "
            f"{C.format_bytes(r['measured_layer_bytes'])} (the chapter's 12·B·T·d: "
            f"{C.format_bytes(r['seed_layer_bytes'])})",
            f"least-memory peak with float32 AdamW states: {r['least_memory_peaks']['adamw_fp32'] / 1e9:.1f} GB"]


if __name__ == "__main__":
    C.cli(main, __doc__)
