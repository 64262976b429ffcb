#!/usr/bin/env python3
"""Regenerate tests/golden/oracle_optima.json: the exhaustive oracle's optimum (formulations/enumerate.py,
every candidate of the space through the vectorised model) of each case in tests/oracle_cases.py. The fast
test compares CP-SAT with these stored optima; the slow test enumerates afresh and checks this file is
current. Review the diff before committing: a changed optimum is a change of the model.

    python scripts/regen_oracle.py            # rewrite the file
    python scripts/regen_oracle.py --check    # exit 1 (and print the differences) when the file is stale

Stored per case: the goal, the optimum's step time (objective_s, seconds, rounded to 1 ns), GPUs it uses, the
size of the space (candidates) and how many fit in memory (feasible_candidates), and the optimal execution
(the enumerator breaks ties by candidate order, so it is reproducible).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from golden_file import write_or_check  # noqa: E402
from test_modules import load  # noqa: E402

CASES = load("oracle_cases").CASES

from optimizer.drivers.solve import solve  # noqa: E402
from optimizer.io.loader import load_problem  # noqa: E402
from optimizer.prepare.objective import gpus_used  # noqa: E402

PATH = ROOT / "tests" / "golden" / "oracle_optima.json"
REL_TOL = 1e-9  # objective_s: the same model on another platform may differ in the last bits


def enumerate_case(name: str, text: str) -> dict:
    """The enumerated optimum of one case (its YAML text), as stored in the file."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(text)
        p = load_problem(path)
    e = solve(p, "enumerate")
    ex = e.plans[0].evaluation.execution
    return {
        "goal": p.objective.goal.value,
        "objective_s": round(e.plans[0].objective_s, 9),
        "gpus_used": gpus_used(ex),
        "candidates": e.candidates,
        "feasible_candidates": e.feasible_candidates,
        "execution": ex.model_dump(mode="json"),
    }


def enumerate_all(names: list[str] | None = None) -> dict:
    return {n: enumerate_case(n, CASES[n]) for n in (names or list(CASES))}


def differences(stored: dict, fresh: dict) -> list[str]:
    """Where the stored optima differ from fresh ones: objective_s beyond REL_TOL, anything else at all."""
    out = []
    for name in sorted(set(stored) | set(fresh)):
        if name not in fresh:
            out.append(f"{name}: stored but no longer a case")
            continue
        if name not in stored:
            out.append(f"{name}: missing from {PATH.name}")
            continue
        s, f = stored[name], fresh[name]
        for key in sorted(set(s) | set(f)):
            a, b = s.get(key), f.get(key)
            same = abs(a - b) <= REL_TOL * abs(b) if key == "objective_s" and None not in (a, b) else a == b
            if same:
                continue
            if isinstance(a, dict) and isinstance(b, dict):  # the execution: name only the knobs that differ
                out += [
                    f"{name}.{key}.{k}: stored {a.get(k)!r}, enumerated {b.get(k)!r}"
                    for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)
                ]
            else:
                out.append(f"{name}.{key}: stored {a!r}, enumerated {b!r}")
    return out


def load() -> dict:
    return json.loads(PATH.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--check", action="store_true", help="compare with the stored file; exit 1 on a difference"
    )
    args = ap.parse_args(argv)
    fresh = {}
    for name, text in CASES.items():
        fresh[name] = enumerate_case(name, text)
        print(name, {k: v for k, v in fresh[name].items() if k != "execution"}, flush=True)
    return write_or_check(PATH, fresh, args.check, "regen_oracle.py", differences)


if __name__ == "__main__":
    sys.exit(main())
