"""Tests for the checkpoint planner: the simulator by hand, the DP against brute force, closed forms."""

import math
import random
import time
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinygrad_ckpt.recompute.planner import (
    LayerCost,
    Plan,
    Segment,
    balanced_plan,
    every_layer_plan,
    minimum_peak_bytes,
    no_checkpoint_plan,
    plan_chain,
    recursive_plan,
    revolve_max_steps,
    revolve_min_forward_steps,
    sequential_plan,
    simulate,
    sqrt_plan,
    uniform_costs,
)

# a_k = saved, b_k = input, f_k = flops, chosen so that every sum below is unambiguous
SMALL = [LayerCost(10, 5, 2), LayerCost(20, 7, 4), LayerCost(30, 3, 1)]


def random_chain(rng: random.Random, n: int) -> list[LayerCost]:
    return [LayerCost(rng.randint(1, 9), rng.randint(1, 12), rng.randint(1, 6)) for _ in range(n)]


def random_chain_with_tails(rng: random.Random, n: int) -> list[LayerCost]:
    """Layers whose replay may stop before a tail of 0 to all of their forward FLOPs."""
    layers = []
    for _ in range(n):
        f = rng.randint(1, 9)
        layers.append(LayerCost(f, rng.randint(1, 12), rng.randint(1, 6), rng.randint(0, f)))
    return layers


# --- simulate, by hand --------------------------------------------------------------------------------


def test_no_checkpoint_holds_every_interior():
    result = simulate(SMALL, no_checkpoint_plan(3))
    assert result.peak_bytes == 5 + 7 + 3
    assert result.recompute_flops == 0
    assert result.timeline[0] == ("start", 0) and result.timeline[-1][1] == 0


def test_every_layer_checkpoint_keeps_all_inputs_then_one_interior():
    # backward of layer k replays it on top of x_0..x_k: peak = max_k (b_0 + ... + b_k + a_k)
    result = simulate(SMALL, every_layer_plan(3))
    assert result.peak_bytes == max(2 + 5, 2 + 4 + 7, 2 + 4 + 1 + 3) == 13
    assert result.recompute_flops == 10 + 20 + 30
    assert result.replay_counts == (1, 1, 1)
    uniform = simulate(uniform_costs(6, 1, 3, 2), every_layer_plan(6))
    assert uniform.peak_bytes == 6 * 2 + 3  # sum b + a


def test_timeline_of_one_checkpoint():
    plan = Plan([Segment(0, 2, checkpoint=True), Segment(2, 3)])
    result = simulate(SMALL, plan)
    assert result.timeline == [
        ("start", 0),
        ("keep x0", 2),
        ("forward 2", 5),
        ("backward 2", 2),
        ("replay [0:2)", 2),
        ("forward 0", 7),
        ("forward 1", 14),
        ("backward 1", 7),
        ("backward 0", 2),
        ("drop x0", 0),
    ]
    assert (result.peak_bytes, result.recompute_flops, result.replay_counts) == (14, 30, (1, 1, 0))


def test_nested_checkpoint_reuses_the_held_input():
    inner = Plan([Segment(0, 2, checkpoint=True), Segment(2, 3)])
    result = simulate(SMALL, Plan([Segment(0, 3, True, inner)]))
    # x0 is kept once; replay of [0:3) runs all three layers, replay of [0:2) runs two again
    assert [event for event, _ in result.timeline].count("keep x0") == 1
    assert result.peak_bytes == 2 + 5 + 7
    assert result.recompute_flops == (10 + 20 + 30) + (10 + 20)
    assert result.replay_counts == (2, 2, 1)


