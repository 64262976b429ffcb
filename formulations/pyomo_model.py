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
    memory.hbm:      sum_c (wgo_z[p] + act[p]) w[c] <= HBM - headroom (KiB)   (formulations.memory)
    memory.offload:  sum_c (off_z[p] + offact[p]) w[c] <= offload memory (KiB)
    target:          sum_c step[c] w[c] <= target;  sum_c n[p] step[c] w[c] <= GPU-seconds cap
    minimise         sum_c score[c] w[c]        (optimizer.objective: step time, GPUs x step, GPUs x BIG + step)
Rules that CP-SAT posts on (zi, di): no ZeRO stage > 0 and DP overlap forced on without a data-parallel
group (`rules.dp1`) decide which choices exist.
"""

from __future__ import annotations

import time as _time

import numpy as np

from optimizer.errors import Infeasible, ProblemError
from optimizer.evaluate import evaluate_execution
from optimizer.model.knobs import to_execution
from optimizer.objective import BIG_S, describe, gpu_time_cap, gpus_used, target
from optimizer.schema import Problem
from optimizer.solve import Plan, SolveResult, verify
from optimizer.space import compact_space

from .bounds import NONE, knobs_of_pairs, presolve
from .pairs import PIPE, Q
from .tables import TIME_UNIT, build_all

SOLVERS = ("highs", "gurobi", "cplex", "cbc", "scip", "glpk")


def choices(T, pre) -> dict[str, np.ndarray]:
    """Every legal (pair, ZeRO index, DP-overlap index) of the kept pairs with its step time, score and
    memory terms (integers: TIME_UNIT, KiB)."""
    cols, P = pre.cols, pre.pairs
    n = len(P)
    pipe = sum(np.asarray(cols[k], dtype=np.int64) for k in PIPE)
    dpg1 = np.asarray(cols["dpg1"]).astype(bool)
    out = {k: [] for k in ("p", "zi", "di", "step", "hbm", "off", "n")}
    ngpu = np.asarray(cols["n_gpus"], dtype=np.int64) * np.ones(n, dtype=np.int64)
    for j, z in enumerate(T.z_vals):
        for k, d in enumerate(T.dpo_vals):
            ok = np.ones(n, dtype=bool)
            if z != 0:
                ok &= ~dpg1
            if (1 in T.dpo_vals) and int(d) != 1:
                ok &= ~dpg1
            if d:
                dp = -((-np.asarray(cols[f"ovl{z}"], dtype=np.int64)) // Q)  # ceil
            else:
                dp = np.asarray(cols[f"link{z}"], dtype=np.int64)
            dp = np.maximum(dp, 0)
            step = pipe + dp + np.asarray(cols[f"opt{z}"], dtype=np.int64)
            idx = np.nonzero(ok)[0]
            out["p"].append(idx)
            out["zi"].append(np.full(len(idx), j))
            out["di"].append(np.full(len(idx), k))
            out["step"].append(step[idx])
            out["hbm"].append((np.asarray(cols[f"wgo{z}"], dtype=np.int64) + cols["act"])[idx])
            out["off"].append((np.asarray(cols[f"off{z}"], dtype=np.int64) + cols["offact"])[idx])
            out["n"].append(ngpu[idx])
    return {k: np.concatenate(v) for k, v in out.items()}


def score(problem: Problem, step: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The score of `optimizer.objective` per choice, TIME_UNIT (as formulations.model.objective_score)."""
    g = problem.objective.goal.value
    if g == "step_time":
        return step
    if g == "tokens_per_gpu":
        return n * step
    return int(BIG_S * TIME_UNIT) * n + step


