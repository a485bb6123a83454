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

This module parses the arguments and dispatches; what the commands measure and print is report.py's.
"""

from __future__ import annotations

import argparse
import re
import sys

from . import backend
from . import estimate as est
from .parallel import Parallelism
from .report import explore, measure, parallel_report, report
from .units import parse_bytes

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
    try:
        backend.current()  # the one TINYGRAD_CKPT_BACKEND names: a missing CuPy is one line here
    except (ImportError, ValueError) as exc:
        print(f"tinygrad-ckpt: error: {exc}", file=sys.stderr)
        return 2
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
