#!/usr/bin/env python3
"""Regenerate tests/golden/solve.json: the CP-SAT optimum of each problem in problems/ (default.yaml and
studies/solve/). Review the diff before committing: a changed objective is a change of the model.

    python scripts/regen_golden.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.io.loader import load_problem  # noqa: E402
from optimizer.drivers.solve import solve  # noqa: E402

PROBLEMS = ["default.yaml", "studies/solve/gpt3-175b-1024xh100.yaml", "studies/solve/gpt3-175b-4096xa100.yaml",
            "studies/solve/gpt3-175b-upto6144xa100.yaml", "studies/solve/gpt3-175b-1024xh100-precision.yaml"]


def main() -> int:
    out = {}
    for rel in PROBLEMS:
        r = solve(load_problem(ROOT / "problems" / rel), "cpsat")
        out[rel] = {"status": r.status, "objective_s": round(r.plans[0].objective_s, 9),
                    "bound_s": round(r.bound_s, 9), "candidates": r.candidates}
        print(rel, out[rel])
    path = ROOT / "tests" / "golden" / "solve.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
