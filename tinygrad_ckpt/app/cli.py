"""The `tinygrad-ckpt` command: arguments and dispatch (what the commands measure and print is report.py's).

    tinygrad-ckpt estimate                      # the seed's 7B GPT: 32 layers, d 4096, T 2048, B 4, fp16
    tinygrad-ckpt estimate --checkpoint sqrt --capacity 80GiB
    tinygrad-ckpt estimate --tensor-parallel 8 --sequence-parallel --checkpoint selective
    tinygrad-ckpt figures --quick [--only 03] [--out figures/] [--verbose]
    tinygrad-ckpt explore --layers 12 --d-model 768 --heads 12 --seq 1024 --out gpt2.html   # a page to open

This module parses the arguments and dispatches: what `estimate` and `explore` run is scale/commands.py's (the meta
backend, the block limit), what they print scale/report.py's. A bad argument is answered with one line and exit
status 2; a missing repository (a wheel install has no lessons/) with one line and status 1. More: docs/estimate.md,
docs/house.md.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from .. import backend
from ..memory import cuda_allocator
from ..scale import commands, devices
from ..scale import estimate as est
from ..scale.measure import PRECISIONS
from ..state import SAVES
from ..units import parse_bytes

_DTYPES = {"float16": "float16", "fp16": "float16", "half": "float16", "float32": "float32", "fp32": "float32",
           "float": "float32", "single": "float32", "float64": "float64", "fp64": "float64", "double": "float64",
           "bfloat16": "bfloat16", "bf16": "bfloat16"}


def parse_size(text: str) -> int:
    """Bytes from '80GB' (10^9), '80GiB' (2^30), '512 MiB' (units.parse_bytes); a bare number is refused here,
    since '--capacity 80' is far more likely to mean 80 GB than 80 bytes, and so is a negative or endless one."""
    if str(text).strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} is negative: give a positive size such as 80GB or 80GiB")
    try:
        value = parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except OverflowError:  # '1e400GB': an infinite float
        value = math.inf
    if re.fullmatch(r"\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*", str(text)):  # a number without a unit
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write e.g. {text}GB (10^9 bytes) or {text}GiB (2^30)")
    if value >= 2**64:
        raise argparse.ArgumentTypeError(f"{text!r} overflows: a device's memory is less than 2^64 bytes (16 EiB); "
                                         "give a size such as 80GB or 80GiB")
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # "--capacity -5GB": a value with a minus sign and a digit is a value (refused by its type), not a flag
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _dtype(text: str) -> str:
    try:
        return _DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"unsupported dtype {text!r}: choose float16, bfloat16, float32 or float64 (or --precision)"
        ) from None


def _gpu(text: str):
    try:
        return devices.parse_gpu(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _alloc_conf(text: str) -> str:
    try:
        cuda_allocator.Settings.parse(text, who="")  # argparse names the flag
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


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
    """The model and run flags `estimate` and `explore` share. Unset, a shape flag takes the --model preset's value,
    else the seed's 7B example's; the report lists each value it assumed."""
    p.add_argument("--model", choices=tuple(est.PRESETS), metavar="NAME",
                   help=f"a published model: {', '.join(est.PRESETS)} (its shape; any flag given overrides it)")
    p.add_argument("--arch", choices=("gpt2", "llama"), default=None,
                   help="gpt2 (nanoGPT's blocks) or llama (RMSNorm, rotary positions, SwiGLU, grouped-query "
                        "attention, optional experts); default the preset's, else gpt2")
    p.add_argument("--layers", type=_positive, default=None,
                   help="number of transformer blocks (default 32; a command runs at most 8192 blocks on the meta "
                        "backend, about a minute: 4096 layers for estimate)")
    p.add_argument("--d-model", type=_positive, default=None, help="model width (default 4096)")
    p.add_argument("--heads", type=_positive, default=None, help="attention heads, dividing d-model (default 32)")
    p.add_argument("--kv-heads", type=_positive, default=None,
                   help="key/value heads, dividing --heads (llama; default --heads: multi-head attention; 1 is "
                        "multi-query)")
    p.add_argument("--ffn", type=_positive, default=None,
                   help="SwiGLU hidden width (llama; default Llama's rule: 8/3 d rounded up to a multiple of 256)")
    p.add_argument("--experts", type=int, default=None, metavar="E",
                   help="experts in each MLP (llama; default 0: dense; 8 for Mixtral)")
    p.add_argument("--experts-per-token", type=_positive, default=None, metavar="K",
                   help="experts each token runs through (llama with --experts; default 2)")
    p.add_argument("--seq", type=_positive, default=None,
                   help="sequence length T (default 2048, or min(2048, the preset's context))")
    p.add_argument("--batch", type=_positive, default=None, help="batch size B (default 4, or 1 with --model)")
    p.add_argument("--vocab", type=_positive, default=None, help="vocabulary size (default 32000, or the preset's)")
    p.add_argument("--dtype", type=_dtype, default=None,
                   help="float16 | bfloat16 | float32 | float64: pure precision in that dtype (as --precision "
                        "fp16, bf16, fp32, fp64)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default=None,
                   help="fp32 | bf16 | fp16 (pure) | amp-bf16 | amp-fp16 (PyTorch autocast, float32 weights) | "
                        "mixed-bf16 | mixed-fp16 (Megatron/DeepSpeed: half weights, float32 master weights, main "
                        "gradients and states); default fp16")
    p.add_argument("--attention", choices=("explicit", "flash"), default=None,
                   help="explicit (the [B, H, T, T] weights kept, nanoGPT without flash) or flash (FlashAttention / "
                        "SDPA: q, k, v, the output and a log-sum-exp a row); default explicit")
    p.add_argument("--saves", choices=tuple(SAVES), default=None,
                   help="whose choice of saved arrays the ops follow: engine (this engine's), pytorch (PyTorch's "
                        "autograd on CUDA) or megatron (Korthikanti et al.'s Table 2); default engine")
    p.add_argument("--optimizer", choices=("adamw", "sgd", "none"), default="adamw",
                   help="adamw (two states per parameter), sgd (none) or none (no step)")
    p.add_argument("--dropout", type=float, default=None, help="dropout probability (default 0.0)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tinygrad-ckpt",
        description="Where training memory goes, and how activation checkpointing buys it back.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{figures,estimate,explore,notebooks,api-docs}")
    _figures_arguments(sub)
    _estimate_arguments(sub)
    _explore_arguments(sub)
    sub.add_parser("notebooks", help="write notebooks/NN_<slug>.ipynb from the lessons",
                   description="Write every lesson as a Jupyter notebook into notebooks/ (no outputs).")
    sub.add_parser("api-docs", help="write docs/api.md from the docstrings",
                   description="Write the public API reference, docs/api.md, from the docstrings.")
    return parser


def _figures_arguments(sub) -> None:
    fig = sub.add_parser("figures", help="draw the lessons' figures (figures/NN_<slug>.png)",
                         description="Run the lessons and write their figures.")
    fig.add_argument("--quick", action="store_true", help="small sizes, for a fast smoke run")
    fig.add_argument("--only", metavar="NN", nargs="+", help="only these lessons (e.g. 03, or 02 08)")
    fig.add_argument("--out", metavar="DIR", help="directory to write the figures to (default: figures/; with "
                                                  "--quick a scratch folder, never figures/)")
    fig.add_argument("--verbose", "-v", action="store_true",
                     help="print each lesson's text as it runs (default: a progress line and two numbers each)")


def _estimate_arguments(sub) -> None:
    e = sub.add_parser(
        "estimate", help="measure one training step of a GPT of any size on the meta backend",
        description="Build a GPT on the shape-only meta backend, run forward, backward and an optimizer step "
                    "under a ledger, and print the measured memory and FLOPs beside the analytic formulas. "
                    "Defaults: the seed's 7B example.",
    )
    _gpt_arguments(e)
    e.add_argument("--checkpoint", type=_checkpoint, default=None,
                   help="none | every_layer | sqrt | selective (Korthikanti) | a number of segments (default none)")
    e.add_argument("--gpu", type=_gpu, default=None, metavar="NAME",
                   help=f"the device: {', '.join(devices.DEVICES)} (or the name CUDA reports); its capacity is the "
                        "memory it reports less CUDA's context and workspaces (default H100-80GB)")
    e.add_argument("--capacity", type=lambda t: "none" if t.lower() == "none" else parse_size(t), default=None,
                   help="device memory for tensors instead of --gpu's, with its unit: 80GB, 80GiB, 74.5GiB, or none "
                        "for no verdict")
    e.add_argument("--alloc-conf", type=_alloc_conf, default="", metavar="CONF",
                   help="PyTorch's caching-allocator settings, PYTORCH_CUDA_ALLOC_CONF's syntax (e.g. "
                        "expandable_segments:True); the reserved peak is simulated with them")
    e.add_argument("--budget", type=parse_size, default=None, metavar="SIZE",
                   help="find the planner's plan with the least recompute whose measured total peak fits SIZE, "
                        "and report that run (instead of --checkpoint)")
    e.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    e.add_argument("--tensor-parallel", type=_positive, default=1, metavar="T",
                   help="Megatron tensor parallelism over T devices (heads and the 4d hidden split by T)")
    e.add_argument("--sequence-parallel", action="store_true",
                   help="split layer norms, dropouts and residuals along the sequence over the T devices")
    e.add_argument("--pipeline-parallel", type=_positive, default=1, metavar="P",
                   help="P pipeline stages of layers/P (1F1B); device 0 is the first stage")
    e.add_argument("--microbatches", type=_positive, default=None, metavar="M",
                   help="microbatches per batch, with --pipeline-parallel (default P)")
    e.add_argument("--virtual-stages", type=_positive, default=1, metavar="V",
                   help="model chunks per pipeline device: Megatron's interleaved 1F1B (layers/(P·V) a chunk)")
    e.add_argument("--zero", type=int, choices=(1, 2, 3), default=0,
                   help="ZeRO stage over --data-parallel replicas: 1 optimizer states, 2 + gradients, 3 + parameters")
    e.add_argument("--data-parallel", type=_positive, default=1, metavar="D", help="data-parallel replicas")


def _explore_arguments(sub) -> None:
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
        return _figures(parser, args)
    if args.command == "explore":
        return commands.explore_command(parser.error, args)
    return commands.estimate_command(parser.error, args)


def _figures(parser, args) -> int:
    """`tinygrad-ckpt figures`: run the lessons (app/figures.py), a missing repository answered in one line."""
    try:
        from . import figures
    except ImportError as exc:
        print(f"tinygrad-ckpt figures: the figures module is not available ({exc})", file=sys.stderr)
        return 1
    try:
        result = figures.run(quick=args.quick, only=args.only, out=args.out, verbose=args.verbose)
    except ValueError as exc:  # an unknown lesson number, an --out that cannot be made
        parser.error(str(exc))
    except figures.LessonsNotFound as exc:  # a wheel install: the lessons live in the repository
        print(f"tinygrad-ckpt figures: error: {exc}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
