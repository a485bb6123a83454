"""Lessons 5-8 (checkpointing) run in quick mode into a temporary folder; each claim they print is
asserted here from the numbers they return, and their figures must exist."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import lesson_runs
import pytest

import tinygrad_ckpt as tg

LESSONS = pathlib.Path(__file__).resolve().parent.parent / "lessons"


def load(stem: str):
    """Import lessons/<stem>.py (its folder on sys.path, for `import _common`)."""
    if str(LESSONS) not in sys.path:
        sys.path.insert(0, str(LESSONS))
    spec = importlib.util.spec_from_file_location(f"lesson_{stem}", LESSONS / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



@pytest.fixture(scope="module")
def lesson5():
    return lesson_runs.quick_result("05_the_checkpoint_segment")


@pytest.fixture(scope="module")
def lesson6():
    return lesson_runs.quick_result("06_sqrt_n_and_beyond")


@pytest.fixture(scope="module")
def lesson7():
    return lesson_runs.quick_result("07_selective_recomputation")


@pytest.fixture(scope="module")
def lesson8():
    return lesson_runs.quick_result("08_stepping_through_backward")


# ---------------------------------------------------------------- lesson 5
def test_lesson5_gradients_identical_bit_for_bit(lesson5):
    assert lesson5["config"]["n_layer"] == 4 and lesson5["config"]["dropout"] > 0
    assert lesson5["identical_gradients"] and lesson5["n_gradients"] > 0
    assert lesson5["loss_plain"] == lesson5["loss_checkpointed"]


def test_lesson5_checkpointing_lowers_the_peak(lesson5):
    assert lesson5["activation_peak_checkpointed"] < lesson5["activation_peak_plain"]
    assert lesson5["total_peak_checkpointed"] < lesson5["total_peak_plain"]
    plain_saved, ckpt_saved = lesson5["saved_after_forward"]
    assert ckpt_saved < plain_saved


def test_lesson5_recompute_is_one_forward_of_the_blocks_up_to_the_last_add(lesson5):
    # full checkpointing replays every block once, up to its residual add (the dropout before it keeps a mask,
    # so the linear before that runs): recompute FLOPs = the blocks' forward FLOPs less L·B·T·d
    assert lesson5["stopped_before"] == ["add"]
    c = lesson5["config"]
    assert lesson5["recompute_ratio"] == 1 - c["n_layer"] * c["batch"] * c["seq_len"] * c["d_model"] / lesson5[
        "block_forward_flops"]
    assert lesson5["recomputed_events"] > 0 and lesson5["recompute_ops"] > 0


def test_lesson5_lost_rng_state_is_caught_or_silently_wrong(lesson5):
    assert lesson5["rng_error"] is not None, "preserve_rng_state=False should raise CheckpointError"
    assert "dropout" in lesson5["rng_error_op"]
    assert lesson5["silent_max_abs_diff"] > 0 and lesson5["silent_n_different"] > 0


def test_lesson5_rng_error_is_a_checkpoint_error():
    """The same failure, raised directly (the lesson catches tg.CheckpointError)."""
    import numpy as np

    from tinygrad_ckpt import nn

    tg.manual_seed(0)
    block = nn.Block(16, 2, dropout=0.5)
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 4, 16)).astype(np.float32), requires_grad=True)
    y = tg.checkpoint(block, x, preserve_rng_state=False)
    with pytest.raises(tg.CheckpointError, match="dropout"):
        y.sum().backward()


# ---------------------------------------------------------------- lesson 6
def test_lesson6_model_predicts_every_measured_plan(lesson6):
    # simulate() with measured per-layer costs, plus the stem's and head's saves: exact in practice
    assert lesson6["max_peak_prediction_error"] <= 0.01
    assert lesson6["max_recompute_prediction_error"] <= 0.01
    assert lesson6["chain_prediction_error"] <= 0.01


def test_lesson6_uniform_k_costs_one_forward_less_a_tail_per_segment_and_checkpointing_helps(lesson6):
    """k segments replay every block once but stop before the tail t of each segment's last block."""
    n, f, t = lesson6["n_layer"], lesson6["f"], lesson6["t"]
    assert 0 < t < f / 2
    for r in lesson6["gpt_sweep"]:
        assert r["block_forward"] == n * f
        assert r["recompute"] == n * f - r["k"] * t
        if r["k"] > 1:
            assert r["peak"] < lesson6["plain_peak"]


