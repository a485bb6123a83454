"""Each case of docs/troubleshooting.md (the README links it) happens as it says: its symptom is produced and the
remedy it gives works. The cases are read from the page (a bold heading per bullet); a case added there without a
check here fails test_every_case_is_checked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.app import cli, figures

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "troubleshooting.md"


def cases() -> list[str]:
    """The bold headings of the page's bullets."""
    return re.findall(r"^- \*\*(.+?)\*\*", PAGE.read_text(), re.M)


def _gpt(**kw):
    tg.manual_seed(0)
    return nn.GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16, **kw)


def _idx():
    return np.random.default_rng(0).integers(0, 32, (2, 16))


def check_command_not_found():
    """The command is the package's entry point (pyproject's [project.scripts]), reached once it is installed."""
    text = (README.parent / "pyproject.toml").read_text()
    assert 'tinygrad-ckpt = "tinygrad_ckpt.app.cli:main"' in text


def check_no_lessons_folder(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(figures, "lessons_dir", lambda: tmp_path / "lessons")  # a wheel install: no lessons/
    assert cli.main(["figures", "--quick"]) == 1
    err = capsys.readouterr().err
    assert "no lessons folder" in err and "pip install -e ." in err


def check_quick_figures(monkeypatch, capsys, tmp_path):
    out = figures.output_folder(None, quick=True)
    assert out != "figures" and "tinygrad_ckpt-quick-figures" in out
    figures.run(quick=True, only="02", out=str(tmp_path))
    assert f"into {tmp_path}/" in capsys.readouterr().out  # the run prints where it wrote them


def check_slow_lesson():
    """Importing the package before NumPy sets OpenBLAS's spin timeout; the thread count is read from the
    environment variable the README names."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    env["PYTHONPATH"] = str(README.parent)
    done = subprocess.run([sys.executable, "-c", "import os, tinygrad_ckpt, numpy; "
                           "print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "14", done.stderr
    assert "TINYGRAD_CKPT_THREADS" in (README.parent / "tinygrad_ckpt" / "backend" / "threads.py").read_text()


def check_pdb_never_stops():
    gpt = _gpt()
    _, loss = gpt(_idx(), _idx())
    tg.debug.break_before("sofmax")  # a typo: matches nothing
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss.backward()
    tg.debug.clear_breakpoints()
    message = " ".join(str(w.message) for w in caught)
    assert "matched no tape entry" in message and "softmax" in message  # the closest names listed


def check_second_backward():
    gpt = _gpt()
    _, loss = gpt(_idx(), _idx())
    loss.backward()
    with pytest.raises(RuntimeError, match=r"backward through '.*a second time.*retain_graph=True"):
        loss.backward()
    _, loss = gpt(_idx(), _idx())
    loss.backward(retain_graph=True)
    loss.backward()  # the remedy works


def check_replay_diverged():
    calls = []

    def changing(h):  # reads changing state: a different op sequence when replayed
        calls.append(1)
        return h * 2.0 if len(calls) == 1 else (h * 2.0).exp()

    x = tg.Tensor(np.ones(4, dtype=np.float32), requires_grad=True)
    y = tg.checkpoint(changing, x)
    with pytest.raises(tg.CheckpointError, match=r"checkpoint replay diverged at op"):
        y.sum().backward()


def check_out_of_memory():
    gpt = _gpt()
    with pytest.raises(tg.OutOfMemoryError, match=r"Live by category: .*Largest holders"):
        with tg.Ledger(capacity_bytes=1000):
            gpt(_idx(), _idx())[1].backward()


def check_notebooks():
    paths = sorted((README.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert paths and all('"outputs": []' in p.read_text() for p in paths)  # plain files, no outputs


def check_tests_skip():
    text = (Path(__file__).parent / "conftest.py").read_text()  # the summary of skips, grouped by reason
    assert "def pytest_terminal_summary" in text and "skipped, by reason" in text


CHECKS = {
    "`tinygrad-ckpt: command not found`": check_command_not_found,
    '"no lessons folder"': check_no_lessons_folder,
    "A quick run's figures are not in `figures/`": check_quick_figures,
    "A lesson is much slower than the README's lesson table says": check_slow_lesson,
    "pdb never stops at `break_before(...)`": check_pdb_never_stops,
    "`RuntimeError: backward through '...' a second time`": check_second_backward,
    "`CheckpointError: checkpoint replay diverged at op ...`": check_replay_diverged,
    "`OutOfMemoryError` inside a `Ledger(capacity_bytes=...)`": check_out_of_memory,
    "The notebooks don't open": check_notebooks,
    "Tests skip": check_tests_skip,
}


def test_every_case_is_checked():
    found = cases()
    assert len(found) >= 8 and "docs/troubleshooting.md" in README.read_text()  # the README sends readers there
    assert [c for c in found if c.rstrip(":") not in CHECKS] == [], "add a check for these Troubleshooting cases"


@pytest.mark.parametrize("case", cases())
def test_the_case_happens_as_the_page_says(case, request):
    check = CHECKS.get(case.rstrip(":"))
    assert check is not None, f"no check for the Troubleshooting case {case!r}"
    names = check.__code__.co_varnames[:check.__code__.co_argcount]
    check(*(request.getfixturevalue(n) for n in names))
