"""glibc keeps freed arrays for the next step once tinygrad_ckpt is imported (backend/allocator.py): a
loop that fills and frees 64 MiB in 2 MiB arrays faults its pages in once, not on every round."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("tune", ["1", "0"])
def test_import_says_what_process_wide_settings_it_changed_and_can_be_told_not_to(tune):
    code = ("import os, tinygrad_ckpt as tg; from tinygrad_ckpt import backend, state; "
            "print(sorted(state.process_settings), os.environ.get('OPENBLAS_THREAD_TIMEOUT'), "
            "backend.KEEPS_FREED_MEMORY)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={**env, "TINYGRAD_CKPT_TUNE": tune}).stdout.strip()
    if tune == "0":
        assert out == "[] None False"
    else:
        glibc = sys.platform.startswith("linux")
        assert out == (f"{['OPENBLAS_THREAD_TIMEOUT', 'malloc'] if glibc else ['OPENBLAS_THREAD_TIMEOUT']} 14 {glibc}")
