"""Checkpointing: bitwise-identical gradients, what the tape and ledger hold, replay checks, policies."""

import sys

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn
from tinygrad_ckpt.recompute import planner


def gpt_grads(spec, dropout=0.1, n_layer=4, ledger=False):
    tg.manual_seed(0)
    model = nn.GPT(vocab_size=32, block_size=16, n_layer=n_layer, n_head=2, d_model=16, dropout=dropout,
                   checkpoint=spec)
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    led = tg.Ledger()
    if ledger:
        led.__enter__()
    try:
        logits, loss = model(idx, idx)
        loss.backward()
    finally:
        if ledger:
            led.__exit__(None, None, None)
    return {k: p.grad.copy() for k, p in model.named_parameters()}, loss.item(), led


PLANS = ["every_layer", "sqrt", 2, 3, tg.save_nothing, tg.save_matmuls, tg.korthikanti_selective,
         planner.recursive_plan(4), planner.Plan([planner.Segment(0, 3, True, planner.sequential_plan(3, 2)),
                                                   planner.Segment(3, 4, False)])]


@pytest.mark.parametrize("spec", PLANS, ids=lambda s: str(s))
def test_gradients_bitwise_equal_with_dropout(spec):
    base, loss0, _ = gpt_grads(None)
    grads, loss, _ = gpt_grads(spec)
    assert loss == loss0
    for k in base:
        assert np.array_equal(grads[k], base[k]), k


def test_gradients_bitwise_equal_on_every_backend(backend):
    """On CuPy too: two plain runs and a checkpointed one give the same bits (an embedding gradient summed
    with atomic adds did not, before backend.scatter_add_rows)."""
    def grads(spec):
        tg.manual_seed(0)
        model = nn.GPT(vocab_size=32, block_size=16, n_layer=2, n_head=2, d_model=16, dropout=0.1, checkpoint=spec)
        idx = np.random.default_rng(1).integers(0, 32, (8, 16))  # every id repeats: sums of many rows
        model(idx, idx)[1].backward()
        return {k: backend.current().to_numpy(p.grad) for k, p in model.named_parameters()}

    first, second, ckpt = grads(None), grads(None), grads("every_layer")
    for k in first:
        assert np.array_equal(first[k], second[k]) and np.array_equal(first[k], ckpt[k]), k


def test_checkpoint_sequential_matches_plain():
    tg.manual_seed(0)
    blocks = [nn.Block(16, 2, dropout=0.1) for _ in range(5)]
    x0 = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)
    results = []
    for use in (False, True):
        tg.manual_seed(3)
        x = tg.Tensor(x0, requires_grad=True)
        y = tg.checkpoint_sequential(blocks, 2, x) if use else x
        if not use:
            for b in blocks:
                y = b(y)
        y.sum().backward()
        results.append([x.grad] + [p.grad.copy() for b in blocks for p in b.parameters()])
        for b in blocks:
            b.zero_grad()
    assert all(np.array_equal(a, b) for a, b in zip(*results))


def test_forward_keeps_only_inputs_and_one_entry():
    tg.manual_seed(0)
    block = nn.Block(16, 2)
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as led:
        y = tg.checkpoint(block, x)
        assert led.live_bytes("activation") == x.nbytes  # the segment's input, nothing of its interior
    tape = y.tape()
    assert [e.op for e in tape.entries] == ["checkpoint"]
    entry = tape.entries[0]
    assert list(entry.ctx.saved) == ["input0"] and entry.ctx.replay.segment.rng == tg.get_rng_state()
    assert entry.saved_bytes() == x.nbytes
    assert "checkpoint" in repr(entry)
    y.sum().backward()
    assert entry.released and tape.saved_bytes() == 0


