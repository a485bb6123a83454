"""The planner for your own model is public: tg.block_costs measures a chain of blocks, tg.plan picks the plan with
the least recompute within a budget, tg.run_plan runs it; the plan's predicted peak is what the ledger measures and
its gradients are the plain run's, bit for bit. Bad input is refused by name; tg.checkpoint given a Tensor says to
pass the function."""

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, state


def _chain(n=4, d=32):
    tg.manual_seed(0)
    blocks = [nn.Block(d, 4) for _ in range(n)]
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 16, d), dtype=np.float32), requires_grad=True)
    return blocks, x


def _step(blocks, x, plan):
    with tg.Ledger() as led:
        y = tg.run_plan(blocks, x, plan)
        y.sum().backward()  # saves nothing: the peak is the chain's
    grads = [p.grad.copy() for b in blocks for p in b.parameters()]
    for b in blocks:
        for p in b.parameters():
            p.grad = None
    return led, grads


def test_costs_are_measured_per_block_and_leave_gradients_alone():
    blocks, x = _chain()
    costs = tg.block_costs(blocks, x)
    assert len(costs) == 4 and all(c == costs[0] for c in costs)  # identical blocks, identical costs
    c = costs[0]
    assert c.input_bytes == x.data.nbytes and c.saved_bytes > 10 * c.input_bytes
    assert 0 < c.tail_flops < c.forward_flops  # the early stop skips the last linear and the residual add
    assert all(p.grad is None for b in blocks for p in b.parameters())


def test_the_plan_fits_its_budget_as_measured_and_gradients_are_bitwise_the_plain_ones():
    blocks, x = _chain()
    plain = tg.plan(blocks, x, budget=10**9)
    assert plain.describe() == "[0:4)plain"
    plain_led, plain_grads = _step(blocks, x, plain)
    budget = plain_led.peak_bytes("activation") // 2
    plan = tg.plan(blocks, x, budget=budget)
    assert isinstance(plan, tg.Plan) and plan.checkpoint_boundaries()
    led, grads = _step(blocks, x, plan)
    assert led.peak_bytes("activation") == plan.predicted_peak_bytes <= budget  # the chain model, to the byte
    assert led.flops("recompute") == plan.predicted_recompute_flops > 0
    assert all(np.array_equal(a, b) for a, b in zip(grads, plain_grads))
    assert tg.plan(blocks, x, budget=f"{budget}B").describe() == plan.describe()  # a size as text


def test_plan_chain_and_layer_cost_are_public_for_costs_you_know():
    costs = [tg.LayerCost(forward_flops=10, saved_bytes=100, input_bytes=10, tail_flops=2)] * 6
    plan = tg.plan_chain(costs, 300)
    assert plan.predicted_peak_bytes <= 300 and plan.predicted_recompute_flops > 0


@pytest.mark.parametrize("budget, match", [("lots", "budget must be a number of bytes"), (0, "budget must be positive"),
                                           (True, "budget must be a number"), (1, r"the least any plan keeps is")])
def test_a_bad_budget_is_refused_by_name(budget, match):
    blocks, x = _chain(2)
    with pytest.raises(ValueError, match=match):
        tg.plan(blocks, x, budget=budget)


def test_blocks_that_are_not_a_chain_are_refused():
    _, x = _chain(1)
    with pytest.raises(TypeError, match="blocks must be a non-empty list of callables"):
        tg.block_costs([], x)
    with pytest.raises(TypeError, match=r"blocks\[0\] returned tuple, not a Tensor"):
        tg.block_costs([lambda h: (h, h)], x)


def test_checkpoint_given_a_tensor_says_to_pass_the_function():
    blocks, x = _chain(1)
    with pytest.raises(TypeError, match=r"pass the function and its arguments: tg\.checkpoint\(block, h\)"):
        tg.checkpoint(blocks[0](x))


