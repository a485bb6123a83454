"""The ledger: exact byte counts, agreement with tracemalloc, no leaks, idle fractions, OOM, exports."""

import json
import tracemalloc

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.memory.ledger import CATEGORIES, numpy_traced_bytes


def tiny_gpt(n_layer=2, d=32, T=16, vocab=64, **kw):
    tg.manual_seed(0)
    model = nn.GPT(vocab_size=vocab, block_size=T, n_layer=n_layer, n_head=2, d_model=d, **kw)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, vocab, (4, T))
    return model, idx


def test_gelu_saves_exactly_its_input_and_output():
    B, T, d = 2, 8, 16
    x = tg.Tensor(np.ones((B, T, 4 * d), np.float32), requires_grad=True)
    with tg.Ledger() as led:
        y = F.gelu(x)
        alone = led.live_bytes("activation")
        z = y @ tg.Parameter(np.ones((4 * d, d), np.float32))  # keeps y: the same buffer
    assert alone == 2 * 4 * B * T * 4 * d  # x and the output, now held by the tape
    assert led.live_bytes("activation") == alone  # the matmul's input is gelu's output, counted once
    assert [e.action for e in led.events if e.op == "gelu" and e.role == "x"] == ["saved"]
    del y, z


def test_softmax_saves_its_output_once_and_views_count_once():
    x = tg.Tensor(np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as led:
        y = F.softmax(x)
        saved = led.live_bytes("activation")
        z = y[:, 1:] * y[:, :4]  # two views of y's buffer, both saved by mul (and y by softmax)
    assert saved == 3 * 5 * 4
    assert led.live_bytes("activation") == saved  # y's buffer counted once though saved three times
    assert z.shape == (3, 4)


def test_output_moves_between_categories():
    x = tg.Tensor(np.ones((4, 4), np.float32), requires_grad=True)
    with tg.Ledger() as led:
        h = x.exp()  # exp saves its own output: "other" -> "activation"
        assert led.live_bytes("activation") == 64
        loss = h.sum()
        loss.backward()
        assert led.live_bytes("activation") == 0
        assert led.live_bytes("other") >= 64  # h is still held by the test, so it is "other" again
        del h
    released = [e for e in led.events if e.action == "released" and e.nbytes == 64]
    assert released, "dropping h must be recorded as a real release"


def _step(model, idx, opt):
    logits, loss = model(idx, idx)
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_ledger_agrees_with_tracemalloc_on_a_gpt_step():
    import scipy.special  # noqa: F401  (imported before tracing: its module-level arrays are not the engine's)

    tracemalloc.start()
    try:
        model, idx = tiny_gpt()
        opt = optim.AdamW(model.parameters(), lr=1e-3)
        _step(model, idx, opt)  # optimizer states now exist
        traced_before = numpy_traced_bytes()
        with tg.Ledger(trace_numpy=True) as led:
            _step(model, idx, opt)
    finally:
        tracemalloc.stop()
    existing = sum(e.nbytes for e in led.events if e.action == "existing")
    offset = traced_before - existing  # NumPy arrays alive that are not the engine's (the test's own)
    assert 0 <= offset < 0.01 * existing
    worst = max(abs((traced - offset) - live) / live for _, traced, live, _ in led.traced)
    assert worst <= 0.01, f"ledger vs tracemalloc at op boundaries: worst relative gap {worst:.4f}"
    traced_peak = max(traced for _, traced, _, _ in led.traced) - offset
    assert abs(traced_peak - led.peak_bytes(untouched=True)) <= 0.05 * led.peak_bytes(untouched=True)
    assert led.peak_bytes() == led.peak_bytes(untouched=True)  # the step used everything the engine held
    transient = max(t for *_, t in led.traced)
    assert transient > 0  # temporaries inside ops exist and are measured (reported, not asserted small)


def test_no_leak_over_200_steps():
    import scipy.special  # noqa: F401

    model, idx = tiny_gpt(n_layer=1, d=16, T=8, vocab=32)
    opt = optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, idx, opt)
    tracemalloc.start()
    try:
        start_traced = numpy_traced_bytes()
        with tg.Ledger() as led:
            baseline = led.live_bytes(untouched=True)  # all of it untouched yet: the whole is what is held
            for _ in range(200):
                _step(model, idx, opt)
            end = led.live_bytes(untouched=True)
        end_traced = numpy_traced_bytes()
    finally:
        tracemalloc.stop()
    params = sum(p.nbytes for p in model.parameters())
    assert led.live_bytes("parameter") == params
    assert led.live_bytes("optimizer") == 2 * params
    assert led.live_bytes("gradient") == 0 and led.live_bytes("activation") == 0
    assert led.live_bytes("other") == idx.nbytes  # the batch the test still holds (the engine read it)
    assert end == baseline + idx.nbytes
    assert abs(end_traced - start_traced) < 1024  # nothing NumPy-allocated piles up either