def test_a_replay_stops_before_the_tail_of_its_last_layer_when_that_layer_runs_plainly():
    """Early stop: the replay of [p, q) skips t_{q-1} when layer q-1 runs plainly in it; an inner checkpoint
    that ends the replay runs whole there (its own replay, later, skips its tail)."""
    tails = [LayerCost(10, 5, 2, 4), LayerCost(20, 7, 4, 6), LayerCost(30, 3, 1, 12)]
    every = simulate(tails, every_layer_plan(3))
    assert every.recompute_flops == (10 - 4) + (20 - 6) + (30 - 12)
    one = simulate(tails, Plan([Segment(0, 2, checkpoint=True), Segment(2, 3)]))
    assert one.recompute_flops == 10 + (20 - 6)  # layer 0's tail is read by layer 1: it runs
    ends_nested = Plan([Segment(0, 3, True, Plan([Segment(0, 1), Segment(1, 3, checkpoint=True)]))])
    assert simulate(tails, ends_nested).recompute_flops == (10 + 20 + 30) + (20 + 30 - 12)
    ends_plain = Plan([Segment(0, 3, True, Plan([Segment(0, 2, checkpoint=True), Segment(2, 3)]))])
    assert simulate(tails, ends_plain).recompute_flops == (10 + 20 + 30 - 12) + (10 + 20 - 6)
    assert simulate(tails, every_layer_plan(3)).peak_bytes == simulate(SMALL, every_layer_plan(3)).peak_bytes
    with pytest.raises(ValueError, match="tail_flops .*at most forward_flops"):
        LayerCost(10, 5, 2, 11)
    with pytest.raises(ValueError, match="non-negative"):
        LayerCost(10, 5, 2, -1)


def test_simulate_rejects_a_plan_for_another_chain():
    with pytest.raises(ValueError, match="3 layers"):
        simulate(SMALL, no_checkpoint_plan(4))


# --- Plan structure and ready-made plans --------------------------------------------------------------


def test_describe_depth_and_boundaries():
    inner = Plan([Segment(0, 2, checkpoint=True), Segment(2, 4)])
    plan = Plan([Segment(0, 4, True, inner), Segment(4, 8, checkpoint=True), Segment(8, 9)])
    assert plan.describe() == "[0:4)ckpt{[0:2)ckpt,[2:4)plain} [4:8)ckpt [8:9)plain"
    assert str(plan) == plan.describe()
    assert plan.depth == 2 and inner.depth == 1 and no_checkpoint_plan(3).depth == 0
    assert plan.checkpoint_boundaries() == [0, 4]
    assert (plan.start, plan.stop) == (0, 9)


def test_invalid_plans_are_rejected():
    with pytest.raises(ValueError, match="contiguous"):
        Plan([Segment(0, 2), Segment(3, 4)])
    with pytest.raises(ValueError, match="cover"):
        Segment(0, 4, True, Plan([Segment(0, 3)]))
    with pytest.raises(ValueError, match="checkpointed"):
        Segment(0, 3, False, Plan([Segment(0, 3)]))
    with pytest.raises(ValueError):
        LayerCost(1, -1, 0)


def test_ready_made_plans():
    assert sequential_plan(10, 3).describe() == "[0:3)ckpt [3:6)ckpt [6:10)ckpt"
    assert sequential_plan(10, 3, last_plain=True).describe() == "[0:3)ckpt [3:6)ckpt [6:10)plain"
    assert sqrt_plan(10).describe() == "[0:3)ckpt [3:6)ckpt [6:10)ckpt"  # 10 // 3 = 3: sizes 3, 3, 4
    assert balanced_plan(24, 5).describe() == "[0:4)ckpt [4:9)ckpt [9:14)ckpt [14:19)ckpt [19:24)ckpt"
    assert sqrt_plan(24) == balanced_plan(24, 5) != sequential_plan(24, 5)  # 4, 4, 4, 4, 8 would peak higher
    assert every_layer_plan(2).describe() == "[0:1)ckpt [1:2)ckpt"
    assert recursive_plan(4).describe() == "[0:2)ckpt{[0:1)ckpt,[1:2)plain} [2:3)ckpt [3:4)plain"
    assert recursive_plan(8, depth=1).depth == 1 and recursive_plan(8).depth == 3
    with pytest.raises(ValueError):
        sequential_plan(4, 5)


@pytest.mark.parametrize("p", range(1, 8))
def test_bisection_uses_logarithmic_memory(p):
    """a = b = f = 1: peak = log2 n + 1; each layer is replayed once per 0 bit of its index, so the
    recompute is n log2(n) / 2 (Chen 2016: O(log n) memory for O(n log n) extra forward)."""
    n = 2**p
    result = simulate(uniform_costs(n), recursive_plan(n))
    assert result.peak_bytes == p + 1
    assert result.recompute_flops == n * p // 2
    assert result.replay_counts == tuple(p - bin(k).count("1") for k in range(n))


