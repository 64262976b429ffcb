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
import hashlib
import itertools
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.errors import Infeasible, ParaplanError, ProblemError, TimeLimit

REF_KINDS = {"llm": "llm", "system": "system"}


@dataclass
class StudyResult:
    """The rows of a study's points in order (`run_point`); a point's `status` is its solve's (optimal,
    feasible), its check's (fits, does not fit), `infeasible` (proven: an answer), `time_limit` (no plan by
    the limit, exit 4's meaning) or `error` (its values make an invalid problem, exit 2's meaning)."""

    study: object  # optimizer.schema.study.Study
    rows: list[dict]
    resumed: int = 0  # points whose rows were read from the journal of an earlier run, not solved again
    journal: str | None = None  # that journal's path

    def best(self) -> dict | None:
        """The row with the smallest step time among the points with a plan (a check study: that fits);
        None when no point has one."""
        with_plan = [r for r in self.rows if isinstance(r.get("step_time_s"), (int, float))]
        with_plan = [r for r in with_plan if r["status"] not in ("does not fit", "error", "time_limit")]
        return min(with_plan, key=lambda r: (r["step_time_s"], r["point"])) if with_plan else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out

    def exit_code(self) -> int:
        """2 when a point is an `error`, else 4 when a point passed its time limit without a plan, else 0."""
        statuses = {r["status"] for r in self.rows}
        return 2 if "error" in statuses else 4 if "time_limit" in statuses else 0


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
        where = doc.where.get(("base",), (doc.file, None))
        try:
            there = base_path.exists()
        except (OSError, ValueError) as e:  # a name the file system refuses (too long, a NUL byte)
            raise ProblemError(
                where[0],
                where[1],
                "base",
                f"{study.base[:200]}: not a file name ({getattr(e, 'strerror', None) or e})",
            ) from None
        if not there:
            raise ProblemError(where[0], where[1], "base", f"{study.base[:200]}: no such file")
        try:
            base = read_yaml(base_path)
        except ProblemError as e:
            if e.line is not None:  # an error inside the base file: its own file and line
                raise
            # the base cannot be read at all (a FIFO, a device, a folder): the study's base line says so
            raise ProblemError(where[0], where[1], "base", f"{study.base}: {e.message}") from None
        near = base_path.parent
    else:
        from optimizer.io.loader import Sourced

        base = Sourced(
            copy.deepcopy(study.base),
            {k[1:]: v for k, v in doc.where.items() if k[:1] == ("base",)},
            doc.file,
        )
        near = Path(path).parent
    if not isinstance(base.data, dict):
        raise ProblemError(base.file, 1, None, "the base problem must be a mapping")
    return study, base, near


def points(study) -> list[dict[str, Any]]:
    """Axis values of every point, in order."""
    keys = list(study.axes)
    vals = [study.axis_values(k) for k in keys]
    combos = zip(*vals, strict=True) if study.mode.value == "zip" else itertools.product(*vals)
    return [dict(zip(keys, c, strict=True)) for c in combos]


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


def axis_lines(path: str | Path) -> dict[str, tuple[str, int]]:
    """The (file, line) of each axis of a study file: where an error in a point's value of it is reported."""
    from optimizer.io.loader import read_yaml

    doc = read_yaml(path)
    return {k[1]: v for k, v in doc.where.items() if len(k) == 2 and k[0] == "axes"}


def point_problem(base, near: Path, axes: dict[str, Any], at: dict[str, tuple[str, int]] | None = None):
    """The problem of one point (resolved and validated like a file); `at` (`axis_lines`): an error in an
    axis' value (or path) is reported at the study's axis line rather than the base file's."""
    from optimizer.io.loader import Sourced, resolve_document, validate_problem

    data = copy.deepcopy(base.data)
    where = dict(base.where)
    for k, v in axes.items():
        _set(data, k, v)
        if at and k in at:
            loc = tuple(k.split("."))
            for n in range(1, len(loc) + 1):  # the path's own line, and its parents' that the base lacks
                if n == len(loc) or loc[:n] not in where:
                    where[loc[:n]] = at[k]
            for w in [w for w in where if w[: len(loc)] == loc and len(w) > len(loc)]:
                del where[w]  # the value replaced the base's fields below it
    return validate_problem(resolve_document(Sourced(data, where, base.file), near))


