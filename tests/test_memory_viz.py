"""Ledger.to_memory_viz: a snapshot pickle that PyTorch's memory_viz helpers read, whose trace replays
the ledger's live bytes exactly (peak and end: of everything held, "untouched" included, as the trace has every
buffer, so the tests hold whatever earlier tests left alive), with frames naming the op and the category."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from helpers import train_step
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.memory import memory_viz

mv = pytest.importorskip("torch.cuda._memory_viz", reason=TORCH_MISSING)


def training_step(checkpoint=None, n_layer=2):
    """A ledger of one steady-state AdamW step of a small GPT (the optimizer states exist before it)."""
    tg.manual_seed(0)
    model = nn.GPT(64, 16, n_layer, 2, 32, checkpoint=checkpoint)
    opt = optim.AdamW(model.parameters())
    idx = np.random.default_rng(0).integers(0, 64, (2, 16))
    train_step(model, opt, idx)
    with tg.Ledger() as led:
        train_step(model, opt, idx)
    return led


@pytest.fixture(scope="module", params=[None, "every_layer"], ids=["plain", "checkpointed"])
def recorded(request, tmp_path_factory):
    """(ledger, the snapshot read back from its pickle)."""
    led = training_step(request.param)
    path = tmp_path_factory.mktemp("snapshots") / "step.pickle"
    assert led.to_memory_viz(path)["device_traces"]  # also returns the dict
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        snap = pickle.load(f)
    assert head == b"\x80\x04", "memory_viz's JavaScript unpickler reads protocol 4, not 5"
    return led, snap


def replay(trace):
    """Live bytes after every alloc / free_completed, as memory_viz draws its timeline."""
    live, out = 0, []
    for e in trace:
        if e["action"] == "alloc":
            live += e["size"]
        elif e["action"] == "free_completed":
            live -= e["size"]
        else:
            continue
        out.append(live)
    return out


def test_the_trace_replays_the_ledger_peak_and_end(recorded):
    led, snap = recorded
    live = replay(snap["device_traces"][0])
    assert max(live) == led.peak_bytes(untouched=True)
    assert live[-1] == led.live_bytes(untouched=True)
    entry = sum(e.action == "existing" for e in led.events)  # the timeline starts at the state after the entry scan
    total = led.timeline()["total"].tolist()
    changes = [int(t) for t, prev in zip(total, [None, *total]) if t != prev]
    steps = [v for v, prev in zip(live, [None, *live]) if v != prev]
    assert steps[-len(changes):] == changes and len(steps) - len(changes) <= max(entry - 1, 0)  # every step


def test_torch_helpers_read_it(recorded):
    led, snap = recorded
    text = mv.segsum(copy.deepcopy(snap))  # checks that blocks tile each segment exactly
    assert "segments: 1" in text
    assert sum(mv.calc_active(seg) for seg in snap["segments"]) == led.live_bytes(untouched=True)
    assert f"{len(snap['device_traces'][0])} entries" in mv.trace(copy.deepcopy(snap))
    alive = mv.filter_alloc_free_pairs(copy.deepcopy(snap))["device_traces"][0]  # allocs never freed
    assert sum(e["size"] for e in alive if e["action"] == "alloc") == led.live_bytes(untouched=True)


def test_entries_carry_what_memory_viz_needs(recorded):
    _, snap = recorded
    trace = snap["device_traces"][0]
    assert {e["action"] for e in trace} == {"alloc", "free_requested", "free_completed", "snapshot"}
    assert "unknown" in {e["category"] for e in trace}  # memory_viz throws when categories lack "unknown"
    for e in trace:
        assert {"action", "addr", "size", "stream", "frames", "category"} <= set(e)
        assert 0 <= e["addr"] < 2**53
    seg = snap["segments"][0]
    assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
    for e in trace:
        if e["action"] == "alloc":
            assert seg["address"] <= e["addr"] and e["addr"] + e["size"] <= seg["address"] + seg["total_size"]


def test_live_buffers_never_overlap(recorded):
    _, snap = recorded
    live = {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            for addr, size in live.items():
                assert e["addr"] + e["size"] <= addr or addr + size <= e["addr"], "two live buffers overlap"
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            assert live.pop(e["addr"]) == e["size"]


def test_frames_name_the_op_and_the_category(recorded):
    led, snap = recorded
    saved = next(lf for lf in led.lifetimes() if lf.name.endswith("mlp.gelu:x"))
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"
              and any(f["name"].startswith(f"{saved.name} (") for f in e["frames"])]
    assert allocs, f"no allocation's frames mention {saved.name}"
    frame = next(f for f in allocs[0]["frames"] if f["name"].startswith(saved.name))
    ev = next(e for e in led.events if e.buffer == saved.buffer and e.name == saved.name)
    assert ev.action in ("saved", "recomputed")  # saved in forward, or by a checkpoint's replay
    assert frame == {"filename": "activation", "line": ev.step, "name": f"{saved.name} ({ev.action}, {ev.phase})"}
    assert allocs[0]["category"] in ("activation", "other")  # the category it held longest
    assert allocs[0]["size"] == saved.nbytes
    categories = {e["category"] for e in snap["device_traces"][0] if e["action"] == "alloc"}
    assert {"parameter", "optimizer", "gradient", "activation", "other"} <= categories


def test_buffers_alive_at_the_start_and_freed_inside():
    tg.manual_seed(0)
    x = tg.Tensor(np.ones((8, 8), np.float32), requires_grad=True, name="x")
    h = x.exp()  # a graph that exists before the ledger: h's buffer is saved by exp
    with tg.Ledger() as led:
        y = (h * 2.0).sum()
        del h
        y.backward()
        del y
    snap = led.to_memory_viz()
    live = replay(snap["device_traces"][0])
    assert max(live) == led.peak_bytes(untouched=True) and live[-1] == led.live_bytes(untouched=True)
    assert live[-1] == int(led.timeline()["total"][-1])  # a pre-existing tape is counted once


def test_first_fit_reuses_gaps_and_merges_them():
    space = memory_viz.FirstFit()
    a, b, c = space.alloc(1000), space.alloc(100), space.alloc(5000)
    assert (a, b, c) == (0, 1024, 1536)  # 512-byte boundaries
    space.free(b, 100)
    assert space.alloc(300) == 1024  # the gap b left
    space.free(1024, 300)
    space.free(a, 1000)
    assert space.gaps == [(0, 1536)]  # merged with its neighbour
    space.free(c, 5000)
    assert space.gaps == [(0, space.top)] and space.top == 1536 + 5120
    assert space.alloc(7000) == 0  # one gap again


def test_a_bad_path_is_refused_and_the_ledger_still_works():
    led = training_step()
    with pytest.raises(TypeError, match="to_memory_viz: path must be a file name"):
        led.to_memory_viz(123)
    assert replay(led.to_memory_viz()["device_traces"][0])[-1] == led.live_bytes(untouched=True)
