"""The ledger's "untouched" category: what the engine held before a ledger started and the recorded code never read,
wrote, saved or took the gradient of. It is left out of the other categories and of `peak_bytes()` (another model
still referenced must not make a run look worse), a buffer the code does use counts in its real category from the
start (a plain step's numbers do not move), and the whole still equals tracemalloc (`untouched=True`)."""

import gc
import tracemalloc

import numpy as np

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.memory import plots
from tinygrad_ckpt.memory.ledger import CATEGORIES, numpy_traced_bytes
from tinygrad_ckpt.units import format_bytes

V, T = 64, 16
IDX = np.random.default_rng(0).integers(0, V, (4, T))
USED = [c for c in CATEGORIES if c != "untouched"]


def gpt(checkpoint=None):
    tg.manual_seed(0)
    return nn.GPT(V, T, 2, 2, 32, checkpoint=checkpoint)


def train_step(model, opt):
    _, loss = model(IDX, IDX)
    loss.backward()
    opt.step()
    opt.zero_grad()


def steady(model, opt=None):
    """A warm-up AdamW step (its states exist), then one step under a fresh Ledger, as the README's recipe."""
    opt = opt or optim.AdamW(model.parameters())
    train_step(model, opt)
    with tg.Ledger() as led:
        train_step(model, opt)
    return led


def nbytes(module) -> int:
    return sum(p.nbytes for p in module.parameters())


def peaks(led) -> dict:
    return {c: led.peak_bytes(c) for c in USED}


def test_a_plain_step_uses_all_it_held_and_its_numbers_are_those_of_a_ledger_kept_open():
    model = gpt()
    fresh = steady(model)
    assert fresh.peak_bytes("untouched") == 0 and "untouched: none" in fresh.summary()
    assert fresh.peak_bytes() == fresh.peak_bytes(untouched=True)
    existing = [e for e in fresh.events if e.action == "existing"]
    assert {e.category for e in existing} == {"parameter", "optimizer"}  # counted as such from the start, though
    tl = fresh.timeline()  # the forward reads the parameters op by op and the step writes the states last
    assert tl["parameter"][len(existing) - 1] == nbytes(model)
    assert tl["optimizer"][len(existing) - 1] == 2 * nbytes(model)
    # a ledger open across the warm-up and the step sees the same step as its second iteration
    model = gpt()
    opt = optim.AdamW(model.parameters())
    with tg.Ledger() as kept_open:
        train_step(model, opt)
        train_step(model, opt)
    second = kept_open.iterations()[1]
    assert {c: second.peak[c] for c in USED} == peaks(fresh)
    assert second.peak["total"] == second.peak["held"] == fresh.peak_bytes()


def test_another_model_still_referenced_is_untouched_and_out_of_the_peak():
    """The issue's first case: with the plain model still referenced, the checkpointed run's "parameter" row doubled
    and its peak looked worse. Now it shows its own model's parameters only, and the same peaks as when alone."""
    alone = steady(gpt("every_layer"))
    gc.collect()
    plain_model = gpt()
    plain_opt = optim.AdamW(plain_model.parameters())
    steady(plain_model, plain_opt)  # the plain model and its AdamW states stay alive
    model = gpt("every_layer")
    led = steady(model)
    other = 3 * nbytes(plain_model)  # its parameters, m and v
    assert led.peak_bytes("parameter") == nbytes(model)
    assert led.peak_bytes("untouched") == led.live_bytes("untouched") == other
    assert peaks(led) == peaks(alone) and led.peak_bytes() == alone.peak_bytes()
    assert led.peak_bytes(untouched=True) == alone.peak_bytes() + other
    assert led.live_bytes(untouched=True) == led.live_bytes() + other
    text = led.summary()
    assert f"untouched: {format_bytes(other, digits=2)} held before the ledger started was never read" in text
    names = {e.tensor for e in led.events if e.category == "untouched"}
    assert names == {p.name for p in plain_model.parameters()}  # its parameters and their states, by parameter
    del plain_opt


def test_an_unused_layer_is_untouched():
    """The issue's second case: an nn.Linear(1000, 1000) that never ran added 4 MB to the run."""
    model = gpt()
    opt = optim.AdamW(model.parameters())
    before = steady(model, opt)
    unused = nn.Linear(1000, 1000)
    led = steady(model, opt)
    assert led.peak_bytes("untouched") == unused.weight.nbytes + unused.bias.nbytes == 4_004_000
    assert peaks(led) == peaks(before) and led.peak_bytes() == before.peak_bytes()
    assert led.peak_bytes(untouched=True) == before.peak_bytes() + 4_004_000
    assert [e.action for e in led.events if e.category == "untouched"] == ["existing", "existing"]


