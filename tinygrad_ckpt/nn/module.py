"""Modules shaped like nanoGPT's, with the same parameter names and layouts; and the Llama family (Llama,
Mistral, Mixtral) with Hugging Face's.

A parameter's `name` is its path from the outermost module (`transformer.h.3.mlp.c_fc.weight`),
as in `state_dict()`: tape entries, the ledger and error messages use it.

Calling a module opens a name scope, so the ops it records are named after where they run, on the
same path: `transformer.h.3.mlp.gelu` is the GELU inside block 3's MLP, whose first linear holds
`transformer.h.3.mlp.c_fc.weight`. A nanoGPT `state_dict` converted to NumPy
(`{k: v.numpy() for k, v in sd.items()}`) loads as it is.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import numpy as np

from .. import backend
from .. import functional as F
from ..checks import float_dtype, kind, number, one_of
from ..engine.tensor import Parameter, Tensor
from ..ops.moe import balanced_indices, expert_picks
from ..ops.rotary import rotary_table
from ..recompute.plans import run_checkpointed
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


def llama_ffn_hidden(d_model: int, multiple_of: int = 256, ffn_dim_multiplier: float | None = None) -> int:
    """The SwiGLU width Meta's Llama code computes [Meta]: 2/3 of 4·d (three matrices instead of two, so about the
    parameters of a 4·d GELU MLP), times ffn_dim_multiplier if given, rounded up to a multiple of multiple_of:
    4096 -> 11008 (Llama-2-7B); with 1.3 and 1024, 4096 -> 14336 (Llama-3-8B); with 1.3 and 4096, 8192 -> 28672
    (Llama-3-70B)."""
    hidden = int(2 * 4 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


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
        """Convert every parameter and floating buffer to `dtype` (e.g. np.float64 for gradient checks)."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        for _, b in self.named_buffers():
            if kind(b.dtype) == "f":
                b.data = b.data.astype(dtype)
        return self

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


