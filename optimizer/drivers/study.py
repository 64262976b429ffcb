"""`paraplan study STUDY.yaml`: many solves over axes of a base problem, on every core or a Ray cluster.

Stages: load the study (schema `optimizer.schema.study`) -> points (the axes crossed or zipped) -> each point
is the base problem document with its axis values set at their field paths, then resolved and validated as
any problem file (a bad value is that point's `error` row, with its message) -> solve or check -> one flat
row (axes, status, knobs, step time and its parts, memory parts, MFU/HFU: `optimizer.report.table`).

Runs on `--workers N` local processes (default: every core) or `--ray [ADDRESS]` (an existing cluster, or a
local one). Resumable: every finished point is appended to `<output>.journal.jsonl` at once; a re-run reads
the journal and solves only the points missing from it, so a killed study loses no point and solves none
twice, and the CSV (points in order) is the same as an uninterrupted run's.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import uuid
from pathlib import Path
from typing import Any

from optimizer.errors import Infeasible, ParaplanError, ProblemError

REF_KINDS = {"llm": "llm", "system": "system"}


def load_study(path: str | Path):
    """The validated study and the base problem document (a `Sourced`, references unresolved)."""
    from optimizer.io.loader import read_yaml, validate_model
    from optimizer.schema.study import Study

    doc = read_yaml(path)
    if not isinstance(doc.data, dict):
        raise ProblemError(doc.file, 1, None, "a study file must be a mapping")
    study = validate_model(Study, doc)
    if isinstance(study.base, str):
        base_path = Path(path).parent / study.base
        base = read_yaml(base_path)
        near = base_path.parent
    else:
        from optimizer.io.loader import Sourced

        base = Sourced(copy.deepcopy(study.base), {k[1:]: v for k, v in doc.where.items() if k[:1] == ("base",)},
                       doc.file)
        near = Path(path).parent
    if not isinstance(base.data, dict):
        raise ProblemError(base.file, 1, None, "the base problem must be a mapping")
    return study, base, near


def points(study) -> list[dict[str, Any]]:
    """Axis values of every point, in order."""
    keys = list(study.axes)
    vals = [study.axis_values(k) for k in keys]
    combos = zip(*vals) if study.mode.value == "zip" else itertools.product(*vals)
    return [dict(zip(keys, c)) for c in combos]


def _set(data: dict, path: str, value: Any) -> None:
    """Set a dotted field path; a library reference on the way (`system: h100-sxm-80gb`) becomes
    `{base: NAME}` so that its fields can be overridden."""
    parts = path.split(".")
    node = data
    for i, k in enumerate(parts[:-1]):
        cur = node.get(k)
        if isinstance(cur, str) and i == 0 and k in REF_KINDS:
            cur = {"base": cur}
        elif not isinstance(cur, dict):
            cur = {}
        node[k] = cur
        node = cur
    node[parts[-1]] = value


def point_problem(base, near: Path, axes: dict[str, Any]):
    """The problem of one point (resolved and validated like a file)."""
    from optimizer.io.loader import Sourced, resolve_document, validate_problem

    data = copy.deepcopy(base.data)
    for k, v in axes.items():
        _set(data, k, v)
    return validate_problem(resolve_document(Sourced(data, dict(base.where), base.file), near))


_CACHE: dict[str, object] = {}  # per process: this study run's tables cache (`run` id -> TablesCache)


def shared_tables(problem, most: int | None, run: str = ""):
    """CP-SAT tables for `problem` built once per process at the study's largest GPU count `most`
    (`purchase.TablesCache`) and reused by every point that differs only in its GPU count: with idle GPUs allowed
    the larger space holds every smaller layout, so each point's solve is the same optimum on a subset. None
    where that does not hold (no `most`, idle GPUs not allowed). `run` names the study run, so a warm Ray
    worker builds them again for a new run rather than keeping an earlier run's."""
    if not most or not problem.options.allow_idle_gpus:
        return None
    from optimizer.drivers.purchase import TablesCache

    if run not in _CACHE:
        _CACHE.clear()
        _CACHE[run] = TablesCache(max_entries=1)  # one base problem at a time: bounded memory
    return _CACHE[run].get(problem, at_gpus=most)


