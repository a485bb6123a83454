"""The checkpoint's silent holes, closed: what a segment reads from outside is version-checked, outside tensors
returned from a segment pass their gradient through, policies are asked about every op and say when a pattern
matched nothing, empty batches work; and each feature switched off on its own."""

import warnings

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.recompute.planner import every_layer_plan
from tinygrad_ckpt.recompute.plans import run_plan
from tinygrad_ckpt.recompute.policies import as_policy


def test_a_replay_reading_a_weight_the_optimizer_changed_raises_as_the_plain_graph_does():
    w = tg.Parameter(np.full(3, 2.0, np.float32), name="w")
    x = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    y = tg.checkpoint(lambda t: t * w, x)
    w.grad = np.ones(3, np.float32)
    optim.SGD([w], lr=0.5).step()
    with pytest.raises(RuntimeError, match=r"'lambda.checkpoint' \[checkpoint\] read \[3\] float32 for backward, but "
                                           r"tensor 'w' .* changed in place afterwards \(now at version 1\)"):
        y.sum().backward()
    plain = x * w  # the same step without checkpoint: its own clear error
    w.grad = np.ones(3, np.float32)
    optim.SGD([w], lr=0.5).step()
    with pytest.raises(RuntimeError, match=r"tensor 'w' .* changed in place afterwards"):
        plain.sum().backward()


def test_a_checkpointed_gpt_whose_weights_were_stepped_refuses_backward():
    """The MLP's last linear is served by the early stop (its weight read live): a step between forward and
    backward is still caught."""
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16, checkpoint="every_layer")
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    _, loss = model(idx, idx)
    projections = [b.mlp.c_proj.weight for b in model.transformer.h]
    for p in projections:
        p.grad = np.zeros_like(p.data)
    optim.SGD(projections, lr=0.1).step()
    with pytest.raises(RuntimeError, match=r"transformer\.h\.1\.checkpoint.*mlp\.c_proj\.weight.*changed in place"):
        loss.backward()


def test_a_segment_bumping_an_outside_tensor_in_place_is_refused_not_replayed():
    counter = tg.Tensor(np.array(1.0), name="counter")
    x = tg.Tensor(np.ones(3), requires_grad=True)

    def bump(t):
        with tg.no_grad():
            counter.add_(1.0)
        return t * counter

    y = tg.checkpoint(bump, x)
    np.testing.assert_array_equal(y.numpy(), [2.0, 2.0, 2.0])
    with pytest.raises(RuntimeError, match=r"'bump.checkpoint' \[checkpoint\] read \[\] float64 for backward, but "
                                           r"tensor 'counter' that holds it was changed in place"):
        y.sum().backward()
    assert counter.item() == 2.0  # the replay did not run the bump again


def test_replacing_a_read_tensors_data_is_refused():
    w = tg.Tensor(np.full(3, 2.0), name="w")
    x = tg.Tensor(np.ones(3), requires_grad=True)
    y = tg.checkpoint(lambda t: t * w, x)
    w.data = np.full(3, 5.0)
    with pytest.raises(RuntimeError, match=r"tensor 'w'"):
        y.sum().backward()


@pytest.mark.parametrize("alone", [True, False])
def test_an_outside_tensor_returned_as_it_is_passes_its_gradient_through(alone):
    """PyTorch and JAX pass it through; a tensor made by an op and a leaf both get their gradient."""
    leaf = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    made = leaf * 3.0
    x = tg.Tensor(np.array([0.5, 0.25]), requires_grad=True)

    def fn(t):
        return (made, leaf) if alone else (t * t, made, leaf)

    outs = tg.checkpoint(fn, x)
    total = sum(((o * float(k + 1)).sum() for k, o in enumerate(outs)), start=tg.Tensor(np.array(0.0)))
    total.backward()
    k = 1 if alone else 2  # the weights (k + 1) of `made` and `leaf` in total
    np.testing.assert_allclose(leaf.grad, np.full(2, 3.0 * k + (k + 1)))
    if not alone:
        np.testing.assert_allclose(x.grad, 2 * x.numpy())


def test_an_argument_returned_as_it_is_passes_its_gradient_through():
    x = tg.Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y, z = tg.checkpoint(lambda t: (t, t.exp()), x)
    (y * 2.0 + z).sum().backward()
    np.testing.assert_allclose(x.grad, 2.0 + np.exp([1.0, 2.0]))


