"""The CP-SAT model of `paraplan solve --method cpsat`, built as a short script of `build` calls:

    tables  = build_all(problem, compact_space(problem))      # prepare: factor tables from the model,
                                                             #   one set per variant (kernels, offload)
    pre     = presolve(tables, top)                          # bounds: fit + incumbent pruning, hint
    choice  = choice.build(tables, m, pre)                   # decisions + integer rules (pair table)
    memory  = memory.build(tables, m, choice)                # memory.hbm
    time    = time.build(tables, m, choice)                  # objective: the model's step time
    m.Minimize(time.objective)

Every solution is extracted into an `Execution`, re-evaluated by the analytical model and verified
(objective within 0.1%, capacities hold). `--top K` re-solves with each found assignment forbidden, so
plan i is optimal among what remains.
"""

from __future__ import annotations

import time as _time

import numpy as np
from ortools.sat.python import cp_model

from optimizer.errors import Infeasible
from optimizer.evaluate import evaluate_execution
from optimizer.model.knobs import to_execution
from optimizer.objective import BIG_S, describe, gpu_time_cap, gpus_used, target
from optimizer.schema import Problem
from optimizer.solve import Plan, SolveResult, verify
from optimizer.space import compact_space

from . import choice as choice_mod
from . import memory as memory_mod
from . import time as time_mod
from .bounds import NONE, Presolved, knobs_of_pairs, presolve
from .common import new_int, product
from .tables import TIME_UNIT, Tables, build_all

# solver parameters as data (`paraplan solve --sat-params`). One worker: on two cores it is the fastest and
# deterministic. Keep CP-SAT's presolve on: with cp_model_presolve=False, ortools 9.15 returned OPTIMAL with
# a worse objective than a feasible assignment of an earlier version of this model. One presolve pass, no
# probing and no symmetry search: on the oracle problems (tests/oracle_cases.py) the default presolve spent
# up to 2.4 s on a 456-pair model; these settings, no LP relaxation (the model is a table plus a few
# linear rows: the LP only costs set-up time) and a complete hint take 0.4 s at worst, with the same optima.
SOLVER_PARAMS = {"num_workers": 1, "random_seed": 0, "log_search_progress": False, "max_presolve_iterations": 1,
                 "cp_model_probing_level": 0, "symmetry_level": 0, "linearization_level": 0}


def set_params(solver: cp_model.CpSolver, params: dict) -> None:
    """Solver parameters by name; enum values by their name (``search_branching: FIXED_SEARCH``)."""
    for k, v in params.items():
        if isinstance(v, str):
            v = getattr(type(solver.parameters), v)
        setattr(solver.parameters, k, v)


def define_model(T: Tables, pre: Presolved, hint: dict[str, int] | None = None):
    m = cp_model.CpModel()
    ch = choice_mod.build(T, m, pre)
    mem = memory_mod.build(T, m, ch)
    m.Add(mem.enforce == 1)
    if mem.enforce_offload is not None:
        m.Add(mem.enforce_offload == 1)
    tv = time_mod.build(T, m, ch)
    obj = new_int(m, 0, 10**14, "step_time")
    m.Add(obj == tv.objective)
    sc = objective_score(T, m, ch, obj)
    m.Add(sc >= ch.lower)  # redundant cut (formulations.bounds)
    if pre.incumbent.ub < NONE:
        m.Add(sc <= pre.incumbent.ub)  # the incumbent (or the top-th one) is at least this good
    ch.close()
    m.Minimize(sc)
    if hint:
        complete_hint(m, ch, hint)
    return m, ch, mem, tv


def complete_hint(m: cp_model.CpModel, ch, hint: dict[str, int]) -> None:
    """Hint every variable: solve once with the hinted pair, ZeRO stage and overlap fixed (instant), then
    hint that whole solution (a partial hint leaves the objective terms to a search)."""
    p = choice_mod.pair_index(ch, hint)
    if p is None:
        return
    probe = m.Clone()
    for var, val in ((ch.pair, p), (ch.zi, hint["zi"]), (ch.di, hint["di"])):
        probe.Add(probe.GetIntVarFromProtoIndex(var.Index()) == val)
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    if s.Solve(probe) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return
    for i in range(len(m.Proto().variables)):
        m.AddHint(m.GetIntVarFromProtoIndex(i), s.Value(probe.GetIntVarFromProtoIndex(i)))