def test_replay_is_recorded_as_recompute_with_one_extra_forward_less_the_tail():
    """The replay runs each block again up to the last op backward needs the output of (PyTorch's early stop):
    each block's last linear (mlp.c_proj, which saves only its input) and its residual add are served, not run."""
    _, _, plain = gpt_grads(None, dropout=0.0, ledger=True)
    _, _, led = gpt_grads("every_layer", dropout=0.0, ledger=True)
    block_forward = sum(f for layer, f in plain.flops_by_layer().items() if layer.startswith("transformer.h."))
    last = {}  # per block: the FLOPs of its last linear and of its last add
    for op in plain.ops:
        if op["phase"] == "forward" and op["name"].startswith("transformer.h."):
            block = ".".join(op["name"].split(".")[:3])
            if op["name"].endswith("mlp.c_proj.linear") or op["name"] == block + ".add":
                last.setdefault(block, {})[op["op"]] = op["flops"]
    tail = sum(f for ops in last.values() for f in ops.values())
    blocks = {".".join(op["name"].split(".")[:3]) for op in plain.ops if op["name"].startswith("transformer.h.")}
    assert len(last) == len(blocks) > 1
    assert tail > 0.2 * block_forward  # the last linear is a quarter of a block's matmuls
    assert led.flops("recompute") == block_forward - tail
    assert led.flops("forward") == plain.flops("forward")
    assert any(e.action == "recomputed" and e.phase == "recompute" for e in led.events)
    assert led.peak_bytes("activation") < plain.peak_bytes("activation")


def test_many_inputs_outputs_kwargs_and_inputs_without_grad():
    rng = np.random.default_rng(0)
    tg.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = tg.Tensor(rng.standard_normal((4, 8)).astype(np.float32))  # does not require grad
    b = tg.Tensor(rng.standard_normal((4, 8)).astype(np.float32), requires_grad=True)

    def f(a, scale, bias=None):
        h = F.gelu(lin(a)) * scale
        return {"out": h + bias, "total": h.sum()}

    grads = []
    for use in (False, True):
        lin.zero_grad()
        b.grad = None
        out = tg.checkpoint(f, x, 2.0, bias=b) if use else f(x, 2.0, bias=b)
        (out["out"].sum() * 3 + out["total"]).backward()
        grads.append((lin.weight.grad.copy(), lin.bias.grad.copy(), b.grad.copy()))
    for g0, g1 in zip(*grads):
        assert np.array_equal(g0, g1)  # parameters inside get gradients although x does not require grad


def test_tensors_captured_from_outside_get_gradients():
    rng = np.random.default_rng(0)
    w = tg.Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    b = tg.Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    grads = []
    for use in (False, True):
        w.grad = None
        h = w * 2.0  # recorded outside, read inside the segment through the closure
        fn = lambda a, h=h: (a * h).tanh()  # noqa: E731  (h read inside, passed as a default)
        (tg.checkpoint(fn, b) if use else fn(b)).sum().backward()
        grads.append(w.grad.copy())
    assert np.array_equal(*grads)


def test_the_replay_stops_before_a_last_op_that_saves_only_its_inputs():
    """PyTorch's early stop: an op at the end whose output no replayed op reads and that saves only its inputs
    is served from the forward's record, so a Python scalar drawn anew there is the forward's (PyTorch's
    MulBackward keeps the forward's scalar too) and the value check has nothing to compare; an op that saves
    its output (exp) runs, and a scale before it that drifts is caught."""
    calls = {"n": 0}

    def scale_last(t):
        calls["n"] += 1
        return t.tanh() * float(calls["n"])

    def leaf(n):
        return tg.Tensor(np.linspace(-1, 1, n), requires_grad=True)

    x = leaf(3)
    with tg.Ledger() as led:
        tg.checkpoint(scale_last, x).sum().backward()
    assert calls["n"] == 2  # the replay ran the function, and stopped before the scale
    np.testing.assert_array_equal(x.grad, 1 - np.tanh(x.data) ** 2)  # d/dx tanh(x)·1, the forward's factor
    replayed = [op["op"] for op in led.ops if op["phase"] == "recompute" and op["flops"]]
    assert replayed == ["tanh"]

    def exp_last(t):
        calls["n"] += 1
        return (t * float(calls["n"])).exp()

    with pytest.raises(tg.CheckpointError, match="diverged at op 'scale'"):
        tg.checkpoint(exp_last, leaf(3)).sum().backward()


