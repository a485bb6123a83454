"""Modules: nanoGPT's parameter names and layouts, tied weights, state_dict loading, train/eval,
parameter counts."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import tiny_batch, tiny_gpt

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.scale import estimate

BLOCK_PARAMS = [  # (suffix, shape as a function of d)
    ("ln_1.weight", lambda d: (d,)),
    ("ln_1.bias", lambda d: (d,)),
    ("attn.c_attn.weight", lambda d: (3 * d, d)),
    ("attn.c_attn.bias", lambda d: (3 * d,)),
    ("attn.c_proj.weight", lambda d: (d, d)),
    ("attn.c_proj.bias", lambda d: (d,)),
    ("ln_2.weight", lambda d: (d,)),
    ("ln_2.bias", lambda d: (d,)),
    ("mlp.c_fc.weight", lambda d: (4 * d, d)),
    ("mlp.c_fc.bias", lambda d: (4 * d,)),
    ("mlp.c_proj.weight", lambda d: (d, 4 * d)),
    ("mlp.c_proj.bias", lambda d: (d,)),
]


def _expected_names(n_layer):
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        names += [f"transformer.h.{i}.{suffix}" for suffix, _ in BLOCK_PARAMS]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


def test_named_parameters_are_nanogpts_in_order():
    vocab, block, d = 11, 8, 16
    model = tiny_gpt(vocab, block, n_layer=2, n_head=2, d_model=d)
    named = list(model.named_parameters())
    assert [n for n, _ in named] == _expected_names(2)
    assert _expected_names(2)[:4] == [
        "transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
    ]
    shapes = dict((n, p.shape) for n, p in named)
    assert shapes["transformer.wte.weight"] == (vocab, d)
    assert shapes["transformer.wpe.weight"] == (block, d)
    for i in range(2):
        for suffix, shape in BLOCK_PARAMS:
            assert shapes[f"transformer.h.{i}.{suffix}"] == shape(d), suffix
    assert all(isinstance(p, tg.Parameter) and p.requires_grad and p.dtype == np.float32 for _, p in named)


def test_state_dict_names_include_the_tied_lm_head():
    model = tiny_gpt()
    state = model.state_dict()
    assert list(state) == _expected_names(2) + ["lm_head.weight"]
    assert all(isinstance(v, np.ndarray) for v in state.values())
    np.testing.assert_array_equal(state["lm_head.weight"], state["transformer.wte.weight"])
    # copies: editing the dict does not touch the model
    state["transformer.ln_f.bias"][:] = 7.0
    assert (model.transformer.ln_f.bias.numpy() == 0).all()


def test_tied_weights_are_one_parameter():
    model = tiny_gpt()
    assert model.lm_head.weight is model.transformer.wte.weight
    params = model.parameters()
    assert len(params) == len({id(p) for p in params}) == 2 + 12 * 2 + 2
    assert sum(p is model.transformer.wte.weight for p in params) == 1
    idx, targets = tiny_batch()
    _, loss = model(idx, targets)
    loss.backward()
    # rows of wte never used as input still get a gradient through the lm_head
    unused = sorted(set(range(11)) - set(idx.ravel().tolist()))
    assert unused and np.abs(model.transformer.wte.weight.grad[unused]).sum() > 0


def test_initialisation_follows_nanogpt():
    tg.manual_seed(0)
    model = nn.GPT(50, 16, 4, 2, 64)
    sd = model.state_dict()
    assert abs(sd["transformer.wte.weight"].std() - 0.02) < 0.002
    assert abs(sd["transformer.h.0.mlp.c_fc.weight"].std() - 0.02) < 0.002
    scaled = 0.02 / np.sqrt(2 * 4)
    assert abs(sd["transformer.h.0.mlp.c_proj.weight"].std() - scaled) < 0.1 * scaled
    assert abs(sd["transformer.h.3.attn.c_proj.weight"].std() - scaled) < 0.1 * scaled
    assert (sd["transformer.h.1.attn.c_attn.bias"] == 0).all() and (sd["transformer.ln_f.weight"] == 1).all()
    tg.manual_seed(0)
    again = nn.GPT(50, 16, 4, 2, 64).state_dict()
    assert all(np.array_equal(sd[k], again[k]) for k in sd)  # seeded init is reproducible


def test_load_state_dict_round_trip(backend):
    a, b = tiny_gpt(seed=1), tiny_gpt(seed=2)
    assert not np.array_equal(a.state_dict()["transformer.h.0.attn.c_attn.weight"],
                              b.state_dict()["transformer.h.0.attn.c_attn.weight"])
    b.load_state_dict(a.state_dict())
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    assert b.lm_head.weight is b.transformer.wte.weight  # still tied after loading
    idx, targets = (backend.xp().asarray(v) for v in tiny_batch())
    assert a(idx, targets)[1].item() == b(idx, targets)[1].item()


def test_load_state_dict_strict_errors():
    model = tiny_gpt()
    state = model.state_dict()
    missing = dict(state)
    del missing["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(KeyError, match=r"missing keys \['transformer\.h\.1\.mlp\.c_fc\.bias'\]"):
        model.load_state_dict(missing)
    extra = dict(state, **{"transformer.h.0.mlp.c_gate.weight": np.zeros((4, 4), np.float32)})
    with pytest.raises(KeyError, match=r"unexpected keys \['transformer\.h\.0\.mlp\.c_gate\.weight'\]"):
        model.load_state_dict(extra)
    bad = dict(state)
    bad["transformer.h.0.attn.c_attn.weight"] = np.zeros((16, 48), np.float32)  # transposed layout
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.attn\.c_attn\.weight' has shape \[16, 48\] "
                                         r"but the parameter is \[48, 16\]"):
        model.load_state_dict(bad)


def test_load_state_dict_non_strict_loads_what_matches():
    model, other = tiny_gpt(seed=1), tiny_gpt(seed=2)
    partial = {k: v for k, v in other.state_dict().items() if ".h.0." in k}
    partial["not.a.parameter"] = np.zeros(3)
    before = model.state_dict()
    model.load_state_dict(partial, strict=False)
    after = model.state_dict()
    for k in after:
        expected = partial[k] if k in partial else before[k]
        np.testing.assert_array_equal(after[k], expected, err_msg=k)


def test_load_state_dict_keeps_the_parameter_dtype():
    model = tiny_gpt()
    state = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    assert all(p.dtype == np.float32 for p in model.parameters())


def test_to_float64_converts_every_parameter_once(backend):
    model = tiny_gpt().to(np.float64)
    assert all(p.dtype == np.float64 for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight
    idx, targets = (backend.xp().asarray(v) for v in tiny_batch())
    logits, loss = model(idx, targets)
    assert logits.dtype == np.float64 and loss.dtype == np.float64


def test_train_eval_toggles_dropout(backend):
    model = tiny_gpt(dropout=0.5)
    idx, targets = (backend.xp().asarray(v) for v in tiny_batch())
    assert all(m.training for _, m in model.named_modules())
    model.eval()
    assert not any(m.training for _, m in model.named_modules())
    _, l1 = model(idx, targets)
    _, l2 = model(idx, targets)
    assert l1.item() == l2.item()
    assert "dropout" not in {e.op for e in l1.tape().entries}
    no_drop = tiny_gpt(dropout=0.0)
    no_drop.load_state_dict(model.state_dict())
    assert no_drop(idx, targets)[1].item() == l1.item()  # eval == no dropout at all
    assert model.train() is model
    assert all(m.training for _, m in model.named_modules())
    _, l3 = model(idx, targets)
    _, l4 = model(idx, targets)
    assert l3.item() != l1.item() and l3.item() != l4.item()  # fresh masks each call
    assert "dropout" in {e.op for e in l3.tape().entries}


def test_dropout_replays_with_the_same_rng_state():
    model = tiny_gpt(dropout=0.3)
    idx, targets = tiny_batch()
    state = tg.get_rng_state()
    first = model(idx, targets)[1].item()
    tg.set_rng_state(state)
    assert model(idx, targets)[1].item() == first


def test_generation_mode_returns_last_position_logits():
    model = tiny_gpt()
    idx, _ = tiny_batch()
    logits, loss = model(idx)
    assert loss is None and logits.shape == (2, 1, 11)
    full, _ = model(idx, idx)
    np.testing.assert_allclose(logits.numpy()[:, 0], full.numpy()[:, -1], rtol=1e-6)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(np.zeros((1, 9), dtype=np.int64))


def test_attention_needs_divisible_heads():
    with pytest.raises(ValueError, match="not divisible"):
        nn.CausalSelfAttention(10, 3)


def test_zero_grad_drops_gradients():
    model = tiny_gpt()
    idx, targets = tiny_batch()
    model(idx, targets)[1].backward()
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_small_gpt_parameter_count_matches_the_estimate():
    model = tiny_gpt(vocab=37, block_size=12, n_layer=3, n_head=4, d_model=24)
    shape = estimate.GPTShape(n_layer=3, d_model=24, n_head=4, seq_len=12, batch=1, vocab_size=37)
    counted = sum(p.size for p in model.parameters())
    assert model.num_parameters() == counted == estimate.gpt_parameter_count(shape)
    d, L, V, T = 24, 3, 37, 12
    assert counted == V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d  # written out by hand


def test_gpt2_small_has_124_439_808_parameters(monkeypatch):
    """GPT-2 small (vocab 50257, 1024 positions, 12 layers, d 768): built with zero-stride weights, so
    the real module code runs in milliseconds without allocating 500 MB."""
    monkeypatch.setattr(nn, "_normal", lambda shape, std, dtype: np.broadcast_to(np.zeros((), dtype), shape))
    model = nn.GPT(50257, 1024, 12, 12, 768)
    assert model.num_parameters() == 124_439_808
    shape = estimate.GPTShape(n_layer=12, d_model=768, n_head=12, seq_len=1024, batch=1, vocab_size=50257)
    assert estimate.gpt_parameter_count(shape) == 124_439_808
