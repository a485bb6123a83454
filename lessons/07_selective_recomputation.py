"""Lesson 7: selective recomputation: drop what is big and cheap, keep what is small and costly.

What you will see: every op of one GPT block, with the bytes it keeps for backward and the FLOPs it
would cost to run again. They are far from proportional: softmax, GELU and LayerNorm keep a lot and
cost almost nothing, while the linear layers cost most of the FLOPs and keep only their input. A
checkpoint `policy` decides per op whether to keep its saves or recompute it, and says why: the
lesson prints every decision of tg.save_nothing, tg.save_matmuls and tg.korthikanti_selective for
the block's ops, then measures each policy's activation peak and recompute FLOPs against no
checkpointing. Last, the attention core (scores, mask, softmax) that Korthikanti et al. (2022)
recompute: its [B, H, T, T] arrays grow with T², so its share of a block's memory (their 5as/h term)
grows with the sequence length while its FLOPs stay a small fraction of the block's.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): the activations are not alike: "the attention weights alone contribute a tensor
proportional to T²", and every nonlinear op keeps its own dependency. Measured here: which saves are
big and cheap to recompute, which are small and costly, and what a per-op policy buys.

Read: tinygrad_ckpt/recompute/policies.py (Policy, Decision, SaveMatmuls, KorthikantiSelective, KeepByPolicy
and ServeKept, KeptOp), tinygrad_ckpt/ops/ (what each op saves: ctx.save, its FLOPs: ctx.flops),
tinygrad_ckpt/scale/estimate.py (korthikanti_terms, engine_activation_terms).

Run: python lessons/07_selective_recomputation.py [--quick] [--out figures]
Figures: {out}/07_selective_recomputation_ops.png (bytes kept vs FLOPs to recompute, per op) and
{out}/07_selective_recomputation_policies.png (each policy measured; the attention core's share vs T).
"""

from __future__ import annotations

import math
import textwrap
import time

import _common as C
import numpy as np
from matplotlib.ticker import FuncFormatter

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.events import within
from tinygrad_ckpt.recompute.policies import KeepByPolicy
from tinygrad_ckpt.scale import estimate

SLUG = "07_selective_recomputation"
POLICIES = (("save_nothing", tg.save_nothing), ("save_matmuls", tg.save_matmuls),
            ("korthikanti_selective", tg.korthikanti_selective))
QUADRANT = 5  # %: "cheap to recompute" under this share of the block's FLOPs, "expensive to keep" over it of its bytes
CORE_OPS = ("masked_fill", "softmax")  # the attention core's ops that keep [T, T]-sized arrays (no dropout here)
# the two ops of a block that share a scoped name, told apart by their order
SECOND_NAMES = {"attn.matmul": ("attn.matmul q·kᵀ", "attn.matmul att·v"), "add": ("add (attn residual)",
                                                                                  "add (mlp residual)")}


def sizes(quick: bool) -> dict:
    # Head dim 4-8: the attention core's bytes grow with H·T² but its FLOPs with T²·d, so many narrow
    # heads give a small model the ratio a·s/h of a large one (GPT-3 175B: 96·2048/12288 = 16).
    if quick:
        return dict(gpt=dict(vocab=32, seq_len=32, batch=2, n_layer=2, n_head=8, d_model=32),
                    t_sweep=dict(seq_lens=(16, 32, 64, 128), batch=1, n_layer=2, n_head=8, d_model=64, vocab=32))
    return dict(gpt=dict(vocab=64, seq_len=64, batch=4, n_layer=4, n_head=8, d_model=64),
                t_sweep=dict(seq_lens=(32, 64, 128, 256), batch=1, n_layer=2, n_head=16, d_model=128, vocab=64))


def make(cfg: dict, checkpoint=None):
    tg.manual_seed(0)
    return nn.GPT(cfg["vocab"], cfg["seq_len"], cfg["n_layer"], cfg["n_head"], cfg["d_model"], checkpoint=checkpoint)


def block_forward_flops(led) -> int:
    return sum(f for layer, f in led.flops_by_layer("forward").items() if layer.startswith("transformer.h."))


