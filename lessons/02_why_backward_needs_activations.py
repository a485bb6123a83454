"""Lesson 2: why backward needs activations.

What you will see: the chain rule at one node (dL/dx = dL/dy · f'(x)) checked against the engine;
two inputs that GELU maps to the same output but whose derivatives differ, so gelu(x) alone cannot
drive backward and GELU must keep x; softmax keeping its output (the tape entry, its saved bytes,
and that it is the output array itself); layer norm keeping its output and 1/std (not the mean and
variance the chapter names) and recovering x̂ from its output, read from the tape.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): backward needs the forward's values, because dL/dx = dL/df(x) · f'(x) and f'(x) depends on x
itself; GELU's x cannot be recovered from gelu(x), softmax's gradient needs its output, and layer
norm needs its statistics.

Read: tinygrad_ckpt/ops/nn.py (GELU, Softmax, LayerNormOp: what each saves and why),
tinygrad_ckpt/engine/function.py (Context.save), tinygrad_ckpt/engine/tape.py (TapeEntry, backward_steps).

Run: python lessons/02_why_backward_needs_activations.py [--quick] [--out figures]
Figure: {out}/02_why_backward_needs_activations.png (GELU and its derivative, the two inputs marked).
"""

from __future__ import annotations

import math
import time

import _common as C
import numpy as np
from scipy.optimize import brentq, minimize_scalar
from scipy.special import erf

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.memory import plots

SLUG = "02_why_backward_needs_activations"


