"""Checkpoint plans for a chain of layers: the memory model, a simulator, an optimal planner.

Layer k of a chain 0..n-1 has four costs (``LayerCost``):
    f_k  forward FLOPs of one run of the layer,
    a_k  bytes its ops save for backward when it runs plainly (its interior),
    b_k  bytes of its input x_k, which a checkpoint starting at k keeps,
    t_k  FLOPs of its tail: the last ops a replay that ends with layer k need not run, because backward
         reads none of their outputs and they save only their inputs (a block's last linear and residual
         add; the engine's early stop, recompute/early_stop.py).
A ``Plan`` cuts [start, stop) into contiguous segments. A plain segment holds a_k from layer k's forward until its
backward. A checkpointed segment [p, q) holds only x_p in the forward; in the backward it replays its inner plan
over [p, q) (those forward FLOPs are recompute, less t_{q-1} if layer q-1 runs plainly in it: an inner checkpoint
that ends the replay runs whole), runs that plan's backward, then drops x_p. Held items form a set: x_p already
held by an enclosing checkpoint costs nothing again. Temporaries and gradients are not modelled. ``simulate``
runs this model; ``plan_chain`` finds the least-recompute plan within a budget (Revolve, for a heterogeneous chain).
"""

from __future__ import annotations

import math
import numbers
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate
from typing import NamedTuple

# Automatic granularity aims for at most this many memory units in the budget (the DP's memory axis).
TARGET_BUDGET_UNITS = 128


@dataclass(frozen=True)
class LayerCost:
    """Costs of one layer: f_k = forward_flops, a_k = saved_bytes, b_k = input_bytes, t_k = tail_flops
    (0 <= t_k <= f_k; measured as f_k less the layer's recompute FLOPs in an every-layer checkpointed run)."""

    forward_flops: float
    saved_bytes: int
    input_bytes: int
    tail_flops: float = 0

    def __post_init__(self):
        if min(self.forward_flops, self.saved_bytes, self.input_bytes, self.tail_flops) < 0:
            raise ValueError(f"layer costs must be non-negative, got {self}")
        if self.tail_flops > self.forward_flops:
            raise ValueError(f"tail_flops is part of a layer's forward, so at most forward_flops, got {self}")


def uniform_costs(
    n: int, forward_flops: float = 1, saved_bytes: int = 1, input_bytes: int = 1
) -> list[LayerCost]:
    """n identical layers: f_k = forward_flops, a_k = saved_bytes, b_k = input_bytes."""
    return [LayerCost(forward_flops, saved_bytes, input_bytes)] * n


@dataclass(frozen=True)
class Segment:
    """Layers [start, stop): plain, or checkpointed and replayed with ``inner`` (None: all plain)."""

    start: int
    stop: int
    checkpoint: bool = False
    inner: Plan | None = None

    def __post_init__(self):
        if not 0 <= self.start < self.stop:
            raise ValueError(f"empty or negative segment [{self.start}:{self.stop})")
        if self.inner is not None:
            if not self.checkpoint:
                raise ValueError("only a checkpointed segment can have an inner plan")
            if (self.inner.start, self.inner.stop) != (self.start, self.stop):
                raise ValueError(f"inner plan {self.inner} does not cover [{self.start}:{self.stop})")

    @property
    def depth(self) -> int:
        """0 plain, 1 checkpointed and replayed plainly, 1 + inner depth otherwise."""
        return 0 if not self.checkpoint else 1 + (self.inner.depth if self.inner else 0)

    def describe(self) -> str:
        kind = "ckpt" if self.checkpoint else "plain"
        inner = "" if self.inner is None else "{" + self.inner.describe(sep=",") + "}"
        return f"[{self.start}:{self.stop}){kind}{inner}"


