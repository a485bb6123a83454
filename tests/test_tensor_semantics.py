"""Tensors behave as a NumPy or PyTorch user expects (issue 27, point 5): grad mode in generators and coroutines.

Expected values come from NumPy on the raw arrays or from PyTorch (when installed), never from the engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import tinygrad_ckpt as tg

try:
    import torch
except ImportError:
    torch = None


def leaf(*shape, dtype=np.float64, seed=0):
    return tg.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), requires_grad=True)


# ---- grad mode in generators and coroutines -------------------------------------------------------------------------
def test_no_grad_on_a_generator_holds_inside_each_resumption_only():
    @tg.no_grad()
    def gen():
        got = yield tg.is_grad_enabled()
        while got is not None:
            got = yield (tg.is_grad_enabled(), got)
        return "done"

    steps = gen()
    assert tg.is_grad_enabled()
    assert next(steps) is False
    assert tg.is_grad_enabled()  # the caller's mode between resumptions
    assert steps.send(5) == (False, 5)
    assert tg.is_grad_enabled()
    with pytest.raises(StopIteration) as stop:
        steps.send(None)
    assert stop.value.value == "done" and tg.is_grad_enabled()


def test_a_decorated_generator_records_nothing_and_sees_thrown_exceptions_inside_its_mode():
    x = leaf(3)

    @tg.no_grad()
    def doubled(t):
        try:
            while True:
                t = t * 2.0
                yield t
        except KeyError:
            yield tg.is_grad_enabled()

    steps = doubled(x)
    assert not next(steps).requires_grad
    assert steps.throw(KeyError()) is False
    steps.close()
    assert tg.is_grad_enabled()

    @tg.enable_grad()
    def recording(t):
        yield t * 2.0

    with tg.no_grad():
        assert next(recording(x)).requires_grad


def test_no_grad_on_a_coroutine_holds_across_awaits_and_not_outside():
    seen = []

    @tg.no_grad()
    async def quiet():
        for _ in range(3):
            seen.append(("quiet", tg.is_grad_enabled()))
            await asyncio.sleep(0)
        return "quiet done"

    @tg.enable_grad()
    async def loud():
        for _ in range(3):
            seen.append(("loud", tg.is_grad_enabled()))
            await asyncio.sleep(0)

    async def main():
        with tg.no_grad():
            return await asyncio.gather(quiet(), loud())

    assert asyncio.run(main())[0] == "quiet done"
    assert {("quiet", False), ("loud", True)} == set(seen) and len(seen) == 6
    assert tg.is_grad_enabled()


def test_a_decorated_function_keeps_its_name_and_value():
    @tg.no_grad()
    def double(t):
        """Doubles."""
        return t * 2.0

    out = double(leaf(2))
    assert not out.requires_grad and double.__name__ == "double" and double.__doc__ == "Doubles."
    assert tg.is_grad_enabled()


def test_set_grad_enabled_as_a_call_a_block_and_a_decorator():
    assert tg.is_grad_enabled()
    tg.set_grad_enabled(False)
    try:
        assert not tg.is_grad_enabled() and not (leaf(2) * 2.0).requires_grad
        with tg.set_grad_enabled(True):
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
    finally:
        tg.set_grad_enabled(True)
    assert tg.is_grad_enabled()

    @tg.set_grad_enabled(False)
    def quiet():
        return tg.is_grad_enabled()

    assert tg.is_grad_enabled()  # decorating changes nothing until the function runs
    assert quiet() is False and tg.is_grad_enabled()
    if torch is not None:
        with torch.set_grad_enabled(False):
            assert not torch.is_grad_enabled()


def test_grad_mode_is_restored_after_an_error_and_a_reused_block_nests():
    with pytest.raises(ZeroDivisionError):
        with tg.no_grad():
            _ = 1 / 0
    assert tg.is_grad_enabled()
    block = tg.no_grad()
    with block:
        with tg.enable_grad():
            with block:
                assert not tg.is_grad_enabled()
            assert tg.is_grad_enabled()
        assert not tg.is_grad_enabled()
    assert tg.is_grad_enabled()