class CausalSelfAttention(Module):
    """Multi-head causal self-attention with the fused q,k,v projection `c_attn` ([3d, d]). `attention`:
    "explicit" (the [T, T] weights on the tape, as nanoGPT without flash) or "chunked" (ops.ChunkedAttention:
    no [T, T] array kept, the weights recomputed block by block in backward)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, n_layer: int = 1,
                 attention: str = "explicit"):
        super().__init__()
        d_model, n_heads = _heads("CausalSelfAttention", d_model, n_heads)
        dropout, n_layer = _dropout("CausalSelfAttention", dropout), _size("CausalSelfAttention", "n_layer", n_layer)
        one_of("CausalSelfAttention", "attention", attention, ("explicit", "chunked"))
        self.attention = attention
        self.c_attn = Linear(d_model, 3 * d_model)
        self.c_proj = Linear(d_model, d_model, std=0.02 / math.sqrt(2 * n_layer))
        self.attn_dropout = Dropout(dropout)
        self.resid_dropout = Dropout(dropout)
        self.n_heads, self.d_model, self.dropout = n_heads, d_model, dropout

    def forward(self, x):
        _input("CausalSelfAttention", x, self.d_model)
        B, T, C = x.shape
        H = self.n_heads
        qkv = self.c_attn(x)  # [B, T, 3C]
        q, k, v = qkv.split(C, dim=2)  # views, [B, T, C] each
        q = q.reshape(B, T, H, C // H).transpose(1, 2)  # [B, H, T, hd]
        k = k.reshape(B, T, H, C // H).transpose(1, 2)
        v = v.reshape(B, T, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training,
                                           impl=self.attention)
        y = y.transpose(1, 2).reshape(B, T, C)  # [B, T, C] (a copy: the transpose is not contiguous)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"attention={self.attention}"


class MLP(Module):
    """GPT-2's feed-forward half: c_fc (d -> 4d), GELU (exact, or approximate="tanh"), c_proj (4d -> d, its init
    scaled by 1/sqrt(2·n_layer) as GPT-2's), dropout. With dropout > 0 a checkpoint's replay of the block runs c_proj
    too (the early stop cannot skip it): the dropout after it saves a mask, so it is replayed, and it reads c_proj's
    output."""

    def __init__(self, d_model: int, dropout: float = 0.0, n_layer: int = 1, approximate: str = "none"):
        d_model, dropout = _size("MLP", "d_model", d_model), _dropout("MLP", dropout)
        n_layer = _size("MLP", "n_layer", n_layer)
        one_of("MLP", "approximate", approximate, ("none", "tanh"))
        super().__init__()
        self.c_fc = Linear(d_model, 4 * d_model)
        self.c_proj = Linear(4 * d_model, d_model, std=0.02 / math.sqrt(2 * n_layer))
        self.dropout = Dropout(dropout)
        self.approximate = approximate

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(Module):
    """Pre-LayerNorm GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, n_layer: int = 1,
                 attention: str = "explicit"):
        d_model, n_heads = _heads("Block", d_model, n_heads)
        dropout, n_layer = _dropout("Block", dropout), _size("Block", "n_layer", n_layer)
        one_of("Block", "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.d_model = d_model
        self.ln_1 = LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, n_layer, attention)
        self.ln_2 = LayerNorm(d_model)
        self.mlp = MLP(d_model, dropout, n_layer)

    def forward(self, x):
        _input("Block", x, self.d_model)
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(Module):
    """nanoGPT: token + position embeddings, n_layer blocks, final LayerNorm, lm_head tied to wte.

    `gpt(idx, targets)` -> (logits, loss). idx, targets: integer arrays [B, T]. With targets the
    logits cover every position; without, only the last one (as nanoGPT). `checkpoint` chooses
    activation checkpointing of the blocks: None, "every_layer", "sqrt", an int (that many
    segments), a policy (selective recomputation inside every block) or a planner Plan. `attention`:
    "explicit" or "chunked", for every block (see CausalSelfAttention).
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 dropout: float = 0.0, checkpoint=None, attention: str = "explicit"):
        vocab_size, block_size = _size("GPT", "vocab_size", vocab_size), _size("GPT", "block_size", block_size)
        n_layer, (d_model, n_head) = _size("GPT", "n_layer", n_layer, 0), _heads("GPT", d_model, n_head, "n_head")
        dropout = _dropout("GPT", dropout)
        one_of("GPT", "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.transformer = ModuleDict(
            wte=Embedding(vocab_size, d_model),
            wpe=Embedding(block_size, d_model),
            drop=Dropout(dropout),
            h=ModuleList([Block(d_model, n_head, dropout, n_layer, attention) for _ in range(n_layer)]),
            ln_f=LayerNorm(d_model),
        )
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in nanoGPT
        self.vocab_size, self.block_size, self.checkpoint = vocab_size, block_size, checkpoint

    def forward(self, idx, targets=None):
        be = backend.current()
        given = idx.data if isinstance(idx, Tensor) else idx
        idx = given if be.is_array(given) else be.asarray(given)  # NumPy ids work on any backend
        if len(idx.shape) != 2 or idx.dtype.kind not in "iu":
            raise ValueError(f"GPT: idx must be integer token ids of shape [B, T], got {list(idx.shape)} {idx.dtype}"
                             + ("; add a batch axis: idx[None]" if len(idx.shape) == 1 else "")
                             + ("; convert: idx.astype(np.int64)" if idx.dtype.kind in "fb" else ""))
        B, T = idx.shape
        if T == 0:
            raise ValueError(f"GPT: idx {list(idx.shape)} holds no positions: give at least one token per row")
        if T > self.block_size:
            raise ValueError(f"GPT: sequence length {T} exceeds block_size {self.block_size}")
        tr = self.transformer
        pos = backend.xp().arange(T)
        x = tr.drop(tr.wte(idx) + tr.wpe(pos))  # [B, T, d]
        x = self.run_blocks(x)
        x = tr.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, T - 1:, :]), None
        logits = self.lm_head(x)  # [B, T, vocab]
        targets = targets.data if isinstance(targets, Tensor) else targets
        if targets is given:  # model(idx, idx): one array, moved to the backend once
            targets = idx
        targets = targets if be.is_array(targets) else be.asarray(targets)
        if tuple(targets.shape) != (B, T):
            raise ValueError(f"GPT: targets must have idx's shape [{B}, {T}] (one next token per position), got "
                             f"{list(targets.shape)}")
        loss = F.cross_entropy(logits.reshape(B * T, self.vocab_size), targets.reshape(-1))
        return logits, loss

    def run_blocks(self, x):
        """Run the blocks, checkpointed as `self.checkpoint` says (checkpoint_plans.run_checkpointed)."""
        return run_checkpointed(list(self.transformer.h), x, self.checkpoint)


# ---- the Llama family (Llama 2/3, Mistral, Mixtral): Hugging Face's module paths and parameter names ----------------
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


class RotaryEmbedding(Module):
    """The cos/sin table of rotary positions, [2, max_positions, head_dim], held once for the whole model (a buffer:
    not a parameter, not in state_dict) and read by every layer's attention (ops.rotary)."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0, dtype=np.float32):
        super().__init__()
        self.head_dim, self.max_positions, self.base = head_dim, max_positions, base
        self.register_buffer("table", Tensor(rotary_table(head_dim, max_positions, base, dtype)))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, positions={self.max_positions}, base={self.base:g}"


