"""The README and the docs pages it sends readers to (DOCUMENTS) run as printed: every command of their ```bash blocks
(at quick sizes where the command has a --quick flag) and every ```python block, in order, in one namespace per page,
as a reader pasting a page into one session would; every flag they name exists on the command it names, as does
every flag a `--help` names. The blocks are read from the pages themselves, so a block added or changed tomorrow is
run tomorrow. The Troubleshooting cases (docs/troubleshooting.md) are checked one by one in
tests/test_troubleshooting.py."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import lesson_runs
import pytest
from needs import TORCH_MISSING

from tinygrad_ckpt.app import cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# the pages whose code is run and whose flags are checked here, the README first (docs/api.md is generated from the
# docstrings; docs/checkpointing.md, benchmarks.md and gpu.md are reports that benchmarks/ writes)
DOCUMENTS = [README] + [ROOT / "docs" / f"{name}.md" for name in
                        ("ledger", "explorer", "estimate", "pytorch", "engine", "house", "troubleshooting")]

# Commands the test leaves out, and why: setting up an environment is what CI itself does first (.ci/run).
LEFT_OUT = {
    r"python3? -m venv \S+": "creates a virtual environment: CI's own first step (.ci/run)",
    r"\. \S*/bin/activate": "activates that environment: the tests already run inside one",
    r"(python -m )?pip install .*": "installs packages: what CI itself runs (.ci/run)",
    r"python -m pytest( -q)?": "the test suite itself, this test included (CI runs it)",
}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(lang: str, text: str | None = None, path: Path = README) -> list[tuple[int, str]]:
    """(line number, body) of every ```lang fenced block of the page at path (the README unless told)."""
    text = path.read_text() if text is None else text
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(rf"^```{lang}\n(.*?)^```", text,
                                                                                 re.S | re.M)]


def shell_commands(text: str | None = None, path: Path = README) -> list[tuple[int, str]]:
    """(line, command) of the ```bash blocks: continuation lines joined, comments dropped, `a && b` as two."""
    commands = []
    for line, body in code_blocks("bash", text, path):
        start, pending = None, ""
        for offset, raw in enumerate(body.splitlines()):
            start = line + 1 + offset if start is None else start
            pending += " " + re.sub(r"\s+#.*$", "", raw).strip()
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            commands += [(start, " ".join(c.split())) for c in pending.split("&&") if c.strip()]
            start, pending = None, ""
    return commands


def left_out(command: str) -> str | None:
    return next((why for pattern, why in LEFT_OUT.items() if re.fullmatch(pattern, command)), None)


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_readme_has_blocks_and_the_parsing_finds_them():
    """The parser itself: a made-up README with a continued line, a chain and a comment."""
    text = "x\n```bash\ntinygrad-ckpt estimate --layers 2 \\\n    --seq 8   # short\npip install -e . && ls\n```\n"
    assert shell_commands(text) == [(3, "tinygrad-ckpt estimate --layers 2 --seq 8"), (5, "pip install -e ."),
                                    (5, "ls")]
    assert left_out("pip install -e .") and not left_out("ls") and not left_out("tinygrad-ckpt figures")
    assert len(shell_commands()) >= 4 and len(code_blocks("python")) >= 2
    assert all(path.is_file() for path in DOCUMENTS)
    assert sum(len(code_blocks("python", path=p)) for p in DOCUMENTS) >= 5


def _command_cases(path: Path = README):
    cases = []
    prefix = "" if path == README else f"{_name(path)}:"
    for line, command in shell_commands(path=path):
        if left_out(command):
            continue
        cases.append(pytest.param(command, id=f"{prefix}L{line}:{command[:60]}"))
    return cases


def test_the_commands_left_out_are_only_the_setup():
    """What is not run is named, with why; everything else in the ```bash blocks runs below."""
    every = [c for path in DOCUMENTS for _, c in shell_commands(path=path)]
    skipped = {c: left_out(c) for c in every if left_out(c)}
    assert all(skipped.values())
    ran = [c for c in every if not left_out(c)]
    assert any(c.startswith("tinygrad-ckpt estimate") for c in ran) and any(c.startswith("tinygrad-ckpt explore")
                                                                            for c in ran)


@pytest.mark.parametrize("command", _command_cases())
def test_every_readme_command_runs_as_printed(command, tmp_path, monkeypatch):
    words = shlex.split(command)
    monkeypatch.chdir(tmp_path)  # what a command writes (explorer.html, ...) goes here
    # processes a command starts (lesson 15's torchrun) import this checkout's package, wherever pip installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if words[0] == "tinygrad-ckpt":
        # in-process: the entry point on PATH may belong to another checkout; this imports this one's package
        args = words[1:]
        sub = _subparsers(cli._parser()).get(args[0]) if args else None
        if sub is not None and "--quick" in _flags_of(sub) and "--quick" not in args:
            args.append("--quick")  # at quick sizes, where the command has the flag
        if args == lesson_runs.figures_command().argv:  # every lesson: the session runs it once, here if first
            run = lesson_runs.figures_command()
            assert run.exit_code == 0, f"`{command}` exited {run.exit_code}:\n{run.errors}{run.printed[-2000:]}"
            assert run.printed.strip(), f"`{command}` printed nothing"
            return
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(args)
            except SystemExit as exc:
                rc = exc.code
        assert rc in (0, None), f"`{command}` exited {rc}:\n{err.getvalue()}{out.getvalue()[-2000:]}"
        assert out.getvalue().strip(), f"`{command}` printed nothing"
    elif words[0] in ("python", "python3"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        words = [sys.executable] + [str(ROOT / w) if (ROOT / w).is_file() else w for w in words[1:]]
        done = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"`{command}` exited {done.returncode}:\n{done.stderr[-3000:]}"
    else:
        pytest.fail(f"README command `{command}`: the test does not know how to run it; teach tests/test_readme.py, "
                    "or name it in LEFT_OUT with the reason")


@pytest.mark.parametrize("command", [case for path in DOCUMENTS[1:] for case in _command_cases(path)])
def test_every_docs_command_runs_as_printed(command, tmp_path, monkeypatch):
    """The docs pages' commands, run exactly as the README's are."""
    test_every_readme_command_runs_as_printed(command, tmp_path, monkeypatch)


# ---- the ```python blocks, in order, in one namespace ----------------------------------------------------------
def _needs_torch(code: str) -> bool:
    return bool(re.search(r"^\s*(import torch|from tinygrad_ckpt import .*torch_)", code, re.M))


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Per page: the namespace its blocks share and the folder they run in; results[i] is block i's error or None."""
    return {path: {"scope": {"__name__": "readme"}, "cwd": tmp_path_factory.mktemp(path.stem), "results": {}}
            for path in DOCUMENTS}