def gelu(x):
    """Exact GELU in float64: x·Φ(x)."""
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_prime(x):
    """Φ(x) + x·φ(x): depends on x itself."""
    return 0.5 * (1 + erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def entry_of(tensor, op: str):
    """The last tape entry of kind `op` on the tape that produced `tensor`."""
    return [e for e in tensor.tape().entries if e.op == op][-1]


def chain_rule(rng) -> dict:
    C.heading("1. The chain rule at one node: y = gelu(x), L = Σ w·y")
    x = tg.Tensor(np.array([-2.0, -1.0, -0.5, 0.5, 2.0]), requires_grad=True, name="x")
    w = tg.Tensor(rng.standard_normal(5), name="w")  # dL/dy: the gradient arriving from above
    y = F.gelu(x)
    loss = (y * w).sum()
    tape = loss.tape()
    print(tape)
    gelu_entry = entry_of(loss, "gelu")
    print(f"\nGELU's entry keeps {list(gelu_entry.ctx.saved)}: its backward computes f'(x) = Φ(x) + x·φ(x) "
          "from x itself,\nreading Φ(x) = out/x from its output (in a block the next linear keeps that output anyway).")
    for entry in loss.backward_steps():  # the backward loop, one entry at a time
        saved = list(entry.ctx.saved) or "nothing"
        print(f"  backward reaches #{tape.entries.index(entry)} {entry.name:<6} saved: {saved}")
    expected = w.data * gelu_prime(x.data)
    rows = [(f"{a:+.2f}", f"{b:+.4f}", f"{c:+.4f}", f"{d:+.4f}", f"{e:+.4f}", f"{g:+.4f}")
            for a, b, c, d, e, g in zip(x.data, gelu(x.data), w.data, gelu_prime(x.data), expected, x.grad)]
    print()
    print(C.table(rows, ["x", "f(x)", "dL/dy = w", "f'(x)", "w·f'(x)", "engine x.grad"]))
    err = float(np.max(np.abs(x.grad - expected)))
    print(f"max |engine - chain rule| = {err:.1e}")
    return {"chain_rule_max_err": err}


def non_invertible(out: str) -> dict:
    C.heading("2. GELU cannot be inverted: one output, two inputs, two derivatives")
    x_min = minimize_scalar(gelu, bounds=(-3, 0), method="bounded", options={"xatol": 1e-12}).x
    y_min = float(gelu(x_min))
    target = -0.1
    x1 = brentq(lambda x: gelu(x) - target, -10.0, x_min, xtol=1e-15)
    x2 = brentq(lambda x: gelu(x) - target, x_min, 0.0, xtol=1e-15)
    print(f"gelu falls to its minimum {y_min:.5f} at x = {x_min:.5f}, then rises: every output in "
          f"({y_min:.3f}, 0) has two inputs.")
    print(f"Solving gelu(x) = {target} on each side of the minimum (scipy brentq, float64):")
    xs = tg.Tensor(np.array([x1, x2]), requires_grad=True, name="x")
    ys = F.gelu(xs)
    ys.sum().backward()  # upstream gradient 1: xs.grad is f'(x)
    y1, y2 = (float(v) for v in ys.numpy())
    d1, d2 = (float(v) for v in xs.grad)
    rows = [("x1", f"{x1:+.9f}", f"{y1:+.12f}", f"{d1:+.6f}"), ("x2", f"{x2:+.9f}", f"{y2:+.12f}", f"{d2:+.6f}")]
    print(C.table(rows, ["", "x", "engine gelu(x)", "engine gradient f'(x)"]))
    print(f"|gelu(x1) - gelu(x2)| = {abs(y1 - y2):.1e}, but f'(x1) - f'(x2) = {d1 - d2:+.4f}: a backward pass\n"
          "that kept only the output could not know whether to scale the incoming gradient by "
          f"{d1:+.3f} or {d2:+.3f}.\nSo GELU saves its input x ([B, T, 4d] in an MLP: lesson 3).")

    fig, axes = plots.new_figure(1, 2, figsize=(11, 4.3), sharex=True)
    grid = np.linspace(-4, 2.5, 600)
    ax = axes[0]
    ax.plot(grid, gelu(grid), color="#4C72B0", lw=2, label="gelu(x)")
    ax.axhline(target, color="gray", ls="--", lw=1, label=f"gelu(x) = {target}")
    box = dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.9)
    ax.plot([x1, x2], [y1, y2], "o", color="#C44E52", ms=7, zorder=3)
    ax.plot([x_min], [y_min], "v", color="black", ms=5, zorder=3)
    ax.annotate(f"x1 = {x1:.3f}", (x1, y1), xytext=(-10, -16), textcoords="offset points", ha="right", fontsize=9,
                bbox=box)
    ax.annotate(f"x2 = {x2:.3f}", (x2, y2), xytext=(8, -14), textcoords="offset points", ha="left", fontsize=9,
                bbox=box)
    ax.annotate(f"minimum {y_min:.3f}\nat x = {x_min:.3f}", (x_min, y_min), xytext=(0, -30),
                textcoords="offset points", ha="center", fontsize=8, bbox=box)
    ax.set_ylim(-0.45, 1.2)
    ax.set_xlabel("x")
    ax.set_ylabel("gelu(x)")
    ax.set_title("same output at two inputs")
    ax.legend(loc="upper left", fontsize=9)
    ax = axes[1]
    ax.plot(grid, gelu_prime(grid), color="#DD8452", lw=2, label="gelu'(x) = Φ(x) + x·φ(x)")
    ax.axhline(0, color="black", lw=0.6)
    ax.plot([x1, x2], [d1, d2], "o", color="#C44E52", ms=7, zorder=3)
    ax.annotate(f"gelu'(x1) = {d1:+.3f}", (x1, d1), xytext=(-10, -4), textcoords="offset points", ha="right",
                va="top", fontsize=9, bbox=box)
    ax.annotate(f"gelu'(x2) = {d2:+.3f}", (x2, d2), xytext=(-10, 6), textcoords="offset points", ha="right",
                va="bottom", fontsize=9, bbox=box)
    ax.set_ylim(-0.4, 1.25)
    for xv in (x1, x2):
        for a in axes:
            a.axvline(xv, color="#C44E52", lw=0.6, ls=":")
    ax.set_xlabel("x")
    ax.set_ylabel("gelu'(x)")
    ax.set_title("different derivatives there")
    ax.legend(loc="upper left", fontsize=9)
    for a in axes:
        a.grid(alpha=0.3)
    fig.suptitle("GELU's non-invertibility: backward needs x, not gelu(x)")
    path = plots.save(fig, C.fig_path(out, f"{SLUG}.png"))
    print(f"\nwrote {path}")
    return {"x_min": float(x_min), "gelu_min": y_min, "target": target, "x1": float(x1), "x2": float(x2),
            "gelu_x1": y1, "gelu_x2": y2, "dgelu_x1": d1, "dgelu_x2": d2,
            "dgelu_formula": (float(gelu_prime(x1)), float(gelu_prime(x2))), "figure": path}


