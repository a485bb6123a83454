"""break_before: whole dotted parts, a warning for a pattern that never fired."""

import warnings

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import debug, nn


@pytest.mark.parametrize("pattern, hit", [
    ("softmax", True), ("attn", True), ("h.1", True), ("transformer.h.1.attn.softmax", True),
    ("h.1.attn", True), ("h.10", False), ("h", True), ("soft", False), ("1.attn", True), ("h.1.at", False),
])
def test_patterns_match_an_op_kind_or_whole_dotted_parts(pattern, hit):
    assert debug.matches("softmax", "transformer.h.1.attn.softmax", pattern) is hit


def test_h1_does_not_stop_in_h10():
    assert not debug.matches("gelu", "transformer.h.10.mlp.gelu", "h.1")
    assert debug.matches("gelu", "transformer.h.10.mlp.gelu", "h.10")


def _backward(model):
    idx = np.zeros((1, 8), dtype=np.int64)
    _, loss = model(idx, idx)
    loss.backward()


def test_a_pattern_that_never_fired_warns_once_with_the_closest_names():
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16)
    debug.break_before("softmx")
    try:
        with pytest.warns(UserWarning, match=r"break_before\('softmx'\) matched no tape entry.*closest.*softmax"):
            _backward(model)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            _backward(model)  # reported once
    finally:
        debug.clear_breakpoints()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _backward(model)  # no patterns, no warning


def test_break_before_takes_lists_and_tuples_of_patterns(monkeypatch):
    """A list (or tuple) counts as its strings: break_before(["softmax", "gelu"]) stops at both, and later
    backward passes keep working (a list used to be kept whole, and every backward then raised AttributeError)."""
    stops = []
    monkeypatch.setattr(debug, "enter_debugger", lambda entry: stops.append(entry.op))
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16)
    debug.break_before(["softmax", "gelu"])
    debug.break_before(("softmax",), "softmax")  # a pattern set twice stops once
    assert debug.breakpoints() == ["softmax", "gelu"]
    _backward(model)
    assert sorted(set(stops)) == ["gelu", "softmax"] and stops.count("softmax") == 2  # one per block
    stops.clear()
    _backward(model)
    assert len(stops) == 4


@pytest.mark.parametrize("patterns", [(3,), ("gelu", 3), (["softmax", b"gelu"],), ("softmax", [["gelu"]]), ("",),
                                      (" softmax",)])
def test_a_bad_pattern_adds_none_of_them(patterns):
    debug.break_before("gelu")
    with pytest.raises((TypeError, ValueError), match=r"break_before: .*pattern"):
        debug.break_before(*patterns)
    assert debug.breakpoints() == ["gelu"]
