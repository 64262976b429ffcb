"""`paraplan solve`: the fastest execution of a problem (stages prepare -> build -> solve -> extract ->
verify). Methods: ``enumerate`` walks the whole space with the vectorised model (the oracle); ``cpsat``
(the CP-SAT formulation in `formulations/`) proves the same optimum without walking it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from optimizer.drivers.evaluate import Evaluation, evaluate_execution
from optimizer.errors import Infeasible, Reason, TimeLimit, VerificationError
from optimizer.model.knobs import to_execution
from optimizer.schema import Precision, Problem

REL_TOL = 1e-3  # solver objective vs re-evaluated step time
ENUMERATE_MAX = 40_000_000  # candidates the enumerator materialises (~0.3 KB each: ~12 GB at most)
ABS_TOL_S = 1e-9  # ... or one solver time unit (1 ns), for sub-ns steps


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
    phased: object = None  # optimizer.drivers.phases.PhasedTotals of a batch-size schedule (a plan per phase)


def verify(problem: Problem, ev: Evaluation, objective_s: float, exact: bool = True) -> None:
    """Re-evaluate with the model: objective within 0.1% (or 1 ns, the solver's time unit) and every
    capacity holds, or fail loudly. `exact` False (a solve stopped by its time limit, not proven): the
    solver's objective may stand above the model's (its exposure terms are bounded from below only, and an
    unfinished search need not have pushed them down), never below it."""
    t = ev.result["step_time"]
    tol = max(REL_TOL * t, ABS_TOL_S)
    if objective_s < t - tol or (exact and objective_s > t + tol):
        raise VerificationError(
            f"solver objective {objective_s:.6g} s disagrees with the model's {t:.6g} s "
            f"for {ev.execution.model_dump(mode='json')}"
        )
    if not ev.fits:
        raise VerificationError(
            f"plan does not fit in memory when re-evaluated: {ev.result['hbm'] / 2**30:.2f} GiB"
        )


def _precisions(problem: Problem) -> list | None:
    """The precisions `search.precision` opens (None: only training.precision, the usual solve)."""
    rule = problem.search_rules().get("precision")
    if rule is None:
        return None
    # a search changed in code (check's fixed knobs) may hold the precisions as plain strings
    vals = list(dict.fromkeys(Precision(v) for v in (rule if isinstance(rule, list) else [rule])))
    return None if vals == [problem.training.precision] else vals


def _solve_precisions(problem: Problem, precs: list, kw: dict) -> SolveResult:
    """Precision as a decision: one solve per precision the system has a matrix peak for (each space is the
    whole problem at that precision), the best by the objective's score; a proven optimum over the precisions
    since each branch is proven (branching on the precision is exact)."""
    from optimizer.prepare.objective import gpus_used, score

    t0 = time.perf_counter()
    # the file's own rules: each branch narrows them to what the stack offers at its precision
    # (`search_rules`)
    search = {k: v for k, v in problem.user_search_rules().items() if k != "precision"}
    best, best_score, notes, candidates, statuses = None, None, [], 0, set()
    reasons: set[Reason] = set()
    for pr in precs:
        if problem.system.peak_tflops(pr) is None:
            notes.append(
                f"precision {pr.value}: {problem.system.name} has no {pr.value} matrix peak, not searched"
            )
            continue
        q = problem.model_copy(
            update={
                "training": problem.training.model_copy(update={"precision": pr}),
                "search": search or None,
            }
        )
        try:
            r = solve(q, **kw)
        except Infeasible as e:
            notes.append(f"precision {pr.value}: nothing fits ({e.reason})")
            reasons.add(e.reason)
            continue
        candidates += r.candidates
        statuses.add(r.status)
        ev = r.plans[0].evaluation
        sc = float(score(q, gpus_used(ev.execution), ev.result["step_time"]))
        notes.append(f"precision {pr.value}: step time {ev.result['step_time']:.4g} s ({r.status})")
        if best_score is None or sc < best_score:
            best, best_score = r, sc
    if best is None:  # the reason closest to a fit: a target missed, else memory, else the rules at every one
        why = next((r for r in (Reason.TARGET, Reason.MEMORY) if r in reasons), Reason.RULES)
        raise Infeasible("nothing fits at any precision searched: " + "; ".join(notes), reason=why)
    chosen = best.plans[0].evaluation.problem.training.precision.value
    best.notes = (
        [f"precision searched over {', '.join(p.value for p in precs)}: {chosen} is fastest"]
        + notes
        + best.notes
    )
    best.candidates = candidates
    best.status = "optimal" if statuses <= {"optimal"} else "feasible"
    best.seconds = time.perf_counter() - t0
    return best


def _plans(problem: Problem, knobs: list, objectives: list, exact: bool = True) -> list[Plan]:
    """Extract and verify: each candidate as an `Execution`, re-evaluated by the model (`exact` False: the
    solves were not all proven, `verify`). Candidates that run as the same plan (a knob that does not run
    where it is set, written as what runs: zero-bubble at one stage per rank, the all-to-all overlap
    where Megatron-Core does not run it) are listed once."""
    plans, seen = [], set()
    for k, obj in zip(knobs, objectives, strict=True):
        ex = to_execution(k, problem.system, rank_order=problem.execution.rank_order)
        key = ex.model_dump_json()
        if key in seen:
            continue
        seen.add(key)
        ev = evaluate_execution(problem, ex)
        obj = ev.result["step_time"] if obj is None else obj
        verify(problem, ev, obj, exact)
        plans.append(Plan(ev, obj))
    return plans


def solve(
    problem: Problem,
    method: str = "cpsat",
    top: int = 1,
    time_limit_s: float = 60.0,
    params: dict | None = None,
    tables=None,
    backend: str = "cpsat",
    solver: str = "highs",
    distinct: bool = False,
) -> SolveResult:
    """The best plans of the problem. `backend` cpsat (default) or pyomo (the same kept pairs as a MILP,
    `formulations.pyomo_model`, with `solver`); `tables` (CP-SAT): tables built for the same problem with
    more GPUs and idle GPUs allowed, reused for this GPU limit (`formulations.tables.restrict`).
    `distinct`: the `top` plans are the best of `top` different layouts (parallel degrees), not the `top`
    best plans, which often share one layout and differ in recompute or overlap."""
    kw = dict(
        method=method,
        top=top,
        time_limit_s=time_limit_s,
        params=params,
        tables=tables,
        backend=backend,
        solver=solver,
        distinct=distinct,
    )
    if problem.training.phases:
        from optimizer.drivers.phases import solve_phases

        return solve_phases(problem, solve, kw)
    precs = _precisions(problem)
    if precs is not None:
        return _solve_precisions(problem, precs, kw)
    t0 = time.perf_counter()
    if method == "cpsat":
        return _solve_model(problem, top, time_limit_s, params, tables, backend, solver, t0, distinct)
    if method == "enumerate":
        return _solve_enumerate(problem, top, t0, time_limit_s, distinct)
    raise ValueError(f"unknown method {method}")


def _solve_model(
    problem: Problem,
    top: int,
    time_limit_s: float,
    params: dict | None,
    tables,
    backend: str,
    solver: str,
    t0: float,
    distinct: bool = False,
) -> SolveResult:
    """Build and solve the CP-SAT model (or, with backend pyomo, the same kept pairs as a MILP,
    `formulations.pyomo_model`), then extract and verify its plans; `t0` (perf_counter s) starts the clock."""
    from optimizer.prepare.objective import describe, gpus_used

    if backend == "pyomo":  # the same kept pairs as a MILP (formulations.pyomo_model)
        from formulations.pyomo_model import solve_pyomo

        o = solve_pyomo(problem, top=top, time_limit_s=time_limit_s, t0=t0, solver=solver, distinct=distinct)
    else:
        from formulations.model import solve_cpsat

        o = solve_cpsat(
            problem,
            top=top,
            time_limit_s=time_limit_s,
            t0=t0,
            params=params,
            tables=tables,
            distinct=distinct,
        )
    plans = _plans(problem, o.knobs, o.objectives_s, exact=o.status == "optimal")
    first = plans[0].evaluation
    notes = [describe(problem, gpus_used(first.execution), first.result["step_time"])] + o.notes
    return SolveResult(
        backend,
        o.status,
        plans,
        o.candidates,
        None,
        time.perf_counter() - t0,
        bound_s=o.bound_s,
        gap=o.gap,
        notes=notes,
    )


def _solve_enumerate(
    problem: Problem, top: int, t0: float, time_limit_s: float | None = None, distinct: bool = False
) -> SolveResult:
    """The exhaustive oracle (`formulations.enumerate`): every candidate of the compact space evaluated, the
    `top` fastest extracted and verified; refused above ENUMERATE_MAX candidates, `Infeasible` when none
    fits. `t0` (perf_counter s) starts the clock; at `time_limit_s` the walk stops: the best so far
    (status feasible), or `TimeLimit` when none fits among the candidates evaluated."""
    from formulations.enumerate import enumerate_best
    from optimizer.errors import ProblemError
    from optimizer.prepare.objective import describe, gpus_used
    from optimizer.prepare.space import compact_space

    size = compact_space(problem).size
    if size > ENUMERATE_MAX:
        raise ProblemError(
            "--method",
            None,
            None,
            f"enumerate walks all {size:,} candidates, more than the "
            f"{ENUMERATE_MAX:,} it holds in memory; use cpsat (the default)",
        )
    r = enumerate_best(
        problem, top=top, deadline=None if time_limit_s is None else t0 + time_limit_s, distinct=distinct
    )
    if len(r.step_time_s) == 0 and not r.complete:
        raise TimeLimit(
            f"enumerate: the time limit ({time_limit_s:g} s) passed after {r.n_evaluated:,} of "
            f"{r.n_candidates:,} candidates, none of which fits: not a proof that none fits"
        )
    if len(r.step_time_s) == 0:
        reason = Reason.RULES if r.n_candidates == 0 else Reason.TARGET if r.n_feasible else Reason.MEMORY
        what = "meets the objective's target" if r.n_feasible else "is within memory"
        raise Infeasible(
            f"nothing fits: none of {r.n_candidates:,} candidates {what} "
            "(run `paraplan check` for why and what would fit)",
            reason=reason,
        )
    plans = _plans(
        problem,
        [r.knobs.take(np.array([i])) for i in range(len(r.step_time_s))],
        [float(x) for x in r.step_time_s],
    )
    note = describe(
        problem, gpus_used(plans[0].evaluation.execution), plans[0].evaluation.result["step_time"]
    )
    step_goal = problem.objective.goal.value == "step_time"
    done = r.complete
    if not done:
        note += f"; the time limit passed after {r.n_evaluated:,} of {r.n_candidates:,} candidates"
    return SolveResult(
        "enumerate",
        "optimal" if done else "feasible",
        plans,
        r.n_candidates,
        r.n_feasible,
        time.perf_counter() - t0,
        bound_s=float(r.step_time_s[0]) if step_goal and done else None,
        gap=0.0 if done else None,
        notes=[note],
    )
