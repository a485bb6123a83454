"""Helpers shared by the lessons: the command line, a seeded token batch, one measured training step,
and small printing aids. Lessons import it as `import _common` (their own folder is on sys.path when
run as scripts; tinygrad_ckpt.app.figures puts it there when it loads them)."""

from __future__ import annotations

import argparse
import gc
import os

import tinygrad_ckpt as tg  # before NumPy, so that OpenBLAS loads with the engine's settings (backend/threads.py)

__all__ = ["cli", "claim", "output_folder", "fresh", "token_batch", "make_gpt", "measured_step",
           "heading", "table", "fig_path", "format_bytes"]

import numpy as np  # noqa: E402

from tinygrad_ckpt import nn, optim  # noqa: E402
from tinygrad_ckpt.app.figures import output_folder  # noqa: E402
from tinygrad_ckpt.memory.events import within  # noqa: E402
from tinygrad_ckpt.units import format_bytes  # noqa: E402


def cli(main, doc: str | None = None) -> None:
    """`python lessons/NN_slug.py [--quick] [--out DIR]` -> main(quick=..., out=...)."""
    first_line = (doc or "").strip().splitlines()[0] if doc else None
    parser = argparse.ArgumentParser(description=first_line)
    parser.add_argument("--quick", action="store_true", help="small sizes: runs in seconds")
    parser.add_argument("--out", default=None, help="folder for the figures (default: figures/; with --quick a "
                                                    "scratch folder, never figures/)")
    args = parser.parse_args()
    main(quick=args.quick, out=output_folder(args.out, args.quick))


def claim(doc: str) -> None:
    """Print the "Claim" paragraph of a lesson's docstring: what of the chapter it measures, in its own words.
    (In a notebook the docstring is the first cell, already shown, and `__doc__` is None: nothing to print.)"""
    for paragraph in (doc or "").split("\n\n"):
        if paragraph.startswith("Claim"):
            print(paragraph + "\n")
            return


def fresh() -> None:
    """Drop graphs left over from earlier measurements, so the next ledger starts clean.

    (A Ledger counts whatever the engine holds when it starts; what the measured step never uses is
    "untouched", left out of its peak but drawn as a grey band. So lessons drop their results and
    collect before measuring.)
    """
    gc.collect()


def token_batch(vocab: int, batch: int, seq_len: int, seed: int = 0):
    """(idx, targets): int64 arrays [batch, seq_len] of random token ids, from a seeded generator."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, vocab, (batch, seq_len))
    return idx, rng.integers(0, vocab, (batch, seq_len))


def make_gpt(vocab: int, block_size: int, n_layer: int, n_head: int, d_model: int, seed: int = 0, **kw):
    """A freshly initialised nn.GPT, seeded (same seed, same weights)."""
    tg.manual_seed(seed)
    return nn.GPT(vocab, block_size, n_layer, n_head, d_model, **kw)


def measured_step(model, idx, targets, warmup: bool = True, lr: float = 1e-3):
    """Run one full AdamW training step (forward, backward, optimizer step, zero_grad) under a Ledger.

    With warmup, one step runs first without the ledger, so AdamW's moments exist (they are
    allocated lazily on the first step) and the measured step is the steady state of training.
    Returns (ledger, loss value).
    """
    opt = optim.AdamW(model.parameters(), lr=lr)
    if warmup:
        logits, loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        del logits, loss  # nothing of the warm-up graph may be alive when the ledger starts
    with tg.Ledger() as led:
        logits, loss = model(idx, targets)
        loss.backward()
        opt.step()  # step and zero_grad are the ledger's phase "optimizer" by themselves
        opt.zero_grad()
    value = loss.item()
    del logits, loss
    return led, value


def heading(text: str) -> None:
    print()
    print(text)
    print("-" * len(text))


def table(rows, headers, aligns=None) -> str:
    """A plain fixed-width text table (first column left-aligned, the rest right-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    aligns = aligns or ["<"] + [">"] * (len(headers) - 1)
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(f"{c:{a}{w}}" for c, a, w in zip(r, aligns, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def replayed_ops(led, module: str) -> list[tuple[dict, dict]]:
    """(forward op, the same op in its replay) for every op run in `module` or below ("transformer.h": every block),
    from the ledger of a run whose blocks are each replayed once (the checkpoint entries aside). Blocks replay in
    backward's order, each one's ops in its forward's order, so the k-th op of a name pairs with the k-th replayed
    op of that name. An op the replay served instead of running (kept by a policy, or past the early stop) shows 0
    FLOPs."""
    def of(phase):
        return [op for op in led.ops if op["phase"] == phase and within(op["scope"], module)
                and op["op"] != "checkpoint"]

    forward, replays = of("forward"), {}
    for op in of("recompute"):
        replays.setdefault(op["name"], []).append(op)
    assert sorted(op["name"] for op in forward) == sorted(op["name"] for ops in replays.values() for op in ops), \
        "the replay ran other ops"
    return [(op, replays[op["name"]].pop(0)) for op in forward]


def fig_path(out: str, name: str) -> str:
    """{out}/{name}, with the folder created."""
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, name)


def without_torch(exc: ImportError) -> dict:
    """What a lesson that needs PyTorch prints and returns where it is missing (and how to install its CPU build)."""
    reason = (f"PyTorch is not installed ({exc}): the optional extra [torch]; on a machine without an NVIDIA GPU take "
              "its CPU build first: pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu, "
              "then pip install -e \".[torch]\"")
    print(f"skipped: {reason}")
    return {"skipped": reason, "figures": []}


def engine_step(model, idx):
    """The ledger of one forward + backward of an engine model on idx (targets = idx); its weights unchanged, its
    gradients zeroed after."""
    fresh()
    with tg.Ledger() as led:
        _, loss = model(idx, idx)
        loss.backward()
    model.zero_grad()
    return led
