"""Ledger(allocator="pytorch-cuda"): every buffer placed, as the engine takes and frees it, by PyTorch's CUDA caching
allocator simulated (cuda_allocator.Placement). The reserved bytes join the summary, the timeline, the explorer and
the memory_viz export; a capacity is then also checked as cudaMalloc would."""

import subprocess
import sys

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.memory import cuda_allocator, explorer
from tinygrad_ckpt.memory.cuda_allocator import MiB

V, T = 64, 64
IDX = np.random.default_rng(0).integers(0, V, (16, T))  # d = 256: the MLP's [16, 64, 1024] float32 is 4 MiB, a large
# pool request (a 20 MiB segment of its own unless a cached one fits)


def warm(checkpoint=None):
    """A GPT and its AdamW after one step (the states exist), as the README's steady-state recipe."""
    tg.manual_seed(0)
    model = nn.GPT(V, T, 2, 4, 256, checkpoint=checkpoint)
    opt = optim.AdamW(model.parameters())
    step(model, opt)
    return model, opt


def step(model, opt):
    model(IDX, IDX)[1].backward()
    opt.step()
    opt.zero_grad()


def recorded(checkpoint=None, **kwargs):
    model, opt = warm(checkpoint)
    with tg.Ledger(allocator="pytorch-cuda", **kwargs) as led:
        step(model, opt)
    return led


def test_the_reserved_timeline_is_the_allocator_replayed_over_the_ledgers_buffers():
    led = recorded()
    tl = led.timeline()
    replay = cuda_allocator.trace_events(led.events)  # the same rules, run afterwards over the events
    assert len(tl["reserved"]) == len(tl["total"]) == len(led.events)
    entry = sum(e.action == "existing" for e in led.events) - 1  # the entry scan's last event: the timeline's rows
    assert (tl["reserved"][:entry] == replay.reserved[entry]).all()  # before it show the state after it
    assert np.array_equal(tl["reserved"][entry:], replay.reserved[entry:])
    assert np.array_equal(replay.requested[entry:], tl["total"][entry:])  # every byte the ledger counts is placed
    assert (tl["reserved"] >= tl["total"]).all() and (replay.reserved >= replay.allocated).all()
    assert (replay.allocated >= replay.requested).all()
    assert tl["reserved"].max() == led.placement.allocator.peak_reserved > led.peak_bytes(untouched=True)
    assert "reserved (PyTorch's CUDA caching allocator, simulated)" in led.summary()
    assert "reserved" not in tg.Ledger().timeline()  # only where asked for


def test_alloc_conf_reaches_the_allocator_and_changes_what_it_reserves():
    plain, grown = recorded(), recorded(alloc_conf="expandable_segments:True")
    assert grown.placement.allocator.settings.expandable_segments
    assert "expandable_segments:True" in grown.summary()
    # the same buffers, placed otherwise: one growing segment per pool instead of one per 2 MiB or 20 MiB
    assert plain.peak_bytes() == grown.peak_bytes()
    assert [s["segment_type"] for s in grown.placement.allocator.snapshot()] == ["small", "large"]
    assert len(plain.placement.allocator.snapshot()) > 2


def test_the_memory_viz_export_carries_the_allocators_segments_and_addresses():
    led = recorded(checkpoint="every_layer")
    snap = led.to_memory_viz()
    alloc = led.placement.allocator
    assert sum(s["total_size"] for s in snap["segments"]) == alloc.reserved
    assert [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]])
            for s in snap["segments"]] == [(s["address"], s["total_size"], [(b["address"], b["size"], b["state"])
                                                                           for b in s["blocks"]])
                                          for s in alloc.snapshot()]
    trace = snap["device_traces"][0]
    reserved, ranges = 0, []  # replaying the trace's segment events gives the reserved bytes at the end
    for e in trace:
        if e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            ranges.append((e["addr"], e["addr"] + e["size"]))
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
    assert reserved == alloc.reserved
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert allocs and all(any(a <= e["addr"] and e["addr"] + e["size"] <= b for a, b in ranges) for e in allocs)
    assert {e["addr"] for e in allocs} <= set(led.placement.addresses.values())
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sum(b["requested_size"] for b in live) == led.live_bytes(untouched=True)
    assert all(b["frames"] for b in live)  # each live block is named by its buffer's history


