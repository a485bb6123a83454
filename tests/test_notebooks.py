"""The notebooks in notebooks/ are what `tinygrad-ckpt notebooks` writes from the lessons now, one per
lesson, and each runs top to bottom in a Jupyter kernel (nbclient, ipykernel) on quick sizes."""

import os
import pathlib

import pytest
from needs import TORCH_MISSING

from tinygrad_ckpt.app import figures, notebooks

REPO = pathlib.Path(figures.lessons_dir()).parent
LESSONS = [p.stem for p in figures.discover()]
STALE = "is not what `tinygrad-ckpt notebooks` writes from the lessons now: run `tinygrad-ckpt notebooks` " \
        "(or `python -m tinygrad_ckpt.app.notebooks`) and commit notebooks/"


def test_one_notebook_per_lesson():
    have = sorted(p.stem for p in notebooks.notebooks_dir().glob("*.ipynb"))
    assert have == LESSONS, f"notebooks/ {STALE}"


@pytest.mark.parametrize("stem", LESSONS)
def test_notebook_is_up_to_date(stem):
    path = notebooks.notebooks_dir() / f"{stem}.ipynb"
    assert path.is_file() and path.read_text() == notebooks.render(figures.lessons_dir() / f"{stem}.py"), \
        f"notebooks/{stem}.ipynb {STALE}"


def test_cells_follow_the_lesson():
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[test]')")
    nb = nbformat.reads(notebooks.render(figures.lessons_dir() / "02_why_backward_needs_activations.py"), 4)
    nbformat.validate(nb)
    sources = ["".join(c.source) for c in nb.cells]
    assert nb.cells[0].cell_type == "markdown" and sources[0].startswith("# Lesson 2: why backward needs activations")
    assert all(c.cell_type == "code" and not c.outputs for c in nb.cells[1:])
    assert any(s.startswith("def gelu(x):") for s in sources) and any(s.startswith("def main(") for s in sources)
    assert not any("__main__" in s for s in sources)
    assert nb.cells[-2].metadata.tags == ["parameters"] and sources[-2].startswith("QUICK = True")
    assert "result = main(quick=QUICK, out=OUT)" in sources[-1]


# One notebook runs in a Jupyter kernel: every notebook is its lesson's code cell by cell (the tests above), and every
# lesson runs once per session at quick size (tests/lesson_runs.py), so running all fifteen again here would only
# run the lessons a second time. Lesson 02 writes two figures, so the last cell's showing of each is checked too.
@pytest.mark.parametrize("stem", ["02_why_backward_needs_activations"])
def test_notebook_runs_on_quick_sizes(stem, tmp_path):
    nbformat = pytest.importorskip("nbformat", reason="nbformat not installed (pip install -e '.[test]')")
    nbclient = pytest.importorskip("nbclient", reason="nbclient not installed (pip install -e '.[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel not installed (pip install -e '.[test]')")
    if stem.startswith(("11_", "15_")):  # the lesson only says "skipped" without PyTorch
        pytest.importorskip("torch", reason=f"lesson {stem[:2]}: {TORCH_MISSING}")
    nb = nbformat.reads((notebooks.notebooks_dir() / f"{stem}.ipynb").read_text(), 4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    params.source = f"QUICK = True\nOUT = {str(tmp_path)!r}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               MPLBACKEND="Agg")
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(notebooks.notebooks_dir())}})
    client.execute(env=env)  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    written = sorted(p.name for p in tmp_path.glob(f"{stem}*.png"))
    assert written, f"{stem}: the notebook wrote no figure into {tmp_path}"
    shown = [o for o in nb.cells[-1].outputs if "image/png" in o.get("data", {})]
    assert len(shown) == len(written)  # the last cell shows every figure


def test_the_command_writes_one_notebook_per_lesson(tmp_path, monkeypatch, capsys):
    from tinygrad_ckpt.app import cli

    (tmp_path / "99_gone.ipynb").write_text("{}")  # a lesson that no longer exists loses its notebook
    monkeypatch.setattr(notebooks, "notebooks_dir", lambda: tmp_path)
    assert cli.main(["notebooks"]) == 0
    assert sorted(p.stem for p in tmp_path.glob("*.ipynb")) == LESSONS
    assert f"wrote {len(LESSONS)} notebooks" in capsys.readouterr().out
