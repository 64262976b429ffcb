"""The one way a golden file of the tests is written or checked: by the script that computes it, the diff
reviewed. `--check` prints each difference and exits 1 when the file is stale."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_or_check(
    path: Path, fresh: dict, check: bool, script: str, differences: Callable[[dict, dict], list[str]]
) -> int:
    """Write `fresh` to `path` as JSON, or (`check`) compare it with the stored file through `differences`
    (stored, fresh) and print each difference; the exit code (1: stale)."""
    rel = path.relative_to(ROOT)
    if check:
        diff = differences(json.loads(path.read_text()) if path.is_file() else {}, fresh)
        for line in diff:
            print("DIFF", line)
        print(f"{rel}: {f'stale, run scripts/{script}' if diff else 'current'}")
        return 1 if diff else 0
    path.write_text(json.dumps(fresh, indent=2) + "\n")
    print(f"wrote {rel}")
    return 0
