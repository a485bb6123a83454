"""Lessons 11 (the plan taken to PyTorch) and 12 (one GPU is not enough) run in quick mode into a temporary
folder; the claims they print are asserted from the numbers they return."""

from __future__ import annotations

import lesson_runs
import pytest
from needs import TORCH_MISSING

from tinygrad_ckpt.app import figures
from tinygrad_ckpt.scale import estimate as est

GB = 10**9



def test_lesson_11_plans_carry_over_to_pytorch():
    pytest.importorskip("torch", reason=f"lesson 11: {TORCH_MISSING}")
    import torch

    from tinygrad_ckpt.backend import threads

    before = torch.get_num_threads()
    r = lesson_runs.quick_result("11_taking_the_plan_to_pytorch")
    assert len(r["figures"]) == 1
    assert r["threads"] == threads.threads()  # both engines timed on the engine's thread count
    assert torch.get_num_threads() == before  # and PyTorch's own setting given back
    results = r["results"]
    assert set(results) == {"none", "every layer", "√n segments", "planner", "selective (K22)"}
    for label, row in results.items():
        assert abs(row["comparable"] / row["engine"] - 1) < 0.02, (label, row)
        assert row["engine_seconds"] > 0 and row["torch_seconds"] > 0
    # the planner's plan fits its budget in both, and saves what it says in PyTorch too
    assert results["planner"]["engine"] < results["none"]["engine"]
    assert results["planner"]["torch"] < results["none"]["torch"]
    assert r["worst_like_for_like"] < 0.02


@pytest.mark.parametrize("stem", ["11_taking_the_plan_to_pytorch", "15_your_own_model"])
def test_a_lesson_that_needs_torch_skips_cleanly_without_it(stem, tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    module = figures.load_lesson(figures.lessons_dir() / f"{stem}.py")
    result = module.main(quick=True, out=str(tmp_path))
    assert result["figures"] == [] and "pip install" in result["skipped"]
    assert "skipped" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert module.headline(result) == [f"skipped: {result['skipped']}"]


def test_lesson_12_per_device_plans_and_table_2():
    r = lesson_runs.quick_result("12_when_one_gpu_is_not_enough")
    c = r["config"]
    assert (c["d_model"], c["n_head"], c["seq_len"], c["batch"], c["tensor"]) == (4096, 32, 2048, 4, 8)
    runs = r["runs"]
    act = {label: run["category_peaks"]["activation"] for label, run in runs.items()}
    assert act["TP + SP"] < act["TP"] and act["TP + selective"] < act["TP"]
    assert act["TP + SP + selective"] < min(act["TP + SP"], act["TP + selective"])
    for label, run in runs.items():
        assert run["fits"] == (run["peak"] <= 80 * GB)
        if run["comparison"] is not None:
            assert run["comparison"].unexplained == 0, label
    s, b, h = c["seq_len"], c["batch"], c["d_model"]
    assert runs["TP + SP + selective"]["comparison"].formula == 34 * s * b * h // 8
    assert runs["TP"]["comparison"].formula == sum(est.korthikanti_parallel_terms(s, b, h, 32, 8).values())
    # a larger batch never fits where a smaller one does not
    assert r["largest_batch"]["TP + SP + selective"] >= r["largest_batch"]["TP"]


def test_lesson_15_plans_your_own_model():
    pytest.importorskip("torch", reason=f"lesson 15: {TORCH_MISSING}")
    r = lesson_runs.quick_result("15_your_own_model")
    assert len(r["figures"]) == 1
    # every layer of the foreign GPT: PyTorch = the ledger + the named layer-norm term, and nothing else
    assert r["unexplained"] == 0
    for torch_bytes, engine_bytes in r["per_layer"]["none"].values():
        assert torch_bytes - engine_bytes == r["per_block_term"]
    assert r["bitwise"] and r["peaks"]["plan"] < 0.5 * r["peaks"]["none"]
    llama = r["llama"]
    assert all(ok for _, ok, _ in llama.values())  # gradients bit-identical under every plan
    assert all(llama[k][0] < llama["none"][0] for k in llama if k != "none")
    assert llama["korthikanti_selective"][0] < llama["none"][0]  # the core found by its name, self_attn
    from tinygrad_ckpt.torch_bridge import dist as td

    if td.availability() is None:
        for label, run in r["tp"].items():
            assert run["worst"] <= 0.02, label
            assert all(loss == pytest.approx(ref, rel=1e-5) for loss, ref in run["losses"])
    else:
        assert r["tp"] is None and r["tp_skipped"]