@dataclass(frozen=True)
class Plan:
    """Contiguous segments over [start, stop); the predictions are filled in by ``plan_chain``."""

    segments: tuple[Segment, ...]
    predicted_peak_bytes: int | None = field(default=None, compare=False)
    predicted_recompute_flops: float | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "segments", tuple(self.segments))
        if not self.segments:
            raise ValueError("a plan needs at least one segment")
        for left, right in zip(self.segments, self.segments[1:]):
            if left.stop != right.start:
                raise ValueError(f"segments {left.describe()} and {right.describe()} are not contiguous")

    @property
    def start(self) -> int:
        return self.segments[0].start

    @property
    def stop(self) -> int:
        return self.segments[-1].stop

    @property
    def depth(self) -> int:
        """Nesting depth of checkpoints: 0 without any, 1 for checkpoints replayed plainly, and so on."""
        return max(segment.depth for segment in self.segments)

    def checkpoint_boundaries(self) -> list[int]:
        """Indices p whose input x_p a top-level checkpoint keeps during the first forward."""
        return [s.start for s in self.segments if s.checkpoint]

    def run(self, blocks, x, checkpoint):
        """The blocks over x, segment by segment: a plain segment block by block, a checkpointed one as one call
        `checkpoint(chunk, x)`, where `chunk` (a `Chunk`) runs the segment's blocks by its inner plan. Every model
        runs its blocks through here: the engine's (tg.checkpoint), its parallel shards, PyTorch's
        (torch.utils.checkpoint)."""
        for segment in self.segments:
            if segment.checkpoint:
                x = checkpoint(Chunk(blocks, segment, checkpoint), x)
            else:
                for block in blocks[segment.start:segment.stop]:
                    x = block(x)
        return x

    def describe(self, sep: str = " ") -> str:
        """E.g. ``[0:4)ckpt{[0:2)ckpt,[2:4)plain} [4:8)ckpt``."""
        return sep.join(s.describe() for s in self.segments)

    def __str__(self) -> str:
        return self.describe()


class Chunk:
    """The blocks of one checkpointed segment as one callable: run by the segment's inner plan (plainly without
    one, nested checkpoints with one), named after its blocks ("transformer.h.4", "transformer.h.4-7") on the
    tape and in tracebacks."""

    def __init__(self, blocks, segment: Segment, checkpoint):
        self.blocks, self.segment, self.checkpoint = blocks, segment, checkpoint
        first, last = (getattr(blocks[i], "_name", "") for i in (segment.start, segment.stop - 1))
        span = f"{segment.start}:{segment.stop}"
        many = segment.stop - segment.start > 1
        self._name = (f"{first}-{last.rsplit('.', 1)[-1]}" if many else first) if first else f"blocks.{span}"
        self.__name__ = f"blocks[{span}]"

    def __repr__(self) -> str:
        return f"<blocks {self._name}>"

    def __call__(self, x):
        inner = self.segment.inner or Plan([Segment(self.segment.start, self.segment.stop)])
        return inner.run(self.blocks, x, self.checkpoint)


# ---------------------------------------------------------------------------------------------------
# Ready-made plans (structure only; ``simulate`` gives their cost for a chain)


def no_checkpoint_plan(n: int) -> Plan:
    """Everything plain: peak = sum a_k, no recompute."""
    return Plan([Segment(0, n)])


def sequential_plan(n: int, segments: int, last_plain: bool = False) -> Plan:
    """``segments`` checkpointed pieces of n // segments layers, the remainder joining the last piece, as
    PyTorch's ``checkpoint_sequential`` splits (which runs it with ``last_plain``: the last piece plainly).
    """
    if not 1 <= segments <= n:
        raise ValueError(f"need 1 <= segments <= n, got segments={segments}, n={n}")
    size = n // segments
    bounds = [k * size for k in range(segments)] + [n]
    pieces = [Segment(p, q, checkpoint=True) for p, q in zip(bounds, bounds[1:])]
    if last_plain:
        pieces[-1] = Segment(pieces[-1].start, n)
    return Plan(pieces)