def test_lesson6_best_k_is_near_sqrt_n_times_a_over_b(lesson6):
    """Stated band: the least measured peak among uniform k lies in [k*/2, min(n, 2k*)], k* = √(n·a/b);
    in Chen's setting (a = b) k* = √n and round(√n) is among the least."""
    n, k_star = lesson6["n_layer"], lesson6["k_star"]
    assert k_star / 2 <= lesson6["best_k"] <= min(n, 2 * k_star)
    nc = lesson6["chain_n"]
    assert round(math.sqrt(nc)) in lesson6["chain_best_ks"]
    assert all(math.sqrt(nc) / 2 <= k <= 2 * math.sqrt(nc) for k in lesson6["chain_best_ks"])


def test_lesson6_planner_fits_its_budget(lesson6):
    """The lesson reserves the stem's and head's saves (measured outside the chain) out of each budget,
    and compares ACTIVATION peaks (gradients and temporaries are not in the model): the measured peak
    must be <= the budget with no tolerance, and match the prediction within 1%."""
    plans = lesson6["planner"]
    assert len(plans) == 3
    for r in plans:
        assert r["peak"] <= r["budget"], r
        assert r["peak"] == pytest.approx(r["predicted_peak"], rel=0.01)
        assert r["recompute"] == pytest.approx(r["predicted_recompute"], rel=0.01, abs=1)
    recomputes = [r["recompute"] for r in plans]
    assert recomputes == sorted(recomputes), "tighter budgets should not recompute less"


def test_lesson6_planner_never_loses_to_a_uniform_plan(lesson6):
    uniform = lesson6["gpt_sweep"] + lesson6["last_plain_sweep"]
    for r in lesson6["planner"]:
        fitting = [u["recompute"] for u in uniform if u["peak"] <= r["budget"]]
        assert all(r["recompute"] <= f * 1.0001 for f in fitting), (r["budget"], r["recompute"], min(fitting))


def test_lesson6_nesting_goes_below_single_level(lesson6):
    named = {r["label"]: r for r in lesson6["named"]}
    assert named["recursive"]["peak"] < named["every_layer"]["peak"]
    assert named["recursive"]["recompute"] > named["every_layer"]["recompute"]
    assert named["none"]["recompute"] == 0


# ---------------------------------------------------------------- lesson 7
def test_lesson7_selective_recompute_is_far_below_one_forward(lesson7):
    runs = {r["label"]: r for r in lesson7["runs"]}
    for policy in ("save_matmuls", "korthikanti_selective"):
        assert runs[policy]["recompute"] < 0.25 * runs[policy]["block_forward"], policy
    # save_nothing replays each block up to its tail: the last linear and the residual add are served
    assert lesson7["stopped_before"]["save_nothing"] == ["mlp.c_proj.linear", "add (mlp residual)"]
    assert lesson7["stopped_before"]["save_matmuls"] == ["add (mlp residual)"]  # its linears are kept anyway
    tail = sum(op["flops"] for op in lesson7["ops"] if op["label"] in lesson7["stopped_before"]["save_nothing"])
    n = lesson7["config"]["n_layer"]
    assert runs["save_nothing"]["recompute"] == runs["save_nothing"]["block_forward"] - n * tail
    assert 0.2 < n * tail / runs["save_nothing"]["block_forward"] < 0.3


def test_lesson7_measured_recompute_matches_the_recomputed_ops(lesson7):
    runs = {r["label"]: r for r in lesson7["runs"]}
    for policy, flops in lesson7["replayed"].items():
        assert runs[policy]["recompute"] == pytest.approx(flops * lesson7["config"]["n_layer"], rel=0.01)


def test_lesson7_peaks(lesson7):
    runs = {r["label"]: r for r in lesson7["runs"]}
    assert runs["korthikanti_selective"]["peak"] < runs["none"]["peak"]
    assert runs["save_nothing"]["peak"] < runs["korthikanti_selective"]["peak"]


def test_lesson7_cheap_and_big_ops_are_softmax_and_gelu(lesson7):
    assert "attn.softmax" in lesson7["quadrant"] and "mlp.gelu" in lesson7["quadrant"]
    assert lesson7["quadrant_bytes_share"] > 0.3 and lesson7["quadrant_flops_share"] < 0.1


