"""The Pyomo MILP of `paraplan solve --backend pyomo`: the same kept pairs and pair terms as the CP-SAT model
(`formulations.tables.build_all` -> `formulations.bounds.presolve` -> `formulations.pairs` columns), no
physics written again, solved by any Pyomo MILP solver (HiGHS through highspy by default).

Decisions: one binary w[c] per legal choice c = (pair p, ZeRO stage z, DP overlap d) of the kept pairs.
The products of the CP-SAT model (pair x ZeRO stage, pair x overlap, GPUs x step time) are linearised exactly
by enumerating the choices: every term of a choice is a constant of the pair columns, so each row is linear
in w:

    sum_c w[c] = 1                                             (one pair, one ZeRO stage, one DP overlap)
    step[c] = pipe[p] + (link_z[p] | ceil(ovl_z[p] / Q)) + opt_z[p]      (formulations.time: y_dp, y_opt
                                                               integers minimised, hence the ceiling)
    memory.hbm:      sum_c (state_hbm_bytes_z[p] + act[p]) w[c] <= HBM - headroom (KiB)  (formulations.memory)
    memory.offload:  sum_c (state_offload_bytes_z[p] + offact[p]) w[c] <= offload memory (KiB)
    target:          sum_c step[c] w[c] <= target;  sum_c n[p] step[c] w[c] <= GPU-seconds cap
    minimise         sum_c score[c] w[c]        (optimizer.prepare.objective: step time, GPUs x step,
                                                 GPUs x BIG + step)
Rules that CP-SAT posts on (zi, di): no ZeRO stage > 0 and DP overlap forced on without a data-parallel
group (`rules.dp1`) decide which choices exist.
"""

from __future__ import annotations

import time as _time

import numpy as np

from formulations.bounds import NONE, knobs_of_pairs, layout_groups, presolve
from formulations.model import Outcome, _infeasible
from formulations.pairs import Q
from formulations.tables import TIME_UNIT, build_all
from optimizer.errors import Infeasible, ProblemError, Reason, TimeLimit
from optimizer.model.compose import PIPE, pipeline_sum
from optimizer.model.terms import compose_step
from optimizer.prepare.objective import gpu_time_cap, target
from optimizer.prepare.objective import score as objective_score
from optimizer.prepare.space import compact_space
from optimizer.rules.layout import dp_overlap_allowed, zero_allowed
from optimizer.schema import Problem
from optimizer.schema.stack import overlaps_pipelined_dp

SOLVERS = ("highs", "gurobi", "cplex", "cbc", "scip", "glpk")


