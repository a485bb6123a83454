"""Lessons 01-04 run in quick mode, write their figures, and the claims they print hold in the
numbers they return. Each lesson runs once per session (a module fixture) and the tests read its
result; tinygrad_ckpt.app.figures is tested on the way (discovery, selection, loading by path)."""

from __future__ import annotations

import json
from pathlib import Path

import lesson_runs
import pytest

from tinygrad_ckpt.app import figures
from tinygrad_ckpt.scale import estimate

LESSONS = {
    1: "01_where_memory_goes",
    2: "02_why_backward_needs_activations",
    3: "03_the_factor_of_12",
    4: "04_the_ledger",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs():
    """{number: result dict} of every lesson here, from the session's one quick run of every lesson."""
    results = lesson_runs.figures_command().results
    return {number: results[stem]["result"] for number, stem in LESSONS.items()} | {"_run": results}


# ---------------------------------------------------------------- figures.py


def test_discover_finds_the_lessons_in_order():
    stems = [p.stem for p in figures.discover()]
    assert stems == sorted(stems)
    for stem in LESSONS.values():
        assert stem in stems


@pytest.mark.parametrize("only, expected", [("01", {1}), ("1", {1}), (3, {3}), (["02", "4"], {2, 4}),
                                            ("1,3", {1, 3}), (None, None)])
def test_only_selects_lessons_by_number(only, expected):
    assert figures._numbers(only) == expected
    chosen = figures.select(only)
    if expected is not None:
        assert {int(p.name[:2]) for p in chosen} == expected


def test_only_rejects_unknown_lessons():
    with pytest.raises(ValueError, match="no lesson numbered"):
        figures.select("99")
    with pytest.raises(ValueError, match="lesson numbers"):
        figures.select("abc")


@pytest.mark.parametrize("number", sorted(LESSONS))
def test_lesson_writes_its_figures(runs, number):
    stem = LESSONS[number]
    entry = runs["_run"][stem]
    assert entry["figures"], f"{stem} wrote no figure"
    for path in runs[number]["figures"]:
        assert path in entry["figures"]
    for path in entry["figures"]:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC, path
        asspath = path.rsplit("/", 1)[-1]
        assert asspath.startswith(stem), path


@pytest.mark.parametrize("number", sorted(LESSONS))
def test_lesson_has_a_docstring_that_says_how_to_run_it(number):
    module = figures.load_lesson(figures.lessons_dir() / f"{LESSONS[number]}.py")
    doc = module.__doc__ or ""
    assert "What you will see" in doc and "Read:" in doc and "Run: python lessons/" in doc


# ---------------------------------------------------------------- lesson 1


def test_lesson1_training_state_is_16_bytes_per_parameter(runs):
    r = runs[1]
    assert r["param_bytes"] == 4 * r["n_params"]  # float32 weights, counted by the ledger
    assert r["optimizer_bytes"] == 8 * r["n_params"]  # AdamW m and v
    assert r["gradient_peak_bytes"] >= 4 * r["n_params"]  # every weight gets a gradient


def test_lesson1_activations_dominate_the_largest_config(runs):
    r = runs[1]
    at_peak = r["largest"]["at_peak"]
    assert max(at_peak, key=at_peak.get) == "activation"
    assert r["largest_activation_share"] > 0.5
    assert r["smallest_state_share"] > 0.5  # ...while the training state dominates the smallest


def test_lesson1_activations_grow_linearly_in_batch_and_faster_in_sequence(runs):
    r = runs[1]
    b = r["batch_runs"]
    for r1, r2 in zip(b, b[1:]):
        ratio = r2["peaks"]["activation"] / r1["peaks"]["activation"]
        assert ratio == pytest.approx(r2["batch"] / r1["batch"], rel=0.05)
    s = r["seq_runs"]
    for r1, r2 in zip(s, s[1:]):
        assert r2["peaks"]["activation"] / r1["peaks"]["activation"] > r2["seq_len"] / r1["seq_len"]


def test_lesson1_is_seeded():
    module = figures.load_lesson(figures.lessons_dir() / f"{LESSONS[1]}.py")
    cfg = module.sizes(quick=True)
    a, b = module.measure(cfg, 1, 16), module.measure(cfg, 1, 16)
    assert a["loss"] == b["loss"]
    assert a["at_peak"] == b["at_peak"] and a["peaks"] == b["peaks"]


# ---------------------------------------------------------------- lesson 2


def test_lesson2_gelu_same_output_different_derivative(runs):
    r = runs[2]
    assert r["x1"] < r["x_min"] < r["x2"]
    assert abs(r["gelu_x1"] - r["gelu_x2"]) < 1e-6
    assert abs(r["gelu_x1"] - r["target"]) < 1e-9
    assert abs(r["dgelu_x1"] - r["dgelu_x2"]) > 0.1
    assert r["dgelu_x1"] < 0 < r["dgelu_x2"]
    assert r["dgelu_x1"] == pytest.approx(r["dgelu_formula"][0], abs=1e-9)  # engine == Φ(x) + x·φ(x)
    assert r["dgelu_x2"] == pytest.approx(r["dgelu_formula"][1], abs=1e-9)


def test_lesson2_chain_rule_matches_the_engine(runs):
    assert runs[2]["chain_rule_max_err"] < 1e-12


def test_lesson2_softmax_keeps_its_output(runs):
    r = runs[2]
    assert r["softmax_saved"] == {"out": [2, 5]}
    assert r["softmax_saved_is_output"]
    assert r["softmax_saved_bytes"] == 2 * 5 * 4
    assert r["softmax_grad_err"] < 1e-6


def test_lesson2_layernorm_keeps_its_output_and_rstd(runs):
    r = runs[2]
    B, T, d = r["layernorm_shape"]
    assert r["layernorm_saved"] == {"out": [B, T, d], "rstd": [B, T, 1], "weight": [d], "bias": [d]}
    assert r["layernorm_keeps_output"]
    assert r["layernorm_activation_bytes"] == (B * T * d + B * T) * 4  # the weight stays a parameter
    assert r["layernorm_rstd_err"] < 1e-5 and r["layernorm_xhat_err"] < 1e-5


def test_lesson2_print_saved_counts_the_blocks_saves_and_draws_the_tape(runs):
    r, (B, T, d), f32 = runs[2], (2, 4, 8), 4
    layer_norm = B * T * f32  # 1/std; its output is the MLP's x, kept once (its weight is a parameter: not counted)
    assert r["saved_plain_bytes"] == layer_norm + (B * T * d + 2 * B * T * 4 * d) * f32  # + the MLP's x, gelu's x, x
    assert r["saved_checkpointed_bytes"] == layer_norm + B * T * d * f32  # + only the MLP's input
    assert Path(r["figures"][1]).name == "02_why_backward_needs_activations_tape.png"
    assert Path(r["figures"][1]).parent == Path(r["figures"][0]).parent


# ---------------------------------------------------------------- lesson 3


def _matches_engine(measured, engine, scalar_bytes):
    """Measured == the engine's term list, up to the 0-d attention scale attn.mul saves as an array
    (not an estimate term; reported to the engine owners). Either form passes once that is settled."""
    return scalar_bytes <= 8 and measured in (engine, engine + scalar_bytes)


def test_lesson3_inventory_equals_engine_estimate(runs):
    r = runs[3]
    assert r["ledger_per_layer"] == r["measured_per_layer"]  # tape inventory == ledger activation bytes
    assert _matches_engine(r["measured_per_layer"], r["engine_per_layer"], r["scalar_bytes"])
    c = r["block_config"]
    shape = estimate.GPTShape(1, c["d_model"], c["n_head"], c["seq_len"], c["batch"])
    terms = estimate.engine_activation_terms(shape)
    for buf in r["inventory"]:
        if buf["shape"] == ():
            continue
        assert buf["term"] in terms, buf
        assert buf["nbytes"] == terms[buf["term"]], buf
    assert {b["term"] for b in r["inventory"] if b["term"]} == set(terms)


def test_lesson3_seed_formula_undercounts(runs):
    r = runs[3]
    assert r["seed_per_layer"] < r["measured_per_layer"]


def test_lesson3_korthikanti_setting_reproduces_the_paper_plus_named_extras(runs):
    for point in runs[3]["sweep"]:
        assert _matches_engine(point["measured"], point["engine"], point["scalar_bytes"]), point
        assert point["extra_vs_korthikanti"] == point["named_extras"], point


def test_lesson3_saved_bytes_grow_superlinearly_in_T(runs):
    sweep = runs[3]["sweep"]
    assert len(sweep) >= 3
    for a, b in zip(sweep, sweep[1:]):
        assert b["measured"] / a["measured"] > b["seq_len"] / a["seq_len"]
    # per token it grows, where the seed's formula is flat
    per_token = [p["measured"] / p["seq_len"] for p in sweep]
    assert per_token == sorted(per_token) and per_token[-1] > 1.5 * per_token[0]


def test_lesson3_seed_arithmetic(runs):
    ex = runs[3]["seed_example"]
    assert ex["seed_formula"] == 32 * 12 * 4 * 2048 * 4096 * 2 == 25_769_803_776
    assert ex["seed_printed"] / ex["seed_formula"] == pytest.approx(2.48, abs=0.01)


# ---------------------------------------------------------------- lesson 4


def test_lesson4_layer1_idle_fraction_is_about_n_minus_1_over_n(runs):
    r = runs[4]
    assert abs(r["idle_layer1"] - r["expected_idle"]) < 0.05
    assert r["expected_idle"] == (r["n_layer"] - 1) / r["n_layer"]
    for point in r["sweep"]:
        assert abs(point["idle"] - point["expected"]) < 0.05, point
        assert abs(point["idle_flops"] - point["expected"]) < 0.05, point
    idles = [p["idle"] for p in r["sweep"]]
    assert idles == sorted(idles)  # deeper stacks leave layer 1 idle longer


def test_lesson4_peak_is_in_backward_and_layers_release_in_reverse(runs):
    r = runs[4]
    assert r["peak_phase"] == "backward"
    blocks = [row for row in r["layers"] if row["name"].startswith("transformer.h.")]
    assert len(blocks) == r["n_layer"]
    firsts = [row["first_used"] for row in blocks]
    assert firsts == sorted(firsts, reverse=True)  # the last layer is read first
    assert all(row["released"] is not None for row in blocks)


def test_lesson4_writes_summary_and_chrome_trace(runs):
    r = runs[4]
    assert "activation" in r["summary"] and "peak" in r["summary"]
    with open(r["trace"]) as f:
        trace = json.load(f)
    phases = {ev.get("cat") for ev in trace["traceEvents"] if ev["ph"] == "X"}
    assert {"forward", "backward"} <= phases
    assert any(ev["ph"] == "C" for ev in trace["traceEvents"])


def test_figures_counts_only_the_figures_a_lesson_writes_now(tmp_path, monkeypatch):
    """A figure left in the folder by an earlier run (or committed, for a lesson that skips) is not this run's."""
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    (lessons / "98_draws.py").write_text(
        "from pathlib import Path\n"
        "def main(quick=False, out='figures'):\n"
        "    Path(out, '98_draws.png').write_bytes(b'new')\n"
        "    return {}\n")
    (lessons / "99_skips.py").write_text("def main(quick=False, out='figures'):\n    return {'skipped': 'no'}\n")
    out = tmp_path / "out"
    out.mkdir()
    for name in ("98_draws.png", "98_draws_older.png", "99_skips.png"):
        (out / name).write_bytes(b"old")
    monkeypatch.setattr(figures, "select", lambda only: sorted(lessons.glob("*.py")))
    results = figures.run(quick=True, out=out)
    assert results["98_draws"]["figures"] == [str(out / "98_draws.png")]
    assert results["99_skips"]["figures"] == []


def test_lessons_load_the_engine_before_numpy():
    """Run as a script, a lesson imports _common first: OpenBLAS must load with the engine's settings (its idle
    threads sleep after a product instead of spinning for 0.1 s; tinygrad_ckpt/backend/threads.py)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import _common, os; "
            "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'))")
    done = subprocess.run([sys.executable, "-c", code, str(figures.lessons_dir())], env=env, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() != "None"  # the engine set it, as NumPy had not loaded yet