def label_ops(names: list[str]) -> list[str]:
    """Block h.0's op names, short, with SECOND_NAMES telling apart two ops of one name, in order."""
    labels, seen = [], {}
    for name in names:
        short = name[len("transformer.h.0."):]
        occurrence = seen.get(short, 0)
        seen[short] = occurrence + 1
        labels.append(SECOND_NAMES[short][occurrence] if short in SECOND_NAMES else short)
    return labels


def block_replay(led) -> list[tuple[str, int, int]]:
    """(label, forward FLOPs, FLOPs its replay ran) of each op of block h.0, from a checkpointed run's ledger
    (an op the replay served, kept by the policy or past the early stop, ran with 0 FLOPs)."""
    pairs = C.replayed_ops(led, "transformer.h.0")
    return [(label, f["flops"], r["flops"]) for label, (f, r) in zip(label_ops([f["name"] for f, _ in pairs]), pairs)]


def block_ops(cfg: dict) -> tuple[list[dict], dict]:
    """Every op of block h.0 from a plain forward: what it keeps (bytes of buffers it is the first to
    save, parameters excluded: a buffer shared by several ops counts once), its forward FLOPs (what a
    replay costs) and the policies' decisions. Also the plain run's numbers."""
    model = make(cfg)
    be = backend.current()
    params = {id(be.buffer(p.data)[0]) for p in model.parameters()}
    batch = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    C.fresh()
    rows, seen = [], set()
    with tg.Ledger() as led:
        _, loss = model(*batch)
        after_forward = led.live_bytes("activation")
        for entry in loss.tape().entries:
            kept, keys = 0, []
            for key, a in entry.ctx.saved.items():
                if not be.is_array(a):
                    continue
                owner, nbytes = be.buffer(a)
                if id(owner) in params:
                    keys.append(f"{key} (parameter)")
                    continue
                keys.append(key if id(owner) not in seen else f"{key} (shared)")
                if id(owner) not in seen:
                    seen.add(id(owner))
                    kept += nbytes
            if not within(entry.scope, "transformer.h.0"):
                continue
            rows.append(dict(name=entry.name, op=entry.op, bytes=kept, flops=entry.ctx.flops[0],
                             keys=keys, decisions={p: pol.decide(entry.op, entry.name) for p, pol in POLICIES}))
        loss.backward()
    del model, loss
    C.fresh()
    for row, label in zip(rows, label_ops([r["name"] for r in rows])):
        row["label"] = label
    return rows, dict(peak=led.peak_bytes("activation"), recompute=0, block_forward=block_forward_flops(led),
                      after_forward=after_forward, per_block=led.saved_breakdown("layer")["transformer.h.0"])


def kept_arrays(entry) -> list[tuple[str, str, tuple, int]]:
    """What a checkpoint entry holds after the forward: (op, array, shape, bytes), each buffer once.

    Its saves are "input0" (the block's input) and the arrays the policy kept, each owned by an op of the
    segment and playing a role there (a save's name, or "out0" for its output: `KeepByPolicy.owners`). Two
    ops of one name (attention's two matmuls, q·kᵀ then weights·v) are told apart as "#1" and "#2", in the
    order they ran."""
    be = backend.current()
    keep = next(f for f in entry.ctx.replay.features if isinstance(f, KeepByPolicy))
    owners = keep.owners()
    ops = [name.removeprefix("transformer.h.0.") for name, *_ in entry.ctx.replay.segment.ops]
    label = {i: f"{name}#{ops[:i + 1].count(name)}" if ops.count(name) > 1 else name for i, name in enumerate(ops)}
    seen, out = set(), []
    for key, a in entry.ctx.saved.items():
        owner, nbytes = be.buffer(a)
        if id(owner) in seen:
            continue
        seen.add(id(owner))
        kept, role = owners.get(key, (None, key))
        out.append((label[kept.index] if kept else "(block input)", role, tuple(a.shape), int(nbytes)))
    return out


