"""The CP-SAT model of `paraplan solve --method cpsat`, built as a short script of `build` calls:

    tables  = build_tables(problem, compact_space(problem))   # prepare: numbers from the model
    choice  = choice.build(tables, m)                        # decisions + integer rules
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
from optimizer.model.knobs import Knobs, to_execution
from optimizer.schema import Problem
from optimizer.solve import Plan, SolveResult, verify
from optimizer.space import compact_space

from . import choice as choice_mod
from . import memory as memory_mod
from . import time as time_mod
from .tables import TIME_UNIT, Tables, build_tables

# measured on problems/default.yaml: presolve off + no LP linearization is 2.6x faster than the defaults
SOLVER_PARAMS = {"num_workers": 1, "random_seed": 0, "log_search_progress": False, "cp_model_presolve": False,
                 "linearization_level": 0}


def greedy_hint(T: Tables, problem: Problem) -> dict[str, int] | None:
    """A good plan to start from: per layout, the evaluated best of a few Megatron-style settings
    (selective recompute, SP and ring overlap where tp > 1, ZeRO-1 with overlap, no interleaving)."""
    from optimizer.enumerate import feasible
    from optimizer.model.step import evaluate

    rows, keys = [], []
    for li, vi, mi in T.legal_lvm:
        if T.v_vals[vi] != 1 or mi > 2:
            continue
        tp1 = T.L["tp1"][li] == 1
        for ri in range(len(T.rec_vals)):
            a = dict(l=li, vi=vi, mi=mi, ri=ri,
                     si=T.sp_vals.index(0 if tp1 else max(T.sp_vals)),
                     oi=T.ov_vals.index(0 if tp1 else max(T.ov_vals)) if (0 in T.ov_vals or not tp1) else 0,
                     zi=T.z_vals.index(0) if (T.L["dpg1"][li] or 1 not in T.z_vals) else T.z_vals.index(1),
                     di=T.dpo_vals.index(1) if 1 in T.dpo_vals else 0)
            rows.append(knobs_of(T, a))
            keys.append(a)
    if not rows:
        return None
    K = Knobs.concat(rows)
    res = evaluate(problem, K)
    t = np.where(feasible(problem, K, res), res.step_time, np.inf)
    i = int(np.argmin(t))
    return keys[i] if np.isfinite(t[i]) else None


def define_model(T: Tables, hint: dict[str, int] | None = None):
    m = cp_model.CpModel()
    ch = choice_mod.build(T, m)
    mem = memory_mod.build(T, m, ch)
    m.Add(mem.enforce == 1)
    tv = time_mod.build(T, m, ch)
    obj = m.NewIntVar(0, 10**14, "step_time")
    m.Add(obj == tv.objective)
    m.Add(obj >= ch.lower)  # redundant cut (formulations.bounds)
    ch.close(T)
    m.Minimize(obj)
    if hint:
        for n, v in hint.items():
            m.AddHint(getattr(ch, n), v)
    return m, ch, mem, tv


def knobs_of(T: Tables, a: dict[str, int]) -> Knobs:
    li = a["l"]
    tp, pp, cp, dp = (int(T.lay[n][li]) for n in ("tp", "pp", "cp", "dp"))
    sp = T.sp_vals[a["si"]]
    row = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=1, etp=tp, vpp=T.v_vals[a["vi"]], mb=T.mb_vals[a["mi"]],
               recompute=T.rec_vals[a["ri"]], sp=sp, rs_ag=sp, sp_redo=T.fixed["sp_redo"],
               tp_overlap=T.ov_vals[a["oi"]], pp_rs_ag=T.fixed["pp_rs_ag"], dp_overlap=T.dpo_vals[a["di"]],
               zero=T.z_vals[a["zi"]], fused=T.fixed["fused"], flash=T.fixed["flash"], gpipe=T.fixed["gpipe"],
               w_off=T.fixed["w_off"], a_off=T.fixed["a_off"], o_off=T.fixed["o_off"],
               tier_tp=int(T.lay["tier_tp"][li]), tier_cp=int(T.lay["tier_cp"][li]), tier_ep=0,
               tier_dp=int(T.lay["tier_dp"][li]), tier_pp=int(T.lay["tier_pp"][li]))
    return Knobs.from_dict(row)


def solve_cpsat(problem: Problem, top: int = 1, time_limit_s: float = 60.0, t0: float | None = None,
                params: dict | None = None) -> SolveResult:
    t0 = t0 if t0 is not None else _time.perf_counter()
    c = compact_space(problem)
    T = build_tables(problem, c)
    m, ch, mem, tv = define_model(T, greedy_hint(T, problem))
    err = m.Validate()
    if err:  # pragma: no cover - a formulation bug, reported loudly
        raise RuntimeError(f"invalid CP-SAT model: {err}")
    solver = cp_model.CpSolver()
    for k, v in {**SOLVER_PARAMS, **(params or {})}.items():
        setattr(solver.parameters, k, v)
    plans: list[Plan] = []
    status_name, bound = "optimal", None
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
            bound = solver.BestObjectiveBound() / TIME_UNIT
            if st != cp_model.OPTIMAL:
                status_name = "feasible"
        a = ch.extract(solver)
        obj = solver.ObjectiveValue() / TIME_UNIT
        k = knobs_of(T, a)
        ev = evaluate_execution(problem, to_execution(k, problem.system))
        verify(problem, ev, obj)
        plans.append(Plan(ev, obj))
        m.AddForbiddenAssignments(ch.key(), [[a[n] for n in ("l", "vi", "mi", "ri", "si", "oi", "zi", "di")]])
    best = plans[0].objective_s
    gap = (best - bound) / best if bound is not None and best > 0 else None
    return SolveResult("cpsat", status_name, plans, c.size, None, _time.perf_counter() - t0, bound_s=bound,
                       gap=gap, notes=[f"CP-SAT model: {len(m.Proto().variables)} variables, "
                                       f"{len(m.Proto().constraints)} constraints"])
