"""Lesson 13: what changes in a Llama: SwiGLU, grouped-query attention, rotary positions and experts, measured.

What you will see: the blocks people train now (Llama, Mistral, Mixtral) beside GPT-2's, one layer each on the
shape-only meta backend at the seed's width (d = 4096, 32 heads, T = 2048, B = 1, float16), every byte from the
ledger. (1) SwiGLU's three matrices: what the norm + MLP half of a block keeps, per token, for GPT-2's GELU MLP
and for SwiGLU at GPT-2's parameter count (f = 11008, Meta's rule) and at its width (f = 4d). (2) Grouped-query
attention: what the attention half keeps with 32, 8 and 1 key/value heads: the keys and values shrink with the
heads, the [B, H, T, T] weights do not. (3) Rotary positions: the rotary ops keep one cos/sin table for the whole
model and nothing per layer, against GPT-2's learned position table with its gradient and AdamW states. (4)
Mixture of experts: as the experts grow from 2 to 16 (2 per token), the MLP's weights, gradients and AdamW states
grow with them while its activations and FLOPs stay those of 2 experts; and on NumPy, with a real router, how
uneven the experts' batches are while the bytes they keep stay the same.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): training memory is parameters, their gradients, Adam's states and the activations each layer keeps,
"about 12·B·T·d values" per layer for the chapter's GPT-style block. The models trained now change every one of
these terms: a SwiGLU MLP keeps more per token, grouped-query attention keeps fewer keys and values, rotary
positions keep no parameter at all, and a mixture of experts multiplies the weights and states but not the
activations or the compute. Measured here: by how much each change moves each term.

Read: tinygrad_ckpt/nn/__init__.py (Llama, LlamaAttention, LlamaMLP, MixtralSparseMoeBlock),
tinygrad_ckpt/ops/rotary.py, tinygrad_ckpt/ops/moe.py (TopKRouting, Dispatch, Combine, balanced_indices: the
balanced routing of the meta backend), tinygrad_ckpt/ops/nn.py (SiLUOp, RMSNormOp: what each keeps),
tinygrad_ckpt/functional.py (scaled_dot_product_attention with enable_gqa),
tinygrad_ckpt/scale/estimate.py (LlamaShape, PRESETS, llama_parameter_terms),
tinygrad_ckpt/scale/measure.py (SteadyStep).

Run: python lessons/13_what_changes_in_a_llama.py [--quick] [--out figures]
(--quick: the same width, fewer points in the experts sweep.)
Figure: {out}/13_what_changes_in_a_llama.png (four panels: the MLP half's saves per token; the attention half's
with 32, 8, 1 key/value heads; position tables; the experts' memory against their compute).
"""

from __future__ import annotations

import _common as C
from matplotlib.patches import Patch

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.events import within
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import SteadyStep

SLUG = "13_what_changes_in_a_llama"
D, HEADS, T, B, VOCAB = 4096, 32, 2048, 1, 32000
V = 2  # bytes per value: float16
GPT_LAYER, LLAMA_LAYER = "transformer.h.0.", "model.layers.0."


# ---------------------------------------------------------------- measuring

def gpt(n_layer: int = 1) -> est.GPTShape:
    return est.GPTShape(n_layer, D, HEADS, T, B, vocab_size=VOCAB, dtype="float16")


def llama(n_layer: int = 1, **kw) -> est.LlamaShape:
    return est.LlamaShape(n_layer, D, HEADS, T, B, vocab_size=VOCAB, dtype="float16", **kw)


def measured(shape):
    """The ledger of one steady training step (AdamW, float32 states) of the model of `shape`, on meta."""
    C.fresh()
    return SteadyStep(shape).measure()[0]


