"""`tinygrad-ckpt estimate` describes the run the user plans: a published model (--model) or a custom one
(--arch llama --kv-heads --ffn --experts ...), its precision, attention and framework's saves, the device and its
allocator, a memory budget, interleaved pipelines; --json gives it as one object, and every value the user did not
give is named in the report."""

from __future__ import annotations

import json

import pytest

from tinygrad_ckpt.app import cli
from tinygrad_ckpt.scale import devices
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import ParallelStep, in_flight, pipeline_schedule, saved_after_forward
from tinygrad_ckpt.scale.parallel import Parallelism

TINY = ["--layers", "2", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "2", "--vocab", "64"]


def run_json(capsys, *argv) -> dict:
    assert cli.main(["estimate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def one_line_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(["estimate", *argv])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("name", sorted(est.PRESETS))
def test_every_preset_reports_its_parameters(name, capsys):
    """Two layers of each preset (the per-layer shapes are the preset's): the parameter counts are the formula's
    for that depth; the full-depth counts are pinned in test_llama."""
    out = run_json(capsys, "--model", name, "--layers", "2", "--seq", "64")
    shape = est.preset(name, seq_len=64, n_layer=2)
    assert out["parameters"] == est.parameter_count(shape)
    assert out["active_parameters"] == est.active_parameter_count(shape)
    assert out["shape"]["n_layer"] == 2 and out["shape"]["d_model"] == shape.d_model


def test_the_published_counts_at_full_size(capsys):
    for name, total, active in (("llama-2-7b", 6_738_415_616, None), ("llama-3-8b", 8_030_261_248, None),
                                ("mixtral-8x7b", 46_702_792_704, 12_879_925_248)):
        out = run_json(capsys, "--model", name, "--seq", "128")
        assert out["parameters"] == total
        assert out["active_parameters"] == (active or total)
        assert out["seconds"] < 30


def test_a_flag_overrides_the_preset_and_custom_llamas_take_their_flags(capsys):
    out = run_json(capsys, "--model", "llama-3-8b", "--layers", "2", "--kv-heads", "32", "--seq", "64")
    assert out["shape"]["n_kv_head"] == 32 and out["shape"]["vocab_size"] == 128256
    custom = run_json(capsys, *TINY, "--arch", "llama", "--kv-heads", "2", "--ffn", "96", "--experts", "4",
                      "--experts-per-token", "2")
    assert custom["shape"]["arch"] == "llama"
    assert (custom["shape"]["n_kv_head"], custom["shape"]["ffn_hidden"], custom["shape"]["n_experts"]) == (2, 96, 4)
    assert custom["active_parameters"] < custom["parameters"]
    assert "--kv-heads" in one_line_error(capsys, *TINY, "--kv-heads", "2")  # a Llama setting on a GPT
    assert "n_kv_head 3 must divide n_head 4" in one_line_error(capsys, *TINY, "--arch", "llama", "--kv-heads", "3")


def test_json_has_every_field_and_the_gradient_rows_add_up(capsys):
    out = run_json(capsys, *TINY, "--precision", "mixed-bf16")
    for key in ("parameters", "active_parameters", "peak_bytes", "peak_bytes_by_category",
                "parameter_gradient_bytes", "activation_gradient_bytes", "per_layer_saved_bytes",
                "reserved_peak_bytes", "capacity_bytes", "fits", "assumptions"):
        assert key in out, key
    P, cat = out["parameters"], out["peak_bytes_by_category"]
    assert cat["parameter"] == 2 * P and cat["optimizer"] == 12 * P  # bfloat16 weights; m, v, master in float32
    assert out["parameter_gradient_bytes"] >= 4 * P  # float32 main gradients
    assert max(out["parameter_gradient_bytes"], out["activation_gradient_bytes"]) <= cat["gradient"]
    assert cat["gradient"] <= out["parameter_gradient_bytes"] + out["activation_gradient_bytes"]
    assert out["reserved_peak_bytes"] >= out["peak_bytes"]  # the allocator rounds and caches
    assert out["capacity_bytes"] == devices.usable_bytes("H100-80GB") and out["fits"] is True


@pytest.mark.parametrize("precision, weights, states", [("fp32", 4, 8), ("bf16", 2, 8), ("amp-bf16", 4, 8),
                                                        ("amp-fp16", 4, 8), ("mixed-fp16", 2, 12)])
def test_precision_sets_the_bytes_a_parameter(precision, weights, states, capsys):
    out = run_json(capsys, *TINY, "--precision", precision)
    assert out["precision"] == precision
    assert out["peak_bytes_by_category"]["parameter"] == weights * out["parameters"]
    assert out["peak_bytes_by_category"]["optimizer"] == states * out["parameters"]


def test_dtype_is_pure_precision_and_may_not_contradict_precision(capsys):
    assert run_json(capsys, *TINY, "--dtype", "bfloat16")["precision"] == "bf16"
    assert "give one of them" in one_line_error(capsys, *TINY, "--dtype", "float32", "--precision", "amp-bf16")


def test_flash_attention_drops_the_square_terms_and_megatron_saves_are_the_table(capsys):
    args = [*TINY, "--dropout", "0.1", "--precision", "fp16", "--saves", "megatron"]
    explicit = run_json(capsys, *args, "--attention", "explicit")
    flash = run_json(capsys, *args, "--attention", "flash")
    assert explicit["per_layer_saved_bytes"] == est.korthikanti_bytes_per_layer(32, 2, 64, 4)
    # flash keeps no [B, H, T, T] array: the paper's selective row, plus its output (a copy) and log-sum-exp
    lse = 2 * 4 * 32 * 2
    assert flash["per_layer_saved_bytes"] == est.korthikanti_selective_bytes(32, 2, 64) + 2 * 32 * 2 * 64 + lse


def test_the_report_names_every_value_it_assumed(capsys):
    assert cli.main(["estimate", "--layers", "2", "--d-model", "64", "--heads", "4"]) == 0
    out = capsys.readouterr().out
    for said in ("seq 2048", "batch 4", "vocab 32000", "GPT-2's tokenizer has 50,257", "precision fp16",
                 "attention explicit", "saves engine", "device H100-80GB", "arch gpt2"):
        assert said in out, said
    assert "layers 32" not in out  # given
    assert cli.main(["estimate", *TINY, "--precision", "fp32", "--attention", "flash", "--saves", "pytorch",
                     "--gpu", "A100-40GB", "--arch", "gpt2"]) == 0
    assert "assumed" not in capsys.readouterr().out  # everything given
    out = run_json(capsys, "--model", "gpt2", "--layers", "2")
    assert any("batch 1" in a for a in out["assumptions"]) and any("seq 1024" in a for a in out["assumptions"])


def test_the_gpu_sets_the_capacity_and_the_allocator_decides_fit(capsys):
    for name in devices.DEVICES:
        out = run_json(capsys, *TINY, "--gpu", name)
        assert out["device"] == name and out["capacity_bytes"] == devices.usable_bytes(name)
    assert run_json(capsys, *TINY, "--gpu", "nvidia geforce rtx 4090")["device"] == "RTX-4090"
    assert "unknown GPU 'TPU-v5'" in one_line_error(capsys, *TINY, "--gpu", "TPU-v5")
    tight = run_json(capsys, *TINY, "--capacity", "1MiB")
    assert tight["fits"] is False and tight["capacity_bytes"] == 2**20
    # between the ledger's peak and the allocator's reserved peak: allocated fits, reserved does not
    probe = run_json(capsys, *TINY, "--capacity", "none")
    assert probe["fits"] is None and probe["capacity_bytes"] is None
    assert probe["reserved_peak_bytes"] > probe["peak_bytes"] + 2  # tiny buffers: 2 MiB small-pool segments
    between = (probe["peak_bytes"] + probe["reserved_peak_bytes"]) // 2
    out = run_json(capsys, *TINY, "--capacity", f"{between}B")
    assert out["fits_allocated"] is True and out["fits"] is False


def test_alloc_conf_changes_the_reserved_peak_and_is_checked(capsys):
    args = ["--layers", "4", "--d-model", "512", "--heads", "8", "--seq", "512", "--batch", "4", "--vocab", "4096"]
    plain = run_json(capsys, *args)
    expandable = run_json(capsys, *args, "--alloc-conf", "expandable_segments:True")
    assert expandable["peak_bytes"] == plain["peak_bytes"]
    assert expandable["reserved_peak_bytes"] != plain["reserved_peak_bytes"]
    assert "--alloc-conf" in one_line_error(capsys, *TINY, "--alloc-conf", "nonsense:3")


def test_budget_finds_a_plan_that_fits_and_runs_it(capsys):
    args = ["--layers", "6", "--d-model", "128", "--heads", "4", "--seq", "256", "--batch", "4", "--vocab", "256",
            "--optimizer", "sgd"]
    plain = run_json(capsys, *args)
    every = run_json(capsys, *args, "--checkpoint", "every_layer")
    budget = (plain["peak_bytes"] + every["peak_bytes"]) // 2
    out = run_json(capsys, *args, "--budget", f"{budget}B")
    assert out["plan"] and "ckpt" in out["plan"] and out["peak_bytes"] <= budget
    assert out["peak_bytes"] >= every["peak_bytes"]  # it recomputes no more than it must
    assert cli.main(["estimate", *args, "--budget", f"{budget}B"]) == 0
    text = capsys.readouterr().out
    assert "budget: the planner's plan" in text and out["plan"] in text
    assert cli.main(["estimate", *args, "--budget", "1KiB"]) == 0
    assert "budget: no plan fits" in capsys.readouterr().out
    assert "leave out --checkpoint" in one_line_error(capsys, *args, "--budget", "1GB", "--checkpoint", "sqrt")


def test_interleaved_schedule_is_megatrons():
    """Megatron-core's interleaved 1F1B on device 0: 2(p - 1) + (v - 1)p forwards to warm up, chunks in groups
    of p, every forward matched by one backward of its chunk."""
    par = Parallelism(pipeline=4, microbatches=8, virtual=2)
    order = pipeline_schedule(par)
    first_backward = next(i for i, (kind, _) in enumerate(order) if kind == "B")
    assert first_backward == 2 * 3 + 1 * 4 + 1  # the warm-up, then one more forward
    assert [c for kind, c in order[:8] if kind == "F"] == [0, 0, 0, 0, 1, 1, 1, 1]
    for chunk in (0, 1):
        assert sum(1 for k, c in order if k == "F" and c == chunk) == 8
        assert sum(1 for k, c in order if k == "B" and c == chunk) == 8
    assert pipeline_schedule(Parallelism(pipeline=4, microbatches=8))[:5] == [("F", 0)] * 4 + [("B", 0)]
    assert in_flight(Parallelism(pipeline=4, microbatches=8)) == 4


@pytest.mark.parametrize("p, v", [(2, 2), (4, 2), (4, 4), (2, 4)])
def test_interleaving_holds_korthikantis_share_of_layers(p, v):
    """The first device's blocks hold L(1 + (p - 1)/(p·v)) layer-microbatches of activations when its first
    backward starts (Korthikanti et al. 2022, sec. 4.2.3), measured."""
    L = 16
    shape = est.GPTShape(n_layer=L, d_model=64, n_head=4, seq_len=32, batch=16, vocab_size=64, dtype="float16")
    plain = ParallelStep(shape, Parallelism(pipeline=p, microbatches=8), "none")
    one = sum(e.nbytes for e in saved_after_forward(plain.measure(None)[0], "transformer.h.0").values()) // p
    step = ParallelStep(shape, Parallelism(pipeline=p, microbatches=8, virtual=v), "none")
    blocks = sum(e.nbytes for e in saved_after_forward(step.measure(None)[0], "transformer.h").values())
    assert blocks == one * L * (1 + (p - 1) / (p * v))


def test_stage_outputs_are_deallocated_once_sent():
    shape = est.GPTShape(n_layer=4, d_model=64, n_head=4, seq_len=32, batch=8, vocab_size=64, dtype="float16")
    par = Parallelism(pipeline=2, microbatches=4)
    kept = ParallelStep(shape, par, "none", deallocate_outputs=False).measure(None)[0]
    freed = ParallelStep(shape, par, "none", deallocate_outputs=True).measure(None)[0]
    output = 2 * 32 * 64 * 2  # one microbatch's stage output, [2, 32, 64] float16
    assert kept.peak_bytes("activation") == freed.peak_bytes("activation")
    assert kept.peak_bytes("other") - freed.peak_bytes("other") >= output


def test_virtual_stages_bad_arguments(capsys):
    base = ["--layers", "8", "--d-model", "64", "--heads", "4", "--seq", "32", "--batch", "8"]
    assert "needs --pipeline-parallel > 1" in one_line_error(capsys, *base, "--virtual-stages", "2")
    assert "microbatches 3 must be a multiple of 2" in one_line_error(
        capsys, *base[:-1], "12", "--pipeline-parallel", "2", "--microbatches", "3", "--virtual-stages", "2")
    assert "does not divide the 8 layers" in one_line_error(capsys, *base, "--pipeline-parallel", "2",
                                                            "--virtual-stages", "3")
    assert cli.main(["estimate", *base, "--pipeline-parallel", "2", "--microbatches", "4",
                     "--virtual-stages", "2"]) == 0
    assert "interleaved 1F1B" in capsys.readouterr().out


def test_the_reserved_peak_is_the_runs_whatever_else_the_process_holds():
    """A tensor alive before the step and never used by it (another model, garbage not yet collected) is the ledger's
    "untouched": left out of the peak, and out of the device the allocator replay describes."""
    import gc

    import numpy as np

    import tinygrad_ckpt as tg
    from tinygrad_ckpt.scale import report
    from tinygrad_ckpt.scale.estimate import GPTShape
    from tinygrad_ckpt.scale.measure import SteadyStep, using_backend

    shape = GPTShape(n_layer=2, d_model=256, n_head=4, seq_len=128, batch=2, vocab_size=512)
    alone = SteadyStep(shape).measure()[0]
    with using_backend("meta"):
        other = tg.Tensor(np.zeros((64, 2**20), np.float32))  # 256 MiB held and never touched
        cycle = [tg.Tensor(np.zeros((16, 2**20), np.float32))]  # 64 MiB of garbage in a reference cycle
        cycle.append(cycle)
    del cycle
    gc.disable()
    try:
        beside = SteadyStep(shape).measure()[0]
    finally:
        gc.enable()
    assert beside.peak_bytes(untouched=True) >= alone.peak_bytes(untouched=True) + other.nbytes
    assert beside.peak_bytes() == alone.peak_bytes()
    assert report.device_fit(beside.events, None).reserved_peak == report.device_fit(alone.events, None).reserved_peak
    del other
