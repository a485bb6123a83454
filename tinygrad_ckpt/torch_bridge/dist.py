"""The engine's plans on a PyTorch model split over processes (torch.distributed on CPU, gloo), measured per rank,
beside the engine's per-device estimate (measure.ParallelStep, what `tinygrad-ckpt estimate --tensor-parallel t
[--sequence-parallel] [--zero 3 --data-parallel d]` runs).

    spec = Spec("tests/foreign_models.py:NanoGPTStyle", dict(n_layer=2, n_embd=64, ...), shape, parallel="tp",
                sequence=True, plan="every_layer")
    ranks = run(spec, nproc=2)              # torchrun --nproc-per-node 2 -m this module (a subprocess)
    rows = comparison_rows(spec, ranks)     # per rank: parameters, gradients, AdamW states, saved per layer, peak
    print(table(rows))

Each rank builds the model, checks that the split computes the unsplit loss, splits it (parallel="tp": DTensor
tensor parallelism in Megatron's split, `tensor_parallel`, with sequence=True also sequence parallelism;
parallel="fsdp": FSDP2), applies the plan (torch_bridge.plans.apply_plan), takes one AdamW step and measures
the next. The model must run on a shard (heads from the width, q, k, v split in three equal parts).
In full: docs/house.md and docs/pytorch.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field

from ..recompute import policies
from ..scale.estimate import GPTShape

PARALLEL = ("tp", "fsdp", "none")  # Spec.parallel: DTensor tensor parallelism, FSDP2, unsplit
POLICY_NAMES = ("korthikanti_selective", "save_matmuls", "save_nothing")  # Spec.policy: tinygrad_ckpt's policies


def availability() -> str | None:
    """Why a multi-process CPU run cannot happen here (None: it can): torch, torch.distributed and gloo needed."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return f"PyTorch is not installed ({exc}); pip install -e '.[torch]'"
    if not dist.is_available():
        return f"this torch {torch.__version__} is built without torch.distributed"
    if not dist.is_gloo_available():
        return f"this torch {torch.__version__} has no gloo backend (CPU processes need it)"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
    except ImportError as exc:
        return f"this torch {torch.__version__} has no DTensor tensor parallelism or FSDP2 ({exc})"
    return None


@dataclass
class Spec:
    """One distributed run: the model (a factory "path/to/file.py:name" or "package.module:name", called with
    `config`), the shape it has (the engine's estimate is built from it), how it is split, the plan and policy."""

    model: str
    config: dict
    shape: GPTShape
    parallel: str = "tp"  # "tp" (DTensor tensor parallelism) | "fsdp" (FSDP2) | "none"
    sequence: bool = False  # sequence parallelism, with "tp"
    plan: object = None  # as apply_plan takes ("every_layer", "sqrt", k, None)
    policy: str | None = None  # a policy's name in tinygrad_ckpt: "korthikanti_selective", "save_matmuls"
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        """Each field checked where the Spec is made (a run would otherwise go unsplit, or fail in a subprocess)."""
        if not isinstance(self.model, str) or ":" not in self.model:
            raise ValueError(f"Spec: model must be a factory 'path/to/file.py:name' or 'package.module:name', got "
                             f"{self.model!r}")
        if not isinstance(self.shape, GPTShape):
            raise TypeError(f"Spec: shape must be a scale.estimate.GPTShape, got {type(self.shape).__name__}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"Spec: parallel={self.parallel!r} is not a split; use one of "
                             f"{', '.join(map(repr, PARALLEL))} (lower case)")
        if not isinstance(self.sequence, bool) or (self.sequence and self.parallel != "tp"):
            raise ValueError(f"Spec: sequence={self.sequence!r} with parallel={self.parallel!r}; sequence "
                             "parallelism is True or False, and True only with parallel='tp'")
        if not (self.plan is None or self.plan in ("every_layer", "sqrt")
                or (isinstance(self.plan, int) and not isinstance(self.plan, bool) and self.plan >= 1)):
            raise ValueError(f"Spec: plan={self.plan!r}; use None, 'every_layer', 'sqrt' or a number of segments "
                             "(a JSON value: no Plan objects)")
        if self.policy is not None and not isinstance(getattr(policies, str(self.policy), None), policies.Policy):
            raise ValueError(f"Spec: policy={self.policy!r} names no policy; use None or one of "
                             f"{', '.join(POLICY_NAMES)}")

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "shape": asdict(self.shape)})

    @classmethod
    def from_json(cls, text: str) -> Spec:
        d = json.loads(text)
        return cls(**{**d, "shape": GPTShape(**d["shape"])})


