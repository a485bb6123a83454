"""Blocks run under a plan (planner.Plan), each checkpointed segment through tg.checkpoint: what a model's
`checkpoint=` switch, tg.checkpoint_sequential and tg.run_plan do."""

from __future__ import annotations

from .checkpoint import checkpoint
from .planner import Plan, every_layer_plan, plan_for, sequential_plan
from .policies import Policy


def checkpoint_sequential(blocks, segments: int, x, **kwargs):
    """Split `blocks` into `segments` chunks and checkpoint every chunk but the last, which runs
    plainly (its backward starts right away, so checkpointing it would only recompute), like
    torch.utils.checkpoint.checkpoint_sequential."""
    blocks = list(blocks)
    return run_plan(blocks, x, sequential_plan(len(blocks), segments, last_plain=True), **kwargs)


def run_plan(blocks, x, plan, **kwargs):
    """Run `blocks` over x following `plan`, each checkpointed segment through `checkpoint` (nested checkpoints for
    nested plans); kwargs go to every checkpoint (policy=, determinism_check=, ...). `plan` is what a model's
    checkpoint= takes: a planner Plan made for these blocks, "every_layer", "sqrt" or a number of segments."""
    blocks = list(blocks)
    n = len(blocks)
    if isinstance(plan, Plan) and (plan.start, plan.stop) != (0, n):
        raise ValueError(f"run_plan: the plan {plan} covers blocks [{plan.start}:{plan.stop}) "
                         f"({plan.stop - plan.start} blocks), but {n} blocks were given: run it over the blocks it "
                         f"was made for, or make one for these {n} (tg.plan(blocks, x, budget))")
    try:
        plan = plan_for(n, plan)
    except ValueError:
        raise ValueError(f"run_plan: plan={plan!r} is not a plan for {n} blocks: give a planner Plan (tg.plan), "
                         f"'every_layer', 'sqrt' or a number of segments from 1 to {n}") from None
    return plan.run(blocks, x, lambda run_chunk, x: checkpoint(run_chunk, x, **kwargs))


def run_checkpointed(blocks, x, spec):
    """A model's checkpoint switch: None, "every_layer", "sqrt", an int k (k segments), a Policy (selective
    recomputation inside every block) or a planner Plan."""
    if spec is None:  # the plain step: block after block, no planner code
        for block in blocks:
            x = block(x)
        return x
    if isinstance(spec, Policy):
        return run_plan(blocks, x, every_layer_plan(len(blocks)), policy=spec)
    return run_plan(blocks, x, plan_for(len(blocks), spec))


__all__ = ["checkpoint_sequential", "run_plan", "run_checkpointed"]