def test_the_part_of_a_model_its_forward_skips_is_untouched():
    """The issue's third case: a model whose forward runs only some of its blocks."""
    tg.manual_seed(0)
    blocks = nn.ModuleList([nn.Block(16, 2) for _ in range(4)])
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as led:
        h = x
        for block in list(blocks)[:2]:
            h = block(h)
        h.sum().backward()
    ran, skipped = list(blocks)[:2], list(blocks)[2:]
    assert led.live_bytes("parameter") == sum(nbytes(b) for b in ran)
    assert led.live_bytes("untouched") == sum(nbytes(b) for b in skipped)
    assert {e.tensor.split(".")[0] for e in led.events if e.category == "untouched"} == {"2", "3"}
    assert led.live_bytes("gradient") == sum(nbytes(b) for b in ran) + x.nbytes


def test_each_way_of_using_a_buffer_ends_untouched():
    tg.manual_seed(0)
    counter = tg.Tensor(np.zeros(16, np.float32), name="counter")  # changed in place
    w = tg.Parameter(np.ones(16, np.float32), name="w")
    w.grad = np.ones(16, np.float32)  # a gradient accumulated into
    d = tg.Parameter(np.ones(16, np.float32), name="d")
    d.grad = np.ones(16, np.float32)  # a gradient dropped (zero_grad)
    x = tg.Tensor(np.ones(16, np.float32), requires_grad=True, name="x")
    h = x.exp()  # a graph that exists: its backward reads exp's output
    g = x.exp()  # one that is dropped unused
    with tg.Ledger() as led:
        with tg.no_grad():
            counter.add_(1.0)
        (h * w).sum().backward()
        d.grad = None
        del g
    by_name = {e.name: e.category for e in led.events if e.action == "existing" and not e.from_category}
    assert by_name["counter"] == "other" and by_name["w"] == "parameter" and by_name["w.grad"] == "gradient"
    assert by_name["d.grad"] == "gradient" and by_name["x"] == "other"
    assert by_name["d"] == "untouched"  # never read: only its gradient was dropped
    assert [e.category for e in led.events if e.action == "released" and e.name == "d.grad"] == ["gradient"]
    untouched = [e for e in led.events if e.category == "untouched"]  # d, and g's graph dropped unused
    assert [(e.action, e.nbytes) for e in untouched if e.name != "d"] == [("existing", 64), ("existing", 64),
                                                                         ("unsaved", 64), ("released", 64)]
    exp_saves = [life for life in led.lifetimes() if life.op == "exp"]
    assert len(exp_saves) == 1 and exp_saves[0].created == 0 and exp_saves[0].first_used is not None
    assert led.live_bytes("untouched") == d.nbytes and led.peak_bytes("untouched") == d.nbytes + 64  # and g's
    assert led.live_bytes(untouched=True) == led.live_bytes() + d.nbytes


def test_the_whole_still_equals_tracemalloc_with_another_model_alive():
    import scipy.special  # noqa: F401  (imported before tracing: its module-level arrays are not the engine's)

    tracemalloc.start()
    try:
        model = gpt()
        opt = optim.AdamW(model.parameters())
        train_step(model, opt)
        unused = gpt("every_layer")
        traced_before = numpy_traced_bytes()
        with tg.Ledger(trace_numpy=True) as led:
            train_step(model, opt)
    finally:
        tracemalloc.stop()
    held = sum(e.nbytes for e in led.events if e.action == "existing" and not e.from_category)
    offset = traced_before - held  # NumPy arrays alive that are not the engine's (the test's own)
    assert 0 <= offset < 0.01 * held
    assert led.peak_bytes("untouched") == nbytes(unused)
    worst = max(abs((traced - offset) - live) / live for _, traced, live, _ in led.traced)
    assert worst <= 0.01, f"ledger vs tracemalloc at op boundaries: worst relative gap {worst:.4f}"
    traced_peak = max(traced for _, traced, _, _ in led.traced) - offset
    assert abs(traced_peak - led.peak_bytes(untouched=True)) <= 0.05 * led.peak_bytes(untouched=True)


