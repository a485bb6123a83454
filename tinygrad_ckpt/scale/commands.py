"""What `tinygrad-ckpt estimate` and `explore` do once app/cli.py has parsed their flags: the shape the flags describe
(a --model preset's or the seed's 7B example's, each value not given named as assumed), then the run.

`estimate` builds the GPT on the meta backend (shapes only), runs a first step (which makes the optimizer states),
measures a second, steady step under a ledger, and prints it beside the analytic formulas (scale/report.py): the
seed's 12·B·T·d per layer, Korthikanti et al.'s sbh(34 + 5as/h), the engine's own count. With parallelism flags it
runs one device's shard (scale/parallel.py) beside Korthikanti et al.'s Table 2. A meta run costs about 4.5 ms and
0.1 MB a block whatever the sizes, so a command runs at most MAX_BLOCK_RUNS of them (about a minute).

`fail(message)` reports a bad combination of flags: the parser's error (one line, exit status 2); it does not
return."""

from __future__ import annotations

import json
import math

from ..units import format_bytes
from . import devices
from . import estimate as est
from .measure import SteadyStep, best_plan, precision_of
from .parallel import Parallelism
from .report import device_fit, explore, measured, parallel_report, report, run_summary

# A meta run costs about 4.5 ms and 0.1 MB per block it runs forward and backward (measured on 2026-12-01: 2048
# layers, two steps, 19 s and 465 MB), whatever the sizes: its time is the number of ops it runs. The limit keeps a
# run under a minute and about 1 GB: 4096 layers for `estimate` (far beyond the ~130 of today's largest models); the
# per-block numbers it reports do not depend on the depth, so a deeper model is estimated from fewer layers.
MAX_BLOCK_RUNS = 8192
# A mixture of experts runs every expert of a layer on the meta backend (tokens routed evenly): 13 ops each beside
# a block's 58-73, so an expert counts as a fifth of a block (timed: Llama 2 layers × 128 experts ≈ 52 GPT blocks).
EXPERT_SHARE = 1 / 5
# The ledger counts FLOPs and bytes in 64-bit integers: a step whose numbers pass this would be reported wrong or
# stop half-way, whatever the time.
MAX_COUNT = 2**63 - 1


def check_cost(fail, args, shape, passes: int, layers: int, what: str) -> None:
    """Refuse, in one line, a meta run of more than MAX_BLOCK_RUNS blocks (`passes` × `layers`, a layer of E experts
    counting 1 + E·EXPERT_SHARE blocks): it would take minutes to hours; then a step the ledger cannot count
    (check_size)."""
    experts = getattr(shape, "n_experts", 0)
    runs = math.ceil(passes * layers * (1 + experts * EXPERT_SHARE))
    if runs > MAX_BLOCK_RUNS:
        seconds = runs * 0.0045
        took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"
        flags = f"--layers {args.layers or layers}" + (f" --experts {experts}" if experts else "")
        if experts:
            what += f", each layer's {experts:,} experts running like {experts * EXPERT_SHARE:,.0f} more blocks"
        fail(f"{flags}: this {args.command} would run {runs:,} blocks on the meta backend ({what}; about {took} and "
             f"{runs * 0.1 / 1000:,.1f} GB), more than the limit of {MAX_BLOCK_RUNS:,}. The per-block numbers do not "
             "depend on the depth: measure fewer layers" + (" or experts" if experts else "") + " and scale")
    check_size(fail, shape)


def check_size(fail, shape) -> None:
    """Refuse, in one line, a step whose FLOPs or bytes the ledger cannot count (more than MAX_COUNT): about 4×
    the forward's matmul FLOPs (forward, backward, a replay) and 32 B a parameter (weights, gradients, states)."""
    if isinstance(shape, est.LlamaShape):
        forward = shape.n_layer * sum(est.llama_forward_flops_terms(shape).values()) \
            + 2 * shape.batch * shape.seq_len * shape.d_model * shape.vocab_size
    else:
        forward = est.gpt_forward_flops(shape)
    size = 4 * forward + 32 * est.parameter_count(shape)
    if size > MAX_COUNT:
        fail(f"--seq {shape.seq_len} --batch {shape.batch} --vocab {shape.vocab_size}: this step would count about "
             f"{size:.1e} FLOPs and bytes, more than the ledger's 64-bit counters hold ({MAX_COUNT:.1e}); lower "
             "--seq, --batch or --vocab (the numbers per token scale)")


# the seed's 7B example: what a shape flag is when neither it nor --model says
SEED_SHAPE = {"n_layer": 32, "d_model": 4096, "n_head": 32, "seq_len": 2048, "batch": 4, "vocab_size": 32000}
_FLAGS = {"n_layer": "layers", "d_model": "d_model", "n_head": "heads", "seq_len": "seq", "batch": "batch",
          "vocab_size": "vocab", "n_kv_head": "kv_heads", "ffn_hidden": "ffn", "n_experts": "experts",
          "experts_per_token": "experts_per_token", "dropout": "dropout"}
