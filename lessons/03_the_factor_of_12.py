"""Lesson 3: the factor of 12.

What you will see: the inventory of what ONE transformer block saves for backward, read from the
tape and the ledger (per saved buffer: who saved it, shape, bytes), held against three formulas:
the engine's own term list (estimate.engine_activation_terms: it must match to the byte), the
seed's 12·B·T·d·bytes, and Korthikanti et al.'s sbh(34 + 5as/h), with every difference named.
Then the T² attention term: per-layer saved bytes measured as the sequence grows, in Korthikanti's
setting (16-bit values, dropout 0.1), against the seed's linear formula and Korthikanti's curve.
Last, the seed's own arithmetic: 32 × 12 × 4 × 2048 × 4096 × 2 bytes is 25.8 GB, not 64 GB.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): one transformer layer keeps about 12·B·T·d values for backward ("the factor of 12"),
and 32 such layers at B=4, T=2048, d=4096 in float16 come to "≈ 64 GB" of activations; the chapter
also says the attention weights grow with T², which a linear formula cannot hold. Measured here: what
a block really keeps, the T² term, and the arithmetic.

Read: tinygrad_ckpt/scale/estimate.py (korthikanti_terms, engine_activation_terms,
seed_activation_bytes_per_layer, seed_activation_example), tinygrad_ckpt/nn/__init__.py (Block,
CausalSelfAttention, MLP), tinygrad_ckpt/functional.py (scaled_dot_product_attention),
tinygrad_ckpt/ops/ (what each op saves).

Run: python lessons/03_the_factor_of_12.py [--quick] [--out figures]
Figures: {out}/03_the_factor_of_12.png (saved bytes per layer vs T: measured, seed, Korthikanti)
and {out}/03_the_factor_of_12_breakdown.png (what one block saves, by op, as T grows).
"""

from __future__ import annotations

import time

import _common as C
import numpy as np
from matplotlib.ticker import FuncFormatter

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.scale import estimate

SLUG = "03_the_factor_of_12"

# first saver of each buffer (scoped name:key) -> its term in estimate.engine_activation_terms
TERM_OF = {
    "ln_1.layer_norm:out": "attn.c_attn.input",  # ln_1's output, which c_attn keeps as its input too
    "ln_1.layer_norm:rstd": "ln_1.rstd",
    "attn.matmul:b": "attn.qkv",  # k (as kᵀ) is the first view of the c_attn output to be saved
    "attn.masked_fill:mask": "attn.causal_mask",
    "attn.softmax:out": "attn.softmax_out",
    "attn.dropout:mask_bits": "attn.attn_dropout_mask",
    "attn.matmul:a": "attn.attn_dropout_out",  # the second matmul's A, a new buffer only with dropout
    "attn.c_proj.linear:x": "attn.c_proj.input",
    "attn.resid_dropout.dropout:mask_bits": "attn.resid_dropout_mask",
    "ln_2.layer_norm:out": "mlp.c_fc.input",  # ln_2's output, which c_fc keeps as its input too
    "ln_2.layer_norm:rstd": "ln_2.rstd",
    "mlp.gelu:x": "mlp.gelu.input",
    "mlp.gelu:out": "mlp.c_proj.input",  # GELU's output, which the MLP's c_proj keeps as its input too
    "mlp.dropout.dropout:mask_bits": "mlp.resid_dropout_mask",
}


# the breakdown figure groups the terms: T²-sized in reds, E-sized in blues and greens
GROUPS = {
    "softmax output [B,H,T,T]": (("attn.softmax_out",), "#C44E52"),
    "attention dropout mask (1 bit) + output [B,H,T,T]": (("attn.attn_dropout_mask", "attn.attn_dropout_out"),
                                                          "#E8A0A0"),
    "causal mask [T,T] (bool)": (("attn.causal_mask",), "#937860"),
    "q, k, v (one c_attn output)": (("attn.qkv",), "#55A868"),
    "linear inputs (c_attn, attn c_proj, c_fc; two are layer-norm outputs)": (
        ("attn.c_attn.input", "attn.c_proj.input", "mlp.c_fc.input"),
                                                  "#4C72B0"),
    "MLP 4d: GELU input + c_proj input": (("mlp.gelu.input", "mlp.c_proj.input"), "#DD8452"),
    "layer norms: 1/std": (("ln_1.rstd", "ln_2.rstd"), "#8172B3"),
    "residual dropout masks (1 bit)": (("attn.resid_dropout_mask", "mlp.resid_dropout_mask"), "#DA8BC3"),
}


