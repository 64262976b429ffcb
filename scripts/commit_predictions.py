#!/usr/bin/env python3
"""Freeze the model's predictions for a new source of published runs, before anything is fitted on it.

    python scripts/commit_predictions.py problems/runs/NEW.yaml   # problems/runs/predictions/NEW.json

A new source is first predicted by the model as it stands (`paraplan validate`'s scorer, the shipped system
files and constants); the file records, per run, the predicted and measured step time and the error, with
the commit the prediction was made at (the repository's HEAD, which must have no uncommitted change to the
model, its data or the runs file) and the date. Commit that file on its own; only then may a fit use the
runs. The before-fit error of each new source is what the documentation reports for it, and
tests/test_predictions.py checks that every predictions file names a commit and its runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from optimizer.drivers.validate import score_runs  # noqa: E402

OUT = ROOT / "problems" / "runs" / "predictions"
MODEL_PATHS = ("optimizer", "formulations", "problems/systems", "problems/llms")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def predictions(runs: Path) -> dict:
    """The predictions document of the runs file (`score_runs` as `paraplan validate` prints it)."""
    res = score_runs(str(runs)).as_dict()
    rows = [
        {
            "id": r["id"],
            "status": r["status"],
            "predicted_step_time_s": r.get("predicted_step_time_s"),
            "target_step_time_s": r.get("target_step_time_s"),
            "error_pct": r.get("error_pct"),
        }
        for r in res["runs"]
    ]
    s = res["summary"]
    return {
        "runs_file": str(runs.resolve().relative_to(ROOT)),
        "n_runs": s["n_runs"],
        "n_scored": s["n_scored"],
        "mape_pct": s["mape_pct"],
        "runs": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, help="the new source's runs file (calibration-run schema)")
    args = ap.parse_args()
    runs = args.runs.resolve()
    if not runs.is_file():
        print(f"{args.runs}: no such file", file=sys.stderr)
        return 2
    dirty = _git("status", "--porcelain", "--", *MODEL_PATHS, str(runs.relative_to(ROOT)))
    if dirty:
        print(f"uncommitted changes to the model or the runs: commit them first\n{dirty}", file=sys.stderr)
        return 2
    doc = {
        "predicted_at_commit": _git("rev-parse", "HEAD"),
        "date": datetime.date.today().isoformat(),
        "command": f"python scripts/commit_predictions.py {runs.relative_to(ROOT)}",
        **predictions(runs),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{runs.stem}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"wrote {path.relative_to(ROOT)}: {doc['n_scored']} of {doc['n_runs']} runs, MAPE {doc['mape_pct']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
