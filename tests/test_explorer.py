"""Ledger.to_html without a browser: one self-contained file whose inlined data is the ledger's own
(timeline, peak, lifetimes, ops), the arguments checked, and `tinygrad-ckpt explore`. The page itself is
driven in headless Chromium by test_explorer_browser.py."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.app import cli
from tinygrad_ckpt.memory import explorer
from tinygrad_ckpt.memory.ledger import CATEGORIES


def forward_backward(checkpoint=None, n_layer=2, seq=16, batch=2):
    """A ledger of one forward and backward of a small GPT (no optimizer)."""
    tg.manual_seed(0)
    model = nn.GPT(64, seq, n_layer, 2, 32, checkpoint=checkpoint)
    idx = np.random.default_rng(0).integers(0, 64, (batch, seq))
    with tg.Ledger() as led:
        _, loss = model(idx, idx)
        loss.backward()
    return led


@pytest.fixture(scope="module")
def ledgers():
    return forward_backward(), forward_backward("every_layer")


def inlined(path) -> dict:
    html = open(path, encoding="utf-8").read()
    match = re.search(r'<script type="application/json" id="explorer-data">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def test_one_file_that_fetches_nothing(ledgers, tmp_path):
    path = ledgers[0].to_html(tmp_path / "page.html", compare=ledgers[1], labels=["plain", "checkpointed"])
    html = open(path, encoding="utf-8").read()
    assert not re.search(r"https?://|<link|\bsrc\s*=|@import|fetch\(|XMLHttpRequest|import\(", html)
    assert html.count("<script") == 2  # the data and the code, both inline
    assert [r["label"] for r in inlined(path)["runs"]] == ["plain", "checkpointed"]


def test_the_data_is_the_ledgers(ledgers, tmp_path):
    plain, ckpt = ledgers
    runs = inlined(plain.to_html(tmp_path / "page.html", compare=[ckpt]))["runs"]
    for led, run in zip(ledgers, runs):
        memory = [i for i, ev in enumerate(led.events) if ev.action != "op"]
        tl = led.timeline()
        for c in CATEGORIES:
            assert np.array_equal(np.cumsum(run["live"][c]), tl[c][memory])
        assert run["peak"]["bytes"] == led.peak_bytes()
        used = tl["total"][memory] - tl["untouched"][memory]  # the peak of what the run used
        assert used[run["peak"]["event"]] == led.peak_bytes()
        assert run["end_bytes"] == led.live_bytes()
        assert run["untouched"] == led.peak_bytes("untouched") == 0  # the test's models die with their ledger
        assert run["held_peak"] == led.peak_bytes(untouched=True)
        assert [run["names"][i] for i in run["ops"]["name"]] == [op["name"] for op in led.ops]
        assert [run["names"][i] for i in run["ops"]["op"]] == [op["op"] for op in led.ops]
        lives = led.lifetimes()
        assert [run["names"][i] for i in run["lifetimes"]["name"]] == [lf.name for lf in lives]
        assert run["lifetimes"]["idle"] == [None if lf.idle_fraction is None else round(lf.idle_fraction, 4)
                                            for lf in lives]
        assert run["layers"][run["names"].index("transformer.h.1.mlp.gelu:x")] == "transformer.h.1"
    assert runs[1]["peak"]["bytes"] < runs[0]["peak"]["bytes"]  # checkpointing lowers the peak


def test_names_cannot_close_the_script(tmp_path):
    x = tg.Tensor(np.ones(4, np.float32), requires_grad=True, name="</script><b>x")
    with tg.Ledger() as led:
        y = (x * 2.0).sum()
    del y
    path = led.to_html(tmp_path / "page.html", title="a <title> & more")
    html = open(path, encoding="utf-8").read()
    assert "</script><b>" not in html and "a &lt;title&gt; &amp; more" in html
    assert "</script><b>x" in inlined(path)["runs"][0]["names"]


def test_bad_arguments_are_refused(ledgers, tmp_path):
    plain, ckpt = ledgers
    with pytest.raises(TypeError, match="compare must be a Ledger or a list of Ledgers, got str"):
        plain.to_html(tmp_path / "a.html", compare="ckpt")
    with pytest.raises(TypeError, match="got int at position 1"):
        plain.to_html(tmp_path / "a.html", compare=[ckpt, 3])
    with pytest.raises(ValueError, match=r"labels must be 2 string\(s\), one per ledger"):
        plain.to_html(tmp_path / "a.html", compare=ckpt, labels=["only one"])
    with pytest.raises(TypeError, match="to_html: path must be a file name"):
        plain.to_html(None)
    with pytest.raises(FileNotFoundError):
        plain.to_html(tmp_path / "missing" / "a.html")
    assert not list(tmp_path.iterdir())
    path = plain.to_html(tmp_path / "a.html", labels="plain")  # still works after the errors
    assert [r["label"] for r in inlined(path)["runs"]] == ["plain"]


def test_the_template_ships_with_the_package():
    html = explorer.page([], title="empty")
    assert "<title>empty</title>" in html and '"runs":[]' in html


def test_cli_explore_writes_the_page_and_snapshots(tmp_path, capsys):
    out = tmp_path / "gpt.html"
    code = cli.main(["explore", "--layers", "2", "--d-model", "64", "--heads", "2", "--seq", "32", "--batch", "2",
                     "--vocab", "128", "--checkpoint", "none", "every_layer", "--memory-viz", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert f"wrote {out}" in printed and "checkpoint every_layer: peak" in printed
    runs = inlined(out)["runs"]
    assert [r["label"] for r in runs] == ["checkpoint none", "checkpoint every_layer"]
    assert (tmp_path / "gpt_none.pickle").exists() and (tmp_path / "gpt_every_layer.pickle").exists()


def test_cli_explore_bad_arguments_exit_2(tmp_path, capsys):
    for argv in (["explore", "--checkpoint", "bogus"], ["explore", "--layers", "0"],
                 ["explore", "--layers", "1", "--d-model", "64", "--heads", "2", "--seq", "8", "--vocab", "32",
                  "--out", str(tmp_path / "no" / "such" / "dir.html")]):
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err


def test_the_page_knows_every_category_and_phase_in_the_ledgers_order():
    from tinygrad_ckpt.memory import ledger

    assert explorer.CATEGORIES == ledger.CATEGORIES and explorer.PHASES == ledger.PHASES


def test_the_page_knows_what_each_ledger_held_untouched(tmp_path):
    plain = forward_backward()
    unused = nn.Linear(100, 100)  # alive while the second ledger records, never run
    ckpt = forward_backward("every_layer")
    runs = inlined(plain.to_html(tmp_path / "page.html", compare=ckpt))["runs"]
    assert [r["untouched"] for r in runs] == [0, unused.weight.nbytes + unused.bias.nbytes]
    assert runs[1]["peak"]["bytes"] == ckpt.peak_bytes() < runs[1]["held_peak"] == ckpt.peak_bytes(untouched=True)
    assert runs[1]["held_peak"] - runs[1]["peak"]["bytes"] == 40_400  # held all along, so the peaks differ by it
