"""Optimizers. Their states are backend arrays, allocated on the first step (as in PyTorch), and
counted by the ledger as "optimizer" memory; updates run in place on `p.data`, and each updated
parameter's version is bumped, so a graph recorded before the step refuses to run backward.

`step()` and `zero_grad()` are the ledger's phase "optimizer" by themselves, and each parameter's
update is one op there, named after the parameter, with its FLOPs (no wrapper needed). A state is
named `<parameter path>:<optimizer>.<state>`, e.g. `transformer.h.0.attn.c_attn.weight:adamw.m`."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Mapping, Set

import numpy as np

from . import state
from .backend import kernels, xp
from .checks import HALF_DTYPES, float_dtype, number
from .engine import observe
from .engine.tensor import Tensor, increment_version


def _check(optimizer: str, name: str, value, ok, wanted: str):
    """ValueError at construction, as PyTorch's optimizers do: a wrong hyperparameter steps uphill silently.
    `ok` is a test of a number (a non-number fails it) or, for a structured value, a plain bool. Returns the
    value with a NumPy scalar made a Python float (`_plain`)."""
    if not (ok if isinstance(ok, bool) else number(value) and ok(value)):
        raise ValueError(f"{optimizer}: invalid {name} {value!r}: expected {wanted}")
    return _plain(value)


def _plain(value):
    """A NumPy scalar as a Python float (np.float32 hyperparameters would change the update's arithmetic)."""
    return value if type(value) in (int, float) or not number(value) else float(value)


def _parameters(optimizer: str, params) -> list:
    """The parameters as a list, refusing what PyTorch refuses (a set, a non-Tensor, a non-leaf) and a parameter
    given twice (PyTorch warns that this "will cause an error" in future: it updates the tensor twice per step)."""
    hint = "pass model.parameters()"
    if isinstance(params, Tensor):
        raise TypeError(f"{optimizer}: params must be an iterable of Tensors, got one Tensor "
                        f"'{params.name or 'tensor'}'; pass [tensor] or model.parameters()")
    if isinstance(params, (Set, Mapping)) or not hasattr(params, "__iter__"):
        why = "a set has no stable order" if isinstance(params, Set) else "it is not iterable"
        raise TypeError(f"{optimizer}: params must be a list (or another ordered iterable) of Tensors, got "
                        f"{type(params).__name__} ({why}); {hint}")
    params = list(params)
    if not params:
        raise ValueError(f"{optimizer}: got an empty parameter list; {hint}")
    seen: dict[int, int] = {}
    for i, p in enumerate(params):
        if isinstance(p, Mapping):
            raise TypeError(f"{optimizer}: parameter groups (dicts) are not supported; give one list of Tensors and "
                            "make one optimizer per group of hyperparameters")
        if not isinstance(p, Tensor) or not p.requires_grad:
            raise TypeError(f"{optimizer}: every parameter must be a Tensor that requires grad, got {p!r} at "
                            f"position {i}")
        if not p.is_leaf:
            raise ValueError(f"{optimizer}: can't optimize a non-leaf Tensor ('{p.name or 'tensor'}' at position {i} "
                             "was made by an op); pass the leaf parameters, e.g. model.parameters()")
        if id(p) in seen:
            raise ValueError(f"{optimizer}: parameter '{p.name or 'tensor'}' {list(p.shape)} appears twice (positions "
                             f"{seen[id(p)]} and {i}): a tied parameter would be updated twice per step; "
                             f"{hint}, which lists a tied parameter once")
        seen[id(p)] = i
    return params


@contextlib.contextmanager
def _sigint_held():
    """Hold SIGINT (Ctrl-C) while the block runs, then hand it to the handler that was there before (Python's
    raises KeyboardInterrupt). Only the main thread can set a signal handler: elsewhere, and where the handler in
    place was not set from Python (it could not be put back), this does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # delivered now, to the handler that was there


class Optimizer:
    """`master_weights=True` keeps a float32 copy of each half-precision (bfloat16, float16) parameter (mixed
    precision: the optimizer state ":master"), updates it in float32 and writes the parameter back rounded, each
    step; float32 and float64 parameters are updated in place as without it."""

    def __init__(self, params, lr: float, state_dtype=None, master_weights: bool = False):
        name = type(self).__name__
        self.params = _parameters(name, params)
        self.lr = _check(name, "lr", lr, lambda v: v >= 0, "a learning rate >= 0")
        _check(name, "state_dtype", state_dtype, state_dtype is None or float_dtype(state_dtype),
               "None (the parameter's dtype; float32 for a half one) or a floating-point dtype such as np.float32")
        _check(name, "master_weights", master_weights, isinstance(master_weights, bool), "True or False")
        self.state_dtype = state_dtype
        self.master_weights = master_weights
        self.state: dict[int, dict] = {}
        self.step_count = 0
        state.new_optimizer(self)  # remembered weakly: a Ledger entered later counts its states

    def __repr__(self) -> str:
        hyper = ", ".join(f"{k}={v!r}" for k, v in vars(self).items()
                          if k not in ("params", "state", "step_count", "state_dtype", "master_weights"))
        return f"{type(self).__name__}({hyper}; {len(self.params)} parameters, {self.step_count} steps taken)"

    def zero_grad(self) -> None:
        """Drop every gradient (set to None, so the memory is really freed)."""
        with observe.phase("optimizer"):
            for p in self.params:
                p.grad = None

    @property
    def kind(self) -> str:
        """The optimizer's name on its update slices and states in the ledger: "adamw", "sgd"."""
        return type(self).__name__.lower()

    def flops_per_element(self) -> int:
        """Arithmetic operations `update` spends on one element of a parameter."""
        raise NotImplementedError

    def mastered(self, p) -> bool:
        """Does p get a float32 master copy? Under master weights, when it is half precision."""
        return self.master_weights and p.dtype in HALF_DTYPES

    def state_dtype_of(self, p):
        """The dtype of p's states: `state_dtype`, else float32 for a mastered half parameter, else p's own
        (PyTorch's)."""
        if self.state_dtype is not None:
            return self.state_dtype
        return np.float32 if self.mastered(p) else p.dtype

    def _state(self, p, **names):
        """The state arrays of parameter p, created on first use: zeros, and with master weights p's values in
        float32 (":master")."""
        st = self.state.get(id(p))
        if st is None:
            dtype = self.state_dtype_of(p)
            st = {k: xp().zeros(p.shape, dtype=dtype) for k in names}
            if self.mastered(p):
                st["master"] = p.data.astype(np.float32)
            for k, a in st.items():
                observe.alloc(a, "optimizer", p.name or "param", k, self.kind)
            self.state[id(p)] = st
        return st

    def _updated(self, p):
        """The array an update writes: p's float32 master copy if it has one, else p's data."""
        return self.state[id(p)]["master"] if self.mastered(p) else p.data

    def step(self) -> None:
        """Update every parameter that has a gradient. A Ctrl-C during the step is held until the step ends (on the
        main thread), so every parameter gets its whole update first: a checkpoint saved in the handler is whole."""
        with _sigint_held(), observe.phase("optimizer"):
            self.step_count += 1
            kind, flops = self.kind, self.flops_per_element()
            for p in self.params:
                if p.grad is not None:
                    arrays = (p.data, p.grad, *self.state.get(id(p), {}).values())  # what the update reads and writes
                    with observe.update(kind, p.name or "param", (flops + self.mastered(p)) * p.size, arrays):
                        self.update(p, p.grad)
                        if self.mastered(p):
                            p.data[...] = self.state[id(p)]["master"]  # the half weights, refreshed (rounded)
                    increment_version(p)

    def update(self, p, g) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """v ← μ·v + g (+ λ·w);  w ← w - lr·v.  One state (the velocity) when momentum > 0."""

    def __init__(self, params, lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0,
                 state_dtype=None, master_weights: bool = False):
        super().__init__(params, lr, state_dtype, master_weights)
        self.momentum = _check("SGD", "momentum", momentum, lambda v: v >= 0, "momentum >= 0")
        self.weight_decay = _check("SGD", "weight_decay", weight_decay, lambda v: v >= 0, "weight_decay >= 0")

    def flops_per_element(self) -> int:
        return 2 + (2 if self.weight_decay else 0) + (2 if self.momentum else 0)  # w -= lr·v; + λ·w; μ·v + g

    def update(self, p, g) -> None:
        st = self._state(p, **({"velocity": None} if self.momentum else {}))
        w = self._updated(p)
        g = g if g.dtype == w.dtype else g.astype(w.dtype)
        if self.weight_decay:
            g = g + self.weight_decay * w
        if self.momentum:
            v = st["velocity"]
            v *= self.momentum
            v += g
            g = v
        w -= self.lr * g


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;  w ← w - lr·(m̂/(√v̂ + eps) + λ·w),
    with m̂ = m/(1-β1ᵗ), v̂ = v/(1-β2ᵗ). Two states per parameter, in the parameter's dtype (float32 under master
    weights) unless `state_dtype` says otherwise. The update is computed in float32 whatever the dtypes (in
    float16, eps = 1e-8 is 0 and a small v divides by 0), and stored back rounded."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, state_dtype=None, master_weights: bool = False):
        super().__init__(params, lr, state_dtype, master_weights)
        ok = isinstance(betas, (tuple, list)) and len(betas) == 2 and all(number(b) and 0 <= b < 1 for b in betas)
        _check("AdamW", "betas", betas, ok, "two numbers in [0, 1), e.g. (0.9, 0.999)")
        self.betas = tuple(_plain(b) for b in betas)
        self.eps = _check("AdamW", "eps", eps, lambda v: v > 0, "eps > 0")
        self.weight_decay = _check("AdamW", "weight_decay", weight_decay, lambda v: v >= 0, "weight_decay >= 0")

    def flops_per_element(self) -> int:
        # m: 3, v: 4, v̂ and √v̂ + eps: 3, w -= step·m/denom: 3, decay: 1
        return 13 + (1 if self.weight_decay else 0)

    def update(self, p, g) -> None:
        st = self._state(p, m=None, v=None)
        kernels.adamw_update(self._updated(p), st["m"], st["v"], g, self.lr, self.betas, self.eps,
                             self.weight_decay, self.step_count)