def test_a_bounded_ledger_moves_what_is_touched_late_from_the_start():
    """An existing tensor first read in the sixth iteration counts as "other" from the start, in the iterations
    whose events were dropped too: a bounded ledger reports what an unbounded one does."""

    def run(**ledger):
        tg.manual_seed(0)
        model = nn.GPT(32, 8, 1, 2, 16)
        late = tg.Tensor(np.ones(64, np.float32), name="late")
        opt = optim.SGD(model.parameters(), lr=0.1)
        idx = np.random.default_rng(0).integers(0, 32, (2, 8))
        with tg.Ledger(**ledger) as led:
            for i in range(8):
                loss = model(idx, idx)[1]
                if i == 5:
                    loss = loss + (late * 0.0).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
            del loss
        return led

    full, kept = run(), run(keep_iterations=2)
    assert full.peak_bytes("untouched") == 0 and full.peak_bytes("other") >= 64 * 4
    for c in (None, *CATEGORIES):
        assert kept.peak_bytes(c) == full.peak_bytes(c) and kept.live_bytes(c) == full.live_bytes(c)
    assert [(i.live, i.peak) for i in kept.iterations()] == [(i.live, i.peak) for i in full.iterations()]
    assert all(i.live["untouched"] == 0 for i in full.iterations())
    tl_full, tl_kept = full.timeline(), kept.timeline()
    last = len(kept.events)
    for key in ("total", *CATEGORIES):
        assert np.array_equal(tl_kept[key], tl_full[key][-last:]), key


def test_the_plots_draw_it_apart_and_a_side_by_side_figure_says_when_the_ledgers_differ():
    plain_model = gpt()
    plain = steady(plain_model)
    again = steady(plain_model)
    ckpt = steady(gpt("every_layer"))  # the plain model is alive and unused meanwhile (its optimizer died)
    fig, ax = plots.new_figure()
    info = plots.plot_memory_timeline(ax, ckpt, x="step")
    assert info["peak_bytes"] == ckpt.peak_bytes() < ckpt.peak_bytes(untouched=True)
    labels = [h.get_label() for h in info["handles"]]
    assert labels[0].startswith("untouched (held before the ledger") and len(labels) == len(set(labels))
    assert ax.get_ylim()[1] >= ckpt.peak_bytes(untouched=True) / 2**20  # the band on top is inside the axes
    fig = plots.plot_timelines_side_by_side([plain, ckpt], ["plain", "checkpointed"], x="step")
    other = format_bytes(nbytes(plain_model))
    assert fig._suptitle.get_text().startswith(
        f"Not the same untouched memory (plain: 0 B; checkpointed: {other}): held before the ledger started")
    fig = plots.plot_timelines_side_by_side([plain, again], ["plain", "again"], x="step", suptitle="two steps")
    assert fig._suptitle.get_text() == "two steps"  # the same untouched bytes (none): nothing to say


def test_garbage_not_yet_collected_is_held_untouched_and_its_collection_is_a_real_release():
    """Entering collects nothing: a tensor in a reference cycle is memory really held until the collector runs."""
    import tinygrad_ckpt.memory.ledger as ledger_module

    assert "gc" not in vars(ledger_module)  # entering costs a walk over the weak registries, no collection
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    tracemalloc.start()
    try:
        cycle = [tg.Tensor(np.ones(1000, np.float32), name="garbage")]
        cycle.append(cycle)
        del cycle
        before = numpy_traced_bytes()
        with tg.Ledger() as led:
            held = led.live_bytes(untouched=True)  # the garbage, and whatever else earlier tests left alive
            assert led.live_bytes("untouched") == held >= 4000 and led.live_bytes() == 0
            gc.collect()
            assert held - led.live_bytes(untouched=True) == 4000
        after = numpy_traced_bytes()
    finally:
        tracemalloc.stop()
        if was_enabled:
            gc.enable()
    assert before - after == 4000  # what tracemalloc saw go is what the ledger released
    assert [(e.action, e.category) for e in led.events if e.name == "garbage"] == [("existing", "untouched"),
                                                                                    ("released", "untouched")]
    assert led.peak_bytes() == 0 and led.peak_bytes(untouched=True) == held


def test_the_exports_carry_the_category(tmp_path):
    import csv
    import json

    model = gpt()
    unused = nn.Linear(10, 10)
    with tg.Ledger() as led:
        model(IDX, IDX)[1].backward()
    led.to_csv(tmp_path / "e.csv")
    rows = list(csv.DictReader(open(tmp_path / "e.csv")))
    assert {(r["name"], r["category"]) for r in rows if r["category"] == "untouched"} == {("weight", "untouched"),
                                                                                         ("bias", "untouched")}
    led.to_jsonl(tmp_path / "e.jsonl")
    lines = [json.loads(line) for line in open(tmp_path / "e.jsonl")]
    assert sum(e["nbytes"] for e in lines if e["category"] == "untouched") == nbytes(unused)
    snap = led.to_memory_viz()
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc" and e["category"] == "untouched"]
    assert sorted(e["size"] for e in allocs) == sorted([unused.weight.nbytes, unused.bias.nbytes])
    counters = [e for e in led.to_chrome_trace()["traceEvents"] if e["ph"] == "C"]
    assert max(e["args"]["untouched"] for e in counters) == counters[-1]["args"]["untouched"] == nbytes(unused)