def test_lesson7_attention_core_share_grows_with_T(lesson7):
    sweep = lesson7["t_sweep"]
    shares = [r["share"] for r in sweep]
    assert shares == sorted(shares) and shares[-1] > 2 * shares[0]
    for r in sweep:
        assert r["share"] == pytest.approx(r["formula_share"], rel=0.01)
        # korthikanti_selective keeps exactly what a plain block keeps, minus the core
        assert r["kept_share"] == pytest.approx(1 - r["share"], abs=0.01)
        assert r["measured_replayed_share"] < r["share"]


# ---------------------------------------------------------------- lesson 8
def test_lesson8_checkpoint_step_replays(lesson8):
    assert lesson8["checkpoint_saved"] == ["input0"]
    assert lesson8["softmax_saved"] == ["out"]
    assert lesson8["checkpoint_recompute_ops"] > 0 and lesson8["checkpoint_recomputed_saves"] > 0
    assert lesson8["checkpoint_inside_peak"] > lesson8["checkpoint_before"] > lesson8["checkpoint_after"]
    assert lesson8["recompute_ops_elsewhere"] == 0
    assert lesson8["total_recompute_ops"] == lesson8["checkpoint_recompute_ops"]


def test_lesson8_plain_steps_only_free(lesson8):
    for s in lesson8["steps"]:
        if s["op"] != "checkpoint":
            assert s["after"] <= s["before"], s["repr"]
    assert lesson8["final_activation"] == 0
    assert [s["index"] for s in lesson8["steps"]] == sorted((s["index"] for s in lesson8["steps"]), reverse=True)


def test_lesson8_printed_breakpoint_is_after_the_replay(lesson8):
    path, line = lesson8["pdb_breakpoint"].rsplit(":", 1)
    source = pathlib.Path(path).read_text().splitlines()
    assert "replay.rerun(" in source[int(line) - 2]  # pdb stops on the line after the replay


def test_lesson8_break_before_softmax_stops_twice(tmp_path, monkeypatch):
    """--break softmax: pdb would open first at block 1's softmax replayed inside the checkpoint's
    backward, then at block 0's softmax on the main tape (enter_debugger replaced by a recorder)."""
    stops = []
    monkeypatch.setattr(tg.debug, "enter_debugger", lambda entry: stops.append(entry.name))
    load("08_stepping_through_backward").main(quick=True, out=str(tmp_path), break_at="softmax")
    assert stops == ["transformer.h.1.attn.softmax", "transformer.h.0.attn.softmax"]
    assert tg.debug.breakpoints() == []


@pytest.fixture(scope="module")
def lesson10():
    return lesson_runs.quick_result("10_recomputation_inside_one_op")


def test_lesson10_same_gradients(lesson10):
    assert lesson10["gradient_max_abs_diff"] < 1e-10


def test_lesson10_the_t2_term_is_gone(lesson10):
    c, b = lesson10["config"], lesson10["t2_coefficient"]
    L, B, H = c["n_layer"], c["batch"], c["n_head"]
    assert b["explicit"] == pytest.approx(L * (B * H * 4 + 1), rel=1e-6)  # softmax output + bool mask, per layer
    assert abs(b["chunked"]) < 1e-6 and abs(b["chunked + checkpoint"]) < 1e-6
    assert b["explicit + checkpoint"] == pytest.approx(B * H * 4 + 1, rel=1e-6)  # one block's replay keeps it
    for T, peaks in lesson10["peaks"].items():
        assert peaks["chunked"] < peaks["explicit"] and peaks["chunked + checkpoint"] < peaks["explicit + checkpoint"]
        # chunked keeps the same linear bytes at every T: exactly twice as many at twice the T
        if 2 * T in lesson10["peaks"]:
            assert lesson10["peaks"][2 * T]["chunked"] == 2 * peaks["chunked"]


def test_lesson10_flops(lesson10):
    T = lesson10["config"]["inventory_T"]
    f = lesson10["flops"][T]
    assert f["chunked"]["recompute"] == 0 and f["explicit"]["recompute"] == 0
    # every block's forward again, less its tail, which the replay stops before: the last linear (x·W of
    # [B·T, 4d]·[4d, d], plus the bias) and the residual add
    c = lesson10["config"]
    L, B, d = c["n_layer"], c["batch"], c["d_model"]
    tail = 2 * B * T * 4 * d * d + B * T * d + B * T * d
    assert f["explicit + checkpoint"]["recompute"] == f["explicit"]["forward"] - L * tail
    assert f["chunked"]["backward"] - f["explicit"]["backward"] < f["explicit + checkpoint"]["recompute"]
