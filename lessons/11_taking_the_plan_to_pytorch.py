"""Lesson 11: taking the plan to PyTorch.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): discarding idle activations and recomputing them on demand turns memory into
compute, in any autograd system that keeps every intermediate for backward; PyTorch is the one the
chapter's readers train with. Measured here: the same plans, in this engine and in PyTorch.

What this lesson adds: a checkpointing plan chosen here carries over to PyTorch unchanged. The planner picks
segments for a memory budget from this engine's measured costs; applied to the same GPT in PyTorch
(torch.utils.checkpoint, non-reentrant, for plans; selective activation checkpointing for policies), PyTorch
keeps the bytes the ledger measured once each measured difference between the two is counted like for like: to
the byte, for every plan and for the selective policy, but for the loss's arrays where the peak is the forward's
end. The time each plan costs is measured too, in both, on the same number of threads, and printed beside
(on a shared CPU these times are noisy; this engine also checks every replay against its forward, which PyTorch
does not).

What you will see: one GPT (dropout on) under five plans (none, every layer, √n segments, the planner's plan
for a budget, Korthikanti's selective recomputation), each measured twice: by the ledger (this engine, NumPy)
and by tinygrad_ckpt.torch_bridge.SavedBytes (PyTorch: every storage autograd, a checkpoint replay or the
selective cache holds for backward, counted once). Beside the raw numbers, the measured differences:
PyTorch's CPU dropout keeps float noise (4 bytes an element, against a mask of 1 bit); selective
checkpointing caches outputs backward never reads (a Linear's output before a residual add) and outputs its
replay never takes back (it stops after the last tensor the forward saved, so a block's output stays cached
until the step ends: "stranded"); it cannot cache dropout noise (an in-place random op), so it draws again in
the replay the masks this engine keeps; and a checkpoint saves its input as it enters, where this engine's
saves it as the segment's forward ends ("entering").
The PyTorch GPT's layer norm keeps what this engine's keeps, its output and 1/std (torch_bridge.LayerNorm;
stock torch.nn.LayerNorm keeps its input instead, as docs/benchmarks.md measures).

Read: tinygrad_ckpt/torch_bridge/__init__.py (TorchGPT, run_blocks, SavedBytes),
tinygrad_ckpt/torch_bridge/saves.py (TorchStep.like_for_like),
tinygrad_ckpt/recompute/planner.py (plan_chain), tinygrad_ckpt/recompute/policies.py (the policies: Policy,
KorthikantiSelective).

Run: python lessons/11_taking_the_plan_to_pytorch.py [--quick] [--out figures]
(needs the optional extra: pip install -e ".[torch]"; without torch the lesson says so and skips.)
Figure: {out}/11_taking_the_plan_to_pytorch.png (activation peak per plan: the ledger, PyTorch raw and like for
like; seconds per step in both).
"""

from __future__ import annotations

import time

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt.backend import threads
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.scale.measure import layer_costs

SLUG = "11_taking_the_plan_to_pytorch"


