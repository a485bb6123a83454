"""Issue 38, the allocator's settings and the ledger: PyTorch's semantics, no silent wrong answer, clear errors.

PYTORCH_CUDA_ALLOC_CONF read as PyTorch reads it (an unknown or malformed option is refused, naming it and the
accepted ones), capacities read one way everywhere, a bounded ledger's events not replayed as if whole, a ledger
entered with work alive holding it from its first event, and phases ended only once begun."""

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.app import cli
from tinygrad_ckpt.memory import cuda_allocator
from tinygrad_ckpt.memory.alloc_conf import MiB, Settings
from tinygrad_ckpt.memory.events import CATEGORIES

V, T = 32, 8
IDX = np.random.default_rng(0).integers(0, V, (2, T))


def gpt():
    tg.manual_seed(0)
    return nn.GPT(V, T, 1, 2, 16)


def one_line_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["estimate", "--layers", "1", "--d-model", "64", "--heads", "2", "--seq", "16", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


# ---- 1. allocator settings, as PyTorch parses them ----------------------------------------------------------
@pytest.mark.parametrize("conf, message", [
    ("expandable_segments=True", r"unknown allocator option 'expandable_segments=True'.*"
                                 r"write 'expandable_segments:True'.*Unrecognized CachingAllocator option.*"
                                 r"The options are max_split_size_mb, "),
    ("expandible_segments:True", r"unknown allocator option 'expandible_segments'.*expandable_segments"),
    ("max_split_size_mb:abc", r"max_split_size_mb:abc is refused: 'abc' is not a whole number"),
    ("max_split_size_mb:128MB", r"max_split_size_mb:128MB is refused: '128MB' is not a whole number"),
    ("expandable_segments", r"option expandable_segments needs a value after a ':'"),
    ("expandable_segments:yes", r"expandable_segments:yes is refused: it takes True or False"),
    ("expandable_segments:True max_split_size_mb:128", r"expected a ',' after 'expandable_segments:True"),
    ("roundup_power2_divisions:[256:1,512", r"cannot read the list of option roundup_power2_divisions"),
    ("roundup_power2_divisions:[3:1]", r"roundup_power2_divisions:\[3:1\] is refused: it must be a power of two"),
    ("garbage_collection_threshold:2", r"garbage_collection_threshold:2 is refused: .*between 0.0 and 1.0"),
    ("backend:cudaMallocAsync", r"backend:cudaMallocAsync is refused: the simulation is PyTorch's native"),
])
def test_an_unknown_or_malformed_option_is_refused_naming_it(conf, message):
    with pytest.raises(ValueError, match="^alloc_conf: " + message):
        Settings.parse(conf)
    with pytest.raises(ValueError, match="^Ledger: alloc_conf: " + message):
        tg.Ledger(allocator="pytorch-cuda", alloc_conf=conf)
    with pytest.raises(ValueError, match="^CachingAllocator: settings: " + message):
        cuda_allocator.CachingAllocator(conf)


def test_every_option_pytorch_accepts_is_read():
    s = Settings.parse("backend:native, expandable_segments:True,max_split_size_mb:256,max_non_split_rounding_mb:40,"
                       "roundup_power2_divisions:[256:1,>:4],garbage_collection_threshold:0.6,"
                       "release_lock_on_cudamalloc:False,pinned_use_cuda_host_register:True,"
                       "pinned_num_register_threads:8,pinned_use_background_threads:False,"
                       "pinned_reserve_segment_size_mb:64,graph_capture_record_stream_reuse:True,")
    assert s == Settings(max_split_size=256 * MiB, max_non_split_rounding=40 * MiB, expandable_segments=True,
                         roundup_power2_divisions={256: 1, ">": 4})
    with pytest.raises(TypeError, match="CachingAllocator: settings must be a Settings, a string"):
        cuda_allocator.CachingAllocator(settings=3)


def test_the_cli_refuses_a_bad_alloc_conf_in_one_line(capsys):
    err = one_line_error(capsys, "--alloc-conf", "expandable_segments=True")
    assert "argument --alloc-conf: unknown allocator option 'expandable_segments=True'" in err
    assert "write 'expandable_segments:True'" in err
    err = one_line_error(capsys, "--alloc-conf", "max_split_size_mb:abc")
    assert "argument --alloc-conf: max_split_size_mb:abc is refused: 'abc' is not a whole number" in err


# ---- 2. the allocator's capacity, read as the Ledger's -----------------------------------------------------
def test_the_allocator_takes_a_capacity_as_the_ledger_does():
    assert cuda_allocator.CachingAllocator(capacity_bytes="80GB").capacity == 80 * 10**9
    assert cuda_allocator.CachingAllocator(capacity_bytes="1 GiB").capacity == tg.Ledger(capacity_bytes="1 GiB")\
        .capacity_bytes
    for bad in ("-3GB", "lots", "1e400GB", 0):
        with pytest.raises(ValueError, match=f"^CachingAllocator: capacity_bytes must be a positive number .*{bad!r}"):
            cuda_allocator.CachingAllocator(capacity_bytes=bad)
    with pytest.raises(ValueError, match=r"^Ledger: capacity_bytes must be .*got '1e400GB'"):
        tg.Ledger(capacity_bytes="1e400GB")


# ---- 5. --capacity and end_phase ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--capacity=-5GB"], "argument --capacity: '-5GB' is negative: give a positive size"),
    (["--capacity", "-5GB"], "argument --capacity: '-5GB' is negative: give a positive size"),
    (["--capacity=1e400GB"], "argument --capacity: '1e400GB' overflows: a device's memory is less than 2^64"),
    (["--capacity=1e30GB"], "argument --capacity: '1e30GB' overflows"),
])
def test_a_negative_or_overflowing_capacity_is_one_line(capsys, argv, message):
    assert message in one_line_error(capsys, *argv)


