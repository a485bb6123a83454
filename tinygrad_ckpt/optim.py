"""Optimizers. Their states are backend arrays, allocated on the first step (as in PyTorch), and
counted by the ledger as "optimizer" memory; updates run in place on `p.data`, and each updated
parameter's version is bumped, so a graph recorded before the step refuses to run backward."""

from __future__ import annotations

from . import observe
from .backend import xp
from .tensor import increment_version


class Optimizer:
    def __init__(self, params, lr: float, state_dtype=None):
        self.params = [p for p in params]
        self.lr = lr
        self.state_dtype = state_dtype  # None: the parameter's dtype (as PyTorch); e.g. np.float32 for fp16 params
        self.state: dict[int, dict] = {}
        self.step_count = 0

    def zero_grad(self) -> None:
        """Drop every gradient (set to None, so the memory is really freed)."""
        for p in self.params:
            p.grad = None

    def _state(self, p, **names):
        """The state arrays of parameter p, created as zeros on first use."""
        st = self.state.get(id(p))
        if st is None:
            st = {k: xp().zeros(p.shape, dtype=self.state_dtype or p.dtype) for k in names}
            for k, a in st.items():
                observe.alloc(a, "optimizer", f"{p.name or 'param'}.{k}")
            self.state[id(p)] = st
        return st

    def step(self) -> None:
        with observe.phase("optimizer"):
            self.step_count += 1
            for p in self.params:
                if p.grad is not None:
                    self.update(p, p.grad)
                    increment_version(p)

    def update(self, p, g) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """v ← μ·v + g (+ λ·w);  w ← w - lr·v.  One state (the velocity) when momentum > 0."""

    def __init__(self, params, lr: float = 1e-2, momentum: float = 0.0, weight_decay: float = 0.0,
                 state_dtype=None):
        super().__init__(params, lr, state_dtype)
        self.momentum, self.weight_decay = momentum, weight_decay

    def update(self, p, g) -> None:
        if self.weight_decay:
            g = g + self.weight_decay * p.data
        if self.momentum:
            v = self._state(p, velocity=None)["velocity"]
            v *= self.momentum
            v += g
            g = v
        p.data -= self.lr * g


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter):
    m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;  w ← w - lr·(m̂/(√v̂ + eps) + λ·w),
    with m̂ = m/(1-β1ᵗ), v̂ = v/(1-β2ᵗ). Two states per parameter, in the parameter's dtype unless
    `state_dtype` says otherwise (float32 states for float16 parameters, as mixed precision keeps them)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, state_dtype=None):
        super().__init__(params, lr, state_dtype)
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, p, g) -> None:
        b1, b2 = self.betas
        st = self._state(p, m=None, v=None)
        m, v = st["m"], st["v"]
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        t = self.step_count
        if self.weight_decay:
            p.data *= 1 - self.lr * self.weight_decay
        step = self.lr / (1 - b1**t)
        denom = xp().sqrt(v / (1 - b2**t))
        denom += self.eps
        p.data -= step * (m / denom)
