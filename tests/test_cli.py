"""The `tinygrad-ckpt` command: `estimate` measures a training step on the meta backend, `figures`
delegates to tinygrad_ckpt.app.figures, `--help` lists both."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import types

import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend
from tinygrad_ckpt.app import cli
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale import report
from tinygrad_ckpt.scale.measure import SteadyStep

SMALL = ["estimate", "--layers", "2", "--d-model", "32", "--heads", "4", "--seq", "16", "--batch", "2",
         "--vocab", "50", "--dtype", "float32"]


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "figures" in out and "estimate" in out
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--help"])
    assert "--checkpoint" in capsys.readouterr().out


def test_no_subcommand_prints_help(capsys):
    assert cli.main([]) == 0
    assert "estimate" in capsys.readouterr().out


def test_estimate_small_config_prints_every_category(capsys):
    assert cli.main(SMALL + ["--capacity", "1GB"]) == 0
    out = capsys.readouterr().out
    for word in ("parameters", "gradients", "optimizer states", "activations", "total peak", "forward",
                 "backward", "recompute", "12·B·T·d", "sbh(34+5as/h)", "engine", "fits"):
        assert word in out, word
    assert backend.current().name == "numpy"  # the previous backend is restored


def test_estimate_measures_what_the_formulas_say():
    """No checkpointing, no dropout: the ledger's per-block saves equal the engine's own formula (plus the
    attention's 0-d scale constant), and the parameter peak is exactly params × bytes."""
    shape = est.GPTShape(n_layer=2, d_model=32, n_head=4, seq_len=16, batch=2, vocab_size=50, dtype="float32")
    m = report.measured(SteadyStep(shape, "adamw"), "adamw", "none")
    assert m.n_params == est.gpt_parameter_count(shape)
    assert m.ledger.peak_bytes("parameter") == 4 * m.n_params
    assert m.ledger.peak_bytes("optimizer") == 2 * 4 * m.n_params
    assert 0 <= m.per_layer_saved - est.engine_activation_bytes_per_layer(shape) <= 4
    assert m.ledger.flops("forward") > est.gpt_forward_flops(shape)


@pytest.mark.parametrize("checkpoint", ["every_layer", "sqrt", "selective", "2"])
def test_estimate_with_checkpointing_recomputes_and_saves_less(checkpoint, capsys):
    shape = est.GPTShape(n_layer=4, d_model=32, n_head=4, seq_len=16, batch=2, vocab_size=50, dtype="float16")
    plain = report.measured(SteadyStep(shape, "sgd"), "sgd", "none")
    ckpt = report.measured(SteadyStep(shape, "sgd"), "sgd", cli._checkpoint(checkpoint))
    assert ckpt.ledger.flops("recompute") > 0
    assert ckpt.ledger.peak_bytes("activation") < plain.ledger.peak_bytes("activation")
    assert cli.main(SMALL + ["--checkpoint", checkpoint, "--optimizer", "none"]) == 0
    assert "recompute" in capsys.readouterr().out


def test_capacity_verdict(capsys):
    cli.main(SMALL + ["--capacity", "1000B"])
    assert "does NOT fit" in capsys.readouterr().out
    cli.main(SMALL + ["--capacity", "none"])
    assert "capacity" not in capsys.readouterr().out


@pytest.mark.parametrize("text, expected", [
    ("80GB", 80 * 10**9), ("80GiB", 80 * 2**30), ("40e9B", 40 * 10**9), ("512 MiB", 512 * 2**20),
    ("1.5gb", 1_500_000_000), ("123b", 123), ("74.5 GiB", int(74.5 * 2**30)),
])
def test_parse_size(text, expected):
    assert cli.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["80XB", "lots", "", "80", "40e9", "0GB"])
def test_parse_size_rejects(bad):
    """A bare number is refused: --capacity 80 would otherwise mean 80 bytes."""
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_size(bad)


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--checkpoint", "sometimes"])
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--d-model", "30", "--heads", "4"])  # not divisible
    assert "4 heads do not divide d_model 30" in capsys.readouterr().err


def test_figures_delegates(monkeypatch):
    calls = []
    fake = types.ModuleType("tinygrad_ckpt.app.figures")
    fake.run = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "tinygrad_ckpt.app.figures", fake)
    monkeypatch.setattr(tg.app, "figures", fake, raising=False)
    assert cli.main(["figures", "--quick", "--only", "03", "--out", "x"]) == 0
    assert calls == [{"quick": True, "only": ["03"], "out": "x", "verbose": False}]
    assert cli.main(["figures"]) == 0
    assert calls[-1] == {"quick": False, "only": None, "out": None, "verbose": False}
    assert cli.main(["figures", "--verbose"]) == 0  # the flag the README names (python -m ...app.figures too)
    assert calls[-1]["verbose"] is True


def test_figures_out_that_cannot_be_made_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as done:
        cli.main(["figures", "--quick", "--only", "01", "--out", str(blocker / "figures")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "cannot make that folder" in err


@pytest.mark.parametrize("command", ["figures", "notebooks", "api-docs"])
def test_without_the_repository_a_command_says_so_in_one_line(command, tmp_path, monkeypatch, capsys):
    """A wheel install has the package and no lessons/ or docs/ beside it: one line, exit 1, nothing written."""
    from tinygrad_ckpt.app import figures

    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(figures, "lessons_dir", lambda: site / "lessons")
    assert cli.main([command]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "pip install -e ." in err and "lessons" in err
    assert list(site.iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed here")
def test_a_missing_cupy_says_how_to_install_it():
    """TINYGRAD_CKPT_BACKEND=cupy without CuPy: importing the package still works (the backend is made on first
    use), the CLI says so in one line and exits 2, and an op says it with an ImportError."""
    env = {**os.environ, "TINYGRAD_CKPT_BACKEND": "cupy"}
    done = subprocess.run([sys.executable, "-m", "tinygrad_ckpt.app.cli", "estimate", "--layers", "2"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr == ('tinygrad-ckpt: error: the "cupy" backend needs CuPy, which is not installed: pip install '
                           '-e ".[gpu]" on a machine with a CUDA GPU (or use the numpy backend)\n')
    done = subprocess.run([sys.executable, "-c", "import tinygrad_ckpt as tg; tg.Tensor([1.0])"], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        'ImportError: the "cupy" backend needs CuPy, which is not installed: pip install -e ".[gpu]" on a machine '
        "with a CUDA GPU (or use the numpy backend)")
