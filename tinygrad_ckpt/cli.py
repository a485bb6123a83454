"""The `tinygrad-ckpt` command.

    tinygrad-ckpt estimate                      # the seed's 7B GPT: 32 layers, d 4096, T 2048, B 4, fp16
    tinygrad-ckpt estimate --checkpoint sqrt --capacity 80GiB
    tinygrad-ckpt estimate --tensor-parallel 8 --sequence-parallel --checkpoint selective
    tinygrad-ckpt estimate --tensor-parallel 4 --pipeline-parallel 4 --microbatches 8 --zero 1 --data-parallel 2
    tinygrad-ckpt figures --quick [--only 03] [--out figures/]
    tinygrad-ckpt explore --layers 12 --d-model 768 --heads 12 --seq 1024 --out gpt2.html   # a page to open

`estimate` builds the GPT on the meta backend (shapes only, no data), runs a first training step
(which creates the optimizer states, float32 for AdamW as the seed assumes), then measures a second,
steady-state step (forward, backward, optimizer step) under a ledger, and prints what the ledger measured next to the
analytic formulas of tinygrad_ckpt/estimate.py: the seed's 12·B·T·d per layer, Korthikanti et al.'s
sbh(34 + 5as/h), and the engine's own per-layer count. It takes seconds and a few tens of MB for a
7B model, because no array has data.

The meta run goes through every block, about 4.5 ms and 0.1 MB each whatever the sizes, so a command runs at
most MAX_BLOCK_RUNS (8192) of them, about a minute: `estimate` takes up to 4096 layers (two steps of each block),
fewer with pipeline microbatches or several `explore` plans. A bad argument, or a run past that limit, is answered
with one line and exit status 2; a missing repository (a wheel install has no lessons/) with one line and status 1.

With --tensor-parallel, --sequence-parallel, --pipeline-parallel/--microbatches or --zero/--data-parallel it
runs one device's shard instead (tinygrad_ckpt/parallel.py, measure.ParallelStep) and sets one layer's saves
beside Korthikanti et al.'s Table 2, term by term.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from dataclasses import dataclass

from . import estimate as est
from .measure import ParallelStep, SteadyStep, saved_after_forward
from .parallel import Parallelism
from .units import format_bytes, parse_bytes

_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "float32": "float32", "fp32": "float32",
           "float": "float32", "single": "float32", "float64": "float64", "fp64": "float64", "double": "float64"}


def parse_size(text: str) -> int:
    """Bytes from '80GB' (10^9), '80GiB' (2^30), '512 MiB' (units.parse_bytes); a bare number is refused here,
    since '--capacity 80' is far more likely to mean 80 GB than 80 bytes."""
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if re.fullmatch(r"\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*", str(text)):  # a number without a unit
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write e.g. {text}GB (10^9 bytes) or {text}GiB (2^30)")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


class _Parser(argparse.ArgumentParser):
    """One line and exit status 2 for a bad argument (argparse would print the whole usage first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _dtype(text: str) -> str:
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"unsupported dtype {text!r}: choose float16, float32 or float64 (NumPy has no bfloat16)"
        ) from None