def _run_through(session, index: int, path: Path = README) -> None:
    blocks = code_blocks("python", path=path)
    for i in range(len(session["results"]), index + 1):
        line, code = blocks[i]
        if _needs_torch(code):
            try:
                import torch  # noqa: F401
            except ImportError:
                session["results"][i] = "skip"
                continue
        here = os.getcwd()
        os.chdir(session["cwd"])
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, f"{_name(path)}:{line}", "exec"), session["scope"])
            session["results"][i] = None
        except Exception as exc:  # recorded, reported by block i's test
            session["results"][i] = f"{type(exc).__name__}: {exc}"
        finally:
            os.chdir(here)


PYTHON_BLOCKS = [(path, index, line) for path in DOCUMENTS
                 for index, (line, _) in enumerate(code_blocks("python", path=path))]


@pytest.mark.parametrize("path,index", [(path, index) for path, index, _ in PYTHON_BLOCKS],
                         ids=[("" if p == README else f"{_name(p)}:") + f"L{line}" for p, _, line in PYTHON_BLOCKS])
def test_every_readme_python_block_runs_as_printed(path, index, sessions):
    line, code = code_blocks("python", path=path)[index]
    where = f"{_name(path)}:{line}"
    assert not re.search(r"(?<![\w.])tg\._|\._[a-z]\w*\(", code), f"{where} uses a private name"
    session = sessions[path]
    _run_through(session, index, path)
    if session["results"][index] == "skip":
        pytest.skip(TORCH_MISSING)
    assert session["results"][index] is None, f"the block at {where} fails: {session['results'][index]}"


def test_the_own_model_recipe_measures_a_steady_step(tmp_path, monkeypatch):
    """Its peak is not AdamW creating its states (the first step's), so checkpointing shows what it saves: the states
    are there when the ledger starts and the peak is in backward."""
    line, code = next(b for path in DOCUMENTS for b in code_blocks("python", path=path) if "my_timeline.png" in b[1])
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, f"README.md:{line}", "exec"), scope)
    led = scope["led"]
    made = [e for e in led.events if e.category == "optimizer" and e.action != "existing"]
    assert made == [], f"AdamW's states were made inside the measured step: {made[:3]}"
    t = led.timeline()
    used = t["total"] - t["untouched"]
    assert t["phase"][int(used.argmax())] == "backward" and used.max() == led.peak_bytes()