# ---- splitting a nanoGPT-layout model ----------------------------------------------------------------------
def interleave_qkv(weight, t: int):
    """Rows of a fused [3d, ...] q, k, v weight (or bias) reordered so that each of t contiguous shards holds
    [q, k, v] of its own heads (column parallelism gives shard r rows r·3d/t ... (r+1)·3d/t)."""
    import torch

    q, k, v = weight.chunk(3, dim=0)
    return torch.cat([torch.cat([q_r, k_r, v_r]) for q_r, k_r, v_r in zip(q.chunk(t), k.chunk(t), v.chunk(t))])


def tensor_parallel(model, mesh, sequence: bool = False, blocks: str = "transformer.h"):
    """Megatron's split of a nanoGPT-layout model over `mesh` (DTensor parallelize_module): c_attn and c_fc
    column-parallel, attn.c_proj and mlp.c_proj row-parallel, transformer.wte over the vocabulary with the lm_head
    tied to it (column-parallel, logits sharded over the vocabulary: run the loss under loss_parallel()). With
    `sequence`, ln_1, ln_2, ln_f and the residual stream are split along the sequence: the embedding's sum is
    reduce-scattered to [B, T/t, d], the column-parallel linears all-gather it, the row-parallel ones
    reduce-scatter. The fused c_attn rows are interleaved first (interleave_qkv) so each rank holds its heads'
    q, k and v."""
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    t = mesh.size()
    with torch.no_grad():
        for block in model.get_submodule(blocks):
            attn = block.attn.c_attn
            attn.weight.copy_(interleave_qkv(attn.weight, t))
            if attn.bias is not None:
                attn.bias.copy_(interleave_qkv(attn.bias, t))
    seq, rep = (Shard(1), Shard(1)) if sequence else (Replicate(), Replicate())
    per_block = {
        "attn.c_attn": ColwiseParallel(input_layouts=seq),
        "attn.c_proj": RowwiseParallel(output_layouts=rep, use_local_output=not sequence),
        "mlp.c_fc": ColwiseParallel(input_layouts=seq),
        "mlp.c_proj": RowwiseParallel(output_layouts=rep, use_local_output=not sequence),
    }
    if sequence:
        per_block |= {"ln_1": SequenceParallel(), "ln_2": SequenceParallel()}
    for block in model.get_submodule(blocks):
        parallelize_module(block, mesh, per_block)
    top = {"transformer.wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
           "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)}
    if sequence:  # the embeddings' sum (replicated) enters the sequence-parallel region: each rank its slice
        top |= {"transformer.drop": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1),
                                                       use_local_output=False),
                "transformer.ln_f": SequenceParallel()}
    parallelize_module(model, mesh, top)
    if model.lm_head.weight is not model.transformer.wte.weight:  # parallelize_module gave each its own DTensor
        model.lm_head.weight = model.transformer.wte.weight
    return model


def fully_shard_blocks(model, mesh, blocks: str = "transformer.h"):
    """FSDP2: each block one unit, then the rest of the model (ZeRO-3: parameters, gradients and optimizer states
    split over the ranks; a unit's parameters all-gathered while it runs, forward and backward)."""
    from torch.distributed.fsdp import fully_shard

    for block in model.get_submodule(blocks):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ---- one rank -----------------------------------------------------------------------------------------------
def _factory(path: str):
    where, name = path.rsplit(":", 1)  # "file.py:Class" or "module:Class", a Spec's model: not an event name
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(os.path.basename(where)[:-3], where)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, os.path.dirname(os.path.abspath(where)))
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def _local_bytes(t) -> int:
    from . import saves as ts

    local = ts._local(t)
    return local.numel() * local.element_size()


