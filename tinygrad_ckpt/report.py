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

import os
import statistics
from dataclasses import dataclass

from . import estimate as est
from .measure import ParallelStep, SteadyStep, saved_after_forward
from .parallel import Parallelism
from .units import format_bytes


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
