"""The fused elementwise kernels the ops call by name (ops/nn.py, ops/elementwise.py, optim.py).

Each is the op's formula as a few in-place array passes into one output, with as few temporaries as the
math allows, run on blocks of rows over the thread pool by `threads.rows` (on NumPy, for big arrays; once on
the whole arrays otherwise): bit for bit the result of one call on the whole arrays. Float32 GELU on NumPy
uses erf.py's fit; row sums use the backend's `row_sums` / `row_dots` (einsum and vecdot on NumPy).
"""

from __future__ import annotations

import math

import numpy as np

from . import current, threads, xp
from .erf import gelu_float32

_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_SQRT_HALF = math.sqrt(0.5)
_TANH_C = math.sqrt(2 / math.pi)


# ---- GELU ---------------------------------------------------------------------------------------------
def gelu(x, approximate: str):
    """x·Φ(x), Φ(x) = ½(1 + erf(x/√2)); "tanh": ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    out = xp().empty(x.shape, dtype=x.dtype)
    threads.rows(_gelu_tanh if approximate == "tanh" else _gelu_erf, out, x)
    return out


def _gelu_erf(out, x):
    if current().xp is np and x.dtype == np.float32:
        gelu_float32(x, out)  # x / (1 + e^(x·G(x²))): 17 passes (erf.py)
        return
    out[...] = current().erf(x * _SQRT_HALF)  # SciPy's erf has no float16 loop: the assignment casts
    out += 1
    out *= 0.5 * x


def _gelu_tanh(out, x):
    out[...] = xp().tanh(_TANH_C * (x + 0.044715 * x * x * x))
    out += 1
    out *= 0.5 * x


def gelu_grad(grad_out, x, out, approximate: str):
    """g·(Φ(x) + x·φ(x)), φ(x) = e^(-x²/2)/√(2π) ("tanh": its own derivative), with Φ(x) read from the output:
    out/x (½ at x = 0)."""
    grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)
    threads.rows(_gelu_tanh_grad if approximate == "tanh" else _gelu_erf_grad, grad, x, out, grad_out)
    return grad


def _phi(phi, x, out):
    """phi = Φ = out/x, read from gelu's output (½ where x = 0, which divides 0 by 1 instead of by 0)."""
    zero = x == 0
    xp().divide(out, x + zero, out=phi)
    xp().copyto(phi, xp().asarray(0.5, dtype=phi.dtype), where=zero)


def _gelu_erf_grad(grad, x, out, grad_out):
    _phi(grad, x, out)
    density = x * x
    density *= -0.5
    xp().exp(density, out=density)
    density *= x
    density *= _INV_SQRT_2PI
    grad += density
    grad *= grad_out


def _gelu_tanh_grad(grad, x, out, grad_out):
    """grad = g·(½(1 + t) + ½x(1 - t²)·√(2/π)(1 + 3·0.044715x²)), t = 2Φ - 1 read from the output."""
    _phi(grad, x, out)  # ½(1 + t)
    t = 2 * grad - 1
    grad += 0.5 * x * (1 - t * t) * _TANH_C * (1 + 3 * 0.044715 * x * x)
    grad *= grad_out


# ---- softmax ------------------------------------------------------------------------------------------
def softmax(x, axis):
    """e^(x - max) / Σ e^(x - max) along `axis` (an int counted from 0, or () for a 0-d x)."""
    out = xp().empty(x.shape, dtype=x.dtype)
    _by_rows(_softmax, axis, out, x)
    return out


def _softmax(out, x, axis):
    xp().subtract(x, x.max(axis=axis, keepdims=True), out=out)
    xp().exp(out, out=out)
    out /= current().row_sums(out) if axis == -1 else out.sum(axis=axis, keepdims=True)


def softmax_grad(grad_out, y, axis):
    """y·(g - Σ g·y) along `axis`, with no temporary beyond the row sums."""
    grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)
    _by_rows(_softmax_grad, axis, grad, y, grad_out)
    return grad


def _softmax_grad(out, y, grad_out, axis):
    xp().multiply(grad_out, y, out=out)
    dot = out.sum(axis=axis, keepdims=True)
    xp().subtract(grad_out, dot, out=out)
    out *= y


def _by_rows(kernel, axis, *arrays):
    """kernel(*arrays, axis=axis), on blocks of rows when the axis is the last one (nothing to do when empty)."""
    if math.prod(arrays[0].shape) == 0:
        return
    if axis == len(arrays[0].shape) - 1:
        threads.rows(lambda *chunks: kernel(*chunks, axis=-1), *arrays)
    else:
        kernel(*arrays, axis=axis)


