"""`paraplan solve`'s report: the plans of a `SolveResult` as a JSON object and as text (each plan's
evaluation, and its launch command for a framework with `emit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optimizer.drivers.solve import SolveResult
    from optimizer.schema import Problem


def result_dict(problem: Problem, r: SolveResult) -> dict:
    from optimizer.report.text import evaluation_dict

    return {
        "method": r.method,
        "status": r.status,
        "solve_time_s": r.seconds,
        "candidates": r.candidates,
        "feasible_candidates": r.feasible_candidates,
        "bound_step_time_s": r.bound_s,
        "gap": r.gap,
        "plans": [evaluation_dict(p.evaluation) | {"objective_step_time_s": p.objective_s} for p in r.plans],
        "notes": r.notes,
    }


def render(problem: Problem, r: SolveResult, emit: str | None = None) -> str:
    from optimizer.report.text import render_evaluation

    out = [
        f"paraplan solve ({r.method}): {r.status}; {r.candidates:,} candidates in the space"
        + (f", {r.feasible_candidates:,} fit" if r.feasible_candidates is not None else "")
        + f"; solved in {r.seconds:.3f} s"
    ]
    if r.bound_s is not None:
        out.append(
            f"best step time {r.plans[0].objective_s:.4f} s, bound {r.bound_s:.4f} s, "
            f"gap {100 * (r.gap or 0):.3f}%"
        )
    for i, p in enumerate(r.plans):
        out += [
            "",
            f"=== plan {i + 1} of {len(r.plans)}: step time {p.evaluation.result['step_time']:.4f} s ===",
        ]
        out.append(render_evaluation(p.evaluation))
        if emit:
            from optimizer.report.export import block

            out += ["", block(emit, problem, p.evaluation.execution)]
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
