"""Lesson 15: your own model.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): the memory a training step needs is set by what each layer's operations keep for backward, so
the trade checkpointing makes (drop those activations, recompute them) depends on the model's layers, not on
who wrote the model or how many devices run it. Measured here: plans made by this engine, on PyTorch models it
did not write, on one process and split over two.

What this lesson adds: lesson 11 took the plans to a PyTorch GPT written by this engine (its names, its layer
norm). Here the models are yours: a GPT in nanoGPT's layout and a model in Hugging Face's Llama layout, written
below with stock PyTorch (F.layer_norm, F.rms_norm, SiLU, fused scaled_dot_product_attention), no engine names.
tinygrad_ckpt.torch_bridge.plans finds their blocks, names their ops by module path, applies the engine's plans and
policies, and measures per layer what PyTorch keeps, to set beside the engine's ledger of the same model; on two
processes, per rank, beside the engine's per-device estimate.

What you will see:
1. The engine's plan: the engine's GPT of your GPT's shape, measured by the ledger, and the planner's plan for a
   budget of 40% of what its blocks keep, from those costs.
2. That plan on your GPT in PyTorch (the engine's weights copied in by name): per layer, PyTorch's saves against
   the ledger's, plainly and under the plan; every block differs by the same named amount (PyTorch's layer norm
   keeps its input and its mean, the engine's its output); the gradients are bit-identical with and without it.
3. The Llama-layout model (blocks at model.layers, called with keyword arguments, returning tuples): planned from
   costs measured on it in PyTorch, with every layer, √n, the planner and a selective policy; and what the engine
   says when a policy finds no module it was written for.
4. Two processes: your GPT split with DTensor tensor parallelism (t = 2, without and with sequence parallelism),
   every layer checkpointed; per rank, parameters, gradients, AdamW states, the saves of each layer and their peak
   against the engine's per-device estimate, every difference a named term (skipped, with the reason, where
   torch.distributed or its gloo backend cannot run).

Read: tinygrad_ckpt/torch_bridge/plans.py (apply_plan, measure, comparison_table),
tinygrad_ckpt/torch_bridge/weights.py, tinygrad_ckpt/torch_bridge/dist.py (tensor_parallel, comparison_rows),
tinygrad_ckpt/recompute/planner.py (plan_chain).

Run: python lessons/15_your_own_model.py [--quick] [--out figures]
(needs the optional extra: pip install -e ".[torch]"; without torch the lesson says so and skips.)
Figure: {out}/15_your_own_model.png (your GPT's saves per layer in PyTorch and in the ledger, plain and planned;
the Llama's peak per plan; per rank, PyTorch against the engine's estimate).
"""

from __future__ import annotations

import math

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt.app.figures import lessons_dir
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.scale.estimate import GPTShape
from tinygrad_ckpt.scale.measure import layer_costs

SLUG = "15_your_own_model"
_MODELS = {}


