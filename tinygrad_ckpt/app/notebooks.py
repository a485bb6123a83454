"""Every lesson as a Jupyter notebook: notebooks/NN_<slug>.ipynb, written from lessons/NN_<slug>.py.

    tinygrad-ckpt notebooks            # (re)write them all (python -m tinygrad_ckpt.app.notebooks: the same)

A notebook is its lesson cut into cells: the docstring as markdown; a cell that puts lessons/ on
sys.path (the lessons `import _common`); the imports; one cell per top-level function or class and
per run of other statements; a parameter cell (QUICK, OUT; tagged "parameters", as papermill
expects); and a last cell that runs `main(quick=QUICK, out=OUT)` and shows the figures it wrote.
Nothing is stored from a run, so the committed notebooks equal what this writes (a test checks it).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

from .figures import discover, lessons_dir

SETUP = """\
# The lesson imports its helpers as `_common` (lessons/_common.py): put lessons/ on the path.
# (Jupyter and VS Code start a notebook in its own folder, notebooks/.)
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join("..", "lessons")))"""

PARAMETERS = """\
QUICK = True  # small sizes: seconds. False: the full sizes of the committed figures (minutes)
OUT = "figures"  # where the figures go, relative to notebooks/ (not the committed ../figures)"""

RUN = """\
import glob

from IPython.display import Image, display

result = main(quick=QUICK, out=OUT)
for path in sorted(glob.glob(os.path.join(OUT, "{stem}*.png"))):
    display(Image(filename=path))"""


def notebooks_dir() -> Path:
    """The repository's notebooks/ folder, beside lessons/."""
    return lessons_dir().parent / "notebooks"


def _cells_of_code(source: str) -> list[str]:
    """The lesson's code after its docstring, cut before every top-level def/class and after it (with the
    comment lines just above a statement kept with it); the imports form one cell; `if __name__` is left out."""
    lines = source.splitlines()
    body = ast.parse(source).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring: the markdown cell
    starts, prev = [], None
    for node in body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        kind = ("def" if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                "import" if isinstance(node, (ast.Import, ast.ImportFrom)) else "other")
        if _is_main_guard(node):
            kind = "main"
        if kind == "def" or kind != prev or prev == "def":
            while first > 0 and lines[first - 1].startswith("#"):
                first -= 1
            starts.append((first, kind))
        prev = kind
    ends = [s for s, _ in starts[1:]] + [len(lines)]
    cells = ["\n".join(lines[s:e]).strip("\n") for (s, kind), e in zip(starts, ends) if kind != "main"]
    return [c for c in cells if c.strip()]


def _is_main_guard(node) -> bool:
    return isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)


def _cell(kind: str, text: str, index: int, **metadata) -> dict:
    lines = text.splitlines(keepends=True)
    cell = {"cell_type": kind, "id": f"cell-{index:02d}", "metadata": metadata, "source": lines}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell


def render(lesson: Path) -> str:
    """The notebook of one lesson, as the text of an .ipynb file (nbformat 4.5, no outputs)."""
    lesson = Path(lesson)
    source = lesson.read_text()
    doc = ast.get_docstring(ast.parse(source)) or lesson.stem
    title, _, rest = doc.partition("\n")
    markdown = f"# {title.strip()}\n\n{rest.strip()}\n\n*Written from `lessons/{lesson.name}` by " \
               "`tinygrad-ckpt notebooks`: edit the lesson, not this notebook.*"
    texts = [("markdown", markdown, {}), ("code", SETUP, {})]
    texts += [("code", code, {}) for code in _cells_of_code(source)]
    texts += [("code", PARAMETERS, {"tags": ["parameters"]}), ("code", RUN.format(stem=lesson.stem), {})]
    nb = {
        "cells": [_cell(kind, text, i, **meta) for i, (kind, text, meta) in enumerate(texts)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def write_all(folder=None) -> list[Path]:
    """Write notebooks/NN_<slug>.ipynb for every lesson (and remove notebooks of lessons that are gone)."""
    folder = Path(folder) if folder is not None else notebooks_dir()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for lesson in discover():
        path = folder / f"{lesson.stem}.ipynb"
        path.write_text(render(lesson))
        written.append(path)
    for old in set(folder.glob("[0-9][0-9]_*.ipynb")) - set(written):
        old.unlink()
    return written


def main(argv=None) -> int:
    written = write_all()
    print(f"wrote {len(written)} notebooks into {notebooks_dir()}/ (open one with `jupyter lab notebooks/` or "
          "in VS Code)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
