"""Plans as flat rows: one row per plan with the knobs, the step time and its parts, memory by part, MFU,
HFU and throughput (units in the column names), for CSV files (`--output plans.csv`) and studies."""

from __future__ import annotations

import csv
import io
from typing import Any

from optimizer.report.text import evaluation_dict


def _flat(prefix: str, d: dict) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(f"{prefix}{k}.", v))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def flat(d: dict) -> dict[str, Any]:
    """A nested dict as one flat row: keys joined by dots, lists left out."""
    return _flat("", d)


def row(ev: Any, **extra) -> dict[str, Any]:
    """One flat row of an evaluation: execution.*, step_time_s, time_s.*, memory_gib.*, mfu, hfu, ..."""
    d = evaluation_dict(ev)
    d.pop("warnings", None)
    return extra | _flat("", d)


def to_csv(rows: list[dict[str, Any]]) -> str:
    """CSV text with the union of the rows' columns, in first-seen order."""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r.get(c) for c in cols})
    return buf.getvalue()