def test_a_capacity_is_checked_as_cudamalloc_would():
    model, opt = warm()
    with tg.Ledger(allocator="pytorch-cuda") as probe:
        step(model, opt)
    peak, reserved = probe.peak_bytes(untouched=True), probe.placement.allocator.peak_reserved
    assert reserved > peak + 2 * MiB
    capacity = peak + 1024  # the buffers fit; the segments do not
    with tg.Ledger(capacity_bytes=capacity) as fits:
        step(model, opt)
    assert fits.peak_bytes(untouched=True) <= capacity
    with pytest.raises(tg.OutOfMemoryError, match="caching allocator .simulated. could not get a segment"):
        with tg.Ledger(capacity_bytes=capacity, allocator="pytorch-cuda"):
            step(model, opt)
    opt.zero_grad()
    with tg.Ledger(allocator="pytorch-cuda") as again:  # the engine works as before
        step(model, opt)
    assert again.placement.allocator.peak_reserved == reserved


def test_a_bounded_ledger_keeps_the_reserved_bytes_of_the_events_it_keeps():
    model, opt = warm()
    with tg.Ledger(allocator="pytorch-cuda", keep_iterations=1) as bounded:
        for _ in range(3):
            step(model, opt)
    model, opt = warm()
    with tg.Ledger(allocator="pytorch-cuda") as full:
        for _ in range(3):
            step(model, opt)
    kept = bounded.timeline()["reserved"]
    assert len(kept) == len(bounded.events) < len(full.events)
    assert np.array_equal(kept, full.timeline()["reserved"][-len(kept):])
    assert bounded.placement.allocator.peak_reserved == full.placement.allocator.peak_reserved
    assert all(q >= bounded.events.first for q, _ in bounded.placement.segment_events)


def test_the_explorer_draws_the_reserved_line():
    led = recorded()
    run = explorer.run_data("a", led.events, led.ops, led.lifetimes(), led.timeline(), led.backward_passes())
    keep = np.array([ev.action != "op" for ev in led.events])
    assert np.array_equal(np.cumsum(run["reserved"]), led.timeline()["reserved"][keep])
    assert run["reserved_peak"] == led.placement.allocator.peak_reserved
    plain = tg.Ledger()
    with plain:
        tg.Tensor(np.ones(3)) * 2
    assert "reserved" not in explorer.run_data("b", plain.events, plain.ops, plain.lifetimes(), plain.timeline(),
                                               plain.backward_passes())


@pytest.mark.parametrize("kwargs, error, match", [
    ({"allocator": "cuda"}, ValueError, "allocator must be None or one of .'pytorch-cuda',."),
    ({"alloc_conf": "expandable_segments:True"}, ValueError, "pass allocator='pytorch-cuda' as well"),
    ({"allocator": "pytorch-cuda", "alloc_conf": 3}, TypeError, "alloc_conf must be a string"),
    ({"allocator": "pytorch-cuda", "alloc_conf": "expandable:yes"}, ValueError, "expandable"),
])
def test_bad_allocator_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        tg.Ledger(**kwargs)


def test_the_allocator_is_loaded_only_when_a_ledger_asks_for_it():
    """The simulation is a plugged-in collaborator: a plain Ledger never imports it; allocator= does."""
    code = ("import sys, tinygrad_ckpt; tinygrad_ckpt.Ledger(); "
            "print('tinygrad_ckpt.memory.cuda_allocator' in sys.modules); "
            "tinygrad_ckpt.Ledger(allocator='pytorch-cuda'); "
            "print('tinygrad_ckpt.memory.cuda_allocator' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]