def saves(led, layer: str, *modules: str) -> dict:
    """{"module.op:role": bytes} of the arrays the ops of `layer` saved (or only those of its `modules`), each buffer
    counted once, under its first saver; the module is its path inside the layer, read from the event fields."""
    layer = layer.rstrip(".")
    out = {}
    for life in led.lifetimes():
        inside = (layer + "." + m for m in modules) if modules else (layer,)
        if any(within(life.scope, m) for m in inside):
            key = f"{life.scope[len(layer) + 1:]}.{life.op}:{life.role}"
            out[key] = out.get(key, 0) + life.nbytes
    return out


def state_bytes(led, module: str) -> dict:
    """Bytes of the parameters in `module` (a module path, or one parameter's name) and of what training keeps for
    them: {parameter, gradient, optimizer}, each buffer once, by the tensor each event says it belongs to."""
    module, params = module.rstrip("."), {e.tensor for e in led.events if e.category == "parameter"}
    out, seen = dict.fromkeys(("parameter", "gradient", "optimizer"), 0), set()
    for e in led.events:
        if e.buffer in seen or not e.allocates:
            continue
        seen.add(e.buffer)
        if e.tensor in params and within(e.tensor, module) and e.category in out:
            out[e.category] += e.nbytes
    return out


def forward_flops(led, module: str) -> int:
    """Forward FLOPs of the ops run in `module` or below it."""
    module = module.rstrip(".")
    return sum(op["flops"] for op in led.ops if op["phase"] == "forward" and within(op["scope"], module))


def per_token(nbytes: int) -> float:
    """Bytes in units of d values per token: bytes / (B·T·d·2)."""
    return nbytes / (B * T * D * V)


# ---------------------------------------------------------------- 1. SwiGLU

MLP_TERMS = {  # saved array (after the layer's prefix) -> what it is
    "ln_2.layer_norm:out": "norm output (c_fc's input)",
    "ln_2.layer_norm:rstd": "norm 1/std",
    "mlp.gelu:x": "GELU input (c_fc output)",
    "mlp.gelu:out": "GELU output (c_proj's input)",
    "post_attention_layernorm.rms_norm:x": "norm input (the residual stream)",
    "post_attention_layernorm.rms_norm:rstd": "norm 1/rms",
    "mlp.gate_proj.linear:x": "normed x (gate's and up's input)",
    "mlp.act_fn.silu:x": "SiLU input (gate output)",
    "mlp.mul:a": "SiLU output",
    "mlp.mul:b": "up output",
    "mlp.down_proj.linear:x": "gate·up (down's input)",
}


def mlp_half(led, prefix: str) -> dict:
    found = saves(led, prefix, "ln_2", "mlp", "post_attention_layernorm")
    assert set(found) <= set(MLP_TERMS), sorted(set(found) - set(MLP_TERMS))
    return found


# ---------------------------------------------------------------- 2. grouped-query attention

ATTN_TERMS = {  # saved array (after the layer's prefix) -> what it is; GPT-2's first, then Llama's
    "ln_1.layer_norm:out": "norm (output or input, 1/std)", "ln_1.layer_norm:rstd": "norm (output or input, 1/std)",
    "attn.matmul:b": "q, k, v (c_attn's output)", "attn.matmul:a": "q, k, v (c_attn's output)",
    "attn.softmax:out": "attention weights [B,H,T,T]", "attn.masked_fill:mask": "causal mask [T,T]",
    "attn.c_proj.linear:x": "output projection's input",
    "input_layernorm.rms_norm:x": "norm (output or input, 1/std)",
    "input_layernorm.rms_norm:rstd": "norm (output or input, 1/std)",
    "self_attn.q_proj.linear:x": "projections' input (the normed x)", "self_attn.matmul:a": "queries (rotated)",
    "self_attn.matmul:b": "keys (rotated) and values", "self_attn.rotary:table": "rotary table (the model's one)",
    "self_attn.softmax:out": "attention weights [B,H,T,T]", "self_attn.masked_fill:mask": "causal mask [T,T]",
    "self_attn.o_proj.linear:x": "output projection's input",
}


