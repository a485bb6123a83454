"""Graphs belong to their tensors (PyTorch's semantics): what no live tensor reaches is freed, backward
consumes, two graphs are independent, in-place changes of saved arrays are caught, faults leave nothing
behind."""

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.memory.ledger import numpy_traced_bytes


def tiny_gpt(seed=0, dropout=0.0, checkpoint=None, n_layer=2):
    tg.manual_seed(seed)
    model = nn.GPT(vocab_size=32, block_size=8, n_layer=n_layer, n_head=2, d_model=16, dropout=dropout,
                   checkpoint=checkpoint)
    idx = np.random.default_rng(seed).integers(0, 32, (2, 8))
    return model, idx


def grads_of(model):
    return {name: p.grad.copy() for name, p in model.named_parameters()}


def assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---- a graph belongs to its tensors ----------------------------------------------------------------
def test_the_second_repro_a_graph_built_before_another_backward_keeps_its_gradient():
    x = tg.Tensor(np.ones(3), requires_grad=True)
    h = x * 2.0
    (x * 3.0).sum().backward()
    h.sum().backward()
    np.testing.assert_array_equal(x.grad, [5.0, 5.0, 5.0])  # PyTorch: 3 + 2


def test_tape_lists_exactly_what_the_tensor_depends_on_in_forward_order():
    x = tg.Tensor(np.ones(3), requires_grad=True, name="x")
    with tg.name_scope("a"):
        a = (x.exp() * 2.0).sum()
    with tg.name_scope("b"):
        b = x.tanh().sum()  # built while a's graph is alive: a graph of its own
    assert [e.name for e in a.tape()] == ["a.exp", "a.scale", "a.sum"]
    assert [e.name for e in b.tape()] == ["b.tanh", "b.sum"]
    assert "(x [3] float64)" in repr(b.tape()[0])  # inputs by name: the leaf's name here
    c = a + b  # joins both graphs
    assert [e.name for e in c.tape()] == ["a.exp", "a.scale", "a.sum", "b.tanh", "b.sum", "add"]


def test_two_live_graphs_backpropagate_independently_in_any_order():
    model, idx = tiny_gpt()
    _, first = model(idx, idx)
    _, second = model(idx[::-1].copy(), idx[::-1].copy())
    second.backward()
    g_second = grads_of(model)
    model.zero_grad()
    first.backward()
    g_first = grads_of(model)
    model.zero_grad()
    model(idx, idx)[1].backward()
    assert_same_grads(g_first, grads_of(model))
    model.zero_grad()
    model(idx[::-1].copy(), idx[::-1].copy())[1].backward()
    assert_same_grads(g_second, grads_of(model))


def test_a_dropped_graph_is_freed_and_the_ledger_sees_the_releases():
    model, idx = tiny_gpt()
    gc.collect()
    with tg.Ledger() as led:
        logits, loss = model(idx, idx)
        held = led.live_bytes("activation")
        saved = [weakref.ref(a) for e in loss.tape() for a in e.ctx.saved.values()
                 if isinstance(a, np.ndarray) and a.base is None and a is not idx
                 and all(a is not p.data for p in model.parameters())]
        del loss
        assert 0 < led.live_bytes("activation") < held  # the loss op's saves went; logits reaches the rest
        del logits  # never backpropagated
        assert led.live_bytes("activation") == 0
    assert held > 0 and saved and all(r() is None for r in saved)
    assert any(e.action == "unsaved" for e in led.events) and any(e.action == "released" for e in led.events)


# ---- backward consumes ----------------------------------------------------------------------------
def test_second_backward_raises_and_names_retain_graph():
    x = tg.Tensor(np.array([0.5, 1.0]), requires_grad=True)
    y = x.exp()
    y.sum().backward()
    with pytest.raises(RuntimeError, match=r"'exp' \[exp\] a second time.*retain_graph=True"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="retain_graph"):
        (y * 2.0).sum().backward()  # an op built later on the consumed activation: an error, not a drop
    z = x.exp()
    z.sum().backward(retain_graph=True)
    z.sum().backward()
    np.testing.assert_allclose(x.grad, 3 * np.exp(x.numpy()))  # once from y, twice from z


def test_entries_that_saved_nothing_can_be_reused_as_in_pytorch():
    x = tg.Tensor(np.ones(3), requires_grad=True)
    h = x * 2.0  # saves nothing: nothing to consume
    h.sum().backward()
    (h * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [8.0, 8.0, 8.0])  # 2 + 3·2, as torch gives


# ---- recording state per thread -------------------------------------------------------------------
def _train(seed, steps=3, out=None, key=None, checkpoint=None, dropout=0.1):
    """Train a tiny GPT for a few steps (this thread's RNG seeded first); the final gradients."""
    model, idx = tiny_gpt(seed, dropout=dropout, checkpoint=checkpoint)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        with tg.name_scope(f"thread{seed}" if key == "scoped" else ""):
            model(idx, idx)[1].backward()
        opt.step()
    result = grads_of(model)
    if out is not None:
        out[seed] = result
    return result


