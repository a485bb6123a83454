"""docs/api.md: the public API on one page, written from the docstrings.

    tinygrad-ckpt api-docs             # rewrite docs/api.md (python -m tinygrad_ckpt.apidoc: the same)

What is public: the names `tinygrad_ckpt` exports (its `__all__`), and the functions and classes
defined in `functional`, `nn`, `optim`, `plots` and `units`, plus the user-facing calls of `debug`.
A class is listed with its constructor and the public methods and properties it defines (observer
callbacks, `on_*`, are the engine's, not the user's). A test fails when the page is stale.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from pathlib import Path

import tinygrad_ckpt as tg

from . import debug, functional, nn, optim, plots, units

HEADER = """\
# API reference

Generated from the docstrings by `tinygrad-ckpt api-docs` (`python -m tinygrad_ckpt.apidoc`); do not edit by
hand. `import tinygrad_ckpt as tg; from tinygrad_ckpt import nn, optim, functional as F`.
"""

# (module, its short name in examples, the names to list or None for every function and class defined there)
SECTIONS = [
    (tg, "tg", None),
    (functional, "F", None),
    (nn, "nn", None),
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
    return (inspect.getdoc(obj) or "").strip()


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
        lines = _block(f"### class `{prefix}.{name}{_signature(obj)}`", _doc(obj))
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
    return Path(__file__).resolve().parent.parent / "docs" / "api.md"


def main(argv=None) -> int:
    path = api_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
