"""docs/api.md: the public API on one page, written from the docstrings.

    tinygrad-ckpt api-docs             # rewrite docs/api.md (python -m tinygrad_ckpt.app.apidoc: the same)

What is public: the names `tinygrad_ckpt` exports (its `__all__`), and the functions and classes
defined in `functional`, `nn`, `optim`, `plots` and `units`, plus the user-facing calls of `debug`.
A class is listed with its constructor, its own docstring (not one inherited from its base class), the Python
operators it defines (`a + b`, `a @ b`, `a[i]`, ..., with the op each records) and the public methods and properties
it defines (observer callbacks, `on_*`, are the engine's, not the user's). A test fails when the page is stale.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import tinygrad_ckpt as tg

from .. import debug, functional, nn, optim, units
from ..memory import plots

HEADER = """\
# API reference

Generated from the docstrings by `tinygrad-ckpt api-docs` (`python -m tinygrad_ckpt.app.apidoc`); do not edit by
hand. `import tinygrad_ckpt as tg; from tinygrad_ckpt import nn, optim, functional as F`.
"""

# (module, its short name in examples, the names to list or None for every function and class defined there)
SECTIONS = [
    (tg, "tg", None),
    (functional, "F", None),
    (nn, "nn", nn.__all__),
    (optim, "optim", None),
    (debug, "tg.debug", ["break_before", "clear_breakpoints", "detect_anomaly"]),
    (plots, "plots", None),
    (units, "units", None),
]


def _public(module, names):
    if names is None and module is tg:
        names = [n for n in tg.__all__ if not isinstance(getattr(tg, n), types.ModuleType)]
    if names is None:
        names = [n for n, obj in vars(module).items() if not n.startswith("_")
                 and (inspect.isfunction(obj) or inspect.isclass(obj)) and obj.__module__ == module.__name__]
    return [(n, getattr(module, n)) for n in names]


def _signature(obj) -> str:
    """The call signature, annotations unquoted (the modules use `from __future__ import annotations`)."""
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(...)"
    sig = re.sub(r"<class '([\w.]+)'>", r"\1", sig)  # dtype=<class 'numpy.float32'> -> dtype=numpy.float32
    return re.sub(r"(: |-> )'([^']*)'", r"\1\2", sig)


def _doc(obj) -> str:
    """The object's own docstring: for a class, the one it defines (inspect.getdoc would fall back to its base's)."""
    if inspect.isclass(obj):
        return inspect.cleandoc(vars(obj).get("__doc__") or "")
    return (inspect.getdoc(obj) or "").strip()


# Python's operators as a reader writes them, for the special methods a class defines
OPERATORS = {
    "__add__": "a + b", "__radd__": "2 + a", "__sub__": "a - b", "__rsub__": "2 - a", "__mul__": "a * b",
    "__rmul__": "2 * a", "__truediv__": "a / b", "__rtruediv__": "2 / a", "__neg__": "-a", "__pow__": "a ** 2",
    "__matmul__": "a @ b", "__rmatmul__": "array @ a", "__getitem__": "a[i]", "__eq__": "a == b", "__ne__": "a != b",
    "__lt__": "a < b", "__le__": "a <= b", "__gt__": "a > b", "__ge__": "a >= b", "__len__": "len(a)",
    "__iter__": "iter(a), for x in a", "__bool__": "bool(a), if a:", "__array__": "np.asarray(a)",
}


def _operators(cls) -> list[str]:
    """A table of the operators `cls` defines, each with the op it records (read from its source) or its doc."""
    rows = []
    for name, expression in OPERATORS.items():
        fn = vars(cls).get(name)
        if not inspect.isfunction(fn):
            continue
        try:
            source = inspect.getsource(fn)
        except OSError:  # written by @dataclass (its __eq__): not an operator of the class's own
            continue
        called = re.search(r"ops\.(\w+)\((\"\w+\")?", source)
        if called:
            what = f"the op `{called.group(1)}`" + (f" ({called.group(2)})" if called.group(2) else "")
        else:
            what = _doc(fn).split("\n")[0] or {"__len__": "the first dimension's size", "__iter__": "the rows a[0], "
                                               "a[1], ... (each an indexing op)", "__bool__": "the value of a "
                                               "one-element tensor"}.get(name, "")
        rows.append(f"| `{expression}` | {what} |")
    if not rows:
        return []
    return ["**Operators** (each one an op on the tape when it records one):", "", "| expression | what it runs |",
            "|---|---|", *rows, ""]


def _members(cls):
    """(name, kind, object) for the public methods and properties a class defines itself."""
    for name, raw in vars(cls).items():
        if name.startswith("_") or name.startswith("on_"):
            continue
        if isinstance(raw, property):
            yield name, "property", raw
        elif isinstance(raw, (staticmethod, classmethod)):
            yield name, "method", raw.__func__
        elif inspect.isfunction(raw):
            yield name, "method", raw


def _block(title: str, doc: str) -> list[str]:
    return [title, "", doc, ""] if doc else [title, ""]


def _entry(prefix: str, name: str, obj) -> list[str]:
    if inspect.isclass(obj):
        lines = _block(f"### class `{prefix}.{name}{_signature(obj)}`", _doc(obj)) + _operators(obj)
        for member, kind, fn in _members(obj):
            sig = "" if kind == "property" else _signature(fn).replace("(self, ", "(").replace("(self)", "()")
            sig = sig.replace("(cls, ", "(").replace("(cls)", "()")
            label = f"**`{name}.{member}{sig}`**" + (" (property)" if kind == "property" else "")
            lines += _block(label, _doc(fn))
        return lines
    return _block(f"### `{prefix}.{name}{_signature(obj)}`", _doc(obj))


def render() -> str:
    """The text of docs/api.md."""
    lines = [HEADER, "## Contents", ""]
    for module, prefix, names in SECTIONS:
        anchor = module.__name__.replace(".", "")
        lines.append(f"- [`{module.__name__}`](#{anchor}) as `{prefix}`: "
                     + ", ".join(f"`{n}`" for n, _ in _public(module, names)))
    lines.append("")
    for module, prefix, names in SECTIONS:
        lines += [f"## {module.__name__}", ""]
        if module is not tg:
            lines += [_doc(module).split("\n\n")[0], ""]
        for name, obj in _public(module, names):
            lines += _entry(prefix, name, obj)
    return "\n".join(lines).rstrip() + "\n"


def api_path() -> Path:
    """docs/api.md in the repository (beside the package folder)."""
    return Path(__file__).resolve().parents[2] / "docs" / "api.md"


def main(argv=None) -> int:
    path = api_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
