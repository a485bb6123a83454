"""Weights both ways between this engine's models and PyTorch models it did not write, by name.

    to_torch(model, gpt)                  # the engine nn.GPT's weights into a nanoGPT / HF GPT-2 / HF Llama model
    to_engine(model, gpt)                 # and back; the layout is found from the model (or layout="hf-gpt2", ...)
    engine_state(model)                   # {engine name: NumPy array} of a PyTorch model's parameters

The engine's names are nanoGPT's (nn.GPT: transformer.h.3.attn.c_attn.weight, lm_head tied to transformer.wte)
and Hugging Face's for nn.Llama (model.layers.3.self_attn.q_proj.weight). A `Layout` says how a family of PyTorch
models differs: "nanogpt" and "hf-llama" not at all; "hf-gpt2" stores the four matrices of a block in Conv1D
modules, [in, out], the transpose of a Linear's [out, in]. A model built with bias=False (nanoGPT's default) has no
biases: a zero bias is no bias, so the engine's biases are dropped when all zero (an error names any that is not)
and filled with zeros on the way back. Buffers (nanoGPT's causal mask `attn.bias`, rotary tables) are not weights.
Every name, shape and dtype is checked before anything is copied; one `WeightsMismatch` names every problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Layout:
    """How a PyTorch model family names and stores the engine's parameters: `transposed` are patterns of the
    engine names whose PyTorch weight is the transpose ([in, out])."""

    name: str
    transposed: tuple[str, ...] = ()

    def is_transposed(self, name: str) -> bool:
        return any(re.search(p, name) for p in self.transposed)


LAYOUTS = {
    "nanogpt": Layout("nanogpt"),
    "hf-gpt2": Layout("hf-gpt2", (r"\.attn\.c_attn\.weight$", r"\.attn\.c_proj\.weight$", r"\.mlp\.c_fc\.weight$",
                                  r"\.mlp\.c_proj\.weight$")),
    "hf-llama": Layout("hf-llama"),
    "engine": Layout("engine"),  # the bridge's TorchGPT / TorchLlama: the engine's own names and layouts
}


class WeightsMismatch(ValueError):
    """Names and shapes that do not line up, all of them: missing, unexpected and mismatched keys."""

    def __init__(self, what: str, missing: list, unexpected: list, mismatched: list):
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        lines = [f"{what}: {len(missing)} missing, {len(unexpected)} unexpected, {len(mismatched)} mismatched"]
        if missing:
            lines.append(f"  missing (the target has them, the weights do not): {', '.join(missing)}")
        if unexpected:
            lines.append(f"  unexpected (the weights have them, the target does not): {', '.join(unexpected)}")
        lines += [f"  mismatched {m}" for m in mismatched]
        super().__init__("\n".join(lines))


def _match(what: str, target: dict, weights: dict, fill_biases: bool, ties: list = (), owner: str = "") -> dict:
    """{name: array} to copy into `target` ({name: (shape, dtype name)}) from `weights` ({name: array}), every name,
    shape and dtype checked: a bias the target lacks is dropped if zero; one the weights lack is zeros if
    fill_biases; the names of each group in `ties` (one tied parameter of `owner`) must hold equal values.
    Raises one WeightsMismatch naming every problem."""
    missing, unexpected, mismatched, ready = [], [], [], {}
    for name, (shape, dtype) in target.items():
        if name not in weights:
            if fill_biases and name.endswith(".bias"):
                ready[name] = np.zeros(shape, dtype)
            else:
                missing.append(name)
            continue
        value = weights[name]
        if list(value.shape) != list(shape) or str(value.dtype) != dtype:
            mismatched.append(f"{name}: the target's {list(shape)} {dtype}, the weights' {list(value.shape)} "
                              f"{value.dtype}")
            continue
        ready[name] = value
    mismatched += _untied(owner, ties, ready)
    for name, value in weights.items():
        if name not in target and not (name.endswith(".bias") and not np.any(value)):
            unexpected.append(name + (" (a nonzero bias: the target has none)" if name.endswith(".bias") else ""))
    if missing or unexpected or mismatched:
        raise WeightsMismatch(what, sorted(missing), sorted(unexpected), mismatched)
    return ready


def _untied(owner: str, ties: list, ready: dict) -> list:
    """A mismatch for each tied parameter of the target whose names the weights give different values (an untied
    model's into a tied one: the last copy would overwrite the first, as the engine's load_state_dict refuses)."""
    out = []
    for names in ties:
        present = [n for n in names if n in ready]  # (a name whose shape is wrong is a mismatch already)
        for name in present[1:]:
            if not np.array_equal(ready[present[0]], ready[name]):
                out.append(f"{present[0]} and {name} name one tied parameter of {owner} but the weights hold "
                           f"different values (an untied model's); untie the target (give it its own nn.Parameter "
                           f"for {name}) or give both names the same array")
    return out


def detect_layout(model: torch.nn.Module) -> Layout:
    """The layout of `model`, from its modules and names: Conv1D blocks -> hf-gpt2; model.layers with self_attn ->
    hf-llama; transformer.h with c_attn Linears -> nanogpt (the engine's names)."""
    if any(type(m).__name__ == "Conv1D" for m in model.modules()):
        return LAYOUTS["hf-gpt2"]
    names = {n for n, _ in model.named_parameters()}
    if any(".self_attn.q_proj." in n for n in names):
        return LAYOUTS["hf-llama"]
    return LAYOUTS["nanogpt"]


def _layout(model, layout) -> Layout:
    if layout is None:
        return detect_layout(model)
    if isinstance(layout, Layout):
        return layout
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: choose one of {', '.join(LAYOUTS)} or pass a Layout")
    return LAYOUTS[layout]


def _parameters(model: torch.nn.Module) -> dict:
    """{name: parameter} under every name it has (a tied weight under both), buffers left out."""
    params = {id(p) for p in model.parameters()}
    return {n: t for n, t in model.state_dict(keep_vars=True).items() if id(t) in params}


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _engine_arrays(engine) -> dict:
    if isinstance(engine, dict):
        return engine
    if hasattr(engine, "state_dict"):
        return engine.state_dict()
    raise TypeError(f"expected an engine model or a dict {{name: array}}, got {type(engine).__name__}")


def to_torch(model: torch.nn.Module, engine, layout=None) -> None:
    """Copy the engine's weights (an engine Module or its state_dict) into `model`, by name (see the module
    docstring); everything is checked before anything is copied."""
    lay = _layout(model, layout)
    own = _parameters(model)
    weights = {k: np.asarray(v) for k, v in _engine_arrays(engine).items()
               if not (k.endswith(".attn.bias") and k not in own)}  # nanoGPT's causal-mask buffer, if saved
    weights = {k: np.ascontiguousarray(v.T) if lay.is_transposed(k) else v for k, v in weights.items()}
    target = {n: (tuple(p.shape), _dtype_name(p.dtype)) for n, p in own.items()}
    ties = {}
    for name, p in own.items():
        ties.setdefault(id(p), []).append(name)
    ready = _match(f"to_torch: into {type(model).__name__} (layout {lay.name}; transposed to [in, out]: "
                   f"{', '.join(lay.transposed) or 'none'})", target, weights, fill_biases=False,
                   ties=[sorted(names) for names in ties.values() if len(names) > 1], owner=type(model).__name__)
    with torch.no_grad():
        for name, value in ready.items():
            own[name].copy_(torch.from_numpy(np.ascontiguousarray(value)))


def engine_state(model: torch.nn.Module, layout=None) -> dict:
    """{engine name: NumPy array}: `model`'s parameters under the engine's names and layouts (a tied weight under
    each of its names), buffers left out."""
    lay = _layout(model, layout)
    out = {}
    for name, param in _parameters(model).items():
        a = param.detach().cpu().numpy().copy()
        out[name] = np.ascontiguousarray(a.T) if lay.is_transposed(name) else a
    return out


def to_engine(model: torch.nn.Module, engine, layout=None):
    """Copy `model`'s weights into the engine model `engine` and return it; the biases a bias-free model lacks are
    zeros. Everything is checked before anything is copied."""
    lay = _layout(model, layout)
    own = engine.state_dict()
    target = {n: (a.shape, str(a.dtype)) for n, a in own.items()}
    engine.load_state_dict(_match(f"to_engine: from {type(model).__name__} (layout {lay.name}) into "
                                  f"{type(engine).__name__}", target, engine_state(model, lay), fill_biases=True))
    return engine


__all__ = ["Layout", "LAYOUTS", "WeightsMismatch", "detect_layout", "to_torch", "to_engine", "engine_state"]