class LlamaAttention(Module):
    """Causal self-attention with rotary positions and n_kv_head ≤ n_head key/value heads (grouped-query attention;
    1: multi-query), no biases: q_proj [H·hd, d], k_proj and v_proj [Hkv·hd, d], o_proj [d, H·hd]. k and v are never
    repeated per query head (functional.scaled_dot_product_attention(enable_gqa=True)). `dropout` drops attention
    weights (Hugging Face's attention_dropout). The rotary table is the model's, read here, not owned."""

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, rotary: RotaryEmbedding, dropout: float = 0.0,
                 attention: str = "explicit"):
        super().__init__()
        d_model, n_head = _heads("LlamaAttention", d_model, n_head, "n_head")
        n_kv_head = _size("LlamaAttention", "n_kv_head", n_kv_head)
        if n_head % n_kv_head:
            raise ValueError(f"LlamaAttention: n_kv_head={n_kv_head} must divide n_head={n_head} (each key/value "
                             f"head serves n_head/n_kv_head query heads); pick a divisor of {n_head}")
        one_of("LlamaAttention", "attention", attention, ("explicit", "chunked"))
        hd = d_model // n_head
        self.q_proj = Linear(d_model, n_head * hd, bias=False)
        self.k_proj = Linear(d_model, n_kv_head * hd, bias=False)
        self.v_proj = Linear(d_model, n_kv_head * hd, bias=False)
        self.o_proj = Linear(n_head * hd, d_model, bias=False)
        object.__setattr__(self, "rotary", rotary)  # shared, not a child: its table is named once, by the model
        self.n_head, self.n_kv_head, self.head_dim, self.d_model = n_head, n_kv_head, hd, d_model
        self.dropout, self.attention = _dropout("LlamaAttention", dropout), attention

    def forward(self, x):
        _input("LlamaAttention", x, self.d_model)
        B, T, _ = x.shape
        H, Hkv, hd = self.n_head, self.n_kv_head, self.head_dim
        q = self.q_proj(x).reshape(B, T, H, hd).transpose(1, 2)  # [B, H, T, hd] (views)
        k = self.k_proj(x).reshape(B, T, Hkv, hd).transpose(1, 2)  # [B, Hkv, T, hd]
        v = self.v_proj(x).reshape(B, T, Hkv, hd).transpose(1, 2)
        table = self.rotary.table.data
        if table.dtype != q.dtype:  # under autocast q, k are half: the table in their dtype, as Hugging Face's
            table = table.astype(q.dtype)  # rotary embedding gives cos and sin in the activations' dtype
        q, k = F.rotary_embedding(q, table), F.rotary_embedding(k, table)  # new [B, H(kv), T, hd] buffers
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training,
                                           impl=self.attention, enable_gqa=Hkv != H)
        y = y.transpose(1, 2).reshape(B, T, H * hd)  # [B, T, H·hd] (a copy: the transpose is not contiguous)
        return self.o_proj(y)

    def extra_repr(self) -> str:
        return f"heads={self.n_head}, kv_heads={self.n_kv_head}, attention={self.attention}"