class _Gathered:
    """FSDP2's all-gather buffers, sampled: the bytes of unsharded parameters live at once, at every module's
    forward (its replay included) and at the start of every module's backward; and, each time a gradient lands on
    an unsharded parameter, the unsharded gradients live before their reduce-scatter."""

    def __init__(self, model):
        from torch.distributed.fsdp import FSDPModule

        self.params = [p for m in model.modules() if isinstance(m, FSDPModule)
                       for g in m._get_fsdp_state()._fsdp_param_groups for p in g.fsdp_params]
        self.peak = self.grads_peak = 0
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(lambda *a: self.sample()))
            self.handles.append(m.register_forward_hook(self.after_forward))
        for p in self.params:  # the unsharded parameters exist from the first all-gather on (the warm-up step)
            self.handles.append(p._unsharded_param.register_post_accumulate_grad_hook(lambda _: self.sample()))

    def live(self) -> int:
        return sum(t.untyped_storage().nbytes() for p in self.params for t in p.all_gather_outputs)

    def grads(self) -> int:
        return sum(g.numel() * g.element_size() for p in self.params
                   if (g := p._unsharded_param.grad) is not None)

    def sample(self) -> None:
        self.peak = max(self.peak, self.live())
        self.grads_peak = max(self.grads_peak, self.grads())

    def after_forward(self, module, args, out):
        self.sample()
        import torch

        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: self.sample())

    def remove(self):
        for h in self.handles:
            h.remove()


def _first_step(step, opt) -> float:
    """The first training step, which makes the optimizer's states; its loss."""
    first = step()
    loss = first.detach().item()
    first.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _state_bytes(opt) -> dict:
    """Bytes this rank holds per optimizer state name (exp_avg, exp_avg_sq, ...), summed over parameters."""
    import torch

    states = {}
    for state in opt.state.values():
        for k, v in state.items():
            states[k] = states.get(k, 0) + (_local_bytes(v) if isinstance(v, torch.Tensor) else 0)
    return states


def _fsdp_numbers(model, gathered) -> dict:
    """FSDP's gathered peaks, and each unit's parameters, whole (a DTensor's numel is its global one)."""
    from torch.distributed.fsdp import FSDPModule

    units = {name: sum(p.numel() * p.element_size() for p in m.parameters()) for name, m in
             model.named_modules() if isinstance(m, FSDPModule)}
    return {"gathered_peak": gathered.peak, "unsharded_grads_peak": gathered.grads_peak, "units": units}


def run_rank(spec: Spec) -> dict:
    """This rank's measurements (torchrun has set RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    import tinygrad_ckpt as tg

    from . import plans as tp

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(spec.seed)
    model = _factory(spec.model)(**spec.config)
    s = spec.shape
    g = torch.Generator().manual_seed(spec.seed + (rank if spec.parallel == "fsdp" else 0))  # FSDP: data parallel
    idx = torch.randint(0, s.vocab_size, (s.batch, s.seq_len), generator=g)
    reference = model(idx, idx)[1].item()  # the model whole, on this rank's batch
    if spec.parallel == "tp":
        tensor_parallel(model, mesh, spec.sequence)
    elif spec.parallel == "fsdp":
        fully_shard_blocks(model, mesh)
    policy = getattr(tg, spec.policy) if spec.policy else None
    if spec.plan is not None or policy is not None:
        tp.apply_plan(model, spec.plan, policy=policy)
    context = loss_parallel if spec.parallel == "tp" else contextlib.nullcontext

    def step():
        with context():
            loss = model(idx, idx)[1]
        return _Backward(loss, context)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first_loss = _first_step(step, opt)
    gathered = _Gathered(model) if spec.parallel == "fsdp" else None
    saves = tp.measure(model, step)
    if gathered is not None:
        gathered.remove()
    params = list({id(p): p for p in model.parameters()}.values())
    fsdp = _fsdp_numbers(model, gathered) if gathered is not None else {}
    return {"rank": rank, "world": world, "loss": first_loss, "reference_loss": reference,
            "params": sum(_local_bytes(p) for p in params),
            "grads": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": _state_bytes(opt), "saved_by_layer": saves.by_layer(), "saved_by_module": saves.by_module(),
            "peak_saved": saves.peak, "after_forward": saves.after_forward, "n_tensors": len(params),
            "at_peak_by_module": _by_scope(saves.meter.at_peak), **fsdp}


def _by_scope(records) -> dict:
    out = {}
    for k in records:
        out[k.scope] = out.get(k.scope, 0) + k.nbytes
    return out


class _Backward:
    """A loss whose backward runs in the context its forward ran in (loss_parallel needs both)."""

    def __init__(self, loss, context):
        self.loss, self.context = loss, context

    def backward(self):
        with self.context():
            self.loss.backward()

    def detach(self):
        return self.loss.detach().full_tensor() if hasattr(self.loss, "full_tensor") else self.loss.detach()


def main(argv=None) -> int:
    """torchrun's entry: run each spec on this rank, gather every rank's results on rank 0, write them as JSON (one
    list of ranks per spec) to --out."""
    import torch.distributed as dist

    from . import saves as ts

    parser = argparse.ArgumentParser(description="the ranks of a tinygrad_ckpt.torch_bridge.dist run")
    parser.add_argument("--specs", required=True, help="a JSON list of Spec.to_json() objects")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    every = []
    for text in json.loads(args.specs):
        result = run_rank(Spec.from_json(text))
        ts._SCOPE.clear()
        results = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(result, results, dst=0)
        every.append(results)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(every, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # leave without the interpreter's teardown: about one run in five, a C++ thread gloo or autograd left behind was
    # destroyed while joinable there ("terminate called without an active exception", SIGABRT) after all was done
    os._exit(0)


# ---- the host side --------------------------------------------------------------------------------------------
def run(specs, nproc: int = 2, timeout: float = 300) -> list[list[dict]]:
    """Launch each Spec of `specs` (one Spec, or a list: one launch for all) on nproc CPU processes (torchrun
    --standalone, in a subprocess) and return, per spec, every rank's measurements. A failure raises RuntimeError
    with the ranks' output."""
    reason = availability()
    if reason:
        raise RuntimeError(f"torch_dist.run: {reason}")
    specs = [specs] if isinstance(specs, Spec) else list(specs)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", __name__, "--specs", json.dumps([s.to_json() for s in specs]), "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"torch_dist.run: torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-6000:]}")
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    sys.exit(main())