def test_idle_fraction_of_layer_1_in_a_32_layer_stack():
    n = 32
    tg.manual_seed(0)
    blocks = nn.ModuleList([nn.Block(16, 2) for _ in range(n)])  # ops named "0.attn.softmax", ...,
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as led:
        h = x
        for b in blocks:
            h = b(h)
        h.sum().backward()
    layer1 = [life for life in led.lifetimes() if life.layer == "0"]  # block 0's saves
    assert layer1
    idle = min(life.idle_fraction for life in layer1)
    assert abs(idle - (n - 1) / n) < 0.02, idle
    last = [life for life in led.lifetimes() if life.layer == str(n - 1)]
    assert max(life.idle_fraction for life in last) < 1.5 / n


def test_out_of_memory_names_the_op_and_engine_stays_usable():
    model, idx = tiny_gpt()
    with tg.Ledger() as probe:
        model(idx, idx)[1].backward()
    model.zero_grad()
    capacity = probe.peak_bytes() // 2
    with tg.Ledger(capacity_bytes=capacity) as led:
        with pytest.raises(tg.OutOfMemoryError) as err:
            model(idx, idx)
    message = str(err.value)
    assert "out of memory in '" in message and "capacity" in message and "activation" in message
    failing = message.split("'")[1]
    assert any(op["name"] == failing for op in led.ops)
    model.zero_grad()
    with tg.Ledger(capacity_bytes=probe.peak_bytes() * 2) as led2:
        logits, loss = model(idx, idx)
        loss.backward()
    assert led2.peak_bytes() <= probe.peak_bytes() * 2
    assert all(p.grad is not None for p in model.parameters())


def test_chrome_trace_and_event_exports(tmp_path):
    model, idx = tiny_gpt(n_layer=1)
    with tg.Ledger() as led:
        model(idx, idx)[1].backward()
    doc = led.to_chrome_trace(tmp_path / "trace.json")
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == json.loads(json.dumps(doc))
    events = loaded["traceEvents"]
    assert all({"ph", "pid", "name"} <= set(e) for e in events)
    counters = [e for e in events if e["ph"] == "C"]
    slices = [e for e in events if e["ph"] == "X"]
    assert counters and slices
    assert all("ts" in e and set(e["args"]) == set(CATEGORIES) for e in counters)
    assert all(e["dur"] >= 0 and "ts" in e for e in slices)
    led.to_csv(tmp_path / "events.csv")
    led.to_jsonl(tmp_path / "events.jsonl")
    assert len((tmp_path / "events.jsonl").read_text().splitlines()) == len(led.events)
    assert (tmp_path / "events.csv").read_text().startswith("seq,step,phase,action")


def test_timeline_summary_flops_and_breakdown():
    model, idx = tiny_gpt()
    with tg.Ledger() as led:
        model(idx, idx)[1].backward()
    tl = led.timeline()
    n = len(led.events)
    assert all(len(v) == n for v in tl.values())
    assert (tl["total"] - tl["untouched"]).max() == led.peak_bytes()  # garbage of earlier tests may be untouched
    assert tl["total"].max() == led.peak_bytes(untouched=True)
    for c in CATEGORIES:
        assert tl[c].max() == led.peak_bytes(c)
    assert led.flops("forward") > 0 and led.flops("backward") > led.flops("forward")
    assert led.flops() == led.flops("forward") + led.flops("backward")
    text = led.summary()
    assert all(c in text for c in CATEGORIES) and "peak" in text
    by_layer = led.saved_breakdown(by="layer")
    assert by_layer["transformer.h.0"] == by_layer["transformer.h.1"] > 0


def test_entering_finds_what_the_engine_holds_from_weak_registries():
    """A Ledger entered late counts every live tensor's data and .grad, every optimizer state and every saved array
    of a graph still reachable (from a tensor, or from a Tape someone holds): state.py's weak registries, no heap
    scan. The registries keep nothing alive, and stay short however many tensors come and go."""
    import gc
    import weakref

    from tinygrad_ckpt import state

    x = tg.Tensor(np.ones((4, 4), np.float32), requires_grad=True, name="x")
    w = tg.Parameter(np.ones((4, 4), np.float32), name="w")
    w.grad = np.ones((4, 4), np.float32)
    optim.AdamW([w]).step()  # w's states m and v; the optimizer itself is dropped (its states with it)
    opt = optim.AdamW([w])
    opt.step()  # this one is kept: two states of 64 B
    y = (x * w).exp()  # mul saves x and w (shared with the tensors), exp its output
    tape = y.tape()
    del y  # the Tape still holds both entries, so exp's output stays alive
    gc.collect()  # (garbage of earlier tests would be counted too: memory really held)
    with tg.Ledger() as led:
        pass
    assert led.live_bytes(untouched=True) == 64 * 6  # x, w, w.grad, m, v and exp's output: each buffer once
    assert {e.tensor for e in led.events if e.action == "existing" and e.tensor} == {"x", "w"}
    assert len(tape) == 2
    ref = weakref.ref(x)
    del x, tape
    gc.collect()
    assert ref() is None and all(t.name != "x" for t in state.live_tensors())
    for _ in range(10_000):
        tg.Tensor(np.ones(1, np.float32))
    assert len(state._tensor_refs) < 2 * len(state.live_tensors()) + 2048  # dead references are tidied away


def test_no_ledger_no_cost_paths():
    assert tg.ledger.current() is None if hasattr(tg, "ledger") else True
    x = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    (x * 2).sum().backward()
    assert np.array_equal(x.grad, np.full(3, 2, np.float32))
