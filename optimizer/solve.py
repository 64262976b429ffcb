"""`paraplan solve`: the fastest execution of a problem (stages prepare -> build -> solve -> extract ->
verify). Methods: ``enumerate`` walks the whole space with the vectorised model (the oracle); ``cpsat``
(the CP-SAT formulation in `formulations/`) proves the same optimum without walking it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import Infeasible, VerificationError
from .evaluate import Evaluation, evaluate_execution
from .model.knobs import to_execution
from .schema import Problem
from .space import build_space

REL_TOL = 1e-3  # solver objective vs re-evaluated step time


@dataclass
class Plan:
    evaluation: Evaluation
    objective_s: float  # what the method reported


@dataclass
class SolveResult:
    method: str
    status: str  # optimal | feasible
    plans: list[Plan]
    candidates: int
    feasible_candidates: int | None
    seconds: float
    bound_s: float | None = None
    gap: float | None = None
    notes: list[str] = field(default_factory=list)


def verify(problem: Problem, ev: Evaluation, objective_s: float) -> None:
    """Re-evaluate with the model: objective within 0.1% and every capacity holds, or fail loudly."""
    t = ev.result["step_time"]
    if abs(t - objective_s) > REL_TOL * t:
        raise VerificationError(f"solver objective {objective_s:.6g} s disagrees with the model's {t:.6g} s "
                                f"for {ev.execution.model_dump(mode='json')}")
    if not ev.fits:
        raise VerificationError(f"plan does not fit in memory when re-evaluated: {ev.result['hbm'] / 2**30:.2f} GiB")


def solve(problem: Problem, method: str = "cpsat", top: int = 1, time_limit_s: float = 60.0,
          params: dict | None = None) -> SolveResult:
    t0 = time.perf_counter()
    if method == "cpsat":
        from formulations.model import solve_cpsat
        from formulations.tables import Unsupported

        try:
            return solve_cpsat(problem, top=top, time_limit_s=time_limit_s, t0=t0, params=params)
        except Unsupported as e:  # solved exactly all the same, by the oracle, and said so
            r = solve(problem, "enumerate", top=top)
            r.notes.append(f"CP-SAT formulation does not cover this problem ({e}); solved by enumeration")
            return r
    if method == "enumerate":
        from .enumerate import enumerate_best

        r = enumerate_best(problem, build_space(problem), top=top)
        if len(r.step_time_s) == 0:
            what = "meets the objective's target" if r.n_feasible else "is within memory"
            raise Infeasible(f"nothing fits: none of {r.n_candidates:,} candidates {what} "
                             "(run `paraplan check` for why and what would fit)",
                             reason="rules" if r.n_candidates == 0 else "target" if r.n_feasible else "memory")
        plans = []
        for i in range(len(r.step_time_s)):
            ex = to_execution(r.knobs, problem.system, i)
            ev = evaluate_execution(problem, ex)
            verify(problem, ev, float(r.step_time_s[i]))
            plans.append(Plan(ev, float(r.step_time_s[i])))
        from .objective import describe, gpus_used

        note = describe(problem, gpus_used(plans[0].evaluation.execution), plans[0].objective_s)
        step_goal = problem.objective.goal.value == "step_time"
        return SolveResult("enumerate", "optimal", plans, r.n_candidates, r.n_feasible,
                           time.perf_counter() - t0, bound_s=float(r.step_time_s[0]) if step_goal else None,
                           gap=0.0, notes=[note])
    raise ValueError(f"unknown method {method}")


def result_dict(problem: Problem, r: SolveResult) -> dict:
    from .report.text import evaluation_dict

    return {
        "method": r.method, "status": r.status, "solve_time_s": r.seconds, "candidates": r.candidates,
        "feasible_candidates": r.feasible_candidates, "bound_step_time_s": r.bound_s, "gap": r.gap,
        "plans": [evaluation_dict(p.evaluation) | {"objective_step_time_s": p.objective_s} for p in r.plans],
        "notes": r.notes,
    }


def render(problem: Problem, r: SolveResult, emit: str | None = None) -> str:
    from .report.text import render_evaluation

    out = [f"paraplan solve ({r.method}): {r.status}; {r.candidates:,} candidates in the space"
           + (f", {r.feasible_candidates:,} fit" if r.feasible_candidates is not None else "")
           + f"; solved in {r.seconds:.3f} s"]
    if r.bound_s is not None:
        out.append(f"best step time {r.plans[0].objective_s:.4f} s, bound {r.bound_s:.4f} s, gap {100 * (r.gap or 0):.3f}%")
    for i, p in enumerate(r.plans):
        out += ["", f"=== plan {i + 1} of {len(r.plans)}: step time {p.evaluation.result['step_time']:.4f} s ==="]
        out.append(render_evaluation(p.evaluation))
        if emit == "megatron":
            from .export import emit as export_emit

            out += ["", "Megatron-LM command:", export_emit("megatron", problem, p.evaluation.execution)]
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
