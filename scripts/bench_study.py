#!/usr/bin/env python3
"""Benchmark of `paraplan study`: the 1,024-point sweep of GPT-3 175B on H100, 8 to 8192 GPUs in steps of 8
(idle GPUs allowed, so every point is a full solve: the fastest plan on at most that many GPUs).

    python scripts/bench_study.py [--json] [--points 1024] [--ray-points N] [--quick]

Prints {"points", "seconds", "ray_speedup", "resume_identical"}: the sweep's wall time on local processes
(every core), Ray with 2 workers in flight against 1 on the same sweep (one local Ray instance of 2 CPUs, up
and warm before timing; same machine, one run each; null without Ray), and whether a study killed half way
and resumed writes the same CSV as the whole run. Exit 1 when the resumed run or the two Ray runs write a CSV
other than the whole local run's (timings are reported, not checked). --quick: Llama 3.1 8B on 8 to 16 GPUs
(2 points), a smoke test of the same paths.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optimizer.api import study as run_study  # noqa: E402  (solves every point, writes the table)


def study(folder: Path, last: int, llm: str = "gpt3-175b", global_batch: int = 1536) -> Path:
    path = folder / f"sweep-{last}.yaml"
    path.write_text(
        f"name: {llm}-h100-sweep\nbase:\n  llm: {llm}\n  system: h100-sxm-80gb\n  num_gpus: 8\n"
        f"  training: {{global_batch: {global_batch}}}\n  options: {{allow_idle_gpus: true}}\n"
        f"axes:\n  num_gpus: {{from: 8, to: {last}, step: 8}}\n"
    )
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--points", type=int, default=1024)
    ap.add_argument("--ray-points", type=int, default=0, help="points of the Ray comparison (0: --points)")
    ap.add_argument("--quick", action="store_true", help="a 2-point sweep of Llama 3.1 8B (a smoke test)")
    a = ap.parse_args(argv)
    if a.quick:
        a.points, a.ray_points = 2, 2
    model = {"llm": "llama3.1-8b", "global_batch": 64} if a.quick else {}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        s = study(tmp, 8 * a.points, **model)
        t0 = time.perf_counter()
        rows = run_study(s, tmp / "full.csv").rows
        out["points"] = len(rows)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["statuses"] = {
            st: sum(1 for r in rows if r["status"] == st) for st in {r["status"] for r in rows}
        }
        # resume: kill a run once half its points are journaled, re-run, compare
        part, journal = tmp / "part.csv", tmp / "part.csv.journal.jsonl"
        proc = subprocess.Popen(
            [sys.executable, "-m", "optimizer.cli", "study", str(s), "-o", str(part), "-q"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # its worker processes die with it
        while proc.poll() is None and (
            not journal.exists() or len(journal.read_text().splitlines()) < a.points // 2
        ):
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        run_study(s, part)
        out["resume_identical"] = part.read_text() == (tmp / "full.csv").read_text()
        try:
            import ray

            # one local Ray instance of 2 CPUs, up before timing (as `--ray ADDRESS` finds a cluster up); a
            # short warm-up study starts both worker processes; then the same sweep with 1 and with 2 workers
            # in flight
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            try:
                run_study(study(tmp, 8 * 4, **model), tmp / "warm.csv", workers=2, use_ray=True)
                sr = study(tmp, 8 * (a.ray_points or a.points), **model)
                times = {}
                for w in (1, 2):
                    t0 = time.perf_counter()
                    run_study(sr, tmp / f"ray{w}.csv", workers=w, use_ray=True)
                    times[w] = time.perf_counter() - t0
            finally:
                ray.shutdown()
            out["ray_points"] = a.ray_points or a.points
            out["ray_speedup"] = round(times[1] / times[2], 2)
            out["ray_seconds"] = {str(k): round(v, 1) for k, v in times.items()}
            out["ray_identical"] = (tmp / "ray1.csv").read_text() == (tmp / "ray2.csv").read_text()
        except ImportError:
            out["ray_speedup"] = None
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        ray_text = (
            "not installed"
            if out["ray_speedup"] is None
            else f"{out['ray_speedup']}x ({out['ray_seconds']}; identical: {out['ray_identical']})"
        )
        print(
            f"{out['points']} points in {out['seconds']} s on {os.cpu_count()} cores"
            f" ({out['statuses']}); resumed "
            f"run identical: {out['resume_identical']}; Ray 2 workers vs 1: {ray_text}"
        )
    bad = [k for k in ("resume_identical", "ray_identical") if out.get(k) is False]
    for k in bad:
        print(f"FAILED: {k}: the CSVs differ", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