def attention_terms(found: dict) -> dict:
    """The attention half's saves grouped by ATTN_TERMS: {term: bytes}."""
    out = {}
    for key, n in found.items():
        if key.startswith(("attn.", "self_attn.", "ln_1.", "input_layernorm.")):
            out[ATTN_TERMS[key]] = out.get(ATTN_TERMS[key], 0) + n
    return out


# ---------------------------------------------------------------- 4. experts on NumPy: the real router

def routed_on_numpy(routing: str, quick: bool) -> dict:
    """A small Mixtral (8 experts, 2 per token) at random initialisation, one forward and backward on NumPy with the
    router's choice or the balanced one: tokens per expert (from the tape) and the MoE's saved bytes (the ledger)."""
    C.fresh()
    tg.manual_seed(0)
    d, tokens = 64, (128 if quick else 512)
    model = nn.Llama(101, tokens, 1, 4, d, n_kv_head=2, ffn_hidden=96, n_experts=8, experts_per_token=2)
    model.model.layers[0].block_sparse_moe.routing = routing
    idx, targets = C.token_batch(101, 1, tokens, seed=3)
    with tg.Ledger() as led:
        _, loss = model(idx, targets)
        dispatch = next(e for e in loss.tape() if e.op == "dispatch")
        counts = [shape[0] for shape, _ in dispatch.out_meta]
        del dispatch
        loss.backward()
    moe = sum(n for k, n in led.saved_breakdown(by="name").items() if ".block_sparse_moe." in k)
    return dict(counts=counts, moe_saved=moe, peak=led.peak_bytes("activation"), tokens=tokens)


# ---------------------------------------------------------------- the lesson

