"""A hand-written NumPy forward + backward of a pre-LN GPT block stack: no tape, no Tensor, no Function.

This is the reference the tape is measured against ("the physical limit" of the same math in NumPy):
the same ops as `tinygrad_ckpt.nn.Block` (layer norm saving x̂ and 1/std, fused q,k,v projection,
explicit causal attention with a saved [B, H, T, T] softmax, exact GELU with the engine's own erf,
recomputed in backward from the saved input), the same saved arrays, written the way a careful
NumPy programmer would: in-place updates where an array is ours, no zero-filled gradient buffers,
no masked-fill backward (the softmax output is exactly 0 where the mask is, so its gradient is too).

    params = [block_params(b) for b in blocks]          # {name: array} per nn.Block
    y, saved = forward(params, x, n_heads)
    dx, grads = backward(params, saved, dy, n_heads)    # grads: [{name: array}] per block
"""

from __future__ import annotations

import math

import numpy as np

from tinygrad_ckpt import backend

PARAM_NAMES = (
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
    "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
    "mlp.c_proj.weight", "mlp.c_proj.bias",
)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_SQRT_HALF = 1 / math.sqrt(2)


def block_params(block) -> dict:
    """The arrays of one `nn.Block`, by the names above (no copies: the engine's own parameters)."""
    own = dict(block.named_parameters())
    return {k: own[k].data for k in PARAM_NAMES}


def erf(x):
    """The engine's erf (whatever `backend.current().erf` runs), so both sides compute the same GELU."""
    return backend.current().erf(x)


# ---- pieces -------------------------------------------------------------------------------------
def _linear(x, w, b):
    out = x @ w.T
    out += b
    return out