def softmax_keeps_output(rng) -> dict:
    C.heading("3. Softmax keeps its output")
    s = tg.Tensor(rng.standard_normal((2, 5)).astype(np.float32), requires_grad=True, name="scores")
    g = rng.standard_normal((2, 5)).astype(np.float32)
    with tg.Ledger() as led:
        p = F.softmax(s, axis=-1)
    entry = entry_of(p, "softmax")
    saved = entry.ctx.saved["out"]
    shares = bool(np.shares_memory(saved, p.data))
    print(f"tape entry: {entry!r}")
    print(f"saved: {', '.join(f'{k} {list(v.shape)} {v.dtype}' for k, v in entry.ctx.saved.items())}; "
          f"entry.saved_bytes() = {entry.saved_bytes()} B (= 2·5 values × 4 B)")
    print(f"np.shares_memory(saved out, p.data) = {shares}: it is the output array itself, so saving it costs "
          "nothing\nextra while p lives, but keeps it alive until softmax's backward even after p is dropped.")
    print(f"ledger: {led.saved_breakdown(by='name')} counted as activation")
    y = saved.copy()
    saved_shapes = {k: list(v.shape) for k, v in entry.ctx.saved.items()}
    saved_bytes = int(entry.saved_bytes())
    p.backward(g)  # g = dL/dp, the gradient arriving from above
    manual = y * (g - (g * y).sum(axis=-1, keepdims=True))  # dL/ds = y·(g - Σ g·y): only y is needed
    err = float(np.max(np.abs(s.grad - manual)))
    print(f"dL/ds = y·(g - Σ g·y) from the saved y alone matches the engine: max error {err:.1e}")
    print(f"after backward the entry holds {entry.saved_bytes()} B: released (entry.released = {entry.released})")
    return {"softmax_saved": saved_shapes, "softmax_saved_bytes": saved_bytes, "softmax_saved_is_output": shares,
            "softmax_grad_err": err}


def layernorm_keeps_statistics(rng) -> dict:
    C.heading("4. Layer norm keeps its output and 1/std, and recovers x̂ from the output")
    B, T, d = 2, 3, 8
    x = tg.Tensor(rng.standard_normal((B, T, d)).astype(np.float32) * 3 + 1, requires_grad=True, name="x")
    w = tg.Parameter(np.ones(d, np.float32), name="ln.weight")
    b = tg.Parameter(np.zeros(d, np.float32), name="ln.bias")
    with tg.Ledger() as led:
        out = F.layer_norm(x, w, b)
    entry = entry_of(out, "layer_norm")
    print(f"tape entry: {entry!r}")
    rows = [(k, str(list(v.shape)), str(v.dtype), f"{v.nbytes} B") for k, v in entry.ctx.saved.items()]
    print(C.table(rows, ["saved", "shape", "dtype", "bytes"]))
    kept, rstd = entry.ctx.saved["out"], entry.ctx.saved["rstd"]
    mean = x.data.mean(axis=-1, keepdims=True)
    var = x.data.var(axis=-1, keepdims=True)
    rstd_err = float(np.max(np.abs(rstd - 1 / np.sqrt(var + 1e-5))))
    xhat_err = float(np.max(np.abs((kept - b.data) / w.data - (x.data - mean) * rstd)))
    act = led.saved_breakdown(by="name")
    print(f"saved 'out' is the output array itself: {kept is out.data}; rstd = 1/√(var + eps), one number per row "
          f"of d = {d}: max error {rstd_err:.1e}")
    print(f"x̂ = (out - b)/w, recovered in backward from what was kept: max error {xhat_err:.1e} against "
          "(x - mean)·rstd")
    print(f"The ledger counts as activations only {act} ({sum(act.values())} B): the weight and bias are saved by "
          "reference\nand stay parameters. Backward reads exactly these: dL/dx = rstd·(ĝ - mean(ĝ) - "
          "x̂·mean(ĝ·x̂)), ĝ = g·w.\nIn a GPT block the output is the next linear's input, which that linear keeps "
          "anyway: the layer norm's\nown cost is 1/std alone. (Where a weight is exactly 0, x̂'s column is kept too.)")
    print("The seed says layer norm stores 'its input mean and variance'; this engine stores its output and 1/std:\n"
          f"d + 1 = {d + 1} values per row instead of d + 2 = {d + 2}, and only the 1 is its own.")
    return {"layernorm_saved": {k: list(v.shape) for k, v in entry.ctx.saved.items()},
            "layernorm_activation_bytes": int(sum(act.values())), "layernorm_rstd_err": rstd_err,
            "layernorm_xhat_err": xhat_err, "layernorm_shape": (B, T, d), "layernorm_keeps_output": kept is out.data}


