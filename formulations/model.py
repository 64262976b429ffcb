"""The CP-SAT model of `paraplan solve --method cpsat`, built as a short script of `build` calls:

    tables  = build_all(problem, compact_space(problem))      # prepare: factor tables from the model,
                                                             #   one set per variant (kernels, offload)
    pre     = presolve(tables, top)                          # bounds: fit + incumbent pruning, hint
    choice  = choice.build(tables, m, pre)                   # decisions + integer rules (pair table)
    memory  = memory.build(tables, m, choice)                # memory.hbm
    time    = step_time.build(tables, m, choice)                # objective: the model's step time
    m.Minimize(time.objective)

Every solution is extracted into an `Execution`, re-evaluated by the analytical model and verified
(objective within 0.1%, capacities hold). `--top K` re-solves with each found assignment forbidden, so
plan i is optimal among what remains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from formulations import choice as choice_mod
from formulations import memory as memory_mod
from formulations import step_time as time_mod
from formulations.bounds import NONE, Pairs, Presolved, knobs_of_pairs, layout_groups, presolve
from formulations.common import new_int, product
from formulations.cp_sat import cp_model
from formulations.tables import TIME_UNIT, Tables, build_all, restrict, same_given
from optimizer.errors import Infeasible, OutOfRange, Reason, TimeLimit, VerificationError
from optimizer.model.knobs import Knobs
from optimizer.prepare.objective import (
    BIG_S,
    W_CAP,
    W_SCALE,
    expected_time_factor,
    failures_in_target,
    gpu_time_cap,
    target,
    uses_factor,
)
from optimizer.prepare.space import compact_space
from optimizer.schema import Problem
from optimizer.schema.problem import Objective

# solver parameters as data (`paraplan solve --sat-params`). One worker: on two cores it is the fastest and
# deterministic. Keep CP-SAT's presolve on: with cp_model_presolve=False, ortools 9.15 returned OPTIMAL with
# a worse objective than a feasible assignment of an earlier version of this model. One presolve pass, no
# probing and no symmetry search: on the oracle problems (tests/oracle_cases.py) the default presolve spent
# up to 2.4 s on a 456-pair model; these settings, no LP relaxation (the model is a table plus a few
# linear rows: the LP only costs set-up time) and a complete hint take 0.4 s at worst, with the same optima.
SOLVER_PARAMS = {
    "num_workers": 1,
    "random_seed": 0,
    "log_search_progress": False,
    "max_presolve_iterations": 1,
    "cp_model_probing_level": 0,
    "symmetry_level": 0,
    "linearization_level": 0,
}


def check_params(params: dict) -> None:
    """Every key a CP-SAT parameter, every value of its type (`--sat-params`), or a ProblemError naming it."""
    from ortools.sat import sat_parameters_pb2

    from optimizer.errors import ProblemError

    fields = sat_parameters_pb2.SatParameters.DESCRIPTOR.fields_by_name
    for k, v in params.items():
        if k not in fields:
            raise ProblemError(
                "--sat-params", None, k, "unknown CP-SAT parameter (see ortools' sat_parameters.proto)"
            )
        try:
            set_params(cp_model.CpSolver(), {k: v})
        except (TypeError, ValueError, AttributeError) as e:
            raise ProblemError("--sat-params", None, k, f"bad value {v!r}: {e}") from None


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
    """The score of `optimizer.prepare.objective` (step time; GPUs x step time; GPUs x BIG + step time
    under the target), as `formulations.bounds.score_int` computes it."""
    p = T.problem
    g = p.objective.goal.value
    tg, cap = target(p, TIME_UNIT), gpu_time_cap(p, TIME_UNIT)
    in_exp = p.objective.target_includes_failures
    w = wt = None
    if uses_factor(p):  # W(n) per pair; a plan training under 1/W_MAX of its wall time is ruled out
        n_p = T.gpus(ch.pre.pairs.li)
        w = ch.by_pair.get("expected_time_w", expected_time_factor(p, n_p))
        m.Add(w <= W_CAP)
        wt = product(m, w, obj, "expected_step")
    if tg is not None and failures_in_target(p):
        m.Add(wt <= int(np.floor(tg * W_SCALE)))
    elif tg is not None:
        m.Add(obj <= int(np.floor(tg)))
    n = ch.col("n_gpus")
    gs = (
        product(m, n, obj, "gpu_seconds")
        if (g == "tokens_per_gpu" or (cap is not None and not in_exp))
        else None
    )
    if cap is not None and in_exp:  # the expected GPU-time: W(n) t <= floor(cap W_SCALE / n) per pair
        m.Add(wt <= ch.by_pair.get("cap_w", np.floor(cap * W_SCALE / np.maximum(n_p, 1)).astype(np.int64)))
    elif cap is not None:
        m.Add(gs <= int(np.floor(cap)))
    if g == "step_time":
        return obj
    if g == "tokens_per_gpu":
        return gs
    if g == "expected_time":
        return wt
    return int(BIG_S * TIME_UNIT) * n + obj


@dataclass
class Outcome:
    """What the CP-SAT formulation returns: assignments as knobs (extraction to plans, verification and
    reports are `optimizer.drivers.solve`'s), the solver's objective per plan, status and bound."""

    status: str  # optimal | feasible
    knobs: list[Knobs]  # one candidate per plan, best first
    objectives_s: list[float | None]  # the solver's step time per plan (None: the model's own incumbent)
    candidates: int
    bound_s: float | None
    gap: float | None
    notes: list[str] = field(default_factory=list)


def no_plan_reason(problem: Problem) -> Reason:
    """Memory or target: does anything fit once the objective's targets are dropped (one presolve)?"""
    if (
        problem.step_time_target_s() is None
        and problem.gpu_seconds_per_step_cap() is None
        and not uses_factor(problem)
    ):
        return Reason.MEMORY
    free = problem.model_copy(update={"objective": Objective()})
    pre = presolve(build_all(free, compact_space(free)), 1)
    return Reason.TARGET if len(pre.pairs) else Reason.MEMORY


def _infeasible(problem: Problem, size: int) -> Infeasible:
    reason = no_plan_reason(problem)
    what = (
        "is within memory and meets the objective's target" if reason == Reason.TARGET else "is within memory"
    )
    if reason == Reason.TARGET and uses_factor(problem):
        what += (
            " with failures, restarts and checkpoints (each plan must also train at least 1/10 of its wall "
            "time: check the goodput inputs, e.g. failure rates and checkpoint_interval_s)"
        )
    return Infeasible(
        f"nothing fits: none of {size:,} candidates {what} (run `paraplan check` for why and what would fit)",
        reason=reason,
    )


def _variant_tables(
    problem: Problem, tables: list[Tables] | None, deadline: float | None = None
) -> tuple[list[Tables], int]:
    """The tables of every variant with legal triples and the size of the space (candidates); `tables`:
    those of a larger problem to restrict (`tables.restrict`). Infeasible (rules) when nothing is legal;
    TimeLimit when `deadline` (perf_counter s) passes while they are filled."""
    if tables is not None and same_given(tables, problem):
        Ts, size = restrict(tables, problem)
        Ts = [T for T in Ts if len(T.legal_lvm)]
    else:
        c = compact_space(problem)
        size = c.size
        Ts = build_all(problem, c, deadline) if size else []
    if size == 0 or not Ts:
        raise Infeasible(
            "no legal plan: no (tp, pp, dp, vpp, micro-batch) satisfies the integer rules "
            "(run `paraplan check` for why)",
            reason=Reason.RULES,
        )
    return Ts, size


def _raise_without_solution(
    problem: Problem, size: int, pre: Presolved, st, solver: cp_model.CpSolver, time_limit_s: float
) -> None:
    """The first solve found no plan: Infeasible when CP-SAT proved that nothing fits, TimeLimit when the
    time ran out and the presolve has no incumbent to answer with; returns when it has one."""
    if st == cp_model.INFEASIBLE:
        raise _infeasible(problem, size)
    if pre.incumbent.hint is None:
        raise TimeLimit(
            f"no plan found within {time_limit_s:g} s ({solver.StatusName(st)}): not a proof "
            "that nothing fits; raise --time-limit"
        )


def _incumbent_knobs(Ts: list[Tables], pre: Presolved) -> Knobs:
    """The presolve's incumbent, a plan the model evaluated, as knobs (the answer when the time limit
    leaves CP-SAT without a plan)."""
    h = pre.incumbent.hint
    P = Pairs(
        *(np.array([h[n]]) for n in ("li", "vi", "mi", "ri", "si", "oi")),
        np.zeros(1, dtype=np.int64),
        np.array([h["var"]]),
    )
    return knobs_of_pairs(Ts, P, np.array([h["zi"]]), np.array([h["di"]]))


def _solve_top(
    problem: Problem,
    Ts: list[Tables],
    pre: Presolved,
    size: int,
    model: tuple,
    solver: cp_model.CpSolver,
    top: int,
    time_limit_s: float,
    t0: float,
    forbid=None,
):
    """Up to `top` plans, best first, each solve forbidding what `forbid` says of the assignment found
    before (`_forbid_plan`: that plan; `_forbid_layout`: every plan of its layout), within what is left of
    `time_limit_s` since `t0`. (status, knobs, objectives in s, bound in s, relative gap); the
    bound and gap are those of the first solve, the bound only for the step-time goal."""
    m, ch, _, tv = model
    knobs: list[Knobs] = []
    objs: list[float | None] = []
    status_name, bound, gap = "optimal", None, None
    goal = problem.objective.goal.value
    for i in range(top):
        solver.parameters.max_time_in_seconds = max(0.1, time_limit_s - (time.perf_counter() - t0))
        st = solver.Solve(m)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if i > 0:
                break
            _raise_without_solution(problem, size, pre, st, solver, time_limit_s)
            knobs.append(_incumbent_knobs(Ts, pre))
            objs.append(None)
            lb = int(pre.pairs.slb.min())
            status_name, gap = "feasible", None
            bound = lb / TIME_UNIT if goal == "step_time" else None
            break
        if i == 0:
            sc_best, sc_bound = solver.ObjectiveValue(), solver.BestObjectiveBound()
            gap = (sc_best - sc_bound) / sc_best if sc_best > 0 else 0.0
            bound = sc_bound / TIME_UNIT if goal == "step_time" else None
        if st != cp_model.OPTIMAL:  # any plan not proven: the answer is not (extract verifies one-sided)
            status_name = "feasible"
        a = ch.extract(solver)
        objs.append(solver.Value(tv.objective) / TIME_UNIT)
        knobs.append(
            knobs_of_pairs(
                Ts, pre.pairs.take(np.array([a["pair"]])), np.array([a["zi"]]), np.array([a["di"]])
            )
        )
        (forbid or _forbid_plan)(m, ch, Ts, pre, a)
    return status_name, knobs, objs, bound, gap


def _forbid_plan(m: cp_model.CpModel, ch, Ts: list[Tables], pre: Presolved, a: dict) -> None:
    """The next solve may not return the plan `a` (its pair, ZeRO stage and DP overlap)."""
    m.AddForbiddenAssignments(ch.key(), [[a["pair"], a["zi"], a["di"]]])


def _forbid_layout(m: cp_model.CpModel, ch, Ts: list[Tables], pre: Presolved, a: dict) -> None:
    """The next solve may not return any pair whose layout has the parallel degrees of `a`'s
    (`bounds.layout_groups`): each answer is a different layout, the best plan of it."""
    groups = layout_groups(Ts[0])
    same = np.flatnonzero(groups[pre.pairs.li] == groups[pre.pairs.li[a["pair"]]])
    m.AddForbiddenAssignments([ch.pair], [[int(p)] for p in same])


def _notes(
    Ts: list[Tables], pre: Presolved, m: cp_model.CpModel, objs: list[float | None], time_limit_s: float
) -> list[str]:
    """What the presolve kept, the CP-SAT model's size and, when the time limit left only the presolve's
    incumbent, that the plan is not proven optimal."""
    inc = pre.incumbent
    var = f" in {len(Ts)} variants (kernels, schedule, offload)" if len(Ts) > 1 else ""
    notes = [
        f"presolve: {pre.n_triples_kept:,} of {pre.n_triples:,} (layout, vpp, micro-batch) triples{var} "
        f"within the incumbent's bound ({inc.evaluated:,} plans evaluated); of their {pre.n_pairs_fit:,} "
        f"(triple, block) pairs that fit, {len(pre.pairs):,} kept",
        f"CP-SAT model: {len(m.Proto().variables)} variables, {len(m.Proto().constraints)} constraints",
    ]
    if objs and objs[0] is None:
        notes.append(
            f"time limit of {time_limit_s:g} s reached: the plan is the presolve's best evaluated plan, "
            "not proven optimal"
        )
    return notes


def invalid_model(err: str) -> OutOfRange | VerificationError:
    """The error of a model CP-SAT's `Validate` refuses: a domain past its 64-bit range comes from the
    input's magnitudes (bad input, exit 2); anything else is a formulation bug (exit 5)."""
    if "kint64max" in err:
        return OutOfRange(
            "the problem's step times overflow CP-SAT's 64-bit integers (in ns, summed over micro-batches "
            f"and layers; {err.split('.')[0]}): use a smaller training.global_batch or fewer layers"
        )
    return VerificationError(f"invalid CP-SAT model: {err}")


def solve_cpsat(
    problem: Problem,
    top: int = 1,
    time_limit_s: float = 60.0,
    t0: float | None = None,
    params: dict | None = None,
    tables: list[Tables] | None = None,
    distinct: bool = False,
) -> Outcome:
    """`tables`: those of the same problem with more GPUs and idle GPUs allowed (`tables.restrict`), to solve
    many GPU limits of one problem (procurement) without filling tables again. `distinct`: the `top` plans
    have different layouts (parallel degrees), each the best of its layout."""
    t0 = t0 if t0 is not None else time.perf_counter()
    deadline = t0 + time_limit_s
    try:
        Ts, size = _variant_tables(problem, tables, deadline)
    except TimeLimit as e:
        raise TimeLimit(
            f"no plan found within {time_limit_s:g} s ({time.perf_counter() - t0:.1f} s): {e}; not a proof "
            "that nothing fits; raise --time-limit"
        ) from None
    T = Ts[0]  # layouts, value lists and capacities are shared by the variants
    pre = presolve(Ts, top, deadline=deadline, distinct=distinct)
    if len(pre.pairs) == 0:
        raise _infeasible(problem, size)
    model = define_model(T, pre, pre.incumbent.hint)
    m = model[0]
    err = m.Validate()
    if err:
        raise invalid_model(err)
    solver = cp_model.CpSolver()
    set_params(solver, {**SOLVER_PARAMS, **(params or {})})
    forbid = _forbid_layout if distinct else _forbid_plan
    status_name, knobs, objs, bound, gap = _solve_top(
        problem, Ts, pre, size, model, solver, top, time_limit_s, t0, forbid
    )
    return Outcome(status_name, knobs, objs, size, bound, gap, _notes(Ts, pre, m, objs, time_limit_s))
