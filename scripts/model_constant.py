"""Set a fitted module-level constant (`NAME = value` at the start of a line) in one of the model's source files:
what the calibration scripts that fit a single model-wide value (calibrate_memory.py, calibrate_host.py) write."""

from __future__ import annotations

import re
import sys
from pathlib import Path


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
