"""The planner for your own model is public: tg.block_costs measures a chain of blocks, tg.plan picks the plan with
the least recompute within a budget, tg.run_plan runs it; the plan's predicted peak is what the ledger measures and
its gradients are the plain run's, bit for bit. Bad input is refused by name; tg.checkpoint given a Tensor says to
pass the function."""

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn


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
