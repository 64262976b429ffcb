#!/usr/bin/env python3
"""Fit the caching allocator's slack on published runs with a measured peak memory, and print it.

    python scripts/calibrate_memory.py RUNS.yaml [RUNS.yaml ...] [--write]

Frameworks report the peak of `torch.cuda.max_memory_reserved()`: the tensors the model accounts for
(`StepResult.hbm` less the runtime's `reserved_gib`, which PyTorch does not count) plus what PyTorch's caching
allocator keeps on top of them (blocks rounded up, freed blocks held for reuse), never more than the memory
the runtime leaves it. One parameter, shared by every run, GPU and stack (they all allocate through it):

    reserved = min(allocated x (1 + ALLOCATOR_SLACK), hbm_gib - reserved_gib)

It is fitted by a grid search minimising the mean |error| of the predicted peaks (`grid_fit.best_row`), and
each run's leave-one-out error is always printed (`grid_fit.held_out`). `--write` sets `allocator_slack_ratio`
(its value and the runs files) in optimizer/model/fitted.yaml, which `step.ALLOCATOR_SLACK` reads. Runs
without `measured.peak_memory_gib` are ignored; a run the model cannot express is reported, not fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grid_fit import best_row, held_out, set_fitted  # noqa: E402

from optimizer.errors import ParaplanError  # noqa: E402
from optimizer.io.runs import load_runs, map_run, predict  # noqa: E402

GIB = 2.0**30
GRID = np.round(np.arange(0.0, 0.3001, 0.005), 3)


def measured_runs(files: list[str]) -> list[tuple[str, float, float, float]]:
    """(id, allocated GiB as the allocator counts it, usable GiB, measured peak GiB) of every run with a
    peak."""
    out = []
    for f in files:
        for run in load_runs(f).data:
            meas = run["measured"].get("peak_memory_gib")
            if not meas:
                continue
            m = map_run(run)
            if m.skip:
                print(f"  {run['id']:50s} skipped: {m.skip}")
                continue
            try:
                res = predict(m).result
            except ParaplanError as e:
                print(f"  {run['id']:50s} not fitted: {e}")
                continue
            ctx = m.problem.system.reserved_gib
            out.append((run["id"], res["hbm"] / GIB - ctx, m.problem.system.hbm_gib - ctx, float(meas)))
    return out


def errors(rows, slack: float) -> np.ndarray:
    """Signed % error of each run's predicted reserved peak."""
    return np.array([100.0 * (min(a * (1.0 + slack), max(u, a)) - m) / m for _, a, u, m in rows])


def error_table(rows) -> np.ndarray:
    """Signed % error of each run (columns) at each grid value of the slack (rows)."""
    return np.array([errors(rows, s) for s in GRID])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument(
        "--write", action="store_true", help="set allocator_slack_ratio in optimizer/model/fitted.yaml"
    )
    args = ap.parse_args()
    rows = measured_runs(args.runs)
    if not rows:
        print("no run with a measured peak memory", file=sys.stderr)
        return 2
    table = error_table(rows)
    b = best_row(table)
    s, e, held = float(GRID[b]), table[b], held_out(table)
    for (rid, a, _, m), x, h in zip(rows, e, held, strict=True):
        print(f"  {rid:50s} allocated {a:6.1f}  measured {m:6.1f} GiB  {x:+6.1f}%   held out {h:+6.1f}%")
    print(
        f"ALLOCATOR_SLACK {s:.3f} on {len(rows)} runs: MAPE {np.mean(np.abs(e)):.2f}%"
        f"  max {np.max(np.abs(e)):.1f}%;"
        f" leave-one-out MAPE {np.mean(np.abs(held)):.2f}%  max {np.max(np.abs(held)):.1f}%"
    )
    if args.write:
        return set_fitted("allocator_slack_ratio", round(s, 3), " ".join(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
