"""Lesson 10: recomputation inside one op: attention that keeps no T×T matrix.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): "the attention weights alone contribute a tensor proportional to T², which is
why long-context training is so memory-intensive", and recomputing on demand turns that memory into
compute. Measured here: the T² term removed by recomputation inside the attention op itself.

What this lesson adds: the checkpoint segment's trade (keep less, recompute in backward) works at the grain of one
op too. Chunked attention (F.scaled_dot_product_attention(impl="chunked"), nn.GPT(attention="chunked"))
keeps q, k, v, its output and one log-sum-exp per row instead of the [B, H, T, T] attention weights,
and rebuilds the weights block by block in backward. So the bytes a block keeps grow linearly in T
(the T² term is gone, not just smaller), for one extra [T, T]-sized matrix product per attention in
backward (q kᵀ again), far less than the checkpoint segment's extra forward of the whole block; with a
causal mask the op also skips the key blocks wholly in the future, which more than pays for it once T spans
a few blocks (T = 256 is one block of 256: nothing to skip).

What you will see, measured by the ledger on a stack of nn.Blocks (forward + backward):
1. the gradients of chunked and explicit attention agree (float64, to rounding);
2. what one block keeps, by op, explicit vs chunked, at one T;
3. bytes against T for explicit, chunked, explicit with every block checkpointed, and both together:
   the fitted T² coefficient of each, and the activation peaks;
4. the FLOPs each one spends: chunked recomputes the scores (and skips the causal blocks wholly in the
   future, so its forward is cheaper); the checkpoint recomputes the whole block up to its tail (the last
   linear and residual add, which backward does not need to run again).

The sweep runs on the meta backend (shapes and bytes, no arithmetic), which the ledger counts exactly as
NumPy (tests/test_chunked_attention.py checks this); the gradient check runs on NumPy.

Read: tinygrad_ckpt/ops/attention.py (ChunkedAttention: the online softmax, the FlashAttention-2
backward, per-block dropout masks), tinygrad_ckpt/functional.py (scaled_dot_product_attention),
lessons/05_the_checkpoint_segment.py (the same trade at the grain of a block).

Run: python lessons/10_recomputation_inside_one_op.py [--quick] [--out figures]
Figure: {out}/10_recomputation_inside_one_op.png (activation peak against T for the four plans, and the
FLOPs of a step relative to explicit attention).
"""

from __future__ import annotations

import time

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.ops.attention import BLOCK_SIZE, blocks

SLUG = "10_recomputation_inside_one_op"
PLANS = {  # name -> (attention, checkpoint every block)
    "explicit": ("explicit", False),
    "chunked": ("chunked", False),
    "explicit + checkpoint": ("explicit", True),
    "chunked + checkpoint": ("chunked", True),
}
COLORS = {"explicit": "#C44E52", "chunked": "#4C72B0", "explicit + checkpoint": "#55A868",
          "chunked + checkpoint": "#8172B3"}


def sizes(quick: bool) -> dict:
    if quick:
        return dict(batch=2, d_model=64, n_head=4, n_layer=2, seq_lens=(32, 64, 128, 256), inventory_T=64)
    return dict(batch=4, d_model=256, n_head=4, n_layer=4, seq_lens=(128, 256, 512, 1024, 2048, 4096),
                inventory_T=1024)


def measure(cfg: dict, T: int, plan: str) -> dict:
    """One forward + backward of the block stack under a Ledger: activation bytes and FLOPs per phase."""
    attention, checkpointed = PLANS[plan]
    C.fresh()
    tg.manual_seed(0)
    blocks = [nn.Block(cfg["d_model"], cfg["n_head"], n_layer=cfg["n_layer"], attention=attention)
              for _ in range(cfg["n_layer"])]
    xp = tg.backend.xp()
    x = tg.Tensor(xp.zeros((cfg["batch"], T, cfg["d_model"]), dtype=np.float32), requires_grad=True, name="x")
    with tg.Ledger() as led:
        h = x
        for block in blocks:
            h = tg.checkpoint(block, h) if checkpointed else block(h)
        at_forward_end = led.live_bytes("activation")
        h.backward(xp.ones(h.shape, dtype=np.float32))
    del h, x, blocks
    return dict(peak=led.peak_bytes("activation"), forward_end=at_forward_end,
                flops={phase: led.flops(phase) for phase in ("forward", "backward", "recompute")},
                by_op=led.saved_breakdown(by="op") if not checkpointed else None)