def build_pyomo(problem: Problem, T, pre):
    """The Pyomo ConcreteModel and its choice table."""
    import pyomo.environ as pyo

    C = choices(T, pre)
    tg, cap = target(problem, TIME_UNIT), gpu_time_cap(problem, TIME_UNIT)
    keep = np.ones(len(C["p"]), dtype=bool)
    # the rows below are posted as rows of the MILP; choices with a nonzero coefficient only are listed
    sc = score(problem, C["step"], C["n"])
    m = pyo.ConcreteModel(name=problem.name or "paraplan")
    idx = np.nonzero(keep)[0]
    m.C = pyo.Set(initialize=range(len(idx)), ordered=True)
    m.w = pyo.Var(m.C, domain=pyo.Binary)
    f = lambda a: {i: float(a[idx[i]]) for i in range(len(idx))}
    step, hbm, off, scv, ng = f(C["step"]), f(C["hbm"]), f(C["off"]), f(sc), f(C["n"])
    m.one = pyo.Constraint(expr=sum(m.w[i] for i in m.C) == 1)
    m.memory_hbm = pyo.Constraint(expr=sum(hbm[i] * m.w[i] for i in m.C) <= float(T.cap_kib))
    if any(v != 0 for v in off.values()):
        m.memory_offload = pyo.Constraint(expr=sum(off[i] * m.w[i] for i in m.C) <= float(T.off_cap_kib))
    if tg is not None:
        m.target = pyo.Constraint(expr=sum(step[i] * m.w[i] for i in m.C) <= float(np.floor(tg)))
    if cap is not None:
        m.gpu_seconds = pyo.Constraint(expr=sum(ng[i] * step[i] * m.w[i] for i in m.C) <= float(np.floor(cap)))
    if pre.incumbent.ub < NONE:
        m.incumbent = pyo.Constraint(expr=sum(scv[i] * m.w[i] for i in m.C) <= float(pre.incumbent.ub))
    m.obj = pyo.Objective(expr=sum(scv[i] * m.w[i] for i in m.C), sense=pyo.minimize)
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
    cannot share a process). Returns {status, objective, bound, values: {name: value}}."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "model.mps")
        _, sid = m.write(path, format="mps", io_options={"symbolic_solver_labels": True})
        smap = m.solutions.symbol_map[sid]
        out = subprocess.run([sys.executable, "-m", "formulations.highs_worker", path, str(max(0.1, time_limit_s))],
                             capture_output=True, text=True, cwd=str(Path(__file__).resolve().parent.parent))
    if out.returncode != 0:  # pragma: no cover - the worker failed to load highspy
        raise RuntimeError(f"HiGHS worker failed: {out.stderr.strip()[-500:]}")
    r = json.loads(out.stdout)
    r["by_name"] = {smap.bySymbol[n].name: v for n, v in r["values"].items() if n in smap.bySymbol}
    return r


def write_model(problem: Problem, path: str) -> None:
    """Write the MILP (LP or MPS by the file's extension) without solving it."""
    c = compact_space(problem)
    Ts = build_all(problem, c)
    pre = presolve(Ts, 1)
    if len(pre.pairs) == 0:
        raise Infeasible(f"nothing fits: none of {c.size:,} candidates is within memory, so there is no MILP to "
                         "write (run `paraplan check` for why)")
    m, _ = build_pyomo(problem, Ts[0], pre)
    m.write(path, io_options={"symbolic_solver_labels": True})


def solve_pyomo(problem: Problem, top: int = 1, time_limit_s: float = 60.0, t0: float | None = None,
                solver: str = "highs") -> SolveResult:
    import pyomo.environ as pyo

    t0 = t0 if t0 is not None else _time.perf_counter()
    c = compact_space(problem)
    if c.size == 0:
        raise Infeasible("no legal plan: no (tp, pp, dp, vpp, micro-batch) satisfies the integer rules "
                         "(run `paraplan check` for why)", reason="rules")
    Ts = build_all(problem, c)
    T = Ts[0]
    pre = presolve(Ts, top)
    if len(pre.pairs) == 0:
        raise Infeasible(f"nothing fits: none of {c.size:,} candidates is within memory "
                         "(run `paraplan check` for why and what would fit)")
    m, C = build_pyomo(problem, T, pre)
    s = _solver(solver)
    plans: list[Plan] = []
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
            if i == 0:
                if str(tc).lower() == "infeasible":
                    raise Infeasible(f"nothing fits: none of {c.size:,} candidates is within memory "
                                     "(run `paraplan check` for why and what would fit)")
                raise Infeasible(f"no plan found within {time_limit_s:g} s ({solver}: {tc})")
            break
        if s is None:
            best, bnd = r["objective"], r["bound"]
            sel = [j for j in m.C if r["values"].get(f"w({j})", 0.0) > 0.5][0]
        else:
            m.solutions.load_from(res)
            best = pyo.value(m.obj)
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
        obj = float(C["step"][sel]) / TIME_UNIT
        k = knobs_of_pairs(Ts, pre.pairs.take(np.array([p])), np.array([zi]), np.array([di]))
        ev = evaluate_execution(problem, to_execution(k, problem.system))
        verify(problem, ev, obj)
        plans.append(Plan(ev, obj))
        m.cuts.add(m.w[sel] == 0)
    n0 = gpus_used(plans[0].evaluation.execution)
    notes = [describe(problem, n0, plans[0].objective_s),
             f"presolve: {pre.n_triples_kept:,} of {pre.n_triples:,} triples kept; {len(pre.pairs):,} pairs",
             f"Pyomo MILP ({solver}): {len(C['p'])} binaries (pair x ZeRO stage x DP overlap)"]
    return SolveResult("pyomo", status_name, plans, c.size, None, _time.perf_counter() - t0, bound_s=bound,
                       gap=gap, notes=notes)
