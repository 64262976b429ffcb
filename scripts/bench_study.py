#!/usr/bin/env python3
"""Benchmark of `paraplan study`: the 1,024-point sweep of GPT-3 175B on H100, 8 to 8192 GPUs in steps of 8
(idle GPUs allowed, so every point is a full solve: the fastest plan on at most that many GPUs).

    python scripts/bench_study.py [--json] [--points 1024] [--ray-points 256]

Prints {"points", "seconds", "ray_speedup", "resume_identical"}: the sweep's wall time on local processes
(every core), Ray with 2 workers against 1 on the first --ray-points points (same machine, one run each;
null without Ray), and whether a study killed half way and resumed writes the same CSV as the whole run.
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

from optimizer.study import run_study  # noqa: E402

def study(folder: Path, last: int) -> Path:
    path = folder / f"sweep-{last}.yaml"
    path.write_text(f"name: gpt3-175b-h100-sweep\nbase:\n  llm: gpt3-175b\n  system: h100-sxm-80gb\n  num_gpus: 8\n"
                    "  training: {global_batch: 1536}\n  options: {allow_idle_gpus: true}\n"
                    f"axes:\n  num_gpus: {{from: 8, to: {last}, step: 8}}\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--points", type=int, default=1024)
    ap.add_argument("--ray-points", type=int, default=256)
    a = ap.parse_args()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        s = study(tmp, 8 * a.points)
        t0 = time.perf_counter()
        rows = run_study(s, tmp / "full.csv")
        out["points"] = len(rows)
        out["seconds"] = round(time.perf_counter() - t0, 1)
        out["statuses"] = {st: sum(1 for r in rows if r["status"] == st) for st in {r["status"] for r in rows}}
        # resume: kill a run once half its points are journaled, re-run, compare
        part, journal = tmp / "part.csv", tmp / "part.csv.journal.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "optimizer.cli", "study", str(s), "-o", str(part), "-q"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # its worker processes die with it
        while proc.poll() is None and (not journal.exists() or len(journal.read_text().splitlines()) < a.points // 2):
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        run_study(s, part)
        out["resume_identical"] = part.read_text() == (tmp / "full.csv").read_text()
        try:
            import ray  # noqa: F401

            sr = study(tmp, 8 * a.ray_points)
            times = {}
            for w in (1, 2):
                t0 = time.perf_counter()
                run_study(sr, tmp / f"ray{w}.csv", workers=w, use_ray=True)
                times[w] = time.perf_counter() - t0
            out["ray_speedup"] = round(times[1] / times[2], 2)
            out["ray_seconds"] = {str(k): round(v, 1) for k, v in times.items()}
        except ImportError:
            out["ray_speedup"] = None
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['points']} points in {out['seconds']} s on {os.cpu_count()} cores ({out['statuses']}); resumed "
              f"run identical: {out['resume_identical']}; Ray 2 workers vs 1: {out['ray_speedup']}x "
              f"({out.get('ray_seconds')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
