"""Lesson 6: √n and beyond: how many segments, which plan, and what each costs.

What you will see: a deep, narrow GPT (24 blocks) and a chain of 36 tanh layers, each run with k
checkpointed segments for every k from 1 to n. Chen et al. (2016) keep k segment inputs and replay one
segment at a time: peak ≈ k·b + (n/k)·a, least at k = √(n·a/b), which is √n only when a layer keeps
as much as its input (a = b: the tanh chain). A GPT block keeps a ≈ 18× its input at this
size (16·B·T·d values plus T² terms, so more as T grows), so its best k is
near n. Single-level checkpointing costs about one extra forward whatever k is (a replay stops once
backward has what it needs, before each segment's last linear and residual add, so more segments
replay slightly less); only nesting (recursive plans) goes lower in memory, and only by replaying
more. The chain's memory model (tinygrad_ckpt/recompute/planner.py: simulate) is fed per-layer costs measured
from one plain and one every-layer ledger run and predicts every measured activation peak and
recompute count. The planner (plan_chain) then picks
the least-recompute plan for three budgets, run through GPT(checkpoint=plan). Last, the frontier:
recompute FLOPs against peak activation memory for every policy.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): recomputing on demand trades memory for compute. Measured here: how much memory
each extra FLOP buys, as the number of checkpointed segments and the plan vary (Chen et al.'s √n rule,
nesting, and an optimal planner).

Read: tinygrad_ckpt/recompute/planner.py (LayerCost, simulate, plan_chain, sequential_plan, recursive_plan),
tinygrad_ckpt/recompute/plans.py (run_plan, run_checkpointed), tinygrad_ckpt/scale/estimate.py (chen_optimal_segments).

Run: python lessons/06_sqrt_n_and_beyond.py [--quick] [--out figures]
Figures: {out}/06_sqrt_n_and_beyond_sweep.png (peak and recompute against k, predicted and measured)
and {out}/06_sqrt_n_and_beyond_frontier.png (the memory-compute frontier of all policies).
"""

from __future__ import annotations

import math
import textwrap
import time

import _common as C
import numpy as np
from matplotlib.ticker import FuncFormatter

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.recompute.planner import LayerCost, Plan
from tinygrad_ckpt.recompute.plans import run_plan
from tinygrad_ckpt.scale import estimate
from tinygrad_ckpt.scale.measure import layer_costs

SLUG = "06_sqrt_n_and_beyond"


def sizes(quick: bool) -> dict:
    if quick:
        return dict(gpt=dict(vocab=32, seq_len=16, batch=2, n_layer=8, n_head=2, d_model=16),
                    chain=dict(n=16, shape=(8, 128)), budgets=(0.5, 0.3, 0.17))
    # budgets: planner budgets as fractions of the plain activation peak (the least feasible is about
    # (a + stem + head) / plain: 5% for 24 blocks, 16% for 8)
    return dict(gpt=dict(vocab=64, seq_len=32, batch=2, n_layer=24, n_head=2, d_model=32),
                chain=dict(n=36, shape=(16, 256)), budgets=(0.45, 0.2, 0.09))


# ---------------------------------------------------------------- measuring a GPT
def run_gpt(cfg: dict, batch, checkpoint=None, keep_ledger: bool = False) -> dict:
    """One forward + backward under a Ledger: activation peak, recompute and block forward FLOPs."""
    tg.manual_seed(0)
    model = nn.GPT(cfg["vocab"], cfg["seq_len"], cfg["n_layer"], cfg["n_head"], cfg["d_model"],
                   checkpoint=checkpoint)
    C.fresh()
    with tg.Ledger() as led:
        _, loss = model(*batch)
        loss.backward()
    del model, loss
    C.fresh()
    out = dict(peak=led.peak_bytes("activation"), total_peak=led.peak_bytes(), recompute=led.flops("recompute"),
               block_forward=sum(f for layer, f in led.flops_by_layer().items() if layer.startswith("transformer.h.")))
    if keep_ledger:
        out["led"] = led
    return out