def choices(T, pre) -> dict[str, np.ndarray]:
    """Every legal (pair, ZeRO index, DP-overlap index) of the kept pairs with its step time, score and
    memory terms (integers: TIME_UNIT, KiB)."""
    cols, P = pre.cols, pre.pairs
    n = len(P)
    pipe = pipeline_sum({k: np.asarray(cols[k], dtype=np.int64) for k in PIPE})
    dpg1 = np.asarray(cols["dpg1"]).astype(bool)
    out = {k: [] for k in ("p", "zi", "di", "step", "hbm", "off", "n")}
    ngpu = np.asarray(cols["n_gpus"], dtype=np.int64) * np.ones(n, dtype=np.int64)
    for j, z in enumerate(T.z_vals):
        for k, d in enumerate(T.dpo_vals):
            ok = zero_allowed(z, dpg1) & dp_overlap_allowed(
                np.full(n, int(d) == 1),
                dpg1,
                np.asarray(cols["ppgt1"]) == 1,
                1 in T.dpo_vals,
                overlaps_pipelined_dp(T.problem.stack),
            )
            if d:
                dp = -((-np.asarray(cols[f"ovl{z}"], dtype=np.int64)) // Q)  # ceil
            else:
                dp = np.asarray(cols[f"link{z}"], dtype=np.int64)
            dp = np.maximum(dp, 0)
            # as step_time.build: the DP and optimizer parts hold the slowdown and FSDP's copies
            step = compose_step(pipe, dp, 0, np.asarray(cols[f"opt{z}"], dtype=np.int64), 0)
            idx = np.nonzero(ok)[0]
            out["p"].append(idx)
            out["zi"].append(np.full(len(idx), j))
            out["di"].append(np.full(len(idx), k))
            out["step"].append(step[idx])
            out["hbm"].append((np.asarray(cols[f"state_hbm_bytes_z{z}"], dtype=np.int64) + cols["act"])[idx])
            off = np.asarray(cols[f"state_offload_bytes_z{z}"], dtype=np.int64) + cols["offact"]
            out["off"].append(off[idx])
            out["n"].append(ngpu[idx])
    return {k: np.concatenate(v) for k, v in out.items()}


def build_pyomo(problem: Problem, T, pre):
    """The Pyomo ConcreteModel and its choice table."""
    import pyomo.environ as pyo

    C = choices(T, pre)
    tg, cap = target(problem, TIME_UNIT), gpu_time_cap(problem, TIME_UNIT)
    # the score of `optimizer.prepare.objective` per choice (TIME_UNIT); a choice that misses a target
    # cannot be chosen
    sc = objective_score(problem, C["n"], C["step"], unit=TIME_UNIT, missed=NONE)
    keep = sc < NONE
    m = pyo.ConcreteModel(name=problem.name or "paraplan")
    idx = np.nonzero(keep)[0]
    m.C = pyo.Set(initialize=range(len(idx)), ordered=True)
    m.w = pyo.Var(m.C, domain=pyo.Binary)

    def f(a):
        return {i: float(a[idx[i]]) for i in range(len(idx))}

    step, hbm, off, scv, ng = f(C["step"]), f(C["hbm"]), f(C["off"]), f(sc), f(C["n"])

    def scaled(coef: dict, rhs: float | None = None):
        """MILP solvers refuse coefficients past ~1e15 (HiGHS) and lose precision well before: a row (or
        the objective) whose values exceed 1e12 is divided by a power of ten (GPUs x 10^5 s in ns reaches
        1e16)."""
        top = max([abs(v) for v in coef.values()] + ([abs(rhs)] if rhs is not None else []) + [1.0])
        k = 10.0 ** max(0, int(np.ceil(np.log10(top / 1e12))))
        return {i: v / k for i, v in coef.items()}, (None if rhs is None else rhs / k)

    m.one = pyo.Constraint(expr=sum(m.w[i] for i in m.C) == 1)
    m.memory_hbm = pyo.Constraint(expr=sum(hbm[i] * m.w[i] for i in m.C) <= float(T.cap_kib))
    if any(v != 0 for v in off.values()):
        m.memory_offload = pyo.Constraint(expr=sum(off[i] * m.w[i] for i in m.C) <= float(T.off_cap_kib))
    if tg is not None:
        m.target = pyo.Constraint(expr=sum(step[i] * m.w[i] for i in m.C) <= float(np.floor(tg)))
    if cap is not None:
        gs, rhs = scaled({i: ng[i] * step[i] for i in m.C}, float(np.floor(cap)))
        m.gpu_seconds = pyo.Constraint(expr=sum(gs[i] * m.w[i] for i in m.C) <= rhs)
    if pre.incumbent.ub < NONE:
        inc, rhs = scaled(scv, float(pre.incumbent.ub))
        m.incumbent = pyo.Constraint(expr=sum(inc[i] * m.w[i] for i in m.C) <= rhs)
    objc, _ = scaled(scv)
    m.obj_scale = next((scv[i] / objc[i] for i in m.C if objc[i]), 1.0)  # score = objective x obj_scale
    m.obj = pyo.Objective(expr=sum(objc[i] * m.w[i] for i in m.C), sense=pyo.minimize)
    m.cuts = pyo.ConstraintList()
    C = {k: v[idx] for k, v in C.items()} | {"score": sc[idx]}
    return m, C


def _solver(name: str):
    import pyomo.environ as pyo

    if name not in SOLVERS:
        raise ProblemError("--solver", None, None, f"unknown solver {name!r} (one of {', '.join(SOLVERS)})")
    if name == "highs":
        return None  # formulations.highs_worker
    s = pyo.SolverFactory(name)
    if not s.available(exception_flag=False):
        raise ProblemError("--solver", None, None, f"solver {name!r} is not available on this machine")
    return s


def run_highs(m, time_limit_s: float) -> dict:
    """Solve the Pyomo model with HiGHS in a worker process (formulations.highs_worker: highspy and ortools
    cannot share a process). Returns {status, objective, bound, values: {name: value}, by_name: {component
    name: value}, by_var: {variable: value}}; read values by variable (`by_var`), since Pyomo quotes an index
    that holds a comma or quote in the component's name."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "model.mps")
        _, sid = m.write(path, format="mps", io_options={"symbolic_solver_labels": True})
        smap = m.solutions.symbol_map[sid]
        out = subprocess.run(
            [sys.executable, "-m", "formulations.highs_worker", path, str(max(0.1, time_limit_s))],
            capture_output=True,
            text=True,
            cwd=str(Path(__file__).resolve().parent.parent),
        )
    if out.returncode != 0:  # pragma: no cover - the worker failed to load highspy
        raise RuntimeError(f"HiGHS worker failed: {out.stderr.strip()[-500:]}")
    from pyomo.common.collections import ComponentMap

    from formulations.highs_worker import MARKER

    line = next((x for x in reversed(out.stdout.splitlines()) if x.startswith(MARKER)), None)
    if line is None:  # pragma: no cover - the worker died before printing its result
        raise RuntimeError(f"HiGHS worker gave no result: {(out.stdout + out.stderr).strip()[-500:]}")
    r = json.loads(line[len(MARKER) :])
    r["by_name"] = {smap.bySymbol[n].name: v for n, v in r["values"].items() if n in smap.bySymbol}
    r["by_var"] = ComponentMap((smap.bySymbol[n], v) for n, v in r["values"].items() if n in smap.bySymbol)
    return r


def write_model(problem: Problem, path: str) -> None:
    """Write the MILP (LP or MPS by the file's extension) without solving it."""
    c = compact_space(problem)
    Ts = build_all(problem, c)
    pre = presolve(Ts, 1)
    if len(pre.pairs) == 0:
        raise _infeasible(problem, c.size)
    m, _ = build_pyomo(problem, Ts[0], pre)
    m.write(path, io_options={"symbolic_solver_labels": True})


def _cut(m, sel: int, group: np.ndarray | None) -> None:
    """Forbid the binary `sel` just chosen, or (`group`: each binary's layout group) every binary of its
    layout, for the next solve."""
    if group is None:
        m.cuts.add(m.w[sel] == 0)
    else:
        m.cuts.add(sum(m.w[j] for j in np.flatnonzero(group == group[sel]).tolist()) == 0)


def solve_pyomo(
    problem: Problem,
    top: int = 1,
    time_limit_s: float = 60.0,
    t0: float | None = None,
    solver: str = "highs",
    distinct: bool = False,
) -> Outcome:
    """The same `Outcome` as `formulations.model.solve_cpsat` (assignments, objectives, status, bound;
    `distinct`: each of the `top` plans another layout); extraction and verification are
    `optimizer.drivers.solve`'s."""
    import pyomo.environ as pyo

    t0 = t0 if t0 is not None else _time.perf_counter()
    c = compact_space(problem)
    if c.size == 0:
        raise Infeasible(
            "no legal plan: no (tp, pp, dp, vpp, micro-batch) satisfies the integer rules "
            "(run `paraplan check` for why)",
            reason=Reason.RULES,
        )
    Ts = build_all(problem, c)
    T = Ts[0]
    pre = presolve(Ts, top, distinct=distinct)
    if len(pre.pairs) == 0:
        raise _infeasible(problem, c.size)
    m, C = build_pyomo(problem, T, pre)
    group = layout_groups(T)[pre.pairs.li[np.asarray(C["p"])]]  # per binary, its layout's degrees
    if len(C["p"]) == 0:
        raise _infeasible(problem, c.size)
    s = _solver(solver)
    knobs, objs = [], []
    status_name, bound, gap = "optimal", None, None
    goal = problem.objective.goal.value
    for i in range(top):
        left = time_limit_s - (_time.perf_counter() - t0)
        if s is None:
            r = run_highs(m, left)
            ok_opt, has = r["status"] == "Optimal", r["objective"] is not None
            tc = r["status"]
        else:
            res = s.solve(m, load_solutions=False, timelimit=max(1, int(left)))
            tc = res.solver.termination_condition
            ok_opt, has = str(tc) == "optimal", len(res.solution) > 0
        if not has:
            if i > 0:
                break
            if str(tc).lower() == "infeasible":
                raise _infeasible(problem, c.size)
            raise TimeLimit(
                f"no plan found within {time_limit_s:g} s ({solver}: {tc}): not a proof that nothing "
                "fits; raise --time-limit"
            )
        if s is None:
            best, bnd = r["objective"], r["bound"]
            best, bnd = best * m.obj_scale, (None if bnd is None else bnd * m.obj_scale)
            sel = [j for j in m.C if r["values"].get(f"w({j})", 0.0) > 0.5][0]
        else:
            m.solutions.load_from(res)
            best = pyo.value(m.obj) * m.obj_scale
            bnd = best if ok_opt else None
            sel = [j for j in m.C if pyo.value(m.w[j]) > 0.5][0]
        if i == 0:
            if not ok_opt:
                status_name = "feasible"
            if bnd is not None and best:
                gap = max(0.0, (best - bnd) / best)
            if goal == "step_time" and bnd is not None:
                bound = bnd / TIME_UNIT
        p, zi, di = int(C["p"][sel]), int(C["zi"][sel]), int(C["di"][sel])
        objs.append(float(C["step"][sel]) / TIME_UNIT)
        knobs.append(knobs_of_pairs(Ts, pre.pairs.take(np.array([p])), np.array([zi]), np.array([di])))
        _cut(m, sel, group if distinct else None)
    notes = [
        f"presolve: {pre.n_triples_kept:,} of {pre.n_triples:,} triples kept; {len(pre.pairs):,} pairs",
        f"Pyomo MILP ({solver}): {len(C['p'])} binaries (pair x ZeRO stage x DP overlap)",
    ]
    return Outcome(status_name, knobs, objs, c.size, bound, gap, notes)