def run(cfg: dict, checkpoint) -> dict:
    """One forward + backward under a Ledger: activation peak, activation bytes live after the forward,
    what block h.0's checkpoint entry keeps, recompute FLOPs and the blocks' forward FLOPs."""
    model = make(cfg, checkpoint)
    batch = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    C.fresh()
    with tg.Ledger() as led:
        _, loss = model(*batch)
        after_forward = led.live_bytes("activation")
        first = next(e for e in loss.tape().entries if e.op == "checkpoint")
        kept = kept_arrays(first)
        del first
        loss.backward()
    del model, loss
    C.fresh()
    return dict(peak=led.peak_bytes("activation"), recompute=led.flops("recompute"),
                block_forward=block_forward_flops(led), after_forward=after_forward, kept=kept,
                replay=block_replay(led))


def core_share(cfg: dict, seq_len: int) -> dict:
    """Block h.0's attention core, plain: its share of the block's saved bytes and forward FLOPs; and
    what korthikanti_selective keeps per block against the plain block."""
    c = dict(cfg, seq_len=seq_len)
    rows, plain = block_ops(c)
    block = sum(r["bytes"] for r in rows)
    core = sum(r["bytes"] for r in rows if r["op"] in CORE_OPS and "attn" in r["name"])
    replayed = sum(r["flops"] for r in rows if not r["decisions"]["korthikanti_selective"].save)
    sel = run(c, tg.korthikanti_selective)
    outside = plain["after_forward"] - c["n_layer"] * plain["per_block"]
    kept_per_block = (sel["after_forward"] - outside) / c["n_layer"]
    shape = estimate.GPTShape(c["n_layer"], c["d_model"], c["n_head"], seq_len, c["batch"], vocab_size=c["vocab"])
    terms = estimate.engine_activation_terms(shape)
    formula = (terms["attn.softmax_out"] + terms["attn.causal_mask"]) / sum(terms.values())
    k = estimate.korthikanti_terms(seq_len, c["batch"], c["d_model"], c["n_head"])
    k22 = sum(v for key, v in k.items() if key.startswith("attn.softmax")) / sum(k.values())
    return dict(seq_len=seq_len, core=core, block=block, share=core / block, formula_share=formula,
                k22_share=k22, as_over_h=c["n_head"] * seq_len / c["d_model"],
                replayed_share=replayed / sum(r["flops"] for r in rows),
                measured_replayed_share=sel["recompute"] / sel["block_forward"],
                kept_per_block=kept_per_block, kept_share=kept_per_block / plain["per_block"])


