"""Command line: thin. Parses flags, calls the API, renders. Errors: one line each, no traceback.

    paraplan evaluate PROBLEM.yaml [--json]     one configuration through the analytical model
    paraplan validate RUNS.yaml [--json]        the model against published runs
    paraplan solve PROBLEM.yaml [--top K] [--time-limit S] [--method cpsat|enumerate] [--json]
                   [--emit megatron]            the fastest execution, proven optimal
    paraplan check PROBLEM.yaml [--json]        does it fit, why not, what would
    paraplan procure PROBLEM.yaml [--pareto] [--json] [--plot FILE.png]
                                                what hardware to buy or rent, with its plan
    paraplan schema [--kind K]                  JSON Schema of problem, procure, catalog, system, llm or run files

Exit codes, one meaning each: 0 an answer; 2 bad input (file:line:field, or a bad flag); 3 proven that
nothing fits; 4 the time limit passed before any plan was found (not a proof); 5 an internal disagreement
between the solver and the model (a bug); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys


def _finite(obj):
    """JSON has no Infinity or NaN: they become null."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):  # numpy scalars
        return _finite(obj.item())
    return obj


EMIT = ["megatron", "nemo", "torchtitan", "deepspeed"]


def _emitted(target, problem, execution) -> dict:
    from optimizer.report.export import emit, stack_warnings

    return {"emit": {"target": target, "text": emit(target, problem, execution),
                     "warnings": stack_warnings(target, execution)}} if target else {}


def _write_output(args, text: str | None = None, obj=None, rows=None) -> bool:
    """--output FILE: the answer as JSON (.json), CSV (.csv, one row per plan) or text (any other name);
    False when no --output was given (the caller prints)."""
    path = getattr(args, "output", None)
    if not path:
        return False
    from optimizer.errors import ProblemError

    if path.lower().endswith(".json"):
        text = json.dumps(_finite(obj), indent=2, allow_nan=False, default=str) + "\n"
    elif path.lower().endswith(".csv"):
        from optimizer.report.table import to_csv

        if rows is None:
            raise ProblemError("--output", None, None, "this command has no plan rows to write as CSV")
        text = to_csv(rows)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError as e:
        raise ProblemError("--output", None, None, f"cannot write {path}: {e.strerror}") from None
    print(f"wrote {path}", file=sys.stderr)
    return True


def _print_emit(target, problem, execution) -> None:
    """--emit in text reports: the plan for the framework under its title (nothing without a plan)."""
    if target and execution is not None:
        from optimizer.report.export import block

        print("\n" + block(target, problem, execution), end="")


def _print_json(obj) -> None:
    print(json.dumps(_finite(obj), indent=2, allow_nan=False, default=str))


