"""Lesson 13 (what changes in a Llama) runs in quick mode into a temporary folder; the claims it prints are asserted
here from the numbers it returns, to the byte where the arithmetic is exact, and its figure must exist."""

from __future__ import annotations

import lesson_runs
import pytest

from tinygrad_ckpt.scale import estimate as est

STEM = "13_what_changes_in_a_llama"


@pytest.fixture(scope="module")
def lesson():
    return lesson_runs.load(STEM)


@pytest.fixture(scope="module")
def r():
    return lesson_runs.quick_result(STEM, figures_expected=1)


def test_swiglu_keeps_two_d_plus_four_f_per_token(r):
    c = r["config"]
    tokens, d, f, v = c["batch"] * c["seq_len"], c["d_model"], c["ffn_equal_params"], 2
    gpt, equal, wide = (sum(terms.values()) for terms in r["mlp"].values())
    rstd = tokens * v  # one 1/std (1/rms) per token
    assert gpt == tokens * 9 * d * v + rstd  # the norm's output (= c_fc's input), GELU's input and output (4d each)
    assert equal == tokens * (2 * d + 4 * f) * v + rstd  # norm input, normed x, and four f-wide arrays
    assert wide == tokens * 18 * d * v + rstd
    assert f == 11008 and r["mlp_ratio"][list(r["mlp"])[1]] == pytest.approx(12.75 / 9, rel=1e-3)


def test_grouped_query_attention_keeps_keys_and_values_in_proportion(r):
    c = r["config"]
    tokens, hd, v = c["batch"] * c["seq_len"], c["d_model"] // c["n_head"], 2
    for kv, nbytes in r["kv_bytes"].items():
        assert nbytes == 2 * tokens * kv * hd * v  # rotated keys and values, kv heads each
        assert r["kv_params"][kv] == 2 * c["d_model"] * kv * hd * v  # k_proj and v_proj, float16
    weights = {label: terms["attention weights [B,H,T,T]"] for label, terms in r["attention"].items()}
    assert len(set(weights.values())) == 1  # the [B, H, T, T] weights do not shrink
    assert set(weights.values()) == {c["batch"] * c["n_head"] * c["seq_len"] ** 2 * v}


def test_rotary_positions_keep_one_table(r):
    p, c = r["positions"], r["config"]
    hd = c["d_model"] // c["n_head"]
    assert p["rotary_table"] == 2 * c["seq_len"] * hd * 2
    assert p["rotary_saves"] == ["model.layers.0.self_attn.rotary:table"]  # one buffer for every layer's ops
    assert p["rotary_ops"] == 2 * p["layers"]
    wpe = c["seq_len"] * c["d_model"]
    assert p["wpe"] == {"parameter": 2 * wpe, "gradient": 2 * wpe, "optimizer": 8 * wpe}


def test_experts_multiply_memory_not_activations_or_compute(r):
    moe = r["moe"]
    dense, d = moe["dense"], r["config"]["d_model"]
    for label, run in moe.items():
        if label == "dense":
            continue
        router = run["experts"] * d * (2 + 2 + 8)  # the gate [E, d]: float16 weight and gradient, float32 m and v
        assert run["state"] == run["experts"] * dense["state"] + router, label  # every expert's weights, grads, m, v
        assert run["flops"] / dense["flops"] == pytest.approx(run["k"], rel=0.01), label  # k experts per token
    saved = {run["saved"] for run in moe.values() if run["k"] == 2}
    assert len(saved) == 1  # at 2 experts per token, activations do not depend on how many experts there are
    mixtral = moe["8 experts, 2 per token"]
    assert 2.0 < mixtral["saved"] / dense["saved"] < 2.4  # 2 experts' saves, plus each expert's in- and output rows


def test_a_real_router_is_uneven_but_keeps_the_same_bytes(r):
    learned, balanced = r["routing"]["learned"], r["routing"]["balanced"]
    assert sum(learned["counts"]) == sum(balanced["counts"]) == 2 * learned["tokens"]
    assert len(set(balanced["counts"])) == 1 and max(learned["counts"]) > r["routing"]["share"]
    assert learned["moe_saved"] == balanced["moe_saved"]


def test_assumptions_and_headline(r, lesson):
    assert any("balanced share" in a for a in est.assumptions(est.preset("mixtral-8x7b")))
    lines = lesson.headline(r)
    assert 1 <= len(lines) <= 4 and "8.0x the weights and states, 2.0x the FLOPs" in lines[1]
