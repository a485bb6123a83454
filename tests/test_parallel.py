"""One device of a tensor/sequence/pipeline-parallel run on the meta backend (tinygrad_ckpt.scale.parallel,
measure.ParallelStep), its activations against Korthikanti et al. 2022 Table 2, ZeRO, and the CLI's errors."""

from __future__ import annotations

import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend
from tinygrad_ckpt.app import cli
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale import report
from tinygrad_ckpt.scale.measure import ParallelStep, saved_after_forward
from tinygrad_ckpt.scale.parallel import DeviceShard, Parallelism


def _shape(s, b, h, a, dropout=0.1, layers=2, dtype="float16"):
    return est.GPTShape(n_layer=layers, d_model=h, n_head=a, seq_len=s, batch=b, vocab_size=64, dtype=dtype,
                        dropout=dropout)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_table_2_closed_forms(t):
    s, b, h, a = 128, 2, 256, 8
    sbh = s * b * h
    assert sum(est.korthikanti_parallel_terms(s, b, h, a, t).values()) == sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert sum(est.korthikanti_parallel_terms(s, b, h, a, t, sequence=True).values()) == \
        sbh / t * (34 + 5 * a * s / h)
    assert sum(est.korthikanti_parallel_terms(s, b, h, a, t, sequence=True, selective=True).values()) == 34 * sbh / t


