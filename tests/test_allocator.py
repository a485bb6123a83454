"""glibc keeps freed arrays for the next step once tinygrad_ckpt is imported (backend/allocator.py): a
loop that fills and frees 64 MiB in 2 MiB arrays faults its pages in once, not on every round."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOOP = """
import resource, sys
if sys.argv[1] == "engine":
    import tinygrad_ckpt
    from tinygrad_ckpt import backend
    assert backend.KEEPS_FREED_MEMORY
import numpy as np
def round_():
    arrays = [np.ones(1 << 18) for _ in range(32)]  # 32 x 2 MiB, every page written
    del arrays
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", LOOP, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc thresholds are Linux-only")
def test_freed_arrays_are_reused_without_page_faults():
    plain, engine = _faults("plain"), _faults("engine")
    pages = 5 * 64 * 2**20 // 4096  # what five rounds touch
    assert plain > pages / 2  # glibc's defaults: the pages go back to the kernel and fault in again
    assert engine < pages / 50