def main(quick: bool = False, out: str = "figures") -> dict:
    print("Lesson 13: what changes in a Llama")
    C.claim(__doc__)
    print(f"One layer of each model at d = {D}, {HEADS} heads, T = {T}, B = {B}, float16, AdamW (float32 m, v), "
          "on the meta backend; each number from the ledger of one steady training step.")
    ffn_equal = est.llama_ffn_hidden(D)  # 11008: SwiGLU with GPT-2's MLP parameters
    result: dict = {"config": dict(d_model=D, n_head=HEADS, seq_len=T, batch=B, ffn_equal_params=ffn_equal)}

    C.heading("1. SwiGLU's three matrices: what the norm + MLP half of a block keeps, per token (units of d values)")
    leds = {"GPT-2 MLP (GELU, 4d)": (measured(gpt()), GPT_LAYER),
            f"SwiGLU, f = {ffn_equal} (GPT-2's parameters)": (measured(llama(ffn_hidden=ffn_equal)), LLAMA_LAYER),
            f"SwiGLU, f = {4 * D} (GPT-2's width)": (measured(llama(ffn_hidden=4 * D)), LLAMA_LAYER)}
    mlp, rows = {}, []
    for label, (led, prefix) in leds.items():
        mlp[label] = mlp_half(led, prefix)
        params = state_bytes(led, prefix + "mlp.")["parameter"] // V
        total = sum(mlp[label].values())
        rows.append((label, f"{params / 1e6:.1f} M", f"{per_token(total):.2f}", C.format_bytes(total)))
    print(C.table(rows, ["MLP", "parameters", "kept per token (d)", "kept, B·T tokens"]))
    for label, found in mlp.items():
        print(f"  {label}: " + ", ".join(f"{MLP_TERMS[k]} {per_token(n):.2f}" for k, n in found.items()))
    base = sum(mlp["GPT-2 MLP (GELU, 4d)"].values())
    ratios = {label: sum(found.values()) / base for label, found in mlp.items()}
    print(f"SwiGLU at GPT-2's parameter count keeps {ratios[list(mlp)[1]]:.2f}x GPT-2's MLP half, at its width "
          f"{ratios[list(mlp)[2]]:.2f}x: three wide arrays instead of two (gate output, SiLU output, up output, and\n"
          "their product against GELU's input and output), and RMSNorm keeps its input where this engine's LayerNorm "
          "keeps its output,\nwhich the next linear keeps anyway (PyTorch's layer norm keeps its input too).")
    result["mlp"] = {label: {MLP_TERMS[k]: n for k, n in found.items()} for label, found in mlp.items()}
    result["mlp_ratio"] = ratios

    C.heading("2. Grouped-query attention: what the attention half keeps, with 32, 8 and 1 key/value heads")
    kv_heads = (HEADS, 8, 1)
    attn = {"GPT-2 (32 heads)": attention_terms(saves(leds["GPT-2 MLP (GELU, 4d)"][0], GPT_LAYER))}
    kv_params = {}
    for kv in kv_heads:
        led = measured(llama(ffn_hidden=ffn_equal, n_kv_head=kv))
        attn[f"Llama, {kv} kv heads"] = attention_terms(saves(led, LLAMA_LAYER))
        kv_params[kv] = sum(state_bytes(led, f"{LLAMA_LAYER}self_attn.{p}.")["parameter"] for p in ("k_proj", "v_proj"))
    terms = sorted({t for found in attn.values() for t in found})
    rows = [(t, *(C.format_bytes(found.get(t, 0)) if found.get(t) else "-" for found in attn.values()))
            for t in terms]
    rows.append(("total", *(C.format_bytes(sum(f.values())) for f in attn.values())))
    print(C.table(rows, ["kept by the attention half", *attn]))
    kv_bytes = {kv: attn[f"Llama, {kv} kv heads"]["keys (rotated) and values"] for kv in kv_heads}
    weights = attn[f"Llama, {HEADS} kv heads"]["attention weights [B,H,T,T]"]
    print(f"keys and values: {C.format_bytes(kv_bytes[HEADS])} with {HEADS} heads, {C.format_bytes(kv_bytes[8])} "
          f"with 8 ({kv_bytes[8] / kv_bytes[HEADS]:.3f}: 8/32), {C.format_bytes(kv_bytes[1])} with 1; the "
          f"[B, H, T, T] weights stay {C.format_bytes(weights)} (one per query head: grouping the keys does not\n"
          "group the queries; chunked attention, lesson 10, removes them), and k_proj + v_proj's weights go from "
          f"{C.format_bytes(kv_params[HEADS])} to {C.format_bytes(kv_params[8])} and {C.format_bytes(kv_params[1])}.\n"
          "Against GPT-2 a Llama's attention keeps one d more per token (RMSNorm keeps its input, and the normed x "
          "is kept again by the projections), rotation or not.")
    result["attention"], result["kv_bytes"], result["kv_params"] = attn, kv_bytes, kv_params

    C.heading("3. Rotary positions keep nothing but one table for the whole model")
    layers = 4
    g_led, l_led = measured(gpt(layers)), measured(llama(layers, ffn_hidden=ffn_equal))
    wpe = state_bytes(g_led, "transformer.wpe.weight")
    rotary = {life.name: life.nbytes for life in l_led.lifetimes() if life.op == "rotary"}
    rotary_ops = [op["name"] for op in l_led.ops if op["op"] == "rotary" and op["phase"] == "forward"]
    table = sum(rotary.values())
    hd = D // HEADS
    print(C.table([("GPT-2: learned positions, transformer.wpe [T, d]", C.format_bytes(wpe["parameter"]),
                    C.format_bytes(wpe["gradient"]), C.format_bytes(wpe["optimizer"]), "0 B"),
                   ("Llama: rotary table, model.rotary_emb [2, T, head_dim]", "0 B (a buffer)", "0 B", "0 B",
                    C.format_bytes(table))],
                  ["positions", "parameter", "gradient", "AdamW m, v", "kept for backward"]))
    print(f"{len(rotary_ops)} rotary ops in {layers} layers (q and k in each) keep {len(rotary)} array: "
          f"{', '.join(rotary)} = 2·T·{hd}·{V} B = {table:,} B, counted once; per layer they add 0 bytes (the rotated\n"
          "q and k the scores' product keeps replace the unrotated ones GPT-2's keeps, byte for byte).")
    result["positions"] = dict(wpe=wpe, rotary_table=table, rotary_saves=list(rotary), rotary_ops=len(rotary_ops),
                               layers=layers)

    C.heading("4. Experts: memory grows with the experts, compute with the experts per token")
    dense = measured(llama(ffn_hidden=14336, n_kv_head=8))
    sweep = [(e, 2) for e in ((2, 8) if quick else (2, 4, 8, 16))] + [(8, 1), (8, 4)]
    moe = {"dense": dict(experts=0, k=1, led=dense, part=LLAMA_LAYER + "mlp.")}
    for e, k in sweep:
        led = measured(llama(ffn_hidden=14336, n_kv_head=8, n_experts=e, experts_per_token=k))
        moe[f"{e} experts, {k} per token"] = dict(experts=e, k=k, led=led, part=LLAMA_LAYER + "block_sparse_moe.")
    rows, base = [], None
    for label, r in moe.items():
        st = state_bytes(r["led"], r["part"])
        r["state"] = sum(st.values())
        r["saved"] = sum(saves(r["led"], LLAMA_LAYER, "mlp", "block_sparse_moe").values())
        r["flops"] = forward_flops(r["led"], r["part"])
        base = base or r
        rows.append((label, C.format_bytes(r["state"]), f"{r['state'] / base['state']:.2f}x",
                     C.format_bytes(r["saved"]), f"{r['saved'] / base['saved']:.2f}x", f"{r['flops'] / 1e12:.2f} T",
                     f"{r['flops'] / base['flops']:.2f}x"))
        del r["led"]
    print(C.table(rows, ["MLP of one layer (f = 14336)", "weights+grads+AdamW", "vs dense", "kept for backward",
                         "vs dense", "forward FLOPs", "vs dense"]))
    mixtral = moe["8 experts, 2 per token"]
    print(f"Mixtral's layer (8 experts, 2 per token): {mixtral['state'] / base['state']:.2f}x the dense MLP's "
          f"weights and states, {mixtral['saved'] / base['saved']:.2f}x its activations and "
          f"{mixtral['flops'] / base['flops']:.2f}x its FLOPs: memory is all 8 experts, compute 2.")
    for note in est.assumptions(llama(ffn_hidden=14336, n_kv_head=8, n_experts=8)):
        print(f"(assumed: {note})")
    result["moe"] = moe

    C.heading("5. A real router on NumPy: uneven batches, the same bytes")
    learned, balanced = routed_on_numpy("learned", quick), routed_on_numpy("balanced", quick)
    share = learned["tokens"] * 2 / 8
    runs = (("router's top-2 (random init)", learned), ("balanced (the meta backend's)", balanced))
    print(C.table([(r, " ".join(f"{n:>4}" for n in x["counts"]), f"{max(x['counts']) / share:.2f}x",
                    C.format_bytes(x["moe_saved"]), C.format_bytes(x["peak"])) for r, x in runs],
                  ["routing", "tokens per expert", "busiest vs N·k/E", "MoE keeps", "activation peak"]))
    print(f"{learned['tokens']} tokens, 8 experts, 2 per token: every expert's saves are held until backward, so "
          "together they come to the N·k routed rows\nwhatever the router chooses; its choice moves compute and "
          "bytes between experts (and devices, under expert parallelism), not the total.")
    result["routing"] = dict(learned=learned, balanced=balanced, share=share)

    path = C.fig_path(out, f"{SLUG}.png")
    figure(path, result)
    print(f"\nfigure: {path}")
    result["figures"] = [path]
    return result


