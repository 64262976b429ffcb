"""`paraplan whatif`'s report as text: the step time (s) saved by +X% of each resource, and the robust
plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optimizer.drivers.whatif import WhatifResult
    from optimizer.schema import Problem


def render(problem: Problem, r: WhatifResult) -> str:
    out = [
        f"paraplan whatif: {problem.name or problem.llm.name}: fastest step {r.base_step_s:.4g} s; each "
        f"resource +{r.pct:g}% (a solve each):"
    ]
    fewest = problem.objective.goal.value == "fewest_gpus"
    for x in r.levers:
        if x.step_s is None:
            v = "nothing fits" if x.status == "infeasible" else "not evaluated: the time limit passed"
        elif fewest and x.gpus is not None:
            v = f"{x.gpus} GPUs ({x.step_s:.4g} s)  saves {x.saved_gpus} GPUs"
        else:
            v = f"{x.step_s:.4g} s  saves {x.saved_pct:5.1f}%"
            if x.name.startswith("GPUs") and x.saved_gpus == 0 and abs(x.saved_pct or 0.0) < 0.05:
                v += f" (its best plan still uses {x.gpus} GPUs: no layout on the added ones is faster)"
        if x.status == "feasible":
            v += " (the best found when the time limit passed, not proven)"
        out.append(f"  {x.name:40s} {v}")
    rb = r.robust
    if rb.robust_plan is None:
        out.append(
            f"robustness, efficiencies +-{100 * rb.band:g}%: the optimum's worst case "
            f"{rb.nominal_worst_s:.4g} s; no robust plan ({rb.status} at the all-low corner): {rb.note}"
        )
        return "\n".join(out)
    same = "it is also the robust choice"
    other = (
        f"robust choice worst case {rb.robust_worst_s:.4g} s (nominal {rb.robust_nominal_s:.4g} s), the "
        f"optimum's regret {rb.regret_s:.4g} s"
    )
    out.append(
        f"robustness, efficiencies +-{100 * rb.band:g}% (best worst case over the whole space, {rb.status}): "
        f"the optimum's worst case {rb.nominal_worst_s:.4g} s; " + (same if rb.robust_is_nominal else other)
    )
    return "\n".join(out)