class _FailsInBackward(tg.Function):
    """Identity forward; its backward raises (after the block's parameters took their gradients)."""

    @staticmethod
    def forward(ctx, x):
        return x * 1

    @staticmethod
    def backward(ctx, grad_out):
        raise RuntimeError("boom in backward")


def _with_gradients(blocks, x):
    """The chain after one training step's backward: every parameter holds a gradient."""
    h = x
    for block in blocks:
        h = block(h)
    h.sum().backward()
    params = [p for b in blocks for p in b.parameters()]
    return params, [p.grad for p in params], [p.grad.copy() for p in params], [p.data.copy() for p in params]


def _unchanged(params, grads, grad_values, data, rng):
    assert all(p.grad is g for p, g in zip(params, grads))  # the same arrays, nothing added into them
    assert all(np.array_equal(p.grad, v) for p, v in zip(params, grad_values))
    assert all(np.array_equal(p.data, v) for p, v in zip(params, data))
    assert tg.get_rng_state() == rng


def test_costs_keep_gradients_rng_and_parameters_exactly_also_when_a_block_raises():
    tg.manual_seed(0)
    blocks = [nn.Block(32, 4, dropout=0.1) for _ in range(3)]  # dropout draws random numbers
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 8, 32), dtype=np.float32))
    params, *before = _with_gradients(blocks, x)
    rng = tg.get_rng_state()
    tg.block_costs(blocks, x)
    _unchanged(params, *before, rng)
    # a block that is a plain function (no .parameters()) raising half-way through its backward
    chain = [blocks[0], lambda h: blocks[1](_FailsInBackward.apply(h)), blocks[2]]
    with pytest.raises(RuntimeError, match="boom in backward"):
        tg.block_costs(chain, x)
    _unchanged(params, *before, rng)
    assert tg.is_grad_enabled() and not state.local.observers  # the engine as before


def test_plan_works_inside_a_ledger_which_sees_none_of_it_and_under_no_grad():
    blocks, x = _chain(2)
    expected = tg.plan(blocks, x, budget=10**9).describe()
    with tg.Ledger() as led:
        y = blocks[0](x)
        events = len(led.events)
        assert tg.plan(blocks, x, budget=10**9).describe() == expected
        assert len(led.events) == events  # the planner's measurements ran beside the ledger, under their own
        y.sum().backward()
    assert led.flops("recompute") == 0 and led.flops("forward") > 0
    with tg.no_grad():  # the planner records with gradients on (it must, to measure); the caller's no_grad stays
        assert tg.plan(blocks, x, budget=10**9).describe() == expected
        assert not tg.is_grad_enabled()


def test_run_plan_refuses_a_plan_for_another_number_of_blocks_naming_both():
    blocks, x = _chain(5)
    plan = tg.plan(blocks[:4], x, budget=10**9)
    with pytest.raises(ValueError, match=r"run_plan: the plan \[0:4\)plain covers blocks \[0:4\) \(4 blocks\), "
                                         r"but 5 blocks were given"):
        tg.run_plan(blocks, x, plan)
    with pytest.raises(ValueError, match=r"GPT\(checkpoint=\[0:4\)plain\): the plan covers blocks \[0:4\) "
                                         r"\(4 blocks\), but the model has 5"):
        tg.planner.plan_for(5, plan)


def test_run_plan_takes_what_a_models_checkpoint_takes_and_refuses_the_rest_by_name():
    blocks, x = _chain(4)
    plain = tg.run_plan(blocks, x, tg.plan(blocks, x, budget=10**9)).numpy()
    for spec in ("every_layer", "sqrt", 2, 4):
        assert np.array_equal(tg.run_plan(blocks, x, spec).numpy(), plain), spec
    for spec in ("sometimes", 0, 5, True, None):
        with pytest.raises(ValueError, match=rf"run_plan: plan={spec!r} is not a plan for 4 blocks: give a planner "
                                             r"Plan \(tg.plan\), 'every_layer', 'sqrt' or a number of segments from 1 "
                                             "to 4"):
            tg.run_plan(blocks, x, spec)