def run_point(args: tuple) -> dict[str, Any]:
    """One point: (index, axes, command, base, near, time limit, largest GPU count of the study or None, run
    id) -> its row (never raises)."""
    i, axes, command, base, near, limit, most, run = args
    row: dict[str, Any] = {"point": i} | {f"axis.{k}": (v if not isinstance(v, (dict, list)) else json.dumps(v))
                                         for k, v in axes.items()}
    try:
        problem = point_problem(base, near, axes)
        if command == "check":
            from optimizer.drivers.check import check

            r = check(problem, None)
            row["status"] = "fits" if r.fits else "does not fit"
            plan = r.plan.plans[0] if r.fits else None
            if not r.fits:
                row["reason"] = "; ".join(g for g, _ in r.conflicts)
        else:
            from optimizer.drivers.solve import solve

            r = solve(problem, time_limit_s=limit, tables=shared_tables(problem, most, run))
            row["status"] = r.status
            plan = r.plans[0]
        if plan is not None:
            from optimizer.report.table import row as plan_row

            row |= plan_row(plan.evaluation)
    except Infeasible as e:
        row |= {"status": "infeasible", "reason": str(e.reason)}
    except ParaplanError as e:
        row |= {"status": "error", "reason": str(e).replace("\n", "; ")}
    return row  # no wall-clock column: a resumed study's table equals an uninterrupted one's


