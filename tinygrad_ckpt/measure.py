"""One steady-state training step, measured: what `tinygrad-ckpt estimate` and lesson 9 report.

    step = SteadyStep(GPTShape(n_layer=32, d_model=4096, n_head=32, seq_len=2048, batch=4, dtype="float16"))
    led, seconds = step.measure("every_layer")        # a Ledger of one forward, backward, optimizer step

The GPT is built (on the meta backend by default: shapes and dtypes, no data, so a 7B model takes
seconds) and one training step is taken first: it creates the optimizer's states, as the first step
of any run does. `measure(checkpoint)` sets the checkpoint plan and runs one more step (forward,
backward, optimizer step, zero_grad) under a Ledger: the step a long run repeats. A meta model has
no data, so changing the plan between measurements changes nothing else.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from . import backend, nn, optim
from .checkpoint import korthikanti_selective
from .estimate import GPTShape
from .ledger import Ledger


@contextlib.contextmanager
def using_backend(name: str):
    """Switch the active backend for a `with` block, then back."""
    previous = backend.current().name
    backend.use_backend(name)
    try:
        yield
    finally:
        backend.use_backend(previous)


class SteadyStep:
    """A GPT of `shape` and its optimizer ("adamw", "sgd" or "none"), one training step already taken."""

    def __init__(self, shape: GPTShape, optimizer: str = "adamw", state_dtype=np.float32, backend_name="meta"):
        if optimizer not in ("adamw", "sgd", "none"):
            raise ValueError(f"SteadyStep: optimizer must be 'adamw', 'sgd' or 'none', got {optimizer!r}")
        self.shape, self.backend_name = shape, backend_name
        with using_backend(backend_name):
            backend.manual_seed(0)
            self.model = nn.GPT(shape.vocab_size, shape.block_size, shape.n_layer, shape.n_head, shape.d_model,
                                dropout=shape.dropout)
            if shape.dtype != "float32":
                self.model.to(np.dtype(shape.dtype))
            params = self.model.parameters()
            self.opt = {"adamw": lambda: optim.AdamW(params, state_dtype=state_dtype),
                        "sgd": lambda: optim.SGD(params, lr=0.1), "none": lambda: None}[optimizer]()
            self.idx = backend.xp().zeros((shape.batch, shape.seq_len), dtype=np.int64)
            if self.opt is not None:
                self._step()
                self.opt.zero_grad()

    def _step(self) -> None:
        _, loss = self.model(self.idx, self.idx)
        loss.backward()
        if self.opt is not None:
            self.opt.step()

    def measure(self, checkpoint=None) -> tuple[Ledger, float]:
        """(ledger, seconds) of one step with `checkpoint`: None or "none", "every_layer", "sqrt", a number of
        segments, "selective" (Korthikanti's policy in every block), a Policy or a planner Plan."""
        self.model.checkpoint = {"none": None, "selective": korthikanti_selective}.get(checkpoint, checkpoint) \
            if isinstance(checkpoint, str) else checkpoint
        with using_backend(self.backend_name):
            t0 = time.perf_counter()
            with Ledger() as led:
                self._step()
                if self.opt is not None:
                    with led.phase("optimizer"):  # zero_grad frees the gradients: part of the optimizer's turn
                        self.opt.zero_grad()
            return led, time.perf_counter() - t0
