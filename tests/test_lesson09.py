"""Lesson 9 (the seed at full scale) runs in quick mode into a temporary folder; the claims it prints are
asserted here from the numbers it returns, and its figures must exist. The full-size run (32 layers on meta), which
pins the numbers the lesson's text is about, is test_lesson09_full_scale.py."""

from __future__ import annotations

import pathlib

import lesson_runs
import pytest

from tinygrad_ckpt.scale import estimate as est

STEM = "09_seed_at_full_scale"
GiB = 2**30


def load():
    return lesson_runs.load(STEM)


def run(out: pathlib.Path, quick: bool) -> dict:
    result = load().main(quick=quick, out=str(out))
    assert len(result["figures"]) == 3
    for path in result["figures"]:
        p = pathlib.Path(path)
        assert p.parent == out and p.name.startswith(STEM), path
        assert p.suffix == ".png" and p.is_file() and p.stat().st_size > 10_000, f"figure {path} missing or empty"
    return result


@pytest.fixture(scope="module")
def quick():
    return lesson_runs.quick_result(STEM, figures_expected=3)


def check_claims(r: dict) -> None:
    """What the lesson prints, whatever the size it ran at."""
    c = r["config"]
    B, T, d, H, L = c["batch"], c["seq_len"], c["d_model"], c["n_head"], c["n_layer"]
    E = B * T * d
    # the seed's formula and its printed number
    assert r["seed_formula_bytes"] == 32 * 12 * 4 * 2048 * 4096 * 2 == 25_769_803_776
    assert r["seed_printed_bytes"] == 64 * 10**9
    assert r["seed_printed_bytes"] / r["seed_formula_bytes"] == pytest.approx(2.48, abs=0.01)
    assert r["seed_formula_config_bytes"] == L * 12 * E * 2
    # measured activations exceed the seed's formula; per layer the engine's terms match the ledger exactly
    assert r["activation_peak"] > r["seed_formula_config_bytes"]
    assert r["measured_layer_bytes"] == r["engine_layer_bytes"] > r["seed_layer_bytes"] == 12 * E * 2
    assert r["layer_e_bytes"] == 14 * E * 2
    assert r["layer_t2_bytes"] == B * H * T * T * 2 + T * T
    assert r["layer_t2_bytes"] == pytest.approx(16 / 14 * r["layer_e_bytes"], rel=0.01)  # H·T = 16·d: B·H·T² = 16·E
    assert list(r["t2_share_by_T"].values()) == sorted(r["t2_share_by_T"].values())  # grows with T
    # parameters and optimizer states
    assert r["n_params"] == est.gpt_parameter_count(est.GPTShape(L, d, H, T, B, vocab_size=c["vocab"]))
    assert r["category_peaks_plain"]["parameter"] == 2 * r["n_params"]
    assert r["category_peaks_plain"]["optimizer"] == 8 * r["n_params"]  # float32 m and v
    assert r["category_peaks_plain"]["gradient"] >= 2 * r["n_params"]
    assert r["at_peak"]["adamw_fp16"]["none"]["optimizer"] * 2 == r["at_peak"]["adamw_fp32"]["none"]["optimizer"]
    assert r["at_peak"]["sgd"]["none"]["optimizer"] == 0
    # checkpointing lowers the peak, and every-layer keeps L inputs + one block
    for key, peaks in r["peaks"].items():
        for plan in ("every_layer", "sqrt", "selective"):
            assert peaks[plan] < peaks["none"], (key, plan)
            assert r["activation_peaks"][key][plan] < r["activation_peaks"][key]["none"], (key, plan)
    # every layer replays each block up to its tail: the last linear ([B·T, 4d]·[4d, d]) and the residual add
    block_matmuls = 24 * B * T * d * d + 4 * B * T * T * d
    assert r["tail_share"] == pytest.approx(8 * B * T * d * d / block_matmuls, rel=0.01)
    assert r["recompute_ratio"]["adamw_fp32"]["every_layer"] == pytest.approx(1 - r["tail_share"], abs=1e-9)
    assert r["recompute_ratio"]["adamw_fp32"]["none"] == 0
    assert 0 < r["recompute_ratio"]["adamw_fp32"]["selective"] < 0.2
    # the verdicts follow from the measured peaks
    for cap_name, cap in r["capacities"].items():
        for key, peaks in r["peaks"].items():
            expected = [n for n, p in peaks.items() if p is not None and p <= cap]
            assert r["fits"][cap_name][key] == expected, (cap_name, key)
            planned = peaks[f"planner {cap_name}"]
            if planned is None:
                assert r["least_memory_peaks"][key] > cap
            else:
                assert planned <= cap
            if expected:
                best = r["cheapest_fit"][cap_name][key]
                assert best in expected
                ratios = r["recompute_ratio"][key]
                assert ratios[best] == min(ratios[n] for n in expected)
            else:
                assert key not in r["cheapest_fit"][cap_name]
    assert r["fits_80_gib_every_layer"] == (r["peaks"]["adamw_fp32"]["every_layer"] <= 80 * GiB)


def test_quick_runs_and_its_claims_hold(quick):
    assert quick["config"] == dict(n_layer=4, d_model=4096, n_head=32, seq_len=2048, batch=4, vocab=32000,
                                   dtype="float16")
    check_claims(quick)


def test_quick_every_layer_keeps_inputs_plus_one_block(quick):
    c = quick["config"]
    layer_input = c["batch"] * c["seq_len"] * c["d_model"] * 2
    formula = c["n_layer"] * layer_input + quick["measured_layer_bytes"]
    assert quick["activation_peaks"]["adamw_fp32"]["every_layer"] == pytest.approx(formula, rel=0.01)
