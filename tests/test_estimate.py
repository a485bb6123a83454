"""Hand-computed checks for tinygrad_ckpt.scale.estimate (arithmetic written out)."""

import math

import numpy as np
import pytest

from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.estimate import GPTShape
from tinygrad_ckpt.units import format_bytes


def test_dtype_bytes():
    assert [est.dtype_bytes(n) for n in ("float16", "bfloat16", "float32", "float64")] == [2, 2, 4, 8]
    assert est.dtype_bytes(np.dtype("float32")) == 4
    assert est.dtype_bytes(np.float16) == 2
    assert est.dtype_bytes(np.dtype(np.float64)) == 8
    assert est.dtype_bytes("bool") == 1
    with pytest.raises(ValueError):
        est.dtype_bytes("complex64")


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(24 * 2**30) == "24.0 GiB"
    assert format_bytes(25_769_803_776, decimal=True) == "25.8 GB"
    assert format_bytes(-2048) == "-2.0 KiB"


def test_shape_defaults_and_validation():
    s = GPTShape(2, 64, 4, seq_len=16, batch=3)
    assert s.block_size == 16 and s.head_dim == 16 and s.value_bytes == 4
    with pytest.raises(ValueError):
        GPTShape(2, 65, 4, 16, 1)
    with pytest.raises(ValueError):
        GPTShape(2, 64, 4, seq_len=32, batch=1, block_size=16)


def test_gpt2_small_parameter_count():
    s = GPTShape(12, 768, 12, seq_len=1024, batch=1, vocab_size=50257)
    d = 768
    wte = 50257 * d                                   # 38,597,376
    wpe = 1024 * d                                    # 786,432
    block = (2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d
             + (4 * d * d + 4 * d) + (4 * d * d + d))  # 7,087,872
    assert wte == 38_597_376 and wpe == 786_432 and block == 7_087_872
    assert wte + wpe + 12 * block + 2 * d == 124_439_808
    assert est.gpt_parameter_count(s) == 124_439_808
    terms = est.gpt_parameter_terms(s)
    assert terms["h.attn.c_attn"] == 12 * (3 * 768 * 768 + 3 * 768)
    assert sum(terms.values()) == 124_439_808
    # nanoGPT's padded vocabulary 50304 adds 47 rows of wte
    padded = GPTShape(12, 768, 12, seq_len=1024, batch=1)
    assert est.gpt_parameter_count(padded) == 124_439_808 + 47 * 768


def test_training_state_bytes():
    P = 1000
    assert est.training_state_bytes(P, "adamw", "float32") == 16 * P            # 4 + 4 + 4 + 4
    assert est.training_state_bytes(P, "sgd", "float32") == 8 * P               # 4 + 4
    assert est.training_state_bytes(P, "sgd_momentum", "float32") == 12 * P     # 4 + 4 + 4
    assert est.training_state_bytes(P, None, "float16") == 4 * P                # 2 + 2
    mixed = est.training_state_terms(P, "adamw", "float16", master_weights=True)
    assert list(mixed) == ["parameters", "gradients", "master_weights", "adam_m", "adam_v"]
    assert sum(mixed.values()) == 16 * P                                        # 2 + 2 + 12
    s = GPTShape(1, 8, 2, 4, 1, vocab_size=10, dtype="float32")
    n = est.gpt_parameter_count(s)
    assert est.training_state_bytes(s) == 16 * n
    with pytest.raises(ValueError):
        est.training_state_bytes(P, "lion")


