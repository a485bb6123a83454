"""Nested arguments and results (tuples, lists and dicts of Tensors), mapped leaf by leaf: what tg.checkpoint
uses to find a segment's tensor arguments and outputs and to put them back in place."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.tensor import Tensor


@dataclass(frozen=True)
class Argument:
    """Stands for the n-th tensor argument in the structure a checkpoint entry keeps (no Tensor held)."""

    position: int


def tree_map(fn, obj, leaf_type=Tensor):
    """obj with fn applied to every leaf of `leaf_type` inside tuples, lists and dicts."""
    if isinstance(obj, leaf_type):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(tree_map(fn, item, leaf_type) for item in obj)
    if isinstance(obj, dict):
        return {k: tree_map(fn, v, leaf_type) for k, v in obj.items()}
    return obj


def flatten(obj) -> list[Tensor]:
    found: list[Tensor] = []
    tree_map(found.append, obj)
    return found
