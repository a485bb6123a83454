"""The pdb recipes lesson 8 and the README print work when typed exactly as printed: each command is
sent to the printed command line in a subprocess, and what pdb prints after it is checked."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinygrad_ckpt.app import figures

ROOT = Path(__file__).resolve().parent.parent
LESSON = "lessons/08_stepping_through_backward.py"


def _session(command_line: str, commands: list[str]) -> tuple[int, list[str]]:
    """Run `command_line` (as printed: `python lessons/... --quick --break X`) from the repository root, type
    `commands`; returns (exit code, [what was printed before the first prompt, after command 1, ...])."""
    argv = command_line.split()
    assert argv[0] == "python"
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, re.split(r"(?m)^\(Pdb\) ", proc.stdout + proc.stderr)  # prompts, not printed recipes


def _lesson():
    return figures.load_lesson(ROOT / LESSON)


@pytest.mark.parametrize("pattern", ["softmax", "checkpoint"])
def test_lesson8_pdb_recipes_work_as_printed(pattern, capsys):
    lesson = _lesson()
    _, line = lesson.replay_line()
    recipe = lesson.pdb_recipes(line)[pattern]
    command_line = f"python {LESSON} --quick --break {pattern}"
    rc, outputs = _session(command_line, [cmd for cmd, _, _ in recipe])
    assert rc == 0, outputs[-1][-2000:]
    assert len(outputs) == len(recipe) + 1, outputs[-1][-2000:]  # one prompt per command, none left over
    for (cmd, _, expected), out in zip(recipe, outputs[1:]):
        assert "***" not in out and "Traceback" not in out, f"{cmd!r} printed:\n{out}"
        assert re.search(expected, out, re.MULTILINE), f"{cmd!r} printed:\n{out}"


def test_lesson8_prints_the_recipes_the_test_types(tmp_path, capsys):
    lesson = _lesson()
    lesson.main(quick=True, out=str(tmp_path))
    printed = capsys.readouterr().out
    _, line = lesson.replay_line()
    for pattern, recipe in lesson.pdb_recipes(line).items():
        assert f"python {LESSON} --quick --break {pattern}\n" in printed
        for cmd, what, _ in recipe:
            assert f"  (Pdb) {cmd:<52} # {what}" in printed


def test_readme_pdb_recipe_works_as_printed():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Stepping through backward\n\n```text\n(.*?)```", text, re.S).group(1).splitlines()
    command_line = block[0].removeprefix("$ ")
    commands = [ln.removeprefix("(Pdb) ").split("  #")[0].strip() for ln in block[1:] if ln.startswith("(Pdb) ")]
    assert command_line.startswith("python lessons/") and len(commands) >= 4
    rc, outputs = _session(command_line, commands)
    assert rc == 0 and len(outputs) == len(commands) + 1
    for cmd, out in zip(commands, outputs[1:]):
        assert "***" not in out and "Traceback" not in out, f"{cmd!r} printed:\n{out}"


def test_q_at_a_stop_ends_the_program_quietly():
    rc, outputs = _session(f"python {LESSON} --quick --break softmax", ["q"])
    assert rc == 0
    assert "Traceback" not in outputs[-1] and "BdbQuit" not in outputs[-1]
    assert "wrote" not in outputs[-1]  # it stopped there


def test_a_quick_run_leaves_the_committed_figures_alone(tmp_path):
    proc = subprocess.run([sys.executable, LESSON, "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = re.findall(r"wrote (\S+\.png)", proc.stdout)
    assert written and not any(Path(p).resolve().is_relative_to(ROOT / "figures") for p in written)
    assert Path(figures.output_folder(None, quick=True)).resolve() == Path(written[0]).resolve().parent
