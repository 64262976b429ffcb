#!/usr/bin/env python3
"""Fit the host time of an eager dropless MoE layer's forward on published MoE runs, and print it.

    python scripts/calibrate_host.py RUNS.yaml [RUNS.yaml ...] [--write]

Under eager launch a dropless MoE layer synchronises the host with the GPU once per forward (it reads the
routed token counts), so its forward takes at least the host time to issue it (`layer.MOE_HOST_FW_S`, less the
share CUDA graphs replay: `layer.GRAPH_HOST_SHARE`). One parameter for the Megatron-Core stack, shared by
every GPU (it is the host's work, not the GPU's), fitted on every Megatron-Core MoE run of the files by a grid
search minimising the mean |error| of their step times with every system as calibrated (`grid_fit.best_row`);
each run's leave-one-out error is always printed (`grid_fit.held_out`). `--write` sets `moe_host_fw_s` (its
value and the runs files) in optimizer/model/fitted.yaml, which `layer.MOE_HOST_FW_S` reads. The systems' own
fits (scripts/calibrate.py) come after this one, on the model with it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grid_fit import best_row, held_out, set_fitted  # noqa: E402

import optimizer.model.layer as layer  # noqa: E402
from optimizer.errors import ParaplanError  # noqa: E402
from optimizer.io.runs import load_runs, map_run, predict, run_target, stack_of  # noqa: E402

GRID_MS = np.round(np.arange(0.0, 12.001, 0.25), 2)


def moe_runs(files: list[str]) -> list[tuple[str, dict]]:
    """(id, record) of every Megatron-Core MoE run of the files."""
    return [
        (r["id"], r)
        for f in files
        for r in load_runs(f).data
        if r["model"].get("moe") and stack_of(r) == "megatron-core"
    ]


def error_table(runs: list[tuple[str, dict]]) -> tuple[list[str], np.ndarray]:
    """Signed % step-time error of each run (columns) at each grid value (rows); runs the model cannot score
    are reported and left out."""
    ids, cols = [], []
    saved = layer.MOE_HOST_FW_S
    try:
        for rid, r in runs:
            try:
                m = map_run(r)
                target = None if m.skip else run_target(r, m.problem)[0]
                if target is None:
                    continue
                col = []
                for h in GRID_MS:
                    layer.MOE_HOST_FW_S = h * 1e-3
                    col.append(100.0 * (predict(m).result["step_time"] - target) / target)
            except ParaplanError as e:
                print(f"  {rid}: not scored ({e})", file=sys.stderr)
                continue
            ids.append(rid)
            cols.append(col)
    finally:
        layer.MOE_HOST_FW_S = saved
    return ids, np.array(cols).T


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--write", action="store_true", help="set moe_host_fw_s in optimizer/model/fitted.yaml")
    args = ap.parse_args(argv)
    try:
        runs = moe_runs(args.runs)
    except ParaplanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("no Megatron-Core MoE run in these files", file=sys.stderr)
        return 2
    ids, err = error_table(runs)
    b, held = best_row(err), held_out(err)
    for i, rid in enumerate(ids):
        print(f"  {rid:55s} {err[0, i]:+7.1f}% without  {err[b, i]:+7.1f}%   held out {held[i]:+7.1f}%")
    print(
        f"MOE_HOST_FW_S {GRID_MS[b]:.2f} ms on {len(ids)} runs: MAPE {np.mean(np.abs(err[b])):.2f}% "
        f"(without the floor {np.mean(np.abs(err[0])):.2f}%); leave-one-out MAPE {np.mean(np.abs(held)):.2f}%"
    )
    if args.write:
        return set_fitted("moe_host_fw_s", round(float(GRID_MS[b]) * 1e-3, 6), " ".join(args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
