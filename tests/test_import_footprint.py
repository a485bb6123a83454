"""What `import tinygrad_ckpt` loads and what a plain step runs: the learner's engine and the segment operator, not
the wings above them (scale, torch_bridge, app) nor the allocator simulation; every tg.* name still works."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg

WINGS_NOT_LOADED = ("tinygrad_ckpt.scale", "tinygrad_ckpt.torch_bridge", "tinygrad_ckpt.app",
                    "tinygrad_ckpt.memory.cuda_allocator", "tinygrad_ckpt.backend.meta")


def _fresh(code: str) -> list[str]:
    """Run `code` in a fresh interpreter; the package modules it loaded."""
    code += "\nimport sys, json; print(json.dumps(sorted(m for m in sys.modules if m.startswith('tinygrad_ckpt'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_loads_no_wing_above_the_segment_operator():
    loaded = _fresh("import tinygrad_ckpt")
    assert not [m for m in loaded if m.startswith(WINGS_NOT_LOADED)], loaded
    assert "tinygrad_ckpt.engine.tensor" in loaded and "tinygrad_ckpt.recompute.checkpoint" in loaded


def test_a_ledger_without_an_allocator_loads_no_allocator_simulation():
    loaded = _fresh("import tinygrad_ckpt as tg\nwith tg.Ledger() as led:\n    tg.Tensor([1.0]) * 2")
    assert "tinygrad_ckpt.memory.ledger" in loaded and "tinygrad_ckpt.memory.cuda_allocator" not in loaded


def test_every_public_name_resolves():
    for name in tg.__all__:
        assert getattr(tg, name) is not None, name
    from tinygrad_ckpt import debug, functional, nn, optim, plots  # noqa: F401
    assert plots.__name__ == "tinygrad_ckpt.memory.plots"


def test_the_bridge_is_reached_by_its_old_name():
    pytest.importorskip("torch", reason=TORCH_MISSING)
    from tinygrad_ckpt import torch_bridge, torch_plans

    assert torch_bridge.__name__ == "tinygrad_ckpt.torch_bridge" and torch_plans is torch_bridge.plans


def test_an_unknown_name_is_an_attribute_error():
    try:
        tg.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("tg.no_such_name did not raise")


def test_a_plain_gpt_step_runs_no_planner_code():
    code = """
import sys, numpy as np
import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
model = nn.GPT(32, 8, 2, 2, 16)
idx = np.zeros((1, 8), dtype=np.int64)
ran = set()
def profile(frame, event, arg):
    if event == "call":
        ran.add(frame.f_code.co_filename)
sys.setprofile(profile)
_, loss = model(idx, idx)
loss.backward()
sys.setprofile(None)
print(sorted(f.split("tinygrad_ckpt")[-1] for f in ran if "tinygrad_ckpt" in f))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ran = done.stdout
    assert "planner" not in ran and "checkpoint" not in ran and "ledger" not in ran, ran
    assert "tensor.py" in ran