# ---------------------------------------------------------------- figures
def ops_figure(rows: list[dict], path: str, cfg: dict) -> None:
    fig, ax = plots.new_figure(figsize=(10, 6.2))
    total_b = sum(r["bytes"] for r in rows)
    total_f = sum(r["flops"] for r in rows)
    # ops that keep nothing (views, adds) or next to nothing (the scalar of attn.mul) are left out
    shown = [r for r in rows if r["bytes"] > 1e-4 * total_b and r["flops"] > 0]
    xs = np.array([100 * r["flops"] / total_f for r in shown])
    ys = np.array([100 * r["bytes"] / total_b for r in shown])
    xlo, xhi = 10 ** math.floor(math.log10(xs.min()) - 0.3), 10 ** math.ceil(math.log10(xs.max()) + 0.2)
    ylo, yhi = 10 ** math.floor(math.log10(ys.min()) - 0.3), 10 ** math.ceil(math.log10(ys.max()) + 0.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xlo, xhi)
    ax.set_ylim(ylo, yhi)
    # the quadrant: under Q% of the block's FLOPs to recompute, over Q% of its bytes to keep
    ax.fill_between([xlo, QUADRANT], QUADRANT, yhi, color="#C44E52", alpha=0.08, lw=0)
    ax.axvline(QUADRANT, color="grey", ls=":", lw=1)
    ax.axhline(QUADRANT, color="grey", ls=":", lw=1)
    ax.text(xlo * 1.3, yhi / 1.4, "cheap to recompute,\nexpensive to keep", color="#C44E52", fontsize=10,
            va="top", fontweight="bold")
    ax.text(xhi / 1.3, ylo * 1.3, "costly to recompute,\ncheap to keep", color="#4C72B0", fontsize=10,
            ha="right", va="bottom", fontweight="bold")
    ax.plot([xlo, xhi], [xlo, xhi], color="grey", lw=0.8, ls="--")
    ax.text(xhi / 1.5, xhi / 1.5 * 1.15, "same share of bytes as of FLOPs", fontsize=7, color="grey", ha="right",
            rotation=0)
    groups: dict[tuple, list] = {}  # ops at the same point (ln_1 and ln_2) share one label
    for r, x, y in zip(shown, xs, ys):
        groups.setdefault((round(math.log10(x), 2), round(math.log10(y), 2)), []).append((r, x, y))
    placed: list[tuple[float, float, bool]] = []
    for members in sorted(groups.values(), key=lambda m: m[0][1]):
        r, x, y = members[0]
        color = plots.OP_COLORS.get(r["op"], "#333333")
        ax.scatter([x], [y], s=60, color=color, zorder=3, edgecolor="white", lw=0.5)
        # labels of neighbours at about the same height alternate above / below their points
        near = [(px, below) for px, py, below in placed
                if abs(math.log10(y / py)) < 0.08 and 0 < math.log10(x / px) < 0.6]
        below = bool(near) and not max(near)[1]
        ax.annotate(" / ".join(m[0]["label"] for m in members), (x, y), xytext=(6, -11 if below else 3),
                    textcoords="offset points", fontsize=8, color=color)
        placed.append((x, y, below))
    percent = FuncFormatter(lambda v, _: f"{v:g}%")
    ax.xaxis.set_major_formatter(percent)
    ax.yaxis.set_major_formatter(percent)
    ax.set_xlabel("FLOPs to recompute it (% of the block's forward FLOPs, log scale)")
    ax.set_ylabel("bytes it keeps for backward (% of the block's saved bytes, log scale)")
    ax.set_title(f"Every op of one GPT block (B={cfg['batch']}, T={cfg['seq_len']}, d={cfg['d_model']}, "
                 f"H={cfg['n_head']}): what it keeps vs what it costs to redo", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    plots.save(fig, path)


def policies_figure(res: dict, path: str) -> None:
    fig, axes = plots.new_figure(1, 2, figsize=(13, 4.8))
    ax = axes[0]
    runs = res["runs"]
    unit = plots.byte_unit(max(r["peak"] for r in runs))[1]
    div = plots.unit_divisor(unit)
    colors = {"none": "black", "save_nothing": "#C44E52", "save_matmuls": "#55A868",
              "korthikanti_selective": "#DA8BC3"}
    ymax = max(r["peak"] for r in runs) / div * 1.2
    label_y = None  # labels stacked top-down, at least `gap` apart, joined to their points
    gap = 0.1 * ymax
    for r in sorted(runs, key=lambda r: -r["peak"]):
        x, y = 100 * r["recompute"] / r["block_forward"], r["peak"] / div
        label_y = y if label_y is None else min(y, label_y - gap)
        ax.scatter([x], [y], s=80, color=colors[r["label"]], zorder=3)
        ax.annotate(f"{r['label']}\n{plots.format_bytes(r['peak'])}, {x:.1f}% recompute", (x, y),
                    xytext=(x + 8, label_y), textcoords="data", fontsize=8, va="center",
                    arrowprops=dict(arrowstyle="-", color="grey", lw=0.6, shrinkA=0, shrinkB=4))
    ax.set_xlim(-5, 125)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("recompute FLOPs (% of one forward of the blocks)")
    ax.set_ylabel(f"peak activation memory ({unit})")
    ax.set_title(f"Policies on a {res['config']['n_layer']}-layer GPT, T={res['config']['seq_len']} (measured)",
                 fontsize=10)
    ax.grid(alpha=0.3)

    ax = axes[1]
    sw = res["t_sweep"]
    ts = [r["seq_len"] for r in sw]
    ax.plot(ts, [100 * r["share"] for r in sw], "o", color="#C44E52", ms=8, mfc="none", mew=1.5,
            label="core's share of a block's saved bytes (measured)")
    ax.plot(ts, [100 * r["formula_share"] for r in sw], "-", color="#C44E52", lw=1,
            label="  the same, estimate.engine_activation_terms")
    ax.plot(ts, [100 * r["k22_share"] for r in sw], "--", color="grey", lw=1,
            label="  Korthikanti: 5as/h ÷ (34 + 5as/h) (fp16, dropout)")
    ax.plot(ts, [100 * r["measured_replayed_share"] for r in sw], "s-", color="#55A868", ms=5, lw=1,
            label="core's share of the block's FLOPs (replayed, measured)")
    ax.plot(ts, [100 * r["kept_share"] for r in sw], "D-", color="#DA8BC3", ms=5, lw=1,
            label="korthikanti_selective keeps, vs a plain block")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ts)
    ax.set_xticklabels([str(t) for t in ts])
    ax.set_ylim(0, 100)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("% of one block")
    tc = res["t_config"]
    ax.set_title(f"The attention core grows with T (B={tc['batch']}, d={tc['d_model']}, H={tc['n_head']})",
                 fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(alpha=0.3)
    plots.save(fig, path)


# ---------------------------------------------------------------- the lesson
def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    sz = sizes(quick)
    cfg = sz["gpt"]
    L = cfg["n_layer"]
    print("Lesson 7: selective recomputation")
    C.claim(__doc__)
    print(f"A GPT with {L} layers, d_model {cfg['d_model']}, {cfg['n_head']} heads, B={cfg['batch']}, "
          f"T={cfg['seq_len']}, float32, no dropout.")

    rows, plain = block_ops(cfg)
    total_b = sum(r["bytes"] for r in rows)
    total_f = sum(r["flops"] for r in rows)
    C.heading("1. One block, op by op: bytes kept vs FLOPs to recompute")
    table, views = [], {}
    for r in rows:
        if not r["bytes"] and not r["flops"]:
            views[r["op"]] = views.get(r["op"], 0) + 1
            continue
        ratio = f"{r['bytes'] / r['flops']:.3f}" if r["flops"] else "-"
        table.append((r["label"], r["op"], f"{r['bytes']:,}", f"{r['bytes'] / total_b:.1%}", f"{r['flops']:,}",
                      f"{r['flops'] / total_f:.1%}", ratio, ", ".join(r["keys"]) or "nothing"))
    print(C.table(table, ["op (in h.0)", "kind", "bytes kept", "of block", "FLOPs", "of block", "B/FLOP",
                          "saves"], ["<", "<", ">", ">", ">", ">", ">", "<"]))
    print("views, " + ", ".join(f"{op} ×{k}" for op, k in views.items()) + ": save nothing, cost nothing.")
    print(f"block h.0 keeps {total_b:,} B (ledger: led.saved_breakdown('layer')['transformer.h.0'] = "
          f"{plain['per_block']:,}) "
          f"and costs {total_f:,} FLOPs forward.")
    cheap = sorted((r for r in rows if r["bytes"] and 100 * r["flops"] < QUADRANT * total_f
                    and 100 * r["bytes"] > QUADRANT * total_b),
                   key=lambda r: -r["bytes"])
    cheap_b = sum(r["bytes"] for r in cheap)
    cheap_f = sum(r["flops"] for r in cheap)
    linear_f = sum(r["flops"] for r in rows if r["op"] == "linear") / total_f
    linear_b = sum(r["bytes"] for r in rows if r["op"] == "linear") / total_b
    print(f"In the quadrant (< {QUADRANT}% of the FLOPs, > {QUADRANT}% of the bytes): "
          f"{', '.join(r['label'] for r in cheap)}:\n"
          f"together {cheap_b / total_b:.0%} of the bytes for {cheap_f / total_f:.1%} of the FLOPs. The linear layers "
          f"are the opposite: {linear_f:.0%} of the FLOPs, {linear_b:.0%} of the bytes.")
    print("(A buffer saved by several ops counts once, under the first; (shared) marks the others: q·kᵀ saves q "
          "and k,\nviews of the one q,k,v output of c_attn, and att·v saves v and the softmax output, both counted "
          "already.)")

    C.heading("2. What each policy decides, and why: policy.decide(op, scoped_name)")
    table = []
    for r in rows:
        if not r["bytes"] and not r["flops"]:
            continue
        table.append((r["label"], f"{r['bytes']:,}",
                      *("keep" if r["decisions"][p].save else "recompute" for p, _ in POLICIES)))
    print(C.table(table, ["op (in h.0)", "bytes kept", *(p for p, _ in POLICIES)]))
    for p, _ in POLICIES:
        reasons = {}
        for r in rows:
            d = r["decisions"][p]
            reasons.setdefault(("keep" if d.save else "recompute", d.reason), []).append(r["label"])
        print(f"{p}:")
        for (verdict, reason), labels in reasons.items():
            print(textwrap.fill(", ".join(dict.fromkeys(labels)), 110,
                                initial_indent=f"  {verdict:<9} {reason!r}: ", subsequent_indent=" " * 14))
    replayed = {p: sum(r["flops"] for r in rows if not r["decisions"][p].save) for p, _ in POLICIES}

    C.heading("3. Measured: peak activation memory and recompute FLOPs")
    runs = [dict(plain, label="none")]
    for p, pol in POLICIES:
        runs.append(dict(run(cfg, pol), label=p))
    outside = plain["after_forward"] - L * plain["per_block"]
    decisions = {r["label"]: r["decisions"] for r in rows}
    table = []
    for r in runs:
        r["kept_per_block"] = (r["after_forward"] - outside) / L
        p = r["label"]
        # ops the policy recomputes that the replay did not run: it stopped before them (early stop)
        r["stopped_before"] = [label for label, f, ran in r.get("replay", ()) if f and not ran
                               and not decisions[label][p].save]
        r["tail"] = sum(f for label, f, _ in r.get("replay", ()) if label in r["stopped_before"])
        if p in replayed:
            replayed[p] -= r["tail"]
        table.append((p, C.format_bytes(r["peak"]), f"{r['peak'] / plain['peak']:.1%}",
                      f"{100 * r['recompute'] / r['block_forward']:.1f}%", f"{100 * replayed.get(p, 0) / total_f:.1f}%",
                      f"{r['kept_per_block']:,.0f}", f"{r['kept_per_block'] / plain['per_block']:.1%}"))
    print(C.table(table, ["policy", "activation peak", "of none", "recompute", "(part 1 sum)", "kept per block",
                          "of plain"]))
    print("recompute: led.flops('recompute') as % of the blocks' forward; part 1 sum: the FLOPs of the ops the "
          "policy\nrecomputes, from the table above, less those the replay stops before. kept per block: "
          "activation bytes live\nafter the forward, minus the embeddings' and head's, per block.")
    print("The replay stops early (as PyTorch's does): once backward has every array it needs, it ends. The ops at "
          "the end\nof a block that save only their inputs and whose outputs nothing later reads are served, not "
          "run. It stopped before:")
    for r in runs[1:]:
        print(f"  {r['label']:<22} {', '.join(r['stopped_before']) or '(nothing)'}: {r['tail']:,} FLOPs of block h.0")
    by = {r["label"]: r for r in runs}
    B, T, d = cfg["batch"], cfg["seq_len"], cfg["d_model"]
    print(f"save_nothing is every-layer checkpointing: it keeps one input per block (B·T·d·4 = {B * T * d * 4:,} B)\n"
          "and replays the forward up to the block's tail.")
    for p in ("save_matmuls", "korthikanti_selective"):
        r = by[p]
        print(f"{p} keeps in block h.0:")
        print(textwrap.fill(", ".join(f"{op}:{what} {list(shape)}" for op, what, shape, _ in r["kept"]), 110,
                            initial_indent="    ", subsequent_indent="    "))
    print("(attn.matmul#1 is q·kᵀ, attn.matmul#2 the attention weights times v: two ops of one name, in order.)")
    print("A kept op keeps what it made: its output (when a recomputed op reads it in the replay) and what it "
          "saved that\nis not one of its inputs. A kept linear keeps its output, not its saved input x: that is the "
          "output of the\nop before it, recomputed when that op is. The activation peak still includes one block "
          "replayed in full,\nplus the head's saves: the per-block saving is what grows with depth.")
    quadratic = [f"{op}:{what} {list(shape)}" for op, what, shape, _ in by["korthikanti_selective"]["kept"]
                 if len(shape) == 4 and shape[-2:] == (T, T)]
    if quadratic:
        print(f"WARNING: korthikanti_selective keeps [B, H, T, T] arrays ({', '.join(quadratic)}): an op of the "
              "attention core\nthat its policy does not recognise (KorthikantiSelective.core / decide) is kept, "
              "and with it its O(T²) output.")
    for p in ("save_nothing", "save_matmuls", "korthikanti_selective"):
        r = by[p]
        print(f"  {p:<22} keeps {r['kept_per_block'] / plain['per_block']:4.0%} of a plain block, peaks at "
              f"{r['peak'] / plain['peak']:4.0%} of none, replays {100 * r['recompute'] / r['block_forward']:5.1f}% "
              "of a forward")
    sm = by["save_matmuls"]
    print("save_matmuls keeps every matmul output, including the attention scores q·kᵀ [B, H, T, T], which a plain "
          "block\nnever keeps (softmax keeps its own output instead): deciding by op kind alone cannot tell a small "
          f"matmul output\nfrom an O(T²) one. Here that costs {sm['kept_per_block'] / plain['per_block']:.0%} of a "
          f"plain block per block and a peak {sm['peak'] / plain['peak']:.0%} of none.")

    C.heading("4. The attention core grows with T (Korthikanti's 5as/h term)")
    tc = sz["t_sweep"]
    sweep = [core_share(tc, t) for t in tc["seq_lens"]]
    table = [(r["seq_len"], f"{r['as_over_h']:g}", f"{r['core']:,}", f"{r['block']:,}", f"{r['share']:.1%}",
              f"{r['formula_share']:.1%}", f"{r['k22_share']:.1%}", f"{r['measured_replayed_share']:.1%}",
              f"{r['kept_share']:.1%}") for r in sweep]
    print(C.table(table, ["T", "as/h", "core bytes", "block bytes", "core share", "formula", "K22",
                          "replayed FLOPs", "kept / plain"]))
    print(f"(B={tc['batch']}, d={tc['d_model']}, H={tc['n_head']}. core: the softmax output [B,H,T,T] and the causal "
          "mask [T,T],\nthe bytes korthikanti_selective drops; formula: estimate.engine_activation_terms; K22: "
          "5as/h ÷ (34 + 5as/h),\nthe paper's share (fp16, with dropout masks). replayed FLOPs: measured recompute "
          "÷ the blocks' forward.\nkept / plain: what the policy keeps per block ÷ a plain block's saves.)")
    print(f"From T={sweep[0]['seq_len']} to T={sweep[-1]['seq_len']} the core's share of a block's bytes goes "
          f"{sweep[0]['share']:.0%} -> {sweep[-1]['share']:.0%}: bytes ∝ H·T², FLOPs ∝ T²·d, so the share of FLOPs\n"
          f"replayed grows less ({sweep[0]['measured_replayed_share']:.0%} -> "
          f"{sweep[-1]['measured_replayed_share']:.0%}), and what a block keeps falls to "
          f"{sweep[-1]['kept_share']:.0%} of a plain block.")

    ops_path = C.fig_path(out, f"{SLUG}_ops.png")
    policies_path = C.fig_path(out, f"{SLUG}_policies.png")
    res = dict(config=cfg, t_config=tc, ops=[{k: v for k, v in r.items() if k != "decisions"} for r in rows],
               decisions={r["label"]: {p: (d.save, d.reason) for p, d in r["decisions"].items()} for r in rows},
               block_bytes=total_b, block_flops=total_f, quadrant=[r["label"] for r in cheap], replayed=replayed,
               quadrant_bytes_share=cheap_b / total_b, quadrant_flops_share=cheap_f / total_f,
               runs=runs, t_sweep=sweep, stopped_before={r["label"]: r["stopped_before"] for r in runs[1:]})
    ops_figure(rows, ops_path, cfg)
    policies_figure(res, policies_path)
    elapsed = time.perf_counter() - t0
    print(f"\nwrote {ops_path}\nwrote {policies_path}  ({elapsed:.1f} s)")
    res.update(figures=[ops_path, policies_path], seconds=elapsed)
    return res


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"{' and '.join(r['quadrant'])} keep {r['quadrant_bytes_share']:.0%} of a block's bytes for "
            f"{r['quadrant_flops_share']:.0%} of its FLOPs",
            "recompute FLOPs per block: " + ", ".join(f"{k} {v:,}" for k, v in r["replayed"].items())]


if __name__ == "__main__":
    C.cli(main, __doc__)
