"""Command line: thin. Parses flags, calls `optimizer.api`, prints. Errors: one line each, no traceback.

    paraplan evaluate PROBLEM.yaml              one configuration through the analytical model
    paraplan validate RUNS.yaml                 the model against published runs
    paraplan solve PROBLEM.yaml [--top K] [--method cpsat|enumerate]
                                                the fastest execution, proven optimal
    paraplan check PROBLEM.yaml                 does it fit, why not, what would
    paraplan procure PROBLEM.yaml [--pareto] [--plot FILE.png]
                                                what hardware to buy or rent, with its plan
    paraplan fleet FLEET.yaml                   nodes per period and a schedule for many jobs
    paraplan study STUDY.yaml [--workers N]     every point of axes over a base problem
    paraplan whatif PROBLEM.yaml [--pct P]      what +P% of each resource is worth; the robust plan
    paraplan schema [--kind K]                  JSON Schema of an input format

Shared flags, before or after the command, on every command they make sense for (`SHARED`): --json (one
JSON object on stdout), -o/--output FILE (the answer to FILE: .json, .csv a row per plan, point or node type,
any other name text), --time-limit S (each solve), -q/--quiet (no progress bars); --emit FRAMEWORK where the
answer has a plan.

Exit codes, one meaning each: 0 an answer; 2 bad input (file:line:field, or a bad flag); 3 proven that
nothing fits; 4 the time limit passed before any plan was found (not a proof); 5 an internal disagreement
between the solver and the model (a bug); 130 interrupted. `study` exits 2 when a point's values make an
invalid problem (an `error` row), else 4 when a point passed its time limit without a plan; its infeasible
points are answers (exit 0).
"""

from __future__ import annotations

import argparse
import sys

from optimizer import api
from optimizer.errors import ProblemError

EMIT = ["megatron", "nemo", "torchtitan", "deepspeed", "maxtext"]
# the shared flags each command takes (`_shared`): the same names and meaning on every command
SHARED = {
    "evaluate": ("json", "output", "quiet"),
    "validate": ("json", "output", "quiet"),
    "solve": ("json", "output", "time_limit", "quiet"),
    "check": ("json", "output", "quiet"),
    "procure": ("json", "output", "time_limit", "quiet"),
    "fleet": ("json", "output", "time_limit", "quiet"),
    "study": ("json", "output", "quiet"),
    "whatif": ("json", "output", "time_limit", "quiet"),
    "schema": ("output", "quiet"),
}
DEFAULTS = {"json": False, "output": None, "time_limit": 60.0, "quiet": False}
OUTPUT_HELP = {
    "study": "the table: .csv (default STUDY.csv here; a Parquet file beside it with pyarrow), "
    ".json or text; resumes from FILE.journal.jsonl"
}


def _bounded(kind, lo: float, hi: float, what: str, lo_open: bool = False):
    """An argparse type: a number of `kind` in [lo, hi] ((lo, hi] with lo_open), NaN refused."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ((lo < v) if lo_open else (lo <= v)) or not v <= hi:
            raise argparse.ArgumentTypeError(
                f"{text} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]"
                if kind is float
                else f"{v} is outside {lo:g}..{hi:g}"
            )
        return v

    return parse


_top = _bounded(int, 1, 1000, "a whole number")  # --top: plans
_seconds = _bounded(float, 0, 86400, "seconds", lo_open=True)  # --time-limit: up to a day
_amount = _bounded(float, 0, 1e9, "a number", lo_open=True)  # positive quantities (GiB, GB/s, %)


def _band(text: str) -> float:
    """--band: the efficiency band of `paraplan whatif`, a fraction in (0, 1) (1 or more would scale an
    efficiency to zero or below)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction, got {text!r}") from None
    if not 0 < v < 1:  # NaN fails too
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1)")
    return v


def _check_plot(path: str | None) -> None:
    """--plot is checked before any work: matplotlib installed, the folder there, a .png name."""
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
    api.check_writable(path, "--plot")


