"""Every lesson runs once per test session, at quick size, and the tests read that run.

`figures_command()` is the README's `tinygrad-ckpt figures` at quick sizes, run in process through the command's own
entry point (cli.main) the first time a test asks: it runs every lesson once, and keeps what the command printed,
its exit code, each lesson's result and figures, and git's status of figures/ and notebooks/ before and after.
The tests of a lesson's claims read its result from there instead of running the lesson again."""

from __future__ import annotations

import contextlib
import io
import pathlib
import subprocess
from dataclasses import dataclass

from tinygrad_ckpt.app import cli, figures

LESSONS = pathlib.Path(__file__).resolve().parent.parent / "lessons"
ROOT = LESSONS.parent


@dataclass
class FiguresRun:
    """One run of `tinygrad-ckpt figures --quick`."""
    argv: list
    exit_code: int
    printed: str
    errors: str
    results: dict  # {lesson stem: {"seconds", "figures", "result"}}, as figures.run returns
    status_before: str
    status_after: str


_RUN: FiguresRun | None = None


def _status() -> str:
    done = subprocess.run(["git", "status", "--porcelain", "--", "figures", "notebooks"], cwd=ROOT,
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else f"(git status failed: {done.stderr.strip()})"


def figures_command() -> FiguresRun:
    """The session's one run of every lesson (see the module's docstring)."""
    global _RUN
    if _RUN is None:
        argv, results, real_run = ["figures", "--quick"], {}, figures.run

        def keep(**kwargs):  # the command's own figures.run, its return value kept for the tests
            results.update(real_run(**kwargs))
            return results

        before, out, err = _status(), io.StringIO(), io.StringIO()
        figures.run = keep
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli.main(list(argv))
        finally:
            figures.run = real_run
        _RUN = FiguresRun(argv, code or 0, out.getvalue(), err.getvalue(), results, before, _status())
    return _RUN


def load(stem: str):
    return figures.load_lesson(LESSONS / f"{stem}.py")


def quick_result(stem: str, figures_expected: int | None = None) -> dict:
    """A lesson's result from the session's run; its figures are files of more than 10 kB named after it."""
    run = figures_command()
    assert run.exit_code == 0, f"tinygrad-ckpt figures --quick exited {run.exit_code}:\n{run.errors}"
    result = run.results[stem]["result"]
    for path in result.get("figures", []):
        p = pathlib.Path(path)
        assert p.name.startswith(stem[:3]) and p.suffix == ".png", path
        assert p.is_file() and p.stat().st_size > 10_000, f"figure {path} missing or empty"
    if figures_expected is not None:
        assert len(result["figures"]) == figures_expected
    return result
