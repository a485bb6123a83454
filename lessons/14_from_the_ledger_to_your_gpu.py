"""Lesson 14: from the ledger to your GPU: the framework's choices, the allocator's reserve, the device's capacity.

What you will see: one model, GPT-2 XL (1.56 B parameters) at B = 16, T = 1024, trained with AdamW, estimated on
the shape-only meta backend three ways: as this engine runs it (pure float16, explicit attention, its own saves),
as PyTorch AMP runs it with flash attention (autocast bfloat16: float32 weights, gradients and states; PyTorch's
saves) and as Megatron runs it (bfloat16 weights with float32 master weights and main gradients, flash attention,
Korthikanti's saves), each with no checkpointing, selective recomputation and every layer checkpointed. Each step
is then replayed through a simulation of PyTorch's CUDA caching allocator: what it reserves beside what the
ledger counts as allocated, against what an H100 "80 GB" really gives a process. Then: the largest batch that
fits each way, and why.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing Solves"): a
step needs parameters, gradients, optimizer states and activations, and checkpointing trades the activations for
recompute until the step fits the device. Measured here: that the sum depends on choices the chapter's arithmetic
leaves implicit, each moving it by gigabytes: the bytes a parameter costs (12 pure, 16 under AMP, 18 under
Megatron's mixed precision), what each op keeps (flash attention keeps no [T, T] array; autocast keeps half copies
of the weights and float32 norms), what the allocator reserves above what tensors hold, and the capacity itself
(79.2 GiB reported, 78.7 GiB left after CUDA's context, not the 74.5 GiB that "80 GB" reads as).

Read: tinygrad_ckpt/scale/measure.py (PRECISIONS, SteadyStep: precision, attention, saves),
tinygrad_ckpt/scale/save_profiles.py (saves_like), tinygrad_ckpt/amp.py (autocast),
tinygrad_ckpt/memory/cuda_allocator.py (the simulated allocator), tinygrad_ckpt/scale/devices.py (what each GPU
reports), tinygrad_ckpt/scale/report.py (device_fit).

Run: python lessons/14_from_the_ledger_to_your_gpu.py [--quick] [--out figures]
(--quick: GPT-2 small at B = 8, three batch sizes tried.)
Figure: {out}/14_from_the_ledger_to_your_gpu.png (three panels: the step's peak by category, three ways × three
plans, with the reserved peak and the capacity; one step's allocated and reserved bytes over time; the largest
batch that fits an H100).
"""

from __future__ import annotations

import _common as C
from matplotlib.lines import Line2D

from tinygrad_ckpt.memory import cuda_allocator, plots
from tinygrad_ckpt.memory.palette import CATEGORY_COLORS
from tinygrad_ckpt.scale import devices
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import PRECISIONS, SteadyStep
from tinygrad_ckpt.scale.report import device_fit, gradient_peaks

SLUG = "14_from_the_ledger_to_your_gpu"
MODEL, BATCH, SEQ = "gpt2-xl", 16, 1024
QUICK_MODEL, QUICK_BATCH = "gpt2", 8  # --quick: GPT-2 small, so that the lesson runs in seconds
GPU = devices.DEVICES["H100-80GB"]
GiB = 2**30
WAYS = {  # how each framework keeps its numbers: (precision, attention, saves)
    "this engine": ("fp16", "explicit", "engine"),
    "PyTorch AMP + flash": ("amp-bf16", "flash", "pytorch"),
    "Megatron": ("mixed-bf16", "flash", "megatron"),
}
PLANS = ("none", "selective", "every_layer")
CATEGORIES = ("parameter", "gradient", "optimizer", "activation", "other")


def step_of(way: str, model: str, batch: int) -> SteadyStep:
    precision, attention, saves = WAYS[way]
    return SteadyStep(est.preset(model, batch=batch, seq_len=SEQ), precision=precision, attention=attention,
                      saves=saves)


def measured(step: SteadyStep, plan: str, settings: str = "") -> dict:
    """One step's peaks by category (the ledger), its reserved peak and fit on the H100 (the simulated allocator)."""
    C.fresh()
    led, seconds = step.measure(plan)
    fit = device_fit(led.events, GPU.usable_bytes, GPU, settings)
    params = {p.name for p in step.model.parameters()}
    tl = led.timeline()
    at = int(tl["total"].argmax())  # the moment of the peak: what each category holds then
    return {"peak": led.peak_bytes(), "by": {c: led.peak_bytes(c) for c in CATEGORIES},
            "at_peak": {c: int(tl[c][at]) for c in CATEGORIES},
            "param_grads": gradient_peaks(led, params)[0], "reserved": fit.reserved_peak, "fits": fit.fits,
            "per_layer": led.saved_breakdown(by="layer")["transformer.h.0"],
            "seconds": seconds, "led": led}