def _shared(names, suppress: bool) -> argparse.ArgumentParser:
    """A parent parser of the shared flags `names`. Their defaults are SUPPRESS (`suppress`) so that a flag
    given before the command is not overwritten by the command's parser; `parse` fills in `DEFAULTS`."""
    sp = argparse.ArgumentParser(add_help=False)
    d = {"default": argparse.SUPPRESS} if suppress else {}
    if "json" in names:
        sp.add_argument("--json", action="store_true", help="print one JSON object", **d)
    if "output" in names:
        sp.add_argument(
            "--output",
            "-o",
            metavar="FILE",
            help="write the answer to FILE: .json, .csv (a row per plan) or text",
            **d,
        )
    if "time_limit" in names:
        sp.add_argument(
            "--time-limit", type=_seconds, metavar="S", help="time limit of each solve, s (default 60)", **d
        )
    if "quiet" in names:
        sp.add_argument("--quiet", "-q", action="store_true", help="no progress bars on stderr", **d)
    return sp


def _answer(args, result, problem=None) -> None:
    """The answer: to --output FILE (format by suffix), or one JSON object (--json), or the text report; with
    --emit, the plan for the framework (nothing where the answer has no plan)."""
    emit = getattr(args, "emit", None)
    obj = api.as_dict(result, problem)
    found = api.plan_of(result, problem) if emit else None
    if found is not None:
        obj = obj | {"emit": api.emitted(emit, *found)}
    if getattr(args, "emit_file", None):
        _write_emitted(args.emit_file, obj.get("emit"), emit)
    if args.output:
        api.write(args.output, api.text(result, problem, emit=emit), obj, api.rows(result))
        print(f"wrote {args.output}", file=sys.stderr)
    elif args.json:
        print(api.to_json(obj))
    else:
        print(api.text(result, problem, emit=emit))


def _write_emitted(path: str, emitted: dict | None, target: str) -> None:
    """The framework's config alone into `path` (`--emit-file`); where the answer has no plan, nothing."""
    from pathlib import Path

    from optimizer.errors import ProblemError

    if emitted is None:
        print(f"--emit-file: the answer has no plan; {path} not written", file=sys.stderr)
        return
    try:
        Path(path).write_text(emitted["text"].rstrip("\n") + "\n", encoding="utf-8")
    except OSError as e:
        raise ProblemError("--emit-file", None, None, f"cannot write {path}: {e.strerror}") from None
    print(f"wrote {path} ({target})", file=sys.stderr)


def _plotted(files) -> None:
    for f in files:
        print(f"plot: {f}", file=sys.stderr)


def cmd_evaluate(args) -> int:
    problem = api.load(args.problem, require_execution=True)
    _answer(args, api.evaluate(problem), problem)
    return 0


def cmd_validate(args) -> int:
    _answer(args, api.validate(args.runs))
    return 0


def cmd_solve(args) -> int:
    from optimizer.errors import Infeasible, TimeLimit

    params = api.sat_params(args.sat_params) if args.sat_params else None
    _check_plot(args.plot)
    problem = api.load(args.problem)
    for path in (args.write_lp, args.write_mps):
        if path:  # the MILP of the same kept pairs, for any solver
            api.write_model(problem, path)
    try:
        r = api.solve(
            problem,
            method=args.method,
            top=args.top,
            time_limit_s=args.time_limit,
            params=params,
            backend=args.backend,
            solver=args.solver,
            distinct=args.distinct == "layout",
        )
    except (Infeasible, TimeLimit) as e:
        if args.json:
            print(
                api.to_json(
                    {
                        "status": "infeasible" if isinstance(e, Infeasible) else "time_limit",
                        "reason": str(e.reason),
                        "message": str(e),
                        "plans": [],
                    }
                )
            )
        raise
    if args.plot:
        _plotted(api.plot(r, args.plot, problem))
    _answer(args, r, problem)
    return 0


def cmd_check(args) -> int:
    r = api.check(args.problem, offload_gib=args.offload_gib, offload_gbps=args.offload_gbps)
    _answer(args, r, r.problem)
    return 0 if r.fits else 3


def cmd_procure(args) -> int:
    _check_plot(args.plot)
    r = api.procure(args.problem, pareto=args.pareto, time_limit_s=args.time_limit, plot=bool(args.plot))
    if args.plot:
        _plotted(api.plot(r, args.plot))
    _answer(args, r)
    return 0 if r.best is not None else 3


def cmd_fleet(args) -> int:
    _check_plot(args.plot)
    r = api.fleet(args.problem, time_limit_s=args.time_limit)
    if args.plot:
        _plotted(api.plot(r, args.plot))
    _answer(args, r)
    return 0 if r.status != "infeasible" else 3


