"""Lesson 5: the checkpoint segment: free the interior, replay it in backward, get identical gradients.

What you will see: a 4-layer GPT with dropout trained for one forward + backward twice, once plainly
and once with every block wrapped in `tg.checkpoint`. The checkpointed forward keeps only each block's
input (one [B, T, d] array) instead of everything the block's ops save; in backward each checkpoint
entry replays its block (ledger phase "recompute") and backpropagates through the replay. Measured:
every parameter gradient is bitwise equal (np.array_equal), the activation peak drops, and the replay
costs one extra forward of the blocks, less the ops at the end of each block that backward does not
need run again (the residual add here: the replay stops once backward has every array it needs). Then
what goes wrong without the RNG state: with preserve_rng_state=False the replay draws new dropout
masks; the replay check raises CheckpointError naming the dropout op, and with
determinism_check="none" the gradient is silently wrong.

Claim (chapter "Activation Checkpointing", section "The Memory Problem Activation Checkpointing
Solves"): the idle activations can be dropped and "recomputed on demand", turning idle
memory into compute work. Measured here: what one checkpoint segment frees, what its replay costs,
and that the gradients do not change at all.

Read: tinygrad_ckpt/recompute/checkpoint.py (checkpoint, SegmentForward.on_op_start, Checkpoint.input_grads,
Replay.rerun), tinygrad_ckpt/recompute/replay_check.py (Comparison, SegmentReplay),
tinygrad_ckpt/engine/function.py (Function.apply: the segment hook), tinygrad_ckpt/engine/tape.py (backward_steps),
tinygrad_ckpt/memory/ledger.py (phase "recompute", action "recomputed"), tinygrad_ckpt/backend/__init__.py
(get_rng_state, set_rng_state).

Run: python lessons/05_the_checkpoint_segment.py [--quick] [--out figures]
Figures: {out}/05_the_checkpoint_segment_timeline.png (memory without / with checkpointing on one
shared y-axis) and {out}/05_the_checkpoint_segment_flops.png (FLOPs per phase).
Page: {out}/05_the_checkpoint_segment_explorer.html (the same step in the interactive memory explorer:
open it in a browser).
"""

from __future__ import annotations

import re
import time

import _common as C
import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.ledger import CATEGORIES

SLUG = "05_the_checkpoint_segment"
DROPOUT_SEED = 1234  # the engine RNG is reset to this just before each forward: same dropout masks


def sizes(quick: bool) -> dict:
    if quick:
        return dict(vocab=64, seq_len=32, batch=4, n_layer=4, n_head=2, d_model=32, dropout=0.1)
    return dict(vocab=128, seq_len=64, batch=8, n_layer=4, n_head=4, d_model=64, dropout=0.1)