# ---- the engine's estimate of the same run ------------------------------------------------------------------
def parallelism(spec: Spec, world: int):
    """The engine's Parallelism for this split over `world` ranks."""
    from ..scale.parallel import Parallelism

    if spec.parallel == "tp":
        return Parallelism(tensor=world, sequence=spec.sequence)
    if spec.parallel == "fsdp":
        return Parallelism(zero=3, data=world)
    return Parallelism()


def estimate(spec: Spec, world: int, saves: str = "engine") -> dict:
    """The engine's per-device numbers for the run (measure.ParallelStep on the meta backend, as `tinygrad-ckpt
    estimate --tensor-parallel t [--sequence-parallel] [--zero 3 --data-parallel d]`; a steady AdamW step, ZeRO
    applied by zero_view): parameters, parameter gradients (live when the optimizer step starts), optimizer states,
    saved bytes per layer (saved_breakdown) and the peak of saved bytes. `saves`: what the framework saves, the
    estimate's --saves (engine: this engine's ops; pytorch: as PyTorch's autograd saves, tg.saves_like)."""
    import tinygrad_ckpt as tg

    from ..scale.measure import ParallelStep

    par = parallelism(spec, world)
    step = ParallelStep(spec.shape, par, "adamw", saves=saves)
    led, _ = step.measure(getattr(tg, spec.policy) if spec.policy else spec.plan)
    tl = led.timeline()
    first_optimizer = int((tl["phase"] == "optimizer").argmax())
    share = {"parameter": 1, "gradient": 1, "optimizer": 1}
    if par.zero:
        share = {"optimizer": 1 / par.data, "gradient": 1 / par.data if par.zero >= 2 else 1,
                 "parameter": 1 / par.data if par.zero >= 3 else 1}
    return {"params": round(led.peak_bytes("parameter") * share["parameter"]),
            "grads": round(int(tl["gradient"][first_optimizer - 1]) * share["gradient"]),
            "optimizer": round(led.peak_bytes("optimizer") * share["optimizer"]),
            "saved_by_layer": led.saved_breakdown(by="layer"), "peak_saved": led.peak_bytes("activation"),
            "parallelism": par.describe()}


# ---- measured against estimated, every difference named -------------------------------------------------------
@dataclass
class Row:
    """One quantity on one rank: measured in PyTorch, estimated by the engine, the named terms between them
    ([(name, bytes)]) and what is left."""

    quantity: str
    measured: int
    estimate: int
    terms: list

    @property
    def unexplained(self) -> int:
        return self.measured - self.estimate - sum(b for _, b in self.terms)

    @property
    def within(self) -> float:
        """|unexplained| as a share of the estimate (0 when both are 0)."""
        return abs(self.unexplained) / self.estimate if self.estimate else float(self.unexplained != 0)


