"""tinygrad_ckpt: a small NumPy/CuPy autograd engine that shows where training memory goes and how
activation checkpointing buys it back.

    import tinygrad_ckpt as tg
    from tinygrad_ckpt import nn, optim, functional as F

Importing loads the learner's engine (engine/, ops/, backend/), the building blocks (nn, optim,
functional, amp, debug) and the segment operator (recompute/). The ledger, the planner, the plots and the
wings above them (scale/, torch_bridge/, app/) load on first use of a name that needs them.
"""

import importlib as _importlib
import os as _os
import sys as _sys

from . import state as _state  # imports nothing: NumPy is not loaded yet

if _state.tune_process and "numpy" not in _sys.modules and "OPENBLAS_THREAD_TIMEOUT" not in _os.environ:
    _os.environ["OPENBLAS_THREAD_TIMEOUT"] = "14"  # OpenBLAS reads it once, as NumPy loads it (why: backend/threads.py)
    _state.process_settings["OPENBLAS_THREAD_TIMEOUT"] = "14"

from . import debug, functional, nn, optim
from .amp import autocast
from .backend import get_rng_state, manual_seed, set_rng_state, use_backend
from .debug import detect_anomaly
from .engine.function import Context, Function
from .engine.tape import Tape, TapeEntry
from .engine.tensor import Parameter, Tensor, increment_version
from .recompute.checkpoint import CheckpointError, checkpoint
from .recompute.plans import checkpoint_sequential, run_plan
from .recompute.policies import Decision, Policy, korthikanti_selective, save_matmuls, save_nothing
from .state import enable_grad, is_grad_enabled, name_scope, no_grad, set_grad_enabled

# name -> the module that defines it, imported on first use (PEP 562)
_LAZY = {
    "Ledger": "memory.ledger", "OutOfMemoryError": "memory.ledger",
    "draw_tape": "memory.tapeview", "print_saved": "memory.tapeview",
    "plan": "scale.measure", "block_costs": "scale.measure", "saves_like": "scale.save_profiles",
    "LayerCost": "recompute.planner", "Plan": "recompute.planner", "plan_chain": "recompute.planner",
}
# modules reached as attributes (`from tinygrad_ckpt import plots`), the flat names of before the wings included
_MODULES = {
    "plots": "memory.plots", "ledger": "memory.ledger", "events": "memory.events", "exports": "memory.exports",
    "memory_viz": "memory.memory_viz", "explorer": "memory.explorer", "tapeview": "memory.tapeview",
    "cuda_allocator": "memory.cuda_allocator", "palette": "memory.palette",
    "planner": "recompute.planner", "policies": "recompute.policies", "checkpoint_plans": "recompute.plans",
    "estimate": "scale.estimate", "measure": "scale.measure", "report": "scale.report",
    "parallel": "scale.parallel", "devices": "scale.devices",
    "torch_plans": "torch_bridge.plans", "torch_saves": "torch_bridge.saves", "torch_weights": "torch_bridge.weights",
    "torch_dist": "torch_bridge.dist", "torch_bridge": "torch_bridge",
    "cli": "app.cli", "figures": "app.figures", "notebooks": "app.notebooks", "apidoc": "app.apidoc",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(_importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _MODULES:
        value = _importlib.import_module(f".{_MODULES[name]}", __name__)
    else:
        raise AttributeError(f"module 'tinygrad_ckpt' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_MODULES))


__all__ = [
    "Tensor", "Parameter", "Function", "Context", "Tape", "TapeEntry", "no_grad", "enable_grad", "set_grad_enabled",
    "is_grad_enabled", "name_scope", "increment_version", "manual_seed", "get_rng_state", "set_rng_state",
    "use_backend", "Ledger", "OutOfMemoryError", "checkpoint", "checkpoint_sequential", "CheckpointError", "Policy",
    "Decision", "save_nothing", "save_matmuls", "korthikanti_selective", "detect_anomaly", "debug", "functional",
    "nn", "optim", "draw_tape", "print_saved", "autocast", "saves_like", "plan", "run_plan", "block_costs",
    "plan_chain", "LayerCost", "Plan",
]
__version__ = "0.1.0"