def what_a_graph_keeps(rng, out: str) -> dict:
    C.heading("5. Everything a graph keeps: tg.print_saved and tg.draw_tape")
    d = 8
    x = tg.Tensor(rng.standard_normal((2, 4, d)).astype(np.float32), requires_grad=True, name="x")
    p = {name: tg.Parameter(rng.standard_normal(shape).astype(np.float32) * 0.3, name=name) for name, shape in
         [("ln.weight", (d,)), ("ln.bias", (d,)), ("mlp.c_fc.weight", (4 * d, d)), ("mlp.c_fc.bias", (4 * d,)),
          ("mlp.c_proj.weight", (d, 4 * d)), ("mlp.c_proj.bias", (d,))]}

    def mlp(h):
        with tg.name_scope("mlp"):
            return F.linear(F.gelu(F.linear(h, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])),
                            p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])

    def block(x, checkpointed=False):
        with tg.name_scope("ln"):
            h = F.layer_norm(x, p["ln.weight"], p["ln.bias"])
        return x + (tg.checkpoint(mlp, h, name="mlp") if checkpointed else mlp(h))

    print("print_saved(block, x): every array the graph of one small pre-norm MLP block keeps for backward")
    plain = tg.print_saved(block, x)
    print("\nthe same block with its MLP checkpointed: the MLP's interior is gone, its input is kept")
    kept = tg.print_saved(block, x, checkpointed=True)
    fresh = lambda rows: sum(r.nbytes for r in rows if r.same_as is None and r.kind != "parameter")
    print(f"held beyond the parameters: {fresh(plain)} B plain, {fresh(kept)} B checkpointed")
    loss = (block(x, checkpointed=True) * block(x)).sum()
    path = C.fig_path(out, f"{SLUG}_tape.png")
    tg.draw_tape(loss, path, engine="matplotlib")  # the same drawing with or without graphviz installed
    print("tg.draw_tape(loss, path): both blocks, the checkpointed one drawn with the ops it will replay")
    print(f"wrote {path}")
    return {"saved_plain_bytes": fresh(plain), "saved_checkpointed_bytes": fresh(kept), "tape_figure": path}


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    tg.manual_seed(0)
    rng = np.random.default_rng(0)
    print("Lesson 2: why backward needs activations")
    C.claim(__doc__)
    result = {}
    result.update(chain_rule(rng))
    result.update(non_invertible(out))
    result.update(softmax_keeps_output(rng))
    result.update(layernorm_keeps_statistics(rng))
    result.update(what_a_graph_keeps(rng, out))
    result["figures"] = [result.pop("figure"), result.pop("tape_figure")]
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return result


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"gelu({r['x1']:.3f}) = gelu({r['x2']:.3f}) = {r['target']}, but gelu' = {r['dgelu_x1']:.3f} vs "
            f"{r['dgelu_x2']:.3f}: backward needs x, not gelu(x)",
            f"softmax keeps its output ({r['softmax_saved_bytes']} B, the output array itself); layer norm keeps "
            f"its output and 1/std ({r['layernorm_activation_bytes']} B)"]


if __name__ == "__main__":
    C.cli(main, __doc__)
