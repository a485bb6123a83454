"""Byte counts as people read them: `format_bytes(3.6 * 2**20) == '3.6 MiB'`, `parse_bytes('80GB')`.

The one place that turns sizes into text and back; every other module (tape, ledger, plots, the
command line, lessons, benchmarks) calls these; a device's capacity is read here too (`parse_capacity`).
Imports nothing.
"""

from __future__ import annotations

import math
import numbers
import re

_BINARY = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"))
_DECIMAL = (1000, ("B", "kB", "MB", "GB", "TB", "PB"))
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def format_bytes(n: float, decimal: bool = False, digits: int = 1) -> str:
    """'24.0 GiB' (binary, default) or '25.8 GB' (decimal=True); plain 'B' below one unit."""
    base, units = _DECIMAL if decimal else _BINARY
    sign, x = ("-" if n < 0 else ""), abs(n)
    i = 0
    while x >= base and i < len(units) - 1:
        x, i = x / base, i + 1
    return f"{sign}{int(x)} B" if i == 0 else f"{sign}{x:.{digits}f} {units[i]}"


def parse_bytes(text) -> int:
    """Bytes from '80GB' (10^9), '80GiB' (2^30), '40e9', '512 MiB' or a plain number."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size: use a number of bytes with an optional unit, e.g. 80GB, 80GiB, 40e9"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def parse_capacity(value, who: str = "Ledger: capacity_bytes") -> int | None:
    """A capacity as given to Ledger (or to `who`): None (no limit), a positive number of bytes or a size such as
    '80GB'."""
    if value is None:
        return None
    wanted = "a positive number of bytes or a size such as '80GB' or '74.5 GiB'"
    if not (isinstance(value, (numbers.Real, str)) and not isinstance(value, bool)):
        raise TypeError(f"{who} must be {wanted}, got {value!r}")
    try:
        size = parse_bytes(value) if isinstance(value, str) else value
    except (ValueError, OverflowError):  # OverflowError: '1e400GB' is an infinite float
        raise ValueError(f"{who} must be {wanted} (None for no limit), got {value!r}") from None
    if not 1 <= size < math.inf:  # NaN fails too; None (not inf) means no limit
        raise ValueError(f"{who} must be {wanted} (None for no limit), got {value!r}")
    return int(size)
