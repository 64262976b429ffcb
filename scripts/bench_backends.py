#!/usr/bin/env python3
"""CP-SAT against the Pyomo MILP solved by HiGHS side by side in one run.

    python scripts/bench_backends.py [--json] [--case NAME ...] [--quick]

Cases: the bench cases of scripts/bench_solve.py (problems/studies/solve/). Per case, one run of each
backend after a warm-up (space, tables, presolve, model build and solve included, the problem file already
loaded; for pyomo also writing the MPS file and the HiGHS worker process, formulations/highs_worker.py), and
whether the optima agree within 0.1% (exit 1 when they do not). JSON: {"cases": [{"name", "cpsat_s",
"pyomo_s", "same_optimum"}]}. --quick: the same on one small problem (Llama 3.1 8B on 8 H100), a smoke test of
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.drivers.solve import solve  # noqa: E402
from optimizer.io.loader import load_problem  # noqa: E402

CASES = ["gpt3-175b-1024xh100", "gpt3-175b-4096xa100", "gpt3-175b-upto6144xa100"]
QUICK_CASE = "llama3.1-8b-8xh100"
QUICK_PROBLEM = (
    "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 64, precision: bf16}\n"
)


def run_case(name: str, path: Path | None = None) -> dict:
    p = load_problem(path or ROOT / "problems" / "studies" / "solve" / f"{name}.yaml")
    solve(p, "cpsat")  # warm imports
    solve(p, backend="pyomo")
    t0 = time.perf_counter()
    c = solve(p, "cpsat")
    tc = time.perf_counter() - t0
    t0 = time.perf_counter()
    h = solve(p, backend="pyomo")
    th = time.perf_counter() - t0
    same = abs(c.plans[0].objective_s - h.plans[0].objective_s) <= 1e-3 * c.plans[0].objective_s
    return {
        "name": name,
        "cpsat_s": round(tc, 4),
        "pyomo_s": round(th, 4),
        "same_optimum": bool(same),
        "cpsat_status": c.status,
        "pyomo_status": h.status,
        "step_time_s": round(c.plans[0].objective_s, 6),
        "pyomo_step_time_s": round(h.plans[0].objective_s, 6),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--case", nargs="*", default=CASES)
    ap.add_argument("--quick", action="store_true", help="one small problem (a smoke test)")
    a = ap.parse_args(argv)
    if a.quick:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{QUICK_CASE}.yaml"
            path.write_text(QUICK_PROBLEM)
            rows = [run_case(QUICK_CASE, path)]
    else:
        rows = [run_case(n) for n in a.case]
    bad = [r["name"] for r in rows if not r["same_optimum"]]
    if bad:
        print(f"FAILED: CP-SAT and Pyomo/HiGHS disagree on the optimum of {', '.join(bad)}", file=sys.stderr)
    if a.json:
        print(json.dumps({"cases": rows}, indent=1))
        return 1 if bad else 0
    print(f"{'case':28} {'CP-SAT s':>9} {'Pyomo/HiGHS s':>14}  same optimum")
    for r in rows:
        print(
            f"{r['name']:28} {r['cpsat_s']:9.3f} {r['pyomo_s']:14.3f}  "
            f"{'yes' if r['same_optimum'] else 'NO'} "
            f"({r['step_time_s']:.4f} s; {r['cpsat_status']}/{r['pyomo_status']})"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