def test_nested_checkpoints_bitwise_and_recompute_twice():
    tg.manual_seed(0)
    blocks = [nn.Block(16, 2, dropout=0.1) for _ in range(4)]
    x0 = np.random.default_rng(0).standard_normal((2, 8, 16)).astype(np.float32)

    def run(nested):
        for bl in blocks:
            bl.zero_grad()
        tg.manual_seed(5)
        x = tg.Tensor(x0, requires_grad=True)
        with tg.Ledger() as led:
            if nested:
                def outer(z):
                    z = tg.checkpoint(lambda q: blocks[1](blocks[0](q)), z)
                    return tg.checkpoint(lambda q: blocks[3](blocks[2](q)), z)
                y = tg.checkpoint(outer, x)
            else:
                y = x
                for bl in blocks:
                    y = bl(y)
            y.sum().backward()
        return [x.grad] + [p.grad.copy() for bl in blocks for p in bl.parameters()], led

    plain, _ = run(False)
    nested, led = run(True)
    assert all(np.array_equal(a, b) for a, b in zip(plain, nested))
    blocks_forward = sum(op["flops"] for op in led.ops if op["phase"] == "forward" and op["name"] != "sum")
    # the outer replay runs both inner checkpoints whole; each inner replay stops before the residual add that
    # ends its second block (dropout keeps a mask, so the linear before it runs)
    adds = [op["flops"] for op in led.ops if op["phase"] == "forward" and op["op"] == "add"]
    assert len(adds) == 8 and adds[3] > 0
    assert led.flops("recompute") == 2 * blocks_forward - adds[3] - adds[7]


def test_no_grad_is_a_plain_call():
    x = tg.Tensor(np.ones((2, 3), np.float32), requires_grad=True)
    with tg.no_grad():
        y = tg.checkpoint(lambda a: a.exp(), x)
    assert not y.requires_grad and len(y.tape()) == 0


def test_non_tensor_return_is_a_clear_error():
    x = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(TypeError, match="must return a Tensor"):
        tg.checkpoint(lambda a: 3, x)


def test_replay_that_behaves_differently_is_named():
    x = tg.Tensor(np.ones((2, 3)), requires_grad=True)
    calls = {"n": 0}

    def drifting(a):
        calls["n"] += 1
        return (a * float(calls["n"])).tanh()

    y = tg.checkpoint(drifting, x)
    # the first op whose values differ: scale, which saves nothing but returns other numbers
    with pytest.raises(tg.CheckpointError, match="diverged at op 'scale'.*output '0'.*checksum"):
        y.sum().backward()


def test_a_one_bit_difference_in_a_save_is_caught():
    """The value check fingerprints bits: one element off by one ulp (lost in a float sum of 10⁶ values), or
    0.0 turned -0.0, is a diverged replay, named at the op that saved it."""
    big = np.full(10**6, 1e6)
    calls = {"n": 0}

    def nudged(a):
        calls["n"] += 1
        w = big.copy()
        if calls["n"] == 2:
            w[7] = np.nextafter(w[7], np.inf)
        return a * tg.Tensor(w)

    x = tg.Tensor(np.ones(10**6), requires_grad=True)
    nudged_copy = big.copy()
    nudged_copy[7] = np.nextafter(1e6, np.inf)
    assert big.sum() == nudged_copy.sum()  # a float sum does not see it
    y = tg.checkpoint(nudged, x)
    with pytest.raises(tg.CheckpointError, match=r"diverged at op 'mul' \(mul\): saved 'b' \[1000000\] float64"):
        y.sum().backward()
    from tinygrad_ckpt.recompute.replay_check import checksum as _checksum
    assert _checksum(np.zeros(3), np) != _checksum(np.array([0.0, -0.0, 0.0]), np)
    assert _checksum(np.arange(5, dtype=np.float32), np) == _checksum(np.arange(5, dtype=np.float32), np)  # 20 bytes
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    view, nudged_base = base.transpose(2, 0, 1), base.copy()
    nudged_base[1, 2, 3] = np.nextafter(nudged_base[1, 2, 3], np.inf)
    assert _checksum(view, np) != _checksum(nudged_base.transpose(2, 0, 1), np)  # a strided view, read in place