def _models():
    """The two PyTorch models, written here from the layouts (defined on first use: torch is optional)."""
    if _MODELS:
        return _MODELS
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):  # nanoGPT's layout: one fused c_attn, explicit causal attention, a mask buffer
        def __init__(self, d, n_head, block_size):
            super().__init__()
            self.c_attn, self.c_proj, self.head_dim = nn.Linear(d, 3 * d), nn.Linear(d, d), d // n_head
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size,
                                                                                            block_size))

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in self.c_attn(x).chunk(3, dim=-1))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # [B, heads, T, T]
            att = F.softmax(att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")), dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, -1))

    class MLP(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.c_fc, self.c_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, d, n_head, block_size):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(d), Attention(d, n_head, block_size)
            self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd), drop=nn.Dropout(0.0),
                h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
                ln_f=nn.LayerNorm(n_embd)))
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.lm_head.weight = self.transformer.wte.weight

        def forward(self, idx, targets):
            tr = self.transformer
            x = tr.drop(tr.wte(idx) + tr.wpe(torch.arange(idx.shape[1])))
            for block in tr.h:
                x = block(x)
            logits = self.lm_head(tr.ln_f(x))
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return F.rms_norm(x, self.weight.shape, self.weight, 1e-5)

    class SelfAttention(nn.Module):  # Hugging Face's Llama layout: q, k, v, o projections, rotary, fused attention
        def __init__(self, d, n_head, n_kv):
            super().__init__()
            hd = d // n_head
            self.q_proj, self.k_proj = nn.Linear(d, n_head * hd, bias=False), nn.Linear(d, n_kv * hd, bias=False)
            self.v_proj, self.o_proj = nn.Linear(d, n_kv * hd, bias=False), nn.Linear(d, d, bias=False)
            self.head_dim, self.group = hd, n_head // n_kv

        def forward(self, hidden_states, position_embeddings):
            B, T, _ = hidden_states.shape
            cos, sin = position_embeddings

            def rotate(x):
                a, b = x.chunk(2, dim=-1)
                return x * cos + torch.cat((-b, a), dim=-1) * sin

            q, k, v = (p(hidden_states).view(B, T, -1, self.head_dim).transpose(1, 2)
                       for p in (self.q_proj, self.k_proj, self.v_proj))
            k, v = rotate(k).repeat_interleave(self.group, 1), v.repeat_interleave(self.group, 1)
            y = F.scaled_dot_product_attention(rotate(q), k, v, is_causal=True)  # the fused kernel: no [T, T]
            return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))

    class SwiGLU(nn.Module):
        def __init__(self, d, hidden):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
            self.down_proj = nn.Linear(hidden, d, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class DecoderLayer(nn.Module):
        def __init__(self, d, n_head, n_kv, hidden):
            super().__init__()
            self.self_attn, self.mlp = SelfAttention(d, n_head, n_kv), SwiGLU(d, hidden)
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)

        def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
            h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings)
            return (h + self.mlp(self.post_attention_layernorm(h)),)

    class Llama(nn.Module):
        def __init__(self, vocab_size, n_layer, n_head, n_kv, d, hidden):
            super().__init__()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(vocab_size, d)
            self.model.layers = nn.ModuleList([DecoderLayer(d, n_head, n_kv, hidden) for _ in range(n_layer)])
            self.model.norm = RMSNorm(d)
            self.lm_head = nn.Linear(d, vocab_size, bias=False)
            hd = d // n_head
            self.register_buffer("inv_freq", 1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

        def forward(self, input_ids, labels):
            angles = torch.outer(torch.arange(input_ids.shape[1]).float(), self.inv_freq).repeat(1, 2)
            h = self.model.embed_tokens(input_ids)
            for layer in self.model.layers:
                h = layer(h, attention_mask=None, position_embeddings=(angles.cos(), angles.sin()))[0]
            logits = self.lm_head(self.model.norm(h))
            return logits, F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    _MODELS.update(GPT=GPT, Llama=Llama)
    return _MODELS


def gpt(**config):
    """Your GPT (the factory torch_dist's ranks build it with: "lessons/15_your_own_model.py:gpt")."""
    return _models()["GPT"](**config)


def sizes(quick: bool) -> dict:
    return dict(vocab_size=64, block_size=32, n_layer=4, n_head=4, n_embd=64, batch=4) if quick else \
        dict(vocab_size=256, block_size=128, n_layer=8, n_head=8, n_embd=256, batch=8)


def grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def same_grads(model, reference) -> bool:
    import torch

    return all(torch.equal(p.grad, reference[n]) for n, p in model.named_parameters())


def main(quick: bool = False, out: str | None = None) -> dict:
    print("Lesson 15: your own model")
    C.claim(__doc__)
    out = C.output_folder(out, quick)
    try:
        import torch

        from tinygrad_ckpt.torch_bridge import dist as td
        from tinygrad_ckpt.torch_bridge import plans as tp
        from tinygrad_ckpt.torch_bridge import weights as tw
    except ImportError as exc:
        return C.without_torch(exc)

    s = sizes(quick)
    V, T, L, H, D, B = (s[k] for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "batch"))
    config = {k: v for k, v in s.items() if k != "batch"}
    idx_np, _ = C.token_batch(V, B, T)
    idx = torch.as_tensor(idx_np)
    blocks = [f"transformer.h.{k}" for k in range(L)]

    C.heading("1. The engine's plan for your GPT, from the ledger's costs")
    engine = C.make_gpt(V, T, L, H, D)
    led_plain = C.engine_step(engine, idx_np)
    engine.checkpoint = "every_layer"
    led_every = C.engine_step(engine, idx_np)
    costs = layer_costs(led_plain, led_every, blocks, B * T * D * 4)
    budget = int(0.4 * sum(c.saved_bytes for c in costs))
    plan = planner.plan_chain(costs, budget, max_depth=1)
    engine.checkpoint = plan
    led_plan = C.engine_step(engine, idx_np)
    print(f"engine GPT: {L} layers, d = {D}, {H} heads, T = {T}, B = {B}; its blocks keep "
          f"{C.format_bytes(sum(c.saved_bytes for c in costs))} run plainly")
    print(f"plan_chain for {C.format_bytes(budget)} (40%): {plan.describe()} (predicted peak "
          f"{C.format_bytes(plan.predicted_peak_bytes)})")

    C.heading("2. That plan on your GPT, in PyTorch, layer by layer against the ledger")
    torch.manual_seed(0)
    model = gpt(**config)
    tw.to_torch(model, engine)  # by name: nanoGPT's names are the engine's; the mask buffer is not a weight
    step = lambda: model(idx, idx)[1]  # noqa: E731
    plain = tp.measure(model, step)
    reference = grads(model)
    model.zero_grad(set_to_none=True)
    applied = tp.apply_plan(model, plan)  # blocks found at transformer.h
    planned = tp.measure(model, step)
    bitwise = same_grads(model, reference)
    tp.remove_plan(model)
    ln = 2 * (B * T * D * 4 + B * T * 4)  # two norms a block: input and mean more in PyTorch
    per_layer = {}
    for label, saves, led in (("none", plain, led_plain), ("plan", planned, led_plan)):
        rows = {r["name"]: r for r in tp.comparison_rows(saves, led)}
        per_layer[label] = {b: (rows[b]["torch"], rows[b]["engine"]) for b in blocks}
        print(f"\n{label}: {describe(applied) if label == 'plan' else 'no checkpoint'}")
        print(tp.comparison_table(saves, led))
    starts = set(plan.checkpoint_boundaries())
    named = {b: ln - (B * T * D * 4 if k in starts else 0) for k, b in enumerate(blocks)}
    unexplained = max(abs(per_layer["plan"][b][0] - per_layer["plan"][b][1] - named[b]) for b in blocks)
    unexplained = max(unexplained, max(abs(t - e - ln) for t, e in per_layer["none"].values()))
    print(f"\nevery block: PyTorch = ledger + {ln:,} B plainly (its two layer norms keep their input and mean, "
          f"2 × ({B}·{T}·{D} + {B}·{T}) × 4 B; the engine's keep their output, which the next linear keeps anyway),"
          f"\nless the block's input ({B * T * D * 4:,} B) under a checkpoint that starts at it (its ln_1's input is "
          f"the checkpoint's)")
    rows = {r["name"]: r["difference"] for r in tp.comparison_rows(plain, led_plain)}
    head = {"transformer.ln_f": B * T * 4, "lm_head": B * T * D * 4, tp.OUTSIDE: 4 - B * T * 5}
    for name, term in head.items():
        unexplained = max(unexplained, abs(rows[name] - term))
    print(f"outside the blocks: ln_f keeps its input and mean too (+{head['transformer.ln_f']:,} B: its output, the "
          f"same bytes, PyTorch counts under lm_head, which keeps it: +{head['lm_head']:,} B there); the loss: "
          f"PyTorch keeps\nthe log-softmax and a 0-d weight, the engine the logits, a log-sum-exp and a valid flag per "
          f"row ({head[tp.OUTSIDE]:+,} B). Unexplained anywhere: {unexplained} B")
    print(f"peak of saved bytes: {plain.peak:,} B plainly, {planned.peak:,} B under the plan "
          f"({planned.peak / plain.peak:.0%}); gradients bit-identical: {bitwise}")

    C.heading("3. A Llama-layout model, planned from costs measured on it in PyTorch")
    torch.manual_seed(0)
    Llama = _models()["Llama"]
    llama = Llama(V, L, H, max(1, H // 2), D, 3 * D // 2)
    lstep = lambda: llama(idx, idx)[1]  # noqa: E731
    lplain = tp.measure(llama, lstep)
    lref = grads(llama)
    lcosts = tp.measure_costs(llama, lstep)
    lbudget = int(0.4 * sum(c.saved_bytes for c in lcosts))
    print(f"blocks found at {tp.find_blocks(llama)[0]}; they keep {C.format_bytes(sum(c.saved_bytes for c in lcosts))}"
          f" run plainly; budget {C.format_bytes(lbudget)}")
    llama_runs = {"none": (lplain.peak, True, "no checkpoint")}
    for label, spec, policy in (("every layer", "every_layer", None), ("√n", "sqrt", None),
                                ("planner", ("budget", lbudget), None), ("save_matmuls", None, tg.save_matmuls),
                                ("korthikanti_selective", None, tg.korthikanti_selective)):
        llama.zero_grad(set_to_none=True)
        applied = tp.apply_plan(llama, spec, policy=policy, step=lstep)
        saves = tp.measure(llama, lstep)
        llama_runs[label] = (saves.peak, same_grads(llama, lref), applied.plan.describe())
        tp.remove_plan(llama)
    print(C.table([(k, f"{p:,}", f"{p / lplain.peak:.0%}", "yes" if ok else "NO", d)
                   for k, (p, ok, d) in llama_runs.items()],
                  ["plan", "peak saved (B)", "of none", "same grads", "segments"]))
    print("korthikanti_selective finds this Llama's attention core by its module name, self_attn (nanoGPT's is attn),"
          " and keeps the\nrotated q and k its replay reads: the [B, H, T, T] scores and softmax are recomputed, "
          "nothing else.")

    C.heading("4. Two processes: your GPT with tensor parallelism, per rank against the engine's estimate")
    reason = td.availability()
    tp_result = None
    if reason:
        print(f"skipped: {reason}")
    else:
        shape = GPTShape(n_layer=2, d_model=64, n_head=4, seq_len=32, batch=4, vocab_size=64)
        small = dict(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64)
        factory = f"{lessons_dir() / SLUG}.py:gpt"  # each rank builds your GPT with this lesson's gpt()
        specs = {sp: td.Spec(factory, small, shape, parallel="tp", sequence=sp, plan="every_layer")
                 for sp in (False, True)}
        ranks = dict(zip(specs, td.run(list(specs.values()), nproc=2)))
        tp_result = {}
        for sp, spec in specs.items():
            rows = td.comparison_rows(spec, ranks[sp][0])
            label = "t = 2" + (" + sequence parallel" if sp else "")
            print(td.table(rows, f"{label}, every layer checkpointed: rank 0 of 2 (rank 1 holds the same)"))
            tp_result[label] = {"rows": {r.quantity: (r.measured, r.estimate, r.unexplained) for r in rows},
                                "worst": max(r.within for r in rows),
                                "losses": [(r["loss"], r["reference_loss"]) for r in ranks[sp]]}
        print("\n(loss on each rank = the unsplit model's; 'unexplained' is what no named term accounts for)")

    path = C.fig_path(out, f"{SLUG}.png")
    unit, uname = (2**20, "MiB") if plain.peak > 2**24 else (2**10, "KiB")
    fig, axes = plots.new_figure(1, 4, figsize=(18, 4.8), gridspec_kw={"width_ratios": [1.5, 0.8, 1.1, 1.3]})
    ax = axes[0]
    x = np.arange(L)
    ax.bar(x - 0.2, [per_layer["none"][b][1] / unit for b in blocks], 0.4, color="#1f77b4", label="ledger (engine)")
    ax.bar(x + 0.2, [per_layer["none"][b][0] / unit for b in blocks], 0.4, color="#d62728", label="PyTorch")
    ax.scatter(x + 0.2, [(per_layer["none"][b][1] + ln) / unit for b in blocks], marker="_", s=500, color="k",
               zorder=3, label="ledger + named terms")
    ax.set_xticks(x)
    ax.set_xticklabels([f"h.{k}" for k in range(L)])
    ax.set_ylabel(f"saved for backward by the layer ({uname})")
    ax.set_title("your GPT, each layer, no checkpoint:\nPyTorch = the ledger + its layer norms' input and mean",
                 fontsize=9)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=3)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[1]
    peaks = {"ledger": (led_plain.peak_bytes("activation"), led_plan.peak_bytes("activation")),
             "PyTorch": (plain.peak, planned.peak)}
    for i, (label, color) in enumerate((("ledger", "#1f77b4"), ("PyTorch", "#d62728"))):
        ax.bar(np.arange(2) + (i - 0.5) * 0.38, [v / unit for v in peaks[label]], 0.38, color=color, label=label)
    ax.set_xticks(np.arange(2))
    ax.set_xticklabels(["none", "the engine's\nplan"], fontsize=8)
    ax.set_ylabel(f"peak of saved bytes ({uname})")
    ax.set_title("your GPT: the plan's peak", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[2]
    labels = list(llama_runs)
    ax.bar(labels, [llama_runs[k][0] / unit for k in labels], color=["#7f7f7f"] + ["#2ca02c"] * (len(labels) - 1))
    around = lplain.peak - sum(c.saved_bytes for c in lcosts)  # what the embedding, norm, head and loss keep
    ax.axhline((lbudget + around) / unit, color="k", ls="--", lw=1)
    ax.text(len(labels) - 0.5, (lbudget + around) / unit, "the planner's budget for the blocks\n+ what the rest keeps ",
            fontsize=7, va="bottom", ha="right")
    ax.set_ylabel(f"peak of saved bytes ({uname})")
    ax.set_title("the Llama-layout model in PyTorch: peak per plan\n(gradients bit-identical under each)", fontsize=9)
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    ax.grid(axis="y", alpha=0.3)
    ax = axes[3]
    if tp_result:
        quantities = ["parameters", "gradients", "optimizer states", "saved, transformer.h.0", "peak of saved bytes"]
        short = ["params", "grads", "AdamW", "saved h.0", "peak saved"]
        x = np.arange(len(quantities))
        for i, (label, color) in enumerate(zip(tp_result, ("#9467bd", "#8c564b"))):
            rows = tp_result[label]["rows"]
            ax.bar(x + (i - 0.5) * 0.38, [rows[q][0] / 2**10 for q in quantities], 0.38, color=color,
                   label=f"PyTorch, {label}")
            ax.scatter(x + (i - 0.5) * 0.38, [rows[q][1] / 2**10 for q in quantities], marker="_", s=300,
                       color="k", zorder=3, label="the engine's estimate" if i == 0 else None)
        ax.set_xticks(x)
        ax.set_xticklabels(short, fontsize=8)
        ax.set_ylabel("per rank (KiB)")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
        ax.legend(fontsize=7, frameon=False, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
        ax.set_title("2 processes (2 layers, d = 64), every layer checkpointed, rank 0:\nabove the estimate by "
                     "the named terms, 0 B unexplained", fontsize=9)
    else:
        ax.text(0.5, 0.5, f"two processes: skipped\n{reason}", ha="center", va="center", fontsize=8, wrap=True)
        ax.set_axis_off()
    fig.suptitle(f"The engine's plans on your own PyTorch models ({L} layers, d = {D}, T = {T}, B = {B})",
                 fontsize=10)
    plots.save(fig, path)
    print(f"\nfigure: {path}")
    return {"plan": plan.describe(), "budget": budget, "per_layer": per_layer, "per_block_term": ln,
            "unexplained": unexplained, "peaks": {"none": plain.peak, "plan": planned.peak}, "bitwise": bitwise,
            "llama": llama_runs, "llama_budget": lbudget, "tp": tp_result,
            "tp_skipped": reason, "figures": [path]}


def describe(applied) -> str:
    return f"plan {applied.plan.describe()} on {applied.path}"


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    if "skipped" in r:
        return [f"skipped: {r['skipped']}"]
    lines = [f"the engine's plan {r['plan']} on your GPT: PyTorch's peak {r['peaks']['plan'] / r['peaks']['none']:.0%} "
             f"of plain, every layer = ledger + named terms ({r['unexplained']} B unexplained)"]
    if r["tp"]:
        worst = max(v["worst"] for v in r["tp"].values())
        lines.append(f"t = 2 (± sequence parallel), per rank against the engine's estimate: {worst:.1%} unexplained")
    else:
        lines.append(f"two processes skipped: {r['tp_skipped']}")
    return lines


if __name__ == "__main__":
    C.cli(main, __doc__)
