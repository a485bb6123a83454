"""Test helpers: central finite differences with a random output weighting, error measures,
buffer identity, and a tiny GPT."""

from __future__ import annotations

import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn


def to_numpy(a) -> np.ndarray:
    """A backend array (or Tensor, or number) as a NumPy array."""
    if isinstance(a, tg.Tensor):
        return a.numpy()
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # cupy
        return a.get()
    return np.asarray(a)


def rel_err(actual, expected) -> float:
    """max |actual - expected| / max |expected|: the error relative to the largest magnitude."""
    actual, expected = to_numpy(actual).astype(np.float64), to_numpy(expected).astype(np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    scale = max(float(np.abs(expected).max(initial=0.0)), 1e-300)
    return float(np.abs(actual - expected).max(initial=0.0)) / scale


def owner(a):
    """The object that owns the memory behind an array: views resolve to their base buffer.

    Written independently of backend.Backend.buffer on purpose (tests should not trust the code
    they check)."""
    if isinstance(a, np.ndarray):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a
    return a.data.mem  # cupy: the pool allocation behind every view


def owner_nbytes(a) -> int:
    o = owner(a)
    return int(o.nbytes) if isinstance(o, np.ndarray) else int(o.size)


def weighted_loss(out: tg.Tensor, w) -> tg.Tensor:
    """sum(out * w) with a fixed random weighting w (catches transposes a plain sum() hides)."""
    return (out * tg.Tensor(w)).sum()


def to_backend(value):
    """NumPy arrays in op kwargs (indices, masks, targets) moved to the active backend."""
    if isinstance(value, np.ndarray):
        return backend.current().asarray(value)
    if isinstance(value, tuple):
        return tuple(to_backend(v) for v in value)
    return value


def numeric_grads(fn, arrays, w, kwargs=None, eps=1e-6):
    """Central differences of L(arrays) = sum(fn(*arrays) * w) for every element of every array.

    arrays: float64 backend arrays (not modified); fn takes Tensors. Returns NumPy arrays.
    """
    kwargs = kwargs or {}

    def loss(arrs):
        with tg.no_grad():
            out = fn(*[tg.Tensor(a) for a in arrs], **kwargs)
        return float((to_numpy(out.data).astype(np.float64) * to_numpy(w)).sum())

    grads = []
    work = [a.copy() for a in arrays]
    for a in work:
        g = np.zeros(a.shape)
        flat = a.reshape(-1)  # a view: perturbing it perturbs work[k]
        for i in range(flat.size):
            old = float(flat[i])
            flat[i] = old + eps
            up = loss(work)
            flat[i] = old - eps
            down = loss(work)
            flat[i] = old
            g.reshape(-1)[i] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def analytic_grads(fn, arrays, w, kwargs=None):
    """(output, [grad per input]) from our backward of sum(fn(*tensors) * w)."""
    kwargs = kwargs or {}
    tensors = [tg.Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tensors, **kwargs)
    weighted_loss(out, w).backward()
    return out, [t.grad for t in tensors]


def tiny_gpt(vocab=11, block_size=8, n_layer=2, n_head=2, d_model=16, dropout=0.0, dtype=None, seed=0):
    tg.manual_seed(seed)
    model = nn.GPT(vocab, block_size, n_layer, n_head, d_model, dropout=dropout)
    if dtype is not None:
        model.to(dtype)
    return model


def tiny_batch(vocab=11, batch=2, seq=8, seed=0):
    r = np.random.default_rng(seed)
    idx = r.integers(0, vocab, size=(batch, seq))
    targets = r.integers(0, vocab, size=(batch, seq))
    return idx, targets


def train_step(model, opt, idx) -> None:
    """One training step of a GPT on idx (the targets are idx too): forward, backward, opt.step(), zero_grad()."""
    _, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad()