def test_a_drift_the_output_sample_misses_is_caught_at_the_next_save():
    """An op's output is sampled (its first 64 elements): add saves nothing, and its output drifts at element 500
    only, so the replay check names tanh, the next op, which saves the array it returns whole."""
    calls = {"n": 0}

    def late_drift(a):
        calls["n"] += 1
        w = np.zeros(1000)
        w[500] = float(calls["n"])
        return (a + tg.Tensor(w)).tanh()

    y = tg.checkpoint(late_drift, tg.Tensor(np.ones(1000), requires_grad=True))
    with pytest.raises(tg.CheckpointError, match=r"diverged at op 'tanh' \(tanh\): saved 'out'"):
        y.sum().backward()


def test_saved_views_are_fingerprinted_by_their_buffer_and_views_are_not_sampled(monkeypatch):
    from tinygrad_ckpt.recompute.replay_check import Observations
    from tinygrad_ckpt.recompute.replay_check import checksum as _checksum

    qkv = np.arange(2 * 4 * 12, dtype=np.float32).reshape(2, 4, 12)
    q, k, v = qkv[..., :4], qkv[..., 4:8].swapaxes(-1, -2), qkv[..., 8:]
    prints = Observations(values=True, start=0)
    assert prints.full(q) == prints.full(k) == prints.full(v) == _checksum(qkv, np)  # one in-order read
    big = np.arange(1000, dtype=np.float32)
    assert prints.full(big[:10]) == _checksum(big[:10], np)  # a small part of a big buffer: read alone
    sampled = []  # the arrays whose bits a sample reads
    module = sys.modules["tinygrad_ckpt.recompute.replay_check"]
    monkeypatch.setattr(module, "checksum", lambda a, xp, sample=False: (sampled.append(a) if sample else None)
                        or _checksum(a, xp, sample))
    y = tg.checkpoint(lambda a: (a.transpose(1, 0) * 2.0).reshape(15), tg.Tensor(np.ones((3, 5)), requires_grad=True))
    y.sum().backward()
    assert sampled and all(a.base is None for a in sampled)  # the scale's output, not the two views


def test_replay_with_other_shapes_is_named():
    x = tg.Tensor(np.ones((4, 3)), requires_grad=True)
    calls = {"n": 0}

    def shape_changing(a):
        calls["n"] += 1
        return (a[: 4 - calls["n"]]).exp().sum()

    y = tg.checkpoint(shape_changing, x)
    with pytest.raises(tg.CheckpointError, match=r"diverged at op 'getitem'.*output '0' was \[3, 3\].*\[2, 3\]"):
        y.backward()


def test_dropout_without_rng_replay_is_caught_and_otherwise_wrong():
    x0 = np.random.default_rng(0).standard_normal((4, 16))

    def f(a):
        return F.dropout(a, 0.5).tanh()

    x = tg.Tensor(x0, requires_grad=True)
    with pytest.raises(tg.CheckpointError, match="dropout"):
        tg.checkpoint(f, x, preserve_rng_state=False).sum().backward()
    grads = []
    for kwargs in ({}, {"preserve_rng_state": False, "determinism_check": "none"}):
        tg.manual_seed(0)
        x = tg.Tensor(x0, requires_grad=True)
        tg.checkpoint(f, x, **kwargs).sum().backward()
        grads.append(x.grad)
    tg.manual_seed(0)
    x = tg.Tensor(x0, requires_grad=True)
    f(x).sum().backward()
    assert np.array_equal(grads[0], x.grad)
    assert not np.array_equal(grads[1], x.grad)  # silently wrong without the RNG replay