_LLAMA_ONLY = ("n_kv_head", "ffn_hidden", "n_experts", "experts_per_token")


def _flag(field: str) -> str:
    return "--" + _FLAGS[field].replace("_", "-")


def shape_from_flags(fail, args):
    """(the shape the flags describe, what was assumed): the preset's fields or the seed's, each flag given over
    them; every value the user did not give is named in `assumed`."""
    given = {f: getattr(args, a) for f, a in _FLAGS.items() if getattr(args, a) is not None}
    assumed = []
    dtype = _values_dtype(fail, args)
    try:
        if args.model:
            seq, batch = given.pop("seq_len", None), given.pop("batch", 1)
            shape = est.preset(args.model, seq_len=seq, batch=batch, dtype=dtype, arch=args.arch, **given)
            assumed += est.assumptions(shape, args.model)
            if seq is None:
                assumed.append(f"seq {shape.seq_len}: min(2048, the preset's context of {shape.block_size}) (--seq)")
            if args.batch is None:
                assumed.append("batch 1 (--batch)")
        else:
            arch = args.arch or "gpt2"
            if arch == "gpt2":
                llama = [_flag(f) for f in _LLAMA_ONLY if f in given]
                if llama:
                    fail(f"{', '.join(llama)}: Llama settings; add --arch llama (or --model llama-3-8b ...)")
            if args.arch is None:
                assumed.append("arch gpt2: nanoGPT's blocks (--arch llama, or --model NAME)")
            for field, value in SEED_SHAPE.items():
                if field not in given:
                    note = "; GPT-2's tokenizer has 50,257" if field == "vocab_size" else ""
                    assumed.append(f"{_flag(field)[2:]} {value}: the seed's 7B example{note} ({_flag(field)})")
            fields = {**SEED_SHAPE, **given}
            shape = (est.GPTShape if arch == "gpt2" else est.LlamaShape)(dtype=dtype, **fields)
    except ValueError as exc:
        fail(str(exc))
    return shape, assumed


def _values_dtype(fail, args) -> str:
    """The dtype --precision or --dtype gives the shape (refusing the two when they disagree)."""
    if args.precision and args.dtype and precision_of(args.dtype).name != args.precision:
        fail(f"--dtype {args.dtype} is pure {precision_of(args.dtype).name}, but --precision says "
                     f"{args.precision}: give one of them")
    return precision_of(args.precision or args.dtype or "fp16").weights


def run_settings(args, assumed) -> dict:
    """How the run keeps its numbers (SteadyStep's precision, attention and saves), each default named in
    `assumed`."""
    precision = precision_of(args.precision or args.dtype or "fp16")
    if args.precision is None and args.dtype is None:
        assumed.append(f"precision fp16: {precision.about} (--precision)")
    if args.attention is None:
        assumed.append("attention explicit: the [B, H, T, T] weights are kept, as nanoGPT without flash "
                       "(--attention flash: FlashAttention or PyTorch's SDPA)")
    if args.saves is None:
        assumed.append("saves engine: this engine's choice of saved arrays (--saves pytorch | megatron)")
    return {"precision": precision.name, "attention": args.attention or "explicit", "saves": args.saves or "engine"}


def _device(args, assumed):
    """(the devices.Device or None, the capacity in bytes or None) from --gpu and --capacity."""
    if args.capacity is not None:  # a number, or "none": no verdict
        return args.gpu, None if args.capacity == "none" else args.capacity
    device = args.gpu or devices.DEVICES["H100-80GB"]
    if args.gpu is None:
        assumed.append(f"device {device.name}: {format_bytes(device.usable_bytes)} for tensors, the "
                       f"{format_bytes(device.total_bytes)} it reports less {format_bytes(device.overhead_bytes)} for "
                       "CUDA's context and workspaces (--gpu NAME, --capacity SIZE)")
    return device, device.usable_bytes


def _check_segments(fail, checkpoint, n_layer: int) -> None:
    """Refuse a number of checkpoint segments larger than the number of layers."""
    if isinstance(checkpoint, int) and checkpoint > n_layer:
        fail(f"--checkpoint {checkpoint}: more segments than the {n_layer} layers; choose 1 to "
             f"{n_layer} (or every_layer, sqrt)")