def measured_costs(cfg: dict, led, every_led) -> dict:
    """Per-layer costs from a plain run: a_k (saved bytes of block k), b_k (its input), f_k (its forward
    FLOPs), and what the stem (embeddings) and head (ln_f, lm_head, loss) save outside the chain; and from
    an every-layer checkpointed run t_k = f_k - the FLOPs block k's replay ran (the tail it skipped)."""
    input_bytes = cfg["batch"] * cfg["seq_len"] * cfg["d_model"] * 4  # B·T·d float32
    costs = layer_costs(led, every_led, [f"transformer.h.{k}" for k in range(cfg["n_layer"])], input_bytes)
    by_layer = led.saved_breakdown(by="layer")
    stem = sum(v for key, v in by_layer.items() if key in ("transformer.wte", "transformer.wpe", "transformer.drop"))
    head = sum(by_layer.values()) - sum(c.saved_bytes for c in costs) - stem
    return dict(costs=costs, stem=stem, head=head, a=costs[0].saved_bytes, b=input_bytes, f=costs[0].forward_flops,
                t=costs[0].tail_flops)


def predict(m: dict, plan: Plan) -> tuple[int, float]:
    """(activation peak, recompute FLOPs) the chain model predicts for the whole GPT run.

    simulate() models the chain; the stem's saves are held throughout and the head's until the backward
    reaches the blocks, i.e. during the chain's forward events."""
    sim = planner.simulate(m["costs"], plan)
    first_backward = next(i for i, (event, _) in enumerate(sim.timeline)
                          if event.startswith(("replay", "backward")))
    peak = max(held + m["stem"] + (m["head"] if i < first_backward else 0)
               for i, (_, held) in enumerate(sim.timeline))
    return peak, sim.recompute_flops


# ---------------------------------------------------------------- Chen's setting: a = b
def run_chain(n: int, shape, plan: Plan, x0) -> dict:
    """A chain of n tanh layers (each saves its output, the size of its input), checkpointed by plan."""
    C.fresh()
    x = tg.Tensor(x0, requires_grad=True)
    blocks = [lambda t: t.tanh()] * n
    with tg.Ledger() as led:
        y = run_plan(blocks, x, plan)
        y.sum().backward()
    out = dict(peak=led.peak_bytes("activation"), recompute=led.flops("recompute"),
               forward=sum(op["flops"] for op in led.ops if op["phase"] == "forward" and op["op"] == "tanh"))
    del x, y
    return out


