"""Solve an MPS file with HiGHS (highspy) in a process of its own and print the result as JSON.

ortools bundles its own libhighs.so.1 with the same SONAME as highspy's but another HiGHS version: in one
process whichever is loaded first serves both and the other's extension fails to load (undefined symbol).
So `--backend pyomo` writes its Pyomo model as MPS and hands it to this worker, which imports highspy only.

    python -m formulations.highs_worker MODEL.mps TIME_LIMIT_S
    -> {"status": "Optimal", "objective": ..., "bound": ..., "values": {"w(3)": 1.0}}
"""

from __future__ import annotations

import json
import sys

MARKER = "paraplan-highs-result: "


def main(argv: list[str]) -> int:
    import highspy

    path, limit = argv[0], float(argv[1])
    h = highspy.Highs()
    for k, v in (
        ("output_flag", False),
        ("threads", 1),
        ("random_seed", 0),
        ("time_limit", limit),
        ("mip_rel_gap", 0.0),
        ("mip_abs_gap", 0.0),
    ):
        h.setOptionValue(k, v)
    h.readModel(path)
    h.run()
    st = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    out = {
        "status": st,
        "objective": info.objective_function_value if has else None,
        "bound": info.mip_dual_bound if has else None,
        "values": {},
    }
    if has:
        names = h.getLp().col_names_
        vals = h.getSolution().col_value
        out["values"] = {n: v for n, v in zip(names, vals, strict=False) if abs(v) > 1e-9}
    # HiGHS may print a banner on stdout before output_flag takes effect (highspy >= 1.12): the result is
    # the line after MARKER
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