class CheckpointedGPT(nn.GPT):
    """nn.GPT whose blocks each run inside tg.checkpoint(block, x, **ckpt_kwargs).

    (GPT(checkpoint="every_layer") does the same with the default arguments; this spells the call
    out, so the lesson can pass preserve_rng_state and determinism_check.)"""

    def __init__(self, *args, ckpt_kwargs=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.ckpt_kwargs = dict(ckpt_kwargs or {})

    def run_blocks(self, x):
        for block in self.transformer.h:
            x = tg.checkpoint(block, x, **self.ckpt_kwargs)
        return x


def build(cfg: dict, ckpt_kwargs=None):
    """The same initial weights every time (seed 0); checkpointed if ckpt_kwargs is not None."""
    tg.manual_seed(0)
    shape = (cfg["vocab"], cfg["seq_len"], cfg["n_layer"], cfg["n_head"], cfg["d_model"])
    if ckpt_kwargs is None:
        return nn.GPT(*shape, dropout=cfg["dropout"])
    return CheckpointedGPT(*shape, dropout=cfg["dropout"], ckpt_kwargs=ckpt_kwargs)


def block_forward_flops(led) -> int:
    """FLOPs of the blocks' ops in the forward phase (layers transformer.h.0, transformer.h.1, ...)."""
    return sum(f for layer, f in led.flops_by_layer("forward").items() if layer.startswith("transformer.h."))


def measure(cfg: dict, batch, ckpt_kwargs=None) -> dict:
    """One forward + backward under a Ledger; the gradients (copied), the tape, the ledger."""
    model = build(cfg, ckpt_kwargs)
    idx, targets = batch
    C.fresh()
    tg.manual_seed(DROPOUT_SEED)
    with tg.Ledger() as led:
        _, loss = model(idx, targets)
        tape = loss.tape()
        entries = len(tape.entries)
        ckpt_entries = [e for e in tape.entries if e.op == "checkpoint"]
        first_ckpt = repr(ckpt_entries[0]) if ckpt_entries else None
        saved_after_forward = led.live_bytes("activation")  # what the tape holds, each buffer once
        loss_value = loss.item()
        del tape, ckpt_entries
        loss.backward()
    grads = {k: backend.current().to_numpy(p.grad).copy() for k, p in model.named_parameters()}  # on the CPU
    del model, loss
    C.fresh()
    return dict(led=led, grads=grads, loss=loss_value, entries=entries, first_ckpt=first_ckpt,
                saved_after_forward=saved_after_forward)


def flops_figure(runs, path) -> None:
    """Horizontal stacked bars: FLOPs per phase for each run, the recompute share written on it."""
    fig, ax = plots.new_figure(figsize=(9, 2.8))
    parts = [
        ("forward: blocks", lambda led: block_forward_flops(led), "#4C72B0"),
        ("forward: embeddings, ln_f, lm_head, loss", lambda led: led.flops("forward") - block_forward_flops(led),
         "#A6BDDB"),
        ("backward", lambda led: led.flops("backward"), plots.CATEGORY_COLORS["gradient"]),
        ("recompute (replays)", lambda led: led.flops("recompute"), "#55A868"),
    ]
    labels = [label for label, _ in runs]
    scale = 1e6
    for y, (_, led) in enumerate(runs):
        left = 0.0
        for name, get, color in parts:
            v = get(led) / scale
            ax.barh(y, v, left=left, color=color, height=0.55, label=name if y == 0 else None)
            if name.startswith("recompute") and v > 0:
                ax.text(left + v / 2, y, f"{get(led) / block_forward_flops(led):.3f}× the blocks' forward",
                        ha="center", va="center", fontsize=8, color="white")
            left += v
        ax.text(left, y, f"  {led.flops() / scale:.1f} MFLOP", va="center", fontsize=8)
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel("MFLOP (counted by the ledger, per phase)")
    ax.set_xlim(0, max(led.flops() for _, led in runs) / scale * 1.18)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.32), ncol=4, fontsize=8, frameon=False)
    ax.set_title("One forward + backward: the checkpointed run adds (almost) one forward of the blocks")
    ax.grid(axis="x", alpha=0.3)
    plots.save(fig, path)