def balanced_plan(n: int, segments: int, last_plain: bool = False) -> Plan:
    """``segments`` checkpointed pieces whose sizes differ by at most one layer (what GPT(checkpoint=k) and
    sqrt_plan run: the longest piece sets the replay's peak, so no piece takes a whole remainder)."""
    if not 1 <= segments <= n:
        raise ValueError(f"need 1 <= segments <= n, got segments={segments}, n={n}")
    bounds = [i * n // segments for i in range(segments + 1)]
    pieces = [Segment(p, q, checkpoint=True) for p, q in zip(bounds, bounds[1:])]
    if last_plain:
        pieces[-1] = Segment(pieces[-1].start, n)
    return Plan(pieces)


def plan_for(n: int, spec, owner: str = "GPT") -> Plan:
    """The Plan a checkpoint switch names for n blocks: "every_layer", "sqrt", a number of (balanced)
    segments, or a Plan of its own covering [0, n). `owner` names the caller in the error."""
    if isinstance(spec, Plan):
        if (spec.start, spec.stop) != (0, n):
            raise ValueError(f"{owner}(checkpoint={spec}): the plan covers blocks [{spec.start}:{spec.stop}) "
                             f"({spec.stop - spec.start} blocks), but the model has {n}: make the plan for its {n} "
                             "blocks")
        return spec
    if spec == "every_layer":
        return every_layer_plan(n)
    if spec == "sqrt":
        return sqrt_plan(n)
    if isinstance(spec, int) and not isinstance(spec, bool) and 1 <= spec <= n:
        return balanced_plan(n, spec)
    raise ValueError(f"{owner}(checkpoint={spec!r}): use None, 'every_layer', 'sqrt', a number of segments from 1 "
                     f"to {n}, a planner Plan or a Policy such as tinygrad_ckpt.korthikanti_selective")


def every_layer_plan(n: int) -> Plan:
    """Each layer its own checkpoint: peak = max_k (b_0 + ... + b_k + a_k), recompute = sum f_k."""
    return Plan([Segment(k, k + 1, checkpoint=True) for k in range(n)])


def sqrt_plan(n: int, last_plain: bool = False) -> Plan:
    """Chen et al. 2016: round(sqrt n) balanced checkpointed segments; peak ~ (n/k) b + k a, one extra forward."""
    return balanced_plan(n, max(1, round(math.sqrt(n))), last_plain)


def recursive_plan(n: int, depth: int | None = None) -> Plan:
    """Bisection (Chen 2016 with k = 1): over [i, j) checkpoint [i, mid) and recurse into both halves.

    The top level keeps x_0, x_{n/2}, x_{3n/4}, ...; replays follow the same rule, so peak = O(log n)
    items and every layer is replayed O(log n) times. ``depth`` caps the nesting (deeper: replay plainly).
    """

    def halves(i: int, j: int, depth_left: int | None) -> list[Segment]:
        if j - i == 1 or depth_left == 0:
            return [Segment(i, j)]
        mid = (i + j) // 2
        inner = halves(i, mid, None if depth_left is None else depth_left - 1)
        inner_plan = None if inner == [Segment(i, mid)] else Plan(inner)
        return [Segment(i, mid, True, inner_plan), *halves(mid, j, depth_left)]

    return Plan(halves(0, n, depth))


# ---------------------------------------------------------------------------------------------------
# The simulator: the memory model, run event by event


@dataclass(frozen=True)
class SimResult:
    """Peak held bytes, recompute FLOPs, (event, held bytes) after each event, replays per layer."""

    peak_bytes: int
    recompute_flops: float
    timeline: list[tuple[str, int]]
    replay_counts: tuple[int, ...]


def simulate(costs: list[LayerCost], plan: Plan) -> SimResult:
    """Run ``plan`` over the chain: forward of all segments, then backward in reverse (module docstring)."""
    costs = list(costs)
    if (plan.start, plan.stop) != (0, len(costs)):
        raise ValueError(f"plan covers [{plan.start}:{plan.stop}), the chain has {len(costs)} layers")
    run = _Simulation(costs)
    run.backward(plan, run.forward(plan, replaying=False))
    peak = max(nbytes for _, nbytes in run.timeline)
    return SimResult(peak, run.recompute, run.timeline, tuple(run.replays))


class _Simulation:
    """What one simulated step holds (by item: ("input", p) or ("saved", k)), its timeline of held bytes, the
    FLOPs it recomputes and how often each layer is replayed."""

    def __init__(self, costs: list[LayerCost]):
        self.costs = costs
        self.held: dict[tuple[str, int], int] = {}
        self.timeline: list[tuple[str, int]] = [("start", 0)]
        self.replays = [0] * len(costs)
        self.recompute = 0

    def hold(self, item: tuple[str, int], nbytes: int, event: str) -> None:
        assert item not in self.held, f"{item} held twice"
        self.held[item] = nbytes
        self.timeline.append((event, self.timeline[-1][1] + nbytes))

    def release(self, item: tuple[str, int], event: str) -> None:
        self.timeline.append((event, self.timeline[-1][1] - self.held.pop(item)))

    def forward(self, plan: Plan, replaying: bool) -> list[bool]:
        """Run the forward of each segment; return which checkpoints added their input x_p."""
        costs, added = self.costs, []
        for seg in plan.segments:
            if replaying:
                for k in range(seg.start, seg.stop):
                    self.recompute += costs[k].forward_flops
                    self.replays[k] += 1
                if seg is plan.segments[-1] and not seg.checkpoint:  # the replay stops before the tail
                    self.recompute -= costs[seg.stop - 1].tail_flops
            fresh = seg.checkpoint and ("input", seg.start) not in self.held
            if fresh:
                self.hold(("input", seg.start), costs[seg.start].input_bytes, f"keep x{seg.start}")
            if not seg.checkpoint:
                for k in range(seg.start, seg.stop):
                    self.hold(("saved", k), costs[k].saved_bytes, f"forward {k}")
            added.append(fresh)
        return added

    def backward(self, plan: Plan, added: list[bool]) -> None:
        for seg, fresh in reversed(list(zip(plan.segments, added))):
            if seg.checkpoint:
                inner = seg.inner or Plan([Segment(seg.start, seg.stop)])
                self.timeline.append((f"replay [{seg.start}:{seg.stop})", self.timeline[-1][1]))
                self.backward(inner, self.forward(inner, replaying=True))
                if fresh:
                    self.release(("input", seg.start), f"drop x{seg.start}")
            else:
                for k in reversed(range(seg.start, seg.stop)):
                    self.release(("saved", k), f"backward {k}")


# ---------------------------------------------------------------------------------------------------
# Minimum peak and the optimal planner


@contextmanager
def _recursion_room(n: int):
    """The memoised DPs below recurse about 3 frames per layer; let chains of a few hundred layers in."""
    old_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old_limit, 4 * n + 200))
    try:
        yield
    finally:
        sys.setrecursionlimit(old_limit)