def terms(spec: Spec, world: int, saves: str = "engine") -> dict:
    """The named differences between PyTorch's saves and the engine's for this run, in bytes, from the shapes:
    {name: (bytes, why)}. Each is counted in comparison_rows() where PyTorch's saves it describes are held. Against an
    estimate with saves="pytorch" the engine's layer norms save as PyTorch's do: their terms are 0 (its
    cross-entropy keeps what it keeps under every profile, so that term stays)."""
    s = spec.shape
    t = world if spec.parallel == "tp" else 1
    w = 4 if s.dtype == "float32" else 2
    B, T, d = s.batch, s.seq_len, s.d_model
    local = T // t if spec.sequence else T  # the sequence on this rank where norms run
    N = B * T
    same = saves == "pytorch"  # the engine's ops then save what PyTorch's do
    out = {
        "layer_norm_mean": (B * local * w, "torch.nn.functional.layer_norm keeps its mean as well as 1/std"),
        "layer_norm_input": (B * local * d * w, "PyTorch's layer norm keeps its input; the engine's keeps its output, "
                                                "which the next linear keeps anyway (Apex's memory-efficient norm)"),
        "gathered_input": (B * (T - local) * d * w, "sequence parallel: DTensor all-gathers [B, T, d] before the "
                                                    "column-parallel linear, which keeps it; Megatron and the engine "
                                                    "(GatherLinear) keep the local [B, T/t, d] and gather again in "
                                                    "backward"),
        "cross_entropy": (4 - N * (w + 1), "PyTorch's cross-entropy keeps its log-softmax and a 0-d total weight; the "
                                           "engine's the logits (as many bytes), a log-sum-exp and a valid flag per "
                                           "row"),
        # FSDP2's buffers, which the engine's ZeRO view (measure.ParallelStep.zero_view) does not model
        "fsdp_root": ((s.vocab_size * d + s.block_size * d + 2 * d) * w, "the root unit's parameters unsharded: FSDP2 "
                                                                          "does not reshard the root after forward"),
        "fsdp_block": ((12 * d * d + 13 * d) * w, "one block's parameters (or gradients) unsharded while it runs"),
        "fsdp_ln_f": (2 * d * w, "ln_f's gradients land before the blocks' and wait for the root's reduce-scatter"),
    }
    if same:
        out.update({k: (0, why) for k, (_, why) in out.items() if k.startswith("layer_norm")})
    return out


def _block_terms(named: dict, spec: Spec, starts: bool) -> list:
    """The terms of one block's saves: two layer norms (mean; input, but for ln_1 of a block that starts a
    checkpoint, whose input is the checkpoint's, kept anyway) and, under sequence parallelism, two column-parallel
    linears."""
    norms = 1 if starts else 2
    out = [("2 × layer_norm_mean", 2 * named["layer_norm_mean"][0]),
           (f"{norms} × layer_norm_input", norms * named["layer_norm_input"][0])]
    if spec.sequence:
        out.append(("2 × gathered_input (c_attn, c_fc)", 2 * named["gathered_input"][0]))
    return out


def _head_terms(named: dict, spec: Spec) -> list:
    out = [("layer_norm_mean", named["layer_norm_mean"][0]), ("layer_norm_input", named["layer_norm_input"][0])]
    if spec.sequence:
        out.append(("gathered_input (lm_head)", named["gathered_input"][0]))
    return out


