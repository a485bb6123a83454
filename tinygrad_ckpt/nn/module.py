"""Module, the base of every layer: children and parameters registered by attribute assignment and named by path
(`transformer.h.3.mlp.c_fc.weight`, as in `state_dict()`); tape entries, the ledger and error messages use it.

Calling a module opens a name scope, so the ops it records are named after where they run, on the same path:
`transformer.h.3.mlp.gelu` is the GELU inside block 3's MLP. And the layers the models are built of (Linear,
Embedding, LayerNorm, RMSNorm, Dropout, SiLU, ModuleList, ModuleDict), with the argument checks they share.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from .. import backend
from .. import functional as F
from ..checks import FLOAT_NAMES, dtype_of, float_dtype, kind, number
from ..engine.tensor import Parameter, Tensor
from ..state import name_scope


def _size(owner: str, name: str, value, least: int = 1) -> int:
    """A size argument: an int (NumPy's too, not a bool) of at least `least`; else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an int, got {value!r} ({type(value).__name__})")
    if value < least:
        raise ValueError(f"{owner}: {name} must be at least {least}, got {value}")
    return int(value)


def _real(owner: str, name: str, value, wanted: str, ok) -> float:
    """A real-number argument (NumPy's too, not a bool) that passes `ok`; else an error naming it."""
    if not number(value):
        raise TypeError(f"{owner}: {name} must be a number ({wanted}), got {value!r} ({type(value).__name__})")
    if not ok(value):
        raise ValueError(f"{owner}: {name} must be {wanted}, got {value!r}")
    return float(value)


def _dropout(owner: str, p) -> float:
    return _real(owner, "dropout", p, "a probability in [0, 1)", lambda v: 0 <= v < 1)


def _float_dtype(owner: str, dtype):
    if not float_dtype(dtype):
        raise TypeError(f"{owner}: dtype must be a floating-point dtype such as np.float32 (parameters need "
                        f"gradients), got {dtype!r}")
    return dtype


def _heads(owner: str, d_model, n_heads, heads_name: str = "n_heads") -> tuple[int, int]:
    d_model, n_heads = _size(owner, "d_model", d_model), _size(owner, heads_name, n_heads)
    if d_model % n_heads:
        raise ValueError(f"{owner}: d_model={d_model} is not divisible by {heads_name}={n_heads}: each head takes "
                         f"d_model/{heads_name} features; pick a divisor of {d_model}")
    return d_model, n_heads


def _input(owner: str, x, d_model: int) -> None:
    """x must be a Tensor [B, T, d_model] (what a block and its attention read)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{owner}: x must be a Tensor [B, T, {d_model}], got {type(x).__name__}; wrap an array "
                        "first: tg.Tensor(x)")
    if len(x.shape) != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{owner}: x must be [B, T, {d_model}] (batch, sequence, d_model), got {list(x.shape)}")


def _normal(shape, std: float, dtype) -> object:
    return (backend.next_generator().standard_normal(shape, dtype=np.float32) * std).astype(dtype)


class Module:
    """Base class: children and parameters registered by attribute assignment, named by path."""

    _container = False  # ModuleList, ModuleDict: never called, so their children carry their path ("h.3")

    def __init__(self):
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_name", "")
        object.__setattr__(self, "training", True)

    def __setattr__(self, key, value):
        if isinstance(value, Parameter):
            self._parameters[key] = value
            if value.name is None:
                value.name = key
        elif isinstance(value, Module):
            self._modules[key] = value
            object.__setattr__(value, "_name", key)
            for path, t in [*value._named_parameters_all(), *value.named_buffers()]:  # "weight" becomes
                if t.name == path:  # "c_fc.weight", then "mlp.c_fc.weight"
                    t.name = f"{key}.{path}"
            if value._container:
                _name_children(value, key)
        object.__setattr__(self, key, value)

    def register_buffer(self, key: str, tensor: Tensor) -> None:
        """Hold a tensor that is not a parameter (no gradient, not in state_dict: a constant such as rotary
        positions' cos/sin table), named by path like a parameter and converted by `to(dtype)`."""
        if tensor.requires_grad:
            raise ValueError(f"register_buffer: '{key}' requires grad; a buffer is a constant (use a Parameter)")
        self._buffers[key] = tensor
        tensor.name = tensor.name or key
        object.__setattr__(self, key, tensor)

    def named_buffers(self):
        """(name, tensor) of every buffer, by path."""
        for path, module in self.named_modules():
            for name, t in module._buffers.items():
                yield (f"{path}.{name}" if path else name), t

    def __call__(self, *args, **kwargs):
        with name_scope(self._name):
            return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def _named_parameters_all(self):
        for path, module in self.named_modules():
            for name, p in module._parameters.items():
                yield (f"{path}.{name}" if path else name), p

    def named_parameters(self):
        """(name, parameter) pairs; a parameter shared under two names (tied weights) appears once."""
        seen = set()
        for name, p in self._named_parameters_all():
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())

    def state_dict(self) -> dict:
        """{name: NumPy array} for every parameter name (tied weights under both names, as PyTorch)."""
        return {name: p.numpy().copy() for name, p in self._named_parameters_all()}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy arrays into the parameters with matching names and shapes: all of them, or none.

        Every key, shape and dtype is checked before anything is copied, and one error names every problem:
        missing and unexpected keys (with strict=True), shapes that differ, values that cannot be cast to the
        parameter's dtype, and two names of one tied parameter given different values. nanoGPT's causal-mask
        buffers (`*.attn.bias`, present when it runs without flash attention) are not parameters here and are
        skipped.
        """
        owner = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state, Mapping):
            raise TypeError(f"{owner}: expected a dict {{name: array}} (as state_dict() returns), got "
                            f"{type(state).__name__}")
        if not isinstance(strict, (bool, np.bool_)):
            raise TypeError(f"{owner}: strict must be True or False, got {strict!r}")
        bad_keys = [k for k in state if not isinstance(k, str)]
        if bad_keys:
            raise TypeError(f"{owner}: keys must be parameter names (str), got {bad_keys!r}")
        own = dict(self._named_parameters_all())
        state = {k: v for k, v in state.items() if not (k.endswith("attn.bias") and k not in own)}
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        problems, ready = [], {}  # ready: id(parameter) -> (name, parameter, the value cast to its dtype)
        for name, value in state.items():
            if name not in own:
                continue
            p = own[name]
            try:
                value = np.asarray(value.numpy() if isinstance(value, Tensor) else value)
            except (TypeError, ValueError) as exc:
                problems.append(f"'{name}' is not an array ({type(value).__name__}: {exc})")
                continue
            if tuple(value.shape) != p.shape:
                problems.append(f"'{name}' has shape {list(value.shape)} but the parameter is {list(p.shape)}")
            elif kind(value.dtype) not in "biuf" or not np.can_cast(value.dtype, p.dtype, casting="same_kind"):
                problems.append(f"'{name}' has dtype {value.dtype}, which does not cast to the parameter's {p.dtype}")
            else:
                value = backend.current().asarray(value, dtype=p.dtype)
                first = ready.setdefault(id(p), (name, p, value))
                if first[2] is not value and not _same(first[2], value):
                    problems.append(f"'{first[0]}' and '{name}' name one tied parameter but hold different values; "
                                    f"give both the same array (e.g. sd['{name}'] = sd['{first[0]}'])")
        if strict and (missing or unexpected):
            raise KeyError(f"{owner}: missing keys {missing}, unexpected keys {unexpected}"
                           + "".join(f"; {p}" for p in problems) + "; nothing was loaded")
        if problems:
            raise ValueError(f"{owner}: {'; '.join(problems)}; nothing was loaded")
        for _, p, value in ready.values():
            p.data[...] = value

    def to(self, dtype) -> Module:
        """Convert every parameter and floating buffer to the floating-point `dtype` (e.g. np.float64 for gradient
        checks; autocast's names too: "bf16", "fp32", ...). A buffer derived from constants (the rotary table) is
        computed again in `dtype` (`buffer_in`), not rounded from its old precision."""
        dtype = dtype_of("Module.to", dtype)
        if not float_dtype(dtype):
            raise TypeError(f"Module.to: dtype {dtype} is not floating point: parameters need gradients, and "
                            f"converting would cut their values; pass one of {', '.join(map(repr, FLOAT_NAMES))} "
                            "(or a NumPy floating dtype)")
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        for _, module in self.named_modules():
            for key, b in module._buffers.items():
                if kind(b.dtype) == "f":
                    b.data = module.buffer_in(key, dtype)
        return self

    def buffer_in(self, key: str, dtype):
        """This module's buffer `key` in `dtype`, for `to`: its values converted. A module whose buffer is derived
        (RotaryEmbedding's table) computes it again at that precision."""
        return self._buffers[key].data.astype(dtype)

    def train(self, mode: bool = True) -> Module:
        for _, m in self.named_modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._modules.items():
            lines.append("  " + f"({name}): {child!r}".replace("\n", "\n  "))
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"

    def extra_repr(self) -> str:
        return ""


def _same(a, b) -> bool:
    """Do two arrays of one backend hold the same values (NaN equal to NaN)? Shape-only arrays always do."""
    be = backend.current()
    return not be.has_values or bool(be.xp.array_equal(a, b, equal_nan=kind(a.dtype) == "f"))


def _name_children(container: Module, path: str) -> None:
    """A container's children are named by their path through it ("transformer.h.3"), through nested
    containers too, since no container opens a scope of its own."""
    for key, child in container._modules.items():
        object.__setattr__(child, "_name", f"{path}.{key}")
        if child._container:
            _name_children(child, f"{path}.{key}")


class ModuleList(Module):
    """A list of modules registered as children named "0", "1", ... (nanoGPT's `transformer.h`): index, slice,
    iterate and len() as a list; their parameters are the list's, named `{i}.<name>` in state_dict."""

    _container = True

    def __init__(self, modules=()):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __getitem__(self, i):
        items = list(self._modules.values())
        return ModuleList(items[i]) if isinstance(i, slice) else items[i]

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)


class ModuleDict(Module):
    """Modules registered as children by keyword (nanoGPT's `transformer = ModuleDict(wte=..., h=..., ln_f=...)`),
    read back as attributes; their parameters are named `<key>.<name>` in state_dict."""

    _container = True

    def __init__(self, **modules):
        super().__init__()
        for k, m in modules.items():
            setattr(self, k, m)


class Linear(Module):
    """y = x Wᵀ + b, W: [out_features, in_features] ~ N(0, std²), b = 0."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, std: float = 0.02,
                 dtype=np.float32):
        in_features, out_features = _size("Linear", "in_features", in_features, 0), _size(
            "Linear", "out_features", out_features, 0)
        if not isinstance(bias, (bool, np.bool_)):
            raise TypeError(f"Linear: bias must be True or False, got {bias!r}")
        std = _real("Linear", "std", std, "a standard deviation >= 0", lambda v: v >= 0)
        _float_dtype("Linear", dtype)
        super().__init__()
        self.weight = Parameter(_normal((out_features, in_features), std, dtype), name="weight")
        self.bias = Parameter(backend.xp().zeros(out_features, dtype=dtype), name="bias") if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        out_f, in_f = self.weight.shape
        return f"{in_f} -> {out_f}, bias={self.bias is not None}"


class LayerNorm(Module):
    """(x - mean) / sqrt(var + eps) · weight + bias over the last axis of size dim (weight 1, bias 0 at first).
    Saves its output and 1/std (x̂ is recovered from the output in backward): see F.layer_norm."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=np.float32):
        dim = _size("LayerNorm", "dim", dim, 0)
        eps = _real("LayerNorm", "eps", eps, "a small number >= 0 such as 1e-5", lambda v: v >= 0)
        _float_dtype("LayerNorm", dtype)
        super().__init__()
        self.weight = Parameter(backend.xp().ones(dim, dtype=dtype), name="weight")
        self.bias = Parameter(backend.xp().zeros(dim, dtype=dtype), name="bias")
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return str(self.weight.shape[0])


class Embedding(Module):
    """Rows of `weight` [num_embeddings, dim] ~ N(0, std²) looked up by integer ids: ids [...] -> [..., dim]. Saves
    nothing but the ids (an int array); its backward scatters the gradient into the looked-up rows."""

    def __init__(self, num_embeddings: int, dim: int, std: float = 0.02, dtype=np.float32):
        num_embeddings, dim = _size("Embedding", "num_embeddings", num_embeddings, 0), _size(
            "Embedding", "dim", dim, 0)
        std = _real("Embedding", "std", std, "a standard deviation >= 0", lambda v: v >= 0)
        _float_dtype("Embedding", dtype)
        super().__init__()
        self.weight = Parameter(_normal((num_embeddings, dim), std, dtype), name="weight")

    def forward(self, ids):
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class Dropout(Module):
    """Zeroes each element with probability p and scales the rest by 1/(1 - p) while training (`module.train()`);
    the identity under `module.eval()` or p = 0. Saves its mask packed 1 bit an element."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = _real("Dropout", "p", p, "a probability in [0, 1)", lambda v: 0 <= v < 1)

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class RMSNorm(Module):
    """x / √(mean(x²) + eps) · weight (ops.RMSNorm: keeps its input and 1/rms per row), weight initialised to 1."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=np.float32):
        dim = _size("RMSNorm", "dim", dim, 0)
        eps = _real("RMSNorm", "eps", eps, "a small number >= 0 such as 1e-5", lambda v: v >= 0)
        _float_dtype("RMSNorm", dtype)
        super().__init__()
        self.weight = Parameter(backend.xp().ones(dim, dtype=dtype), name="weight")
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class SiLU(Module):
    """x·σ(x) as a module, so its op is named after where it runs (`model.layers.3.mlp.act_fn.silu`, as Hugging
    Face names the activation `act_fn`)."""

    def forward(self, x):
        return F.silu(x)


def _token_ids(owner: str, given, block_size: int):
    """idx as integer token ids [B, T] on the active backend (NumPy ids work on any backend), checked."""
    be = backend.current()
    idx = given if be.is_array(given) else be.asarray(given)
    if len(idx.shape) != 2 or idx.dtype.kind not in "iu":
        raise ValueError(f"{owner}: idx must be integer token ids of shape [B, T], got {list(idx.shape)} {idx.dtype}"
                         + ("; add a batch axis: idx[None]" if len(idx.shape) == 1 else "")
                         + ("; convert: idx.astype(np.int64)" if idx.dtype.kind in "fb" else ""))
    B, T = idx.shape
    if T == 0:
        raise ValueError(f"{owner}: idx {list(idx.shape)} holds no positions: give at least one token per row")
    if T > block_size:
        raise ValueError(f"{owner}: sequence length {T} exceeds block_size {block_size}")
    return idx


def next_token_logits_and_loss(owner: str, lm_head, x, idx, given, targets, vocab_size: int):
    """A language model's head: (logits of the last position, None) without targets; with them the logits of every
    position [B, T, vocab] and the mean cross-entropy against targets of idx's shape (`given` is what the caller
    passed as idx: model(idx, idx) moves one array to the backend once)."""
    B, T = idx.shape
    if targets is None:
        return lm_head(x[:, T - 1:, :]), None
    logits = lm_head(x)  # [B, T, vocab]
    be = backend.current()
    targets = targets.data if isinstance(targets, Tensor) else targets
    if targets is given:
        targets = idx
    targets = targets if be.is_array(targets) else be.asarray(targets)
    if tuple(targets.shape) != (B, T):
        raise ValueError(f"{owner}: targets must have idx's shape [{B}, {T}] (one next token per position), got "
                         f"{list(targets.shape)}")
    return logits, F.cross_entropy(logits.reshape(B * T, vocab_size), targets.reshape(-1))