def _layer_norm(x, w, b, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    xhat = x - mean
    var = np.square(xhat).mean(axis=-1, keepdims=True)
    var += eps
    rstd = 1 / np.sqrt(var)
    xhat *= rstd
    out = xhat * w
    out += b
    return out, xhat, rstd


def _layer_norm_backward(g, xhat, rstd, w):
    d = g.shape[-1]
    rows = g.reshape(-1, d)
    gw = np.einsum("ij,ij->j", rows, xhat.reshape(rows.shape))
    gb = rows.sum(axis=0)
    ghat = g * w
    gx = ghat - ghat.mean(axis=-1, keepdims=True)
    dot = np.einsum("...i,...i->...", ghat, xhat)[..., None]
    dot /= d
    gx -= xhat * dot
    gx *= rstd
    return gx, gw, gb


def _gelu(u):
    cdf = erf(u * _SQRT_HALF)
    cdf += 1
    cdf *= 0.5
    cdf *= u
    return cdf


def _gelu_backward(g, u, out):
    zero = u == 0
    d = out / (u + zero)  # Φ(u) = gelu(u)/u, read from the kept output, as the engine does (½ at u = 0)
    np.copyto(d, 0.5, where=zero)
    pdf = np.square(u)
    pdf *= -0.5
    np.exp(pdf, out=pdf)
    pdf *= u
    pdf *= _INV_SQRT_2PI
    d += pdf
    d *= g
    return d


def _mask(T: int):
    return np.triu(np.ones((T, T), dtype=bool), k=1)


# ---- one block ----------------------------------------------------------------------------------
def block_forward(p: dict, x, n_heads: int):
    """Returns (out, saved): saved holds exactly what the tape saves for this block."""
    B, T, C = x.shape
    H, hd = n_heads, C // n_heads
    h1, _, rstd1 = _layer_norm(x, p["ln_1.weight"], p["ln_1.bias"])  # x̂ is recovered from h1 in backward
    qkv = _linear(h1, p["attn.c_attn.weight"], p["attn.c_attn.bias"])  # [B, T, 3C]
    q = qkv[:, :, :C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)  # views [B, H, T, hd]
    k = qkv[:, :, C:2 * C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    v = qkv[:, :, 2 * C:].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    att = q @ k.swapaxes(-1, -2)  # [B, H, T, T]
    att *= np.asarray(1 / math.sqrt(hd), dtype=att.dtype)
    mask = _mask(T)
    np.copyto(att, -np.inf, where=mask)
    att -= att.max(axis=-1, keepdims=True)
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)  # a copy (the transpose is not contiguous)
    x = x + _linear(y, p["attn.c_proj.weight"], p["attn.c_proj.bias"])
    h2, _, rstd2 = _layer_norm(x, p["ln_2.weight"], p["ln_2.bias"])
    u = _linear(h2, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])
    g = _gelu(u)
    out = x + _linear(g, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
    saved = dict(rstd1=rstd1, h1=h1, qkv=qkv, mask=mask, att=att, y=y, rstd2=rstd2, h2=h2, u=u, g=g)
    return out, saved


def _weight_grad(g, x):
    return g.reshape(-1, g.shape[-1]).T @ x.reshape(-1, x.shape[-1])


def block_backward(p: dict, s: dict, dout, n_heads: int):
    """Gradient of the block's input and {name: gradient} of its parameters, from dL/dout."""
    B, T, C = dout.shape
    H, hd = n_heads, C // n_heads
    grads = {}
    # MLP branch: out = x + c_proj(gelu(c_fc(ln_2(x))))
    grads["mlp.c_proj.weight"] = _weight_grad(dout, s["g"])
    grads["mlp.c_proj.bias"] = dout.reshape(-1, C).sum(axis=0)
    dg = dout @ p["mlp.c_proj.weight"]
    du = _gelu_backward(dg, s["u"], s["g"])
    del dg
    grads["mlp.c_fc.weight"] = _weight_grad(du, s["h2"])
    grads["mlp.c_fc.bias"] = du.reshape(-1, 4 * C).sum(axis=0)
    dh2 = du @ p["mlp.c_fc.weight"]
    del du
    xhat2 = (s["h2"] - p["ln_2.bias"]) / p["ln_2.weight"]  # as the engine: x̂ from the kept output
    dx, grads["ln_2.weight"], grads["ln_2.bias"] = _layer_norm_backward(dh2, xhat2, s["rstd2"], p["ln_2.weight"])
    del xhat2
    dx += dout  # the residual
    # attention branch: x_mid = x + c_proj(attn(ln_1(x)))
    grads["attn.c_proj.weight"] = _weight_grad(dx, s["y"])
    grads["attn.c_proj.bias"] = dx.reshape(-1, C).sum(axis=0)
    dy = (dx @ p["attn.c_proj.weight"]).reshape(B, T, H, hd).transpose(0, 2, 1, 3)  # [B, H, T, hd] view
    qkv, att = s["qkv"], s["att"]
    q = qkv[:, :, :C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    k = qkv[:, :, C:2 * C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    v = qkv[:, :, 2 * C:].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    dqkv = np.empty_like(qkv)
    dq = dqkv[:, :, :C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)  # views to write into
    dk = dqkv[:, :, C:2 * C].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    dv = dqkv[:, :, 2 * C:].reshape(B, T, H, hd).transpose(0, 2, 1, 3)
    np.matmul(att.swapaxes(-1, -2), dy, out=dv)
    datt = dy @ v.swapaxes(-1, -2)  # [B, H, T, T]
    # softmax backward: ds = att * (datt - Σ datt·att); masked entries have att = 0, so ds = 0 there
    datt *= att
    datt -= att * datt.sum(axis=-1, keepdims=True)
    datt *= np.asarray(1 / math.sqrt(hd), dtype=datt.dtype)
    np.matmul(datt, k, out=dq)
    np.matmul(datt.swapaxes(-1, -2), q, out=dk)
    del datt
    grads["attn.c_attn.weight"] = _weight_grad(dqkv, s["h1"])
    grads["attn.c_attn.bias"] = dqkv.reshape(-1, 3 * C).sum(axis=0)
    dh1 = dqkv @ p["attn.c_attn.weight"]
    del dqkv
    xhat1 = (s["h1"] - p["ln_1.bias"]) / p["ln_1.weight"]
    dx1, grads["ln_1.weight"], grads["ln_1.bias"] = _layer_norm_backward(dh1, xhat1, s["rstd1"], p["ln_1.weight"])
    dx1 += dx
    return dx1, grads


# ---- the stack ----------------------------------------------------------------------------------
def forward(params: list, x, n_heads: int):
    saved = []
    for p in params:
        x, s = block_forward(p, x, n_heads)
        saved.append(s)
    return x, saved


def backward(params: list, saved: list, dout, n_heads: int):
    grads = [None] * len(params)
    for i in reversed(range(len(params))):
        dout, grads[i] = block_backward(params[i], saved[i], dout, n_heads)
        saved[i] = None  # what the tape does: an entry's saves go as soon as its backward ran
    return dout, grads


def step(params: list, x, dout, n_heads: int):
    """One forward + backward: (dx, per-block parameter gradients)."""
    _, saved = forward(params, x, n_heads)
    return backward(params, saved, dout, n_heads)


def saved_bytes(saved: list) -> int:
    """Bytes the forward keeps for backward (views counted once by their owning buffer)."""
    seen, total = set(), 0
    for s in saved:
        for a in s.values():
            while isinstance(a.base, np.ndarray):
                a = a.base
            if id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
    return total
