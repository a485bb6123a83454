"""Every code reference a reader is sent to exists: the lessons' "Read:" lists, the README and the docs pages name
files and the names defined in them, and each resolves to a file of the repository and a definition in it (found
with ast: functions, classes, assignments at the top level, methods and class attributes as Class.method).

The forms read, with what each must resolve to:

- a path ending in .py (`tinygrad_ckpt/engine/tape.py`, `engine/tape.py`, `checkpoint.py`): a file, from the
  repository root, from the package, or (a bare file name) the one package file of that name; followed directly by
  parentheses, `tape.py (TapeEntry, backward_steps: the loop)`, each comma-separated item that is a dotted name
  (alone or before a colon) must be defined in that file; other items are prose;
- `module.Name` in backticks, where module is a package module's or folder's name (`measure.estimate_step`,
  `nn.GPT`, `tinygrad_ckpt.torch_bridge.dist`): the name defined in one of the modules of that name;
- `tg.name` in backticks: an attribute of the package (`tg.plan`, `tg.debug.break_before`).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import tinygrad_ckpt as tg

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tinygrad_ckpt"
# docs/api.md is left out: it is written from the docstrings by reading the live objects (tests/test_apidoc.py),
# so every name it shows exists by construction; docs/benchmarks.md, checkpointing.md and gpu.md are reports
PAGES = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "api.md")
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.py"))

PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[A-Za-z_]\w*\.py)\b(?:`?[ \t]*\n?[ \t]*\(([^()]*)\))?")
TICKED = re.compile(r"`([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
FILE_KINDS = {"py", "md", "png", "html", "json", "pickle", "csv", "jsonl", "toml", "ipynb", "txt", "cpp", "sh"}
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


@functools.cache
def definitions(path: Path) -> frozenset[str]:
    """What a file defines: top-level names and imports, Class.member for methods, class attributes and the
    attributes methods set on self, and each member's bare name too."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()

    def targets(node) -> list[str]:
        found = []
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                found += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
        return found

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        names.update(targets(node))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        if isinstance(node, ast.ClassDef):
            for member in ast.walk(node):
                found = []
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and member is not node:
                    found.append(member.name)
                found += targets(member) if member in node.body else []
                if isinstance(member, ast.Attribute) and isinstance(member.value, ast.Name) and \
                        member.value.id == "self" and isinstance(member.ctx, ast.Store):
                    found.append(member.attr)
                names.update(f"{node.name}.{n}" for n in found)
                names.update(found)
    return frozenset(names)


def modules_named(name: str) -> list[Path]:
    """The package files a module name can mean: `tape` -> engine/tape.py; a folder's name, every file in it
    (`backend.buffer`: each backend's method); `nn` -> the files of nn/ and ops/nn.py."""
    files = list(PACKAGE.rglob(f"{name}.py")) + [f for p in PACKAGE.rglob(name) if p.is_dir() for f in p.rglob("*.py")]
    return sorted(f for f in files if f.is_file() and "__pycache__" not in f.parts)


def resolve_path(text: str) -> list[Path]:
    """The files a written path can mean."""
    for base in (ROOT, PACKAGE):
        if (base / text).is_file():
            return [base / text]
    if "/" not in text:
        return sorted(p for p in PACKAGE.rglob(text) if "__pycache__" not in p.parts)
    return []


def defined_in(files: list[Path], name: str) -> bool:
    return any(name in definitions(f) for f in files)