@pytest.mark.parametrize("s,b,h,a", [(32, 2, 64, 8), (64, 1, 32, 4), (16, 3, 96, 8)])
@pytest.mark.parametrize("t,sequence", [(1, False), (2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("selective", [False, True])
def test_one_layer_agrees_with_table_2_once_each_difference_is_named(s, b, h, a, t, sequence, selective):
    shape = _shape(s, b, h, a)
    par = Parallelism(tensor=t, sequence=sequence)
    led, _ = ParallelStep(shape, par, "none").measure("selective" if selective else None)
    c = report.compare_layer(led, shape, par, selective)
    assert c.unexplained == 0, c
    assert c.formula == sum(est.korthikanti_parallel_terms(s, b, h, a, t, sequence, selective).values())
    named = dict((label, n) for label, n, _ in c.explained)
    terms = est.korthikanti_parallel_terms(s, b, h, a, t, sequence, selective)
    rstd = 2 * b * s // (t if sequence else 1) * 2  # two 1/std vectors [B, T(/t), 1], 2 B each
    # each layer norm keeps its output (the next linear's input, in the paper's linear terms), not its input
    assert named["layer norms"] == rstd - terms["layernorms"]
    assert named["causal mask [T, T]"] == (0 if selective else s * s)
    masks = [n for k, n in terms.items() if k.endswith("dropout_mask")]  # 1 B an element in the paper
    assert named["dropout masks"] == sum(-(-n // 8) - n for n in masks)  # 1 bit an element here


@pytest.mark.parametrize("saves", ["megatron", "pytorch"])
@pytest.mark.parametrize("s,b,h,a", [(32, 2, 64, 8), (64, 1, 32, 4), (16, 3, 96, 8)])
@pytest.mark.parametrize("t,sequence", [(1, False), (2, False), (4, False), (2, True), (4, True)])
@pytest.mark.parametrize("checkpoint", [None, "selective", "every_layer"])
def test_table_2_every_row_is_exact_under_megatrons_and_pytorchs_saves(saves, s, b, h, a, t, sequence, checkpoint):
    """Table 2's five rows (t; t with sequence parallelism; full recompute; selective; selective with sequence
    parallelism) at three shapes, with the frameworks' own saves: no byte unexplained, the layer norms' term
    their kept inputs (under a selective policy the block input and the residual sum are those inputs)."""
    shape = _shape(s, b, h, a, dropout=0.0)
    par = Parallelism(tensor=t, sequence=sequence)
    led, _ = ParallelStep(shape, par, "none", saves=saves).measure(checkpoint)
    if checkpoint == "every_layer":
        c = report.full_recompute_layer(led, shape, par)
        assert c.unexplained == 0 and c.measured == c.formula > 0, c
        return
    c = report.compare_layer(led, shape, par, checkpoint == "selective")
    assert c.unexplained == 0, c
    named = dict((label, n) for label, n, _ in c.explained)
    terms = est.korthikanti_parallel_terms(s, b, h, a, t, sequence, checkpoint == "selective")
    stats = 2 * 2 * b * s // (t if sequence else 1) * 2  # PyTorch's layer norms: mean and 1/std, [B, T(/t)], 2 B
    assert named["layer norms"] == (stats if saves == "pytorch" else 0)  # its input: the paper's term exactly
    if checkpoint == "selective":
        assert named["c_proj input, rebuilt"] == -terms["attn.proj_input"]


def test_without_dropout_the_papers_dropout_terms_are_the_difference():
    shape = _shape(32, 2, 64, 8, dropout=0.0)
    par = Parallelism(tensor=2)
    led, _ = ParallelStep(shape, par, "none").measure(None)
    c = report.compare_layer(led, shape, par, False)
    assert c.unexplained == 0
    terms = est.korthikanti_parallel_terms(32, 2, 64, 8, 2)
    named = dict((lbl, n) for lbl, n, _ in c.explained)
    assert named["dropout masks"] + named["no attention dropout output"] == \
        -sum(n for k, n in terms.items() if "dropout" in k)


def test_sharded_weights_and_a_numpy_step_match_the_meta_ledger():
    shape = _shape(16, 2, 32, 4, layers=2, dtype="float32")
    par = Parallelism(tensor=2, sequence=True)
    led_meta, _ = ParallelStep(shape, par, "adamw").measure(None)
    led_np, _ = ParallelStep(shape, par, "adamw", backend_name="numpy").measure(None)
    for cat in ("parameter", "gradient", "optimizer", "activation"):
        assert led_meta.peak_bytes(cat) == led_np.peak_bytes(cat), cat
    tg.manual_seed(0)
    model = DeviceShard(shape, par)
    sizes = {n: p.shape for n, p in model.named_parameters()}
    assert sizes["transformer.h.0.attn.c_attn.weight"] == (3 * 32 // 2, 32)  # column-parallel
    assert sizes["transformer.h.0.attn.c_proj.weight"] == (32, 32 // 2)  # row-parallel
    assert sizes["transformer.h.0.mlp.c_fc.weight"] == (4 * 32 // 2, 32)
    assert sizes["transformer.wte.weight"] == (64 // 2, 32)  # vocabulary-parallel


def test_pipeline_first_stage_holds_p_microbatches():
    shape = _shape(32, 8, 64, 8, layers=4)
    per_layer = None
    for p in (2, 4):
        par = Parallelism(tensor=2, pipeline=p, microbatches=8)
        led, _ = ParallelStep(shape, par, "none").measure(None)
        blocks = sum(e.nbytes for e in saved_after_forward(led, "transformer.h").values())
        one = sum(e.nbytes for e in saved_after_forward(led, "transformer.h.0").values()) // p
        per_layer = per_layer or one
        assert one == per_layer
        assert blocks == p * (4 // p) * one == 4 * one  # Korthikanti: the first stage holds L layers' worth


def test_zero_divides_what_it_shards():
    shape = _shape(16, 2, 32, 4, dtype="float32")
    for zero in (1, 2, 3):
        step = ParallelStep(shape, Parallelism(tensor=2, zero=zero, data=4))
        led, _ = step.measure(None)
        view = step.zero_view(led)
        n = step.model.num_parameters()
        assert view["optimizer"] == round(led.peak_bytes("optimizer") / 4) == 2 * 4 * n // 4
        if zero == 1:
            assert view["gradient"] == led.peak_bytes("gradient")
        else:  # the parameters' gradients are sharded, the activations' in flight are not
            param_grads, in_flight = report.gradient_peaks(led, {p.name for p in step.model.parameters()})
            assert param_grads >= 4 * n and in_flight > 0  # (a second gradient of a tied weight, briefly)
            assert max(param_grads // 4, in_flight) <= view["gradient"] <= param_grads // 4 + in_flight
        assert view["parameter"] == round(led.peak_bytes("parameter") / (4 if zero == 3 else 1))
        assert view["activation"] == led.peak_bytes("activation")
        assert view["peak"] < led.peak_bytes()


def test_cli_parallel_report(capsys):
    args = ["estimate", "--layers", "4", "--d-model", "64", "--heads", "8", "--seq", "32", "--batch", "4",
            "--vocab", "64", "--dropout", "0.1"]
    assert cli.main(args + ["--tensor-parallel", "4", "--sequence-parallel", "--checkpoint", "selective"]) == 0
    out = capsys.readouterr().out
    assert "K22 Table 2: 34·sbh/t" in out and "(agrees exactly)" in out and "2 of 8 heads" in out
    assert cli.main(args + ["--tensor-parallel", "2", "--pipeline-parallel", "2", "--microbatches", "4",
                            "--zero", "1", "--data-parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "1F1B" in out and "ZeRO-1" in out
    for sp in ([], ["--sequence-parallel"]):
        assert cli.main(args + ["--tensor-parallel", "4", "--checkpoint", "every_layer"] + sp) == 0
        out = capsys.readouterr().out
        assert "full recompute" in out and "(agrees exactly)" in out


@pytest.mark.parametrize("extra,needle", [
    (["--tensor-parallel", "3"], "--tensor-parallel 3 does not divide the 8 heads"),
    (["--sequence-parallel"], "--sequence-parallel splits the sequence"),
    (["--tensor-parallel", "2", "--microbatches", "2"], "--microbatches 2 needs --pipeline-parallel"),
    (["--pipeline-parallel", "3"], "--pipeline-parallel 3 does not divide the 4 layers"),
    (["--pipeline-parallel", "2", "--microbatches", "3"], "--microbatches 3 does not divide the batch 4"),
    (["--zero", "2"], "--zero 2 shards over the data-parallel replicas"),
    (["--zero", "4", "--data-parallel", "2"], "invalid choice"),
    (["--tensor-parallel", "0"], "must be at least 1"),
    (["--tensor-parallel", "2", "--checkpoint", "sqrt"], "--checkpoint sqrt with parallelism"),
])
def test_bad_combinations_are_one_line_and_exit_2(capsys, extra, needle):
    args = ["estimate", "--layers", "4", "--d-model", "64", "--heads", "8", "--seq", "32", "--batch", "4",
            "--vocab", "64"]
    with pytest.raises(SystemExit) as done:
        cli.main(args + extra)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert backend.current().name == "numpy"
    assert cli.main(args + ["--tensor-parallel", "2"]) == 0  # works as before after the error


def test_parallelism_check_names_the_argument():
    with pytest.raises(ValueError, match="tensor_parallel 3 does not divide the 8 heads"):
        Parallelism(tensor=3).check(_shape(32, 2, 64, 8))
    with pytest.raises(ValueError, match="microbatches must be a positive integer"):
        Parallelism(pipeline=2, microbatches=0).check(_shape(32, 2, 64, 8))
