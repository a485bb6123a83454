"""What `tinygrad-ckpt estimate` and `explore` print, measured: one training step of a GPT on the meta backend
under a ledger, set beside the analytic formulas of estimate.py; lessons import it too.

    m = measure(GPTShape(n_layer=32, d_model=4096, n_head=32, seq_len=2048, batch=4))   # seconds for 7B
    print(report(m, capacity=80 * 10**9))        # peaks per category, saves per block, FLOPs, next to formulas
    print(parallel_report(shape, Parallelism(tensor=8, sequence=True), "adamw", "selective", None))
    compare_layer(led, shape, par, selective)    # one block's saves against Korthikanti et al.'s Table 2

Everything it reads from a ledger it reads from event fields (op kind, module path, layer, role, kept).
cli.py parses the arguments and calls these.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from dataclasses import dataclass

from ..memory import cuda_allocator
from ..units import format_bytes
from . import estimate as est
from .measure import ParallelStep, SteadyStep, block_names, saved_after_forward
from .measure import in_flight as _in_flight
from .parallel import Parallelism


# ---- one measured training step ------------------------------------------------------------------
@dataclass
class Measurement:
    """What one meta training step measured: the ledger, the wall time, the parameter counts, and how the run
    keeps its numbers (precision: a measure.Precision, None for the shape's dtype; attention; whose saves)."""

    shape: object
    optimizer: str
    checkpoint: object
    ledger: object
    seconds: float
    n_params: int
    active_params: int = 0
    precision: object = None
    attention: str = "explicit"
    saves: str = "engine"
    blocks: tuple = ()  # the blocks' module paths
    parameter_names: frozenset = frozenset()

    @property
    def per_layer_saved(self) -> int:
        """Bytes saved for backward per block (mean over the blocks; recomputed saves included)."""
        by_layer = self.ledger.saved_breakdown(by="layer")
        blocks = self.blocks or tuple(f"transformer.h.{i}" for i in range(self.shape.n_layer))
        by_block = [by_layer[k] for k in blocks if k in by_layer]
        return round(statistics.mean(by_block)) if by_block else 0

    @property
    def outside_blocks_saved(self) -> dict:
        """{module: bytes saved for backward} outside the blocks (embeddings, the final norm, the logits, the loss)."""
        return {k: n for k, n in self.ledger.saved_breakdown(by="layer").items() if k not in self.blocks and n}

    def gradient_peaks(self) -> tuple[int, int]:
        """(peak bytes of the parameters' gradients, peak bytes of the other gradients in flight: activations'):
        the ledger's "gradient" category split by whether the buffer is the gradient of a parameter."""
        return gradient_peaks(self.ledger, self.parameter_names)


def gradient_peaks(led, parameter_names) -> tuple[int, int]:
    """The "gradient" category's peak split in two: buffers whose tensor is a parameter (named in
    parameter_names), and the rest (gradients of activations, in flight during backward)."""
    live, held, peak = {}, [0, 0], [0, 0]
    for e in led.events:
        if e.buffer < 0:
            continue
        if e.category == "gradient" and e.action in ("existing", "allocated") and e.buffer not in live:
            kind = 0 if e.tensor in parameter_names else 1
            live[e.buffer] = (kind, e.nbytes)
            held[kind] += e.nbytes
            peak[kind] = max(peak[kind], held[kind])
        elif e.buffer in live and (e.action == "released" or e.category != "gradient"):
            kind, n = live.pop(e.buffer)
            held[kind] -= n
    return peak[0], peak[1]


def measured(step: SteadyStep, optimizer: str, checkpoint, ledger=None, seconds: float = 0.0) -> Measurement:
    """The Measurement of a SteadyStep under `checkpoint` (measured now, or the ledger given)."""
    if ledger is None:
        ledger, seconds = step.measure(checkpoint)
    return Measurement(step.shape, optimizer, checkpoint, ledger, seconds, step.model.num_parameters(),
                       est.active_parameter_count(step.shape), step.precision, step.attention, step.saves,
                       tuple(block_names(step.model)), frozenset(p.name for p in step.model.parameters()))


# ---- the device ----------------------------------------------------------------------------------
@dataclass
class DeviceFit:
    """The step on a GPU: the capacity for tensors (a devices.Device's usable bytes, or a number given), the
    peak PyTorch's caching allocator would reserve (cuda_allocator.trace_events on the ledger's events, with its
    settings), and whether it fits in those terms (the simulation runs out of memory, or not, at the capacity)."""

    capacity: int | None
    device: object  # a devices.Device, or None for a bare capacity
    settings: str
    reserved_peak: int
    allocated_peak: int
    fits: bool | None
    oom: dict | None


def device_fit(events, capacity: int | None, device=None, settings: str = "") -> DeviceFit:
    """Replay a ledger's events through the simulated allocator, at `capacity` (None: unbounded): the buffers the
    run used (what the process held before and never touched, "untouched", is no part of the run's device)."""
    events = [e for e in events if e.category != "untouched"]
    trace = cuda_allocator.trace_events(events, settings or None, capacity)
    if trace.fits:
        return DeviceFit(capacity, device, settings, trace.peak_reserved, trace.peak_allocated,
                         None if capacity is None else True, None)
    unbounded = cuda_allocator.trace_events(events, settings or None)  # what it would have reserved
    return DeviceFit(capacity, device, settings, unbounded.peak_reserved, unbounded.peak_allocated, False, trace.oom)


# ---- the report ----------------------------------------------------------------------------------
def _b(n: float) -> str:
    return f"{format_bytes(n)} ({format_bytes(n, decimal=True)})"


def _row(label: str, measured: str = "", formula: str = "", note: str = "") -> str:
    """One table row; a cell longer than its column keeps two spaces before the next."""
    cells = [(label, 36), (measured, 24), (formula, 24)]
    return ("  " + "".join(c.ljust(w) if len(c) < w - 1 else c + "  " for c, w in cells) + note).rstrip()


def _activation_formula(m: Measurement) -> tuple[int | None, str]:
    """The activation peak a formula predicts for this run (None where no formula describes it), and which."""
    s = m.shape
    if not isinstance(s, est.GPTShape):
        return None, "no closed formula for a Llama block here: see the per-block rows"
    L, v = s.n_layer, s.value_bytes
    layer_input = s.batch * s.seq_len * s.d_model * v
    if m.saves == "megatron" and m.checkpoint in ("none", "selective"):
        k22 = est.korthikanti_selective_bytes(s.seq_len, s.batch, s.d_model, v) if (
            m.checkpoint == "selective" or m.attention == "flash") else \
            est.korthikanti_bytes_per_layer(s.seq_len, s.batch, s.d_model, s.n_head, bytes_per_value=v)
        return L * k22, "layers × Korthikanti's Table 2 row" + (" (34sbh: no [T,T] terms)" if (
            m.checkpoint == "selective" or m.attention == "flash") else "")
    if m.saves != "engine" or m.attention != "explicit":
        if m.checkpoint == "every_layer":
            return None, "each block keeps its input; no formula for one block's replay under these saves"
        return None, f"no closed formula for {m.saves}'s saves with {m.attention} attention: see the per-block rows"
    engine_layer = est.engine_activation_bytes_per_layer(s)
    if m.checkpoint == "none":
        return L * engine_layer, "layers × engine per-layer count"
    if m.checkpoint == "every_layer":
        return L * layer_input + engine_layer, "layers × block input + one block replayed"
    if m.checkpoint == "selective":
        terms = est.engine_activation_terms(s)
        core = sum(n for k, n in terms.items() if k == "attn.softmax_out" or "attn_dropout" in k)
        return L * (engine_layer - core), "layers × engine count without its [B,H,T,T] terms"
    if not isinstance(m.checkpoint, (int, str)):
        return None, "a planner plan: see its predicted peak"
    segments = est.chen_optimal_segments(L, 1, 1) if m.checkpoint == "sqrt" else m.checkpoint
    return (est.chen_sqrt_peak(L, layer_input, engine_layer, segments),
            f"Chen 2016: {segments} segment inputs + {-(-L // segments)} blocks replayed")


def describe_run(m: Measurement) -> str:
    """One line: the model, its shape and how the run keeps its numbers."""
    s = m.shape
    if isinstance(s, est.LlamaShape):
        moe = f", {s.n_experts} experts ({s.experts_per_token} a token)" if s.n_experts else ""
        model = (f"Llama: {s.n_layer} layers, d_model {s.d_model}, {s.n_head} heads ({s.n_kv_head} key/value), "
                 f"ffn {s.ffn_hidden}{moe}")
    else:
        model = f"GPT: {s.n_layer} layers, d_model {s.d_model}, {s.n_head} heads"
    precision = m.precision.name if m.precision is not None else s.dtype
    return (f"{model}, seq {s.seq_len}, batch {s.batch}, vocab {s.vocab_size}, dropout {s.dropout}; precision "
            f"{precision}; {m.attention} attention; {m.saves}'s saves; optimizer {m.optimizer}; checkpoint "
            f"{_plan_text(m.checkpoint)}")


def _plan_text(checkpoint) -> str:
    return checkpoint if isinstance(checkpoint, (str, int)) else getattr(checkpoint, "describe", lambda: "custom")()


def _state_formulas(m: Measurement) -> dict:
    """Formula bytes of parameters, parameter gradients and optimizer states for the run's precision."""
    P, p = m.n_params, m.precision
    weights = est.dtype_bytes(p.weights if p is not None else m.shape.dtype)
    grads = 4 if p is not None and p.master else weights
    states = {"adamw": 2 * P * 4, "sgd": 0, "none": 0}[m.optimizer] + (P * 4 if p is not None and p.master
                                                                        and m.optimizer != "none" else 0)
    return {"parameter": P * weights, "gradient": P * grads, "optimizer": states, "weights": weights,
            "grads": grads}


def report(m: Measurement, capacity: int | None, fit: DeviceFit | None = None, assumed=(), plan=None) -> str:
    """The measured breakdown beside the formulas, as printed by `tinygrad-ckpt estimate`: `fit` adds the
    allocator's reserved peak and the device, `assumed` lists what the user did not say, `plan` a PlanSearch."""
    led = m.ledger
    lines = _run_lines(m, assumed) + _memory_lines(m, fit) + _per_block_lines(m) + _flops_lines(m)
    drift = _drifted_dtypes(m)
    if drift:
        lines += ["", f"note: some saved activations are {', '.join(drift)} although the model is {m.shape.dtype}"]
    if plan is not None:
        lines += ["", *plan_lines(plan)]
    if capacity is not None:
        lines += ["", *capacity_lines(led.peak_bytes(), capacity, fit)]
    return "\n".join(lines)


def _run_lines(m: Measurement, assumed) -> list[str]:
    """What ran: the run, the step measured, the parameter count, the precision and what was assumed."""
    s, led, P, p = m.shape, m.ledger, m.n_params, m.precision
    count = f"{P:,} ({P / 1e9:.2f} B; formula {est.parameter_count(s):,})"
    if m.active_params and m.active_params != P:
        count += f"; active a token: {m.active_params:,} ({m.active_params / 1e9:.2f} B)"
    lines = [
        describe_run(m),
        f"one steady-state training step (forward, backward, optimizer step; optimizer states already exist) "
        f"measured on the meta backend (shapes only, no data) in {m.seconds:.2f} s; {len(led.events)} ledger events",
        f"parameters: {count}",
    ]
    if p is not None:
        lines.append(f"precision {p.name}: {p.about}")
    if assumed:
        lines += ["", "assumed (not given; each has a flag):", *[f"  - {a}" for a in assumed]]
    return lines


def _memory_lines(m: Measurement, fit: DeviceFit | None) -> list[str]:
    """The peak of each memory category, measured beside its formula (and the allocator's reserved peak)."""
    led, p = m.ledger, m.precision
    act_formula, act_source = _activation_formula(m)
    formulas = _state_formulas(m)
    param_grads, flight_grads = m.gradient_peaks()
    opt_note = {
        "adamw": "m and v in float32" + (" + the float32 master copy" if p is not None and p.master else ""),
        "sgd": "plain SGD keeps no state" + (" (a float32 master copy)" if p is not None and p.master else ""),
        "none": "no optimizer step",
    }[m.optimizer]
    lines = [
        "",
        "memory (peak of each category)        measured by the ledger  formula",
        _row("parameters", _b(led.peak_bytes("parameter")), _b(formulas["parameter"]),
             f"params × {formulas['weights']} B"),
        _row("parameter gradients", _b(param_grads), _b(formulas["gradient"]), f"params × {formulas['grads']} B"
             + (" (float32 main gradients; measured: also a parameter's half gradient until it is added in, "
                "which Megatron's fused accumulation never holds)" if p is not None and p.master else "")),
        _row("activation gradients (in flight)", _b(flight_grads), "", "backward's gradients of activations"),
        _row("gradients (both, at once)", _b(led.peak_bytes("gradient"))),
        _row("optimizer states", _b(led.peak_bytes("optimizer")), _b(formulas["optimizer"]), opt_note),
        _row("activations (saved for backward)", _b(led.peak_bytes("activation")),
             "" if act_formula is None else _b(act_formula), act_source),
        _row("other (live outputs and inputs)", _b(led.peak_bytes("other"))),
        _row("total peak", _b(led.peak_bytes())),
    ]
    if fit is not None:
        conf = f", {fit.settings}" if fit.settings else ""
        lines.append(_row("reserved (PyTorch's allocator)", _b(fit.reserved_peak), "",
                          f"cuda_allocator.trace_events over the ledger's buffers{conf}"))
    return lines


def _per_block_lines(m: Measurement) -> list[str]:
    """The activations saved per block, measured and by each published formula (for a GPT), times the layers."""
    s = m.shape
    B, T, d, H, L, v = s.batch, s.seq_len, s.d_model, s.n_head, s.n_layer, s.value_bytes
    outside = m.outside_blocks_saved
    lines = ["", "activations saved per block            bytes                   × layers",
             _row("measured (ledger, mean over blocks)", f"{m.per_layer_saved:,}", format_bytes(L * m.per_layer_saved),
                  {"none": "", "selective": "kept in forward + saved by the replays"}.get(
                      m.checkpoint, "saved by the replays, in backward") if isinstance(m.checkpoint, str) else "")]
    if isinstance(s, est.GPTShape):
        engine_layer = est.engine_activation_bytes_per_layer(s)
        seed_layer = est.seed_activation_bytes_per_layer(B, T, d, v)
        k22_layer = est.korthikanti_bytes_per_layer(T, B, d, H, bytes_per_value=v)
        lines += [
            _row("engine (engine_activation_terms)", f"{engine_layer:,}", format_bytes(L * engine_layer),
                 "this engine's saves, explicit attention"),
            _row("seed: 12·B·T·d·bytes", f"{seed_layer:,}", format_bytes(L * seed_layer)),
            _row("Korthikanti 2022: sbh(34+5as/h)", f"{k22_layer:,}", format_bytes(L * k22_layer),
                 f"at {v} B per value, 1 B per dropout-mask element"),
            _row("Korthikanti selective / full", f"{est.korthikanti_selective_bytes(T, B, d, v):,}",
                 format_bytes(L * est.korthikanti_selective_bytes(T, B, d, v)),
                 f"full recompute: {format_bytes(L * est.korthikanti_full_recompute_bytes(T, B, d, v))}")]
    if outside:
        top = ", ".join(f"{k or '(top level)'} {format_bytes(n)}" for k, n in
                        sorted(outside.items(), key=lambda kv: -kv[1])[:3])
        lines.append(_row("outside the blocks (measured)", f"{sum(outside.values()):,}", "",
                          f"not in the per-block formulas: {top}"))
    return lines


def _flops_lines(m: Measurement) -> list[str]:
    """FLOPs of each phase, measured over every op, beside the matmul-only formulas."""
    s, led = m.shape, m.ledger
    lines = ["", "FLOPs                                 measured (every op)     formula (matmuls only)"]
    if isinstance(s, est.GPTShape):
        recompute = {"none": "none", "selective": "selective"}.get(m.checkpoint, "full") \
            if isinstance(m.checkpoint, str) else "full"
        fwd = est.gpt_forward_flops(s)
        lines += [
            _row("forward", f"{led.flops('forward'):.4e}", f"{fwd:.4e}"),
            _row("backward", f"{led.flops('backward'):.4e}", f"{2 * fwd:.4e}"),
            _row("recompute", f"{led.flops('recompute'):.4e}",
                 f"{est.gpt_training_flops(s, recompute) - 3 * fwd:.4e}",
                 "formula: a whole forward [C16]; a replay stops before its last linear and add"
                 if recompute == "full" else ""),
            _row("total", f"{led.flops():.4e}", f"{est.gpt_training_flops(s, recompute):.4e}")]
    else:
        B, T, d = s.batch, s.seq_len, s.d_model
        fwd = s.n_layer * sum(est.llama_forward_flops_terms(s).values()) + 2 * B * T * d * s.vocab_size
        lines += [_row("forward", f"{led.flops('forward'):.4e}", f"{fwd:.4e}", "blocks (k experts a token) + lm_head"),
                  _row("backward", f"{led.flops('backward'):.4e}", f"{2 * fwd:.4e}"),
                  _row("recompute", f"{led.flops('recompute'):.4e}"),
                  _row("total", f"{led.flops():.4e}")]
    return lines


def _drifted_dtypes(m: Measurement) -> list[str]:
    """Floating dtypes of saved activations other than the model's values' (none under autocast, which mixes)."""
    p = m.precision
    values = m.shape.dtype if p is None or not p.autocast else None
    return sorted({e.dtype for e in m.ledger.events if e.action == "saved" and e.dtype.startswith("float")
                   and values and e.dtype != values})


def plan_lines(search) -> list[str]:
    """What best_plan found, in lines: the plan, its measured peak, what was tried."""
    if search.plan is None:
        return [f"budget: no plan fits; the least-memory plan peaks at {_b(search.least_peak)}"]
    peak = max(pk for _, plan, pk in search.tried if plan is search.plan)
    return [f"budget: the planner's plan with the least recompute that fits, measured: peak {_b(peak)}",
            f"  plan {search.plan.describe()}",
            f"  ({len({p.describe() for _, p, _ in search.tried})} plans measured; the least-memory one peaks at "
            f"{format_bytes(search.least_peak)})"]


def run_summary(m: Measurement, fit: DeviceFit | None = None, assumed=(), plan=None, view: dict | None = None) -> dict:
    """One object: what `estimate --json` prints (bytes as integers). `view`: per-category peaks to report in
    place of the ledger's (ZeRO's shares)."""
    led = m.ledger
    param_grads, flight_grads = m.gradient_peaks()
    peaks = {c: led.peak_bytes(c) for c in ("parameter", "gradient", "optimizer", "activation", "other")}
    total = led.peak_bytes()
    if view is not None:
        peaks, total = {c: view[c] for c in peaks}, view["peak"]
    out = {
        "model": describe_run(m),
        "shape": {k: v for k, v in dataclasses.asdict(m.shape).items()} | {"arch": getattr(m.shape, "arch", "gpt2")},
        "precision": m.precision.name if m.precision is not None else m.shape.dtype,
        "attention": m.attention, "saves": m.saves, "optimizer": m.optimizer, "checkpoint": _plan_text(m.checkpoint),
        "parameters": m.n_params, "active_parameters": m.active_params or m.n_params,
        "peak_bytes": total, "peak_bytes_by_category": peaks,
        "parameter_gradient_bytes": param_grads, "activation_gradient_bytes": flight_grads,
        "per_layer_saved_bytes": m.per_layer_saved,
        "reserved_peak_bytes": None if fit is None else fit.reserved_peak,
        "capacity_bytes": None if fit is None else fit.capacity,
        "device": None if fit is None or fit.device is None else fit.device.name,
        "fits": None if fit is None or fit.capacity is None else bool(fit.fits and total <= fit.capacity),
        "fits_allocated": None if fit is None or fit.capacity is None else total <= fit.capacity,
        "assumptions": list(assumed), "seconds": round(m.seconds, 3),
    }
    if plan is not None:
        out["plan"] = None if plan.plan is None else plan.plan.describe()
    return out


# ---- one device of many -------------------------------------------------------------------------------
def parallel_report(shape: est.GPTShape, par: Parallelism, optimizer: str, checkpoint, capacity: int | None,
                    device=None, alloc_conf: str = "", assumed=(), as_json: bool = False, precision: str | None = None,
                    attention: str = "explicit", saves: str = "engine") -> str:
    """One device's share measured on the meta backend, beside Korthikanti et al. 2022, Table 2 (or, as_json,
    the JSON object of `estimate --json`, per device)."""
    step = ParallelStep(shape, par, optimizer, precision=precision, attention=attention, saves=saves)
    led, seconds = step.measure(checkpoint)
    view = step.zero_view(led)
    m = Measurement(step.shape, optimizer, checkpoint, led, seconds, step.model.num_parameters(),
                    step.model.num_parameters(), step.precision, attention, saves,
                    tuple(f"transformer.h.{i}" for i in range(len(step.model.transformer.h))),
                    frozenset(p.name for p in step.model.parameters()))
    fit = device_fit(step.zero_events(led) if par.zero else led.events, capacity, device, alloc_conf)
    layer = full_recompute_layer(led, step.shape, par) if checkpoint == "every_layer" else \
        compare_layer(led, step.shape, par, checkpoint == "selective", attention)
    if as_json:  # the fields the text prints: one layer's saves as the Table 2 section measures them
        return json.dumps(run_summary(m, fit, assumed, view=view) | {
            "parallelism": par.describe(), "per_layer_saved_bytes": layer.measured, "table_2": {
                "measured_bytes": layer.measured, "formula": layer.formula_text, "formula_bytes": layer.formula,
                "terms": {label: n for label, n, _ in layer.explained if n}, "unexplained_bytes": layer.unexplained}})
    lines = _shard_run_lines(m, par, seconds, assumed) + _shard_memory_lines(m, par, view, fit)
    if checkpoint == "every_layer":
        lines += ["", *_full_recompute_lines(layer, par)]
    else:
        lines += ["", *korthikanti_comparison(layer, step.shape)]
    if par.pipeline > 1:
        lines += ["", pipeline_note(led, step.shape, par)]
    if capacity is not None:
        lines += ["", *capacity_lines(view["peak"] if par.zero else led.peak_bytes(), capacity, fit,
                                      "per-device peak")]
    return "\n".join(lines)


def _shard_run_lines(m: Measurement, par: Parallelism, seconds: float, assumed) -> list[str]:
    """What ran: the run, device 0's share of the layers, heads and batch, and what was assumed."""
    shape = m.shape
    b, a, L = shape.batch // par.microbatches, shape.n_head, shape.n_layer
    t, p, v = par.tensor, par.pipeline, par.virtual
    stage = f"the first of {p} pipeline stages, " if p > 1 else ""
    chunks = f" in {v} chunks" if v > 1 else ""
    lines = [
        describe_run(m),
        f"{par.describe()}: device 0 ({stage}{L // p} layers{chunks}, {a // t} of {a} heads, microbatch {b}; "
        f"{m.n_params:,} parameters) measured on the meta backend in {seconds:.2f} s",
    ]
    if assumed:
        lines += ["", "assumed (not given; each has a flag):", *[f"  - {x}" for x in assumed]]
    return lines


def _shard_memory_lines(m: Measurement, par: Parallelism, view: dict, fit: DeviceFit) -> list[str]:
    """Device 0's peak of each category (and ZeRO's shares of them), its total and reserved peaks."""
    led = m.ledger
    param_grads, flight_grads = m.gradient_peaks()
    zero = "" if not par.zero else f"with ZeRO-{par.zero} over {par.data} (÷{par.data} from the measurement)"
    lines = ["", _row("per device (peak of each category)", "measured", zero)]
    for label, cat, n in (("parameters", "parameter", None), ("parameter gradients", None, param_grads),
                          ("activation gradients (in flight)", None, flight_grads),
                          ("gradients (both, at once)", "gradient", None),
                          ("optimizer states", "optimizer", None),
                          ("activations (saved for backward)", "activation", None),
                          ("other (live outputs and inputs)", "other", None)):
        lines.append(_row(label, _b(led.peak_bytes(cat) if n is None else n), _b(view[cat]) if par.zero and cat
                          else ""))
    lines.append(_row("total peak", _b(led.peak_bytes()), _b(view["peak"]) if par.zero else ""))
    lines.append(_row("reserved (PyTorch's allocator)", _b(fit.reserved_peak), "",
                      "simulated over the device's buffers" + (" (ZeRO's shares)" if par.zero else "")))
    return lines


def full_recompute_layer(led, shape: est.GPTShape, par: Parallelism) -> LayerComparison:
    """What one layer holds under full recompute when backward starts, beside Table 2's 2sbh (/t when split)."""
    s, b, h, t = shape.seq_len, shape.batch // par.microbatches, shape.d_model, par.tensor
    block0 = saved_after_forward(led, "transformer.h.0")
    kept = sum(e.nbytes for e in block0.values()) // _in_flight(par)
    full = est.korthikanti_full_recompute_bytes(s, b, h, shape.value_bytes) // (t if par.sequence else 1)
    return LayerComparison(kept, full, "2sbh" + ("/t (split)" if par.sequence else ""), [], kept - full)


def _full_recompute_lines(c: LayerComparison, par: Parallelism) -> list[str]:
    return ["activations of one layer under full recompute (held when backward starts):",
            _row("measured (ledger, block 0)", f"{c.measured:,}"),
            _row(f"K22 Table 2: {c.formula_text}", f"{c.formula:,}",
                 "", "the block input" + ("; sequence parallelism splits it by t" if par.sequence else "")),
            _row("  unexplained", f"{c.unexplained:+,}", "", "(agrees exactly)" if c.unexplained == 0 else "")]


def pipeline_note(led, shape, par) -> str:
    """What device 0's blocks hold when its first backward starts, beside Korthikanti's L(1 + (p - 1)/(p·v))."""
    L, p, v = shape.n_layer, par.pipeline, par.virtual
    per_layer = sum(e.nbytes for e in saved_after_forward(led, "transformer.h.0").values()) // _in_flight(par)
    blocks = sum(e.nbytes for e in saved_after_forward(led, "transformer.h").values())
    layers = blocks / per_layer if per_layer else 0
    if v == 1:
        n = _in_flight(par)
        return (f"pipeline (1F1B): the first stage holds {n} microbatches in flight when its first backward starts: "
                f"its blocks keep {format_bytes(blocks)} = {n} × {L // p} layers × {format_bytes(per_layer)} (one "
                f"layer, one microbatch); Korthikanti: p microbatches × L/p layers = the activations of all {L} "
                f"layers, {format_bytes(L * per_layer)}")
    formula = L * (1 + (p - 1) / (p * v))
    return (f"pipeline (interleaved 1F1B, {v} chunks a device): when its first backward starts the first device's "
            f"blocks keep {format_bytes(blocks)} = {layers:g} layer-microbatches × {format_bytes(per_layer)}; "
            f"Korthikanti: L(1 + (p - 1)/(p·v)) = {formula:g} layers' activations, {format_bytes(formula * per_layer)}"
            f"; stage outputs given up once sent (Megatron's deallocate_output_tensor)")


def capacity_lines(peak: int, capacity: int, fit: DeviceFit | None, what: str = "total peak") -> list[str]:
    """The verdict at a capacity: the ledger's peak (allocated), and the allocator's reserved peak."""
    verdict = (f"fits, {format_bytes(capacity - peak)} to spare" if peak <= capacity
               else f"does NOT fit: {format_bytes(peak - capacity)} over")
    where = ""
    if fit is not None and fit.device is not None:
        where = (f"{fit.device.name} ({format_bytes(fit.device.total_bytes)} reported, less "
                 f"{format_bytes(fit.device.overhead_bytes)} for CUDA's context and workspaces): ")
    lines = [f"capacity {where}{_b(capacity)}", f"  allocated: {what} {_b(peak)} {verdict}"]
    if fit is not None:
        lines.append(f"  reserved:  peak {_b(fit.reserved_peak)} " + (
            f"fits, {format_bytes(capacity - fit.reserved_peak)} to spare" if fit.fits else
            f"does NOT fit: the allocator runs out at {fit.oom['name']!r} (it would reserve "
            f"{format_bytes(fit.reserved_peak)})"))
    return lines


@dataclass
class LayerComparison:
    """One layer's saves (one microbatch, held when backward starts) beside [K22] Table 2: the formula, the
    difference and its terms (label, bytes, why), each measured from the ledger; `unexplained` is what is left."""

    measured: int
    formula: int
    formula_text: str
    explained: list
    unexplained: int


def compare_layer(led, shape: est.GPTShape, par: Parallelism, selective: bool,
                  attention: str = "explicit") -> LayerComparison:
    """Block h.0's saves beside [K22] Table 2, the difference term by term: measured, not assumed, so it follows
    any change in what the engine saves. Flash attention keeps no [T, T] array: it is set beside the selective
    row (the paper's attention core recomputed)."""
    s, b, h, a, v = shape.seq_len, shape.batch // par.microbatches, shape.d_model, shape.n_head, shape.value_bytes
    t, sp = par.tensor, par.sequence
    selective = selective or attention == "flash"
    in_flight = _in_flight(par)
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
    kept_input = sum(e.nbytes for e in saves.values() if e.op == "checkpoint" and e.role == "input0") // in_flight
    # Under a selective policy, layer norms that keep their input (PyTorch's, Megatron's) find it kept for them:
    # ln_2's is the residual sum the policy keeps as an output, ln_1's the block input the checkpoint keeps.
    kept_sums = sum(e.nbytes for e in saves.values() if e.op == "add" and e.kept and e.role == "output") // in_flight
    norms_read_input = selective and attention != "flash" and kept_sums > 0
    norms = measured_by("layer_norm") + (kept_sums + kept_input if norms_read_input else 0)
    explained = [("layer norms", norms - terms["layernorms"],
                  "their inputs, kept for them (ln_1's: the block input the checkpoint keeps; ln_2's: the residual "
                  "sum the policy keeps), and any mean or 1/std, minus the paper's inputs" if norms_read_input else
                  "the ledger's layer-norm saves minus the paper's inputs (the engine's keep 1/std and the output, "
                  "which is the next linear's input, a term of the paper's; PyTorch's the input, mean and 1/std)"),
                 ("causal mask [T, T]", measured_by("masked_fill"), "the paper's attention keeps no mask"),
                 ("dropout masks", measured_by("dropout") - masks,
                  "dropout is 0: no masks kept" if shape.dropout == 0 else
                  "the ledger's masks minus the paper's (1 B an element)")]
    if shape.dropout == 0:
        explained.append(("no attention dropout output", -terms.get("attn.softmax_dropout_output", 0),
                          "dropout is 0: A·V reads the softmax output itself"))
    copies = sum(e.nbytes for e in saves.values() if e.role == "weight") // in_flight
    if copies:
        explained.append(("autocast's half copies of weights", copies,
                          "each use casts its weight; the linear keeps the copy for backward (PyTorch's too)"))
    if attention == "flash":
        qkv = terms["attn.q_and_k"] + terms["attn.v"]
        explained.append(("flash attention's output, log-sum-exp", measured_by("chunked_attention") - qkv,
                          "besides q, k, v it keeps its output (c_proj keeps that again, transposed: a copy) and a "
                          "log-sum-exp a row"))
    elif norms_read_input:
        explained.append(("c_proj input, rebuilt", -terms["attn.proj_input"],
                          "not kept: the replay rebuilds it from the q, k, v the policy keeps"))
    elif selective and not sp:
        explained.append(("block input vs c_proj input", kept_input - terms["attn.proj_input"],
                          "the checkpoint keeps the block input whole; the replay rebuilds c_proj's input (÷t)"))
    k22 = sum(terms.values())
    return LayerComparison(measured, k22, text, explained, measured - k22 - sum(n for _, n, _ in explained))


def korthikanti_comparison(c: LayerComparison, shape: est.GPTShape) -> list[str]:
    """compare_layer's result as the report's lines."""
    lines = [f"activations of one layer, one microbatch (held when backward starts), {shape.value_bytes} B values, "
             "1 B masks:",
             _row("measured (ledger, block 0)", f"{c.measured:,}"),
             _row(f"K22 Table 2: {c.formula_text}", f"{c.formula:,}"),
             _row("difference", f"{c.measured - c.formula:+,}")]
    lines += [_row("  " + label, f"{n:+,}", "", why) for label, n, why in c.explained if n]
    lines.append(_row("  unexplained", f"{c.unexplained:+,}", "", "(agrees exactly)" if c.unexplained == 0 else ""))
    return lines



def explore(shape, optimizer: str, plans, out: str, memory_viz: bool = False, precision: str | None = None,
            attention: str = "explicit", saves: str = "engine") -> list[str]:
    """Measure one training step per checkpoint plan on the meta backend, as precision, attention and saves
    describe the run; write the explorer page (and the memory_viz snapshots). Returns the files written."""
    step = SteadyStep(shape, optimizer, precision=precision, attention=attention, saves=saves)
    ledgers = [step.measure(plan)[0] for plan in plans]
    labels = [f"checkpoint {plan}" for plan in plans]
    kind = "Llama" if isinstance(shape, est.LlamaShape) else "GPT"
    written = [ledgers[0].to_html(out, compare=ledgers[1:], labels=labels,
                                  title=f"{kind} {shape.n_layer} layers, d_model {shape.d_model}, seq {shape.seq_len}, "
                                        f"batch {shape.batch}, {precision or step.shape.dtype}, {attention} attention, "
                                        f"{saves}'s saves: one training step")]
    for plan, led in zip(plans, ledgers):
        print(f"checkpoint {plan}: peak {format_bytes(led.peak_bytes())}, {len(led.events)} ledger events")
        if memory_viz:
            path = f"{os.path.splitext(out)[0]}_{plan}.pickle"
            led.to_memory_viz(path)
            written.append(path)
    return written