@pytest.mark.parametrize("checkpoint", [None, "every_layer"])
def test_two_threads_training_give_the_sequential_gradients_bit_for_bit(checkpoint):
    import sys
    import threading

    sequential = {seed: _train(seed, checkpoint=checkpoint) for seed in (1, 2)}
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        out = {}
        threads = [threading.Thread(target=_train, args=(seed, 3, out, "scoped", checkpoint)) for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    for seed in (1, 2):
        assert_same_grads(out[seed], sequential[seed])
    # nothing leaked into this thread: grad mode, scope, segment
    y = tg.Tensor(np.ones(2), requires_grad=True).exp()
    assert y.requires_grad and y.tape()[0].name == "exp"


def test_a_no_grad_thread_changes_nothing_in_another_thread():
    import threading

    expected = _train(3)
    stop = threading.Event()

    def evaluate():
        model, idx = tiny_gpt(7)
        while not stop.is_set():
            with tg.no_grad():
                _, loss = model(idx, idx)
            assert not loss.requires_grad

    worker = threading.Thread(target=evaluate)
    worker.start()
    try:
        got = _train(3)
    finally:
        stop.set()
        worker.join()
    assert_same_grads(got, expected)


def test_a_ledger_observes_the_thread_that_entered_it():
    import threading

    def run_step():
        model, idx = tiny_gpt(4)
        model(idx, idx)[1].backward()

    with tg.Ledger() as alone:
        run_step()
    busy = threading.Event()

    def other():
        busy.set()
        for _ in range(5):
            run_step()

    worker = threading.Thread(target=other)
    with tg.Ledger() as led:
        worker.start()
        busy.wait()
        run_step()
    worker.join()
    strip = [(e.action, e.nbytes, e.category, e.name, e.phase) for e in alone.events]
    assert [(e.action, e.nbytes, e.category, e.name, e.phase) for e in led.events] == strip


# ---- in-place changes of saved arrays are caught ---------------------------------------------------
def test_in_place_method_on_a_saved_tensor_is_caught_at_backward():
    x = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    w = tg.Tensor(np.array([3.0, 4.0]), name="w")
    with tg.name_scope("layer"):
        y = (x * w).sum()  # mul saves w to get dL/dx
    w.mul_(2.0)
    assert w._version == 1
    with pytest.raises(RuntimeError, match=r"'layer\.mul' \[mul\] saved 'b' \[2\] float64.*tensor 'w'.*version 1"):
        y.backward()
    with pytest.raises(RuntimeError, match=r"add_: 'x' .*no_grad"):
        x.name = "x"
        x.add_(1.0)  # in-place on a tensor that requires grad, while recording: refused
    with tg.no_grad():
        x.add_(1.0)  # allowed where nothing is recorded
    np.testing.assert_array_equal(x.numpy(), [2.0, 3.0])


def test_optimizer_step_between_forward_and_backward_is_caught():
    model, idx = tiny_gpt()
    opt = optim.SGD(model.parameters(), lr=0.1)
    _, loss = model(idx, idx)
    loss.backward(retain_graph=True)
    opt.step()  # changes every parameter in place
    with pytest.raises(RuntimeError, match=r"saved '(weight|x)'.*tensor 'transformer\.|lm_head.*changed in place"):
        loss.backward()
    _, fresh = model(idx, idx)  # a graph recorded after the step is fine
    fresh.backward()


def test_a_data_write_is_caught_under_detect_anomaly():
    x = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    w = tg.Tensor(np.array([3.0, 4.0]), name="w")
    with tg.detect_anomaly():
        y = (x * w).sum()
        w.data[...] = 0.0  # behind the engine's back: only the fingerprint can see it
        with pytest.raises(RuntimeError, match=r"saved 'b' \[2\] float64.*values changed"):
            y.backward()


# ---- faults leave nothing behind ------------------------------------------------------------------
def _unaccounted(led) -> int:
    """NumPy bytes alive (tracemalloc) minus the ledger's live bytes, after collecting cycles. At op
    boundaries it stays constant: the arrays of the test itself, which the ledger never saw."""
    gc.collect()
    return numpy_traced_bytes() - led.live_bytes()


@pytest.fixture
def traced():
    import scipy.special  # noqa: F401  (imported before tracing: its module arrays are not the engine's)

    gc.collect()
    tracemalloc.start()
    yield
    tracemalloc.stop()


def test_interrupted_backward_then_a_normal_step_matches_a_fresh_run():
    model, idx = tiny_gpt(dropout=0.1)
    reference, _ = tiny_gpt(dropout=0.1)
    opt, ref_opt = optim.AdamW(model.parameters()), optim.AdamW(reference.parameters())
    tg.manual_seed(5)
    logits, loss = model(idx, idx)
    with pytest.raises(KeyboardInterrupt):
        for i, _entry in enumerate(loss.backward_steps()):
            if i == 10:
                raise KeyboardInterrupt
    del logits, loss
    opt.zero_grad()  # the interrupted backward left partial gradients, as in PyTorch
    one_step = len(reference(idx, idx)[1].tape())
    for m, o in ((model, opt), (reference, ref_opt)):
        tg.manual_seed(6)
        _, loss = m(idx, idx)
        assert len(loss.tape()) == one_step  # a fresh graph: nothing appended to the interrupted one
        loss.backward()
        o.step()
    assert_same_grads(grads_of(model), grads_of(reference))
    for (_, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_interrupted_backward_leaves_no_phantom_bytes(traced):
    model, idx = tiny_gpt()
    with tg.Ledger() as led:
        logits, loss = model(idx, idx)
        before = _unaccounted(led)
        steps = loss.backward_steps()
        for _ in range(7):
            next(steps)
        del steps, logits, loss  # abandoned half-way: the rest of the graph goes with the last tensor
        assert led.live_bytes("activation") == 0
        assert _unaccounted(led) == before


def test_out_of_memory_in_one_forward_leaves_another_graph_intact(traced):
    model, idx = tiny_gpt()
    model(idx, idx)[1].backward()
    expected = grads_of(model)
    model.zero_grad()
    with tg.Ledger() as led:
        logits, first = model(idx, idx)
        before, held = _unaccounted(led), led.live_bytes()
        led.capacity_bytes = led.live_bytes() + 2000  # the second forward cannot fit
        with pytest.raises(tg.OutOfMemoryError, match="out of memory in"):
            model(idx, idx)
        assert _unaccounted(led) == before and led.live_bytes() == held  # the failed graph is gone, bytes and all
        led.capacity_bytes = None
        first.backward()  # the first graph was not touched
    assert_same_grads(grads_of(model), expected)


def test_out_of_memory_during_a_replay_leaves_no_phantom_activation(traced):
    model, idx = tiny_gpt(checkpoint="every_layer")
    model(idx, idx)[1].backward()
    expected = grads_of(model)
    model.zero_grad()
    with tg.Ledger() as led:
        logits, loss = model(idx, idx)
        before = _unaccounted(led)
        led.capacity_bytes = led.live_bytes() + 3000  # room for the head's backward, not for a block's replay
        with pytest.raises(tg.OutOfMemoryError, match=r"\(recompute\)"):
            loss.backward()
        del logits, loss
        assert led.live_bytes("activation") == 0
        assert _unaccounted(led) == before
        led.capacity_bytes = None
        model.zero_grad()
        model(idx, idx)[1].backward()  # the next step is a fresh, correct one
    assert_same_grads(grads_of(model), expected)


def test_keyboard_interrupt_inside_a_replay_affects_only_its_graph(traced):
    tg.manual_seed(0)
    block = nn.Block(16, 2)
    x = np.random.default_rng(1).standard_normal((2, 8, 16)).astype(np.float32)
    calls = {"n": 0}

    def flaky(h):
        calls["n"] += 1
        if calls["n"] == 2:  # the replay of the first graph below
            raise KeyboardInterrupt
        return block(h)

    block(tg.Tensor(x)).sum().backward()
    expected = {n: p.grad.copy() for n, p in block.named_parameters()}
    block.zero_grad()
    with tg.Ledger() as led:
        doomed = tg.checkpoint(flaky, tg.Tensor(x, requires_grad=True)).sum()
        other = tg.checkpoint(block, tg.Tensor(x)).sum()  # a second graph, alive meanwhile
        before = _unaccounted(led)
        with pytest.raises(KeyboardInterrupt):
            doomed.backward()
        del doomed
        assert _unaccounted(led) == before
        assert all(p.grad is None for p in block.parameters())  # the replay stopped before any gradient
        other.backward()
        del other
        assert led.live_bytes("activation") == 0
    for n, p in block.named_parameters():
        np.testing.assert_array_equal(p.grad, expected[n], err_msg=n)
    assert tg.state.local.observers == [] and tg.state.local.prefix == "" and tg.state.local.grad_enabled


def test_an_exception_inside_a_segment_leaves_the_thread_state_clean():
    x = tg.Tensor(np.ones(3), requires_grad=True)

    def broken(t):
        t.exp()
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        tg.checkpoint(broken, x)
    y = x.exp().sum()  # recording works as before: an entry, saves kept, gradient right
    assert [e.op for e in y.tape()] == ["exp", "sum"] and y.tape()[0].ctx.saved
    y.backward()
    np.testing.assert_allclose(x.grad, np.exp(1.0) * np.ones(3))


def test_meta_ledger_equals_numpy_ledger_with_numpy_ids():
    def events(backend):
        tg.use_backend(backend)
        try:
            model, idx = tiny_gpt()
            with tg.Ledger() as led:
                model(idx, idx)[1].backward()  # NumPy ids and targets on either backend
            return [(e.action, e.nbytes, e.category, e.name, e.phase) for e in led.events]
        finally:
            tg.use_backend("numpy")

    assert events("meta") == events("numpy")


def test_anomaly_and_functional_paths_still_record(rng):
    x = tg.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    with tg.detect_anomaly():
        y = F.softmax(x).sum()
    y.backward()
    assert x.grad.shape == (2, 3)
