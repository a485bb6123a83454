"""One steady-state training step, measured: what `tinygrad-ckpt estimate` and lessons 9 and 13 report.

    step = SteadyStep(GPTShape(n_layer=32, d_model=4096, n_head=32, seq_len=2048, batch=4, dtype="float16"))
    led, seconds = step.measure("every_layer")        # a Ledger of one forward, backward, optimizer step
    run = estimate_step(preset("llama-3-70b", batch=1))   # the same for a published model, timed

The model (nn.GPT for a GPTShape, nn.Llama for a LlamaShape) is built (on the meta backend by
default: shapes and dtypes, no data, so a 70B model takes seconds) and one training step is taken
first: it creates the optimizer's states, as the first step of any run does. `measure(checkpoint)`
sets the checkpoint plan and runs one more step (forward, backward, optimizer step, zero_grad) under
a Ledger: the step a long run repeats. A meta model has no data, so changing the plan between
measurements changes nothing else; a mixture of experts routes tokens evenly there
(estimate.assumptions says so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import backend, nn, optim, state
from ..amp import autocast
from ..engine.tensor import Tensor
from ..memory.events import CATEGORIES, within
from ..memory.ledger import Ledger
from ..recompute.planner import LayerCost
from ..recompute.policies import korthikanti_selective
from .estimate import GPTShape, LlamaShape, active_parameter_count, parameter_count
from .save_profiles import saves_like


@contextlib.contextmanager
def using_backend(name: str):
    """Switch the active backend for a `with` block, then back."""
    previous = backend.current().name
    backend.use_backend(name)
    try:
        yield
    finally:
        backend.use_backend(previous)


@dataclass(frozen=True)
class Precision:
    """How a run keeps its numbers: the parameters' dtype, autocast's half dtype (None: off), whether there are
    float32 master weights and main gradients (Megatron's mixed precision), and the AdamW states' dtype."""

    name: str
    weights: str
    autocast: str | None
    master: bool
    states: str
    about: str


PRECISIONS = {p.name: p for p in (
    Precision("fp32", "float32", None, False, "float32",
              "float32 throughout: 4 B weights + 4 B gradients + 8 B AdamW states a parameter"),
    Precision("bf16", "bfloat16", None, False, "float32",
              "pure bfloat16 weights, gradients and activations, AdamW states in float32 (12 B a parameter)"),
    Precision("fp16", "float16", None, False, "float32",
              "pure float16 weights, gradients and activations, AdamW states in float32 (12 B a parameter; the "
              "seed's assumption)"),
    Precision("amp-bf16", "float32", "bfloat16", False, "float32",
              "PyTorch autocast: float32 weights, gradients and AdamW states (16 B a parameter); matmuls, linears "
              "and attention in bfloat16, softmax, norms, the loss and the logits it reads in float32"),
    Precision("amp-fp16", "float32", "float16", False, "float32",
              "PyTorch autocast: float32 weights, gradients and AdamW states (16 B a parameter); matmuls, linears "
              "and attention in float16, softmax, norms, the loss and the logits it reads in float32"),
    Precision("mixed-bf16", "bfloat16", None, True, "float32",
              "Megatron/DeepSpeed mixed precision: bfloat16 weights and activations, float32 main gradients, master "
              "weights and AdamW states (18 B a parameter)"),
    Precision("mixed-fp16", "float16", None, True, "float32",
              "Megatron/DeepSpeed mixed precision: float16 weights and activations, float32 main gradients, master "
              "weights and AdamW states (18 B a parameter)"),
    Precision("fp64", "float64", None, False, "float64", "float64 throughout (gradient checks)"),
)}


def precision_of(name_or_dtype: str) -> Precision:
    """A PRECISIONS entry by name, or the pure precision of a dtype ("float16" -> fp16, "bfloat16" -> bf16)."""
    by_dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}
    name = by_dtype.get(name_or_dtype, name_or_dtype)
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name_or_dtype!r}: choose {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


_ATTENTION = {"explicit": "explicit", "flash": "chunked", "chunked": "chunked"}  # a run's attention -> the op's


def _described(shape, precision: str | None):
    """(the Precision or None, the shape with the dtype its values take: autocast's half, else the weights')."""
    if precision is None:
        return None, shape
    p = precision_of(precision)
    return p, dataclasses.replace(shape, dtype=p.autocast or p.weights)


def _autocast(precision: Precision | None):
    """The precision's autocast block, or nothing."""
    return autocast(precision.autocast) if precision is not None and precision.autocast else contextlib.nullcontext()


def build_model(shape, attention: str = "explicit"):
    """The engine's model of a shape, on the active backend: nn.GPT for a GPTShape, nn.Llama for a LlamaShape;
    attention "explicit" (the [B, H, T, T] weights kept) or "flash" (the chunked op: none kept, as FlashAttention)."""
    if attention not in _ATTENTION:
        raise ValueError(f"attention must be 'explicit' or 'flash', got {attention!r}")
    impl = _ATTENTION[attention]
    if isinstance(shape, LlamaShape):
        return nn.Llama(shape.vocab_size, shape.block_size, shape.n_layer, shape.n_head, shape.d_model,
                        n_kv_head=shape.n_kv_head, ffn_hidden=shape.ffn_hidden, rope_theta=shape.rope_theta,
                        norm_eps=shape.norm_eps, tie_embeddings=shape.tie_embeddings, n_experts=shape.n_experts,
                        experts_per_token=shape.experts_per_token, dropout=shape.dropout, attention=impl)
    return nn.GPT(shape.vocab_size, shape.block_size, shape.n_layer, shape.n_head, shape.d_model,
                  dropout=shape.dropout, attention=impl)


def _set_up(model, precision: Precision | None, optimizer: str, state_dtype):
    """The model in the precision's weights, its optimizer ("adamw", "sgd" or "none") as the precision keeps it."""
    if precision is None:  # the shape's dtype, AdamW states in `state_dtype` (as before precisions)
        weights, master, states = None, False, state_dtype
    else:
        weights, master, states = precision.weights, precision.master, np.dtype(precision.states)
    if weights is not None and weights != "float32":
        model.to(np.dtype(weights))
    params = model.parameters()
    for p in params if master else ():
        p.grad_dtype = np.dtype(np.float32)  # the main gradient
    return {"adamw": lambda: optim.AdamW(params, state_dtype=states, master_weights=master),
            "sgd": lambda: optim.SGD(params, lr=0.1, master_weights=master), "none": lambda: None}[optimizer]()


class MeasuredStep:
    """A model and its optimizer, one training step already taken, that runs one more step under a Ledger: the
    step a long run repeats (a "measured steady step"). A subclass says how a step runs (`_step`: forward, backward,
    the optimizer's step) and holds `model`, `opt` and `backend_name`.

    The idea is written five times in the house, and only these two (SteadyStep, ParallelStep) share this base:
    torch_bridge's TorchStep is the record of a PyTorch forward + backward (what its meter saw, no optimizer, no
    Ledger) and saves.timed_step the function that takes it; lessons/_common.engine_step is the lessons' plain
    ledger of one forward + backward of a model with data, no optimizer and no first step. What they share is only
    "run once, under a meter"; their meters (a Ledger, torch's saved-tensor hooks) and what a step is differ."""

    def measure(self, checkpoint=None) -> tuple[Ledger, float]:
        """(ledger, seconds) of one step with `checkpoint`: None or "none", "every_layer", "sqrt", a number of
        segments, "selective" (Korthikanti's policy in every block), a Policy or a planner Plan; its zero_grad
        included (the optimizer's phase frees the gradients)."""
        self.model.checkpoint = {"none": None, "selective": korthikanti_selective}.get(checkpoint, checkpoint) \
            if isinstance(checkpoint, str) else checkpoint
        with using_backend(self.backend_name):
            gc.collect()  # garbage of earlier work is no part of this step (the ledger would count it, untouched)
            t0 = time.perf_counter()
            with Ledger() as led:
                self._step()
                if self.opt is not None:
                    self.opt.zero_grad()
            return led, time.perf_counter() - t0


class SteadyStep(MeasuredStep):
    """The model of `shape` (a GPTShape or a LlamaShape) and its optimizer ("adamw", "sgd" or "none"), one training
    step already taken; `precision` (a PRECISIONS name; None: the shape's dtype with `state_dtype` states),
    `attention` ("explicit" or "flash") and `saves` (what framework's saves: save_profiles.saves_like; None: the
    tg.saves_like in effect where the step is made) say how the run keeps its numbers."""

    def __init__(self, shape, optimizer: str = "adamw", state_dtype=np.float32, backend_name="meta",
                 precision: str | None = None, attention: str = "explicit", saves: str | None = None):
        if optimizer not in ("adamw", "sgd", "none"):
            raise ValueError(f"SteadyStep: optimizer must be 'adamw', 'sgd' or 'none', got {optimizer!r}")
        self.precision, shape = _described(shape, precision)
        saves = state.local.saves if saves is None else saves
        self.shape, self.backend_name, self.saves, self.attention = shape, backend_name, saves, attention
        with using_backend(backend_name):
            backend.manual_seed(0)
            self.model = build_model(shape, attention)
            if self.precision is None and shape.dtype != "float32":
                self.model.to(np.dtype(shape.dtype))
            self.opt = _set_up(self.model, self.precision, optimizer, state_dtype)
            self.idx = backend.xp().zeros((shape.batch, shape.seq_len), dtype=np.int64)
            if self.opt is not None:
                self._step()
                self.opt.zero_grad()

    def _step(self) -> None:
        with saves_like(self.saves):
            with _autocast(self.precision):
                _, loss = self.model(self.idx, self.idx)
            loss.backward()
        if self.opt is not None:
            self.opt.step()



class ParallelStep(MeasuredStep):
    """One device of a parallel run (parallel.DeviceShard: device 0, the first pipeline stage), one training step
    already taken. `measure(checkpoint)` runs one more step under a Ledger: the 1F1B schedule over the
    microbatches when pipelined, then the optimizer step. ZeRO is applied to the measurement afterwards
    (`zero_view`).

    1F1B (v = 1): p - 1 forwards to warm up, then one forward and one backward at a time, so p microbatches are
    in flight at most. Interleaved 1F1B (v model chunks a device, Megatron's schedule): forward k runs chunk
    (k // p) mod v, 2(p - 1) + (v - 1)p of them to warm up, so the first device holds L(1 + (p - 1)/(p·v))
    layers' activations instead of L. A chunk after the first starts from the activation the last stage sent
    (a leaf that takes a gradient); each stage output's gradient arrives as zeros of its shape. With
    `deallocate_outputs` (Megatron's deallocate_output_tensor, Korthikanti et al. 2022 appendix B) a stage output
    gives up its data once sent: the next stage holds it, and its backward needs only the graph."""

    def __init__(self, shape: GPTShape, par, optimizer: str = "adamw", state_dtype=np.float32, backend_name="meta",
                 deallocate_outputs: bool = True, precision: str | None = None, attention: str = "explicit",
                 saves: str | None = None):
        from .parallel import DeviceShard

        if optimizer not in ("adamw", "sgd", "none"):
            raise ValueError(f"ParallelStep: optimizer must be 'adamw', 'sgd' or 'none', got {optimizer!r}")
        par.check(shape)
        self.precision, shape = _described(shape, precision)
        saves = state.local.saves if saves is None else saves
        self.shape, self.par, self.backend_name, self.saves, self.attention = shape, par, backend_name, saves, attention
        self.deallocate_outputs = deallocate_outputs
        with using_backend(backend_name):
            backend.manual_seed(0)
            self.model = DeviceShard(shape, par, attention=_ATTENTION[attention])
            if self.precision is None and shape.dtype != "float32":
                self.model.to(np.dtype(shape.dtype))
            self.opt = _set_up(self.model, self.precision, optimizer, state_dtype)
            micro = shape.batch // par.microbatches
            self.idx = backend.xp().zeros((micro, shape.seq_len), dtype=np.int64)
            if self.opt is not None:
                self._step()
                self.opt.zero_grad()

    def _forward(self, chunk: int = 0):
        if chunk == 0:
            out, loss = self.model(self.idx, self.idx)
            out = out if loss is None else loss
        else:  # the activation the last stage sent, [B, T(/t), d]
            s, t = self.shape, self.par.tensor
            rows = s.seq_len // t if self.par.sequence else s.seq_len
            width = self.model.transformer.wte.weight.dtype  # the residual stream's dtype
            received = Tensor(backend.xp().zeros((self.idx.shape[0], rows, s.d_model), dtype=width),
                              requires_grad=True, name=f"received.chunk{chunk}")
            out = self.model.run_chunk(received, chunk)
        if self.par.pipeline > 1 and self.deallocate_outputs:  # sent on: keep the graph, not the values
            out.data = backend.zeros_view(out.shape, out.dtype)
        return out

    def _backward(self, out) -> None:
        if out.size == 1:
            out.backward()
        else:  # a pipeline stage: the next stage sends the gradient of its output
            out.backward(backend.xp().zeros(out.shape, dtype=out.dtype))

    def _step(self) -> None:
        in_flight = [[] for _ in range(self.par.virtual)]  # per chunk, oldest first
        with saves_like(self.saves):
            for kind, chunk in pipeline_schedule(self.par):
                if kind == "F":
                    with _autocast(self.precision):
                        in_flight[chunk].append(self._forward(chunk))
                else:
                    self._backward(in_flight[chunk].pop(0))
        if self.opt is not None:
            self.opt.step()

    def zero_events(self, led: Ledger) -> list:
        """The ledger's events as this device holds them under ZeRO stage z over d replicas: optimizer states ÷ d
        (z ≥ 1), the parameters' gradients ÷ d (z ≥ 2), parameters ÷ d (z = 3); everything else as measured.
        (ZeRO's gather and reduce-scatter buffers are not modelled.) Records with seq, action, nbytes, category,
        buffer, from_category and name: what cuda_allocator.trace_events reads."""
        z, d = self.par.zero, self.par.data
        params = {p.name for p in self.model.parameters()}

        def share(e) -> float:
            if e.category == "optimizer" and z >= 1 or e.category == "parameter" and z >= 3:
                return 1 / d
            return 1 / d if e.category == "gradient" and z >= 2 and e.tensor in params else 1

        return [ZeroEvent(e.seq, e.action, round(e.nbytes * share(e)), e.category, e.buffer, e.from_category, e.name)
                for e in led.events]

    def zero_view(self, led: Ledger) -> dict:
        """Per-device peak bytes of each category and of their sum over the step, under ZeRO (zero_events)."""
        live, held, peak, total, top = {}, dict.fromkeys(CATEGORIES, 0), dict.fromkeys(CATEGORIES, 0), 0, 0
        for e in self.zero_events(led):
            if e.buffer < 0:
                continue
            if e.buffer in live:
                category, n = live.pop(e.buffer)
                held[category] -= n
                total -= n
                if e.action == "released":
                    continue
            if e.action != "released":
                live[e.buffer] = (e.category, e.nbytes)
                held[e.category] += e.nbytes
                total += e.nbytes
                peak[e.category] = max(peak[e.category], held[e.category])
                top = max(top, total)
        return {**peak, "peak": top}


class ZeroEvent(NamedTuple):
    """One ledger event as a device holds it under ZeRO (ParallelStep.zero_events)."""

    seq: int
    action: str
    nbytes: int
    category: str
    buffer: int
    from_category: str
    name: str


def pipeline_schedule(par) -> list[tuple[str, int]]:
    """Device 0's order of ("F" | "B", model chunk) over a step: 1F1B (p - 1 forwards to warm up), or with
    par.virtual = v > 1 Megatron-core's interleaved 1F1B (forward k runs chunk (k // p) mod v, backward k chunk
    v - 1 - (k // p) mod v; 2(p - 1) + (v - 1)p forwards to warm up, all of them if that is every one)."""
    p, m, v = par.pipeline, par.microbatches, par.virtual
    units = m * v
    warmup = min(units, p - 1 if v == 1 else 2 * (p - 1) + (v - 1) * p)
    forward = [(k // p) % v for k in range(units)]
    backward = [v - 1 - (k // p) % v for k in range(units)]
    order = [("F", c) for c in forward[:warmup]]
    for k in range(units - warmup):
        order += [("F", forward[warmup + k]), ("B", backward[k])]
    return order + [("B", c) for c in backward[units - warmup:]]


def in_flight(par, chunk: int = 0) -> int:
    """Microbatches of model chunk `chunk` device 0 holds when its first backward starts."""
    order = pipeline_schedule(par)
    first = next(i for i, (kind, _) in enumerate(order) if kind == "B")
    return sum(1 for kind, c in order[:first] if c == chunk)


class Estimate(NamedTuple):
    """One measured steady step of a shape: the ledger, the step's seconds, the seconds to build the model and take
    the first step (the optimizer states), and the parameters in all and those a token runs through."""

    shape: object
    ledger: Ledger
    seconds: float
    setup_seconds: float
    parameters: int
    active_parameters: int


def estimate_step(shape, checkpoint=None, optimizer: str = "adamw", state_dtype=np.float32,
                  backend_name: str = "meta", precision: str | None = None, attention: str = "explicit",
                  saves: str | None = None) -> Estimate:
    """Build the model of `shape` (estimate.preset gives published ones), take a first step, and measure the next one
    under `checkpoint` (see SteadyStep, which reads precision, attention and saves): what `tinygrad-ckpt estimate
    --model NAME` reports."""
    t0 = time.perf_counter()
    step = SteadyStep(shape, optimizer, state_dtype, backend_name, precision, attention, saves)
    setup = time.perf_counter() - t0
    led, seconds = step.measure(checkpoint)
    return Estimate(shape, led, seconds, setup, parameter_count(shape), active_parameter_count(shape))


def saved_after_forward(led: Ledger, module: str = "") -> dict:
    """{buffer id: its last forward event (an Event)} of the activations still held when the first backward
    starts (what a forward keeps for backward: with a checkpoint, its inputs and what its policy kept), saved
    by ops in `module` or below it ("transformer.h.0": block 0; "transformer.h": every block; "": all)."""
    last = {}
    for e in led.events:
        if e.phase != "forward":
            break
        if e.buffer >= 0 and e.action != "op":
            last[e.buffer] = e
    return {k: e for k, e in last.items() if e.category == "activation" and e.action not in ("released", "freed")
            and within(e.scope, module)}


def layer_costs(plain: Ledger, every_layer: Ledger, layers: list[str], input_bytes: int) -> list[LayerCost]:
    """The planner's costs of each layer (a name `layer_of` gives, "transformer.h.0"), measured: f_k and a_k
    from a plain step (the forward FLOPs and saved bytes of the layer's ops), b_k = input_bytes, and t_k from
    a step with every layer checkpointed: f_k less the FLOPs the layer's replay ran (the tail it stopped before)."""
    saved, flops = plain.saved_breakdown(by="layer"), plain.flops_by_layer("forward")
    replayed = every_layer.flops_by_layer("recompute")
    return [LayerCost(flops[k], saved[k], input_bytes, flops[k] - replayed[k]) for k in layers]


def block_costs(blocks, x) -> list[LayerCost]:
    """The planner's costs of each block of a chain (your own model's layers: blocks[k] takes one Tensor, the output
    of blocks[k - 1], and returns one; x is blocks[0]'s input, a Tensor or an array), measured on x under a ledger:
    each block runs once plainly (f_k its forward FLOPs, a_k the bytes its ops save for backward, b_k its input's
    bytes) and once checkpointed with a backward (t_k: f_k less the FLOPs its replay ran).

    It measures apart from the caller's run (`_apart`): every gradient, the engine's RNG state and the parameters are
    as they were when it returns or raises; an open Ledger sees none of its work (its own ledgers record it, so the
    caller's peak does not include it); under no_grad it records with gradients on, as it must to measure."""
    blocks = list(blocks)
    if not blocks or not all(callable(b) for b in blocks):
        raise TypeError(f"block_costs: blocks must be a non-empty list of callables (your model's layers), got "
                        f"{[type(b).__name__ for b in blocks] or 'an empty list'}")
    h = x if isinstance(x, Tensor) else Tensor(x)
    costs = []
    with _apart() as kept_grads:
        for k, block in enumerate(blocks):
            cost, h = _block_cost(k, block, h, kept_grads)
            costs.append(cost)
    return costs


@contextlib.contextmanager
def _apart():
    """A `with` block that runs apart from the caller's run: no observer of the caller's (an open Ledger, a
    checkpoint) sees it, gradients are on, and on the way out, also by an exception, the engine's RNG state is put
    back and every leaf in the dict it yields ({id: (leaf, its .grad before)}) gets its gradient back (the same
    array: the work's backward ran with .grad None, so nothing was added into it)."""
    rng, kept_grads = backend.get_rng_state(), {}
    with state.patched(observers=[], grad_enabled=True, segments=0):
        try:
            yield kept_grads
        finally:
            for leaf, grad in kept_grads.values():
                leaf.grad = grad
            backend.set_rng_state(rng)


def _block_cost(k: int, block, h: Tensor, kept_grads: dict) -> tuple[LayerCost, Tensor]:
    """(block k's LayerCost, the next block's input, cut from this run's graph), measured on input h; the leaves
    the block reaches have their gradients set aside in kept_grads first (`_apart` puts them back)."""
    from ..recompute.checkpoint import checkpoint

    h_in = Tensor(h.data, requires_grad=True)  # a leaf of this run: a save of the block's input counts here
    with Ledger() as plain:
        out = block(h_in)
    if not isinstance(out, Tensor):
        raise TypeError(f"block_costs: blocks[{k}] returned {type(out).__name__}, not a Tensor: a chain's blocks "
                        "take and return one Tensor each")
    leaves = [*_leaves_of(out), *(block.parameters() if hasattr(block, "parameters") else ())]
    for leaf in leaves:
        if leaf is not h_in and id(leaf) not in kept_grads:
            kept_grads[id(leaf)] = (leaf, leaf.grad)
        leaf.grad = None
    with Ledger() as replayed:
        checkpoint(block, h_in).sum().backward()
    for leaf in leaves:
        leaf.grad = None  # this run's gradients: not the caller's, and not held while the next block is measured
    f = plain.flops("forward")
    cost = LayerCost(f, plain.live_bytes("activation"), int(h.data.nbytes), max(0, f - replayed.flops("recompute")))
    return cost, Tensor(out.data)


def _leaves_of(out: Tensor) -> list:
    """The leaf tensors out's graph reads that take a gradient (a block's parameters, and any other leaf it uses)."""
    from ..engine.tape import graph

    return [edge() for entry in graph([out]) for edge in entry.inputs
            if edge is not None and edge.is_leaf and edge() is not None]


def plan(blocks, x, budget, max_depth: int | None = None):
    """The checkpoint plan with the least recompute for your own chain of blocks whose activations fit `budget`
    (bytes, or a size such as "4MiB"), from costs measured on the example input x (`block_costs`; the planner is
    planner.plan_chain). Run it with tg.run_plan(blocks, x, plan); nn.GPT and nn.Llama take it as checkpoint=.
    The budget covers what the blocks save for backward (parameters, gradients and optimizer states come on top);
    one below the least any plan needs is refused with that least. max_depth caps nested checkpoints (None: any).
    It may be called inside an open Ledger (which sees none of the measuring) or under no_grad (block_costs).

        plan = tg.plan(blocks, x, budget="2MiB")   # e.g. [0:2)ckpt [2:4)ckpt [4:5)plain
        y = tg.run_plan(blocks, x, plan)
    """
    from ..recompute import planner
    from ..units import parse_bytes

    try:
        budget_bytes = budget if isinstance(budget, int) and not isinstance(budget, bool) else parse_bytes(budget)
    except (TypeError, ValueError):
        raise ValueError(f"plan: budget must be a number of bytes or a size such as '4MiB', got {budget!r}") from None
    if budget_bytes <= 0:
        raise ValueError(f"plan: budget must be positive, got {budget!r}")
    costs = block_costs(blocks, x)
    least = planner.minimum_peak_bytes(costs, max_depth=max_depth)
    if budget_bytes < least:
        raise ValueError(f"plan: no plan of these {len(costs)} blocks fits budget={budget!r} ({budget_bytes:,} B): "
                         f"the least any plan keeps is {least:,} B; raise the budget (or max_depth)")
    return planner.plan_chain(costs, budget_bytes, max_depth=max_depth)


def block_names(model) -> list[str]:
    """The module paths of a model's blocks, as the ledger's per-layer breakdown names them: transformer.h.i
    (GPT) or model.layers.i (Llama)."""
    if isinstance(model, nn.Llama):
        return [f"model.layers.{i}" for i in range(len(model.model.layers))]
    return [f"transformer.h.{i}" for i in range(len(model.transformer.h))]


class PlanSearch(NamedTuple):
    """What best_plan found: the plan (None when even the least-memory plan is over budget), its measured
    ledger, the least-memory plan's peak, and every (activation budget, plan, measured peak) it tried."""

    plan: object
    ledger: Ledger | None
    least_peak: int
    tried: list


def best_plan(step: SteadyStep, budget_bytes: int, peak=None, max_depth: int | None = 1) -> PlanSearch:
    """The plan with the least recompute whose MEASURED peak (peak(ledger); default the ledger's total peak) is
    within budget_bytes. planner.plan_chain budgets activations only (parameters, gradients and optimizer states
    are not in its model, and gradients grow while activations shrink in backward), so the activation budget is
    bisected between the least any plan of max_depth needs and keeping everything, each candidate measured by a
    step under a ledger. Costs come from two measured steps (layer_costs: plain and every layer checkpointed)."""
    from ..recompute import planner

    peak = peak or (lambda led: led.peak_bytes())
    s = step.shape
    width = np.dtype(step.model.parameters()[0].dtype).itemsize
    plain, every = step.measure(None)[0], step.measure("every_layer")[0]
    costs = layer_costs(plain, every, block_names(step.model), s.batch * s.seq_len * s.d_model * width)
    measured, tried = {}, []

    def run_at(budget):
        plan = planner.plan_chain(costs, budget, max_depth=max_depth)
        key = plan.describe()
        if key not in measured:
            led = step.measure(plan)[0]
            measured[key] = (plan, led, peak(led), led.flops("recompute"))
        tried.append((budget, measured[key][0], measured[key][2]))
        return measured[key]

    lo, hi = planner.minimum_peak_bytes(costs, max_depth=max_depth), sum(c.saved_bytes for c in costs)
    least = run_at(lo)
    if least[2] > budget_bytes:
        return PlanSearch(None, None, least[2], tried)
    best = run_at(hi)
    if best[2] <= budget_bytes:
        return PlanSearch(best[0], best[1], least[2], tried)
    best, tolerance = least, max(1, costs[0].saved_bytes // 2)
    while hi - lo > tolerance:
        mid = (lo + hi) // 2
        found = run_at(mid)
        if found[2] <= budget_bytes:
            lo = mid
            if found[3] <= best[3]:
                best = found
        else:
            hi = mid
    return PlanSearch(best[0], best[1], least[2], tried)
