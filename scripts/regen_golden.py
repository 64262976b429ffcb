#!/usr/bin/env python3
"""Regenerate tests/golden/solve.json: the CP-SAT optimum of each problem in problems/ (default.yaml and
studies/solve/). Review the diff before committing: a changed objective is a change of the model.

    python scripts/regen_golden.py            # rewrite the file
    python scripts/regen_golden.py --check    # exit 1 (and print the differences) when the file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from golden_file import write_or_check  # noqa: E402

from optimizer.drivers.solve import solve  # noqa: E402
from optimizer.io.loader import load_problem  # noqa: E402

PROBLEMS = [
    "default.yaml",
    "studies/solve/gpt3-175b-1024xh100.yaml",
    "studies/solve/gpt3-175b-4096xa100.yaml",
    "studies/solve/gpt3-175b-upto6144xa100.yaml",
    "studies/solve/gpt3-175b-1024xh100-precision.yaml",
]


PATH = ROOT / "tests" / "golden" / "solve.json"
REL_TOL = 1e-9  # the times: the same model on another platform may differ in the last bits


def differences(stored: dict, fresh: dict) -> list[str]:
    """Where the stored solves differ from fresh ones: times beyond REL_TOL, anything else at all."""
    out = []
    for rel in sorted(set(stored) | set(fresh)):
        s, f = stored.get(rel, {}), fresh.get(rel, {})
        for key in sorted(set(s) | set(f)):
            a, b = s.get(key), f.get(key)
            close = isinstance(a, float) and isinstance(b, float) and abs(a - b) <= REL_TOL * abs(b)
            if a != b and not close:
                out.append(f"{rel}.{key}: stored {a!r}, solved {b!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="compare with the stored file; exit 1 on a difference"
    )
    args = ap.parse_args(argv)
    out = {}
    for rel in PROBLEMS:
        r = solve(load_problem(ROOT / "problems" / rel), "cpsat")
        out[rel] = {
            "status": r.status,
            "objective_s": round(r.plans[0].objective_s, 9),
            "bound_s": round(r.bound_s, 9),
            "candidates": r.candidates,
        }
        print(rel, out[rel])
    return write_or_check(PATH, out, args.check, "regen_golden.py", differences)


if __name__ == "__main__":
    sys.exit(main())