def _canonical_ranges(layer_keys: list) -> list[list[tuple[int, int]]]:
    """first[i][j] = the first range [i0, j0) whose layers have the same keys, in order, as [i, j).

    Sub-chains with equal costs have the same best plan (shifted), so the DPs below solve each distinct
    sub-chain once: a uniform chain has n distinct ranges, not n(n+1)/2.
    """
    n = len(layer_keys)
    range_ids: dict[tuple, int] = {}
    first_with_id: dict[int, tuple[int, int]] = {}
    first = [[(i, i)] * (n + 1) for i in range(n + 1)]
    for i in range(n):
        range_id = -1
        for j in range(i + 1, n + 1):
            range_id = range_ids.setdefault((range_id, layer_keys[j - 1]), len(range_ids))
            first[i][j] = first_with_id.setdefault(range_id, (i, j))
    return first


def _min_peak_function(saved: list[int], inputs: list[int]):
    """peak(i, j, held, depth_left): least peak of any plan over [i, j), in the units of saved/inputs.

    peak = min( a_i + peak(i+1, j),  min_k  c + max(peak(k, j), peak(i, k, held)) ),  c = 0 if x_i held
    else b_i, k < j when x_i is held; a range that may not nest further costs sum a_k.
    """
    first = _canonical_ranges(list(zip(saved, inputs)))

    def peak(i: int, j: int, held: bool, depth_left: int | None) -> int:
        return canonical_peak(*first[i][j], held, depth_left)

    @cache
    def canonical_peak(i: int, j: int, held: bool, depth_left: int | None) -> int:
        if i == j:
            return 0
        if depth_left == 0:
            return sum(saved[i:j])
        least = saved[i] + peak(i + 1, j, False, depth_left)
        c = 0 if held else inputs[i]
        inner_depth = None if depth_left is None else depth_left - 1
        for k in range(i + 1, j if held else j + 1):
            least = min(least, c + max(peak(k, j, False, depth_left), peak(i, k, True, inner_depth)))
        return least

    return peak