def test_end_phase_without_begin_phase_says_so():
    led = tg.Ledger()
    with pytest.raises(RuntimeError, match=r"^Ledger.end_phase\('backward'\): no phase is open .*begin_phase"):
        led.end_phase("backward")
    with pytest.raises(RuntimeError, match=r"^Ledger.end_span\('x'\): no span is open"):
        led.end_span("x")
    led.begin_phase("optimizer")
    with pytest.raises(RuntimeError, match=r"end_phase\('backward'\): the phase begun last is 'optimizer'"):
        led.end_phase("backward")
    led.end_phase("optimizer")  # the ledger still works
    with pytest.raises(ValueError, match=r"^Ledger.begin_phase: name must be 'forward'.*got 'bw'"):
        led.begin_phase("bw")
    model = gpt()
    with led:
        model(IDX, IDX)[1].backward()
    assert led.peak_bytes() > 0 and led.backward_passes()


# ---- 3. a bounded ledger's events are not replayed as if whole -----------------------------------------------
def test_a_bounded_ledgers_events_are_not_replayed():
    def run(**ledger):
        model = gpt()
        opt = optim.SGD(model.parameters(), lr=0.1)
        with tg.Ledger(**ledger) as led:
            for _ in range(3):
                model(IDX, IDX)[1].backward()
                opt.step()
                opt.zero_grad()
        return led

    whole = cuda_allocator.trace_events(run().events)
    with pytest.raises(ValueError, match=r"^trace_events: these are a bounded ledger's events .*dropped cannot be "
                                         r"replayed.*Ledger\(allocator='pytorch-cuda', keep_iterations=\.\.\.\)"):
        cuda_allocator.trace_events(run(keep_iterations=1).events)
    placed = run(keep_iterations=1, allocator="pytorch-cuda")  # what to use instead: placed as it happens
    assert placed.placement.allocator.peak_reserved == whole.peak_reserved
    assert cuda_allocator.trace_events(run().events, capacity_bytes="1 GiB").fits


# ---- 4. a ledger entered with work alive holds it from its first event --------------------------------------
def test_a_ledger_entered_with_a_graph_alive_draws_it_held_from_the_start():
    from tinygrad_ckpt.memory import plots

    model = gpt()
    loss = model(IDX, IDX)[1]  # the graph and its saves are alive before the ledger
    with tg.Ledger() as led:
        at_entry = led.live_bytes(), led.live_bytes("activation"), led.live_bytes(untouched=True)
        loss.backward()
    saved = led.peak_bytes("activation")
    assert saved > 0 and at_entry[:2] == (0, 0)  # untouched at entry, as the docstring says
    assert at_entry[2] == sum(e.nbytes for e in led.events if e.action == "existing" and not e.from_category)
    counters = [e["args"] for e in led.to_chrome_trace()["traceEvents"] if e["ph"] == "C"]
    tl, drawn = led.timeline(), plots.timeline_data(led)
    n = sum(e.action == "existing" for e in led.events)
    for curve in (counters[0], {c: int(drawn[c][0]) for c in ("activation", "parameter")}):
        assert curve["activation"] == int(tl["activation"][n - 1]) == saved  # the saves, all there at the start
        assert curve["parameter"] == sum(p.nbytes for p in model.parameters())
    for c in (*CATEGORIES, "total"):  # the timeline itself: the scan's rows all show the state at entry (no ramp)
        assert (tl[c][:n] == tl[c][n - 1]).all(), c
    assert tl["total"][0] == at_entry[2]


def test_the_timeline_of_a_ledger_with_an_allocator_entered_with_work_alive_starts_reserved():
    tg.manual_seed(0)
    model = nn.GPT(V, T, 2, 2, 256)  # weights of 256 KiB: the scan's buffers need more than one segment
    loss = model(IDX, IDX)[1]
    with tg.Ledger(allocator="pytorch-cuda") as led:
        loss.backward()
    tl = led.timeline()
    n = sum(e.action == "existing" for e in led.events)
    assert n > 1 and (tl["reserved"][:n] == tl["reserved"][n - 1]).all() and tl["reserved"][0] >= tl["total"][0] > 0