def grouped(inventory) -> dict:
    """{group: bytes} of an inventory (buffers with no estimate term go to 'other')."""
    out = dict.fromkeys(GROUPS, 0)
    for b in inventory:
        g = next((name for name, (terms, _) in GROUPS.items() if b["term"] in terms), "other (0-d scale)")
        out[g] = out.get(g, 0) + b["nbytes"]
    return out


def sizes(quick: bool) -> dict:
    if quick:
        return dict(block=dict(batch=2, seq_len=32, d_model=64, n_head=4),
                    sweep=dict(batch=1, d_model=64, n_head=4, seq_lens=(16, 32, 64, 128, 256)))
    return dict(block=dict(batch=4, seq_len=128, d_model=128, n_head=4),
                sweep=dict(batch=2, d_model=64, n_head=4, seq_lens=(32, 64, 128, 256, 512, 1024)))


def measure_block(batch, seq_len, d_model, n_head, dtype=np.float32, dropout=0.0, seed=0) -> dict:
    """Forward one nn.Block under a Ledger; the saved buffers, each once, with their savers."""
    C.fresh()
    tg.manual_seed(seed)
    block = nn.Block(d_model, n_head, dropout=dropout).to(dtype)
    x = tg.Tensor(np.random.default_rng(seed).standard_normal((batch, seq_len, d_model)).astype(dtype),
                  requires_grad=True, name="x")
    with tg.Ledger() as led:
        y = block(x)
    be = backend.current()
    params = {id(be.buffer(p.data)[0]) for p in block.parameters()}
    buffers: dict[int, dict] = {}
    for entry in y.tape().entries:
        for key, arr in entry.ctx.saved.items():
            owner, nbytes = be.buffer(arr)
            saver = f"{entry.name}:{key}"
            if id(owner) in params:
                continue  # a weight, saved by reference: parameter memory, not activation
            if id(owner) in buffers:
                buffers[id(owner)]["also"].append(f"{entry.op}:{key}")
            else:
                buffers[id(owner)] = dict(name=saver, shape=tuple(owner.shape), dtype=str(owner.dtype),
                                          nbytes=int(nbytes), also=[], term=TERM_OF.get(saver))
    inventory = list(buffers.values())
    shape = estimate.GPTShape(1, d_model, n_head, seq_len, batch, dtype=np.dtype(dtype).name, dropout=dropout)
    measured = sum(b["nbytes"] for b in inventory)
    by_op = led.saved_breakdown(by="op")
    ledger_total = sum(led.saved_breakdown(by="name").values())
    scalars = sum(b["nbytes"] for b in inventory if b["shape"] == ())
    del y
    return dict(inventory=inventory, measured=measured, ledger_total=ledger_total, by_op=by_op,
                scalar_bytes=scalars, terms=estimate.engine_activation_terms(shape),
                engine=estimate.engine_activation_bytes_per_layer(shape), shape=shape)


