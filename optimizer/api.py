"""The Python API: paraplan's commands as functions (what the CLI calls), for notebooks and scripts.

    from optimizer import api

    problem = api.load("problems/default.yaml")          # a validated Problem (file:line:field errors)
    result = api.solve(problem, top=3)                   # proven-optimal plans, each re-evaluated
    best = result.plans[0]
    best.evaluation.execution.tp, best.objective_s       # knobs, step time in s
    api.rows(result)                                     # one flat dict per plan (knobs, times, memory, MFU)
    api.emit("megatron", problem, best)                  # a launch command for the plan

Errors are `optimizer.errors` exceptions: `ProblemError(s)` for bad input, `Infeasible` (with `.reason`:
rules, memory or target) when nothing fits, `TimeLimit` when the limit passed before any plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optimizer.schema import Execution, Problem


def load(path: str | Path) -> Problem:
    """A problem file (`paraplan solve`'s input), loaded and validated."""
    from optimizer.io.loader import load_problem

    return load_problem(path)


def evaluate(problem: Problem, execution: Execution | None = None):
    """Step time and memory of one execution (the problem's own by default): an `Evaluation` with `.result`
    (seconds, bytes), `.fits`, `.warnings`."""
    from optimizer.drivers.evaluate import evaluate_execution

    return evaluate_execution(problem, execution)


def solve(problem: Problem, top: int = 1, time_limit_s: float = 60.0, backend: str = "cpsat", **kw):
    """The `top` best plans of the problem's objective (a `SolveResult`: `.status`, `.plans`, `.bound_s`,
    `.gap`); `backend` cpsat or pyomo."""
    from optimizer.drivers.solve import solve as _solve

    return _solve(problem, top=top, time_limit_s=time_limit_s, backend=backend, **kw)


def check(path: str | Path):
    """Does the problem fit, why not, and what would (a `CheckResult`: `.fits`, `.conflicts`,
    `.relaxations`, `.freed`). Takes the file: the knobs it writes are the fixed ones."""
    from optimizer.drivers.check import check as _check
    from optimizer.io.loader import load_problem_doc

    return _check(*load_problem_doc(path))


def procure(path: str | Path, pareto: bool = False, time_limit_s: float = 60.0):
    """What to buy (a `ProcureResult`: `.best`, `.rows` per node type, `.pareto`)."""
    from optimizer.io.loader import load_procure
    from optimizer.drivers.procure import procure as _procure

    return _procure(load_procure(path), pareto=pareto, time_limit_s=time_limit_s)


def validate(runs_path: str | Path) -> dict[str, Any]:
    """The model against published runs (`paraplan validate --json`'s object)."""
    from optimizer.drivers.validate import score_runs

    return score_runs(str(runs_path))


def rows(result) -> list[dict[str, Any]]:
    """One flat dict per plan of a `SolveResult` (or one for an `Evaluation`)."""
    from optimizer.report.table import row

    if hasattr(result, "plans"):
        return [row(p.evaluation, plan=i + 1, objective_step_time_s=p.objective_s) for i, p in enumerate(result.plans)]
    return [row(result)]


def emit(target: str, problem: Problem, plan) -> str:
    """A plan (a `Plan`, an `Evaluation` or an `Execution`) for megatron, nemo, torchtitan or deepspeed."""
    from optimizer.report.export import emit as _emit

    ex = getattr(getattr(plan, "evaluation", plan), "execution", plan)
    return _emit(target, problem, ex)