def _resolved(data: dict, near: Path) -> Any:
    """`data` with its library references (llm, system, catalog) read in, for a fingerprint; a reference that
    does not resolve stands as written (its points are error rows, keyed by what was written)."""
    from optimizer.io.loader import Sourced, resolve_document

    try:
        return resolve_document(Sourced(copy.deepcopy(data)), near).data
    except ParaplanError:
        return data


def point_keys(study, base, near: Path, pts: list[dict[str, Any]]) -> list[str]:
    """Each point's journal key: a SHA-256 of what its row depends on (the command, the time limit, the base
    problem with its library files read in, and the point's axis values, a library name among them read in
    too), so that a journal left by an edited study, base problem or library file is not reused."""
    common = json.dumps(
        [study.command.value, study.time_limit_s, base.data, _resolved(base.data, near)],
        sort_keys=True,
        default=str,
    )
    refs: dict[str, str] = {}  # a library name set by an axis -> its resolved content

    def ref(k: str, v: Any) -> Any:
        if k not in REF_KINDS or not isinstance(v, str):
            return v
        key = f"{k}\0{v}"
        if key not in refs:
            refs[key] = json.dumps(_resolved({k: v}, near), sort_keys=True, default=str)
        return refs[key]

    head = hashlib.sha256(common.encode()).hexdigest()
    return [
        hashlib.sha256(
            (head + json.dumps({k: ref(k, v) for k, v in p.items()}, sort_keys=True, default=str)).encode()
        ).hexdigest()
        for p in pts
    ]


_CACHE: dict[str, object] = {}  # per process: this study run's tables cache (`run` id -> TablesCache)


def shared_tables(problem, most: int | None, run: str = ""):
    """CP-SAT tables for `problem` built once per process at the study's largest GPU count `most`
    (`purchase.TablesCache`) and reused by every point that differs only in its GPU count: with idle GPUs
    allowed the larger space holds every smaller layout, so each point's solve is the same optimum on a
    subset. None where that does not hold (no `most`, idle GPUs not allowed). `run` names the study run, so a
    warm Ray worker builds them again for a new run rather than keeping an earlier run's."""
    if not most or not problem.options.allow_idle_gpus:
        return None
    from optimizer.drivers.purchase import TablesCache

    if run not in _CACHE:
        _CACHE.clear()
        _CACHE[run] = TablesCache(max_entries=1)  # one base problem at a time: bounded memory
    return _CACHE[run].get(problem, at_gpus=most)


def run_point(args: tuple) -> dict[str, Any]:
    """One point: (index, axes, command, base, near, time limit, largest GPU count of the study or None, run
    id, the study's axis lines) -> its row (never raises)."""
    i, axes, command, base, near, limit, most, run, at = args
    row: dict[str, Any] = {"point": i} | {
        f"axis.{k}": (v if not isinstance(v, (dict, list)) else json.dumps(v)) for k, v in axes.items()
    }
    try:
        problem = point_problem(base, near, axes, at)
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
    except TimeLimit as e:
        row |= {"status": "time_limit", "reason": str(e).replace("\n", "; ")}
    except ParaplanError as e:
        row |= {"status": "error", "reason": str(e).replace("\n", "; ")}
    except Exception as e:  # a defect at one point is that point's row: the other points still run
        row |= {"status": "error", "reason": _internal(e)}
    return row  # no wall-clock column: a resumed study's table equals an uninterrupted one's


def _internal(e: BaseException) -> str:
    """The one-line reason of an unexpected exception at a point (a defect of paraplan, not of the input)."""
    return f"internal error: {type(e).__name__}: {e}".replace("\n", "; ")


def _pooled_row(fut, args: tuple) -> dict[str, Any]:
    """The row of a point run in a worker; a worker that died (or a result that did not come back) is that
    point's `error` row rather than the end of the study."""
    try:
        return fut.result()
    except Exception as e:
        i, axes = args[0], args[1]
        return (
            {"point": i}
            | {f"axis.{k}": v for k, v in axes.items()}
            | {
                "status": "error",
                "reason": _internal(e),
            }
        )


