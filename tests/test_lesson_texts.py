"""Each lesson stands alone: it states the chapter's claim it measures, prints it, and gives the figures
command a few headline numbers; nothing in the repository needs a file outside it."""

import ast
import subprocess
import sys
from pathlib import Path

import lesson_runs
import pytest

from tinygrad_ckpt.app import figures

ROOT = Path(__file__).resolve().parent.parent
LESSONS = figures.discover()
OUTSIDE = ("../" + "shared", "shared/" + "seed")  # spelled in two parts, so this file does not match itself


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_states_the_claim_it_measures(path):
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree)
    claims = [p for p in doc.split("\n\n") if p.startswith("Claim")]
    assert len(claims) == 1, "one paragraph starting 'Claim (chapter ..., section ...): ...'"
    assert claims[0].startswith('Claim (chapter "') and 'section "' in claims[0]
    assert len(claims[0]) > 150  # the claim in the lesson's own words, not just a reference
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "C.claim" in calls  # and prints it
    assert any(isinstance(n, ast.FunctionDef) and n.name == "headline" for n in tree.body)


def test_nothing_in_the_repository_reaches_outside_it():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix in (".py", ".md", ".toml", ".txt", ".ipynb", ".sh", ".cfg") or name.startswith(".ci/"):
            text = path.read_text(errors="replace")
            if any(outside in text for outside in OUTSIDE):
                offenders.append(name)
    assert not offenders


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem[:2])
def test_figures_prints_each_lessons_headline_numbers(path):
    run = lesson_runs.figures_command()
    lesson = figures.load_lesson(path)
    lines = lesson.headline(run.results[path.stem]["result"]) if hasattr(lesson, "headline") else []
    assert len(lines) <= 4
    for line in lines:
        assert f"      {line}\n" in run.printed


def test_a_quick_figures_run_leaves_git_status_clean():
    run = lesson_runs.figures_command()  # tinygrad-ckpt figures --quick, every lesson
    assert run.exit_code == 0, run.errors
    assert run.status_after == run.status_before
    assert str(figures.output_folder(None, quick=True)) in run.printed


def test_the_command_runs_as_a_module():
    command = [sys.executable, "-m", "tinygrad_ckpt.app.cli", "figures", "--help"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--quick" in proc.stdout, proc.stderr