# ---------------------------------------------------------------- the figure

MLP_GROUPS = {  # a term of either MLP -> (its role, which both MLPs share, and its color)
    "norm output (c_fc's input)": ("norm: its output (GPT-2) or input (Llama)", "#8172B3"),
    "norm input (the residual stream)": ("norm: its output (GPT-2) or input (Llama)", "#8172B3"),
    "norm 1/std": ("norm: 1/std or 1/rms per token", "#3F3266"),
    "norm 1/rms": ("norm: 1/std or 1/rms per token", "#3F3266"),
    "normed x (gate's and up's input)": ("Llama: the normed x (gate's and up's input)", "#B3A2D6"),
    "GELU input (c_fc output)": ("first linear's output (GELU's or SiLU's input)", "#DD8452"),
    "SiLU input (gate output)": ("first linear's output (GELU's or SiLU's input)", "#DD8452"),
    "GELU output (c_proj's input)": ("GELU's or SiLU's output", "#F2B58A"),
    "SiLU output": ("GELU's or SiLU's output", "#F2B58A"),
    "up output": ("SwiGLU: up's output", "#55A868"),
    "gate·up (down's input)": ("SwiGLU: gate·up (down's input)", "#4C72B0"),
}
ATTN_COLORS = {"norm (output or input, 1/std)": "#8172B3", "projections' input (the normed x)": "#B3A2D6",
               "q, k, v (c_attn's output)": "#55A868", "queries (rotated)": "#8FC89C",
               "keys (rotated) and values": "#2E7D45", "output projection's input": "#4C72B0",
               "causal mask [T,T]": "#937860", "rotary table (the model's one)": "#C44E52"}