# ---- layer norm -----------------------------------------------------------------------------------------
def layer_norm(x, weight, bias, eps: float):
    """(out, x̂, mean, 1/std) with x̂ = (x - mean)/√(var + eps) over the last axis and out = x̂·w + b."""
    out = xp().empty(x.shape, dtype=x.dtype)
    xhat = xp().empty(x.shape, dtype=x.dtype)
    mean = xp().empty(x.shape[:-1] + (1,), dtype=x.dtype)
    rstd = xp().empty(x.shape[:-1] + (1,), dtype=x.dtype)
    if math.prod(x.shape) == 0:  # nothing to normalise (and a row of no values has no mean)
        mean[...], rstd[...] = 0, 0
        return out, xhat, mean, rstd
    be, d = current(), x.shape[-1]

    def normalise(out, xhat, row_mean, rstd, x):
        mean = be.row_sums(x)
        mean /= d
        row_mean[...] = mean
        xp().subtract(x, mean, out=xhat)
        var = be.row_dots(xhat, xhat)
        var /= d
        var += eps
        rstd[...] = 1 / xp().sqrt(var)
        xhat *= rstd
        xp().multiply(xhat, weight, out=out)
        out += bias

    threads.rows(normalise, out, xhat, mean, rstd, x)
    return out, xhat, mean, rstd


def layer_norm_xhat_from_input(x, mean, rstd):
    """x̂ = (x - mean)·(1/std), from the saved input and statistics (what PyTorch's kernel keeps)."""
    xhat = xp().empty(x.shape, dtype=x.dtype)

    def normalised(xhat, x, mean, rstd):
        xp().subtract(x, mean, out=xhat)
        xhat *= rstd

    threads.rows(normalised, xhat, x, mean, rstd)
    return xhat


def layer_norm_xhat(out, weight, bias, zeros: bool):
    """x̂ = (out - b)/w, recovered from the output; with `zeros` (some weight is exactly 0) those columns divide by
    1 instead, and are lost: the op kept them."""
    safe = xp().where(weight == 0, xp().ones((), dtype=weight.dtype), weight) if zeros else weight
    xhat = xp().empty(out.shape, dtype=out.dtype)

    def recover(xhat, out):
        xp().subtract(out, bias, out=xhat)
        xhat /= safe

    threads.rows(recover, xhat, out)
    return xhat


def layer_norm_input_grad(grad_out, xhat, rstd, weight):
    """dL/dx = (1/std)·(ĝ - mean(ĝ) - x̂·mean(ĝ·x̂)) with ĝ = g·w, over the last axis."""
    gx = xp().empty(grad_out.shape, dtype=grad_out.dtype)

    def input_grad(gx, grad_out, xhat, rstd):
        xp().multiply(grad_out, weight, out=gx)  # ĝ = g·w
        dot = (gx * xhat).mean(axis=-1, keepdims=True)
        gx -= gx.mean(axis=-1, keepdims=True)
        gx -= xhat * dot
        gx *= rstd

    threads.rows(input_grad, gx, grad_out, xhat, rstd)
    return gx


# ---- masked fill ----------------------------------------------------------------------------------------
def masked_fill(x, mask, value: float, scale: float):
    """value where mask else x·scale; the mask lines up with x's last axes and repeats along the others."""
    out = xp().empty(np.broadcast_shapes(tuple(x.shape), tuple(mask.shape)), dtype=x.dtype)
    fill, factor = xp().asarray(value, dtype=x.dtype), xp().asarray(scale, dtype=x.dtype)

    def kernel(out, x):
        xp().multiply(x, factor, out=out)
        xp().copyto(out, fill, where=mask)

    threads.rows(kernel, out, x, inner=len(mask.shape))
    return out


def masked_fill_grad(grad_out, mask, scale: float):
    """0 where mask else g·scale."""
    grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)
    zero, factor = xp().zeros((), dtype=grad_out.dtype), xp().asarray(scale, dtype=grad_out.dtype)

    def kernel(grad, grad_out):
        xp().multiply(grad_out, factor, out=grad)
        xp().copyto(grad, zero, where=mask)

    threads.rows(kernel, grad, grad_out, inner=len(mask.shape))
    return grad


