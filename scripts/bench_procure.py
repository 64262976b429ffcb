"""Benchmark of `paraplan procure`: proven-optimal purchases from catalogs of node types.

    python scripts/bench_procure.py [--json] [--quick]

Cases: the 8-node-type catalog problems/catalogs/gpus-2025.yaml (A100 40/80, H100 80 (and with 512 GiB of
host offload memory), H100 96, H200, B200, MI300X) under a $40M budget with heterogeneous mixes allowed, and
the 16 Study 5 node variants for GPT-3 175B, and the first with its Pareto front of cost against time
(10 budgets, each point a proven optimum). Prints the size of the space searched (candidates of every
per-type sub-problem) and the solve time, one run each (whole procure call, after imports). Exit 1 when a case
finds no purchase, or when the pipelined-mix cases do not end as their names say (a mix wins, a single type
wins). --quick: one small catalog (one or two nodes of H200 and of H100 80 GB, Llama 3.1 8B) with its Pareto
front, a smoke test of seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.drivers.procure import procure  # noqa: E402
from optimizer.io.loader import load_procure  # noqa: E402

CASES = {  # name: (problem, with the Pareto front, the best purchase expected: "mix", "single" or None)
    "gpt3-175b-40musd-8types-mix": ("problems/studies/procure/gpt3-175b-40musd-mix.yaml", False, None),
    "study5-175b-16variants": ("problems/studies/procure/study5-175b.yaml", False, None),
    "gpt3-175b-40musd-8types-pareto": ("problems/studies/procure/gpt3-175b-40musd-mix.yaml", True, None),
    "llama70b-pipeline-mix-wins": ("problems/studies/procure/llama70b-pipeline-mix-wins.yaml", False, "mix"),
    "llama70b-pipeline-mix-loses": (
        "problems/studies/procure/llama70b-pipeline-mix-loses.yaml",
        False,
        "single",
    ),
}
QUICK_CASE = "llama8b-2types-pareto"
QUICK_PROBLEM = """name: llama8b-2types
llm: llama3.1-8b
catalog:
  name: two-types
  node_types:
    - {name: h200, system: h200-sxm-141gb, price_usd: 330000, power_kw: 10.2, max_nodes: 2}
    - {name: h100-80g, system: h100-sxm-80gb, price_usd: 280000, power_kw: 10.2, max_nodes: 2}
training: {global_batch: 64, precision: bf16, tokens: 10.0e+9}
procure: {goal: throughput, pricing: capex, budget_usd: 1.0e+6}
"""


def run_case(name: str, path: Path, pareto: bool) -> dict:
    pp = load_procure(path)
    t0 = time.perf_counter()
    r = procure(pp, pareto=pareto)
    dt = time.perf_counter() - t0
    return {
        "name": name,
        "space": r.candidates,
        "solve_s": round(dt, 3),
        "status": r.status,
        "node_types": len(pp.catalog.node_types),
        "best": r.best.label() if r.best else None,
        "mixes": r.mixes_considered,
        "pareto_points": len(r.pareto or []),
    }


def failures(rows: list[dict], expect: dict[str, str | None]) -> list[str]:
    """A case with no purchase, or whose best purchase is not the kind its name promises (a mix of node types,
    whose label joins its groups with ' + ', or a single type)."""
    out = []
    for r in rows:
        if r["best"] is None:
            out.append(f"{r['name']}: no purchase ({r['status']})")
        elif expect.get(r["name"]) and (" + " in r["best"]) != (expect[r["name"]] == "mix"):
            out.append(
                f"{r['name']}: best purchase {r['best']}, expected a {expect[r['name']]} of node types"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--quick", action="store_true", help="one small catalog with its Pareto front (a smoke test)"
    )
    a = ap.parse_args(argv)
    if a.quick:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{QUICK_CASE}.yaml"
            path.write_text(QUICK_PROBLEM)
            out = [run_case(QUICK_CASE, path, True)]
    else:
        out = [run_case(name, ROOT / path, pareto) for name, (path, pareto, _) in CASES.items()]
    bad = failures(out, {name: c[2] for name, c in CASES.items()})
    for msg in bad:
        print(f"FAILED: {msg}", file=sys.stderr)
    if a.json:
        print(json.dumps({"cases": out}, indent=2))
        return 1 if bad else 0
    print(f"{'case':32s} {'types':>5s} {'space':>15s} {'solve_s':>8s} {'status':>8s}  best")
    for c in out:
        print(
            f"{c['name']:32s} {c['node_types']:5d} {c['space']:15,d} {c['solve_s']:8.2f}"
            f" {c['status']:>8s}  {c['best']}"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