def main(quick: bool = False, out: str = "figures") -> dict:
    t0 = time.perf_counter()
    cfg = sizes(quick)
    batch = C.token_batch(cfg["vocab"], cfg["batch"], cfg["seq_len"], seed=1)
    B, T, d, L = cfg["batch"], cfg["seq_len"], cfg["d_model"], cfg["n_layer"]
    print("Lesson 5: the checkpoint segment")
    C.claim(__doc__)
    print(f"A GPT with {L} layers, d_model {d}, {cfg['n_head']} heads, dropout {cfg['dropout']}, batch B={B}, "
          f"T={T}, float32.\nOne forward + backward under tg.Ledger(), without and with tg.checkpoint around "
          f"every block;\nthe engine RNG is reset to {DROPOUT_SEED} before each forward, so both draw the same "
          "dropout masks.")

    plain = measure(cfg, batch)
    ckpt = measure(cfg, batch, ckpt_kwargs={})
    lp, lc = plain["led"], ckpt["led"]

    C.heading("1. Forward: the interior is not kept")
    print(f"without checkpointing the tape has {plain['entries']} entries holding "
          f"{C.format_bytes(plain['saved_after_forward'])} when the forward ends;")
    print(f"with it, {ckpt['entries']} entries holding {C.format_bytes(ckpt['saved_after_forward'])}. "
          "Each block is one entry:")
    print(f"  {ckpt['first_ckpt']}")
    print(f"  (it saves the block's input x: B·T·d·4 = {B * T * d * 4:,} bytes; the block's ops ran, computed "
          "their outputs,\n  and saved nothing: `checkpoint` ran them in \"discard\" mode)")

    C.heading("2. Backward: each checkpoint entry replays its block")
    recomputed = [e for e in lc.events if e.action == "recomputed"]
    replay_ops = [op for op in lc.ops if op["phase"] == "recompute"]
    print(f"the ledger saw {len(replay_ops)} ops in phase \"recompute\" ({len(replay_ops) // L} per block) and "
          f"{len(recomputed)} \"recomputed\" saves\n({C.format_bytes(sum(e.nbytes for e in recomputed))} in all: "
          "what the block's ops saved again, one block at a time, just before its backward).")
    distinct = {e.buffer: e.nbytes for e in recomputed}
    plain_blocks = sum(v for k, v in lp.saved_breakdown(by="layer").items() if k.startswith("transformer.h."))
    print(f"That sum counts a buffer once per save: one array kept by two ops (a layer norm's output, which the "
          f"linear after it\nkeeps too) counts twice. The {len(distinct)} distinct buffers hold "
          f"{C.format_bytes(sum(distinct.values()))}, {C.format_bytes(sum(distinct.values()) // L)} a block "
          "(the plain forward's blocks saved "
          f"{C.format_bytes(plain_blocks)}),\nand only one block's are alive at a time.")

    C.heading("3. Identical gradients")
    names = list(plain["grads"])
    equal = [np.array_equal(plain["grads"][k], ckpt["grads"][k]) for k in names]
    identical = all(equal)
    print(f"np.array_equal on all {len(names)} parameter gradients: {sum(equal)}/{len(names)} equal "
          f"-> {'IDENTICAL, bit for bit' if identical else 'DIFFERENT'}")
    print(f"loss: {plain['loss']!r} without, {ckpt['loss']!r} with checkpointing")
    print("The replay runs the same ops on the same input, with the RNG state the forward started from\n"
          "(preserve_rng_state=True), so every dropout mask, and so every floating-point operation, repeats.")

    C.heading("4. Memory: the activation peak drops")
    rows = []
    for label, led in (("no checkpointing", lp), ("checkpoint every block", lc)):
        tl = led.timeline()
        i = int(np.argmax(tl["total"]))
        rows.append((label, C.format_bytes(led.peak_bytes("activation")), C.format_bytes(led.peak_bytes()),
                     str(tl["phase"][i]), *(C.format_bytes(int(tl[c][i])) for c in ("parameter", "gradient",
                                                                                      "activation", "other"))))
    print(C.table(rows, ["run", "activation peak", "total peak", "total peak in", "params", "grads",
                         "activations", "other"]))
    act_ratio = lc.peak_bytes("activation") / lp.peak_bytes("activation")
    print(f"(the last four columns: what is live at the total peak.) Activation peak with checkpointing: "
          f"{act_ratio:.1%} of the plain one.")
    print(f"Without checkpointing, activations peak at the end of the forward: all {L} blocks' saves at once (the\n"
          "total peaks just after, when the first gradients join them). With checkpointing the peak is inside a\n"
          f"replay: the {L} block inputs plus one block's saves, while the parameter gradients are already live.")

    C.heading("5. Compute: one extra forward of the blocks")
    fwd_blocks = block_forward_flops(lc)
    recompute = lc.flops("recompute")
    recompute_ratio = recompute / fwd_blocks
    train_plain = lp.flops("forward") + lp.flops("backward")
    train_ckpt = lc.flops("forward") + lc.flops("backward") + recompute
    print(f"forward FLOPs of the blocks: {fwd_blocks:,}   led.flops('recompute'): {recompute:,}   "
          f"ratio {recompute_ratio:.4f}")
    print(f"forward + backward (+ recompute): {train_plain:,} -> {train_ckpt:,} FLOPs "
          f"(×{train_ckpt / train_plain:.3f}; backward is about 2× forward, so one extra forward is about +33%)")
    stopped_before = sorted({f["name"].removeprefix(f["layer"] + ".") for f, r in C.replayed_ops(lc, "transformer.h")
                             if f["flops"] and not r["flops"]})
    print(f"The {fwd_blocks - recompute:,} FLOPs not replayed are each block's {', '.join(stopped_before)}: the "
          "replay stops early, as PyTorch's does,\nonce backward has every array it needs (such an op saves at "
          "most its inputs, and no op the replay runs reads its output).")
    if cfg["dropout"] > 0:
        print(f"With dropout {cfg['dropout']} after each block's last linear (c_proj), that linear is replayed too: "
              "the dropout saves a mask,\nso it runs again, and it reads c_proj's output. Without dropout the replay "
              "stops before c_proj as well,\nwhich is why every-layer checkpointing recomputes 69-75% of a forward on "
              "the README's GPTs (dropout 0).")

    C.heading("6. Without the RNG state, the replay draws different dropout masks")
    bad = build(cfg, ckpt_kwargs={"preserve_rng_state": False})
    tg.manual_seed(DROPOUT_SEED)
    _, loss = bad(*batch)
    error = None
    try:
        loss.backward()
    except tg.CheckpointError as exc:
        error = str(exc)
    del bad, loss
    C.fresh()
    op_in_error = re.search(r"at op '([^']+)'", error).group(1) if error else None
    print("checkpoint(block, x, preserve_rng_state=False), determinism_check='values' (the default):")
    print(f"  CheckpointError: {error}" if error else "  no error raised (unexpected)")
    print(f"The first replay (the last block, {op_in_error}) already differs: its forward observed a checksum of "
          "every saved array,\nand the replayed dropout mask sums to a different number.")

    silent = measure(cfg, batch, ckpt_kwargs={"preserve_rng_state": False, "determinism_check": "none"})
    diffs = {k: float(np.abs(silent["grads"][k] - plain["grads"][k]).max()) for k in names}
    max_diff = max(diffs.values())
    worst = max(diffs, key=diffs.get)
    scale = float(np.abs(plain["grads"][worst]).max())
    n_diff = sum(not np.array_equal(silent["grads"][k], plain["grads"][k]) for k in names)
    print("\nWith determinism_check='none' nothing complains, and the gradient is simply wrong:")
    print(f"  {n_diff}/{len(names)} parameter gradients differ; max |difference| = {max_diff:.4g} in {worst} "
          f"(whose largest gradient entry is {scale:.4g})")
    print(f"  the loss is the same ({silent['loss']!r}): only the backward used other masks than the forward.")

    timeline_path = C.fig_path(out, f"{SLUG}_timeline.png")
    flops_path = C.fig_path(out, f"{SLUG}_flops.png")
    plots.plot_timelines_side_by_side(
        [lp, lc], ["no checkpointing", "tg.checkpoint around every block"], timeline_path, x="step",
        suptitle=f"One forward + backward of a {L}-layer GPT (B={B}, T={T}, d={d}), shared y-axis",
    )
    flops_figure([("no checkpointing", lp), ("checkpoint every block", lc)], flops_path)
    explorer = lp.to_html(C.fig_path(out, f"{SLUG}_explorer.html"), compare=lc,
                          labels=("no checkpointing", "tg.checkpoint around every block"))
    print(f"wrote {explorer} (open it in a browser: hover, click a layer, search, zoom)")
    elapsed = time.perf_counter() - t0
    print(f"\nwrote {timeline_path}\nwrote {flops_path}  ({elapsed:.1f} s)")

    return dict(
        config=cfg,
        identical_gradients=identical,
        n_gradients=len(names),
        loss_plain=plain["loss"],
        loss_checkpointed=ckpt["loss"],
        tape_entries=(plain["entries"], ckpt["entries"]),
        saved_after_forward=(plain["saved_after_forward"], ckpt["saved_after_forward"]),
        activation_peak_plain=lp.peak_bytes("activation"),
        activation_peak_checkpointed=lc.peak_bytes("activation"),
        total_peak_plain=lp.peak_bytes(),
        total_peak_checkpointed=lc.peak_bytes(),
        peaks_by_category={"plain": {c: lp.peak_bytes(c) for c in CATEGORIES},
                           "checkpointed": {c: lc.peak_bytes(c) for c in CATEGORIES}},
        block_forward_flops=fwd_blocks,
        recompute_flops=recompute,
        recompute_ratio=recompute_ratio,
        stopped_before=stopped_before,
        recompute_ops=len(replay_ops),
        recomputed_events=len(recomputed),
        rng_error=error,
        rng_error_op=op_in_error,
        silent_max_abs_diff=max_diff,
        silent_worst_param=worst,
        silent_n_different=n_diff,
        figures=[timeline_path, flops_path],
        explorer=explorer,
        seconds=elapsed,
    )


def headline(r: dict) -> list[str]:
    """The few numbers `tinygrad-ckpt figures` prints for this lesson."""
    return [f"activation peak {C.format_bytes(r['activation_peak_plain'])} -> "
            f"{C.format_bytes(r['activation_peak_checkpointed'])} with every block checkpointed, for "
            f"{r['recompute_ratio']:.2f} extra forward of the blocks",
            f"all {r['n_gradients']} gradients bitwise equal: {r['identical_gradients']}; without the RNG state the "
            f"replay check names {r['rng_error_op']}"]


if __name__ == "__main__":
    C.cli(main, __doc__)