def minimum_peak_bytes(costs: list[LayerCost], max_depth: int | None = None) -> int:
    """The least simulated peak any plan (of nesting depth <= max_depth) can reach on this chain."""
    costs = list(costs)
    peak = _min_peak_function([c.saved_bytes for c in costs], [c.input_bytes for c in costs])
    with _recursion_room(len(costs)):
        return peak(0, len(costs), False, max_depth)


def _auto_granularity(costs: list[LayerCost], budget_bytes: int, max_depth: int | None) -> int:
    """Exact units (gcd of all sizes) if the budget holds at most TARGET_BUDGET_UNITS of them, else a
    coarser multiple, refined until the rounded-up chain still has a plan inside the budget."""
    exact = math.gcd(*(c.saved_bytes for c in costs), *(c.input_bytes for c in costs)) or 1
    if len(set(costs)) == 1:
        return exact  # identical layers: equal sub-chains are solved once, so exact units stay fast
    factor = max(1, math.ceil(budget_bytes / exact / TARGET_BUDGET_UNITS))
    while factor > 1:
        unit = exact * factor
        saved = [-(-c.saved_bytes // unit) for c in costs]
        inputs = [-(-c.input_bytes // unit) for c in costs]
        if _min_peak_function(saved, inputs)(0, len(costs), False, max_depth) <= budget_bytes // unit:
            break
        factor //= 2
    return exact * factor


def plan_chain(
    costs: list[LayerCost],
    budget_bytes: int,
    granularity: int | None = None,
    max_depth: int | None = None,
) -> Plan:
    """The plan with the least recompute FLOPs whose simulated peak is <= budget_bytes.

    Dynamic programme over (i, j, m, held, depth_left, ends_replay): the best plan over [i, j) within m
    memory units, x_i already held or not, [i, j) ending a replay or not (then a plain layer j-1 saves its
    tail: recompute - t_{j-1}). Either layer i runs plainly, leaving m - a_i for [i+1, j), or a checkpoint
    [i, k) keeps x_i (c = b_i, or 0 if held; k < j if held) and
        recompute = f_i + ... + f_{k-1} + best(k, j, m - c) + best(i, k, m - c, held=True, ends_replay=True),
    because the rest runs on top of x_i and, later, the replay of [i, k) runs on top of x_i alone.
    Bytes are rounded UP to multiples of ``granularity`` (default: see ``_auto_granularity``), so the
    plan fits the budget with exact bytes. ``max_depth`` caps checkpoint nesting (None: no cap).
    Among plans of equal recompute the lower peak wins (a sub-chain that fits all plain is run plain).
    """
    costs = list(costs)
    budget_bytes = _checked_budget(budget_bytes)
    with _recursion_room(len(costs)):
        return _plan_chain(costs, budget_bytes, granularity, max_depth)


def _checked_budget(budget_bytes) -> int:
    """The budget as whole bytes (a fractional one rounded down), or an error naming it: plan_chain's budget must be
    a finite, non-negative number."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, numbers.Real):
        raise TypeError(f"plan_chain: budget_bytes must be a number of bytes, got {budget_bytes!r} "
                        f"({type(budget_bytes).__name__}); tg.plan also reads sizes such as '4MiB'")
    if not math.isfinite(budget_bytes) or budget_bytes < 0:
        raise ValueError(f"plan_chain: budget_bytes must be a finite, non-negative number of bytes, got "
                         f"{budget_bytes!r}: give the bytes the chain's activations may hold")
    return int(budget_bytes)


def _plan_chain(costs: list[LayerCost], budget_bytes: int, granularity: int | None, max_depth: int | None):
    """The plan of least recompute over the chain whose peak fits `budget_bytes`: sizes rounded up to `unit`
    bytes, the dynamic programme `_least_recompute` searched, its choices followed by `_segments`."""
    n = len(costs)
    if n == 0:
        raise ValueError("the chain has no layers")
    least = minimum_peak_bytes(costs, max_depth)
    if budget_bytes < least:
        raise ValueError(
            f"no plan fits a budget of {budget_bytes} bytes: the minimum feasible peak is {least} bytes"
            + (f" (max_depth={max_depth})" if max_depth is not None else "")
        )
    # a layer whose forward is all tail (t_k = f_k) replays for free when a checkpoint ends with it: a plan
    # with such a checkpoint ties all-plain at zero recompute, maybe with a lower peak, so it is searched
    free_before = [0, *accumulate(c.tail_flops == c.forward_flops for c in costs)]
    if sum(c.saved_bytes for c in costs) <= budget_bytes and not free_before[n]:
        return _with_predictions(costs, no_checkpoint_plan(n))  # zero recompute, whatever the rounding
    unit = granularity or _auto_granularity(costs, budget_bytes, max_depth)
    units = _in_units(costs, unit)
    best = _least_recompute(costs, units, free_before)
    capacity = budget_bytes // unit
    if best(0, n, capacity, False, max_depth, False) is None:  # [0, n) is its own canonical range
        raise ValueError(
            f"no plan fits a budget of {budget_bytes} bytes once sizes are rounded up to multiples of "
            f"granularity={unit} bytes (the exact minimum peak is {least} bytes): use a finer granularity"
        )
    return _with_predictions(costs, Plan(_segments(best, units, 0, n, capacity, False, max_depth, False)))


class _Units(NamedTuple):
    """A chain's sizes in units of the granularity (rounded up) and its canonical sub-ranges: first[i][j] is the
    (i', j') that stands for [i, j) (equal sub-chains share one entry of the search's cache)."""

    saved: list[int]
    inputs: list[int]
    first: list


def _in_units(costs: list[LayerCost], unit: int) -> _Units:
    saved = [-(-c.saved_bytes // unit) for c in costs]
    inputs = [-(-c.input_bytes // unit) for c in costs]
    return _Units(saved, inputs, _canonical_ranges([(a, b, c.forward_flops, c.tail_flops)
                                                   for a, b, c in zip(saved, inputs, costs)]))


def _least_recompute(costs: list[LayerCost], units: _Units, free_before: list[int]):
    """The dynamic programme over the chain: best(i, j, m, held, depth_left, ends_replay), cached."""
    saved, inputs, first = units
    flops_before = [0, *accumulate(c.forward_flops for c in costs)]
    saved_before = [0, *accumulate(saved)]
    least_units = _min_peak_function(saved, inputs)
    tails = [c.tail_flops for c in costs]

    @cache
    def best(i: int, j: int, m: int, held: bool, depth_left: int | None, ends_replay: bool):
        """(recompute, peak units, split) of the best plan over [i, j) within m units, or None if none
        fits; split None: layer i runs plainly, else the first segment is the checkpoint [i, i + split).
        Called with canonical ranges only (``first``), so equal sub-chains share one entry."""
        saved_tail = tails[j - 1] if ends_replay and i < j else 0  # what a plain layer j-1 does not recompute
        if saved_before[j] - saved_before[i] <= m and free_before[j] == free_before[i]:
            return (-saved_tail, saved_before[j] - saved_before[i], None)  # all plain: only a replay's tail saved
        if least_units(i, j, held, depth_left) > m:
            return None
        choice = None
        if saved[i] <= m and (rest := best(*first[i + 1][j], m - saved[i], False, depth_left, ends_replay)):
            choice = (rest[0] - (saved_tail if i + 1 == j else 0), saved[i] + rest[1], None)
        c = 0 if held else inputs[i]
        if depth_left == 0 or c > m:
            return choice
        inner_depth = None if depth_left is None else depth_left - 1
        for k in range(i + 1, j if held else j + 1):
            replay_flops = flops_before[k] - flops_before[i]
            if choice and replay_flops - tails[k - 1] - saved_tail > choice[0]:
                break  # replaying more layers only costs more (f_k >= t_k: the bound grows with k)
            rest = best(*first[k][j], m - c, False, depth_left, ends_replay)
            replay = best(*first[i][k], m - c, True, inner_depth, True)
            if rest and replay:
                peak = c + (rest[1] if rest[1] > replay[1] else replay[1])
                option = (replay_flops + rest[0] + replay[0], peak, k - i)
                if choice is None or option[:2] < choice[:2]:
                    choice = option
        return choice

    return best


def _segments(best, units: _Units, i: int, j: int, m: int, held: bool, depth_left: int | None,
              ends_replay: bool) -> list[Segment]:
    """Follow the DP's choices along [i, j); adjacent plain layers merge into one segment."""
    saved, inputs, first = units
    segments: list[Segment] = []
    while i < j:
        split = best(*first[i][j], m, held, depth_left, ends_replay)[2]
        if split is None:
            if segments and not segments[-1].checkpoint:
                segments[-1] = Segment(segments[-1].start, i + 1)
            else:
                segments.append(Segment(i, i + 1))
            m, i = m - saved[i], i + 1
        else:
            k = i + split
            m -= 0 if held else inputs[i]
            inner = _segments(best, units, i, k, m, True, None if depth_left is None else depth_left - 1, True)
            segments.append(Segment(i, k, True, None if inner == [Segment(i, k)] else Plan(inner)))
            i = k
        held = False
    return segments


def _with_predictions(costs: list[LayerCost], plan: Plan) -> Plan:
    result = simulate(costs, plan)
    return Plan(plan.segments, result.peak_bytes, result.recompute_flops)


# ---------------------------------------------------------------------------------------------------
# Revolve (Griewank & Walther 2000) closed forms for a uniform chain


def revolve_max_steps(snapshots: int, repetitions: int) -> int:
    """beta(s, r) = C(s + r, s): the longest chain s snapshots can reverse if no step is advanced more
    than r times (advances only: the one recording run of each step before its reversal is not counted)."""
    if snapshots < 0 or repetitions < 0:
        raise ValueError("snapshots and repetitions must be non-negative")
    return math.comb(snapshots + repetitions, snapshots)


def revolve_min_forward_steps(steps: int, snapshots: int) -> int:
    """T(l, s) = r l - C(s + r, s + 1) with r the least integer such that C(s + r, s) >= l.

    The fewest advances (forward steps, not counting the l recording runs) that reverse l uniform steps
    with s snapshot slots, one of them holding the initial state.
    """
    if steps < 1 or snapshots < 0 or (snapshots == 0 and steps > 1):
        raise ValueError(f"cannot reverse {steps} steps with {snapshots} snapshots")
    r = 0
    while revolve_max_steps(snapshots, r) < steps:
        r += 1
    return r * steps - math.comb(snapshots + r, snapshots + 1)