def figure(path: str, r: dict) -> None:
    fig, axes = plots.new_figure(2, 2, figsize=(13, 9.2))
    (a, b), (c, d) = axes

    labels = list(r["mlp"])
    for x, label in enumerate(labels):
        bottom = 0.0
        for term, n in r["mlp"][label].items():
            a.bar(x, per_token(n), bottom=bottom, color=MLP_GROUPS[term][1], width=0.6, edgecolor="white", lw=0.5)
            bottom += per_token(n)
        a.text(x, bottom + 0.3, f"{bottom:.2f}·d", ha="center", fontsize=8)
    a.set_xticks(range(len(labels)), [lbl.replace(" (", "\n(") for lbl in labels], fontsize=8)
    a.set_ylabel("kept per token (units of d values)")
    a.set_ylim(0, max(sum(per_token(n) for n in f.values()) for f in r["mlp"].values()) * 1.45)
    roles = dict(MLP_GROUPS.values())
    a.legend(handles=[Patch(color=col, label=role) for role, col in roles.items()], fontsize=7, frameon=False,
             loc="upper left", ncol=2)
    a.set_title("(1) the norm + MLP half of one block", fontsize=10)
    a.grid(axis="y", alpha=0.3)

    cols = list(r["attention"])
    t2 = "attention weights [B,H,T,T]"
    for x, label in enumerate(cols):
        bottom = 0.0
        for term, n in sorted(r["attention"][label].items(), key=lambda kv: list(ATTN_COLORS).index(kv[0])
                              if kv[0] in ATTN_COLORS else 99):
            if term == t2:
                continue
            b.bar(x, per_token(n), bottom=bottom, color=ATTN_COLORS[term], width=0.6, edgecolor="white", lw=0.5)
            bottom += per_token(n)
        b.text(x, bottom + 0.15, f"{bottom:.2f}·d\n+ {C.format_bytes(r['attention'][label][t2])}\nT² weights",
               ha="center", fontsize=7)
    b.set_xticks(range(len(cols)), [lbl.replace(", ", "\n") for lbl in cols], fontsize=8)
    b.set_ylabel("kept per token (units of d values), T² weights aside")
    b.set_ylim(0, max(sum(per_token(n) for k, n in f.items() if k != t2) for f in r["attention"].values()) * 1.75)
    used = {t for f in r["attention"].values() for t in f if t != t2}
    b.legend(handles=[Patch(color=col, label=t) for t, col in ATTN_COLORS.items() if t in used], fontsize=7,
             frameon=False, loc="upper center", ncol=3)
    b.set_title("(2) the attention half: keys and values shrink with the kv heads", fontsize=10)
    b.grid(axis="y", alpha=0.3)

    p = r["positions"]
    wpe = p["wpe"]
    bars = [("GPT-2 wpe\nparameter", wpe["parameter"], "#4C72B0"), ("GPT-2 wpe\ngradient", wpe["gradient"], "#DD8452"),
            ("GPT-2 wpe\nAdamW m, v", wpe["optimizer"], "#8172B3"),
            (f"Llama rotary table\n(kept, once for\n{p['layers']} layers)", p["rotary_table"], "#C44E52")]
    for x, (_, n, color) in enumerate(bars):
        c.bar(x, n / 2**20, color=color, width=0.6)
        c.text(x, n / 2**20, f"{C.format_bytes(n)}", ha="center", va="bottom", fontsize=8)
    c.set_xticks(range(len(bars)), [bar[0] for bar in bars], fontsize=8)
    c.set_ylabel("bytes for positions (MiB)")
    c.set_ylim(0, max(n for _, n, _ in bars) / 2**20 * 1.15)
    c.set_title(f"(3) positions at T = {T}: a trained table against a fixed one", fontsize=10)
    c.grid(axis="y", alpha=0.3)

    moe = r["moe"]
    dense = moe["dense"]
    two = sorted((v for v in moe.values() if v["k"] == 2), key=lambda v: v["experts"])
    xs = [v["experts"] for v in two]
    for key, color, label in (("state", "#8172B3", "weights + gradients + AdamW m, v"),
                              ("saved", "#C44E52", "activations kept for backward"),
                              ("flops", "#55A868", "forward FLOPs")):
        ys = [v[key] / dense[key] for v in two]
        d.plot(xs, ys, "o-", color=color, label=label)
        d.annotate(f"{ys[-1]:.2f}x", (xs[-1], ys[-1]), textcoords="offset points",
                   xytext=(0, 6 if key != "flops" else -12), ha="center", fontsize=8, color=color)
    for v in two:
        if v["experts"] == 8:
            d.annotate("Mixtral 8x7B's layer", (8, v["state"] / dense["state"]), textcoords="offset points",
                       xytext=(-8, -4), ha="right", va="top", fontsize=8)
    d.axhline(1, color="#555555", lw=0.8, ls=":")
    d.set_xscale("log", base=2)
    d.set_xticks(xs, [str(x) for x in xs])
    d.set_xlabel("experts per layer (2 per token)")
    d.set_ylabel("the MLP's, relative to one dense SwiGLU MLP")
    d.legend(fontsize=8, frameon=False, loc="upper left")
    d.set_title("(4) a mixture of experts: memory ∝ experts, compute ∝ experts per token", fontsize=10)
    d.grid(alpha=0.3)
    fig.suptitle(f"What changes in a Llama: one layer at d = {D}, {HEADS} heads, T = {T}, B = {B}, float16, measured "
                 "by the ledger on the meta backend", fontsize=11)
    plots.save(fig, path)


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    ratios, kv, moe = r["mlp_ratio"], r["kv_bytes"], r["moe"]
    mixtral, dense = moe["8 experts, 2 per token"], moe["dense"]
    equal = next(label for label in ratios if "parameters" in label)
    return [f"SwiGLU at GPT-2's parameters keeps {ratios[equal]:.2f}x its MLP half; 8 kv heads keep "
            f"{kv[8] / kv[HEADS]:.2f}x the keys and values of 32",
            f"Mixtral's layer: {mixtral['state'] / dense['state']:.1f}x the weights and states, "
            f"{mixtral['flops'] / dense['flops']:.1f}x the FLOPs of a dense MLP"]


if __name__ == "__main__":
    C.cli(main, __doc__)