# ---- AdamW ----------------------------------------------------------------------------------------------
def adamw_update(w, m, v, g, lr: float, betas: tuple, eps: float, weight_decay: float, t: int) -> None:
    """In place, computed in float32 (w, m, v may be half precision): m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;
    w ← w·(1 - lr·λ) - lr/(1-β1ᵗ) · m/(√(v/(1-β2ᵗ)) + eps)."""
    b1, b2 = betas
    decay = 1 - lr * weight_decay
    step = lr / (1 - b1**t)

    def kernel(w, m, v, g):
        if np.dtype(m.dtype).itemsize < 4:  # half-precision states: updated in float32 copies, stored back rounded
            m32, v32 = m.astype(np.float32), v.astype(np.float32)
            w32 = w.astype(np.float32)
            kernel(w32, m32, v32, g)
            m[...], v[...], w[...] = m32, v32, w32
            return
        if g.dtype != m.dtype:  # a half-precision gradient: the update runs in the states' float32
            g = g.astype(m.dtype)
        m *= b1
        m += (1 - b1) * g
        v *= b2
        v += (1 - b2) * (g * g)
        if weight_decay:
            w *= decay
        denom = xp().sqrt(v / (1 - b2**t))
        denom += eps
        w -= step * (m / denom)

    threads.rows(kernel, w, m, v, g)


# ---- SiLU ---------------------------------------------------------------------------------------------
def silu(x):
    """x·σ(x) = x / (1 + e^(-x))."""
    out = xp().empty(x.shape, dtype=x.dtype)

    def kernel(out, x):
        xp().negative(x, out=out)
        xp().exp(out, out=out)
        out += 1
        xp().divide(x, out, out=out)

    threads.rows(kernel, out, x)
    return out


def silu_grad(grad_out, x):
    """g·σ(x)·(1 + x·(1 - σ(x)))."""
    grad = xp().empty(grad_out.shape, dtype=grad_out.dtype)

    def kernel(grad, x, grad_out):
        xp().negative(x, out=grad)
        xp().exp(grad, out=grad)
        grad += 1
        xp().divide(1, grad, out=grad)  # σ(x)
        rest = 1 - grad
        rest *= x
        rest += 1  # 1 + x·(1 - σ)
        grad *= rest
        grad *= grad_out

    threads.rows(kernel, grad, x, grad_out)
    return grad


# ---- RMS norm -----------------------------------------------------------------------------------------
def rms_norm(x, weight, eps: float):
    """(out, 1/rms) with 1/rms = 1/√(mean(x²) + eps) over the last axis and out = (x·(1/rms))·w."""
    out = xp().empty(x.shape, dtype=x.dtype)
    rstd = xp().empty(x.shape[:-1] + (1,), dtype=x.dtype)
    if math.prod(x.shape) == 0:
        rstd[...] = 0
        return out, rstd
    be, d = current(), x.shape[-1]

    def normalise(out, rstd, x):
        var = be.row_dots(x, x)
        var /= d
        var += eps
        rstd[...] = 1 / xp().sqrt(var)
        xp().multiply(x, rstd, out=out)
        out *= weight

    threads.rows(normalise, out, rstd, x)
    return out, rstd


def rms_norm_grads(grad_out, x, rstd, weight):
    """(dL/dx, dL/dw): with x̂ = x·(1/rms) and ĝ = g·w, dL/dx = (1/rms)·(ĝ - x̂·mean(ĝ·x̂)), dL/dw = Σ_rows g·x̂."""
    gx = xp().empty(grad_out.shape, dtype=grad_out.dtype)
    xhat = xp().empty(x.shape, dtype=x.dtype)

    def input_grad(gx, xhat, grad_out, x, rstd):
        xp().multiply(x, rstd, out=xhat)
        xp().multiply(grad_out, weight, out=gx)  # ĝ = g·w
        dot = (gx * xhat).mean(axis=-1, keepdims=True)
        gx -= xhat * dot
        gx *= rstd

    threads.rows(input_grad, gx, xhat, grad_out, x, rstd)
    rows = grad_out.reshape(-1, grad_out.shape[-1])
    gw = (rows * xhat.reshape(rows.shape)).sum(axis=0)
    return gx, gw


# ---- rotary position embedding ---------------------------------------------------------------------------
def rotary(x, cos, sin):
    """x·cos + rotate_half(x)·sin, rotate_half(x) = [-x₂, x₁] (x's last axis cut in two halves, as Hugging Face's
    Llama); cos and sin broadcast against x."""
    h = x.shape[-1] // 2
    out = x * cos
    out[..., :h] -= x[..., h:] * sin[..., :h]
    out[..., h:] += x[..., :h] * sin[..., h:]
    return out


def rotary_grad(grad_out, cos, sin):
    """dL/dx = g·cos + rotate_halfᵀ(g·sin), rotate_halfᵀ(y) = [y₂, -y₁]."""
    h = grad_out.shape[-1] // 2
    grad = grad_out * cos
    grad[..., :h] += grad_out[..., h:] * sin[..., h:]
    grad[..., h:] -= grad_out[..., :h] * sin[..., :h]
    return grad