def cmd_study(args) -> int:
    """Exit 0 when every point has an answer (a plan, or proven infeasible); 2 when a point is an `error` (its
    values make an invalid problem); else 4 when a point passed its time limit without a plan."""
    if args.workers is not None and not 1 <= args.workers <= 1024:
        raise ProblemError("--workers", None, None, f"{args.workers} is outside 1..1024")
    if args.plot:
        api.check_writable(args.plot, "--plot", folder=True)
    r = api.study(
        args.study,
        args.output,
        workers=args.workers,
        ray_address=args.ray or None,
        use_ray=args.ray is not None,
    )
    if args.json:
        print(api.to_json(api.as_dict(r)))
    else:
        from pathlib import Path

        head = api.text(r).splitlines()  # the counts line, then the best point's line where one has a plan
        wrote = f"; wrote {args.output or Path(args.study).stem + '.csv'}"
        print("\n".join([head[0] + wrote, *[h for h in head[1:2] if h.startswith("best: ")]]))
    if args.plot:
        _plotted(api.plot(r, args.plot))
    return r.exit_code()


def cmd_whatif(args) -> int:
    _check_plot(args.plot)
    problem = api.load(args.problem)
    r = api.whatif(problem, pct=args.pct, top=args.top, band=args.band, time_limit_s=args.time_limit)
    if args.plot:
        _plotted(api.plot(r, args.plot))
    _answer(args, r, problem)
    return 0


def cmd_schema(args) -> int:
    s = api.schema(args.kind)
    if args.output:
        api.write(args.output, api.to_json(s), s, None)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(api.to_json(s))
    return 0


def _command(sub, name: str, func, help: str, positional: str | None = None, emit: str | None = None):
    """A command's parser: its positional file, its shared flags (`SHARED`), --emit (`emit`: its help)."""
    p = sub.add_parser(name, parents=[_shared(SHARED[name], suppress=True)], help=help)
    if positional:
        p.add_argument(positional)
    if emit:
        p.add_argument("--emit", choices=EMIT, help=emit)
        p.add_argument(
            "--emit-file",
            metavar="FILE",
            help="with --emit: write the framework's config alone to FILE (a file to run as it is); the "
            "answer is printed as usual",
        )
    if name in OUTPUT_HELP:
        next(a for a in p._actions if a.dest == "output").help = OUTPUT_HELP[name]
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The `paraplan` argument parser: the shared flags, then one subcommand per task in help order
    (planning, procurement, studies and what-ifs, the schema)."""
    ap = argparse.ArgumentParser(
        prog="paraplan",
        parents=[_shared(DEFAULTS, suppress=True)],
        description="Plan LLM training: fastest parallel execution, feasibility, "
        "hardware procurement (CP-SAT over an analytical model).",
    )
    from optimizer import __version__

    ap.add_argument("--version", action="version", version=f"paraplan {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    _plan_commands(sub)
    _procure_commands(sub)
    _study_commands(sub)
    p = _command(sub, "schema", cmd_schema, "print the JSON Schema of an input format")
    p.add_argument(
        "--kind",
        choices=list(api.SCHEMA_KINDS),
        default="problem",
        help="which file format (default: problem)",
    )
    return ap


def _plan_commands(sub) -> None:
    """Subcommands on one problem's plan: evaluate, validate, solve and check (with its offload flags)."""
    _command(
        sub,
        "evaluate",
        cmd_evaluate,
        "step time and memory of the problem's execution",
        "problem",
        emit="also print the execution for a training framework",
    )
    _command(
        sub,
        "validate",
        cmd_validate,
        "predict published runs (calibration schema) and score the model",
        "runs",
    )
    _solve_flags(
        _command(
            sub,
            "solve",
            cmd_solve,
            "the fastest execution of the problem (exit 3 when nothing fits)",
            "problem",
            emit="also print the plan for a training framework",
        )
    )
    p = _command(
        sub,
        "check",
        cmd_check,
        "does it fit? why not, and what smallest change would (exit 3: does not fit)",
        "problem",
        emit="when it fits, also print the plan for a framework",
    )
    p.add_argument(
        "--offload-gib", type=_amount, default=512.0, help="offload memory to try when nothing fits"
    )
    p.add_argument("--offload-gbps", type=_amount, default=64.0, help="its bandwidth, GB/s (PCIe 5 x16: 64)")