def seconds(step, repeats: int) -> float:
    """The fastest of `repeats` runs of step() (no ledger, no meter: their bookkeeping is not the plan's cost)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    return best


def main(quick: bool = False, out: str = "figures") -> dict:
    print("Lesson 11: taking the plan to PyTorch")
    C.claim(__doc__)
    try:
        import torch  # noqa: F401

        from tinygrad_ckpt import torch_bridge as tb
    except ImportError as exc:
        return C.without_torch(exc)

    V, T, L, H, D, B, p = (64, 32, 4, 4, 64, 4, 0.1) if quick else (256, 128, 8, 8, 256, 8, 0.1)
    model = C.make_gpt(V, T, L, H, D, dropout=p)
    idx, _ = C.token_batch(V, B, T)
    print(f"GPT: {L} layers, d = {D}, {H} heads, T = {T}, B = {B}, dropout {p}, float32, on the CPU")

    C.heading("1. The planner's plan for a budget, from this engine's measured costs")
    led = C.engine_step(model, idx)
    model.checkpoint = "every_layer"  # for the tails: what each block's replay stops before
    costs = layer_costs(led, C.engine_step(model, idx), [f"transformer.h.{k}" for k in range(L)], B * T * D * 4)
    model.checkpoint = None
    plain = sum(c.saved_bytes for c in costs)
    budget = int(0.45 * plain)
    plan = planner.plan_chain(costs, budget, max_depth=1)
    print(f"the blocks save {C.format_bytes(plain)} when nothing is checkpointed; budget 45% of that, "
          f"{C.format_bytes(budget)}:\nplan_chain -> {plan.describe()} (predicted peak "
          f"{C.format_bytes(plan.predicted_peak_bytes)}, recompute {plan.predicted_recompute_flops:.3g} FLOPs)")

    C.heading("2. The same plans in this engine and in PyTorch, measured")
    plans = {"none": None, "every layer": "every_layer", "√n segments": "sqrt", "planner": plan,
             "selective (K22)": tg.korthikanti_selective}
    torch_model = tb.TorchGPT.from_engine(model)
    ids = torch.as_tensor(idx)

    def engine_run():
        _, loss = model(idx, idx)
        loss.backward()
        model.zero_grad()

    def torch_run():
        _, loss = torch_model(ids, ids)
        loss.backward()
        torch_model.zero_grad()

    torch_threads, n_threads = torch.get_num_threads(), threads.threads()
    torch.set_num_threads(n_threads)  # as many as this engine's elementwise ops (and NumPy's BLAS, every core) use
    rows, results = [], {}
    for label, spec in plans.items():
        model.checkpoint = torch_model.checkpoint = spec
        engine = C.engine_step(model, idx).peak_bytes("activation")
        step = tb.measure_step(torch_model, idx, idx)
        terms = step.like_for_like()
        engine_seconds, torch_seconds = seconds(engine_run, 3), seconds(torch_run, 3)
        results[label] = dict(engine=engine, engine_seconds=engine_seconds, torch=step.peak,
                              torch_seconds=torch_seconds, **terms)
        rows.append((label, f"{engine:,}", f"{step.peak:,}", f"{step.peak / engine - 1:+.1%}",
                     f"{terms['noise_masks'] - terms['noise']:+,}", f"{terms['regenerated']:+,}",
                     f"{-terms['dead_cache']:+,}", f"{-terms['stranded_cache']:+,}", f"{-terms['entering']:+,}",
                     f"{terms['comparable']:,}",
                     f"{terms['comparable'] / engine - 1:+.2%}",
                     f"{engine_seconds * 1e3:.1f}", f"{torch_seconds * 1e3:.1f}"))
    torch.set_num_threads(torch_threads)
    print(C.table(rows, ["plan", "ledger (B)", "PyTorch (B)", "raw", "noise", "masks kept", "dead cache",
                         "stranded", "entering", "like for like", "vs ledger", "ours ms", "torch ms"]))
    print(f"(times: the fastest of 3 steps, each engine on {n_threads} thread(s))")
    print("(each column between 'raw' and 'like for like' is measured in PyTorch's step: 'noise' turns CPU\n"
          "dropout's float noise into a mask of 1 bit per element, as this engine keeps; 'masks kept' adds, while a\n"
          "block waits for its replay, the 1-bit masks of the dropouts the selective policy keeps, which PyTorch\n"
          "cannot cache (an in-place random op) and draws again in the replay; 'dead cache' removes what selective\n"
          "checkpointing cached and backward never reads, 'stranded' what it cached and its replay never took back;\n"
          "'entering' counts a checkpoint's input from the segment's end, as this engine saves it. Each term is\n"
          "measured at the moment the like-for-like count peaks. The PyTorch model's layer norm keeps its output and\n"
          "1/std, as this engine's does, as one op. Left over: the loss's arrays (PyTorch's log-softmax and a 0-d\n"
          "total, this engine's logits, a log-sum-exp and a flag per row) where the peak is the forward's end)")
    worst = max(abs(r["comparable"] / r["engine"] - 1) for r in results.values())
    print(f"\nlike for like, PyTorch and the ledger agree within {worst:.2%} for every plan.")
    base_e, base_t = results["none"]["engine_seconds"], results["none"]["torch_seconds"]
    for label in ("every layer", "planner"):
        r = results[label]
        print(f"{label}: activation peak {r['engine'] / results['none']['engine']:.0%} of the plain run here, "
              f"{r['torch'] / results['none']['torch']:.0%} in PyTorch; step time ×{r['engine_seconds'] / base_e:.2f} "
              f"here, ×{r['torch_seconds'] / base_t:.2f} in PyTorch")

    path = C.fig_path(out, f"{SLUG}.png")
    fig, (ax, ax2) = plots.new_figure(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2.2, 1]})
    labels = list(results)
    x = np.arange(len(labels))
    width = 0.27
    series = (("engine", "ledger (this engine)", "#1f77b4"), ("torch", "PyTorch, raw", "#d62728"),
              ("comparable", "PyTorch, like for like", "#ff9896"))
    for i, (key, name, color) in enumerate(series):
        values = [results[lbl][key] / 2**20 for lbl in labels]
        ax.bar(x + (i - 1) * width, values, width, label=name, color=color)
    ax.set_xticks(x)
    ax.set_xticklabels([lbl if lbl != "planner" else f"planner\n≤ {C.format_bytes(budget)}" for lbl in labels],
                       fontsize=8)
    ax.set_ylabel("activation peak of one step (MiB)")
    ax.set_title("what each plan keeps for backward", fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    for i, (key, name, color) in enumerate((("engine_seconds", "this engine (NumPy)", "#1f77b4"),
                                            ("torch_seconds", "PyTorch (CPU)", "#d62728"))):
        ax2.bar(x + (i - 0.5) * 0.38, [results[lbl][key] * 1e3 for lbl in labels], 0.38, label=name, color=color)
    ax2.set_xticks(x)
    ax2.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
    ax2.set_ylabel("forward + backward (ms, fastest of 3)")
    ax2.set_title(f"time of one step ({n_threads} thread{'s' if n_threads > 1 else ''} each)", fontsize=10)
    ax2.set_ylim(0, ax2.get_ylim()[1] * 1.2)  # room above the bars for the legend
    ax2.legend(fontsize=8, frameon=False)
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle(f"The same plans in this engine and in PyTorch ({L} layers, d={D}, T={T}, B={B}, dropout {p})",
                 fontsize=10)
    plots.save(fig, path)
    print(f"\nfigure: {path}")
    return {"plan": plan.describe(), "budget": budget, "results": results, "worst_like_for_like": worst,
            "threads": n_threads, "figures": [path]}


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    if "skipped" in r:
        return [f"skipped: {r['skipped']}"]
    raw = max(abs(x["torch"] / x["engine"] - 1) for x in r["results"].values())
    return [f"the planner's plan {r['plan']} for {C.format_bytes(r['budget'])}, and four more, in PyTorch",
            f"PyTorch's saved bytes against the ledger: within {raw:.0%} raw, {abs(r['worst_like_for_like']):.2%} "
            "like for like"]


if __name__ == "__main__":
    C.cli(main, __doc__)
