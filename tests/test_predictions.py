"""Predictions committed before a new source is fitted (scripts/commit_predictions.py)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from helpers import ROOT

from optimizer.io.runs import load_runs

PRED = ROOT / "problems" / "runs" / "predictions"
FILES = sorted(PRED.glob("*.json"))


def test_there_are_committed_predictions():
    assert FILES, "problems/runs/predictions/ holds no predictions"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_predictions_name_their_commit_and_runs(path):
    """Each file names the commit that predicted it, its runs file, and a prediction (or the reason for none)
    for every run of that file, no more."""
    doc = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", doc["predicted_at_commit"])
    runs = load_runs(str(ROOT / doc["runs_file"])).data
    assert [r["id"] for r in doc["runs"]] == [r["id"] for r in runs] and doc["n_runs"] == len(runs)
    for r in doc["runs"]:
        assert r["status"] != "ok" or (r["predicted_step_time_s"] > 0 and r["error_pct"] is not None)
    if (ROOT / ".git").exists():  # a checkout: the commit exists and is an ancestor of this one
        ok = subprocess.run(
            ["git", "merge-base", "--is-ancestor", doc["predicted_at_commit"], "HEAD"], cwd=ROOT
        ).returncode
        assert ok == 0, f"{doc['predicted_at_commit']} is not an ancestor of HEAD"
