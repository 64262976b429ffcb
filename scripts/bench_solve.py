#!/usr/bin/env python3
"""CP-SAT against the exhaustive enumerator, side by side in one run (issue 3, item 6).

    python scripts/bench_solve.py [--json] [--repeat 5] [--case NAME ...]

Cases (problems/studies/solve/): GPT-3 175B on 1024 H100 and on 4096 A100 with every knob free, and GPT-3
175B on up to 6144 A100 with idle GPUs allowed (a space of 2.4e7 candidates), and the 1024-H100 case with the
precision open (BF16, FP8, FP8 current scaling: one proven solve each, candidates summed). Per case: the size of the
candidate space, CP-SAT wall time (median of --repeat runs; space, tables, presolve, model build and solve
included, the problem file already loaded), the enumerator's wall time (one run), their ratio, and whether
the optima agree within 0.1%. Targets: CP-SAT median <= 1 s per case on 2 cores, >= 10x faster than the
enumerator on the >= 1e7-candidate case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.io.loader import load_problem  # noqa: E402
from optimizer.drivers.solve import solve  # noqa: E402

CASES = ["gpt3-175b-1024xh100", "gpt3-175b-4096xa100", "gpt3-175b-upto6144xa100", "gpt3-175b-1024xh100-precision"]


def run_case(name: str, repeat: int) -> dict:
    p = load_problem(ROOT / "problems" / "studies" / "solve" / f"{name}.yaml")
    solve(p, "cpsat")  # warm imports
    times, c = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        c = solve(p, "cpsat")
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    e = solve(p, "enumerate")
    te = time.perf_counter() - t0
    cs = statistics.median(times)
    same = abs(c.plans[0].objective_s - e.plans[0].objective_s) <= 1e-3 * e.plans[0].objective_s
    return {"name": name, "candidates": e.candidates, "cpsat_s": round(cs, 4), "enumerate_s": round(te, 3),
            "ratio": round(te / cs, 1), "same_optimum": bool(same), "status": c.status,
            "step_time_s": round(c.plans[0].objective_s, 6)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--case", nargs="*", default=CASES)
    a = ap.parse_args()
    rows = [run_case(n, a.repeat) for n in a.case]
    if a.json:
        print(json.dumps({"cases": [{k: r[k] for k in ("name", "candidates", "cpsat_s", "enumerate_s", "ratio",
                                                        "same_optimum")} for r in rows]}))
        return 0
    print(f"{'case':26s} {'candidates':>12s} {'cpsat_s':>8s} {'enum_s':>8s} {'ratio':>7s} {'same':>5s} step_time_s")
    for r in rows:
        print(f"{r['name']:26s} {r['candidates']:>12,d} {r['cpsat_s']:>8.3f} {r['enumerate_s']:>8.2f} "
              f"{r['ratio']:>7.1f} {str(r['same_optimum']):>5s} {r['step_time_s']:.4f} ({r['status']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
