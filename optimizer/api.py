"""The Python API: paraplan's commands as functions (what the CLI calls), for notebooks and scripts.

    from optimizer import api

    problem = api.load("problems/default.yaml")          # a validated Problem (file:line:field errors)
    result = api.solve(problem, top=3)                   # proven-optimal plans, each re-evaluated
    best = result.plans[0]
    best.evaluation.execution.tp, best.objective_s       # knobs, step time in s
    api.rows(result)                                     # one flat dict per plan (knobs, times, memory, MFU)
    api.emit("megatron", problem, best)                  # a launch command for the plan
    api.text(result, problem), api.as_dict(result)       # the report, as `paraplan solve` prints it

Every command of the CLI is one function here (`evaluate`, `validate`, `solve`, `check`, `procure`, `fleet`,
`study`, `whatif`, `schema`); `text`, `as_dict`, `rows` and `plot` render any of their results, and `write`
writes one to a file by its suffix (.json, .csv, text).

Errors are `optimizer.errors` exceptions: `ProblemError(s)` for bad input, `Infeasible` (with `.reason`:
rules, memory or target) when nothing fits, `TimeLimit` when the limit passed before any plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optimizer.schema import Execution, Problem


def load(path: str | Path, require_execution: bool = False) -> Problem:
    """A problem file (`paraplan solve`'s input), loaded and validated; `require_execution`: it must write its
    `execution` (`paraplan evaluate`'s input)."""
    from optimizer.io.loader import load_problem

    return load_problem(path, require_execution=require_execution)


def evaluate(problem: Problem, execution: Execution | None = None):
    """Step time and memory of one execution (the problem's own by default): an `Evaluation` with `.result`
    (seconds, bytes), `.fits`, `.warnings`."""
    from optimizer.drivers.evaluate import evaluate_execution

    return evaluate_execution(problem, execution)


def solve(problem: Problem, top: int = 1, time_limit_s: float = 60.0, backend: str = "cpsat", **kw):
    """The `top` best plans of the problem's objective (a `SolveResult`: `.status`, `.plans`, `.bound_s`,
    `.gap`); `backend` cpsat or pyomo; `distinct=True`: the best plan of each of `top` different layouts."""
    from optimizer.drivers.solve import solve as _solve

    return _solve(problem, top=top, time_limit_s=time_limit_s, backend=backend, **kw)


def sat_params(text: str) -> dict[str, Any]:
    """CP-SAT parameters given as a JSON object (`--sat-params`), checked against CP-SAT's own names."""
    import json

    from formulations.model import check_params
    from optimizer.errors import ProblemError

    try:
        params = json.loads(text)
    except ValueError:
        params = None
    if not isinstance(params, dict):
        raise ProblemError("--sat-params", None, None, "expected a JSON object of CP-SAT parameters")
    check_params(params)
    return params


def write_model(problem: Problem, path: str | Path) -> None:
    """The problem's MILP (the kept pairs of `formulations.pyomo_model`) in LP or MPS format, by suffix."""
    from formulations.pyomo_model import write_model as _write_model

    _write_model(problem, str(path))


def check(path: str | Path, offload_gib: float = 512.0, offload_gbps: float = 64.0):
    """Does the problem fit, why not, and what would (a `CheckResult`: `.fits`, `.conflicts`,
    `.relaxations`, `.freed`, `.problem`). Takes the file: the knobs it writes are the fixed ones.
    `offload_gib`, `offload_gbps`: the offload memory (GiB per GPU, GB/s) tried when nothing fits."""
    from optimizer.drivers.check import check as _check
    from optimizer.io.loader import load_problem_doc

    return _check(*load_problem_doc(path), offload_gib=offload_gib, offload_gbps=offload_gbps)


def procure(path: str | Path, pareto: bool = False, time_limit_s: float = 60.0, plot: bool = False):
    """What to buy (a `ProcureResult`: `.best`, `.rows` per node type, `.pareto`); for a file with `sites`,
    where (a `MultisiteResult`: `.best` sites, links and scheme, `.single_site`, `.verdict()`, with `pareto`
    `.pareto`: the front of cost against days across sites). `plot`: a
    chart will be drawn (of one site's purchases: the Pareto front, so it is computed)."""
    from optimizer.drivers.procure import procure as _procure
    from optimizer.io.loader import load_any_procure
    from optimizer.schema.multisite import MultisiteProblem

    pp = load_any_procure(path)
    if isinstance(pp, MultisiteProblem):
        from optimizer.drivers.multisite import multisite, multisite_with_front

        return (multisite_with_front if pareto else multisite)(pp, time_limit_s=time_limit_s)
    return _procure(pp, pareto=pareto or plot, time_limit_s=time_limit_s)


def fleet(path: str | Path, time_limit_s: float = 60.0):
    """Nodes to buy per period and a schedule for a portfolio of jobs (a `FleetResult`: `.status`,
    `.cost_usd`, `.buy`, `.schedule`, `.problem`)."""
    from optimizer.drivers.fleet import fleet as _fleet
    from optimizer.io.loader import load_fleet

    return _fleet(load_fleet(path), time_limit_s=time_limit_s)


def study(
    path: str | Path,
    output: str | Path | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
):
    """Every point of a study file solved (or checked); a `StudyResult` (`.rows`, `.counts()`,
    `.exit_code()`). Resumes from `<output>.journal.jsonl` (output default: `<study>.csv` here) and writes
    the table to `output` by its suffix (CSV with a Parquet beside it when pyarrow is installed)."""
    from optimizer.drivers.study import run_study
    from optimizer.report.output import check_writable

    output = Path(output or f"{Path(path).stem}.csv")
    check_writable(output)
    r = run_study(path, output, workers=workers, ray_address=ray_address, use_ray=use_ray)
    write(output, text(r), as_dict(r), r.rows, parquet=True)
    return r


def whatif(problem: Problem, pct: float = 20.0, top: int = 10, band: float = 0.1, time_limit_s: float = 60.0):
    """What +pct% of each resource saves of the fastest step (s), and the plan best in the worst case over
    efficiency bands of +-band (a `WhatifResult`: `.base_step_s`, `.levers`, `.robust`); `time_limit_s` of
    each solve."""
    from optimizer.drivers.whatif import whatif as _whatif

    return _whatif(problem, pct=pct, top=top, band=band, time_limit_s=time_limit_s)


SCHEMA_KINDS = ("problem", "procure", "sites", "catalog", "system", "llm", "run", "fleet", "study")


def schema(kind: str = "problem") -> dict[str, Any]:
    """The JSON Schema of an input format (`SCHEMA_KINDS`)."""
    from optimizer.schema import LLM, System
    from optimizer.schema.fleet import FleetProblem
    from optimizer.schema.multisite import MultisiteProblem
    from optimizer.schema.procure import Catalog, ProcureProblem
    from optimizer.schema.run import Run
    from optimizer.schema.study import Study

    model = {
        "problem": Problem,
        "procure": ProcureProblem,
        "sites": MultisiteProblem,
        "catalog": Catalog,
        "system": System,
        "llm": LLM,
        "run": Run,
        "fleet": FleetProblem,
        "study": Study,
    }[kind]
    return model.model_json_schema()


def validate(runs_path: str | Path):
    """The model against published runs (a `ValidateResult`: `.runs`, one row each, and `.summary`)."""
    from optimizer.drivers.validate import score_runs

    return score_runs(str(runs_path))


def rows(result) -> list[dict[str, Any]]:
    """One flat dict per plan of a `SolveResult` (one for an `Evaluation`, none or one for a `CheckResult`);
    for the other results one per row of their answer: node type (procure), period of a job (fleet), point
    (study), resource (whatif), run (validate)."""
    from optimizer.report.table import flat, row

    kind = _kind(result)
    if kind == "solve":
        return [
            row(p.evaluation, plan=i + 1, objective_step_time_s=p.objective_s)
            for i, p in enumerate(result.plans)
        ]
    if kind == "evaluate":
        return [row(result)]
    if kind == "check":
        return [row(result.plan.plans[0].evaluation)] if result.fits else []
    if kind == "study":
        return result.rows
    key = {
        "procure": "node_types",
        "multisite": "considered",
        "fleet": "schedule",
        "whatif": "levers",
        "validate": "runs",
    }[kind]
    return [flat(x) for x in as_dict(result)[key]]


def text(result, problem: Problem | None = None, emit: str | None = None) -> str:
    """The text report of any command's result, as the CLI prints it; `emit`: with the plan for that
    framework."""
    kind = _kind(result)
    if kind == "evaluate":
        from optimizer.report.text import render_evaluation

        out = render_evaluation(result)
    elif kind == "solve":
        from optimizer.report.solve import render

        return render(problem, result, emit=emit)  # the plan for the framework under each plan
    elif kind == "whatif":
        from optimizer.report.whatif import render

        out = render(problem, result)
    elif kind == "validate":
        from optimizer.report.text import render_validation

        out = render_validation(result.as_dict())
    else:
        import importlib

        report = importlib.import_module(f"optimizer.report.{kind}")
        out = report.render(result.problem, result) if kind == "fleet" else report.render(result)
    found = plan_of(result, problem) if emit else None
    return out if found is None else out + "\n\n" + emit_block(emit, *found).rstrip("\n")


def as_dict(result, problem: Problem | None = None) -> dict[str, Any]:
    """The JSON object of any command's result, as `--json` prints it."""
    kind = _kind(result)
    if kind in ("whatif", "validate"):
        return result.as_dict()
    if kind == "evaluate":
        from optimizer.report.text import evaluation_dict

        return evaluation_dict(result)
    if kind == "study":
        return {
            "study": result.study.name,
            "points": len(result.rows),
            "counts": result.counts(),
            "resumed": result.resumed,
            "best_point": None if result.best() is None else result.best()["point"],
            "rows": result.rows,
        }
    import importlib

    report = importlib.import_module(f"optimizer.report.{kind}")
    return report.result_dict(problem, result) if kind == "solve" else report.result_dict(result)


def plot(result, path: str | Path, problem: Problem | None = None) -> list[str]:
    """A chart of the result (PNG; a study: PNGs in the folder `path`); the files written."""
    from optimizer.report import plots

    kind, path = _kind(result), str(path)
    if kind == "study":
        return plots.plot_study(result.rows, result.study, path)
    if kind == "solve":
        name = problem.name if problem is not None else None
        plots.plot_breakdown(
            [p.evaluation for p in result.plans],
            path,
            f"{name or 'solve'}: the {len(result.plans)} best plans, step time and memory by part",
        )
    elif kind == "procure":
        plots.plot_pareto(result, path)
    elif kind == "multisite":
        plots.plot_sites(result.considered, path, f"{result.problem.name or 'sites'}: {result.verdict()}")
    elif kind == "fleet":
        if result.status == "infeasible":
            return []
        plots.plot_gantt(result.problem, result, path)
    elif kind == "whatif":
        plots.plot_tornado(result, path)
    else:
        raise TypeError(f"no plot of a {kind} result")
    return [path]


def plan_of(result, problem: Problem | None = None):
    """(problem, execution) of the result's best plan, for `emit`; None when it has none (nothing fits, a
    pipelined mix of node types, a result that holds no plan). `problem`: the problem to emit it for (default:
    the result's own)."""
    kind = _kind(result)
    ev = None
    if kind == "evaluate":
        ev = result
    elif kind == "solve":
        ev = result.plans[0].evaluation
    elif kind == "check" and result.fits:
        ev, problem = result.plan.plans[0].evaluation, problem or result.problem
    elif kind == "procure" and result.best is not None and len(result.best.groups) == 1:
        plan = result.best.groups[0].plan
        ev, problem = (None, None) if plan is None else (plan.evaluation, None)
    elif kind == "whatif" and problem is not None and result.robust.robust_plan is not None:
        return problem, Execution.model_validate(result.robust.robust_plan)
    return None if ev is None else (problem or ev.problem, ev.execution)


def _kind(result) -> str:
    """Which command's result this is: evaluate, solve, check, procure, fleet, study, whatif or validate."""
    from optimizer.drivers.check import CheckResult
    from optimizer.drivers.evaluate import Evaluation
    from optimizer.drivers.fleet import FleetResult
    from optimizer.drivers.multisite import MultisiteResult
    from optimizer.drivers.procure import ProcureResult
    from optimizer.drivers.solve import SolveResult
    from optimizer.drivers.study import StudyResult
    from optimizer.drivers.validate import ValidateResult
    from optimizer.drivers.whatif import WhatifResult

    for kind, cls in (
        ("evaluate", Evaluation),
        ("solve", SolveResult),
        ("check", CheckResult),
        ("procure", ProcureResult),
        ("multisite", MultisiteResult),
        ("fleet", FleetResult),
        ("study", StudyResult),
        ("whatif", WhatifResult),
        ("validate", ValidateResult),
    ):
        if isinstance(result, cls):
            return kind
    raise TypeError(f"not a paraplan result: {type(result).__name__}")


def emitted(target: str, problem: Problem, execution) -> dict[str, Any]:
    """A plan for a framework as `--json` gives it: {"target", "text", "warnings"}."""
    from optimizer.report.export import emit as _emit
    from optimizer.report.export import stack_warnings

    return {
        "target": target,
        "text": _emit(target, problem, execution),
        "warnings": stack_warnings(target, execution),
    }


def emit_block(target: str, problem: Problem, execution) -> str:
    """A plan for a framework under its title, as the text reports print it."""
    from optimizer.report.export import block

    return block(target, problem, execution)


def check_writable(path: str | Path, flag: str = "--output", folder: bool = False) -> None:
    """Refuse (`ProblemError` naming `flag`) an output file, or with `folder` an output folder, that cannot be
    written, before any work is done."""
    from optimizer.report import output

    (output.check_writable_folder if folder else output.check_writable)(path, flag)


def to_json(obj: Any) -> str:
    """One JSON object (non-finite numbers as null)."""
    from optimizer.report.output import to_json as _to_json

    return _to_json(obj)


def write(path: str | Path, text: str, obj: Any, rows: list[dict] | None, parquet: bool = False) -> None:
    """The answer to a file by its suffix: .json the object, .csv the rows (None: refused), else the text."""
    from optimizer.report.output import write as _write

    _write(path, text, obj, rows, parquet=parquet)


def emit(target: str, problem: Problem, plan) -> str:
    """A plan (a `Plan`, an `Evaluation` or an `Execution`) for megatron, nemo, torchtitan, deepspeed or
    maxtext."""
    from optimizer.report.export import emit as _emit

    ex = getattr(getattr(plan, "evaluation", plan), "execution", plan)
    return _emit(target, problem, ex)