def _checkpoint(text: str):
    if text in ("none", "every_layer", "sqrt", "selective"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise argparse.ArgumentTypeError(
        f"unknown checkpoint {text!r}: choose none, every_layer, sqrt, selective or a number of segments"
    )


# ---- one measured training step ------------------------------------------------------------------
@dataclass
class Measurement:
    """What one meta training step measured: the ledger, the wall time and the parameter count."""

    shape: est.GPTShape
    optimizer: str
    checkpoint: object
    ledger: object
    seconds: float
    n_params: int

    @property
    def per_layer_saved(self) -> int:
        """Bytes saved for backward per block (mean over the blocks transformer.h.0 .. ; recomputed saves included)."""
        by_layer = self.ledger.saved_breakdown(by="layer")
        by_block = [by_layer[k] for k in (f"transformer.h.{i}" for i in range(self.shape.n_layer)) if k in by_layer]
        return round(statistics.mean(by_block)) if by_block else 0


def measure(shape: est.GPTShape, optimizer: str = "adamw", checkpoint="none") -> Measurement:
    """One steady-state training step of shape's GPT on the meta backend, under a Ledger (measure.SteadyStep)."""
    step = SteadyStep(shape, optimizer)
    led, seconds = step.measure(checkpoint)
    return Measurement(shape, optimizer, checkpoint, led, seconds, step.model.num_parameters())


# ---- the report ----------------------------------------------------------------------------------
def _b(n: float) -> str:
    return f"{format_bytes(n)} ({format_bytes(n, decimal=True)})"


def _row(label: str, measured: str = "", formula: str = "", note: str = "") -> str:
    return f"  {label:<34}{measured:<24}{formula:<24}{note}".rstrip()


def _activation_formula(m: Measurement) -> tuple[int, str]:
    """The activation peak the formulas predict for this checkpoint choice, and where it comes from."""
    s = m.shape
    L, engine_layer, layer_input = s.n_layer, est.engine_activation_bytes_per_layer(s), (
        s.batch * s.seq_len * s.d_model * s.value_bytes)
    if m.checkpoint == "none":
        return L * engine_layer, "layers × engine per-layer count"
    if m.checkpoint == "every_layer":
        return L * layer_input + engine_layer, "layers × block input + one block replayed"
    if m.checkpoint == "selective":
        terms = est.engine_activation_terms(s)
        core = sum(v for k, v in terms.items() if k == "attn.softmax_out" or "attn_dropout" in k)
        return L * (engine_layer - core), "layers × engine count without its [B,H,T,T] terms"
    segments = est.chen_optimal_segments(L, 1, 1) if m.checkpoint == "sqrt" else m.checkpoint
    return (est.chen_sqrt_peak(L, layer_input, engine_layer, segments),
            f"Chen 2016: {segments} segment inputs + {-(-L // segments)} blocks replayed")


def report(m: Measurement, capacity: int | None) -> str:
    """The measured breakdown beside the formulas, as printed by `tinygrad-ckpt estimate`."""
    s, led, P = m.shape, m.ledger, m.n_params
    B, T, d, H, L, v = s.batch, s.seq_len, s.d_model, s.n_head, s.n_layer, s.value_bytes
    engine_layer = est.engine_activation_bytes_per_layer(s)
    seed_layer = est.seed_activation_bytes_per_layer(B, T, d, v)
    k22_layer = est.korthikanti_bytes_per_layer(T, B, d, H, bytes_per_value=v)
    act_formula, act_source = _activation_formula(m)
    recompute = {"none": "none", "selective": "selective"}.get(m.checkpoint, "full")
    fwd = est.gpt_forward_flops(s)
    opt_note = {
        "adamw": "m and v kept in float32 (the seed: Adam states at 32-bit precision)",
        "sgd": "plain SGD keeps no state", "none": "no optimizer step",
    }[m.optimizer]
    lines = [
        f"GPT: {L} layers, d_model {d}, {H} heads, seq {T}, batch {B}, vocab {s.vocab_size}, {s.dtype}, "
        f"dropout {s.dropout}; optimizer {m.optimizer}; checkpoint {m.checkpoint}",
        f"one steady-state training step (forward, backward, optimizer step; optimizer states already exist) "
        f"measured on the meta backend (shapes only, "
        f"no data) in {m.seconds:.2f} s; {len(led.events)} ledger events",
        f"parameters: {P:,} ({P / 1e9:.2f} B; formula {est.gpt_parameter_count(s):,})",
        "",
        "memory (peak of each category)      measured by the ledger  formula",
        _row("parameters", _b(led.peak_bytes("parameter")), _b(P * v), f"params × {v} B"),
        _row("gradients", _b(led.peak_bytes("gradient")), _b(P * v),
             "formula: parameter gradients; measured: also those in flight"),
        _row("optimizer states", _b(led.peak_bytes("optimizer")),
             _b({"adamw": 2 * P * 4}.get(m.optimizer, 0)), opt_note),
        _row("activations (saved for backward)", _b(led.peak_bytes("activation")), _b(act_formula), act_source),
        _row("other (live outputs and inputs)", _b(led.peak_bytes("other"))),
        _row("total peak", _b(led.peak_bytes())),
        "",
        "activations saved per block          bytes                   × layers",
        _row("measured (ledger, mean over blocks)", f"{m.per_layer_saved:,}", format_bytes(L * m.per_layer_saved),
             {"none": "", "selective": "kept in forward + saved by the replays"}.get(
                 m.checkpoint, "saved by the replays, in backward")),
        _row("engine (engine_activation_terms)", f"{engine_layer:,}", format_bytes(L * engine_layer)),
        _row("seed: 12·B·T·d·bytes", f"{seed_layer:,}", format_bytes(L * seed_layer)),
        _row("Korthikanti 2022: sbh(34+5as/h)", f"{k22_layer:,}", format_bytes(L * k22_layer),
             f"at {v} B per value, 1 B per dropout-mask element"),
        _row("Korthikanti selective / full", f"{est.korthikanti_selective_bytes(T, B, d, v):,}",
             format_bytes(L * est.korthikanti_selective_bytes(T, B, d, v)),
             f"full recompute: {format_bytes(L * est.korthikanti_full_recompute_bytes(T, B, d, v))}"),
        "",
        "FLOPs                               measured (every op)     formula (matmuls only)",
        _row("forward", f"{led.flops('forward'):.4e}", f"{fwd:.4e}"),
        _row("backward", f"{led.flops('backward'):.4e}", f"{2 * fwd:.4e}"),
        _row("recompute", f"{led.flops('recompute'):.4e}", f"{est.gpt_training_flops(s, recompute) - 3 * fwd:.4e}",
             "formula: a whole forward [C16]; a replay stops before its last linear and add" if recompute == "full"
             else ""),
        _row("total", f"{led.flops():.4e}", f"{est.gpt_training_flops(s, recompute):.4e}"),
    ]
    drift = sorted({e.dtype for e in led.events if e.action == "saved" and e.dtype.startswith("float")
                    and e.dtype != s.dtype})
    if drift:
        lines += ["", f"note: some saved activations are {', '.join(drift)} although the model is {s.dtype}"]
    if capacity is not None:
        peak = led.peak_bytes()
        verdict = (f"fits, {format_bytes(capacity - peak)} to spare" if peak <= capacity
                   else f"does NOT fit: {format_bytes(peak - capacity)} over")
        lines += ["", f"capacity {_b(capacity)}: total peak {_b(peak)} {verdict}"]
    return "\n".join(lines)


# ---- one device of many -------------------------------------------------------------------------------
def parallel_report(shape: est.GPTShape, par: Parallelism, optimizer: str, checkpoint, capacity: int | None) -> str:
    """One device's share measured on the meta backend, beside Korthikanti et al. 2022, Table 2."""
    step = ParallelStep(shape, par, optimizer)
    led, seconds = step.measure(checkpoint)
    s, b, h, a = shape.seq_len, shape.batch // par.microbatches, shape.d_model, shape.n_head
    t, L, p = par.tensor, shape.n_layer, par.pipeline
    view = step.zero_view(led)
    lines = [
        f"GPT: {L} layers, d_model {h}, {a} heads, seq {s}, batch {shape.batch}, vocab {shape.vocab_size}, "
        f"{shape.dtype}, dropout {shape.dropout}; optimizer {optimizer}; checkpoint {checkpoint}",
        f"{par.describe()}: device 0 ({'the first of ' + str(p) + ' pipeline stages, ' if p > 1 else ''}"
        f"{L // p} layers, {a // t} of {a} heads, microbatch {b}) measured on the meta backend in {seconds:.2f} s",
        "",
        "per device (peak of each category)  measured" + ("" if not par.zero else f"            with ZeRO-{par.zero} "
                                                          f"over {par.data} (÷{par.data} from the measurement)"),
    ]
    for label, cat in (("parameters", "parameter"), ("gradients", "gradient"), ("optimizer states", "optimizer"),
                       ("activations (saved for backward)", "activation"), ("other (live outputs, inputs)", "other")):
        lines.append(_row(label, _b(led.peak_bytes(cat)), _b(view[cat]) if par.zero else ""))
    lines.append(_row("total peak", _b(led.peak_bytes()), _b(view["peak"]) if par.zero else ""))
    if checkpoint == "every_layer":
        block0 = saved_after_forward(led, "transformer.h.0")
        kept = sum(e.nbytes for e in block0.values()) // min(p, par.microbatches)
        full = est.korthikanti_full_recompute_bytes(s, b, h, shape.value_bytes) // (t if par.sequence else 1)
        lines += ["", "activations of one layer under full recompute (held when backward starts):",
                  _row("measured (ledger, block 0)", f"{kept:,}"),
                  _row("K22 Table 2: 2sbh" + ("/t (split)" if par.sequence else ""), f"{full:,}",
                       "", "the block input" + ("; sequence parallelism splits it by t" if par.sequence else "")),
                  _row("  unexplained", f"{kept - full:+,}", "", "(agrees exactly)" if kept == full else "")]
    else:
        lines += ["", *korthikanti_comparison(led, shape, par, checkpoint == "selective")]
    if p > 1:
        n = min(p, par.microbatches)
        per_layer = sum(e.nbytes for e in saved_after_forward(led, "transformer.h.0").values()) // n
        blocks = sum(e.nbytes for e in saved_after_forward(led, "transformer.h").values())
        lines += ["", f"pipeline (1F1B): the first stage holds {n} microbatches in flight when its first backward "
                      f"starts: its blocks keep {format_bytes(blocks)} = {n} × {L // p} layers × "
                      f"{format_bytes(blocks / (n * (L // p)))} (one layer, one microbatch: "
                      f"{format_bytes(per_layer)}); Korthikanti: p microbatches × L/p layers = the activations of "
                      f"all {L} layers, {format_bytes(L * per_layer)}"]
    if capacity is not None:
        peak = view["peak"] if par.zero else led.peak_bytes()
        verdict = (f"fits, {format_bytes(capacity - peak)} to spare" if peak <= capacity
                   else f"does NOT fit: {format_bytes(peak - capacity)} over")
        lines += ["", f"capacity {_b(capacity)}: per-device peak {_b(peak)} {verdict}"]
    return "\n".join(lines)


@dataclass
class LayerComparison:
    """One layer's saves (one microbatch, held when backward starts) beside [K22] Table 2: the formula, the
    difference and its terms (label, bytes, why), each measured from the ledger; `unexplained` is what is left."""

    measured: int
    formula: int
    formula_text: str
    explained: list
    unexplained: int


def compare_layer(led, shape: est.GPTShape, par: Parallelism, selective: bool) -> LayerComparison:
    """Block h.0's saves beside [K22] Table 2, the difference term by term: measured, not assumed, so it follows
    any change in what the engine saves."""
    s, b, h, a, v = shape.seq_len, shape.batch // par.microbatches, shape.d_model, shape.n_head, shape.value_bytes
    t, sp = par.tensor, par.sequence
    in_flight = min(par.pipeline, par.microbatches)
    saves = saved_after_forward(led, "transformer.h.0")
    measured = sum(e.nbytes for e in saves.values()) // in_flight
    terms = est.korthikanti_parallel_terms(s, b, h, a, t, sp, selective, bytes_per_value=v)
    text = ("34·sbh/t" if sp else "sbh(10+24/t)") if selective else \
        ("(sbh/t)(34+5as/h)" if sp else "sbh(10+24/t+5as/(ht))")

    def measured_by(op: str) -> int:
        """Bytes the ops of this kind keep for their own backward (a layer norm's rstd; not the outputs a selective
        policy kept, which stand for the next op's input)."""
        return sum(e.nbytes for e in saves.values() if e.op == op and not (e.kept and e.role == "output")) // in_flight

    masks = sum(n for k, n in terms.items() if k.endswith("dropout_mask"))
    explained = [("layer norms", measured_by("layer_norm") - terms["layernorms"],
                  "the ledger's layer-norm saves minus the paper's inputs (this engine: 1/std; the output it keeps is "
                  "the next linear's input, a term of the paper's)"),
                 ("causal mask [T, T]", measured_by("masked_fill"), "the paper's attention keeps no mask"),
                 ("dropout masks", measured_by("dropout") - masks,
                  "the ledger's masks (1 bit an element) minus the paper's (1 B)")]
    if shape.dropout == 0:
        explained.append(("no attention dropout output", -terms.get("attn.softmax_dropout_output", 0),
                          "dropout is 0: A·V reads the softmax output itself"))
    if selective and not sp:
        kept_input = sum(e.nbytes for e in saves.values() if e.op == "checkpoint" and e.role == "input0") // in_flight
        explained.append(("block input vs c_proj input", kept_input - terms["attn.proj_input"],
                          "the checkpoint keeps the block input whole; the replay rebuilds c_proj's input (÷t)"))
    k22 = sum(terms.values())
    return LayerComparison(measured, k22, text, explained, measured - k22 - sum(n for _, n, _ in explained))


def korthikanti_comparison(led, shape: est.GPTShape, par: Parallelism, selective: bool) -> list[str]:
    c = compare_layer(led, shape, par, selective)
    lines = [f"activations of one layer, one microbatch (held when backward starts), {shape.value_bytes} B values, "
             "1 B masks:",
             _row("measured (ledger, block 0)", f"{c.measured:,}"),
             _row(f"K22 Table 2: {c.formula_text}", f"{c.formula:,}"),
             _row("difference", f"{c.measured - c.formula:+,}")]
    lines += [_row("  " + label, f"{n:+,}", "", why) for label, n, why in c.explained if n]
    lines.append(_row("  unexplained", f"{c.unexplained:+,}", "", "(agrees exactly)" if c.unexplained == 0 else ""))
    return lines


# ---- the command line ----------------------------------------------------------------------------
def _gpt_arguments(p: argparse.ArgumentParser) -> None:
    """The GPT and training set-up flags `estimate` and `explore` share (defaults: the seed's 7B example)."""
    p.add_argument("--layers", type=_positive, default=32,
                   help="number of transformer blocks (default 32; a command runs at most 8192 blocks on the meta "
                        "backend, about a minute: 4096 layers for estimate)")
    p.add_argument("--d-model", type=_positive, default=4096, help="model width (default 4096)")
    p.add_argument("--heads", type=_positive, default=32, help="attention heads, dividing d-model (default 32)")
    p.add_argument("--seq", type=_positive, default=2048, help="sequence length T (default 2048)")
    p.add_argument("--batch", type=_positive, default=4, help="batch size B (default 4)")
    p.add_argument("--vocab", type=_positive, default=32000, help="vocabulary size (default 32000)")
    p.add_argument("--dtype", type=_dtype, default="float16", help="float16 | float32 | float64 (default float16)")
    p.add_argument("--optimizer", choices=("adamw", "sgd", "none"), default="adamw",
                   help="adamw (two states per parameter), sgd (none) or none (no step)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (default 0.0)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tinygrad-ckpt",
        description="Where training memory goes, and how activation checkpointing buys it back.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{figures,estimate,explore,notebooks,api-docs}")
    fig = sub.add_parser("figures", help="draw the lessons' figures (figures/NN_<slug>.png)",
                         description="Run the lessons and write their figures.")
    fig.add_argument("--quick", action="store_true", help="small sizes, for a fast smoke run")
    fig.add_argument("--only", metavar="NN", nargs="+", help="only these lessons (e.g. 03, or 02 08)")
    fig.add_argument("--out", metavar="DIR", help="directory to write the figures to (default: figures/; with "
                                                  "--quick a scratch folder, never figures/)")
    e = sub.add_parser(
        "estimate", help="measure one training step of a GPT of any size on the meta backend",
        description="Build a GPT on the shape-only meta backend, run forward, backward and an optimizer step "
                    "under a ledger, and print the measured memory and FLOPs beside the analytic formulas. "
                    "Defaults: the seed's 7B example.",
    )
    _gpt_arguments(e)
    e.add_argument("--checkpoint", type=_checkpoint, default="none",
                   help="none | every_layer | sqrt | selective (Korthikanti) | a number of segments")
    e.add_argument("--capacity", type=lambda t: None if t.lower() == "none" else parse_size(t), default="80GB",
                   help="device memory to compare the peak with, with its unit: 80GB, 80GiB, 74.5GiB or none "
                        "(default 80GB)")
    e.add_argument("--tensor-parallel", type=_positive, default=1, metavar="T",
                   help="Megatron tensor parallelism over T devices (heads and the 4d hidden split by T)")
    e.add_argument("--sequence-parallel", action="store_true",
                   help="split layer norms, dropouts and residuals along the sequence over the T devices")
    e.add_argument("--pipeline-parallel", type=_positive, default=1, metavar="P",
                   help="P pipeline stages of layers/P (1F1B); device 0 is the first stage")
    e.add_argument("--microbatches", type=_positive, default=None, metavar="M",
                   help="microbatches per batch, with --pipeline-parallel (default P)")
    e.add_argument("--zero", type=int, choices=(1, 2, 3), default=0,
                   help="ZeRO stage over --data-parallel replicas: 1 optimizer states, 2 + gradients, 3 + parameters")
    e.add_argument("--data-parallel", type=_positive, default=1, metavar="D", help="data-parallel replicas")
    x = sub.add_parser(
        "explore", help="write the memory explorer page (HTML) of a GPT training step under checkpoint plans",
        description="Measure one steady-state training step of a GPT on the meta backend under each --checkpoint "
                    "plan (as `estimate` does) and write one self-contained HTML page with their memory timelines "
                    "and lifetimes side by side: open it in a browser. For your own model, record a step under "
                    "`with tg.Ledger() as led:` and call led.to_html(path). Defaults: the seed's 7B example, "
                    "without and with checkpointing every layer.",
    )
    _gpt_arguments(x)
    x.add_argument("--checkpoint", type=_checkpoint, nargs="+", default=["none", "every_layer"], metavar="PLAN",
                   help="one panel per plan: none | every_layer | sqrt | selective | a number of segments "
                        "(default: none every_layer)")
    x.add_argument("--out", default="explorer.html", metavar="PATH", help="the page to write (default explorer.html)")
    x.add_argument("--memory-viz", action="store_true",
                   help="also write each step as a PyTorch memory_viz snapshot, PATH_<plan>.pickle, to open at "
                        "pytorch.org/memory_viz")
    sub.add_parser("notebooks", help="write notebooks/NN_<slug>.ipynb from the lessons",
                   description="Write every lesson as a Jupyter notebook into notebooks/ (no outputs).")
    sub.add_parser("api-docs", help="write docs/api.md from the docstrings",
                   description="Write the public API reference, docs/api.md, from the docstrings.")
    return parser


def explore(shape: est.GPTShape, optimizer: str, plans, out: str, memory_viz: bool = False) -> list[str]:
    """Measure one training step per checkpoint plan on the meta backend; write the explorer page (and
    the memory_viz snapshots). Returns the files written."""
    step = SteadyStep(shape, optimizer)
    ledgers = [step.measure(plan)[0] for plan in plans]
    labels = [f"checkpoint {plan}" for plan in plans]
    written = [ledgers[0].to_html(out, compare=ledgers[1:], labels=labels,
                                  title=f"GPT {shape.n_layer} layers, d_model {shape.d_model}, seq {shape.seq_len}, "
                                        f"batch {shape.batch}, {shape.dtype}: one training step")]
    for plan, led in zip(plans, ledgers):
        print(f"checkpoint {plan}: peak {format_bytes(led.peak_bytes())}, {len(led.events)} ledger events")
        if memory_viz:
            path = f"{os.path.splitext(out)[0]}_{plan}.pickle"
            led.to_memory_viz(path)
            written.append(path)
    return written


# A meta run costs about 4.5 ms and 0.1 MB per block it runs forward and backward (measured on 2026-12-01: 2048
# layers, two steps, 19 s and 465 MB), whatever the sizes. The limit keeps a run under a minute and about 1 GB:
# 4096 layers for `estimate` (far beyond the ~130 of today's largest models); the per-block numbers it reports do
# not depend on the depth, so a deeper model is estimated from fewer layers.
MAX_BLOCK_RUNS = 8192


def _check_cost(parser, args, passes: int, layers: int, what: str) -> None:
    """Refuse, in one line, a meta run of more than MAX_BLOCK_RUNS blocks (`passes` × `layers`): it would take
    minutes to hours."""
    runs = passes * layers
    if runs > MAX_BLOCK_RUNS:
        seconds = runs * 0.0045
        took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"
        parser.error(f"--layers {args.layers}: this {args.command} would run {runs:,} blocks on the meta backend "
                     f"({what}; about {took} and {runs * 0.1 / 1000:,.1f} GB), more than the limit of "
                     f"{MAX_BLOCK_RUNS:,}. The per-block numbers do not depend on the depth: measure fewer layers "
                     "and scale")


def _checkout(command: str) -> bool:
    """Is the repository beside the package (lessons/, docs/)? A wheel install has only the package: say so in
    one line instead of failing inside, or writing next to site-packages."""
    from .figures import lessons_dir

    if lessons_dir().is_dir():
        return True
    print(f"tinygrad-ckpt {command}: error: no lessons folder at {lessons_dir()}: this command needs the repository, "
          "not only the installed package; clone it and install it with `pip install -e .`", file=sys.stderr)
    return False


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command in ("notebooks", "api-docs"):
        if not _checkout(args.command):
            return 1
        from . import apidoc, notebooks

        return (notebooks if args.command == "notebooks" else apidoc).main()
    if args.command == "figures":
        try:
            from . import figures
        except ImportError as exc:
            print(f"tinygrad-ckpt figures: the figures module is not available ({exc})", file=sys.stderr)
            return 1
        try:
            result = figures.run(quick=args.quick, only=args.only, out=args.out)
        except ValueError as exc:  # an unknown lesson number, an --out that cannot be made
            parser.error(str(exc))
        except figures.LessonsNotFound as exc:  # a wheel install: the lessons live in the repository
            print(f"tinygrad-ckpt figures: error: {exc}", file=sys.stderr)
            return 1
        return result if isinstance(result, int) else 0
    try:
        shape = est.GPTShape(n_layer=args.layers, d_model=args.d_model, n_head=args.heads, seq_len=args.seq,
                             batch=args.batch, vocab_size=args.vocab, dtype=args.dtype, dropout=args.dropout)
    except ValueError as exc:
        parser.error(str(exc))
    plans = args.checkpoint if isinstance(args.checkpoint, list) else [args.checkpoint]
    for plan in plans:
        if isinstance(plan, int) and plan > args.layers:
            parser.error(f"--checkpoint {plan}: more segments than the {args.layers} layers; choose 1 to "
                         f"{args.layers} (or every_layer, sqrt)")
    if args.command == "explore":
        _check_cost(parser, args, 1 + len(plans), args.layers, f"a first step, then one per plan: {1 + len(plans)} "
                    f"× {args.layers} layers")
        try:
            written = explore(shape, args.optimizer, args.checkpoint, args.out, args.memory_viz)
        except OSError as exc:
            parser.error(f"cannot write {exc.filename or args.out}: {exc.strerror or exc}")
        for path in written:
            print(f"wrote {path}")
        return 0
    if args.microbatches is not None and args.pipeline_parallel == 1:
        parser.error(f"--microbatches {args.microbatches} needs --pipeline-parallel > 1 (microbatches feed pipeline "
                     "stages)")
    par = Parallelism(args.tensor_parallel, args.sequence_parallel, args.pipeline_parallel,
                      args.microbatches or args.pipeline_parallel, args.zero, args.data_parallel)
    steps = 1 if args.optimizer == "none" else 2  # a first step makes the optimizer states, then the measured one
    if par == Parallelism():
        _check_cost(parser, args, steps, args.layers, f"{steps} step(s) × {args.layers} layers")
        print(report(measure(shape, args.optimizer, args.checkpoint), args.capacity))
        return 0
    try:
        par.check(shape)
    except ValueError as exc:
        parser.error(str(exc).replace("tensor_parallel", "--tensor-parallel").replace(
            "pipeline_parallel", "--pipeline-parallel").replace("sequence_parallel", "--sequence-parallel").replace(
            "data_parallel", "--data-parallel").replace("microbatches", "--microbatches").replace("zero", "--zero"))
    _check_cost(parser, args, steps * par.microbatches, args.layers // par.pipeline,  # device 0: one stage
                f"{steps} step(s) × {par.microbatches} microbatch(es) × {args.layers // par.pipeline} layers of one "
                "stage")
    if not isinstance(args.checkpoint, str) or args.checkpoint not in ("none", "selective", "every_layer"):
        parser.error(f"--checkpoint {args.checkpoint} with parallelism: choose none, selective or every_layer")
    print(parallel_report(shape, par, args.optimizer, args.checkpoint, args.capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
