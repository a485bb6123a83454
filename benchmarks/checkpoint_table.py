"""Peak memory and FLOPs of every checkpointing plan on a 32-layer small GPT; writes docs/checkpointing.md.

    python benchmarks/checkpoint_table.py [--quick] [--out docs/checkpointing.md]

For each plan: the activation peak and total peak from the ledger, the total peak tracemalloc
saw in a separate run (it also sees the temporaries inside ops, which the ledger does not hold),
and the FLOPs by phase. The planner is given per-layer costs measured from the uncheckpointed
ledger run (and the tail each replay stops before, from the every-layer run) and three budgets;
its predicted peak (chain model + the constant saves outside the blocks) is printed beside the
measured one.
"""

from __future__ import annotations

import argparse
import math
import tracemalloc
from pathlib import Path

import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.scale.measure import layer_costs
from tinygrad_ckpt.units import format_bytes


def build(n_layer, d, T, B, heads, checkpoint):
    tg.manual_seed(0)
    model = nn.GPT(vocab_size=128, block_size=T, n_layer=n_layer, n_head=heads, d_model=d, checkpoint=checkpoint)
    idx = np.random.default_rng(0).integers(0, 128, (B, T))
    return model, idx


def measure(cfg, checkpoint):
    model, idx = build(**cfg, checkpoint=checkpoint)
    with tg.Ledger() as led:
        logits, loss = model(idx, idx)
        del logits
        loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    tracemalloc.start()  # before the model is built, so its parameters count as in the ledger
    base = tracemalloc.get_traced_memory()[0]
    model, idx = build(**cfg, checkpoint=checkpoint)
    logits, loss = model(idx, idx)
    del logits
    loss.backward()
    traced_peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return led, traced_peak, grads


def layer_costs_of(base_led, every_led, cfg):
    """Per-layer costs (tinygrad_ckpt.scale.measure.layer_costs) and the bytes saved outside the blocks."""
    blocks = [f"transformer.h.{i}" for i in range(cfg["n_layer"])]
    costs = layer_costs(base_led, every_led, blocks, cfg["B"] * cfg["T"] * cfg["d"] * 4)
    outside = sum(v for k, v in base_led.saved_breakdown(by="layer").items() if k not in blocks)
    return costs, outside


def main(quick=False, out="docs/checkpointing.md"):
    cfg = dict(n_layer=8 if quick else 32, d=32 if quick else 64, T=32 if quick else 64, B=4, heads=4)
    n = cfg["n_layer"]
    base_led, base_traced, base_grads = measure(cfg, None)
    every = measure(cfg, "every_layer")
    costs, outside = layer_costs_of(base_led, every[0], cfg)
    block_forward = sum(c.forward_flops for c in costs)
    full = planner.simulate(costs, planner.no_checkpoint_plan(n)).peak_bytes
    low = planner.minimum_peak_bytes(costs)
    budgets = [int(low + f * (full - low)) for f in (0.1, 0.3, 0.6)]
    plans = [("none", None), ("every layer", "every_layer"), (f"sqrt (k={round(math.sqrt(n))})", "sqrt"),
             ("selective (Korthikanti)", tg.korthikanti_selective), ("save matmuls", tg.save_matmuls)]
    planned = []
    for b in budgets:
        plan = planner.plan_chain(costs, b)
        planned.append((f"planner, chain budget {format_bytes(b)}", plan))
    rows = []
    for label, spec in plans + planned:
        led, traced, grads = ((base_led, base_traced, base_grads) if spec is None
                              else every if spec == "every_layer" else measure(cfg, spec))
        same = all(np.array_equal(grads[k], base_grads[k]) for k in base_grads)
        predicted = ""
        if isinstance(spec, planner.Plan):
            predicted = (f"{format_bytes(spec.predicted_peak_bytes + outside)}, "
                         f"{spec.predicted_recompute_flops / block_forward:.3f}")
        rows.append((label, led.peak_bytes("activation"), predicted, led.peak_bytes(), traced,
                     led.flops("forward"), led.flops("recompute"), led.flops("recompute") / block_forward, same,
                     spec.describe() if isinstance(spec, planner.Plan) else ""))
        print(f"{label:<32} act {format_bytes(rows[-1][1]):>10} recompute {rows[-1][7]:.3f} x fwd  grads equal: {same}")
    lines = [
        "# Checkpointing plans on a small GPT, measured",
        "",
        f"GPT with {n} layers, d={cfg['d']}, T={cfg['T']}, B={cfg['B']}, {cfg['heads']} heads, float32, no dropout; "
        "one forward + backward. Regenerate with `python benchmarks/checkpoint_table.py`.",
        "",
        "Activation peak and total peak are the ledger's; *traced peak* is tracemalloc's peak in a separate "
        "run (all NumPy and Python allocations, including the temporaries inside ops that the ledger does not "
        "hold). *Predicted* is the planner's chain model: its activation peak plus the activations saved outside "
        f"the blocks ({format_bytes(outside)}: embeddings, final layer norm, lm_head, loss), and its recompute. A "
        "replay stops once backward has every array it needs (before each segment's last linear and residual "
        "add), so every layer recomputes less than one forward. Recompute is in units of one "
        f"forward of the {n} blocks ({block_forward:.3e} FLOPs).",
        "",
        "| plan | activation peak | predicted (peak, recompute) | total peak (ledger) | traced peak | forward FLOPs "
        "| recompute FLOPs "
        "| recompute / block forward | gradients bitwise equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for label, act, pred, total, traced, fwd, rec, ratio, same, _ in rows:
        lines.append(f"| {label} | {format_bytes(act)} | {pred or '–'} | {format_bytes(total)} | "
                     f"{format_bytes(traced)} | {fwd:.3e} | {rec:.3e} | {ratio:.3f} | {'yes' if same else 'NO'} |")
    lines += ["", "Planner schedules:", ""]
    lines += [f"- {label}: `{desc}`" for label, *_, desc in rows if desc]
    lines += ["", f"Per-layer measured costs: saved {format_bytes(costs[0].saved_bytes)}, input "
              f"{format_bytes(costs[0].input_bytes)}, forward {costs[0].forward_flops:.3e} FLOPs, of which the tail "
              f"a replay stops before {costs[0].tail_flops:.3e}.", ""]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text("\n".join(lines))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="docs/checkpointing.md")
    args = parser.parse_args()
    main(quick=args.quick, out=args.out)