# --- Chen et al. 2016 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("a, b", [(1, 1), (4, 1), (1, 4), (3, 5)])
def test_segments_of_k_layers_peak_at_n_over_k_inputs_plus_k_interiors(a, b):
    """Checkpointed segments of k layers: the last replay holds all n/k inputs and k interiors,
    peak = (n/k) b + k a, minimal near k = sqrt(n b / a); the recompute is one extra forward."""
    n = 64
    peaks = {}
    for k in (1, 2, 4, 8, 16, 32, 64):
        result = simulate(uniform_costs(n, 3, a, b), sequential_plan(n, n // k))
        assert result.peak_bytes == (n // k) * b + k * a
        assert result.recompute_flops == 3 * n
        peaks[k] = result.peak_bytes
    best_k = min(peaks, key=peaks.get)
    assert abs(math.log2(best_k) - math.log2(math.sqrt(n * b / a))) <= 0.5


def test_sqrt_plan_peak_grows_like_sqrt_n():
    for n in range(1, 400):
        segments = max(1, round(math.sqrt(n)))
        result = simulate(uniform_costs(n), sqrt_plan(n))
        assert result.peak_bytes == segments + -(-n // segments)  # k inputs + the longest (balanced) segment
        assert result.peak_bytes <= 3 * math.sqrt(n) + 1
        assert result.recompute_flops == n
        last_plain = simulate(uniform_costs(n), sqrt_plan(n, last_plain=True))
        assert last_plain.recompute_flops == (segments - 1) * n // segments


# --- Revolve closed forms -----------------------------------------------------------------------------


@cache
def fewest_advances(steps: int, snapshots: int) -> float:
    """t(l, s) = min_{1<=k<l} k + t(l-k, s-1) + t(k, s): advance to x_k, store it, reverse [k, l) with
    the other s-1 slots, then [0, k) from x_0. t(1, s) = 0 (the input is the current state, even with
    no free slot); t(l, 0) = inf for l >= 2."""
    if steps == 1:
        return 0
    if snapshots == 0:
        return math.inf
    return min(
        k + fewest_advances(steps - k, snapshots - 1) + fewest_advances(k, snapshots) for k in range(1, steps)
    )


@cache
def fewest_repetitions(steps: int, snapshots: int) -> float:
    """rho(l, s) = min_k max(1 + rho(k, s), rho(l-k, s-1)): the steps before the split are advanced
    once now and again while [0, k) is reversed; the others only while [k, l) is reversed."""
    if steps == 1:
        return 0
    if snapshots == 0:
        return math.inf
    return min(
        max(1 + fewest_repetitions(k, snapshots), fewest_repetitions(steps - k, snapshots - 1))
        for k in range(1, steps)
    )


def test_revolve_min_forward_steps_matches_the_recursion():
    for snapshots in range(1, 7):
        for steps in range(1, 61):
            assert revolve_min_forward_steps(steps, snapshots) == fewest_advances(steps, snapshots)
    assert revolve_min_forward_steps(1, 0) == 0
    with pytest.raises(ValueError):
        revolve_min_forward_steps(2, 0)


def test_revolve_worked_numbers_for_1000_steps():
    table = {3: 12155, 10: 3636, 31: 2439, 63: 1935}
    assert {s: revolve_min_forward_steps(1000, s) for s in table} == table


def test_revolve_max_steps_matches_the_min_max_recursion():
    for snapshots in range(1, 5):
        for repetitions in range(0, 6):
            longest = max(n for n in range(1, 200) if fewest_repetitions(n, snapshots) <= repetitions)
            assert (
                revolve_max_steps(snapshots, repetitions)
                == longest
                == math.comb(snapshots + repetitions, snapshots)
            )


def revolve_chain(steps: int, snapshots: int) -> tuple[list[LayerCost], int]:
    interior = snapshots + 1
    return uniform_costs(steps, 1, interior, 1), interior + snapshots


@pytest.mark.parametrize("snapshots", [1, 2, 3, 4])
def test_plan_chain_reproduces_revolve(snapshots):
    """Mapping: f_k = 1, b_k = 1 (a kept input is a snapshot), a_k = A = s + 1, budget A + s.

    Two interiors need 2A > A + s, so a plain layer is only ever the one being reversed (Revolve's
    single tape, with the working state folded into A), and at most s inputs are kept (x_0 included, as
    in Revolve's convention). Each layer runs 1 + replays times here and 1 recording + advances times in
    Revolve, so our recompute is Revolve's T(l, s). What differs: Revolve's secondary criterion (fewest
    snapshot writes) is not modelled, and a nested plan keeps each snapshot for a whole sub-reversal;
    the binomial recursion is of that shape, hence the optimum agrees.
    """
    for steps in range(1, 25):
        costs, budget = revolve_chain(steps, snapshots)
        plan = plan_chain(costs, budget, granularity=1)
        assert plan.predicted_recompute_flops == revolve_min_forward_steps(steps, snapshots)
        assert plan.predicted_peak_bytes <= budget


@pytest.mark.parametrize("snapshots, repetitions", [(1, 3), (2, 2), (2, 3), (3, 2), (4, 1)])
def test_binomial_length_replays_the_busiest_layer_exactly_r_times(snapshots, repetitions):
    """l = C(s + r, s) steps can be reversed with r advances per step but not r - 1 (l > C(s+r-1, s));
    the optimal plan on the Revolve chain attains that: its most replayed layer runs r extra times."""
    steps = revolve_max_steps(snapshots, repetitions)
    costs, budget = revolve_chain(steps, snapshots)
    replays = simulate(costs, plan_chain(costs, budget, granularity=1)).replay_counts
    assert max(replays) == repetitions


# --- the planner against brute force ------------------------------------------------------------------


@cache  # each sub-range's plans once (Segment and Plan are frozen, so plans may share their parts)
def all_plans(i: int, j: int, depth: int) -> list[list[Segment]]:
    """Every segmentation of [i, j) with checkpoints nested at most ``depth`` deep (plain layers one by
    one, checkpoints whose replay is pointless included)."""
    if i == j:
        return [[]]
    plans = []
    for k in range(i + 1, j + 1):
        firsts = [Segment(i, k)] if k == i + 1 else []
        if depth > 0:
            firsts += [Segment(i, k, True, Plan(inner)) for inner in all_plans(i, k, depth - 1)]
        plans += [[first, *rest] for first in firsts for rest in all_plans(k, j, depth)]
    return plans


def periodic_chain(n: int) -> list[LayerCost]:
    """Two alternating kinds of layer: equal sub-chains share one entry in the planner's memo."""
    kinds = [LayerCost(3, 8, 2), LayerCost(1, 2, 5)]
    return [kinds[k % 2] for k in range(n)]


BRUTE_FORCE_CASES = [  # (n, nesting depth enumerated, chain)
    (4, 4, random_chain(random.Random(0), 4)),
    (4, 4, random_chain(random.Random(1), 4)),
    (4, 4, uniform_costs(4, 2, 3, 1)),
    (5, 3, random_chain(random.Random(2), 5)),
    (5, 3, periodic_chain(5)),
    (6, 2, random_chain(random.Random(3), 6)),
    (6, 1, random_chain(random.Random(4), 6)),
    (4, 4, random_chain_with_tails(random.Random(5), 4)),
    (5, 3, random_chain_with_tails(random.Random(6), 5)),
    (5, 4, random_chain_with_tails(random.Random(7), 5)),
    (6, 2, random_chain_with_tails(random.Random(8), 6)),
]


@pytest.mark.parametrize("n, depth, costs", BRUTE_FORCE_CASES)
def test_plan_chain_is_optimal_against_brute_force(n, depth, costs):
    """At every budget that some plan reaches exactly, the planner finds the least recompute (and,
    among those, the least peak) over all plans of that nesting depth, each one run in ``simulate``."""
    outcomes = [
        (result.peak_bytes, result.recompute_flops)
        for result in (simulate(costs, Plan(segments)) for segments in all_plans(0, n, depth))
    ]
    all_plans.cache_clear()  # its hundreds of thousands of plans would slow every later garbage collection
    # depth n reaches every plan worth having, so the uncapped planner must match it too
    max_depth = None if depth == n else depth
    least = min(peak for peak, _ in outcomes)
    assert minimum_peak_bytes(costs, max_depth) == least
    for budget in sorted({peak for peak, _ in outcomes}):
        fitting = [(recompute, peak) for peak, recompute in outcomes if peak <= budget]
        plan = plan_chain(costs, budget, granularity=1, max_depth=max_depth)
        assert (plan.predicted_recompute_flops, plan.predicted_peak_bytes) == min(fitting)
        assert plan.depth <= depth
        assert simulate(costs, plan).peak_bytes == plan.predicted_peak_bytes
    with pytest.raises(ValueError, match=f"budget of {least - 1} bytes.*minimum feasible peak is {least}"):
        plan_chain(costs, least - 1, granularity=1, max_depth=max_depth)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 9), st.integers(0, 60), st.integers(0, 30)), min_size=1, max_size=7
    ),
    slack=st.floats(0, 1),
    granularity=st.integers(1, 16),
)
def test_rounding_up_keeps_plans_inside_the_budget(sizes, slack, granularity):
    costs = [LayerCost(*size) for size in sizes]
    least, total = minimum_peak_bytes(costs), sum(c.saved_bytes for c in costs)
    budget = least + round(slack * (total - least))
    exact = plan_chain(costs, budget, granularity=1)
    automatic = plan_chain(costs, budget)
    assert exact.predicted_peak_bytes <= budget and automatic.predicted_peak_bytes <= budget
    try:
        coarse = plan_chain(costs, budget, granularity=granularity)
    except ValueError as error:
        assert "finer granularity" in str(error)
    else:
        assert coarse.predicted_peak_bytes <= budget
        assert coarse.predicted_recompute_flops >= exact.predicted_recompute_flops