def largest_batch(way: str, model: str, plan: str, batches) -> tuple[int, dict]:
    """The largest batch in `batches` whose reserved peak fits the H100 (bisection: fitting is monotone in B)."""
    lo, hi, best = 0, len(batches) - 1, (0, None)
    while lo <= hi:
        mid = (lo + hi) // 2
        run = measured(step_of(way, model, batches[mid]), plan)
        run.pop("led")
        if run["fits"]:
            best, lo = (batches[mid], run), mid + 1
        else:
            hi = mid - 1
    return best


def main(quick: bool = False, out: str = "figures") -> dict:
    print("Lesson 14: from the ledger to your GPU")
    C.claim(__doc__)
    model, batch = (QUICK_MODEL, QUICK_BATCH) if quick else (MODEL, BATCH)
    P = est.parameter_count(est.preset(model, batch=batch, seq_len=SEQ))
    print(f"{model}: {P:,} parameters, B = {batch}, T = {SEQ}, AdamW; one steady step on the meta backend each way. "
          f"Device: {GPU.name}, {C.format_bytes(GPU.total_bytes)} reported, {C.format_bytes(GPU.usable_bytes)} for "
          f"tensors after {C.format_bytes(GPU.overhead_bytes)} for CUDA's context and workspaces.")
    result: dict = {"config": dict(model=model, batch=batch, seq_len=SEQ, parameters=P, usable=GPU.usable_bytes,
                                   reported=GPU.total_bytes), "runs": {}, "figures": []}

    C.heading("1. The bytes a parameter costs, measured (weights, their gradients, AdamW's states)")
    rows = []
    for way in WAYS:
        step = step_of(way, model, batch)
        runs = result["runs"][way] = {plan: measured(step, plan) for plan in PLANS}
        plain = runs["none"]
        per = {c: plain["by"][c] / P for c in ("parameter", "optimizer")} | {"gradient": plain["param_grads"] / P}
        rows.append((way, PRECISIONS[WAYS[way][0]].name, f"{per['parameter']:.2f}", f"{per['gradient']:.2f}",
                     f"{per['optimizer']:.2f}", f"{sum(per.values()):.2f}"))
        result["runs"][way]["bytes_per_parameter"] = per
        del step  # a ledger counts every engine buffer alive when it starts: no model may outlive its measurement
    print(C.table(rows, ["way", "precision", "weights", "gradients", "states", "B a parameter"]))
    print("The measured gradients include, briefly, a second gradient of a tied or half weight in flight (the "
          "embedding's two uses; a bfloat16 gradient before it is added into its float32 main gradient).")

    C.heading("2. What one block keeps for backward (no checkpointing)")
    base = result["runs"]["this engine"]["none"]["per_layer"]
    rows = [(way, C.format_bytes(r["none"]["per_layer"]), f"{r['none']['per_layer'] / base:.2f}x")
            for way, r in result["runs"].items()]
    print(C.table(rows, ["way", "saved a block", "vs this engine"]))
    print("This engine keeps the [B, H, T, T] attention weights (explicit attention); flash attention keeps q, k, v, "
          "its output and a log-sum-exp a row instead. Under AMP the layer norms run in float32 and each linear keeps "
          "the bfloat16 copy of its weight that autocast made; Megatron keeps each layer norm's input, as "
          "Korthikanti's Table 2 counts.")

    C.heading(f"3. The step's peak, allocated and reserved, on an {GPU.name}")
    rows = []
    for way, runs in result["runs"].items():
        for plan in PLANS:
            r = runs[plan]
            rows.append((way, plan, C.format_bytes(r["by"]["activation"]), C.format_bytes(r["peak"]),
                         C.format_bytes(r["reserved"]), f"{(r['reserved'] - r['peak']) / GiB:+.2f} GiB",
                         "fits" if r["fits"] else "does NOT fit"))
    print(C.table(rows, ["way", "checkpoint", "activations", "allocated peak", "reserved peak", "reserve",
                         f"{C.format_bytes(GPU.usable_bytes)}"]))
    marketed = 80 * 10**9
    print(f"'80 GB' is {C.format_bytes(marketed)} when read as 80·10^9 bytes; the card reports "
          f"{C.format_bytes(GPU.total_bytes)}, and a process gets {C.format_bytes(GPU.usable_bytes)} of it.")

    C.heading("4. Allocated and reserved over one step (PyTorch AMP + flash, no checkpointing)")
    led = result["runs"]["PyTorch AMP + flash"]["none"]["led"]
    traces = {conf or "default": cuda_allocator.trace_events(led.events, conf or None)
              for conf in ("", "expandable_segments:True")}
    for name, trace in traces.items():
        print(f"  {name:<26} reserved peak {C.format_bytes(trace.peak_reserved)}, allocated (blocks) peak "
              f"{C.format_bytes(trace.peak_allocated)}, ledger peak {C.format_bytes(led.peak_bytes())}, "
              f"{len(trace.segments)} segments at the end")
    entry = sum(ev.action == "existing" for ev in led.events) - 1  # from the state at entry (what the step held
    reserved = {k: t.reserved[entry:] for k, t in traces.items()}  # before it began), not the scan's ramp up to it
    result["timeline"] = {"event": range(entry, len(led.events)), "total": led.timeline()["total"][entry:], **reserved}
    result["reserved_by_conf"] = {k: t.peak_reserved for k, t in traces.items()}

    C.heading("5. The largest batch that fits, each way and plan")
    batches = [8, 32, 128] if quick else [4, 8, 12, 16, 20, 24, 32, 48, 64, 96, 128, 160, 192, 256]
    rows, result["largest"] = [], {}
    for way in WAYS:
        for plan in PLANS:
            b, run = largest_batch(way, model, plan, batches)
            result["largest"][(way, plan)] = b
            rows.append((way, plan, str(b) if b else "none",
                         C.format_bytes(run["reserved"]) if run else "", why(run) if run else ""))
    print(C.table(rows, ["way", "checkpoint", "largest B tried that fits", "its reserved peak", "what holds most"]))
    states = {way: runs["none"]["by"]["parameter"] + runs["none"]["by"]["optimizer"] + runs["none"]["param_grads"]
              for way, runs in result["runs"].items()}
    largest = ", ".join(f"{way} {result['largest'][(way, 'none')]}" for way in WAYS)
    print("Why: without checkpointing the activations hold most of the peak whichever way, so the batch is set by "
          "what each op keeps: flash attention keeps no [T, T] weights, where this engine's explicit attention "
          f"does, against the 4 or 6 more bytes a parameter AMP and Megatron spend (largest batch without "
          f"checkpointing: {largest}). With every layer checkpointed what "
          "is left is the block inputs (B·T·d a layer: float32 under AMP, whose residual stream is float32; half "
          "elsewhere), one block's replay (with this engine's [T, T] weights again) and the weights, gradients and "
          "states: " + ", ".join(f"{way} {C.format_bytes(n)}" for way, n in states.items()) + ".")
    for run in result["runs"].values():
        for r in run.values():
            if isinstance(r, dict):
                r.pop("led", None)

    path = C.fig_path(out, f"{SLUG}.png")
    figure(path, result, batches)
    result["figures"].append(path)
    print(f"\nwrote {path}")
    return result


