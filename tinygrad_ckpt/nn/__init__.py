"""Modules shaped like nanoGPT's, with the same parameter names and layouts; and the Llama family (Llama,
Mistral, Mixtral) with Hugging Face's.

    module.py   Module (children and parameters named by path) and the layers: Linear, Embedding, LayerNorm,
                RMSNorm, Dropout, SiLU, ModuleList, ModuleDict
    gpt.py      the GPT family (nanoGPT's CausalSelfAttention, MLP, Block, GPT)
    llama.py    Llama, Mistral and Mixtral (rotary positions, grouped-query attention, SwiGLU, sparse MoE)
"""

from .. import functional as F  # noqa: F401  (nn.F, nn.Parameter, nn.Tensor and nn._normal, as before)
from ..engine.tensor import Parameter, Tensor  # noqa: F401
from .gpt import GPT, MLP, Block, CausalSelfAttention  # noqa: F401
from .llama import (  # noqa: F401
    Llama,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaModel,
    MixtralExpert,
    MixtralSparseMoeBlock,
    RotaryEmbedding,
    llama_ffn_hidden,
)
from .module import (  # noqa: F401
    Dropout,
    Embedding,
    LayerNorm,
    Linear,
    Module,
    ModuleDict,
    ModuleList,
    RMSNorm,
    SiLU,
    _normal,
)

# in the order the API reference lists them (app/apidoc.py)
__all__ = [
    "llama_ffn_hidden", "Module", "ModuleList", "ModuleDict", "Linear", "LayerNorm", "Embedding", "Dropout",
    "CausalSelfAttention", "MLP", "Block", "GPT", "RMSNorm", "SiLU", "RotaryEmbedding", "LlamaAttention", "LlamaMLP",
    "MixtralExpert", "MixtralSparseMoeBlock", "LlamaDecoderLayer", "LlamaModel", "Llama",
]
