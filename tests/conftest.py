"""Shared fixtures: the array backend (NumPy, and CuPy when a GPU is present) and seeding."""

import gc
import os

# The tests use tiny arrays, where BLAS threads only add overhead; on a busy 2-core machine their
# spin-waiting made a 20-step training run 5x slower. Set before NumPy (or torch) is imported;
# export the variables to override.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tinygrad_ckpt as tg  # noqa: E402
from tinygrad_ckpt import backend as backend_module  # noqa: E402


def _cupy_skip_reason():
    """Why the CuPy backend cannot run here, or None when it can."""
    try:
        import cupy
    except ModuleNotFoundError:
        return "CuPy is not installed (the GPU variants: pip install -e '.[gpu]' where there is a CUDA GPU)"
    except Exception as exc:  # a CUDA library failing to load
        return f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver / no device
        return f"no CUDA device ({type(exc).__name__}: {exc})"
    return None if count > 0 else "no CUDA device"


@pytest.fixture(params=["numpy", "cupy"])
def backend(request):
    """The active backend module (`backend.xp()` is numpy or cupy); restores NumPy afterwards."""
    if request.param == "cupy":
        reason = _cupy_skip_reason()
        if reason:
            pytest.skip(reason)
    tg.use_backend(request.param)
    try:
        yield backend_module
    finally:
        tg.use_backend("numpy")


@pytest.fixture(autouse=True)
def seed():
    """Every test starts from the same engine RNG state, NumPy backend and no breakpoints."""
    tg.use_backend("numpy")
    tg.manual_seed(0)
    tg.debug.clear_breakpoints()
    yield 0
    tg.debug.clear_breakpoints()


@pytest.fixture
def rng():
    """A NumPy generator for test data (independent of the engine's RNG)."""
    return np.random.default_rng(1234)


def pytest_terminal_summary(terminalreporter):
    """Why tests skipped, one line per reason with its count (instead of one line per test with -rs)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section(f"{sum(reasons.values())} skipped, by reason", sep="-")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:5d}  {reason}")


# ---- running on every core (pytest-xdist, `-n auto` in pyproject.toml) -----------------------------------------------
# The tests of the lessons read one quick run of every lesson per session (lesson_runs.figures_command, about two
# minutes). Spread over workers, each worker would run it again, so the files that read it form one work unit, run by
# one worker while the others take the rest, a file at a time. Those files are found by what they import, so a new
# lesson test joins the unit without being listed.
TESTS = os.path.dirname(os.path.abspath(__file__))


def lesson_session_files() -> set[str]:
    """The test files that read the session's run of every lesson (they import lesson_runs)."""
    names = (n for n in os.listdir(TESTS) if n.startswith("test_") and n.endswith(".py"))
    return {n for n in names if "lesson_runs" in open(os.path.join(TESTS, n), encoding="utf-8").read()}


def work_unit(nodeid: str, lesson_files: set[str]) -> str:
    """The unit a test runs in: "lesson session" for the files that read the lessons' run, else its file."""
    path = nodeid.split("::", 1)[0]
    return "lesson session" if os.path.basename(path) in lesson_files else path


def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduling by scope, with work_unit as the scope; the lesson session's unit is handed out first,
    as it is the longest."""
    from xdist.scheduler import LoadScopeScheduling

    lesson_files = lesson_session_files()

    class LessonsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid, lesson_files)

    config.option.loadscopereorder = False  # keep the collection's order: the lessons' unit first
    return LessonsTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """The lesson session's tests first (stable otherwise), so that its unit starts as soon as a worker is free."""
    lesson_files = lesson_session_files()
    items.sort(key=lambda item: work_unit(item.nodeid, lesson_files) != "lesson session")


def pytest_collection_finish(session):
    """Everything alive once the tests are collected (the modules, torch's among them, and the test items) lives
    to the end: freeze it out of the collector's reach, so the gc.collect() that each measured step and each
    lesson runs first scans only what the tests made (0.16 s a call with torch loaded; microseconds once frozen)."""
    gc.collect()
    gc.freeze()
