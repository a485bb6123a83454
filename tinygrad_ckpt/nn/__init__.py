"""Modules shaped like nanoGPT's and Hugging Face's Llama family, with their parameter names and layouts.

    module.py   Module (children and parameters named by path) and the layers: Linear, Embedding, LayerNorm,
                RMSNorm, Dropout, SiLU, ModuleList, ModuleDict
    gpt.py      the GPT family (nanoGPT's CausalSelfAttention, MLP, Block, GPT)
    llama.py    Llama, Mistral and Mixtral (rotary positions, grouped-query attention, SwiGLU, sparse MoE)
"""

from ..engine.tensor import Parameter, Tensor  # noqa: F401  (nn.Parameter, nn.Tensor, as before)
from .module import *  # noqa: F403
from .module import (  # noqa: F401  (helpers other modules and tests reach as nn._name)
    F, _dropout, _float_dtype, _heads, _input, _name_children, _normal, _real, _same, _size, _token_ids,
)