def _procure_commands(sub) -> None:
    """Subcommands that choose hardware: procure (with its Pareto front) and fleet (a schedule of jobs)."""
    p = _command(
        sub,
        "procure",
        cmd_procure,
        "what hardware to buy or rent, and its plan (exit 3: nothing fits)",
        "problem",
        emit="also print the best purchase's plan for a training framework (one node type)",
    )
    p.add_argument("--pareto", action="store_true", help="also the front of cost against time to train")
    p.add_argument("--plot", metavar="FILE.png", help="plot the Pareto front (implies --pareto)")
    p = _command(
        sub,
        "fleet",
        cmd_fleet,
        "nodes to buy per period and a schedule for many training jobs (exit 3: infeasible)",
        "problem",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw the schedule as a Gantt chart")


def _study_commands(sub) -> None:
    """Subcommands over many variants of a problem: study (axes over a base problem, local or Ray workers)
    and whatif (the worth of more of each resource, the robust plan)."""
    p = _command(
        sub,
        "study",
        cmd_study,
        "solve (or check) every point of axes over a base problem (exit 2: "
        "a point is an error row, its values an invalid problem; else 4: a point passed its time "
        "limit without a plan; infeasible points are answers)",
        "study",
    )
    p.add_argument("--workers", type=int, help="local processes (default: every core)")
    p.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run on Ray (an existing cluster's "
        "address, or a local one without); needs pip install 'paraplan[ray]'",
    )
    p.add_argument("--plot", metavar="FOLDER", help="line, heatmap and breakdown PNGs in FOLDER")
    p = _command(
        sub,
        "whatif",
        cmd_whatif,
        "what +X%% of each resource is worth; the robust plan",
        "problem",
        emit="also print the robust plan for a training framework",
    )
    p.add_argument(
        "--pct", type=_amount, default=20.0, help="how much more of each resource, %% (default 20)"
    )
    p.add_argument("--top", type=_top, default=10, help="plans compared for robustness (default 10)")
    p.add_argument(
        "--band", type=_band, default=0.1, help="efficiency band, a fraction in (0, 1) (default 0.1)"
    )
    p.add_argument("--plot", metavar="FILE.png", help="a tornado chart of the resources' value")


def _solve_flags(p) -> None:
    p.add_argument("--top", type=_top, default=1, help="K distinct plans, best first (1..1000)")
    p.add_argument(
        "--distinct",
        choices=["layout", "plan"],
        default="layout",
        help="with --top: each plan another layout (parallel degrees), the best of it (default), or the K "
        "best plans, which may share a layout",
    )
    p.add_argument(
        "--method",
        choices=["cpsat", "enumerate"],
        default="cpsat",
        help="cpsat (proven optimum, default) or enumerate (the exhaustive oracle)",
    )
    p.add_argument("--sat-params", metavar="JSON", help="CP-SAT parameters, e.g. '{\"num_workers\": 2}'")
    p.add_argument("--plot", metavar="FILE.png", help="draw each plan's step time and memory by part")
    p.add_argument(
        "--backend",
        choices=["cpsat", "pyomo"],
        default="cpsat",
        help="cpsat (default) or pyomo (the same kept pairs as a MILP)",
    )
    p.add_argument(
        "--solver",
        choices=["highs", "gurobi", "cplex", "cbc", "scip", "glpk"],
        default="highs",
        help="MILP solver of --backend pyomo (default highs, via highspy)",
    )
    p.add_argument("--write-lp", metavar="FILE", help="also write the MILP in LP format")
    p.add_argument("--write-mps", metavar="FILE", help="also write the MILP in MPS format")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; a shared flag given before a command that does not take it is a bad flag (exit 2)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    for name, default in DEFAULTS.items():
        if name in vars(args) and name not in SHARED[args.command]:
            ap.error(f"{args.command} takes no --{name.replace('_', '-')}")
        vars(args).setdefault(name, default)
    if getattr(args, "emit_file", None) and not args.emit:
        ap.error("--emit-file needs --emit FRAMEWORK")
    return args


def main(argv: list[str] | None = None) -> int:
    from optimizer import progress
    from optimizer.errors import ParaplanError, ProblemErrors

    args = parse(argv)
    progress.QUIET = bool(args.quiet)
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
