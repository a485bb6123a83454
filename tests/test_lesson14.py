"""Lesson 14 (from the ledger to your GPU) runs in quick mode into a temporary folder; what it prints is asserted
from the numbers it returns, and its figure must exist."""

from __future__ import annotations

import lesson_runs
import pytest

from tinygrad_ckpt.scale import devices
from tinygrad_ckpt.scale import estimate as est

STEM = "14_from_the_ledger_to_your_gpu"


@pytest.fixture(scope="module")
def lesson():
    return lesson_runs.load(STEM)


@pytest.fixture(scope="module")
def r():
    return lesson_runs.quick_result(STEM, figures_expected=1)


def test_each_way_costs_its_bytes_a_parameter(r):
    per = {way: runs["bytes_per_parameter"] for way, runs in r["runs"].items()}
    assert (per["this engine"]["parameter"], per["this engine"]["optimizer"]) == (2, 8)  # pure float16
    assert (per["PyTorch AMP + flash"]["parameter"], per["PyTorch AMP + flash"]["optimizer"]) == (4, 8)
    assert (per["Megatron"]["parameter"], per["Megatron"]["optimizer"]) == (2, 12)  # m, v and the master copy
    shape = est.preset(r["config"]["model"], batch=1)
    wte = shape.vocab_size * shape.d_model / r["config"]["parameters"]  # the tied embedding's share
    for way, grads in (("this engine", 2), ("PyTorch AMP + flash", 4), ("Megatron", 4)):
        # plus, briefly, the tied embedding's second gradient in flight (at most its size again)
        assert grads <= per[way]["gradient"] <= grads * (1 + wte)


def test_flash_attention_keeps_less_a_block_and_the_engine_count_is_exact(r):
    shape = est.preset(r["config"]["model"], batch=r["config"]["batch"], seq_len=r["config"]["seq_len"],
                       dtype="float16")
    engine = r["runs"]["this engine"]["none"]["per_layer"]
    assert 0 <= engine - est.engine_activation_bytes_per_layer(shape) <= 4  # (the attention's 0-d scale)
    assert r["runs"]["PyTorch AMP + flash"]["none"]["per_layer"] < engine
    assert r["runs"]["Megatron"]["none"]["per_layer"] < engine


def test_reserved_is_at_least_allocated_and_decides_the_fit(r):
    usable = devices.usable_bytes("H100-80GB")
    for runs in r["runs"].values():
        for plan in ("none", "selective", "every_layer"):
            run = runs[plan]
            assert run["reserved"] >= run["peak"]
            assert run["fits"] == (run["reserved"] <= usable)
            assert sum(run["at_peak"].values()) == run["peak"]  # the bar is the peak's moment, not summed peaks
    assert r["reserved_by_conf"]["expandable_segments:True"] <= r["reserved_by_conf"]["default"]


def test_the_largest_batch_fits_and_the_next_one_tried_does_not(r, lesson):
    for (way, plan), batch in r["largest"].items():
        if plan != "every_layer":
            continue
        assert batch > 0
        tried = [8, 32, 128]
        if batch != tried[-1]:
            bigger = tried[tried.index(batch) + 1]
            assert not lesson.measured(lesson.step_of(way, r["config"]["model"], bigger), plan)["fits"]