# ---- every flag named exists ----------------------------------------------------------------------------------
@functools.cache
def _script_flags(path: str) -> set[str]:
    """The flags `python path --help` lists."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / path), "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"`python {path} --help` failed: {done.stderr[-2000:]}"
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", done.stdout))


def _known_flags(command: str) -> tuple[str, set[str]]:
    """(what the command is, its flags) for 'tinygrad-ckpt SUB', 'python x.py'."""
    words = command.split()
    subs = _subparsers(cli._parser())
    if words[0] == "tinygrad-ckpt":
        if len(words) > 1 and words[1] in subs:
            return f"tinygrad-ckpt {words[1]}", _flags_of(subs[words[1]])
        return "tinygrad-ckpt", _flags_of(cli._parser())
    if words[0] in subs:  # `explore --memory-viz`: a subcommand named alone
        return f"tinygrad-ckpt {words[0]}", _flags_of(subs[words[0]])
    if words[:3] == ["python", "-m", "tinygrad_ckpt.app.figures"]:
        from tinygrad_ckpt.app import figures

        parser = argparse.ArgumentParser()
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()) as help_text:
            figures.main(["--help"])
        return "python -m tinygrad_ckpt.app.figures", set(re.findall(r"--[a-z][a-z0-9-]*", help_text.getvalue())) \
            | _flags_of(parser)
    return f"python {words[1]}", _script_flags(words[1])


COMMAND = re.compile(r"(?:\$ )?(tinygrad-ckpt(?=\s|$)[^`\n]*|python3? -m tinygrad_ckpt\.figures[^`\n]*|"
                     r"python3? (?:lessons|benchmarks)/\S+\.py[^`\n]*)")
# other programs' commands: their flags are theirs (pip's --index-url), not checked here
OTHER = re.compile(r"(?:\$ )?((?:python3? -m )?pip |apt-get |jupyter |bash |python3? -m pytest|torchrun )")


def flag_mentions(text: str) -> list[tuple[int, str, str]]:
    """(line, command, flag): each --flag in the README's code (blocks and inline spans) with the command it
    belongs to: the command written before it in the same span or line, else the last command named before it."""
    out, current = [], None
    code = [(m.start(), m.group(1)) for m in re.finditer(r"```\w*\n(.*?)```", text, re.S)]
    code += [(m.start(), m.group(1)) for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text)]
    for start, body in sorted(code):
        for offset, whole in enumerate(body.splitlines()):
            for line in re.sub(r"\s+#.*$", "", whole).split("&&"):
                found, other = COMMAND.search(line), OTHER.search(line)
                words = line.split()
                if found and not (other and other.start() < found.start()):
                    current = found.group(1)
                elif other:
                    current = None  # until the next command of ours
                elif words and words[0] in _subparsers(cli._parser()) and re.search(r"\s--", line):
                    current = line
                if current is None:
                    continue
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
                    out.append((text[:start].count("\n") + 1 + offset, current, flag))
    return out


def test_flag_mentions_are_attributed_to_their_command():
    text = ("Run `tinygrad-ckpt figures` (`--only 05`).\n```bash\ntinygrad-ckpt estimate --layers 2\n"
            "pip install --index-url x && tinygrad-ckpt figures --quick\n```\n`--out`, not pip's `--user`")
    assert [(c.split()[1], f) for _, c, f in flag_mentions(text)] == [
        ("figures", "--only"), ("estimate", "--layers"), ("figures", "--quick"), ("figures", "--out"),
        ("figures", "--user")]


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_every_flag_the_readme_names_exists_on_its_command(path):
    mentions = flag_mentions(path.read_text())
    if path == README:
        assert any(f == "--verbose" for _, _, f in mentions)  # `tinygrad-ckpt figures ... --verbose`
    if path.stem == "estimate":
        assert {"--precision", "--alloc-conf", "--tensor-parallel", "--json"} <= {f for _, _, f in mentions}
    missing = []
    for line, command, flag in mentions:
        name, flags = _known_flags(command)
        if flag not in flags:
            missing.append(f"{_name(path)}:{line}: {name} has no {flag} (it has {', '.join(sorted(flags))})")
    assert missing == [], "\n".join(missing)


def _helps():
    """(command, its --help text) for the command and each subcommand."""
    parser = cli._parser()
    yield "tinygrad-ckpt", parser.format_help(), _flags_of(parser)
    for name, sub in _subparsers(parser).items():
        yield f"tinygrad-ckpt {name}", sub.format_help(), _flags_of(sub)


def test_every_flag_a_help_names_exists_on_that_command():
    missing = []
    for name, text, flags in _helps():
        for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - flags:
            missing.append(f"`{name} --help` names {flag}, which {name} does not have")
    assert missing == [], "\n".join(missing)


def test_every_flag_the_usage_lines_name_exists():
    """The usage lines at the top of cli.py and figures.py, which `--help` of the modules and pydoc show."""
    from tinygrad_ckpt.app import figures

    missing = []
    for module in (cli, figures):
        for line in (module.__doc__ or "").splitlines():
            found = COMMAND.search(line.strip())
            if not found or not line.strip().startswith(("tinygrad-ckpt", "python")):
                continue
            name, flags = _known_flags(re.sub(r"\s+#.*$", "", found.group(1)))
            missing += [f"{module.__name__}: `{line.strip()}`: {flag}" for flag in
                        re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line) if flag not in flags]
    assert missing == [], "\n".join(missing)