def gradient_check(rng) -> float:
    """Max |chunked - explicit| over the input and parameter gradients of one float64 block (dropout 0)."""
    grads = []
    x0 = rng.standard_normal((2, 24, 32))
    for attention in ("explicit", "chunked"):
        tg.manual_seed(0)
        block = nn.Block(32, 4, attention=attention).to(np.float64)
        x = tg.Tensor(x0, requires_grad=True)
        block(x).backward(np.cos(np.arange(x0.size)).reshape(x0.shape))
        grads.append([x.grad] + [p.grad for p in block.parameters()])
    return max(float(np.abs(a - b).max()) for a, b in zip(*grads))


def t2_fit(seq_lens, values) -> tuple[float, float]:
    """Least squares bytes = a·T + b·T² (bytes per token, bytes per token²)."""
    T = np.asarray(seq_lens, dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.stack([T, T * T], axis=1), np.asarray(values, dtype=float), rcond=None)
    return float(a), float(b)


def _coefficient(b: float) -> str:
    """A fitted coefficient; a least-squares zero (|b| < 0.005) prints as 0.00, not -0.00."""
    return f"{0.0 if abs(b) < 0.005 else b:,.2f}"


def figure(cfg, sweep, path) -> None:
    seq_lens = cfg["seq_lens"]
    fig, (ax_b, ax_f) = plots.new_figure(1, 2, figsize=(11, 4.3))
    for plan in PLANS:
        values = [sweep[T][plan]["peak"] for T in seq_lens]
        ax_b.plot(seq_lens, [v / 2**20 for v in values], "o-", color=COLORS[plan], label=plan)
        total = [sum(sweep[T][plan]["flops"].values()) / sum(sweep[T]["explicit"]["flops"].values())
                 for T in seq_lens]
        ax_f.plot(seq_lens, total, "o-", color=COLORS[plan], label=plan)
    for ax in (ax_b, ax_f):
        ax.set_xscale("log", base=2)
        ax.set_xticks(seq_lens)
        ax.set_xticklabels([str(t) for t in seq_lens])
        ax.set_xlabel("sequence length T")
        ax.grid(alpha=0.3)
    ax_b.set_yscale("log")
    ax_b.set_ylabel("activation peak (MiB, ledger), log scale")
    ax_b.set_title(f"Bytes: {cfg['n_layer']} blocks, B={cfg['batch']}, d={cfg['d_model']}, H={cfg['n_head']}, "
                   "float32", fontsize=10)
    ax_b.legend(fontsize=8)
    ax_f.set_ylabel("FLOPs of forward + backward (+ recompute), × explicit")
    ax_f.set_title("FLOPs relative to explicit attention\n(chunked recomputes q kᵀ but skips the causal future;\n"
                   "a checkpoint replays each block but its last linear and add)", fontsize=10)
    ax_f.axhline(1.0, color="gray", lw=0.8)
    plots.save(fig, path)


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    B, d, H, L = cfg["batch"], cfg["d_model"], cfg["n_head"], cfg["n_layer"]
    print("Lesson 10: recomputation inside one op")
    C.claim(__doc__)
    print(f"A stack of {L} nn.Blocks, d_model {d}, {H} heads, batch B={B}, float32, no dropout; one forward +\n"
          "backward under tg.Ledger() per plan. Attention: explicit (the [B, H, T, T] weights on the tape) or\n"
          f"chunked (ops.ChunkedAttention, blocks of {BLOCK_SIZE} queries and keys).")

    C.heading("1. The same gradients")
    err = gradient_check(np.random.default_rng(0))
    print(f"one float64 block, T=24, causal: max |chunked - explicit| over dx and every parameter gradient = "
          f"{err:.2e}")

    tg.use_backend("meta")  # shapes and bytes only: the sweep reaches T = 4096 in seconds
    try:
        sweep = {T: {plan: measure(cfg, T, plan) for plan in PLANS} for T in cfg["seq_lens"]}
    finally:
        tg.use_backend("numpy")

    T0 = cfg["inventory_T"]
    C.heading(f"2. What one block keeps at T={T0}, by op (activation bytes at the end of the forward / {L})")
    ops = sorted(set(sweep[T0]["explicit"]["by_op"]) | set(sweep[T0]["chunked"]["by_op"]))
    rows = [(op, C.format_bytes(sweep[T0]["explicit"]["by_op"].get(op, 0) // L),
             C.format_bytes(sweep[T0]["chunked"]["by_op"].get(op, 0) // L)) for op in ops]
    per_layer = {p: sweep[T0][p]["forward_end"] / L for p in ("explicit", "chunked")}
    rows.append(("per layer (forward end / L)", C.format_bytes(per_layer["explicit"]),
                 C.format_bytes(per_layer["chunked"])))
    print(C.table(rows, ["op (first saver of each buffer)", "explicit", "chunked"]))
    print(f"chunked keeps {per_layer['chunked'] / per_layer['explicit']:.1%} of explicit's bytes per layer: "
          "no softmax output, no causal mask;\nit keeps its own output instead (B·T·d values) and one "
          "log-sum-exp per row (B·H·T).")

    C.heading("3. Bytes against T: the T² term")
    rows, fits = [], {}
    for plan in PLANS:
        peaks = [sweep[T][plan]["peak"] for T in cfg["seq_lens"]]
        fits[plan] = t2_fit(cfg["seq_lens"], peaks)
        rows.append((plan, *(C.format_bytes(p) for p in peaks), _coefficient(fits[plan][1])))
    print(C.table(rows, ["activation peak", *(f"T={T}" for T in cfg["seq_lens"]), "b (B per T²)"]))
    t_max = cfg["seq_lens"][-1]
    ratio = {p: sweep[t_max][p]["peak"] / sweep[t_max]["explicit"]["peak"] for p in PLANS}
    print(f"fit peak = a·T + b·T² over the sweep: explicit b = {fits['explicit'][1]:,.1f} B/T² "
          f"(B·H·4 bytes of softmax output + the bool mask per layer, {L} layers),\n"
          f"chunked b = {_coefficient(fits['chunked'][1])} B/T² (linear in T). At T={t_max}: chunked "
          f"{ratio['chunked']:.1%}, explicit + checkpoint {ratio['explicit + checkpoint']:.1%}, "
          f"both {ratio['chunked + checkpoint']:.1%} of explicit's peak.\n"
          "The checkpointed explicit stack still has a T² term: its peak is the block inputs plus ONE block's "
          "replay, which rebuilds the [T, T] weights.")

    C.heading(f"4. The price in FLOPs at T={T0}")
    rows = []
    base = sum(sweep[T0]["explicit"]["flops"].values())
    for plan in PLANS:
        f = sweep[T0][plan]["flops"]
        rows.append((plan, *(f"{f[phase] / 1e6:,.1f}" for phase in ("forward", "backward", "recompute")),
                     f"{sum(f.values()) / base:.3f}"))
    print(C.table(rows, ["plan", "forward MFLOP", "backward MFLOP", "recompute MFLOP", "total × explicit"]))
    fe, fc = sweep[T0]["explicit"]["flops"], sweep[T0]["chunked"]["flops"]
    ck = sweep[T0]["explicit + checkpoint"]["flops"]
    extra_backward = fc["backward"] - fe["backward"]
    # the causal op computes, for each block of queries, the key blocks up to its own: keys 0..i1-1
    visible = sum((i1 - i0) * i1 for i0, i1 in blocks(T0, BLOCK_SIZE))
    rescore = L * B * visible * 2 * d  # q kᵀ over the visible blocks, all heads (2·hd per score, H heads)
    print(f"recomputing the scores inside the op costs {rescore / 1e6:,.1f} MFLOP (L·B·2·d per visible score, "
          f"{visible / T0**2:.1%} of the T² scores visible).")
    print(f"chunked's backward does {extra_backward / 1e6:+,.1f} MFLOP against explicit's (the scores q kᵀ again, "
          "inside the op, so the ledger counts\nit as backward, less the blocks it skips); its forward "
          f"{(fc['forward'] - fe['forward']) / 1e6:+,.1f} MFLOP (blocks wholly in the causal future are skipped).\n"
          f"The checkpoint segment recomputes {ck['recompute'] / 1e6:,.1f} MFLOP: "
          f"{ck['recompute'] / fe['forward']:.0%} of the forward, every block up to its last linear and residual "
          "add\n(the replay stops once backward has all it needs).")

    path = C.fig_path(out, f"{SLUG}.png")
    figure(cfg, sweep, path)
    elapsed = time.perf_counter() - t0
    print(f"\nwrote {path}  ({elapsed:.1f} s)")
    return dict(
        config=cfg,
        gradient_max_abs_diff=err,
        peaks={T: {p: sweep[T][p]["peak"] for p in PLANS} for T in cfg["seq_lens"]},
        forward_end={T: {p: sweep[T][p]["forward_end"] for p in PLANS} for T in cfg["seq_lens"]},
        flops={T: {p: sweep[T][p]["flops"] for p in PLANS} for T in cfg["seq_lens"]},
        t2_coefficient={p: fits[p][1] for p in PLANS},
        rescore_flops=rescore,
        per_layer_at_inventory_T=per_layer,
        figures=[path],
        seconds=elapsed,
    )


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    t2 = r["t2_coefficient"]
    T = max(r["peaks"])
    peaks = r["peaks"][T]
    return ["activation bytes per T² (fitted): " + ", ".join(f"{p} {0 if abs(t2[p]) < 0.5 else t2[p]:,.0f}"
                                                             for p in t2),
            f"at T = {T}: " + ", ".join(f"{p} {C.format_bytes(v)}" for p, v in peaks.items())]


if __name__ == "__main__":
    C.cli(main, __doc__)