def test_policies_give_reasons_and_save_less_than_no_checkpointing():
    _, _, plain = gpt_grads(None, dropout=0.0, ledger=True)
    for policy in (tg.korthikanti_selective, tg.save_matmuls):
        _, _, led = gpt_grads(policy, dropout=0.0, ledger=True)
        kept = [e for e in led.events if e.kept]
        assert kept, "the ledger names what the policy kept, and why"
        assert led.peak_bytes("activation") < plain.peak_bytes("activation")
        assert 0 < led.flops("recompute") < 0.3 * plain.flops("forward")
    decision = tg.korthikanti_selective.decide("softmax", "transformer.h.0.attn.softmax")
    assert not decision.save and "attention core" in decision.reason
    assert tg.korthikanti_selective.decide("linear", "transformer.h.0.mlp.c_fc.linear").save


def test_selective_keeps_exactly_what_korthikanti_counts():
    """Korthikanti's selective recompute keeps everything but the attention core: compared with no
    checkpointing, the block saves the softmax output and the causal mask less, plus the block input
    (held by the checkpoint entry) and minus the output projection's input (recomputed by the core)."""
    B, T, d, H = 2, 16, 16, 2
    tg.manual_seed(0)
    block = nn.Block(d, H)
    x = tg.Tensor(np.random.default_rng(0).standard_normal((B, T, d)).astype(np.float32), requires_grad=True)
    with tg.Ledger() as plain:
        y = block(x)
    del y
    with tg.Ledger() as sel:
        y = tg.checkpoint(block, x, policy=tg.korthikanti_selective)
    del y
    E = B * T * d * 4
    softmax_out, causal_mask = B * H * T * T * 4, T * T
    expected = plain.live_bytes("activation") - softmax_out - causal_mask + E - E
    assert sel.live_bytes("activation") == expected


def test_a_kept_output_only_a_recomputed_view_reads_is_let_go():
    """A view reads no data: a kept op's output that the replay only views, on the way to ops that are kept
    too, is let go after the forward. In a Llama block under korthikanti_selective q and k reach the (kept)
    rotary op only through views, so q_proj's and k_proj's outputs go, while v_proj's stays: the recomputed
    attention core reads it through its views. Gradients stay bit-identical to the plain run."""
    from tinygrad_ckpt.scale.measure import saved_after_forward

    idx = np.random.default_rng(0).integers(0, 64, (2, 16))

    def run(policy):
        tg.manual_seed(0)
        model = nn.Llama(64, 16, 1, 4, 32, n_kv_head=2, ffn_hidden=48, checkpoint=policy)
        with tg.Ledger() as led:
            _, loss = model(idx, idx)
            held = {e.scope for e in saved_after_forward(led, "model.layers.0.self_attn").values()
                    if e.role == "output" and e.op == "linear"}
            loss.backward()
        return held, [p.grad for p in model.parameters()]

    held, grads = run(tg.korthikanti_selective)
    assert held == {"model.layers.0.self_attn.v_proj"}
    for g, p in zip(grads, run(None)[1]):
        assert np.array_equal(g, p)


def test_gpt_checkpoint_switch_rejects_nonsense():
    with pytest.raises(ValueError, match="checkpoint="):
        gpt_grads("sometimes")


def test_nested_replays_hold_no_extra_gradients():
    """A plan nested 7 deep keeps no more gradient bytes in flight than checkpointing every layer:
    each level lets go of its incoming gradient once the level below holds it."""
    def gradient_peak(plan):
        tg.manual_seed(0)
        model = nn.GPT(64, 32, 8, 4, 64, checkpoint=plan)
        idx = np.zeros((4, 32), dtype=np.int64)
        with tg.Ledger() as led:
            model(idx, idx)[1].backward()
        return led.peak_bytes("gradient"), led.peak_bytes("activation")

    costs = planner.uniform_costs(8, 1, 10, 1)
    nested = planner.plan_chain(costs, planner.minimum_peak_bytes(costs))
    assert nested.depth >= 5
    assert gradient_peak(nested)[0] == gradient_peak(planner.every_layer_plan(8))[0]