def _bounded(kind, lo: float, hi: float, what: str, lo_open: bool = False):
    """An argparse type: a number of `kind` in [lo, hi] ((lo, hi] with lo_open), NaN refused."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ((lo < v) if lo_open else (lo <= v)) or not v <= hi:
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]"
                                             if kind is float else f"{v} is outside {lo:g}..{hi:g}")
        return v
    return parse


_top = _bounded(int, 1, 1000, "a whole number")  # --top: plans
_seconds = _bounded(float, 0, 86400, "seconds", lo_open=True)  # --time-limit: up to a day
_amount = _bounded(float, 0, 1e9, "a number", lo_open=True)  # positive quantities (GiB, GB/s, %)


def _check_plot(path: str | None) -> None:
    """--plot is checked before any work: matplotlib installed, the folder there, a .png name."""
    from optimizer.errors import ProblemError

    if not path:
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ProblemError("--plot", None, None, "needs matplotlib: pip install 'paraplan[plot]'") from None
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ProblemError("--plot", None, None, f"folder {folder} does not exist")
    if not path.lower().endswith(".png"):
        raise ProblemError("--plot", None, None, f"{path}: the plot is a PNG file (name it *.png)")


def cmd_evaluate(args) -> int:
    from optimizer.drivers.evaluate import as_json, evaluate_execution
    from optimizer.io.loader import load_problem
    from optimizer.report.text import render_evaluation

    problem = load_problem(args.problem, require_execution=True)
    ev = evaluate_execution(problem)
    from optimizer.report.table import row

    if _write_output(args, render_evaluation(ev), as_json(ev) | _emitted(args.emit, problem, ev.execution), [row(ev)]):
        return 0
    if args.json:
        _print_json(as_json(ev) | _emitted(args.emit, problem, ev.execution))
    else:
        print(render_evaluation(ev))
        _print_emit(args.emit, problem, ev.execution)
    return 0


def cmd_validate(args) -> int:
    from optimizer.report.text import render_validation
    from optimizer.drivers.validate import score_runs

    v = score_runs(args.runs)
    if args.json:
        _print_json(v)
    else:
        print(render_validation(v))
    return 0


def cmd_solve(args) -> int:
    from optimizer.io.loader import load_problem
    from optimizer.errors import Infeasible, ProblemError, TimeLimit
    from optimizer.drivers.solve import render, result_dict, solve

    params = None
    if args.sat_params:
        from formulations.model import check_params

        try:
            params = json.loads(args.sat_params)
        except ValueError:
            params = None
        if not isinstance(params, dict):
            raise ProblemError("--sat-params", None, None, "expected a JSON object of CP-SAT parameters")
        check_params(params)
    _check_plot(args.plot)
    problem = load_problem(args.problem)
    for path in (args.write_lp, args.write_mps):
        if path:  # the MILP of the same kept pairs (formulations.pyomo_model), for any solver
            from formulations.pyomo_model import write_model

            write_model(problem, path)
    try:
        r = solve(problem, method=args.method, top=args.top, time_limit_s=args.time_limit, params=params,
                  backend=args.backend, solver=args.solver)
    except (Infeasible, TimeLimit) as e:
        if args.json:
            _print_json({"status": "infeasible" if isinstance(e, Infeasible) else "time_limit",
                         "reason": str(e.reason), "message": str(e), "plans": []})
        raise
    from optimizer.report.table import row

    if args.plot:
        from optimizer.report.plots import plot_breakdown

        plot_breakdown([p.evaluation for p in r.plans], args.plot, f"{problem.name or 'solve'}: the {len(r.plans)} "
                       "best plans, step time and memory by part")
        print(f"plot: {args.plot}", file=sys.stderr)
    rows = [row(p.evaluation, plan=i + 1, objective_step_time_s=p.objective_s) for i, p in enumerate(r.plans)]
    if _write_output(args, render(problem, r, emit=args.emit),
                     result_dict(problem, r) | _emitted(args.emit, problem, r.plans[0].evaluation.execution), rows):
        return 0
    if args.json:
        _print_json(result_dict(problem, r) | _emitted(args.emit, problem, r.plans[0].evaluation.execution))
    else:
        print(render(problem, r, emit=args.emit))
    return 0


def cmd_check(args) -> int:
    from optimizer.drivers.check import check, render, result_dict
    from optimizer.io.loader import load_problem_doc

    problem, written = load_problem_doc(args.problem)
    r = check(problem, written, offload_gib=args.offload_gib, offload_gbps=args.offload_gbps)
    ex = r.plan.plans[0].evaluation.execution if r.fits else None
    if args.json:
        _print_json(result_dict(r) | (_emitted(args.emit, problem, ex) if ex is not None else {}))
    else:
        print(render(r))
        _print_emit(args.emit, problem, ex)
    return 0 if r.fits else 3


def cmd_procure(args) -> int:
    from optimizer.io.loader import load_procure
    from optimizer.drivers.procure import plot_pareto, procure, render, result_dict

    _check_plot(args.plot)
    pp = load_procure(args.problem)
    r = procure(pp, pareto=args.pareto or bool(args.plot), time_limit_s=args.time_limit)
    if args.plot:
        plot_pareto(r, args.plot)
    if args.json:
        _print_json(result_dict(r))
    else:
        print(render(r))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0 if r.best is not None else 3


def cmd_fleet(args) -> int:
    from optimizer.drivers.fleet import fleet, plot_gantt, render, result_dict
    from optimizer.io.loader import load_fleet

    _check_plot(args.plot)
    fp = load_fleet(args.problem)
    r = fleet(fp, time_limit_s=args.time_limit)
    if args.plot and r.status != "infeasible":
        plot_gantt(fp, r, args.plot)
    if args.json:
        _print_json(result_dict(r))
    else:
        print(render(fp, r))
        if args.plot and r.status != "infeasible":
            print(f"plot: {args.plot}")
    return 0 if r.status != "infeasible" else 3


def cmd_study(args) -> int:
    from pathlib import Path

    from optimizer.drivers.study import load_study, plot_study, run_study

    if args.workers is not None and not 1 <= args.workers <= 1024:
        from optimizer.errors import ProblemError

        raise ProblemError("--workers", None, None, f"{args.workers} is outside 1..1024")
    study, _, _ = load_study(args.study)
    out = args.output or f"{Path(args.study).stem}.csv"
    rows = run_study(args.study, out, workers=args.workers, ray_address=args.ray or None, use_ray=args.ray is not None)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    print(f"paraplan study: {study.name or args.study}: {len(rows)} points ({', '.join(f'{v} {k}' for k, v in counts.items())}); "
          f"wrote {out}")
    if args.plot:
        for f in plot_study(rows, study, args.plot):
            print(f"plot: {f}")
    return 0


def cmd_whatif(args) -> int:
    from optimizer.io.loader import load_problem
    from optimizer.drivers.whatif import plot_tornado, render, whatif

    _check_plot(args.plot)
    problem = load_problem(args.problem)
    r = whatif(problem, pct=args.pct, top=args.top, band=args.band)
    if args.plot:
        plot_tornado(r, args.plot)
    if args.json:
        _print_json(r)
    else:
        print(render(problem, r))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def cmd_schema(args) -> int:
    from optimizer.schema import LLM, Problem, System
    from optimizer.schema.procure import Catalog, ProcureProblem
    from optimizer.schema.run import Run

    from optimizer.schema.fleet import FleetProblem
    from optimizer.schema.study import Study

    model = {"problem": Problem, "procure": ProcureProblem, "catalog": Catalog, "system": System, "llm": LLM,
             "run": Run, "fleet": FleetProblem, "study": Study}[args.kind]
    _print_json(model.model_json_schema())
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paraplan", description="Plan LLM training: fastest parallel execution, "
                                 "feasibility, hardware procurement (CP-SAT over an analytical model).")
    from optimizer import __version__

    ap.add_argument("--version", action="version", version=f"paraplan {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true", help="no progress bars on stderr")
    p = sub.add_parser("evaluate", parents=[common], help="step time and memory of the problem's execution")
    p.add_argument("problem")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--emit", choices=EMIT, help="also print the execution for a training framework")
    p.add_argument("--output", "-o", metavar="FILE", help="write the answer to FILE: .json, .csv or text")
    p.set_defaults(func=cmd_evaluate)
    p = sub.add_parser("validate", parents=[common], help="predict published runs (calibration schema) and score the model")
    p.add_argument("runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("solve", parents=[common], help="the fastest execution of the problem (exit 3 when nothing fits)")
    p.add_argument("problem")
    p.add_argument("--top", type=_top, default=1, help="K distinct plans, best first (1..1000)")
    p.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit, s")
    p.add_argument("--method", choices=["cpsat", "enumerate"], default="cpsat",
                   help="cpsat (proven optimum, default) or enumerate (the exhaustive oracle)")
    p.add_argument("--sat-params", metavar="JSON", help='CP-SAT parameters, e.g. \'{"num_workers": 2}\'')
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--emit", choices=EMIT, help="also print the plan for a training framework")
    p.add_argument("--output", "-o", metavar="FILE", help="write the answer to FILE: .json, .csv (a row per plan) or text")
    p.add_argument("--plot", metavar="FILE.png", help="draw each plan's step time and memory by part")
    p.add_argument("--backend", choices=["cpsat", "pyomo"], default="cpsat",
                   help="cpsat (default) or pyomo (the same kept pairs as a MILP)")
    p.add_argument("--solver", choices=["highs", "gurobi", "cplex", "cbc", "scip", "glpk"], default="highs",
                   help="MILP solver of --backend pyomo (default highs, via highspy)")
    p.add_argument("--write-lp", metavar="FILE", help="also write the MILP in LP format")
    p.add_argument("--write-mps", metavar="FILE", help="also write the MILP in MPS format")
    p.set_defaults(func=cmd_solve)
    p = sub.add_parser("check", parents=[common], help="does it fit? why not, and what smallest change would (exit 3: does not fit)")
    p.add_argument("problem")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--emit", choices=EMIT, help="when it fits, also print the plan for a training framework")
    p.add_argument("--offload-gib", type=_amount, default=512.0, help="offload memory to try when nothing fits")
    p.add_argument("--offload-gbps", type=_amount, default=64.0, help="its bandwidth, GB/s (PCIe 5 x16: 64)")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("procure", parents=[common], help="what hardware to buy or rent, and its plan (exit 3: nothing fits)")
    p.add_argument("problem")
    p.add_argument("--pareto", action="store_true", help="also the front of cost against time to train")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="plot the Pareto front (implies --pareto)")
    p.add_argument("--time-limit", type=_seconds, default=60.0, help="solver time limit per solve, s")
    p.set_defaults(func=cmd_procure)
    p = sub.add_parser("fleet", parents=[common], help="nodes to buy per period and a schedule for many training jobs (exit 3: infeasible)")
    p.add_argument("problem")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="draw the schedule as a Gantt chart")
    p.add_argument("--time-limit", type=_seconds, default=60.0, help="time limit of each solve, s")
    p.set_defaults(func=cmd_fleet)
    p = sub.add_parser("study", parents=[common], help="solve (or check) every point of axes over a base problem")
    p.add_argument("study")
    p.add_argument("--output", "-o", metavar="FILE.csv", help="the table (default: STUDY.csv here); a Parquet file "
                   "beside it with pyarrow; resumes from FILE.csv.journal.jsonl")
    p.add_argument("--workers", type=int, help="local processes (default: every core)")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS", help="run on Ray (an existing cluster's address, "
                   "or a local one without); needs pip install 'paraplan[ray]'")
    p.add_argument("--plot", metavar="FOLDER", help="line, heatmap and breakdown PNGs in FOLDER")
    p.set_defaults(func=cmd_study)
    p = sub.add_parser("whatif", parents=[common], help="what +X%% of each resource is worth; the robust plan")
    p.add_argument("problem")
    p.add_argument("--pct", type=_amount, default=20.0, help="how much more of each resource, %% (default 20)")
    p.add_argument("--top", type=_top, default=10, help="plans compared for robustness (default 10)")
    p.add_argument("--band", type=float, default=0.1, help="efficiency band, a fraction (default 0.1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="a tornado chart of the resources' value")
    p.set_defaults(func=cmd_whatif)
    p = sub.add_parser("schema", parents=[common], help="print the JSON Schema of an input format")
    p.add_argument("--kind", choices=["problem", "procure", "catalog", "system", "llm", "run", "fleet", "study"],
                   default="problem", help="which file format (default: problem)")
    p.set_defaults(func=cmd_schema)
    return ap


def main(argv: list[str] | None = None) -> int:
    from optimizer.errors import ParaplanError, ProblemErrors

    args = build_parser().parse_args(argv)
    from optimizer import progress

    progress.QUIET = bool(getattr(args, "quiet", False))
    try:
        return args.func(args)
    except ProblemErrors as e:
        for err in e.errors:
            print(f"error: {err}", file=sys.stderr)
        return e.exit_code
    except ParaplanError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
