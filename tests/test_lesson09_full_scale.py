"""Lesson 9 at full size: the seed's 32-layer model on meta, the numbers the lesson's text is about. Its own file,
so that it runs beside the session's quick run of every lesson (conftest.py's scheduler keeps the files that read
that run on one worker)."""

import pytest
from test_lesson09 import GiB, check_claims, run


def test_full_scale_numbers(tmp_path):
    r = run(tmp_path, quick=False)
    check_claims(r)
    assert r["config"]["n_layer"] == 32
    assert r["n_params"] == 6_583_623_680
    assert r["activation_peak"] / GiB == pytest.approx(60.68, abs=0.05)
    assert r["measured_layer_bytes"] == 2_017_492_992
    assert r["total_peak_plain"] / GiB == pytest.approx(122.95, abs=0.1)
    assert r["category_peaks_plain"]["optimizer"] / 10**9 == pytest.approx(52.7, abs=0.05)
    # the seed's set-up: every layer checkpointed is 76.4 GiB = 82.0 GB, over 80 GB; nothing fits 80 GB or 40 GB
    el = r["peaks"]["adamw_fp32"]["every_layer"]
    assert el / GiB == pytest.approx(76.40, abs=0.05) and el > 80 * 10**9
    assert r["fits"]["80 GB"]["adamw_fp32"] == [] and r["fits"]["40 GB"]["adamw_fp32"] == []
    assert r["at_peak"]["adamw_fp32"]["every_layer"]["optimizer"] / GiB == pytest.approx(49.05, abs=0.01)
    # what does fit: float16 states or SGD at 80 GB, SGD at 40 GB
    assert "every_layer" in r["fits"]["80 GB"]["adamw_fp16"] and "every_layer" in r["fits"]["80 GB"]["sgd"]
    assert r["fits"]["40 GB"]["sgd"] and not r["fits"]["40 GB"]["adamw_fp16"]
    assert r["fits_80_gib_every_layer"]
