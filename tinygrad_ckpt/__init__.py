"""tinygrad_ckpt: a small NumPy/CuPy autograd engine that shows where training memory goes and how
activation checkpointing buys it back.

    import tinygrad_ckpt as tg
    from tinygrad_ckpt import nn, optim, functional as F
"""

import os as _os
import sys as _sys

from . import state as _state  # imports nothing: NumPy is not loaded yet

if _state.tune_process and "numpy" not in _sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in _os.environ:
    _os.environ["OPENBLAS_THREAD_TIMEOUT"] = "14"  # OpenBLAS reads it once, as NumPy loads it (why: backend/threads.py)
    _state.process_settings["OPENBLAS_THREAD_TIMEOUT"] = "14"

from . import debug, functional, nn, optim
from .amp import autocast
from .backend import get_rng_state, manual_seed, set_rng_state, use_backend
from .checkpoint import CheckpointError, checkpoint
from .checkpoint_plans import checkpoint_sequential, run_plan
from .debug import detect_anomaly
from .function import Context, Function
from .ledger import Ledger, OutOfMemoryError
from .measure import block_costs, plan
from .planner import LayerCost, Plan, plan_chain
from .policies import Decision, Policy, korthikanti_selective, save_matmuls, save_nothing
from .state import enable_grad, is_grad_enabled, name_scope, no_grad, saves_like, set_grad_enabled
from .tape import Tape, TapeEntry
from .tapeview import draw_tape, print_saved
from .tensor import Parameter, Tensor, increment_version

__all__ = [
    "Tensor", "Parameter", "Function", "Context", "Tape", "TapeEntry", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "name_scope", "increment_version", "manual_seed", "get_rng_state", "set_rng_state",
    "use_backend", "Ledger", "OutOfMemoryError", "checkpoint", "checkpoint_sequential", "CheckpointError", "Policy",
    "Decision", "save_nothing", "save_matmuls", "korthikanti_selective", "detect_anomaly", "debug", "functional",
    "nn", "optim", "draw_tape", "print_saved", "autocast", "saves_like", "plan", "run_plan", "block_costs",
    "plan_chain", "LayerCost", "Plan",
]
__version__ = "0.1.0"