def why(run: dict) -> str:
    """The largest share of a fitting step's peak, in words."""
    states = run["by"]["parameter"] + run["by"]["optimizer"] + run["param_grads"]
    act = run["by"]["activation"]
    return (f"weights, gradients, states {states / run['peak']:.0%}" if states > act
            else f"activations {act / run['peak']:.0%}")


def figure(path, r: dict, batches) -> None:
    fig, (a, b, c) = plots.new_figure(1, 3, figsize=(17, 5.6))
    ticks, x = [], 0.0
    for way in WAYS:
        first = x
        for plan in PLANS:
            run, bottom = r["runs"][way][plan], 0.0
            for cat in CATEGORIES:  # what each category holds at the moment of the step's peak
                h = run["at_peak"][cat] / GiB
                a.bar(x, h, bottom=bottom, color=CATEGORY_COLORS[cat], width=0.8, edgecolor="white", lw=0.4)
                bottom += h
            a.plot([x - 0.4, x + 0.4], [run["reserved"] / GiB] * 2, color="black", lw=1.8)
            ticks.append((x, {"none": "none", "selective": "selective", "every_layer": "every\nlayer"}[plan]))
            x += 1
        a.annotate(way, ((first + x - 1) / 2, 0), xycoords=("data", "axes fraction"), xytext=(0, -34),
                   textcoords="offset points", ha="center", fontsize=9, fontweight="bold")
        x += 0.6
    a.axhline(GPU.usable_bytes / GiB, color="#B2182B", lw=1.4, ls="--")
    a.axhline(80e9 / GiB, color="#E69F00", lw=1.2, ls=":")
    a.set_xticks([p for p, _ in ticks], [t for _, t in ticks], fontsize=8)
    a.set_ylabel("GiB at the step's peak")
    handles = [Line2D([], [], color=CATEGORY_COLORS[cat], lw=8, label=cat) for cat in CATEGORIES]
    handles += [Line2D([], [], color="black", lw=1.8, label="reserved peak (simulated allocator)"),
                Line2D([], [], color="#B2182B", lw=1.4, ls="--", label=f"{GPU.name}: usable "
                       f"{GPU.usable_bytes / GiB:.1f} GiB"),
                Line2D([], [], color="#E69F00", lw=1.2, ls=":", label="'80 GB' read as 80·10⁹ B = 74.5 GiB")]
    a.legend(handles=handles, fontsize=7, frameon=False, loc="upper right")
    cfg = r["config"]
    a.set_title(f"(1) one step of {cfg['model']}, B = {cfg['batch']}, T = {SEQ}: allocated at its peak, reserved",
                fontsize=10)
    top = max(run["reserved"] for runs in r["runs"].values() for run in runs.values()
              if isinstance(run, dict) and "reserved" in run)
    a.set_ylim(0, top / GiB * 1.3)

    tl = r["timeline"]
    steps = tl["event"]
    b.plot(steps, tl["total"] / GiB, color="#333333", lw=1.2, label="allocated (the ledger)")
    b.plot(steps, tl["default"] / GiB, color="#2166AC", lw=1.2, label="reserved, default allocator")
    b.plot(steps, tl["expandable_segments:True"] / GiB, color="#1B9E77", lw=1.0, ls="--",
           label="reserved, expandable_segments:True")
    b.axhline(GPU.usable_bytes / GiB, color="#B2182B", lw=1.4, ls="--")
    b.set_xlabel("ledger event")
    b.set_ylabel("GiB")
    b.legend(fontsize=8, frameon=False, loc="lower right")
    b.set_title("(2) PyTorch AMP + flash, no checkpointing: allocated vs reserved", fontsize=10)

    width = 0.25
    for i, way in enumerate(WAYS):
        ys = [r["largest"][(way, plan)] for plan in PLANS]
        c.bar([k + (i - 1) * width for k in range(len(PLANS))], ys, width=width * 0.95, label=way,
              color=("#7F7F7F", "#2166AC", "#B2182B")[i])
        for k, y in enumerate(ys):
            c.text(k + (i - 1) * width, y + 1, str(y), ha="center", fontsize=7)
    c.set_xticks(range(len(PLANS)), [p.replace("_", " ") for p in PLANS])
    c.set_ylabel(f"largest batch B that fits (tried {batches[0]} to {batches[-1]})")
    c.legend(fontsize=8, frameon=False, loc="upper left")
    c.set_title(f"(3) the largest batch whose reserved peak fits an {GPU.name}", fontsize=10)
    fig.suptitle(f"From the ledger to your GPU: {cfg['model']} estimated as this engine, PyTorch AMP and Megatron "
                 "run it, with the allocator's reserve and the device's real capacity", fontsize=11)
    plots.save(fig, path)


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    per = {way: sum(runs["bytes_per_parameter"].values()) for way, runs in r["runs"].items()}
    amp = r["runs"]["PyTorch AMP + flash"]["none"]
    return [", ".join(f"{way}: {b:.1f} B a parameter" for way, b in per.items()),
            f"AMP + flash, B = {r['config']['batch']}: allocated {C.format_bytes(amp['peak'])}, reserved "
            f"{C.format_bytes(amp['reserved'])}; largest B that fits with every layer checkpointed: "
            + ", ".join(f"{way} {r['largest'][(way, 'every_layer')]}" for way in WAYS)]


if __name__ == "__main__":
    C.cli(main, __doc__)