def problems(text: str, where: str) -> list[str]:
    """Every reference of the forms above in text that does not resolve, as 'where:line: what'."""
    out = []

    def line_of(match) -> int:
        return text[:match.start()].count("\n") + 1

    for m in PATH.finditer(text):
        written = m.group(1)
        if written.startswith(("http", "www.")):
            continue
        files = resolve_path(written)
        if not files:
            out.append(f"{where}:{line_of(m)}: no file {written}")
            continue
        for item in (m.group(2) or "").replace("`", "").split(","):
            item = item.strip()
            head = NAME.match(item)
            if not head or not re.fullmatch(r"(\(\))?(:.*)?", item[head.end():], re.S) or item.startswith("tg."):
                continue  # prose, not a name (a `tg.name` is checked as the package's, below)
            if not defined_in(files, head.group(0)):
                out.append(f"{where}:{line_of(m)}: {written} defines no {head.group(0)}")
    for m in TICKED.finditer(text):
        parts = m.group(1).split(".")
        if parts[-1] in FILE_KINDS:
            continue  # a file name (`ledger.py`: the path form above)
        if parts[0] == "tg":
            obj, ok = tg, True
            for part in parts[1:]:
                if part.startswith("_") or not hasattr(obj, part):
                    ok = False
                    break
                obj = getattr(obj, part)
            if not ok:
                out.append(f"{where}:{line_of(m)}: tinygrad_ckpt has no {'.'.join(parts[1:])}")
            continue
        if parts[0] == "tinygrad_ckpt":
            parts = parts[1:]
            if all((PACKAGE.joinpath(*parts[:k]).with_suffix(".py").is_file() or PACKAGE.joinpath(*parts[:k]).is_dir())
                   for k in range(1, len(parts) + 1)):
                continue  # a module path: tinygrad_ckpt.torch_bridge.dist
        files = modules_named(parts[0]) if parts and not parts[0][0].isupper() else []
        # the name after the module, or a submodule of a folder (`torch_bridge.plans`)
        if files and not defined_in(files, parts[1]) and not modules_named(parts[1]):
            out.append(f"{where}:{line_of(m)}: no module {parts[0]} defines {parts[1]}")
        elif files and len(parts) > 2 and parts[1][0].isupper() and not defined_in(files, ".".join(parts[1:3])):
            out.append(f"{where}:{line_of(m)}: {parts[0]}.{parts[1]} has no {parts[2]}")
    return out


def read_list(path: Path) -> str:
    """The "Read:" paragraph of a lesson's docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = [p for p in doc.split("\n\n") if p.startswith("Read:")]
    assert len(found) == 1, f"{path.name}: one paragraph starting 'Read:'"
    return found[0]


def test_a_made_up_reference_is_reported():
    """The test can fail: each form, broken on purpose, is reported; the same forms, right, are not."""
    text = ("Read: tinygrad_ckpt/engine/tape.py (TapeEntry, backward_steps: the loop, Tape.nothing_here),\n"
            "recompute/checkpoint.py (Checkpoint.call_backward), tinygrad_ckpt/ledger.py (Ledger),\n"
            "checkpoint.py (KorthikantiSelective), `measure.no_such_step`, `tg.no_such_name`, `nn.GPT.no_method`\n"
            "and, right: engine/tape.py (TapeEntry.release, how it works), `measure.estimate_step`, `tg.plan`,\n"
            "`nn.GPT`, `tinygrad_ckpt.torch_bridge.dist`, policies.py (KorthikantiSelective), `torch_bridge.plans`")
    found = problems(text, "made-up")
    assert found == [
        "made-up:1: tinygrad_ckpt/engine/tape.py defines no Tape.nothing_here",
        "made-up:2: recompute/checkpoint.py defines no Checkpoint.call_backward",
        "made-up:2: no file tinygrad_ckpt/ledger.py",
        "made-up:3: checkpoint.py defines no KorthikantiSelective",
        "made-up:3: no module measure defines no_such_step",
        "made-up:3: tinygrad_ckpt has no no_such_name",
        "made-up:3: nn.GPT has no no_method",
    ], found


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_lessons_read_list_resolves(path):
    assert problems(read_list(path), path.name) == []


@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_every_reference_on_a_page_resolves(path):
    assert problems(path.read_text(), str(path.relative_to(ROOT))) == []