def comparison_rows(spec: Spec, rank: dict, est: dict | None = None, blocks: str = "transformer.h",
                    saves: str = "engine") -> list[Row]:
    """One rank's measurements beside the engine's estimate (estimate(spec, world, saves) if not given), row by row:
    parameters, gradients, AdamW states, the saves of every block, of ln_f + lm_head and of the loss, the peak of
    saved bytes, and FSDP2's all-gathered parameters and unsharded gradients; each difference a named term
    (terms()). comparison_rows(spec, rank, saves="pytorch") is the comparison with the estimate's --saves pytorch."""
    from ..recompute import planner

    if spec.policy:
        raise NotImplementedError("torch_dist.comparison_rows: the named terms are derived for plans (full "
                                  f"recompute); under policy {spec.policy} the ranks' measurements stand alone")
    world = rank["world"]
    est = est or estimate(spec, world, saves)
    named = terms(spec, world, saves)
    plan = planner.plan_for(spec.shape.n_layer, spec.plan) if spec.plan is not None else None
    starts = set(plan.checkpoint_boundaries()) if plan is not None else set()  # blocks whose input a checkpoint keeps
    rows = [Row("parameters", rank["params"], est["params"], []),
            Row("gradients", rank["grads"], est["grads"], []),
            Row("optimizer states", sum(rank["optimizer"].values()), est["optimizer"],
                [(f"AdamW step: {rank['n_tensors']} × 0-d float32 (the engine counts steps in Python)",
                  rank["optimizer"].get("step", 0))])]
    ours, theirs = rank["saved_by_layer"], est["saved_by_layer"]
    for k in range(spec.shape.n_layer):
        name = f"{blocks}.{k}"
        rows.append(Row(f"saved, {name}", ours.get(name, 0), theirs.get(name, 0),
                        _block_terms(named, spec, k in starts)))
    head = ("transformer.ln_f", "lm_head")
    rows.append(Row("saved, ln_f + lm_head", sum(ours.get(n, 0) for n in head), sum(theirs.get(n, 0) for n in head),
                    _head_terms(named, spec)))
    rows.append(Row("saved, loss", ours.get("", 0), theirs.get("cross_entropy", 0),
                    [("cross_entropy", named["cross_entropy"][0])]))
    rows.append(Row("saved, embeddings", sum(v for n, v in ours.items() if n.startswith("transformer.w")),
                    sum(v for n, v in theirs.items() if n.startswith("transformer.w")), []))
    for seg in plan.segments if plan is not None else ():  # a checkpoint of several blocks keeps its input under
        if seg.checkpoint and seg.stop - seg.start > 1:  # its own name, in both ("transformer.h.0-1")
            name = f"{blocks}.{seg.start}-{seg.stop - 1}"
            rows.append(Row(f"saved, {name} (its input)", ours.get(name, 0), theirs.get(name, 0), []))
    peak_terms = _peak_terms(rank["at_peak_by_module"], named, spec, blocks, starts, head)
    rows.append(Row("peak of saved bytes", rank["peak_saved"], est["peak_saved"], peak_terms))
    if "gathered_peak" in rank:
        rows += _fsdp_rows(rank, named)
    return rows


def _peak_terms(live, named: dict, spec: Spec, blocks: str, starts: set, head: tuple) -> list:
    """The terms of the saves PyTorch held at its peak (`live`: the scopes it held then)."""
    peak_terms = []
    for k in range(spec.shape.n_layer):
        if any(scope.startswith(f"{blocks}.{k}.") for scope in live):
            peak_terms += [(f"{blocks}.{k}: {n}", b) for n, b in _block_terms(named, spec, k in starts)]
    if any(scope in head for scope in live):
        peak_terms += [(f"ln_f + lm_head: {n}", b) for n, b in _head_terms(named, spec)]
    if "" in live:
        peak_terms.append(("loss: cross_entropy", named["cross_entropy"][0]))
    return peak_terms


def _fsdp_rows(rank: dict, named: dict) -> list[Row]:
    """FSDP2's all-gathered parameters and unsharded gradients at their peaks, each beside its named terms."""
    return [Row("FSDP2 all-gathered parameters (peak)", rank["gathered_peak"], 0,
                [("root unit: embeddings, ln_f (lm_head tied), kept unsharded through forward and backward",
                  named["fsdp_root"][0]), ("one block unit, from its pre-forward (pre-backward) to its post-",
                                           named["fsdp_block"][0])]),
            Row("FSDP2 unsharded gradients (peak)", rank["unsharded_grads_peak"], 0,
                [("one block unit's, from accumulation to its reduce-scatter", named["fsdp_block"][0]),
                 ("ln_f's: the root's, landed before the blocks', reduce-scattered last", named["fsdp_ln_f"][0])])]


def table(rows: list[Row], title: str = "") -> str:
    """The rows as a fixed-width table; the terms one per line under their row."""
    lines = [title] if title else []
    lines.append(f"  {'per rank':<38}{'measured':>12}{'estimate':>12}{'difference':>12}{'unexplained':>13}")
    for r in rows:
        lines.append(f"  {r.quantity:<38}{r.measured:>12,}{r.estimate:>12,}{r.measured - r.estimate:>+12,}"
                     f"{r.unexplained:>+13,}")
        for name, nbytes in r.terms:
            if nbytes:
                lines.append(f"      {name:<66}{nbytes:>+12,}")
    return "\n".join(lines)