def test_a_policy_is_asked_about_every_op_and_can_keep_a_named_constant():
    asked = []
    c = tg.Tensor(np.array([1.0, 2.0]))  # needs no grad: its ops record nothing

    def fn(t):
        return t * (c * 3.0).exp()

    def policy(op, name):
        asked.append((op, name))
        return op == "exp"

    def recompute(policy):
        x = tg.Tensor(np.array([0.5, 0.5]), requires_grad=True)
        with tg.Ledger() as led:
            tg.checkpoint(fn, x, policy=policy).sum().backward()
        np.testing.assert_allclose(x.grad, np.exp([3.0, 6.0]))
        return {op["op"]: op["flops"] for op in led.ops if op["phase"] == "recompute"}

    assert recompute(None)["exp"] > 0  # mul needs exp's output: exp (and the scale before it) run again
    kept = recompute(policy)
    assert [op for op, _ in asked] == ["scale", "exp", "mul"]  # asked about ops that need no grad too
    assert kept["exp"] == 0 and kept["mul"] == 0  # exp kept, so served; mul past the early stop


def test_a_pattern_that_matched_nothing_warns_once_with_the_closest_names():
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16, checkpoint=as_policy({"matmull", "gelu"}))  # matmull: a typo
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(idx, idx)[1].backward()
        model(idx, idx)[1].backward()
    found = [str(w.message) for w in caught if "matmull" in str(w.message)]
    assert len(found) == 1 and "closest names the segment ran: matmul" in found[0]
    assert not any("'gelu'" in str(w.message) for w in caught)


def test_a_checkpoint_over_an_empty_batch_works():
    tg.manual_seed(0)
    block = nn.Block(8, 2)
    x = tg.Tensor(np.zeros((0, 4, 8), np.float32), requires_grad=True)
    y = tg.checkpoint(block, x)
    assert y.shape == (0, 4, 8)
    y.sum().backward()
    assert x.grad.shape == (0, 4, 8)


def _gpt_step(checkpoint, **kwargs):
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 3, 2, 16, dropout=0.1)
    idx = np.random.default_rng(1).integers(0, 32, (2, 8))
    tg.manual_seed(3)
    if checkpoint:
        tr = model.transformer
        model.run_blocks = lambda x: run_plan(list(tr.h), x, every_layer_plan(3), **kwargs)
    with tg.Ledger() as led:
        _, loss = model(idx, idx)
        loss.backward()
    return [p.grad.copy() for p in model.parameters()], led


@pytest.mark.parametrize("switch", [dict(early_stop=False), dict(determinism_check="none"),
                                    dict(determinism_check="metadata"), dict(policy=tg.save_matmuls),
                                    dict(early_stop=False, determinism_check="none")])
def test_each_feature_switched_off_or_on_on_its_own_keeps_gradients_bitwise(switch):
    plain, _ = _gpt_step(False)
    grads, led = _gpt_step(True, **switch)
    assert all(np.array_equal(a, b) for a, b in zip(plain, grads))
    _, default = _gpt_step(True)
    if switch.get("early_stop") is False:  # every op of every block runs again
        assert led.flops("recompute") > default.flops("recompute")
    if "policy" in switch:
        assert led.flops("recompute") < default.flops("recompute")


def test_without_the_early_stop_the_replay_runs_the_whole_segment():
    _, plain = _gpt_step(False)
    _, led = _gpt_step(True, early_stop=False)
    blocks = sum(f for layer, f in plain.flops_by_layer().items() if layer.startswith("transformer.h."))
    assert led.flops("recompute") == blocks


def test_without_the_replay_check_a_changed_value_goes_unseen_but_the_op_sequence_is_still_checked():
    calls = {"n": 0}

    def drifting(a):
        calls["n"] += 1
        return a * float(calls["n"])  # a Python scalar drawn anew: the replay computes other values

    x = tg.Tensor(np.ones(3), requires_grad=True)
    tg.checkpoint(lambda a: drifting(a).exp(), x, determinism_check="none").sum().backward()  # unseen
    x.grad = None
    with pytest.raises(tg.CheckpointError, match="checksum"):
        tg.checkpoint(lambda a: drifting(a).exp(), x).sum().backward()

    def branching(a):
        calls["n"] += 1
        return a.exp() if calls["n"] % 2 else a.tanh()

    with pytest.raises(tg.CheckpointError, match=r"the forward ran '.*' \((exp|tanh)\), the replay"):
        tg.checkpoint(branching, x, determinism_check="none").sum().backward()