class Journal:
    """Rows of finished points, one JSON line each, appended as they finish (the study's resume state)."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[int, dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill: its point is solved again
                self.rows[int(r["point"])] = r

    def add(self, row: dict) -> None:
        self.rows[int(row["point"])] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()  # in the kernel at once: a killed study keeps it (no fsync: power loss is not the case)


def run_study(path: str | Path, output: str | Path, workers: int | None = None, ray_address: str | None = None,
              use_ray: bool = False) -> list[dict]:
    """Run (or resume) a study; returns the rows in point order and writes `output` (CSV, and Parquet next to it
    when pyarrow is installed)."""
    from optimizer.progress import progress
    from optimizer.report.table import to_csv

    study, base, near = load_study(path)
    pts = points(study)
    out = Path(output)
    journal = Journal(out.with_suffix(out.suffix + ".journal.jsonl"))
    gpus = [p["num_gpus"] for p in pts if isinstance(p.get("num_gpus"), int)]
    most = max(gpus) if gpus and len(gpus) == len(pts) else None  # a GPU-count sweep: tables shared per process
    run = uuid.uuid4().hex
    todo = [(i, p, study.command.value, base, near, study.time_limit_s, most, run) for i, p in enumerate(pts)
            if i not in journal.rows]
    with progress(f"study {study.name or Path(path).stem}: points", len(pts)) as step:
        step(len(pts) - len(todo))
        if use_ray:
            _run_ray(todo, journal, step, ray_address, workers)
        elif (workers or os.cpu_count() or 1) > 1 and len(todo) > 1:
            from concurrent.futures import as_completed

            from optimizer.drivers.pool import process_pool

            with process_pool(workers or os.cpu_count() or 1) as ex:
                futs = [ex.submit(run_point, t) for t in todo]
                for f in as_completed(futs):
                    journal.add(f.result())
                    step()
        else:
            for t in todo:
                journal.add(run_point(t))
                step()
    rows = [journal.rows[i] for i in range(len(pts))]
    out.write_text(to_csv(rows))
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = list(dict.fromkeys(c for r in rows for c in r))
        table = pa.table({c: [None if r.get(c) is None else str(r.get(c)) for r in rows] for c in cols})
        pq.write_table(table, out.with_suffix(".parquet"))
    except ImportError:
        pass
    return rows


def _run_ray(todo: list, journal: Journal, step, address: str | None, workers: int | None) -> None:
    """The points as Ray tasks on an existing cluster (`address`) or a local one of `workers` CPUs; on a
    cluster that is already up, `workers` bounds the tasks in flight (the study uses that many CPUs of it)."""
    try:
        import ray
    except ImportError:
        raise ProblemError("--ray", None, None, "needs Ray: pip install 'paraplan[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=None if address else (workers or os.cpu_count()),
                 include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        started = True
    try:
        task = ray.remote(num_cpus=1)(run_point)
        window = len(todo) if not workers else workers
        queue = list(todo)
        pending = [task.remote(t) for t in queue[:window]]
        queue = queue[window:]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for d in done:
                journal.add(ray.get(d))
                step()
                if queue:
                    pending.append(task.remote(queue.pop(0)))
    finally:
        if started:
            ray.shutdown()


def plot_study(rows: list[dict], study, folder: str | Path) -> list[str]:
    """Line plot over the first axis (step time and MFU), heatmap over the first two (step time), stacked
    breakdown of step time per point; PNG files in `folder`, their paths returned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from optimizer.report.text import TIME_PARTS

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(study.axes)
    ok = [r for r in rows if r.get("step_time_s") not in (None, "")]
    files = []
    k0 = f"axis.{keys[0]}"
    numeric = all(isinstance(r.get(k0), (int, float)) for r in ok)
    if ok and (len(keys) == 1 or study.mode.value == "zip"):
        fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=130)
        xs = [r[k0] if numeric else i for i, r in enumerate(ok)]
        ax.plot(xs, [r["step_time_s"] for r in ok], ".-", color="tab:blue", label="step time, s")
        ax.set_xlabel(keys[0])
        ax.set_ylabel("step time, s")
        ax2 = ax.twinx()
        ax2.plot(xs, [100 * r["mfu"] for r in ok], ".-", color="tab:orange", label="MFU, %")
        ax2.set_ylabel("MFU, %")
        fig.legend(loc="upper right", fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.set_title(study.name or "study", fontsize=9)
        fig.tight_layout()
        files.append(str(folder / "line.png"))
        fig.savefig(files[-1])
        plt.close(fig)
    if ok and len(keys) >= 2 and study.mode.value == "cross":
        k1 = f"axis.{keys[1]}"
        def order(vals):
            vals = set(vals)
            num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
            return sorted(vals, key=(lambda v: v) if num else str)

        xv = order(r[k0] for r in rows)
        yv = order(r[k1] for r in rows)
        import numpy as np

        z = np.full((len(yv), len(xv)), np.nan)
        for r in ok:
            z[yv.index(r[k1]), xv.index(r[k0])] = r["step_time_s"]
        fig, ax = plt.subplots(figsize=(1.6 + 0.7 * len(xv), 1.4 + 0.5 * len(yv)), dpi=130)
        im = ax.imshow(z, cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(xv)), [str(v) for v in xv], fontsize=7)
        ax.set_yticks(range(len(yv)), [str(v) for v in yv], fontsize=7)
        ax.set_xlabel(keys[0])
        ax.set_ylabel(keys[1])
        for (yi, xi), v in np.ndenumerate(z):
            if v == v:
                ax.text(xi, yi, f"{v:.3g}", ha="center", va="center", fontsize=6, color="white")
        fig.colorbar(im, ax=ax, label="step time, s")
        ax.set_title(f"{study.name or 'study'}: step time (blank: nothing fits)", fontsize=8)
        fig.tight_layout()
        files.append(str(folder / "heatmap.png"))
        fig.savefig(files[-1])
        plt.close(fig)
    if ok and len(ok) <= 64:
        fig, ax = plt.subplots(figsize=(8, 1.6 + 0.3 * len(ok)), dpi=130)
        left = [0.0] * len(ok)
        cmap = plt.get_cmap("tab20")
        for j, (name, key) in enumerate(TIME_PARTS):
            vals = [float(r.get(f"time_s.{key}") or 0.0) for r in ok]
            if any(vals):
                ax.barh(range(len(ok)), vals, left=left, color=cmap(j % 20), label=name)
                left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(range(len(ok)), [", ".join(f"{k}={r[f'axis.{k}']}" for k in keys) for r in ok], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("step time, s")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=4, frameon=False)
        ax.set_title(f"{study.name or 'study'}: step time by part", fontsize=9)
        fig.tight_layout()
        files.append(str(folder / "breakdown.png"))
        fig.savefig(files[-1])
        plt.close(fig)
    return files