def explore_command(fail, args) -> int:
    """`tinygrad-ckpt explore`: one steady step per --checkpoint plan, written as one explorer page."""
    shape, assumed = shape_from_flags(fail, args)
    run = run_settings(args, assumed)
    plans = args.checkpoint
    for plan in plans:
        _check_segments(fail, plan, shape.n_layer)
    check_cost(fail, args, shape, 1 + len(plans), shape.n_layer,
               f"a first step, then one per plan: {1 + len(plans)} × {shape.n_layer} layers")
    try:
        written = explore(shape, args.optimizer, plans, args.out, args.memory_viz, **run)
    except OSError as exc:
        fail(f"cannot write {exc.filename or args.out}: {exc.strerror or exc}")
    for path in written:
        print(f"wrote {path}")
    return 0


def estimate_command(fail, args) -> int:
    """`tinygrad-ckpt estimate`: one device's steady step (its plan found by --budget if given) and its report, or
    with parallelism flags one device's shard beside Korthikanti et al.'s Table 2."""
    shape, assumed = shape_from_flags(fail, args)
    run = run_settings(args, assumed)
    if args.budget is not None and args.checkpoint is not None:
        fail(f"--budget {args.budget:,} B finds the plan itself: leave out --checkpoint {args.checkpoint}")
    checkpoint = args.checkpoint or "none"
    _check_segments(fail, checkpoint, shape.n_layer)
    device, capacity = _device(args, assumed)
    if args.microbatches is not None and args.pipeline_parallel == 1:
        fail(f"--microbatches {args.microbatches} needs --pipeline-parallel > 1 (microbatches feed pipeline "
             "stages)")
    par = Parallelism(args.tensor_parallel, args.sequence_parallel, args.pipeline_parallel,
                      args.microbatches or args.pipeline_parallel, args.zero, args.data_parallel, args.virtual_stages)
    steps = 1 if args.optimizer == "none" else 2  # a first step makes the optimizer states, then the measured one
    if par == Parallelism():
        _estimate_one_device(fail, args, shape, assumed, run, checkpoint, device, capacity, steps)
    else:
        _estimate_shard(fail, args, shape, assumed, run, checkpoint, device, capacity, steps, par)
    return 0


def _estimate_one_device(fail, args, shape, assumed, run, checkpoint, device, capacity, steps) -> None:
    """Measure the steady step under `checkpoint` (or the plan --budget finds) and print its report or JSON."""
    check_cost(fail, args, shape, steps if args.budget is None else steps + 12, shape.n_layer,
               f"{steps} step(s) × {shape.n_layer} layers" + ("" if args.budget is None else
                                                              " + about 12 plans measured for --budget"))
    step = SteadyStep(shape, args.optimizer, **run)
    search = None
    if args.budget is not None:
        search = best_plan(step, args.budget)
        checkpoint = search.plan if search.plan is not None else "every_layer"
    m = measured(step, args.optimizer, checkpoint)
    fit = device_fit(m.ledger.events, capacity, device, args.alloc_conf)
    print(json.dumps(run_summary(m, fit, assumed, search)) if args.json else
          report(m, capacity, fit, assumed, search))


_PARALLEL_FLAGS = {"tensor_parallel": "--tensor-parallel", "pipeline_parallel": "--pipeline-parallel",
                   "sequence_parallel": "--sequence-parallel", "data_parallel": "--data-parallel",
                   "microbatches": "--microbatches", "virtual_stages": "--virtual-stages", "zero": "--zero"}


def _estimate_shard(fail, args, shape, assumed, run, checkpoint, device, capacity, steps, par) -> None:
    """Measure one device's shard under the parallelism `par` and print parallel_report's table."""
    if args.budget is not None:
        fail("--budget plans one device's blocks: leave out the parallelism flags")
    if not isinstance(shape, est.GPTShape):
        fail("parallelism is modelled for GPT-2 shapes (tinygrad_ckpt/parallel.py); leave out --arch llama "
             "or the parallelism flags")
    try:
        par.check(shape)
    except ValueError as exc:
        message = str(exc)
        for field, flag in _PARALLEL_FLAGS.items():  # Parallelism's field names, as the flags that set them
            message = message.replace(field, flag)
        fail(message)
    chunk_layers = shape.n_layer // (par.pipeline * par.virtual)
    what = (f"{steps} step(s) × {par.microbatches} microbatch(es) × {shape.n_layer // par.pipeline} layers of one "
            "stage" if par.virtual == 1 else f"{steps} step(s) × {par.microbatches} microbatch(es) × "
            f"{par.virtual} chunks × {chunk_layers} layers of one chunk")
    check_cost(fail, args, shape, steps * par.microbatches * par.virtual, chunk_layers, what)
    if not isinstance(checkpoint, str) or checkpoint not in ("none", "selective", "every_layer"):
        fail(f"--checkpoint {checkpoint} with parallelism: choose none, selective or every_layer")
    print(parallel_report(shape, par, args.optimizer, checkpoint, capacity, device=device,
                          alloc_conf=args.alloc_conf, assumed=assumed, as_json=args.json, **run))