# ---------------------------------------------------------------- figures
def sweep_figure(res: dict, path: str) -> None:
    g, ch = res["gpt_sweep"], res["chain_sweep"]
    n, nc = res["n_layer"], res["chain_n"]
    fig, axes = plots.new_figure(1, 3, figsize=(15, 4.4))
    unit = plots.byte_unit(max(r["peak"] for r in g))[1]
    div = plots.unit_divisor(unit)
    ks = [r["k"] for r in g]

    ax = axes[0]
    ax.plot(ks, [r["predicted_peak"] / div for r in g], "-", color="#4C72B0", lw=1.5,
            label="predicted (simulate, measured costs)")
    ax.plot(ks, [r["peak"] / div for r in g], "o", color="#C44E52", ms=5, mfc="none", label="measured (ledger)")
    top = res["plain_peak"] / div
    ax.axhline(top, color="grey", ls=":", lw=1)
    ax.text(n, top, "no checkpointing ", ha="right", va="bottom", fontsize=8, color="grey")
    ax.axvline(math.sqrt(n), color="black", ls="--", lw=1)
    ax.text(math.sqrt(n), top * 0.45, f" √n = {math.sqrt(n):.1f}", fontsize=9)
    if res["k_star"] <= n:
        ax.axvline(res["k_star"], color="#55A868", ls="--", lw=1)
        ax.text(res["k_star"], top * 0.85, f"√(n·a/b) = {res['k_star']:.1f} ", fontsize=9, color="#55A868",
                ha="right")
    else:
        ax.annotate(f"√(n·a/b) = {res['k_star']:.1f} > n", (n, top * 0.85), xytext=(-8, 0),
                    textcoords="offset points", ha="right", va="center", fontsize=9, color="#55A868",
                    arrowprops=dict(arrowstyle="-|>", color="#55A868"))
    best = min(g, key=lambda r: r["peak"])
    ax.plot([best["k"]], [best["peak"] / div], "*", color="black", ms=12, label=f"least measured: k = {best['k']}")
    ax.set_xlabel("k checkpointed segments (uniform)")
    ax.set_ylabel(f"peak activation memory ({unit})")
    ax.set_title(f"GPT, n = {n} blocks: a ≈ {res['a_over_b']:.0f}·b", fontsize=10)
    ax.set_ylim(0, top * 1.12)
    ax.set_xlim(0.5, n + 0.5)
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)

    ax = axes[1]
    ax.plot(ks, [100 * r["recompute"] / r["block_forward"] for r in g], "o-", color="#55A868", ms=4,
            label="all k segments checkpointed (GPT(checkpoint=k))")
    lp = res["last_plain_sweep"]
    ax.plot([r["k"] for r in lp], [100 * r["recompute"] / r["block_forward"] for r in lp], "s-", color="#8172B3",
            ms=4, label="last segment plain (checkpoint_sequential)")
    ax.axvline(math.sqrt(n), color="black", ls="--", lw=1)
    ax.set_ylim(0, 115)
    ax.set_xlabel("k segments")
    ax.set_ylabel("recompute FLOPs (% of the blocks' forward)")
    ax.set_title("Recompute: about one forward for every k (less if the last segment is plain)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)

    ax = axes[2]
    cunit = plots.byte_unit(max(r["peak"] for r in ch))[1]
    cdiv = plots.unit_divisor(cunit)
    cks = [r["k"] for r in ch]
    ax.plot(cks, [r["predicted_peak"] / cdiv for r in ch], "-", color="#4C72B0", lw=1.5, label="predicted")
    ax.plot(cks, [r["peak"] / cdiv for r in ch], "o", color="#C44E52", ms=5, mfc="none", label="measured")
    ax.axvline(math.sqrt(nc), color="black", ls="--", lw=1)
    ax.text(math.sqrt(nc), ax.get_ylim()[1] * 0.9, f" √n = {math.sqrt(nc):.0f}", fontsize=9)
    cbest = min(r["peak"] for r in ch)
    ties = [r["k"] for r in ch if r["peak"] == cbest]
    ax.plot(ties, [cbest / cdiv] * len(ties), "*", color="black", ms=10,
            label=f"least measured: k = {ties[0]}…{ties[-1]}" if len(ties) > 1 else f"least: k = {ties[0]}")
    ax.set_ylim(0, max(r["peak"] for r in ch) / cdiv * 1.1)
    ax.set_xlabel("k checkpointed segments (uniform)")
    ax.set_ylabel(f"peak activation memory ({cunit})")
    ax.set_title(f"Chen's setting: {nc} tanh layers, a = b", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.suptitle("k checkpointed segments: peak ≈ k·b + (n/k)·a, least at k = √(n·a/b); recompute stays about one "
                 "forward")
    plots.save(fig, path)


def frontier_figure(res: dict, path: str) -> None:
    fig, ax = plots.new_figure(figsize=(10.5, 6))
    unit = plots.byte_unit(min(c["peak"] for c in res["planner_curve"]))[1]
    div = plots.unit_divisor(unit)
    measured = res["gpt_sweep"] + res["last_plain_sweep"] + res["named"] + res["planner"]
    xmax = 1.15 * max(100 * r["recompute"] / r["block_forward"] for r in measured)
    ax.set_xlim(-0.04 * xmax, xmax)

    def pct(r):
        return 100 * r["recompute"] / r["block_forward"]

    curve = res["planner_curve"]
    ax.step([c["recompute_pct"] for c in curve] + [xmax], [c["peak"] / div for c in curve] + [curve[-1]["peak"] / div],
            where="post", color="#4C72B0", lw=1.2, alpha=0.7, label="plan_chain optimum (predicted, any budget)")
    least = min(curve, key=lambda c: (c["peak"], c["recompute_pct"]))
    if least["recompute_pct"] > xmax:
        ax.annotate(f"least feasible peak {C.format_bytes(least['peak'])}\nneeds "
                    f"{least['recompute_pct']:.0f}% recompute (off the chart)", (xmax, least["peak"] / div),
                    xytext=(-4, -4), textcoords="offset points", ha="right", va="top", fontsize=7, color="#4C72B0")
    ax.set_ylim(least["peak"] / div * 0.72, res["plain_peak"] / div * 1.25)
    g = res["gpt_sweep"]
    ax.scatter([pct(r) for r in g], [r["peak"] / div for r in g], s=22, color="#C44E52", zorder=3,
               label=f"k = 1..{res['n_layer']} segments, all checkpointed")
    lp = res["last_plain_sweep"]
    ax.scatter([pct(r) for r in lp], [r["peak"] / div for r in lp], s=22, marker="s", color="#8172B3", zorder=3,
               label="k segments, last plain (checkpoint_sequential)")
    marks = {"none": ("o", "black"), "every_layer": ("D", "#C44E52"), "sqrt": ("P", "#DD8452"),
             "recursive": ("^", "#2F4F4F"), "recursive (depth 2)": ("v", "#2F4F4F"),
             "save_nothing": ("x", "#937860"), "save_matmuls": ("X", "#55A868"),
             "korthikanti_selective": ("*", "#DA8BC3")}
    same: dict = {}  # policies that land on one point share one label
    for r in res["named"]:
        same.setdefault((r["peak"], r["recompute"]), []).append(r["label"])
    labelled_k = (1, 2, 3, round(math.sqrt(res["n_layer"])), res["n_layer"])
    sweep_at = {(r["peak"], r["recompute"]): r["k"] for r in g if r["k"] in labelled_k}
    below = {"save_matmuls"}  # its label would run under korthikanti_selective's star
    for point, labels in same.items():
        r = next(x for x in res["named"] if x["label"] == labels[0])
        marker, color = marks.get(labels[0], ("o", "grey"))
        ax.scatter([pct(r)], [point[0] / div], s=70 if marker != "*" else 140, marker=marker, color=color, zorder=4)
        k = sweep_at.pop(point, None)  # a sweep point under a named one: one label for both
        ax.annotate(" = ".join(labels) + (f" (k={k})" if k else ""), (pct(r), point[0] / div),
                    xytext=(7, -11 if labels[0] in below else 4), textcoords="offset points", fontsize=7,
                    color=color, fontweight="bold")
    ax.scatter([], [], s=50, marker="D", color="grey", label="named policies (GPT(checkpoint=...), labelled)")
    for i, r in enumerate(res["planner"]):
        ax.scatter([pct(r)], [r["peak"] / div], s=90, marker="h", facecolor="none", edgecolor="#4C72B0", lw=1.6,
                   zorder=5)
        ax.axhline(r["budget"] / div, color="#4C72B0", ls=":", lw=0.8, alpha=0.7)
        ax.annotate(f"budget {i + 1}: {C.format_bytes(r['budget'])}", (ax.get_xlim()[1], r["budget"] / div),
                    xytext=(-4, 2), textcoords="offset points", ha="right", va="bottom", fontsize=7,
                    color="#4C72B0")
        ax.annotate(str(i + 1), (pct(r), r["peak"] / div), xytext=(-9, -3), textcoords="offset points",
                    ha="right", va="top", fontsize=8, color="#4C72B0", fontweight="bold")
    for r in g:
        if (r["peak"], r["recompute"]) in sweep_at:
            ax.annotate(f"k={r['k']}", (pct(r), r["peak"] / div), xytext=(9, 0), textcoords="offset points",
                        va="center", fontsize=7, color="#C44E52")
    ax.scatter([], [], s=90, marker="h", facecolor="none", edgecolor="#4C72B0", lw=1.6,
               label="plan_chain at 3 budgets (measured; dotted: the budget)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
    ax.set_xlabel("recompute FLOPs (% of one forward of the blocks)")
    ax.set_ylabel(f"peak activation memory ({unit}, log scale)")
    ax.set_title(f"Memory–compute frontier, GPT with {res['n_layer']} blocks (every point measured by the ledger)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    plots.save(fig, path)


# ---------------------------------------------------------------- the lesson
def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    sz = sizes(quick)
    cfg = sz["gpt"]
    n = cfg["n_layer"]
    batch = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    print("Lesson 6: √n and beyond")
    C.claim(__doc__)
    print(f"A GPT with n = {n} blocks, d_model {cfg['d_model']}, {cfg['n_head']} heads, B={cfg['batch']}, "
          f"T={cfg['seq_len']}, float32, no dropout; one forward + backward per configuration, under tg.Ledger().")

    # 1. costs
    plain = run_gpt(cfg, batch, keep_ledger=True)
    m = measured_costs(cfg, plain.pop("led"), run_gpt(cfg, batch, "every_layer", keep_ledger=True)["led"])
    a, b, f, t = m["a"], m["b"], m["f"], m["t"]
    k_star = math.sqrt(n * a / b)
    C.heading("1. Per-layer costs, measured from one plain and one every-layer run")
    print(f"a = saved bytes of one block (led.saved_breakdown('layer')['transformer.h.0']): {a:,} B")
    print(f"b = bytes of a block's input, B·T·d·4:                                         {b:,} B  "
          f"(a/b = {a / b:.1f})")
    print(f"f = forward FLOPs of one block (led.flops_by_layer()['transformer.h.0']):        {f:,}")
    print(f"t = FLOPs of its tail, which a replay that ends with it skips:                     {t:,} "
          f"({t / f:.0%} of f)\n    = f less led.flops_by_layer('recompute')['transformer.h.0'] of an every-layer "
          "run: the block's last linear\n    and residual add save only their inputs and backward reads none of their "
          "outputs, so the replay stops before them")
    print(f"outside the chain: the stem (embeddings) keeps {m['stem']:,} B throughout, the head (ln_f, lm_head, "
          f"loss)\n{m['head']:,} B until the backward reaches the blocks. Plain activation peak: "
          f"{C.format_bytes(plain['peak'])} = n·a + stem + head = {n * a + m['stem'] + m['head']:,} B "
          f"(measured {plain['peak']:,} B).")

    # 2. uniform k
    C.heading("2. k checkpointed segments, k = 1..n")
    gpt_sweep, last_plain = [], []
    for k in range(1, n + 1):
        plan = planner.balanced_plan(n, k)
        r = run_gpt(cfg, batch, plan)
        r["predicted_peak"], r["predicted_recompute"] = predict(m, plan)
        r["k"] = k
        gpt_sweep.append(r)
    divisors = [k for k in range(2, n + 1) if n % k == 0]
    for k in divisors:
        plan = planner.balanced_plan(n, k, last_plain=True)
        r = run_gpt(cfg, batch, plan)
        r["predicted_peak"], r["predicted_recompute"] = predict(m, plan)
        r["k"] = k
        last_plain.append(r)
    rows = []
    for r in gpt_sweep:
        if r["k"] in (1, 2, 3, 4, round(math.sqrt(n)), n // 3, n // 2, round(k_star), n - 1, n):
            rows.append((r["k"], C.format_bytes(r["peak"]), C.format_bytes(r["predicted_peak"]),
                         f"{r['peak'] / plain['peak']:.1%}", f"{100 * r['recompute'] / r['block_forward']:.1f}%"))
    print(C.table(rows, ["k", "measured peak", "predicted", "of plain", "recompute"]))
    print("(recompute: FLOPs replayed, as a % of one forward of the blocks, here and below)")
    worst_pred = max(abs(r["peak"] - r["predicted_peak"]) / r["peak"] for r in gpt_sweep + last_plain)
    worst_flops = max(abs(r["recompute"] - r["predicted_recompute"]) / max(r["recompute"], 1)
                      for r in gpt_sweep + last_plain)
    best = min(gpt_sweep, key=lambda r: r["peak"])
    sqrt_row = gpt_sweep[round(math.sqrt(n)) - 1]
    print(f"predicted vs measured over {len(gpt_sweep) + len(last_plain)} plans (k = 1..{n} all checkpointed, and "
          f"the {len(last_plain)} k dividing {n} with the last segment plain): largest peak error "
          f"{worst_pred:.2%}, largest recompute error {worst_flops:.2%}.")
    print(f"least peak at k = {best['k']} ({C.format_bytes(best['peak'])}); √n = {math.sqrt(n):.1f} gives "
          f"{C.format_bytes(sqrt_row['peak'])} at k = {sqrt_row['k']}, {sqrt_row['peak'] / best['peak']:.1f}× more.")
    one_segment, n_segments = (100 * r["recompute"] / r["block_forward"] for r in (gpt_sweep[0], gpt_sweep[-1]))
    print(f"Chen's peak k·b + (n/k)·a is least at k* = √(n·a/b) = √({n}·{a / b:.1f}) = {k_star:.1f} "
          f"(estimate.chen_optimal_segments: {estimate.chen_optimal_segments(n, b, a)}).\n"
          f"√n is that optimum only when a = b. A block keeps {a / b:.0f}× its input, so the best k sits near n: "
          "checkpoint\nevery block (with whole layers, a segment of 2 layers costs a second `a` for every "
          f"k from {(n + 1) // 2} to {n - 1}).\nAnd every k costs about the same: each layer is replayed once, "
          f"less one tail t per segment\n(recompute = n·f - k·t: {one_segment:.1f}% at k = 1, "
          f"{n_segments:.1f}% at k = {n}).")
    lp_best = min(last_plain, key=lambda r: r["recompute"])
    print(f"With the last segment plain (PyTorch's checkpoint_sequential) its n/k layers are not replayed\n"
          f"(k = {lp_best['k']}: {lp_best['recompute'] / lp_best['block_forward']:.0%} of a forward), but their "
          f"saves overlap the head's at the end of the forward:\nk = {n} costs "
          f"{C.format_bytes(last_plain[-1]['peak'] - gpt_sweep[-1]['peak'])} more than all checkpointed "
          f"(= head − b = {m['head'] - b:,} B).")

    # Chen's setting
    nc, shape = sz["chain"]["n"], sz["chain"]["shape"]
    x0 = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    xb = x0.nbytes
    chain_costs = None
    chain_sweep = []
    for k in range(1, nc + 1):
        plan = planner.balanced_plan(nc, k)
        r = run_chain(nc, shape, plan, x0)
        if chain_costs is None:
            chain_costs = [LayerCost(r["forward"] / nc, xb, xb)] * nc
        sim = planner.simulate(chain_costs, plan)
        r.update(k=k, predicted_peak=sim.peak_bytes, predicted_recompute=sim.recompute_flops)
        chain_sweep.append(r)
    cbest = min(r["peak"] for r in chain_sweep)
    ties = [r["k"] for r in chain_sweep if r["peak"] == cbest]
    sqrt_k = round(math.sqrt(nc))
    chain_pred_err = max(abs(r["peak"] - r["predicted_peak"]) / r["peak"] for r in chain_sweep)
    print(f"\nChen's own setting, a chain of {nc} tanh layers on a {list(shape)} array: each layer saves its "
          f"output,\nexactly the size of the next input ({xb:,} B), so a = b. Peak by k (in units of one array):")
    print("  " + "  ".join(f"k={r['k']}:{r['peak'] // xb}" for r in chain_sweep[: min(nc, 12)]) + "  ...  "
          f"k={nc}:{chain_sweep[-1]['peak'] // xb}")
    print(f"least peak {cbest // xb} arrays at k = {ties}; √n = {math.sqrt(nc):.0f} "
          f"{'is among them' if sqrt_k in ties else 'is NOT among them'}; predicted vs measured: largest error "
          f"{chain_pred_err:.2%}.")

    # 3. the planner
    C.heading("3. The planner: least recompute within a budget")
    outside = m["stem"] + m["head"]
    print(f"plan_chain plans the chain; the stem and head keep {outside:,} B outside it (measured above), so "
          "each chain\nbudget is the activation budget minus that. A budget is met when the measured activation "
          "peak is <= it.")
    # exact bytes: the gcd of all sizes as the DP's unit (fast here: identical blocks make few distinct sub-chains)
    exact = math.gcd(*(c.saved_bytes for c in m["costs"]), *(c.input_bytes for c in m["costs"]))
    planner_runs, rows = [], []
    for frac in sz["budgets"]:
        budget = int(frac * plain["peak"])
        plan = planner.plan_chain(m["costs"], budget - outside, granularity=exact)
        coarse = planner.plan_chain(m["costs"], budget - outside)  # default granularity: about budget/128
        r = run_gpt(cfg, batch, plan)
        pred_peak, pred_flops = predict(m, plan)
        r.update(budget=budget, plan=plan.describe(), depth=plan.depth, predicted_peak=pred_peak,
                 predicted_recompute=pred_flops, chain_predicted_peak=plan.predicted_peak_bytes,
                 chain_predicted_recompute=plan.predicted_recompute_flops,
                 coarse_recompute=coarse.predicted_recompute_flops)
        planner_runs.append(r)
        rows.append((f"{frac:.0%} = {C.format_bytes(budget)}", C.format_bytes(pred_peak),
                     C.format_bytes(r["peak"]), "yes" if r["peak"] <= budget else "NO",
                     f"{100 * pred_flops / r['block_forward']:.1f}%",
                     f"{100 * r['recompute'] / r['block_forward']:.1f}%"))
    print(C.table(rows, ["budget (of plain peak)", "predicted peak", "measured", "fits", "pred. recompute",
                         "measured"]))
    for r in planner_runs:
        print(textwrap.fill(r["plan"], 110, initial_indent=f"  budget {C.format_bytes(r['budget'])}: ",
                            subsequent_indent="      "))
    print("([p:q)ckpt{...} is a checkpoint whose replay is itself checkpointed.)")
    print(f"These use granularity={exact} B (exact). With the default granularity (sizes rounded up to about "
          "budget/128)\nthe plans would recompute " + ", ".join(
              f"{100 * r['coarse_recompute'] / r['block_forward']:.1f}%" for r in planner_runs)
          + ": rounding every size up can hide the best plan.")
    uniform = gpt_sweep + last_plain
    for r in planner_runs:
        fitting = [u for u in uniform if u["peak"] <= r["budget"]]
        best_u = min(fitting, key=lambda u: u["recompute"]) if fitting else None
        r["best_uniform_recompute"] = best_u["recompute"] if best_u else None
    print("Least recompute of a uniform plan (part 2) that fits the same budget: " + ", ".join(
        "none fits" if r["best_uniform_recompute"] is None else
        f"{100 * r['best_uniform_recompute'] / r['block_forward']:.1f}%" for r in planner_runs)
        + (": the planner never does worse." if all(
            r["best_uniform_recompute"] is None or r["recompute"] <= r["best_uniform_recompute"] for r in planner_runs)
           else ": the planner does WORSE than a uniform plan somewhere (see above)."))
    print("The plans mix three moves: plain layers (the last ones are never replayed, their backward comes first;"
          "\nwith room to spare, the first ones too), single checkpoints, and, for tight budgets, nested checkpoints.")

    # 4. the frontier
    C.heading("4. The memory–compute frontier")
    named = []
    for label, spec in (("none", None), ("every_layer", "every_layer"), ("sqrt", "sqrt"),
                        ("recursive", planner.recursive_plan(n)), ("recursive (depth 2)", planner.recursive_plan(n, 2)),
                        ("save_nothing", tg.save_nothing), ("save_matmuls", tg.save_matmuls),
                        ("korthikanti_selective", tg.korthikanti_selective)):
        r = run_gpt(cfg, batch, spec)
        r["label"] = label
        named.append(r)
    rows = [(r["label"], C.format_bytes(r["peak"]), f"{r['peak'] / plain['peak']:.1%}",
             f"{100 * r['recompute'] / r['block_forward']:.1f}%") for r in named]
    rows += [(f"plan_chain({C.format_bytes(r['budget'])})", C.format_bytes(r["peak"]),
              f"{r['peak'] / plain['peak']:.1%}", f"{100 * r['recompute'] / r['block_forward']:.1f}%")
             for r in planner_runs]
    print(C.table(rows, ["policy (GPT(checkpoint=...))", "peak activation", "of plain", "recompute"]))
    sqrt_named = next(r for r in named if r["label"] == "sqrt")
    print(f"'sqrt' is planner.sqrt_plan: the k = {round(math.sqrt(n))} row above "
          f"({C.format_bytes(sqrt_named['peak'])}, measured again here);\n'save_nothing' replays every block, "
          "as 'every_layer' does, and peaks the same.")
    print("Nesting (recursive) goes below every single-level plan, at the price of replaying most layers "
          "more than once;\nselective policies keep most of the block and replay a few cheap ops: little memory "
          "saved, little recompute.")
    curve = []
    lo = planner.minimum_peak_bytes(m["costs"])
    hi = sum(c.saved_bytes for c in m["costs"])
    for chain_budget in np.geomspace(lo, hi, 40 if not quick else 16):
        plan = planner.plan_chain(m["costs"], int(math.ceil(chain_budget)), granularity=exact)
        peak, flops = predict(m, plan)
        curve.append(dict(peak=peak, recompute_pct=100 * flops / sum(c.forward_flops for c in m["costs"])))
    curve.sort(key=lambda c: c["recompute_pct"])
    by = {r["label"]: r for r in named}
    depth2, every = by["recursive (depth 2)"], by["every_layer"]
    if depth2["peak"] > every["peak"] and depth2["recompute"] > every["recompute"]:
        print(f"Not every nesting helps: recursive_plan(n, depth=2) replays its deepest halves plainly, and is worse "
              f"than every_layer\non both axes ({C.format_bytes(depth2['peak'])} and "
              f"{100 * depth2['recompute'] / depth2['block_forward']:.0f}% against {C.format_bytes(every['peak'])} "
              f"and {100 * every['recompute'] / every['block_forward']:.0f}%).")
    sm = by["save_matmuls"]
    sm_pct = 100 * sm["recompute"] / sm["block_forward"]
    block_level = min(c["peak"] for c in curve if c["recompute_pct"] <= sm_pct)
    print(f"At save_matmuls' {sm_pct:.1f}% of recompute, the best block-level plan (plan_chain) peaks at "
          f"{C.format_bytes(block_level)}, save_matmuls at\n{C.format_bytes(sm['peak'])}: the planner only cuts "
          "between blocks, a policy chooses inside them.")

    res = dict(
        config=cfg, n_layer=n, a=a, b=b, f=f, t=t, a_over_b=a / b, k_star=k_star, stem=m["stem"], head=m["head"],
        plain_peak=plain["peak"], gpt_sweep=gpt_sweep, last_plain_sweep=last_plain,
        best_k=best["k"], best_peak=best["peak"], sqrt_k_peak=sqrt_row["peak"],
        max_peak_prediction_error=worst_pred, max_recompute_prediction_error=worst_flops,
        chain_n=nc, chain_sweep=chain_sweep, chain_best_ks=ties, chain_best_peak=cbest,
        chain_prediction_error=chain_pred_err, planner=planner_runs, named=named, planner_curve=curve,
    )
    sweep_path = C.fig_path(out, f"{SLUG}_sweep.png")
    frontier_path = C.fig_path(out, f"{SLUG}_frontier.png")
    sweep_figure(res, sweep_path)
    frontier_figure(res, frontier_path)
    elapsed = time.perf_counter() - t0
    print(f"\nwrote {sweep_path}\nwrote {frontier_path}  ({elapsed:.1f} s)")
    res.update(figures=[sweep_path, frontier_path], seconds=elapsed)
    return res


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"a block keeps a = {r['a_over_b']:.1f}× its input b, so the best k is {r['best_k']} of "
            f"{r['n_layer']} (√(n·a/b) = {r['k_star']:.1f}), not √n; the tanh chain (a = b): k = "
            f"{', '.join(map(str, r['chain_best_ks']))}",
            "the chain model's predictions against the measured peaks: largest error "
            f"{r['max_peak_prediction_error']:.1%}"]


if __name__ == "__main__":
    C.cli(main, __doc__)
