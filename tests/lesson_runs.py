"""A lesson loaded by its stem and run once in quick mode into a temporary folder, its one figure checked: what the
tests of a single lesson share."""

from __future__ import annotations

import pathlib

from tinygrad_ckpt.app import figures

LESSONS = pathlib.Path(__file__).resolve().parent.parent / "lessons"


def load(stem: str):
    return figures.load_lesson(LESSONS / f"{stem}.py")


def quick_run(lesson, stem: str, out: pathlib.Path) -> dict:
    """lesson.main(quick=True) into `out`; its figure is `out/<stem>.png`, not empty."""
    result = lesson.main(quick=True, out=str(out))
    (path,) = result["figures"]
    p = pathlib.Path(path)
    assert p.parent == out and p.name == f"{stem}.png" and p.stat().st_size > 10_000
    return result
