"""The Chrome trace: slices nest as they ran, on every track (Perfetto draws overlapping slices that
do not nest as slivers)."""

import json
from collections import defaultdict

import numpy as np
import pytest
from helpers import train_step

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim

EPS = 1e-6  # µs: float rounding of ts + dur


def _trace(checkpoint, tmp_path):
    tg.manual_seed(0)
    model = nn.GPT(32, 16, 4, 2, 16, dropout=0.1, checkpoint=checkpoint)
    opt = optim.AdamW(model.parameters())
    idx = np.random.default_rng(0).integers(0, 32, (2, 16))
    with tg.Ledger() as led:
        train_step(model, opt, idx)
    led.to_chrome_trace(tmp_path / "trace.json")
    return json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def _check_nesting(slices):
    """Every two slices on a track are disjoint or one contains the other; returns child -> parent."""
    parent = {}
    stack = []
    for s in sorted(slices, key=lambda s: (s["ts"], -s["dur"])):
        while stack and s["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
            stack.pop()
        if stack:
            top = stack[-1]
            assert s["ts"] + s["dur"] <= top["ts"] + top["dur"] + EPS, (
                f"{s['name']} ({s['cat']}) overlaps {top['name']} ({top['cat']}) without nesting")
            parent[id(s)] = top
        stack.append(s)
    return parent


@pytest.mark.parametrize("checkpoint", [None, "every_layer", "sqrt", 2])
def test_slices_nest_on_every_track(checkpoint, tmp_path):
    events = _trace(checkpoint, tmp_path)
    tracks = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0
            tracks[(e["pid"], e["tid"])].append(e)
    assert tracks
    for slices in tracks.values():
        _check_nesting(slices)


def _ancestors(s, parent):
    while id(s) in parent:
        s = parent[id(s)]
        yield s


def test_checkpoint_slice_wraps_its_forward_ops_and_the_replay_wraps_the_recomputed_ops(tmp_path):
    slices = [e for e in _trace("every_layer", tmp_path) if e["ph"] == "X"]
    parent = _check_nesting(slices)
    by_name = lambda s: [a["name"] for a in _ancestors(s, parent)]  # noqa: E731
    forward = [s for s in slices if s["cat"] == "forward" and s["name"].startswith("transformer.h.1.")
               and not s["name"].endswith("checkpoint")]
    assert forward and all("transformer.h.1.checkpoint" in by_name(s) for s in forward)
    recomputed = [s for s in slices if s["cat"] == "recompute" and s["name"].startswith("transformer.h.1.")]
    assert len(recomputed) == len(forward)
    for s in recomputed:
        chain = by_name(s)
        assert chain[0] == "recompute"  # the replay's span
        assert "transformer.h.1.checkpoint" in chain and "backward" in chain  # inside the checkpoint's backward
    updates = [s for s in slices if s["cat"] == "optimizer" and s["args"].get("op") == "adamw"]
    assert updates and all(by_name(s)[0] == "optimizer" for s in updates)


def test_optimizer_is_its_own_phase_with_flops_without_a_wrapper():
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16)
    for opt, per_element in [(optim.AdamW(model.parameters()), 14),
                             (optim.SGD(model.parameters(), lr=0.1, momentum=0.9), 4)]:
        idx = np.random.default_rng(0).integers(0, 32, (2, 8))
        with tg.Ledger() as led:
            train_step(model, opt, idx)
        assert led.flops("optimizer") == per_element * model.num_parameters()
        ops = [op for op in led.ops if op["phase"] == "optimizer"]
        assert sorted(op["name"] for op in ops) == sorted(n for n, _ in model.named_parameters())
        freed = {e.name for e in led.events if e.action == "released" and e.phase == "optimizer"}
        assert freed == {f"{n}.grad" for n, _ in model.named_parameters()}  # zero_grad's frees
        timeline = led.timeline()
        assert "optimizer" in set(timeline["phase"])
