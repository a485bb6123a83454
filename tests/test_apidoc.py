"""docs/api.md is what `tinygrad-ckpt api-docs` writes from the docstrings now (the CI check for a stale
page), it covers every export, and the README's "Your own model's memory timeline" snippet runs."""

import gc
import json
import pathlib
import re
import types

import tinygrad_ckpt as tg
from tinygrad_ckpt.app import apidoc

README = pathlib.Path(apidoc.api_path()).parent.parent / "README.md"


def test_api_md_is_up_to_date():
    path = apidoc.api_path()
    assert path.is_file() and path.read_text() == apidoc.render(), (
        "docs/api.md is not what the docstrings say now: run `tinygrad-ckpt api-docs` (or "
        "`python -m tinygrad_ckpt.app.apidoc`) and commit docs/api.md")


def test_every_export_and_the_ledger_methods_are_documented():
    text = apidoc.render()
    for name in tg.__all__:
        module = isinstance(getattr(tg, name), types.ModuleType)
        assert (f"## tinygrad_ckpt.{name}\n" if module else f"`tg.{name}") in text, name
    for method in ("peak_bytes", "timeline", "lifetimes", "summary", "to_chrome_trace", "saved_breakdown"):
        assert f"**`Ledger.{method}(" in text, method
    assert "### `F.scaled_dot_product_attention(" in text and "### class `nn.GPT(" in text
    assert "### `tg.debug.break_before(" in text and "### class `optim.AdamW(" in text
    assert "Ledger.on_save" not in text  # the engine's observer callbacks are not the user's API
    assert " at 0x" not in text  # nothing that changes from run to run


def _readme_snippet(heading: str) -> str:
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_timeline_snippet_runs(tmp_path, monkeypatch):
    code = _readme_snippet("Your own model's memory timeline")
    assert not re.search(r"\._\w", code) and "import tinygrad_ckpt as tg" in code  # public names only
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # the README's own example
    assert (tmp_path / "my_timeline.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "my_trace.json").read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("ph") == "X" for e in events)  # op slices
    led = scope["led"]
    assert led.peak_bytes("activation") > 0 and led.peak_bytes("optimizer") > 0 and led.flops("backward") > 0
    scope.clear()
    gc.collect()  # the example's model and optimizer go now, not under a later test's ledger (as untouched bytes)


def test_the_command_writes_the_page(tmp_path, monkeypatch, capsys):
    from tinygrad_ckpt.app import cli

    monkeypatch.setattr(apidoc, "api_path", lambda: tmp_path / "docs" / "api.md")
    assert cli.main(["api-docs"]) == 0
    assert (tmp_path / "docs" / "api.md").read_text() == apidoc.render()
    assert "wrote" in capsys.readouterr().out