def print_inventory(m: dict) -> None:
    rows = []
    for i, b in enumerate(m["inventory"]):
        term = b["term"] or "(none)"
        est = m["terms"].get(b["term"]) if b["term"] else None
        ok = "yes" if est == b["nbytes"] else f"+{b['nbytes']} B"
        rows.append((i + 1, b["name"], ", ".join(b["also"]) or "",
                     str(list(b["shape"])), b["dtype"], f"{b['nbytes']:,}", term,
                     f"{est:,}" if est is not None else "-", ok))
    print(C.table(rows, ["#", "saved by (first saver)", "also read by", "buffer shape", "dtype", "bytes",
                         "estimate term", "term bytes", "agrees"],
                  [">", "<", "<", "<", "<", ">", "<", ">", "<"]))
    missing = [k for k in m["terms"] if k not in {b["term"] for b in m["inventory"]}]
    if missing:
        print(f"estimate terms with no measured buffer: {missing}")


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    print("Lesson 3: the factor of 12")
    C.claim(__doc__)
    result: dict = {}

    # ---------------------------------------------------------------- the inventory
    b = cfg["block"]
    B, T, d, H = b["batch"], b["seq_len"], b["d_model"], b["n_head"]
    E, v = B * T * d, 4
    C.heading(f"1. What one block saves: nn.Block(d={d}, H={H}), x [B={B}, T={T}, d={d}], float32, no dropout")
    m = measure_block(B, T, d, H)
    print_inventory(m)
    print(f"\nmeasured: {m['measured']:,} B (ledger, activation category: {m['ledger_total']:,} B)")
    diff = m["measured"] - m["engine"]
    scale = (f" (the scale 1/√hd, which the attention's multiply saves as a 0-d array of {m['scalar_bytes']} B)"
             if m["scalar_bytes"] else " (every saved byte is one of its terms)")
    print(f"estimate.engine_activation_bytes_per_layer: {m['engine']:,} B; measured - estimate = {diff:,} B{scale}")
    print("q, k and v are three views of ONE c_attn output buffer [B, T, 3d]: saved three times, counted once;"
          "\nthe second matmul's A is the softmax output itself (no dropout), also counted once.\n"
          "A buffer's shape is that of the array owning its memory, not of the view an op saved: a linear computes "
          f"one matmul\nover the B·T rows flattened, so c_attn's output buffer is [B·T, 3d] = [{B * T}, {3 * d}] "
          "(q, k, v view it) and c_fc's [B·T, 4d];\nthe attention output's buffer is the transpose's copy "
          "[B, T, H, d/H], before its heads are merged: same bytes either way.")

    seed_b = estimate.seed_activation_bytes_per_layer(B, T, d, v)
    k22 = estimate.korthikanti_terms(T, B, d, H, bytes_per_value=v)
    k22_total = sum(k22.values())
    C.heading("2. Against the seed's 12·B·T·d and Korthikanti's sbh(34 + 5as/h), in units of E = B·T·d values")
    print(f"measured          {m['measured']:>12,} B = {m['measured'] / (E * v):6.2f} E·v")
    print(f"engine formula    {m['engine']:>12,} B = 14 E·v + 2·B·T·v (two 1/std) + T² (bool mask) "
          "+ B·H·T²·v (softmax)")
    print(f"seed 12·B·T·d·v   {seed_b:>12,} B = 12.00 E·v   (no T² term, though its prose names [B, H, T, T])")
    print(f"Korthikanti (v=4) {k22_total:>12,} B = {k22_total / (E * v):6.2f} E·v  (with dropout masks, 1 B each)")
    print("\nThe 14 E-sized values the engine's backward reads, against the seed's 12:")
    print("  c_attn input (= ln_1 output) 1 + q,k,v 3 + c_proj input 1 + c_fc input (= ln_2 output) 1 + GELU input 4"
          "\n  + MLP c_proj input (GELU output) 4 = 14. Each layer norm keeps its output, which the next linear keeps"
          "\n  anyway, and recovers x̂ = (out - b)/w from it: its own cost is one 1/std per row; GELU keeps its output"
          "\n  too (the same array as c_proj's input) and reads Φ(x) = out/x from it. The seed's list"
          "\n  (pre-norm input, Q, K, V, attention weights, a 4d FFN tensor, residual-stream tensors) misses that"
          "\n  each linear keeps its own input and that the MLP keeps BOTH 4d tensors, and it prices the"
          "\n  [B, H, T, T] attention weights as if B·T·d.")
    print("Korthikanti's terms, and what this block does instead (same bytes per value):")
    notes = {
        "attn.qkv_input": "= c_attn input (E)",
        "attn.q_and_k": "+ attn.v = the one qkv buffer (3E)",
        "attn.softmax_output": "= softmax out (B·H·T²)",
        "attn.softmax_dropout_mask": "absent: no dropout here",
        "attn.softmax_dropout_output": "absent: no dropout here",
        "attn.v": "inside the qkv buffer",
        "attn.proj_input": "= c_proj input (E)",
        "attn.dropout_mask": "absent: no dropout here",
        "mlp.fc1_input": "= c_fc input (E)",
        "mlp.gelu_input": "= GELU input (4E)",
        "mlp.fc2_input": "= MLP c_proj input (4E)",
        "mlp.dropout_mask": "absent: no dropout here",
        "layernorms": "not kept: each keeps its output (= the next linear's input) and 1/std (2·B·T, not in [K22])",
    }
    print(C.table([(k, f"{val:,}", notes[k]) for k, val in k22.items()], ["[K22] term", "bytes", "here"],
                  ["<", ">", "<"]))
    print(f"and one the paper does not have: the bool causal mask, T² = {T * T:,} B (a fused kernel needs none).")
    result.update(block_config=dict(batch=B, seq_len=T, d_model=d, n_head=H),
                  inventory=[{k: bi[k] for k in ("name", "shape", "dtype", "nbytes", "term")} for bi in m["inventory"]],
                  measured_per_layer=m["measured"], ledger_per_layer=m["ledger_total"],
                  engine_per_layer=m["engine"], scalar_bytes=m["scalar_bytes"], seed_per_layer=seed_b,
                  korthikanti_per_layer=k22_total)

    # ---------------------------------------------------------------- Korthikanti's own setting
    s = cfg["sweep"]
    Bs, ds, Hs = s["batch"], s["d_model"], s["n_head"]
    C.heading(f"3. The T² term: one block in Korthikanti's setting (float16, dropout 0.1), B={Bs}, d={ds}, H={Hs}")
    rows, sweep = [], []
    breakdown = {}
    for Ts in s["seq_lens"]:
        ms = measure_block(Bs, Ts, ds, Hs, dtype=np.float16, dropout=0.1)
        k = estimate.korthikanti_bytes_per_layer(Ts, Bs, ds, Hs)
        sd = estimate.seed_activation_bytes_per_layer(Bs, Ts, ds, 2)
        extra = ms["measured"] - k
        E, bhtt = Bs * Ts * ds, Bs * Hs * Ts * Ts
        named = (2 * Bs * Ts * 2 + Ts * Ts + ms["scalar_bytes"]  # 1/std vectors, bool causal mask, 0-d scale
                 - 2 * E * 2  # the two layer-norm inputs [K22] counts: here their outputs, kept by the linears
                 - (bhtt - -(-bhtt // 8)) - 2 * (E - -(-E // 8)))  # dropout masks at 1 bit, not 1 byte
        sweep.append(dict(seq_len=Ts, measured=ms["measured"], engine=ms["engine"], korthikanti=k, seed=sd,
                          scalar_bytes=ms["scalar_bytes"], extra_vs_korthikanti=extra, named_extras=named))
        breakdown[f"T = {Ts}"] = grouped(ms["inventory"])
        rows.append((Ts, f"{ms['measured']:,}", f"{ms['engine']:,}", f"{k:,}", f"{extra:+,}",
                     "yes" if extra == named else "NO", f"{sd:,}", f"{ms['measured'] / sd:.2f}×",
                     f"{ms['measured'] / (Bs * Ts * ds * 2):.1f}"))
    print(C.table(rows, ["T", "measured", "engine", "[K22]", "meas.-[K22]", "= named?", "seed", "meas./seed",
                         "factor"]))
    print("(bytes; engine = estimate.engine_activation_bytes_per_layer, [K22] = sbh(34 + 5as/h), seed = "
          "12·B·T·d·2)")
    print("'= named?': measured - [K22] is exactly what is named: + two 1/std vectors (2·B·T·2 B), the bool "
          "causal mask "
          "(T² B)\nand the 2-byte scale; - the two layer-norm inputs (4·B·T·d B: each layer norm keeps its output, "
          "which the\nnext linear keeps anyway); - 7/8 of the three dropout masks (1 bit per element instead of "
          "1 byte).\n'factor' is measured / (B·T·d·2): the seed's 12 would be a constant; "
          f"it grows with T\nbecause of the [B, H, T, T] terms (5as/h in [K22]: they pass the 34 at T = 34h/5a = "
          f"{34 * ds / (5 * Hs):.0f}).")
    ratios = [(b2["measured"] / b1["measured"], b2["seq_len"] / b1["seq_len"]) for b1, b2 in zip(sweep, sweep[1:])]
    print("doubling T multiplies the saved bytes by " + ", ".join(f"{r:.2f}" for r, _ in ratios)
          + ": more than 2, superlinear.")
    result.update(sweep_config=dict(batch=Bs, d_model=ds, n_head=Hs, dtype="float16", dropout=0.1), sweep=sweep)

    # ---------------------------------------------------------------- the seed's arithmetic
    ex = estimate.seed_activation_example()
    e = estimate.SEED_EXAMPLE
    C.heading("4. The seed's own arithmetic: 32 layers, B=4, T=2048, d=4096, 2 bytes")
    print(f"32 × 12 × 4 × 2048 × 4096 × 2 = {ex['seed_formula']:,} B = "
          f"{C.format_bytes(ex['seed_formula'], decimal=True)} ({C.format_bytes(ex['seed_formula'])})")
    print(f"the seed prints ≈ 64 GB: {ex['seed_printed'] / ex['seed_formula']:.2f}× its own formula.")
    print(f"With the T² term (Korthikanti, 32 heads assumed): {C.format_bytes(ex['korthikanti_none'], True)}"
          f"; selective recompute {C.format_bytes(ex['korthikanti_selective'], True)}; full recompute "
          f"{C.format_bytes(ex['korthikanti_full'], True)}.")
    print("So the printed 64 GB is wrong arithmetic, and the formula itself undercounts a 2048-token layer by "
          f"{ex['korthikanti_none'] / ex['seed_formula']:.1f}×.")
    result.update(seed_example=dict(ex), seed_example_inputs=dict(e))

    # ---------------------------------------------------------------- figures
    Ts_m = np.array([r["seq_len"] for r in sweep], dtype=float)
    grid = np.unique(np.geomspace(Ts_m[0], Ts_m[-1], 200).round().astype(int))
    k_curve = np.array([estimate.korthikanti_bytes_per_layer(int(t), Bs, ds, Hs) for t in grid], dtype=float)
    k_lin = np.array([estimate.korthikanti_selective_bytes(int(t), Bs, ds) for t in grid], dtype=float)
    seed_line = np.array([estimate.seed_activation_bytes_per_layer(int(t), Bs, ds, 2) for t in grid], dtype=float)
    meas = np.array([r["measured"] for r in sweep], dtype=float)
    fig, axes = plots.new_figure(1, 2, figsize=(12, 4.6))
    unit = plots.byte_unit(meas.max())[1]
    div = plots.unit_divisor(unit)
    ax = axes[0]
    ax.plot(grid, k_curve / div, color="#C44E52", lw=2, label="Korthikanti sbh(34 + 5as/h)")
    ax.plot(grid, k_lin / div, color="#C44E52", lw=1, ls=":", label="Korthikanti without the as²b terms (34sbh)")
    ax.plot(grid, seed_line / div, color="#4C72B0", lw=2, ls="--", label="seed 12·B·T·d·2 (linear in T)")
    ax.plot(Ts_m, meas / div, "o", color="black", ms=6, label="measured (ledger), one block", zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ts_m, [str(int(t)) for t in Ts_m])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda val, _: f"{val:g}"))
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel(f"saved for backward per layer ({unit})")
    ax.set_title("per-layer activation memory")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    ax = axes[1]
    tok = Bs * grid
    ax.plot(grid, k_curve / tok / 1024, color="#C44E52", lw=2, label="Korthikanti")
    ax.plot(grid, seed_line / tok / 1024, color="#4C72B0", lw=2, ls="--", label="seed (a constant)")
    ax.plot(Ts_m, meas / (Bs * Ts_m) / 1024, "o", color="black", ms=6, label="measured", zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ts_m, [str(int(t)) for t in Ts_m])
    ax.set_ylim(0, None)
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("saved per token per layer (KiB)")
    ax.set_title("per token: flat for the seed, growing with T")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.suptitle(f"The T² attention term (one block, B={Bs}, d={ds}, H={Hs}, float16, dropout 0.1)")
    path1 = plots.save(fig, C.fig_path(out, f"{SLUG}.png"))

    fig, ax = plots.new_figure(figsize=(10, 4.6))
    plots.plot_saved_breakdown(ax, breakdown, title=f"What one block saves as T grows (B={Bs}, d={ds}, H={Hs}, "
                               "float16, dropout 0.1); totals on top", xlabel="sequence length", normalize=True,
                               colors={g: c for g, (_, c) in GROUPS.items()}, order=list(GROUPS)[::-1],
                               legend_title="saved tensors (estimate terms)")
    path2 = plots.save(fig, C.fig_path(out, f"{SLUG}_breakdown.png"))
    print(f"\nwrote {path1}\nwrote {path2}  ({time.perf_counter() - t0:.1f} s)")
    result["figures"] = [path1, path2]
    return result


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    b = r["block_config"]
    e = b["batch"] * b["seq_len"] * b["d_model"] * 4
    last = r["sweep"][-1]
    ex = r["seed_example"]
    return [f"one block keeps {r['measured_per_layer'] / e:.1f}·B·T·d values (float32, T={b['seq_len']}), not 12; "
            f"at T={last['seq_len']} (float16) "
            f"{last['measured'] / (last['seq_len'] * r['sweep_config']['d_model'] * 2):.0f}",
            f"the chapter's 32 × 12 × 4 × 2048 × 4096 × 2 B is {ex['seed_formula'] / 1e9:.1f} GB, not the printed "
            f"{ex['seed_printed'] / 1e9:.0f} GB; with the T² term {ex['korthikanti_none'] / 1e9:.1f} GB"]


if __name__ == "__main__":
    C.cli(main, __doc__)