class LlamaMLP(Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) · up_proj(x)), no biases; gate and up [f, d], down [d, f]."""

    def __init__(self, d_model: int, ffn_hidden: int):
        super().__init__()
        self.gate_proj = Linear(d_model, ffn_hidden, bias=False)
        self.up_proj = Linear(d_model, ffn_hidden, bias=False)
        self.down_proj = Linear(ffn_hidden, d_model, bias=False)
        self.act_fn = SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class MixtralExpert(Module):
    """One expert of a Mixtral MoE (Hugging Face's MixtralBlockSparseTop2MLP): w2(silu(w1(x)) · w3(x))."""

    def __init__(self, d_model: int, ffn_hidden: int):
        super().__init__()
        self.w1 = Linear(d_model, ffn_hidden, bias=False)
        self.w2 = Linear(ffn_hidden, d_model, bias=False)
        self.w3 = Linear(d_model, ffn_hidden, bias=False)
        self.act_fn = SiLU()

    def forward(self, x):
        return self.w2(self.act_fn(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(Module):
    """Mixtral's sparse MoE: the router `gate` ([E, d], no bias) picks each token's k experts (softmax, top-k, weights
    renormalised over the k), each expert runs on its tokens only, and their outputs are summed back, weighted
    (ops.moe: topk_routing, dispatch, combine).

    `routing`: "learned" (the router's choice) or "balanced" (token n's slot j goes to expert (n·k + j) mod E, the
    weights still the router's softmax over those experts: what the shape-only meta backend assumes, since there a
    router has no values to choose by; on NumPy it makes a run's ledger equal the meta ledger)."""

    def __init__(self, d_model: int, ffn_hidden: int, n_experts: int, experts_per_token: int = 2):
        super().__init__()
        n_experts = _size("MixtralSparseMoeBlock", "n_experts", n_experts)
        k = _size("MixtralSparseMoeBlock", "experts_per_token", experts_per_token)
        if k > n_experts:
            raise ValueError(f"MixtralSparseMoeBlock: experts_per_token={k} is more than the {n_experts} experts")
        self.gate = Linear(d_model, n_experts, bias=False)
        self.experts = ModuleList([MixtralExpert(d_model, ffn_hidden) for _ in range(n_experts)])
        self.n_experts, self.k, self.d_model, self.routing = n_experts, k, d_model, "learned"

    def forward(self, x, statistics: bool = False):
        """x [B, T, d] -> the experts' weighted sum [B, T, d]; with `statistics`, also (the router probabilities
        summed over the tokens [E], how often each expert was chosen [E]) for the load-balancing loss."""
        B, T, d = x.shape
        rows = x.reshape(B * T, d)
        logits = self.gate(rows)  # [N, E]
        be = backend.current()
        balanced = self.routing == "balanced" or not be.has_values
        experts = balanced_indices(B * T, self.k, self.n_experts) if balanced else None
        weights, indices = F.topk_routing(logits, self.k, experts)  # [N, k] each
        picks = expert_picks(indices.data, self.n_experts)
        inputs = F.moe_dispatch(rows, picks, self.k)
        outputs = [expert(xe) for expert, xe in zip(self.experts, inputs)]  # each expert on its tokens only
        out = F.moe_combine(weights, outputs, picks).reshape(B, T, d)
        if not statistics:
            return out
        chosen = Tensor(be.asarray(np.array([p.shape[0] for p in picks], dtype=np.float64)).astype(x.dtype)
                        if be.has_values else backend.xp().zeros((self.n_experts,), dtype=x.dtype))
        return out, F.softmax(logits, axis=-1).sum(axis=0), chosen

    def extra_repr(self) -> str:
        return f"experts={self.n_experts}, per_token={self.k}, routing={self.routing}"


class LlamaDecoderLayer(Module):
    """Pre-RMSNorm Llama block: h = x + self_attn(input_layernorm(x)), then h + mlp(post_attention_layernorm(h))
    (mlp: SwiGLU, or `block_sparse_moe` with n_experts > 0). With the router's statistics wanted (Llama's
    output_router_logits) it takes and returns (x, probabilities summed, choices counted), so that a checkpointed
    layer hands them on too."""

    def __init__(self, d_model: int, n_head: int, n_kv_head: int, ffn_hidden: int, rotary: RotaryEmbedding,
                 norm_eps: float = 1e-5, n_experts: int = 0, experts_per_token: int = 2, dropout: float = 0.0,
                 attention: str = "explicit"):
        super().__init__()
        self.d_model = d_model
        self.self_attn = LlamaAttention(d_model, n_head, n_kv_head, rotary, dropout, attention)
        self.input_layernorm = RMSNorm(d_model, norm_eps)
        self.post_attention_layernorm = RMSNorm(d_model, norm_eps)
        if n_experts:
            self.block_sparse_moe = MixtralSparseMoeBlock(d_model, ffn_hidden, n_experts, experts_per_token)
        else:
            self.mlp = LlamaMLP(d_model, ffn_hidden)

    def forward(self, x):
        carry = isinstance(x, tuple)
        if carry:
            x, probabilities, chosen = x
        _input("LlamaDecoderLayer", x, self.d_model)
        h = x + self.self_attn(self.input_layernorm(x))
        normed = self.post_attention_layernorm(h)
        if "mlp" in self._modules:
            out = h + self.mlp(normed)
            return (out, probabilities, chosen) if carry else out
        if not carry:
            return h + self.block_sparse_moe(normed)
        moe, p, c = self.block_sparse_moe(normed, statistics=True)
        return h + moe, probabilities + p, chosen + c


class LlamaModel(Module):
    """Hugging Face's LlamaModel: embed_tokens, layers, norm, and the rotary table shared by every layer."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, d_model, n_kv_head, ffn_hidden, rope_theta, norm_eps,
                 n_experts, experts_per_token, dropout, attention):
        super().__init__()
        self.embed_tokens = Embedding(vocab_size, d_model)
        self.rotary_emb = RotaryEmbedding(d_model // n_head, block_size, rope_theta)
        self.layers = ModuleList([LlamaDecoderLayer(d_model, n_head, n_kv_head, ffn_hidden, self.rotary_emb, norm_eps,
                                                    n_experts, experts_per_token, dropout, attention)
                                  for _ in range(n_layer)])
        self.norm = RMSNorm(d_model, norm_eps)

    def forward(self, idx, checkpoint=None, statistics=None):
        x = self.embed_tokens(idx)  # [B, T, d]
        x = run_checkpointed(list(self.layers), x if statistics is None else (x, *statistics), checkpoint)
        if statistics is None:
            return self.norm(x), None
        x, *statistics = x
        return self.norm(x), statistics


class Llama(Module):
    """A Llama / Mistral / Mixtral causal LM, as nn.GPT is nanoGPT: `model(idx, targets)` -> (logits, loss).

    Pre-RMSNorm blocks, rotary positions (rope_theta; one [2, block_size, head_dim] cos/sin table for the model),
    grouped-query attention (n_kv_head key/value heads, default n_head), a SwiGLU MLP of ffn_hidden units (default:
    `llama_ffn_hidden(d_model)`, Meta's rule with multiple_of 256, 11008 at d = 4096), no biases, lm_head untied
    unless tie_embeddings. With n_experts > 0 every MLP is a Mixtral sparse MoE of experts_per_token experts per token.
    Module paths and state_dict names are Hugging Face's LlamaForCausalLM / MixtralForCausalLM (`model.embed_tokens`,
    `model.layers.{i}.self_attn.q_proj`, `...mlp.gate_proj` or `...block_sparse_moe.experts.{e}.w1`, `model.norm`,
    `lm_head`), so a checkpoint in that layout loads as it is and the ops are named by the same paths
    (`model.layers.3.mlp.act_fn.silu`).

    idx, targets: integer arrays [B, T]; targets[t] is the token after idx[t] (nanoGPT's convention: Hugging Face
    shifts its labels inside instead). Without targets only the last position's logits. `checkpoint`: as nn.GPT's
    (None, "every_layer", "sqrt", a number of segments, a Policy such as tg.korthikanti_selective, a planner Plan).
    `attention`: "explicit" or "chunked". `dropout`: on the attention weights (Hugging Face's attention_dropout).

    Mixtral's load-balancing loss (Hugging Face's load_balancing_loss_func: E·Σ_e f_e·P_e over every layer's tokens,
    f_e the share of choices that went to expert e, P_e its mean router probability): set `output_router_logits =
    True` and each forward computes it into `aux_loss` and adds `router_aux_loss_coef · aux_loss` to the loss (as
    MixtralForCausalLM; coefficient default 0.001, MixtralConfig's), under every checkpoint plan too.
    """

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, d_model: int,
                 n_kv_head: int | None = None, ffn_hidden: int | None = None, rope_theta: float = 10000.0,
                 norm_eps: float = 1e-5, tie_embeddings: bool = False, n_experts: int = 0, experts_per_token: int = 2,
                 dropout: float = 0.0, checkpoint=None, attention: str = "explicit"):
        owner = "Llama"
        vocab_size, block_size = _size(owner, "vocab_size", vocab_size), _size(owner, "block_size", block_size)
        n_layer, (d_model, n_head) = _size(owner, "n_layer", n_layer, 0), _heads(owner, d_model, n_head, "n_head")
        if (d_model // n_head) % 2:
            raise ValueError(f"Llama: head_dim = d_model/n_head = {d_model // n_head} must be even (rotary positions "
                             "turn pairs of features)")
        n_kv_head = n_head if n_kv_head is None else _size(owner, "n_kv_head", n_kv_head)
        if n_head % n_kv_head:
            raise ValueError(f"Llama: n_kv_head={n_kv_head} must divide n_head={n_head}")
        ffn_hidden = llama_ffn_hidden(d_model) if ffn_hidden is None else _size(owner, "ffn_hidden", ffn_hidden)
        rope_theta = _real(owner, "rope_theta", rope_theta, "a base > 0 such as 10000.0", lambda v: v > 0)
        norm_eps = _real(owner, "norm_eps", norm_eps, "a small number >= 0 such as 1e-5", lambda v: v >= 0)
        if not isinstance(tie_embeddings, (bool, np.bool_)):
            raise TypeError(f"Llama: tie_embeddings must be True or False, got {tie_embeddings!r}")
        n_experts = _size(owner, "n_experts", n_experts, 0)
        experts_per_token = _size(owner, "experts_per_token", experts_per_token)
        if n_experts and experts_per_token > n_experts:
            raise ValueError(f"Llama: experts_per_token={experts_per_token} is more than n_experts={n_experts}")
        dropout = _dropout(owner, dropout)
        one_of(owner, "attention", attention, ("explicit", "chunked"))
        super().__init__()
        self.model = LlamaModel(vocab_size, block_size, n_layer, n_head, d_model, n_kv_head, ffn_hidden, rope_theta,
                                norm_eps, n_experts, experts_per_token, dropout, attention)
        self.lm_head = Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.vocab_size, self.block_size, self.checkpoint = vocab_size, block_size, checkpoint
        self.n_experts, self.experts_per_token = n_experts, experts_per_token
        self.output_router_logits, self.router_aux_loss_coef, self.aux_loss = False, 0.001, None

    def forward(self, idx, targets=None):
        be = backend.current()
        given = idx.data if isinstance(idx, Tensor) else idx
        idx = _token_ids("Llama", given, self.block_size)
        B, T = idx.shape
        statistics = None
        if self.n_experts and self.output_router_logits:
            statistics = tuple(Tensor(be.xp.zeros((self.n_experts,), dtype=self.lm_head.weight.dtype))
                               for _ in range(2))
        x, statistics = self.model(idx, self.checkpoint, statistics)
        self.aux_loss = None if statistics is None else self._load_balancing_loss(*statistics, B * T)
        if targets is None:
            return self.lm_head(x[:, T - 1:, :]), None
        logits = self.lm_head(x)  # [B, T, vocab]
        targets = targets.data if isinstance(targets, Tensor) else targets
        if targets is given:  # model(idx, idx): one array, moved to the backend once
            targets = idx
        targets = targets if be.is_array(targets) else be.asarray(targets)
        if tuple(targets.shape) != (B, T):
            raise ValueError(f"Llama: targets must have idx's shape [{B}, {T}] (one next token per position), got "
                             f"{list(targets.shape)}")
        loss = F.cross_entropy(logits.reshape(B * T, self.vocab_size), targets.reshape(-1))
        if self.aux_loss is not None:
            loss = loss + self.aux_loss * self.router_aux_loss_coef
        return logits, loss

    def _load_balancing_loss(self, probabilities, chosen, tokens: int):
        """E·Σ_e (chosen_e / (L·N))·(probabilities_e / (L·N)): Hugging Face's load_balancing_loss_func over every
        layer's N tokens at once (the choices' share per expert times its mean probability, summed, times E)."""
        seen = len(self.model.layers) * tokens
        return (probabilities * (chosen * (self.n_experts / (seen * seen)))).sum()


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