def test_seed_activation_formula():
    assert est.seed_activation_bytes_per_layer(4, 2048, 4096, 2) == 12 * 4 * 2048 * 4096 * 2
    total = est.seed_activation_bytes_total(32, 4, 2048, 4096, 2)
    assert total == 32 * 12 * 4 * 2048 * 4096 * 2 == 25_769_803_776 == 24 * 2**30
    ex = est.seed_activation_example()
    assert ex["seed_printed"] == 64 * 10**9
    assert ex["seed_formula"] == 25_769_803_776
    sbh = 2048 * 4 * 4096
    assert ex["korthikanti_none"] == 32 * sbh * (34 + 5 * 32 * 2048 // 4096)  # 34 + 80 = 114
    assert ex["korthikanti_selective"] == 32 * 34 * sbh
    assert ex["korthikanti_full"] == 32 * 2 * sbh


@pytest.mark.parametrize("s,b,h,a", [(2048, 1, 12288, 96), (1024, 8, 768, 12), (7, 3, 10, 5)])
def test_korthikanti_total(s, b, h, a):
    terms = est.korthikanti_terms(s, b, h, a)
    total = est.korthikanti_bytes_per_layer(s, b, h, a)
    assert total == sum(terms.values())
    assert total == 34 * s * b * h + 5 * a * s * s * b
    assert math.isclose(total, s * b * h * (34 + 5 * a * s / h))
    assert est.korthikanti_selective_bytes(s, b, h) == 34 * s * b * h
    assert est.korthikanti_full_recompute_bytes(s, b, h) == 2 * s * b * h


def test_korthikanti_named_terms_and_fp32():
    s, b, h, a = 3, 2, 5, 7
    sbh, ass = s * b * h, a * s * s * b
    t = est.korthikanti_terms(s, b, h, a)
    expected = [2 * sbh, 4 * sbh, 2 * ass, ass, 2 * ass, 2 * sbh, 2 * sbh, sbh,
                2 * sbh, 8 * sbh, 8 * sbh, sbh, 4 * sbh]
    assert list(t.values()) == expected
    attn = sum(v for k, v in t.items() if k.startswith("attn"))
    mlp = sum(v for k, v in t.items() if k.startswith("mlp"))
    assert attn == 11 * sbh + 5 * ass and mlp == 19 * sbh and t["layernorms"] == 4 * sbh
    # float32 values, 1-byte masks: 2·16 value-sbh + 2 mask-sbh, and 4+1+4 per as²b
    assert est.korthikanti_bytes_per_layer(s, b, h, a, bytes_per_value=4) == 66 * sbh + 9 * ass
    assert est.korthikanti_selective_bytes(s, b, h, bytes_per_value=4) == 66 * sbh
    assert est.korthikanti_full_recompute_bytes(s, b, h, bytes_per_value=4) == 4 * sbh


def test_gpt3_selective_saving_is_70_percent():
    s, b, h, a = 2048, 1, 12288, 96                   # 5as/h = 80
    saving = 1 - est.korthikanti_selective_bytes(s, b, h) / est.korthikanti_bytes_per_layer(s, b, h, a)
    assert round(saving, 2) == 0.70                   # 80 / 114


def test_engine_terms_without_dropout():
    s = GPTShape(2, 64, 4, seq_len=16, batch=3, dtype="float32")
    B, T, d, H, v = 3, 16, 64, 4, 4
    E = B * T * d
    t = est.engine_activation_terms(s)
    assert not any("dropout" in k for k in t)
    assert t["attn.qkv"] == 3 * E * v and t["attn.causal_mask"] == T * T
    assert t["attn.softmax_out"] == B * H * T * T * v
    total = 14 * E * v + 2 * B * T * v + T * T + B * H * T * T * v
    assert est.engine_activation_bytes_per_layer(s) == sum(t.values()) == total
    assert not any("xhat" in k for k in t)  # a layer norm keeps its output, which is the next linear's input
    # at 2 bytes: Korthikanti's 34sbh minus the two sbh masks and the two layer-norm inputs (4sbh),
    # + 1/std vectors + causal mask
    s16 = GPTShape(2, 64, 4, seq_len=16, batch=3, dtype="float16")
    k = est.korthikanti_bytes_per_layer(T, B, d, H) - 2 * T * B * d - 3 * B * H * T * T - 4 * T * B * d
    assert est.engine_activation_bytes_per_layer(s16) == k + 2 * B * T * 2 + T * T


def test_engine_terms_with_dropout_match_korthikanti_plus_extras():
    s = GPTShape(2, 64, 4, seq_len=16, batch=3, dtype="float16", dropout=0.1)
    B, T, d, H = 3, 16, 64, 4
    t = est.engine_activation_terms(s)
    assert t["attn.attn_dropout_mask"] == B * H * T * T // 8  # 1 bit per element
    assert t["attn.resid_dropout_mask"] == t["mlp.resid_dropout_mask"] == B * T * d // 8
    extras = 2 * B * T * 2 + T * T                    # ln rstd vectors + bool causal mask
    fewer = 4 * B * T * d + 7 * (B * H * T * T + 2 * B * T * d) // 8  # layer-norm inputs; 7/8 of the masks
    assert sum(t.values()) == est.korthikanti_bytes_per_layer(T, B, d, H) + extras - fewer
    s32 = GPTShape(2, 64, 4, seq_len=16, batch=3, dtype="float32", dropout=0.1)
    k32 = est.korthikanti_bytes_per_layer(T, B, d, H, bytes_per_value=4)
    fewer32 = 8 * B * T * d + 7 * (B * H * T * T + 2 * B * T * d) // 8
    assert est.engine_activation_bytes_per_layer(s32) == k32 + 2 * B * T * 4 + T * T - fewer32
    odd = est.engine_activation_terms(GPTShape(1, 5, 1, seq_len=3, batch=1, dtype="float32", dropout=0.1))
    assert odd["attn.resid_dropout_mask"] == 2 and odd["attn.attn_dropout_mask"] == 2  # 15 and 9 bits: rounded up


def test_chen():
    assert est.chen_optimal_segments(16, 100, 100) == 4                   # sqrt(16)
    assert est.chen_optimal_segments(100, 10, 40) == 20                   # sqrt(100·40/10)
    assert est.chen_optimal_segments(4, 100, 1) == 1                      # clamped to >= 1
    assert est.chen_sqrt_peak(16, 100, 100) == 4 * 100 + 4 * 100
    assert est.chen_sqrt_peak(16, 100, 100, segments=2) == 2 * 100 + 8 * 100
    assert est.chen_sqrt_peak(10, 1, 5, segments=3) == 3 * 1 + 4 * 5     # ceil(10/3) = 4
    assert est.chen_sqrt_peak(100, 10, 40) == 20 * 10 + 5 * 40
    assert est.chen_recompute_flops(12, 1000) == 12_000


def test_flops():
    s = GPTShape(2, 64, 4, seq_len=16, batch=3, vocab_size=100)
    B, T, d, V = 3, 16, 64, 100
    t = est.gpt_forward_flops_terms(s)
    assert t == {"attn.qkv": 2 * B * T * d * 3 * d, "attn.scores": 4 * 2 * T * T * (d // 4) * B,
                 "attn.av": 2 * B * T * T * d, "attn.proj": 2 * B * T * d * d,
                 "mlp": 2 * B * T * d * 4 * d * 2}
    layer = 24 * B * T * d * d + 4 * B * T * T * d
    assert est.gpt_forward_flops_per_layer(s) == layer
    fwd = 2 * layer + 2 * B * T * d * V
    assert est.gpt_forward_flops(s) == fwd
    assert est.gpt_forward_flops(s, include_lm_head=False) == 2 * layer
    assert est.gpt_training_flops(s) == 3 * fwd
    assert est.gpt_training_flops(s, "full") == 3 * fwd + 2 * layer
    assert est.gpt_training_flops(s, "selective") == 3 * fwd + 2 * 4 * B * T * T * d
    with pytest.raises(ValueError):
        est.gpt_training_flops(s, "half")


def test_seed_claims_table():
    claims = est.seed_claims()
    assert len(claims) == 5
    act, params, adam, idle, fit = claims
    assert (act.seed_value, act.formula_value) == (64 * 10**9, 32 * 12 * 4 * 2048 * 4096 * 2)
    assert act.verdict.startswith("does not follow")
    assert params.formula_value == 7 * 10**9 * 2 == 14 * 10**9 and params.verdict == "follows"
    assert adam.formula_value == 7 * 10**9 * 2 * 4 == 56 * 10**9 and adam.verdict.startswith("follows")
    assert idle.formula_value == 31 / 32 == 0.96875 and idle.verdict.startswith("follows")
    assert fit.seed_value == (14 + 56 + 64) * 10**9
    assert fit.formula_value == (14 + 14 + 56) * 10**9 + 25_769_803_776   # params+grads+Adam+acts
    assert fit.formula_value > 80 * 2**30 and fit.verdict.startswith("follows")
    for claim, seed_value, formula_value, verdict in claims:              # plain 4-tuples
        assert isinstance(claim, str) and isinstance(verdict, str) and seed_value and formula_value
