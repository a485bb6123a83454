"""Run the lessons and write their figures.

    python -m tinygrad_ckpt.app.figures [--quick] [--only 01 3] [--out figures] [--verbose]
    tinygrad-ckpt figures [--quick] [--only NN] [--out DIR] [--verbose]   (the same, through cli.py)

The lessons live in `lessons/NN_<slug>.py` next to the package (in the repository, not inside the
installed package), so they are found from this file's location and loaded by path. Each one's
`main(quick=..., out=...)` prints its narrative (shown with --verbose) and writes
`{out}/NN_<slug>*.png`; `run` shows which lesson is running, for how long, and the few headline
numbers its `headline(result)` picks from what `main` returned.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import sys
import tempfile
import threading
import time
from pathlib import Path


def output_folder(out=None, quick: bool = False) -> str:
    """Where the figures go: `out` when given; else figures/ at full size, and a scratch folder for quick
    runs, so that a quick pass never replaces the committed full-size figures."""
    if out is not None:
        return str(out)
    return str(Path(tempfile.gettempdir()) / "tinygrad_ckpt-quick-figures") if quick else "figures"


def lessons_dir() -> Path:
    """The repository's lessons/ folder (the package's parent folder holds it)."""
    return Path(__file__).resolve().parents[2] / "lessons"


class LessonsNotFound(FileNotFoundError):
    """No lessons/ beside the package: installed from a wheel, without the repository."""


def discover() -> list[Path]:
    """lessons/NN_*.py in order of their number."""
    folder = lessons_dir()
    if not folder.is_dir():
        raise LessonsNotFound(
            f"no lessons folder at {folder}: the lessons ship with the repository, not the installed package. "
            "Clone the repository and install it with `pip install -e .` to run them."
        )
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py") if p.is_file())


def _numbers(only) -> set[int] | None:
    """None -> None; "01", "1", 3, "1,3", ["01", "4"] -> {1, 3, 4}."""
    if only is None:
        return None
    items = [only] if isinstance(only, (str, int)) else list(only)
    out = set()
    for item in items:
        for part in str(item).replace(",", " ").split():
            number = part.split("_")[0]
            if not number.isdigit():
                raise ValueError(f"--only takes lesson numbers such as 01 or 3, got {part!r}")
            out.add(int(number))
    return out


def select(only=None) -> list[Path]:
    """The lessons chosen by `only` (see _numbers); all of them for None."""
    paths = discover()
    wanted = _numbers(only)
    if wanted is None:
        return paths
    chosen = [p for p in paths if int(p.name[:2]) in wanted]
    missing = wanted - {int(p.name[:2]) for p in chosen}
    if missing:
        have = ", ".join(p.stem for p in paths)
        raise ValueError(f"no lesson numbered {sorted(missing)}; the lessons are: {have}")
    return chosen


def load_lesson(path) -> object:
    """Import lessons/NN_slug.py by path (its folder goes on sys.path, for `import _common`)."""
    path = Path(path).resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = "tinygrad_ckpt_lesson_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class _Ticker:
    """Rewrites '[i/n] lesson ... 3.2 s' in place every half second (only on a terminal)."""

    def __init__(self, stream, label: str):
        self.stream, self.label = stream, label
        self.t0 = time.perf_counter()
        self._stop = threading.Event()
        self._thread = None
        if getattr(stream, "isatty", lambda: False)():
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        else:
            print(f"{label} ...", file=stream, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.stream.write(f"\r{self.label} ... {time.perf_counter() - self.t0:.1f} s")
            self.stream.flush()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.stream.write("\r")


def run(quick: bool = False, only=None, out=None, verbose: bool = False) -> dict:
    """Run each selected lesson's main(quick=quick, out=out); write all figures under `out`.

    only: None (all), a lesson number ("01", "1", 3) or several (a list, or "1,3"); out: None means
    `output_folder(None, quick)`; an unknown lesson number raises ValueError before anything runs. verbose: show
    the lessons' narratives (otherwise only the progress lines). Returns {lesson stem: {"seconds",
    "figures", "result"}}; a lesson that fails stops the run, its output printed, its error raised.
    """
    paths = select(only)
    out = output_folder(out, quick)
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot make that folder ({exc.strerror or exc})") from None
    stream = sys.stdout
    mode = "quick" if quick else "full"
    print(f"tinygrad_ckpt figures: {len(paths)} lesson(s), {mode} sizes, into {out}/", file=stream, flush=True)
    results, t_all = {}, time.perf_counter()
    for i, path in enumerate(paths, 1):
        label = f"[{i}/{len(paths)}] {path.stem}"
        module = load_lesson(path)
        gc.collect()  # what is alive now (modules, torch, earlier lessons' results) lives to the end of the run:
        gc.freeze()  # frozen, the gc.collect() each measurement runs first scans only the lesson's own objects
        captured = io.StringIO()
        ticker = None if verbose else _Ticker(stream, label)
        if verbose:
            print(f"{label}", file=stream, flush=True)
        t0, before = time.perf_counter(), _figures_in(out, path.stem)
        try:
            with contextlib.nullcontext() if verbose else contextlib.redirect_stdout(captured):
                result = module.main(quick=quick, out=out)
        except BaseException:
            if ticker is not None:
                ticker.stop()
                print(f"{label} FAILED; its output:\n{captured.getvalue()}", file=sys.stderr, flush=True)
            raise
        if ticker is not None:
            ticker.stop()
        seconds = time.perf_counter() - t0
        figures = sorted(p for p, t in _figures_in(out, path.stem).items() if before.get(p) != t)  # this run's
        print(f"{label} done in {seconds:.1f} s: {len(figures)} figure(s)", file=stream, flush=True)
        for line in getattr(module, "headline", lambda result: [])(result):
            print(f"      {line}", file=stream, flush=True)
        results[path.stem] = {"seconds": seconds, "figures": figures, "result": result}
    total = time.perf_counter() - t_all
    n_fig = sum(len(r["figures"]) for r in results.values())
    print(f"all done in {total:.1f} s: {n_fig} figure(s) in {out}/", file=stream, flush=True)
    return results


def _figures_in(out, stem: str) -> dict:
    """{path: modification time} of a lesson's figures in `out` (a lesson that skips writes none, and one
    that ran before left its files: only those it writes now count as its figures)."""
    return {str(p): p.stat().st_mtime_ns for p in Path(out).glob(f"{stem}*.png")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinygrad_ckpt.app.figures",
                                     description="Run the lessons and write their figures.")
    parser.add_argument("--quick", action="store_true", help="small sizes: seconds instead of minutes")
    parser.add_argument("--only", nargs="+", metavar="NN", help="lesson numbers to run (e.g. 01 3)")
    parser.add_argument("--out", default=None, help="folder for the figures (default: figures/; with --quick a "
                                                    "scratch folder)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each lesson's narrative")
    args = parser.parse_args(argv)
    try:
        run(quick=args.quick, only=args.only, out=args.out, verbose=args.verbose)
    except (ValueError, FileNotFoundError) as e:
        parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