def _journal_row(line: str) -> dict | None:
    """The row of one journal line; None for a line that is not one (not JSON, or JSON without a point key,
    as an older journal's): its point is solved again."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict) or not isinstance(row.get("key"), str) or "status" not in row:
        return None
    return row


class Journal:
    """Rows of finished points, one JSON line each with the point's key (`point_keys`), appended as they
    finish (the study's resume state): a row is reused only by a point of the same key."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: dict[str, dict] = {}  # key -> row
        try:
            path.open("a").close()  # refused before any point runs, not after the first
        except OSError as e:
            raise ProblemError(
                "--output", None, None, f"cannot write the journal {path}: {e.strerror}"
            ) from None
        text = path.read_text(errors="replace")
        if text and not text.endswith("\n"):  # a last line cut by a kill: dropped, so appends start clean
            text = text[: text.rfind("\n") + 1]
            with path.open("r+b") as f:
                f.truncate(len(text.encode()))
        for line in text.splitlines():
            row = _journal_row(line)
            if row is not None:
                self.rows[row["key"]] = row

    def add(self, row: dict, key: str) -> None:
        self.rows[key] = row = row | {"key": key}
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
                f.flush()  # in the kernel at once: a killed study keeps it (no fsync: not for power loss)
        except OSError as e:
            raise ProblemError(
                "--output", None, None, f"cannot write the journal {self.path}: {e.strerror}"
            ) from None

    def row(self, i: int, key: str) -> dict:
        """The row of point `i` (of key `key`) as the table has it: its index, no key."""
        return {k: v for k, v in self.rows[key].items() if k != "key"} | {"point": i}


def run_study(
    path: str | Path,
    output: str | Path,
    workers: int | None = None,
    ray_address: str | None = None,
    use_ray: bool = False,
) -> StudyResult:
    """Run (or resume) a study; returns its rows in point order. Finished points are journalled in
    `<output>.journal.jsonl` (the table itself is written by the caller: `optimizer.report.output`)."""
    from optimizer.progress import progress

    study, base, near = load_study(path)
    pts = points(study)
    out = Path(output)
    journal = Journal(out.with_suffix(out.suffix + ".journal.jsonl"))
    gpus = [p["num_gpus"] for p in pts if isinstance(p.get("num_gpus"), int)]
    most = (
        max(gpus) if gpus and len(gpus) == len(pts) else None
    )  # a GPU-count sweep: tables shared per process
    run = uuid.uuid4().hex
    keys = point_keys(study, base, near, pts)
    at = axis_lines(path)

    def record(row: dict) -> None:
        journal.add(row, keys[row["point"]])

    todo = [
        (i, p, study.command.value, base, near, study.time_limit_s, most, run, at)
        for i, p in enumerate(pts)
        if keys[i] not in journal.rows
    ]
    with progress(f"study {study.name or Path(path).stem}: points", len(pts)) as step:
        step(len(pts) - len(todo))
        if use_ray:
            _run_ray(todo, record, step, ray_address, workers)
        elif (workers or os.cpu_count() or 1) > 1 and len(todo) > 1:
            from optimizer.drivers.pool import process_pool

            n = workers or os.cpu_count() or 1
            with process_pool(n) as ex:
                run_pooled(ex, run_point, todo, record, step, window=2 * n)
        else:
            for t in todo:
                record(run_point(t))
                step()
    rows = [journal.row(i, k) for i, k in enumerate(keys)]
    return StudyResult(study, rows, len(pts) - len(todo), str(journal.path))


def run_pooled(ex, fn, todo: list, record, step, window: int) -> None:
    """`fn` of every item of `todo` on the executor `ex`, at most `window` submitted and not yet recorded at
    once (a million-point study holds a window of pickled calls, not a million), each result `record`ed
    (journaled) as it finishes, in any order."""
    from concurrent.futures import FIRST_COMPLETED, wait

    items = iter(todo)
    pending: dict = {}
    while True:
        for t in itertools.islice(items, max(0, window - len(pending))):
            pending[ex.submit(fn, t)] = t
        if not pending:
            return
        done, _ = wait(pending, return_when=FIRST_COMPLETED)
        for f in done:
            record(_pooled_row(f, pending.pop(f)))
            step()


def _run_ray(todo: list, record, step, address: str | None, workers: int | None) -> None:
    """The points as Ray tasks on an existing cluster (`address`) or a local one of `workers` CPUs; on a
    cluster that is already up, `workers` bounds the tasks in flight (the study uses that many CPUs of it)."""
    try:
        import ray
    except ImportError:
        raise ProblemError("--ray", None, None, "needs Ray: pip install 'paraplan[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(
            address=address,
            num_cpus=None if address else (workers or os.cpu_count()),
            include_dashboard=False,
            log_to_driver=False,
            ignore_reinit_error=True,
        )
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
                record(ray.get(d))
                step()
                if queue:
                    pending.append(task.remote(queue.pop(0)))
    finally:
        if started:
            ray.shutdown()
