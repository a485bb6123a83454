"""Analytic memory and compute estimates for GPT-style training.

Every formula is written one named term per line, with its unit and its source, cited in comments as [tag]:
[seed] the course text, "The Memory Problem Activation Checkpointing Solves"; [K22] Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198), sec. 4.1, Eq. 1 and
Table 2; [C16] Chen, Xu, Zhang, Guestrin 2016, "Training Deep Nets with Sublinear Memory Cost"
(arXiv:1604.06174), sec. 4, Eq. 1; [nanoGPT] karpathy/nanoGPT model.py's parameter layout; [Adam] two fp32
moments per parameter (m, v), plus an fp32 master copy in mixed precision; [engine] what this engine's ops
save in a pre-LN nanoGPT block; [HF] Hugging Face's LlamaForCausalLM / MixtralForCausalLM parameter layout;
[Meta] Meta's Llama reference code (the SwiGLU width 2/3·4d, rounded up to multiple_of); [configs] the
models' published config.json / params.json (presets below). Each source in full: docs/house.md.

Pure Python: sizes are ints of bytes (or FLOPs); nothing here needs NumPy.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

from ..nn import llama_ffn_hidden
from ..units import format_bytes

_DTYPE_BYTES = {
    "float16": 2, "half": 2, "fp16": 2, "bfloat16": 2, "bf16": 2,
    "float32": 4, "float": 4, "fp32": 4, "single": 4,
    "float64": 8, "double": 8, "fp64": 8,
    "bool": 1, "int8": 1, "uint8": 1, "int32": 4, "int64": 8,
}


def dtype_bytes(dtype) -> int:
    """Bytes per element for a dtype name, a numpy dtype or a numpy scalar type."""
    name = getattr(dtype, "__name__", None) or str(dtype)
    name = name.lower().removeprefix("torch.").removeprefix("np.").removeprefix("numpy.")
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


class _Shape:
    """What GPTShape and LlamaShape share: the head size, the bytes of a value, and the run's own checks."""

    def _check_run(self) -> None:
        name = type(self).__name__
        if self.seq_len > self.block_size:
            raise ValueError(f"{name}: seq_len {self.seq_len} exceeds block_size {self.block_size}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"{name}: dropout must be in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def value_bytes(self) -> int:
        return dtype_bytes(self.dtype)


@dataclass
class GPTShape(_Shape):
    """A nanoGPT-style model and batch. block_size defaults to seq_len."""

    n_layer: int
    d_model: int
    n_head: int
    seq_len: int
    batch: int
    vocab_size: int = 50304
    block_size: int | None = None
    dtype: str = "float32"
    dropout: float = 0.0

    arch = "gpt2"

    def __post_init__(self):
        if self.block_size is None:
            self.block_size = self.seq_len
        for field_name in ("n_layer", "d_model", "n_head", "seq_len", "batch", "vocab_size", "block_size"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTShape: {field_name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"GPTShape: {self.n_head} heads do not divide d_model {self.d_model}; pick a head count "
                             f"that does (e.g. {self.d_model // 64 or 1} heads of 64)")
        self._check_run()



@dataclass
class LlamaShape(_Shape):
    """A Llama / Mistral / Mixtral-family model (nn.Llama's arguments; Hugging Face's config names in the comments)
    and a batch. block_size defaults to seq_len, n_kv_head to n_head, ffn_hidden to llama_ffn_hidden(d_model)."""

    n_layer: int                      # num_hidden_layers
    d_model: int                      # hidden_size
    n_head: int                       # num_attention_heads
    seq_len: int
    batch: int
    vocab_size: int = 32000           # vocab_size
    block_size: int | None = None     # max_position_embeddings: the rotary table's length
    dtype: str = "float32"
    dropout: float = 0.0              # attention_dropout
    n_kv_head: int | None = None      # num_key_value_heads
    ffn_hidden: int | None = None     # intermediate_size
    rope_theta: float = 10000.0       # rope_theta
    norm_eps: float = 1e-5            # rms_norm_eps
    tie_embeddings: bool = False      # tie_word_embeddings
    n_experts: int = 0                # num_local_experts (0: a dense SwiGLU MLP)
    experts_per_token: int = 2        # num_experts_per_tok

    arch = "llama"

    def __post_init__(self):
        self.block_size = self.seq_len if self.block_size is None else self.block_size
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        self.ffn_hidden = llama_ffn_hidden(self.d_model) if self.ffn_hidden is None else self.ffn_hidden
        for name in ("n_layer", "d_model", "n_head", "seq_len", "batch", "vocab_size", "block_size", "n_kv_head",
                     "ffn_hidden", "experts_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LlamaShape: {name} must be a positive integer, got {value!r}")
        if isinstance(self.n_experts, bool) or not isinstance(self.n_experts, int) or self.n_experts < 0:
            raise ValueError(f"LlamaShape: n_experts must be 0 (dense) or a positive integer, got {self.n_experts!r}")
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(f"LlamaShape: {self.n_head} heads must divide d_model {self.d_model} into an even head "
                             "dimension (rotary positions turn pairs of features)")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"LlamaShape: n_kv_head {self.n_kv_head} must divide n_head {self.n_head}")
        if self.n_experts and self.experts_per_token > self.n_experts:
            raise ValueError(f"LlamaShape: experts_per_token {self.experts_per_token} exceeds n_experts "
                             f"{self.n_experts}")
        self._check_run()



# Published shapes [configs]: GPT-2 (OpenAI's config.json: n_embd, n_layer, n_head, n_ctx 1024, vocab 50257, tied,
# biases), Llama 2 and 3 (Meta's params.json and Hugging Face's config.json: the SwiGLU width is intermediate_size),
# Mistral 7B v0.1 and Mixtral 8x7B v0.1 (Mistral AI's config.json). max_position_embeddings is block_size.
PRESETS = {
    "gpt2": dict(arch="gpt2", n_layer=12, d_model=768, n_head=12, vocab_size=50257, block_size=1024),
    "gpt2-xl": dict(arch="gpt2", n_layer=48, d_model=1600, n_head=25, vocab_size=50257, block_size=1024),
    "llama-2-7b": dict(arch="llama", n_layer=32, d_model=4096, n_head=32, n_kv_head=32, ffn_hidden=11008,
                       vocab_size=32000, block_size=4096, rope_theta=10000.0, norm_eps=1e-5),
    "llama-3-8b": dict(arch="llama", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, ffn_hidden=14336,
                       vocab_size=128256, block_size=8192, rope_theta=500000.0, norm_eps=1e-5),
    "llama-3-70b": dict(arch="llama", n_layer=80, d_model=8192, n_head=64, n_kv_head=8, ffn_hidden=28672,
                        vocab_size=128256, block_size=8192, rope_theta=500000.0, norm_eps=1e-5),
    "mistral-7b": dict(arch="llama", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, ffn_hidden=14336,
                       vocab_size=32000, block_size=32768, rope_theta=10000.0, norm_eps=1e-5),
    "mixtral-8x7b": dict(arch="llama", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, ffn_hidden=14336,
                         vocab_size=32000, block_size=32768, rope_theta=1000000.0, norm_eps=1e-5, n_experts=8,
                         experts_per_token=2),
}
# what a preset's model has that the engine does not run, said wherever the preset is used
PRESET_NOTES = {
    "mistral-7b": "Mistral's sliding-window attention (4096 positions) is not modelled: it equals causal attention "
                  "for T <= 4096 and keeps less above",
}


def preset(name: str, seq_len: int | None = None, batch: int = 1, dtype: str = "float16", **overrides):
    """The shape of a published model (PRESETS) for a batch: a GPTShape or a LlamaShape. seq_len defaults to
    min(2048, block_size); every other field of the shape can be overridden (a custom width, fewer layers, more
    key/value heads, experts: arch="llama" with n_experts=8 ...), and arch= switches the family."""
    if name not in PRESETS:
        raise ValueError(f"unknown model {name!r}; the presets are {', '.join(PRESETS)}")
    fields = {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}
    arch = fields.pop("arch")
    if arch not in ("gpt2", "llama"):
        raise ValueError(f"unknown arch {arch!r}: gpt2 or llama")
    seq_len = seq_len or min(2048, fields.get("block_size") or 2048)
    cls = GPTShape if arch == "gpt2" else LlamaShape
    if cls is GPTShape:
        extra = sorted(set(fields) - {f.name for f in dataclasses.fields(GPTShape)})
        if extra:
            raise ValueError(f"{', '.join(extra)}: not a GPT-2 setting (use arch='llama' for these)")
    return cls(seq_len=seq_len, batch=batch, dtype=dtype, **fields)


def assumptions(shape, name: str | None = None) -> list[str]:
    """What an estimate of `shape` (of preset `name`) assumes that the shape does not say: one sentence each."""
    out = [PRESET_NOTES[name]] if name in PRESET_NOTES else []
    if getattr(shape, "n_experts", 0):
        k, e, tokens = shape.experts_per_token, shape.n_experts, shape.batch * shape.seq_len
        out.append(f"routing: the meta backend has no values to route by, so each expert takes a balanced share, "
                   f"B·T·k/E = {tokens}·{k}/{e} = {tokens * k / e:g} tokens per layer (a real router is uneven: the "
                   "experts' saves still add up to the same B·T·k rows, but the busiest expert's batch, temporaries "
                   "and compute are larger)")
    return out


# ---------------------------------------------------------------- parameters

def gpt_parameter_terms(shape: GPTShape) -> dict[str, int]:
    """Parameter counts (elements) per tensor group, nanoGPT layout [nanoGPT]."""
    d, L = shape.d_model, shape.n_layer
    t = {}
    t["wte"] = shape.vocab_size * d              # elements; token embedding, tied with lm_head (counted once)
    t["wpe"] = shape.block_size * d              # elements; learned position embedding
    t["h.ln_1"] = L * 2 * d                      # elements; LayerNorm weight + bias
    t["h.attn.c_attn"] = L * (3 * d * d + 3 * d)  # elements; fused Q,K,V Linear d -> 3d, weight + bias
    t["h.attn.c_proj"] = L * (d * d + d)         # elements; attention output Linear d -> d
    t["h.ln_2"] = L * 2 * d                      # elements; LayerNorm weight + bias
    t["h.mlp.c_fc"] = L * (4 * d * d + 4 * d)    # elements; MLP Linear d -> 4d
    t["h.mlp.c_proj"] = L * (d * 4 * d + d)      # elements; MLP Linear 4d -> d
    t["ln_f"] = 2 * d                            # elements; final LayerNorm
    return t


def gpt_parameter_count(shape: GPTShape) -> int:
    """Total parameters (tied lm_head counted once) [nanoGPT]."""
    return sum(gpt_parameter_terms(shape).values())


def llama_parameter_terms(shape: LlamaShape) -> dict[str, int]:
    """Parameter counts (elements) per tensor group, Hugging Face's Llama / Mixtral layout [HF]."""
    d, L, f, E = shape.d_model, shape.n_layer, shape.ffn_hidden, shape.n_experts
    q, kv = shape.n_head * shape.head_dim, shape.n_kv_head * shape.head_dim
    t = {}
    t["embed_tokens"] = shape.vocab_size * d          # elements; token embedding (no position table: rotary)
    t["layers.input_layernorm"] = L * d               # elements; RMSNorm weight
    t["layers.self_attn.q_proj"] = L * d * q          # elements; d -> H·hd, no bias
    t["layers.self_attn.k_proj"] = L * d * kv         # elements; d -> Hkv·hd: grouped key heads
    t["layers.self_attn.v_proj"] = L * d * kv         # elements; d -> Hkv·hd: grouped value heads
    t["layers.self_attn.o_proj"] = L * q * d          # elements; H·hd -> d
    t["layers.post_attention_layernorm"] = L * d      # elements; RMSNorm weight
    if E:
        t["layers.block_sparse_moe.gate"] = L * d * E          # elements; the router, d -> E
        t["layers.block_sparse_moe.experts.w1"] = L * E * d * f  # elements; every expert's gate, d -> f
        t["layers.block_sparse_moe.experts.w3"] = L * E * d * f  # elements; every expert's up, d -> f
        t["layers.block_sparse_moe.experts.w2"] = L * E * f * d  # elements; every expert's down, f -> d
    else:
        t["layers.mlp.gate_proj"] = L * d * f           # elements; SwiGLU gate, d -> f
        t["layers.mlp.up_proj"] = L * d * f             # elements; SwiGLU up, d -> f
        t["layers.mlp.down_proj"] = L * f * d           # elements; SwiGLU down, f -> d
    t["norm"] = d                                     # elements; final RMSNorm
    t["lm_head"] = 0 if shape.tie_embeddings else shape.vocab_size * d  # elements; untied output layer
    return t


def parameter_count(shape) -> int:
    """Total parameters of a GPTShape or a LlamaShape (every expert counted; a tied lm_head once)."""
    if isinstance(shape, LlamaShape):
        return sum(llama_parameter_terms(shape).values())
    return gpt_parameter_count(shape)


def active_parameter_count(shape) -> int:
    """Parameters one token runs through: the total less the experts it does not use, (E - k) of them per layer
    (Mixtral-8x7B: 12.9B of 46.7B); a dense model's total."""
    if not getattr(shape, "n_experts", 0):
        return parameter_count(shape)
    idle = shape.n_experts - shape.experts_per_token
    return parameter_count(shape) - shape.n_layer * idle * 3 * shape.d_model * shape.ffn_hidden


def llama_forward_flops_terms(shape: LlamaShape) -> dict[str, int]:
    """Matmul FLOPs (2·m·n·k) of one Llama block's forward, the experts a token uses only (k of E; balanced
    routing). Elementwise ops (RMSNorm, rotary, SiLU, softmax, routing) are excluded."""
    B, T, d, f = shape.batch, shape.seq_len, shape.d_model, shape.ffn_hidden
    N, q, kv = B * T, shape.n_head * shape.head_dim, shape.n_kv_head * shape.head_dim
    t = {}
    t["attn.q_proj"] = 2 * N * d * q             # FLOPs; [BT, d] @ [d, H·hd]
    t["attn.k_v_proj"] = 2 * 2 * N * d * kv      # FLOPs; two [BT, d] @ [d, Hkv·hd]
    t["attn.scores"] = 2 * B * T * T * q         # FLOPs; Q·K^T over every query head
    t["attn.av"] = 2 * B * T * T * q             # FLOPs; A·V over every query head
    t["attn.o_proj"] = 2 * N * q * d             # FLOPs; [BT, H·hd] @ [H·hd, d]
    routed = shape.experts_per_token if shape.n_experts else 1
    if shape.n_experts:
        t["moe.gate"] = 2 * N * d * shape.n_experts  # FLOPs; the router
    t["mlp"] = routed * 3 * 2 * N * d * f        # FLOPs; gate, up, down for each of a token's k experts
    return t


def training_state_terms(params, optimizer: str | None = "adamw", param_dtype=None,
                         master_weights: bool = False) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state [Adam].

    params: a GPTShape, a LlamaShape or a parameter count. param_dtype defaults to shape.dtype
    (float32 for a bare count). Optimizer states and the master copy are float32.
    """
    if isinstance(params, (GPTShape, LlamaShape)):
        param_dtype = param_dtype or params.dtype
        params = parameter_count(params)
    pb = dtype_bytes(param_dtype or "float32")
    P, fp32 = params, 4
    t = {}
    t["parameters"] = P * pb                     # bytes; weights in param_dtype
    t["gradients"] = P * pb                      # bytes; one gradient per weight, same dtype
    if master_weights:
        t["master_weights"] = P * fp32           # bytes; fp32 master copy for mixed precision
    if optimizer in ("adam", "adamw"):
        t["adam_m"] = P * fp32                   # bytes; first moment, fp32 [Adam]
        t["adam_v"] = P * fp32                   # bytes; second moment, fp32 [Adam]
    elif optimizer == "sgd_momentum":
        t["momentum"] = P * fp32                 # bytes; momentum buffer, fp32
    elif optimizer not in (None, "sgd"):
        raise ValueError(f"unknown optimizer {optimizer!r}")
    return t


def training_state_bytes(params, optimizer: str | None = "adamw", param_dtype=None,
                         master_weights: bool = False) -> int:
    """Total of training_state_terms: 16 B/param for fp32 Adam or fp16 Adam + master."""
    return sum(training_state_terms(params, optimizer, param_dtype, master_weights).values())


# ---------------------------------------------------------- seed activations

SEED_EXAMPLE = dict(n_layer=32, B=4, T=2048, d=4096, bytes_per_value=2)  # [seed] worked example
SEED_PRINTED_ACTIVATION_BYTES = 64 * 10**9  # [seed] "≈ 64 GB"


def seed_activation_bytes_per_layer(B: int, T: int, d: int, bytes_per_value) -> int:
    """[seed] Memory_layer ≈ 12·B·T·d·bytes (no T² attention term, despite its prose)."""
    return 12 * B * T * d * bytes_per_value


def seed_activation_bytes_total(n_layer: int, B: int, T: int, d: int, bytes_per_value) -> int:
    """[seed] n_layer × 12·B·T·d·bytes.

    The seed's own example, 32×12×4×2048×4096×2 = 25,769,803,776 bytes
    ≈ 25.8 GB (exactly 24 GiB), not the "≈ 64 GB" it prints.
    """
    return n_layer * seed_activation_bytes_per_layer(B, T, d, bytes_per_value)


def seed_activation_example(n_head: int = 32) -> dict[str, int]:
    """The seed example side by side: printed figure, its formula, and [K22] for context.

    n_head is not given by the seed; 32 heads (head dim 128) is assumed for [K22].
    """
    e = SEED_EXAMPLE
    s, b, h, L = e["T"], e["B"], e["d"], e["n_layer"]
    return {
        "seed_printed": SEED_PRINTED_ACTIVATION_BYTES,
        "seed_formula": seed_activation_bytes_total(L, b, s, h, e["bytes_per_value"]),
        "korthikanti_none": L * korthikanti_bytes_per_layer(s, b, h, n_head),
        "korthikanti_selective": L * korthikanti_selective_bytes(s, b, h),
        "korthikanti_full": L * korthikanti_full_recompute_bytes(s, b, h),
    }


# ------------------------------------------------------ Korthikanti 2022 [K22]

def korthikanti_terms(s: int, b: int, h: int, a: int, bytes_per_value: int = 2,
                      mask_bytes: int = 1) -> dict[str, int]:
    """Saved bytes per transformer layer, term by term [K22 sec. 4.1].

    With the defaults (2-byte values, 1-byte dropout masks) these are the
    paper's numbers; the total is sbh(34 + 5as/h).
    """
    v, m, sbh, ass = bytes_per_value, mask_bytes, s * b * h, a * s * s * b
    t = {}
    t["attn.qkv_input"] = v * sbh                # bytes; shared input of Q/K/V projections (2sbh)
    t["attn.q_and_k"] = 2 * v * sbh              # bytes; Q and K for QK^T (4sbh)
    t["attn.softmax_output"] = v * ass           # bytes; softmax output (2as²b)
    t["attn.softmax_dropout_mask"] = m * ass     # bytes; attention dropout mask (as²b)
    t["attn.softmax_dropout_output"] = v * ass   # bytes; dropout output, input of A·V (2as²b)
    t["attn.v"] = v * sbh                        # bytes; V for A·V (2sbh)
    t["attn.proj_input"] = v * sbh               # bytes; output-projection input (2sbh)
    t["attn.dropout_mask"] = m * sbh             # bytes; residual dropout mask (sbh)
    t["mlp.fc1_input"] = v * sbh                 # bytes; first linear input (2sbh)
    t["mlp.gelu_input"] = 4 * v * sbh            # bytes; GELU input, 4h wide (8sbh)
    t["mlp.fc2_input"] = 4 * v * sbh             # bytes; second linear input, 4h wide (8sbh)
    t["mlp.dropout_mask"] = m * sbh              # bytes; residual dropout mask (sbh)
    t["layernorms"] = 2 * v * sbh                # bytes; inputs of both LayerNorms (4sbh)
    return t


def korthikanti_bytes_per_layer(s: int, b: int, h: int, a: int, bytes_per_value: int = 2,
                                mask_bytes: int = 1) -> int:
    """[K22 Eq. 1] sbh(34 + 5as/h) bytes at the defaults."""
    return sum(korthikanti_terms(s, b, h, a, bytes_per_value, mask_bytes).values())


def korthikanti_selective_bytes(s: int, b: int, h: int, bytes_per_value: int = 2,
                                mask_bytes: int = 1) -> int:
    """[K22 Table 2] attention core recomputed: every as²b term dropped, 34sbh at the defaults."""
    terms = korthikanti_terms(s, b, h, 1, bytes_per_value, mask_bytes)
    return sum(v for k, v in terms.items() if not k.startswith("attn.softmax"))


# terms every tensor-parallel device holds whole unless sequence parallelism splits them [K22 sec. 4.2]
KORTHIKANTI_REPLICATED = ("attn.qkv_input", "attn.dropout_mask", "mlp.fc1_input", "mlp.dropout_mask", "layernorms")


def korthikanti_parallel_terms(s: int, b: int, h: int, a: int, t: int = 1, sequence: bool = False,
                               selective: bool = False, bytes_per_value: int = 2, mask_bytes: int = 1) -> dict:
    """One device's saved bytes per layer, term by term [K22 Table 2]: with t-way tensor parallelism the
    layer-norm inputs, the QKV and first-MLP inputs and the two residual dropout masks stay whole (10sbh) and the
    rest is split by t; sequence parallelism splits those too; selective recomputation drops the as²b terms.
    Totals at the defaults: sbh(10 + 24/t + 5as/(ht)), (sbh/t)(34 + 5as/h), 34·sbh/t with both."""
    out = {}
    for key, value in korthikanti_terms(s, b, h, a, bytes_per_value, mask_bytes).items():
        if selective and key.startswith("attn.softmax"):
            continue                                                # recomputed, not kept
        whole = key in KORTHIKANTI_REPLICATED and not sequence
        out[key] = value if whole else value // t                   # bytes on one device
    return out


def korthikanti_full_recompute_bytes(s: int, b: int, h: int, bytes_per_value: int = 2) -> int:
    """[K22 Table 2] full recompute keeps only the layer input: 2sbh at 2 bytes."""
    return bytes_per_value * s * b * h


# ------------------------------------------------------------ engine [engine]

def engine_activation_terms(shape: GPTShape) -> dict[str, int]:
    """Bytes our engine saves for backward in one pre-LN nanoGPT block.

    Without dropout the total is 14·E·v + 2·B·T·v + T² + B·H·T²·v (E = B·T·d):
    [K22]'s 34sbh minus its two sbh dropout masks and its two layer-norm inputs (each
    layer norm keeps its output, which the next linear keeps anyway, and recovers x̂ from
    it), plus the LayerNorm 1/std vectors and the bool causal mask. With dropout > 0 the
    three dropout masks are packed 1 bit per element (n/8 bytes, rounded up).
    """
    B, T, d, H, v = shape.batch, shape.seq_len, shape.d_model, shape.n_head, shape.value_bytes
    E, BHTT, drop = B * T * d, B * H * T * T, shape.dropout > 0
    t = {}
    t["ln_1.rstd"] = B * T * v                   # bytes; 1/std per token
    t["attn.c_attn.input"] = E * v               # bytes; ln_1 output: linear input, and ln_1's own save
    t["attn.qkv"] = 3 * E * v                    # bytes; q, k, v: views of one c_attn output, counted once
    t["attn.causal_mask"] = T * T                # bytes; bool [T, T]
    t["attn.softmax_out"] = BHTT * v             # bytes; attention probabilities [B, H, T, T]
    if drop:
        t["attn.attn_dropout_mask"] = -(-BHTT // 8)  # bytes; 1 bit per [B, H, T, T] element
        t["attn.attn_dropout_out"] = BHTT * v    # bytes; dropped probabilities, input of A·V
    t["attn.c_proj.input"] = E * v               # bytes; merged heads
    if drop:
        t["attn.resid_dropout_mask"] = -(-E // 8)  # bytes; 1 bit per [B, T, d] element
    t["ln_2.rstd"] = B * T * v                   # bytes; 1/std per token
    t["mlp.c_fc.input"] = E * v                  # bytes; ln_2 output: linear input, and ln_2's own save
    t["mlp.gelu.input"] = 4 * E * v              # bytes; GELU input [B, T, 4d]
    t["mlp.c_proj.input"] = 4 * E * v            # bytes; GELU output [B, T, 4d]: c_proj input, and GELU's own save
    if drop:
        t["mlp.resid_dropout_mask"] = -(-E // 8)  # bytes; 1 bit per [B, T, d] element
    return t


def engine_activation_bytes_per_layer(shape: GPTShape) -> int:
    return sum(engine_activation_terms(shape).values())


# --------------------------------------------------------------- Chen [C16]

def chen_optimal_segments(n: int, input_bytes: float, interior_bytes: float) -> int:
    """k minimising k·input + (n/k)·interior: round(sqrt(n·interior/input)), in [1, n]."""
    return max(1, min(n, round(math.sqrt(n * interior_bytes / input_bytes))))


def chen_sqrt_peak(n: int, layer_input_bytes: float, layer_interior_bytes: float,
                   segments: int | None = None) -> float:
    """[C16 Eq. 1] peak ≈ k·(segment input) + (largest segment)·(layer interior), bytes.

    segments defaults to chen_optimal_segments (= √n when input == interior).
    The largest of k segments has ceil(n/k) layers (= n/k when k divides n).
    """
    k = segments or chen_optimal_segments(n, layer_input_bytes, layer_interior_bytes)
    stored_inputs = k * layer_input_bytes                       # bytes; one checkpoint per segment
    live_segment = math.ceil(n / k) * layer_interior_bytes      # bytes; one segment replayed in backward
    return stored_inputs + live_segment


def chen_recompute_flops(n: int, layer_forward_flops: float) -> float:
    """[C16] recomputation costs one extra forward pass: n·layer_forward_flops."""
    return n * layer_forward_flops


# ------------------------------------------------------------------- FLOPs

def gpt_forward_flops_terms(shape: GPTShape) -> dict[str, int]:
    """Matmul FLOPs (2·m·n·k) of one block's forward. Elementwise ops (LayerNorm,
    softmax, GELU, residual adds, dropout) are excluded: O(B·T·d + B·H·T²), negligible."""
    B, T, d = shape.batch, shape.seq_len, shape.d_model
    t = {}
    t["attn.qkv"] = 6 * B * T * d * d            # FLOPs; [BT, d] @ [d, 3d]
    t["attn.scores"] = 2 * B * T * T * d         # FLOPs; Q·K^T summed over heads: H·2·T·T·(d/H)
    t["attn.av"] = 2 * B * T * T * d             # FLOPs; A·V summed over heads
    t["attn.proj"] = 2 * B * T * d * d           # FLOPs; [BT, d] @ [d, d]
    t["mlp"] = 16 * B * T * d * d                # FLOPs; [BT, d] @ [d, 4d] and [BT, 4d] @ [4d, d]
    return t


def gpt_forward_flops_per_layer(shape: GPTShape) -> int:
    """24·B·T·d² + 4·B·T²·d."""
    return sum(gpt_forward_flops_terms(shape).values())


def gpt_forward_flops(shape: GPTShape, include_lm_head: bool = True) -> int:
    head = 2 * shape.batch * shape.seq_len * shape.d_model * shape.vocab_size  # FLOPs; tied lm_head
    return shape.n_layer * gpt_forward_flops_per_layer(shape) + (head if include_lm_head else 0)


def gpt_training_flops(shape: GPTShape, recompute: str = "none") -> int:
    """≈ 3× forward (backward ≈ 2× forward); 'full' adds one forward of the blocks [C16],
    'selective' re-runs only the attention core (scores and A·V) [K22]."""
    fwd = gpt_forward_flops(shape)
    per_layer = gpt_forward_flops_terms(shape)
    extra = {
        "none": 0,
        "full": shape.n_layer * gpt_forward_flops_per_layer(shape),
        "selective": shape.n_layer * (per_layer["attn.scores"] + per_layer["attn.av"]),
    }
    if recompute not in extra:
        raise ValueError(f"unknown recompute {recompute!r}")
    return 3 * fwd + extra[recompute]


# ------------------------------------------------------------- seed claims

class SeedClaim(NamedTuple):
    claim: str
    seed_value: float
    formula_value: float
    verdict: str


def seed_claims(n_params: int = 7 * 10**9, gpu_bytes: int = 80 * 10**9) -> list[SeedClaim]:
    """Each numeric claim in [seed] next to what its own formula or premise gives."""
    ex = seed_activation_example()
    act_seed, act = ex["seed_printed"], ex["seed_formula"]
    params16 = training_state_terms(n_params, None, "float16")["parameters"]
    adam = training_state_terms(n_params, "adamw", "float16")
    adam_mv = adam["adam_m"] + adam["adam_v"]
    idle = (SEED_EXAMPLE["n_layer"] - 1) / SEED_EXAMPLE["n_layer"]
    total_seed = params16 + adam_mv + act_seed
    total = sum(adam.values()) + act              # params + grads (fp16) + Adam m, v + activations
    no_act = params16 + adam_mv
    gib80 = 80 * 2**30

    def agree(x, y, rel=0.05):
        return abs(x - y) <= rel * max(abs(x), abs(y))

    return [
        SeedClaim("activations, 32 layers, B=4, T=2048, d=4096, 2 bytes: 32×12×B×T×d×2",
                  act_seed, act,
                  "does not follow: formula gives "
                  f"{format_bytes(act, True)} ({format_bytes(act)}); printed is {act_seed / act:.2f}×"),
        SeedClaim("7B parameters at 16-bit ≈ 14 GB", 14 * 10**9, params16,
                  "follows" if agree(14e9, params16) else "does not follow"),
        SeedClaim("Adam states (fp32 m and v) for 7B ≈ 56 GB", 56 * 10**9, adam_mv,
                  f"follows (m, v only; an fp32 master copy adds {format_bytes(4 * n_params, True)})"
                  if agree(56e9, adam_mv) else "does not follow"),
        SeedClaim("layer 1 of 32 idle for ≈ 97% of the backward pass", 0.97, idle,
                  "follows (31/32 = 96.875%)" if agree(0.97, idle, 0.01) else "does not follow"),
        SeedClaim("7B with Adam does not fit in one 80 GB A100 (seed: 14+56+64 GB; "
                  "formula: params + fp16 grads + Adam m, v + 12·B·T·d·L activations)",
                  total_seed, total,
                  (f"follows: {format_bytes(total, True)} > 80 GB (and > 80 GiB = {gib80:,} B);"
                   f" params + Adam alone ({format_bytes(no_act, True)}) would fit")
                  if total > max(gpu_bytes, gib80) else "does not follow"),
    ]
