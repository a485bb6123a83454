"""The float32 erf's error over every float32 from 0 to inf (erf is odd, and the evaluation is too: the
negative half is checked bit for bit against the positive), against SciPy's erf in float64, and where
it becomes exactly 1; then the float32 GELU's largest error over every float32 in [-14, 14]. A few minutes:
`python benchmarks/erf_every_float32.py`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from scipy.special import erf  # noqa: E402

from tinygrad_ckpt.backend.erf import erf_float32, gelu_float32  # noqa: E402

SMALLEST_NORMAL = np.finfo(np.float32).tiny


def main() -> None:
    top = int(np.array([np.inf], np.float32).view(np.int32)[0])
    last_below_one = 0.0
    worst_abs = worst_rel = 0.0
    at_abs = at_rel = 0.0
    step = 1 << 24
    for lo in range(0, top + 1, step):
        x = np.arange(lo, min(lo + step, top + 1), dtype=np.int32).view(np.float32)
        got = erf_float32(x)
        assert np.array_equal(erf_float32(-x), -got), "not odd"
        ref = erf(x.astype(np.float64))
        err = np.abs(got.astype(np.float64) - ref)
        below = np.nonzero(got < 1)[0]
        if below.size:
            last_below_one = float(x[below[-1]])
        i = int(err.argmax())
        if err[i] > worst_abs:
            worst_abs, at_abs = float(err[i]), float(x[i])
        normal = ref >= SMALLEST_NORMAL  # subnormal results cannot be relatively accurate in float32
        if normal.any():
            rel = err[normal] / ref[normal]
            j = int(rel.argmax())
            if rel[j] > worst_rel:
                worst_rel, at_rel = float(rel[j]), float(x[normal][j])
    one_from = float(np.nextafter(np.float32(last_below_one), np.float32(np.inf)))
    print(f"every float32 in [0, inf]: max |error| {worst_abs:.3g} at x = {at_abs:.7g}; "
          f"max relative error (normal results) {worst_rel:.3g} at x = {at_rel:.7g}; "
          f"exactly 1 from x = {one_from:.7g} on")


def gelu_every() -> None:
    top = int(np.array([14.0], np.float32).view(np.int32)[0])
    worst, at = 0.0, 0.0
    step = 1 << 24
    for sign in (1, -1):
        for lo in range(0, top + 1, step):
            x = sign * np.arange(lo, min(lo + step, top + 1), dtype=np.int32).view(np.float32)
            got = gelu_float32(x, np.empty_like(x))
            x64 = x.astype(np.float64)
            err = np.abs(got - 0.5 * x64 * (1 + erf(x64 / np.sqrt(2))))
            i = int(err.argmax())
            if err[i] > worst:
                worst, at = float(err[i]), float(x[i])
    print(f"gelu_float32, every float32 in [-14, 14]: max |error| {worst:.3g} at x = {at:.7g}")


if __name__ == "__main__":
    main()
    gelu_every()