def test_automatic_granularity_fits_odd_byte_sizes():
    rng = random.Random(5)
    costs = [
        LayerCost(rng.randint(1, 9), rng.randint(10**5, 10**6), rng.randint(10**4, 10**5)) for _ in range(16)
    ]
    least, total = minimum_peak_bytes(costs), sum(c.saved_bytes for c in costs)
    for budget in (least, least + 1000, (9 * least + total) // 10, (least + total) // 2, total):
        plan = plan_chain(costs, budget)
        assert plan.predicted_peak_bytes <= budget
    assert plan == no_checkpoint_plan(16)


def test_units_that_divide_every_size_lose_nothing():
    page = 4096
    in_pages = plan_chain(uniform_costs(24, 1, 3 * page, page), 20 * page, granularity=page)
    in_bytes = plan_chain(uniform_costs(24, 1, 3, 1), 20, granularity=1)
    assert in_pages == in_bytes
    assert in_pages.predicted_peak_bytes == page * in_bytes.predicted_peak_bytes


def test_uniform_chain_of_32_layers_is_planned_quickly():
    costs = uniform_costs(32, 1, 4, 1)
    baselines = [simulate(costs, plan) for plan in (sqrt_plan(32), recursive_plan(32), every_layer_plan(32))]
    budgets = sorted({minimum_peak_bytes(costs), 20, 40, 80, 4 * 32, *(b.peak_bytes for b in baselines)})
    started = time.perf_counter()
    plans = {budget: plan_chain(costs, budget) for budget in budgets}
    assert time.perf_counter() - started < 5
    recomputes = [plan.predicted_recompute_flops for plan in plans.values()]
    assert recomputes == sorted(recomputes, reverse=True) and recomputes[-1] == 0
    assert plans[4 * 32] == no_checkpoint_plan(32)
    for baseline in baselines:
        assert plans[baseline.peak_bytes].predicted_recompute_flops <= baseline.recompute_flops


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="no layers"):
        plan_chain([], 10)
    with pytest.raises(
        ValueError, match=r"budget of 3 bytes: the minimum feasible peak is 7 bytes \(max_depth=0\)"
    ):
        plan_chain([LayerCost(10, 5, 2), LayerCost(1, 2, 1)], 3, max_depth=0)


@pytest.mark.parametrize("budget, error, match", [
    (float("nan"), ValueError, "got nan"), (float("inf"), ValueError, "got inf"), (-5, ValueError, "got -5"),
    ("4MiB", TypeError, "number of bytes, got '4MiB' \\(str\\)"), (True, TypeError, "got True"),
])
def test_plan_chain_refuses_a_budget_that_is_not_bytes_by_name(budget, error, match):
    with pytest.raises(error, match="plan_chain: budget_bytes must be a .*" + match):
        plan_chain(uniform_costs(4), budget)


def test_plan_chain_takes_a_fractional_budget_rounded_down():
    assert plan_chain(uniform_costs(4), 4.9).describe() == plan_chain(uniform_costs(4), 4).describe()