def objective_score(T: Tables, m: cp_model.CpModel, ch, obj):
    """The score of `optimizer.objective` (step time; GPUs x step time; GPUs x BIG + step time under the
    target), as `formulations.bounds.score_int` computes it."""
    p = T.problem
    g = p.objective.goal.value
    tg, cap = target(p, TIME_UNIT), gpu_time_cap(p, TIME_UNIT)
    if tg is not None:
        m.Add(obj <= int(np.floor(tg)))
    n = ch.col("n_gpus")
    gs = product(m, n, obj, "gpu_seconds") if (g == "tokens_per_gpu" or cap is not None) else None
    if cap is not None:
        m.Add(gs <= int(np.floor(cap)))
    if g == "step_time":
        return obj
    if g == "tokens_per_gpu":
        return gs
    return int(BIG_S * TIME_UNIT) * n + obj


def solve_cpsat(problem: Problem, top: int = 1, time_limit_s: float = 60.0, t0: float | None = None,
                params: dict | None = None) -> SolveResult:
    t0 = t0 if t0 is not None else _time.perf_counter()
    c = compact_space(problem)
    if c.size == 0:
        raise Infeasible("no legal plan: no (tp, pp, dp, vpp, micro-batch) satisfies the integer rules "
                         "(run `paraplan check` for why)", reason="rules")
    Ts = build_all(problem, c)
    T = Ts[0]  # layouts, value lists and capacities are shared by the variants
    pre = presolve(Ts, top)
    if len(pre.pairs) == 0:
        has_target = problem.step_time_target_s() is not None or problem.gpu_seconds_per_step_cap() is not None
        what = "is within memory and meets the objective's targets" if has_target else "is within memory"
        raise Infeasible(f"nothing fits: none of {c.size:,} candidates {what} "
                         "(run `paraplan check` for why and what would fit)")
    m, ch, mem, tv = define_model(T, pre, pre.incumbent.hint)
    err = m.Validate()
    if err:  # pragma: no cover - a formulation bug, reported loudly
        raise RuntimeError(f"invalid CP-SAT model: {err}")
    solver = cp_model.CpSolver()
    set_params(solver, {**SOLVER_PARAMS, **(params or {})})
    plans: list[Plan] = []
    status_name, bound, gap = "optimal", None, None
    goal = problem.objective.goal.value
    for i in range(top):
        solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (_time.perf_counter() - t0))
        st = solver.Solve(m)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if i == 0:
                if st == cp_model.INFEASIBLE:
                    raise Infeasible(f"nothing fits: none of {c.size:,} candidates is within memory "
                                     "(run `paraplan check` for why and what would fit)")
                raise Infeasible(f"no plan found within {time_limit_s:g} s ({solver.StatusName(st)})")
            break
        if i == 0:
            sc_best, sc_bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
            gap = (sc_best - sc_bound) / sc_best if sc_best > 0 else 0.0
            bound = sc_bound / TIME_UNIT if goal == "step_time" else None
            if st != cp_model.OPTIMAL:
                status_name = "feasible"
        a = ch.extract(solver)
        obj = solver.Value(tv.objective) / TIME_UNIT
        k = knobs_of_pairs(Ts, pre.pairs.take(np.array([a["pair"]])), np.array([a["zi"]]), np.array([a["di"]]))
        ev = evaluate_execution(problem, to_execution(k, problem.system))
        verify(problem, ev, obj)
        plans.append(Plan(ev, obj))
        m.AddForbiddenAssignments(ch.key(), [[a["pair"], a["zi"], a["di"]]])
    inc = pre.incumbent
    n0 = gpus_used(plans[0].evaluation.execution)
    var = f" in {len(Ts)} variants (kernels, schedule, offload)" if len(Ts) > 1 else ""
    notes = [describe(problem, n0, plans[0].objective_s),
             f"presolve: {pre.n_triples_kept:,} of {pre.n_triples:,} (layout, vpp, micro-batch) triples{var} "
             f"within the incumbent's bound ({inc.evaluated:,} plans evaluated); of their {pre.n_pairs_fit:,} "
             f"(triple, block) pairs that fit, {len(pre.pairs):,} kept",
             f"CP-SAT model: {len(m.Proto().variables)} variables, {len(m.Proto().constraints)} constraints"]
    return SolveResult("cpsat", status_name, plans, c.size, None, _time.perf_counter() - t0, bound_s=bound,
                       gap=gap, notes=notes)
