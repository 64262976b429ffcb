"""`paraplan validate`: predict every run of a calibration file and score the model against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optimizer.errors import ParaplanError
from optimizer.io.runs import load_runs, map_run, order_precisions, precision_key, predict, run_target


def _group(rows: list[dict], key: str) -> dict:
    """Rows by the value of `key`, in sorted order of the values (None last)."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: (r.get(key) is None, str(r.get(key)))):
        out.setdefault(r.get(key), []).append(r)
    return out


@dataclass(frozen=True)
class ValidateResult:
    """`paraplan validate`'s answer: one row per run (`runs`: id, status ok|skipped|error, reason, predicted
    and target step time in s, error_pct, predicted and target peak memory in GiB, fits, stack, assumptions,
    precision, precision_group) and their `summary` (n_runs, n_scored, mape_pct, max_abs_error_pct,
    memory_mape_pct, n_not_fitting, by_stack, precision_order); the CLI reference gives the JSON shape."""

    runs: list[dict[str, Any]]
    summary: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The `--json` object."""
        return {"runs": self.runs, "summary": self.summary}


def score_runs(path: str) -> ValidateResult:
    """Every run of a file predicted and scored (`paraplan validate`). Records are checked by the run schema
    when loaded (`runs.load_runs`); a run the model cannot express is an error row, never skipped."""
    from optimizer.progress import progress

    doc = load_runs(path)
    rows: list[dict[str, Any]] = []
    systems: dict = {}
    with progress("validate: runs", total=len(doc.data)) as step:
        for i, run in enumerate(doc.data):
            _score_one(doc, i, run, rows, systems)
            step()
    return _summarise(rows)


def _score_one(doc, i: int, run: dict, rows: list, systems: dict) -> None:
    """Map, predict and score run `i` of `doc`, appending its row to `rows`."""
    rid = run["id"]
    row: dict[str, Any] = {
        "id": rid,
        "status": "ok",
        "reason": None,
        "predicted_step_time_s": None,
        "target_step_time_s": None,
        "error_pct": None,
        "predicted_peak_memory_gib": None,
        "target_peak_memory_gib": None,
        "fits": None,
        "assumptions": [],
    }
    rows.append(row)
    try:
        mapped = map_run(run, systems)
        row["assumptions"] = mapped.assumptions
        if mapped.skip:
            row.update(status="skipped", reason=mapped.skip)
            return
        systems.setdefault(mapped.problem.system.name, mapped.problem.system)
        pred = predict(mapped)
    except ParaplanError as e:
        file, line = doc.locate((i,))
        row.update(status="error", reason=f"{file}:{line}: {e}")
        return
    r = pred.result
    t_pred = r["step_time"]
    row["stack"] = mapped.problem.stack.value
    row["predicted_step_time_s"] = t_pred
    row["predicted_peak_memory_gib"] = r["hbm_reserved"] / 2**30  # as frameworks report it (max reserved)
    row["fits"] = pred.fits
    row["chosen"] = {k: v for k, v in pred.execution.model_dump(mode="json").items() if k in mapped.free}
    target, how = run_target(run, mapped.problem)
    meas = run["measured"]
    if how:
        row["assumptions"].append(how)
    if meas.get("peak_memory_gib") is not None:
        row["target_peak_memory_gib"] = float(meas["peak_memory_gib"])
    if target is None:
        row.update(status="skipped", reason="no step-time, throughput or MFU target")
        return
    row["target_step_time_s"] = target
    row["error_pct"] = 100.0 * (t_pred - target) / target
    row["precision"] = str(run["parallel"]["precision"])
    row["precision_group"] = list(precision_key(run))


def _summarise(rows: list) -> ValidateResult:
    """The rows and their summary (runs scored, MAPE, memory MAPE, by stack)."""
    scored = [r for r in rows if r["status"] == "ok" and r["error_pct"] is not None]
    mem = [r for r in scored if r["target_peak_memory_gib"]]
    summary = {
        "n_runs": len(rows),
        "n_scored": len(scored),
        "mape_pct": sum(abs(r["error_pct"]) for r in scored) / len(scored) if scored else None,
        "max_abs_error_pct": max((abs(r["error_pct"]) for r in scored), default=None),
        "memory_mape_pct": (
            sum(
                abs(
                    100
                    * (r["predicted_peak_memory_gib"] - r["target_peak_memory_gib"])
                    / r["target_peak_memory_gib"]
                )
                for r in mem
            )
            / len(mem)
        )
        if mem
        else None,
        "n_not_fitting": sum(1 for r in scored if r["fits"] is False),
        "by_stack": {
            st: {
                "n": len(rs),
                "mape_pct": sum(abs(r["error_pct"]) for r in rs) / len(rs),
                "mean_signed_error_pct": sum(r["error_pct"] for r in rs) / len(rs),
            }
            for st, rs in _group(scored, "stack").items()
        },
        "precision_order": _precision_order(scored),
    }
    return ValidateResult(rows, summary)


def _precision_order(scored: list) -> dict[str, Any]:
    """Per (model, GPU, GPU count, sequence length, global batch) scored in several precisions: whether the
    model orders the precisions as measured (`runs.order_precisions`; one group's steps hold the same tokens,
    so the shorter step is the higher throughput)."""
    groups = order_precisions(
        (r["precision_group"], r["precision"], r["target_step_time_s"], r["predicted_step_time_s"])
        for r in scored
        if r.get("precision_group")
    )
    detail = [{"group": list(key), "measured": m, "predicted": p, "ordered": m == p} for key, m, p in groups]
    return {"n_groups": len(detail), "n_ordered": sum(d["ordered"] for d in detail), "groups": detail}
