"""One model-wide value fitted on a grid, as the calibration scripts that fit one do (calibrate_memory.py,
calibrate_host.py; tests/helpers.grid_leave_one_out for a system's parameters): the grid row with the smallest
mean |error|, each run's leave-one-out error on that rule, and writing the fitted constant into the model's
source (`NAME = value` at the start of a line)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np


def best_row(err: np.ndarray) -> int:
    """The grid row (rows: grid values, columns: runs; signed % errors) with the smallest mean |error|, the first
    one on ties."""
    return int(np.argmin(np.round(np.mean(np.abs(err), axis=1), 9)))


def held_out(err: np.ndarray) -> np.ndarray:
    """Each run's error at the grid row fitted on the other runs (leave-one-out)."""
    return np.array([err[best_row(np.delete(err, j, axis=1)), j] for j in range(err.shape[1])])


def set_constant(path: Path, name: str, value: str) -> int:
    """Replace the one `name = <number>` line of `path` by `name = value`; 0, or 2 (with a message) when the
    file has no such line or several."""
    text = path.read_text()
    new, n = re.subn(rf"^{re.escape(name)} = [0-9.eE+-]+", f"{name} = {value}", text, flags=re.M)
    if n != 1:
        print(f"{'no' if n == 0 else 'more than one'} {name} line in {path}", file=sys.stderr)
        return 2
    path.write_text(new)
    print(f"wrote {path}")
    return 0
