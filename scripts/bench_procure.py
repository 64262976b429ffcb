"""Benchmark of `paraplan procure` (issue 5): proven-optimal purchases from catalogs of node types.

    python scripts/bench_procure.py [--json]

Cases: the 8-node-type catalog problems/catalogs/gpus-2025.yaml (A100 40/80, H100 80 (and with 512 GiB of
host offload memory), H100 96, H200, B200, MI300X) under a $40M budget with heterogeneous mixes allowed, and
the 16 Study 5 node variants for GPT-3 175B, and the first with its Pareto front of cost against time
(10 budgets, each point a proven optimum). Prints the size of the space searched (candidates of every
per-type sub-problem) and the solve time, one run each (whole procure call, after imports).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.io.loader import load_procure  # noqa: E402
from optimizer.drivers.procure import procure  # noqa: E402

CASES = {  # name: (problem, with the Pareto front)
    "gpt3-175b-40musd-8types-mix": ("problems/studies/procure/gpt3-175b-40musd-mix.yaml", False),
    "study5-175b-16variants": ("problems/studies/procure/study5-175b.yaml", False),
    "gpt3-175b-40musd-8types-pareto": ("problems/studies/procure/gpt3-175b-40musd-mix.yaml", True),
    "llama70b-pipeline-mix-wins": ("problems/studies/procure/llama70b-pipeline-mix-wins.yaml", False),
    "llama70b-pipeline-mix-loses": ("problems/studies/procure/llama70b-pipeline-mix-loses.yaml", False),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = []
    for name, (path, pareto) in CASES.items():
        pp = load_procure(ROOT / path)
        t0 = time.perf_counter()
        r = procure(pp, pareto=pareto)
        dt = time.perf_counter() - t0
        out.append({"name": name, "space": r.candidates, "solve_s": round(dt, 3), "status": r.status,
                    "node_types": len(pp.catalog.node_types), "best": r.best.label() if r.best else None,
                    "mixes": r.mixes_considered, "pareto_points": len(r.pareto or [])})
    if a.json:
        print(json.dumps({"cases": out}, indent=2))
        return 0
    print(f"{'case':32s} {'types':>5s} {'space':>15s} {'solve_s':>8s} {'status':>8s}  best")
    for c in out:
        print(f"{c['name']:32s} {c['node_types']:5d} {c['space']:15,d} {c['solve_s']:8.2f} {c['status']:>8s}  {c['best']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
