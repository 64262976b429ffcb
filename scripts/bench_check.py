#!/usr/bin/env python3
"""Wall time of the whole `paraplan check` command, process start included (issue 4, item 4).

    python scripts/bench_check.py [--json] [--repeat 5] [PROBLEM ...]

Runs `python -m optimizer.cli check PROBLEM --json` in a fresh process --repeat times per problem (default:
every problem file in problems/ and problems/studies/check|solve/) and prints the median. Target: <= 1.5 s
median on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def default_problems() -> list[Path]:
    out = [ROOT / "problems" / "default.yaml"]
    for sub in ("check", "solve"):
        out += sorted((ROOT / "problems" / "studies" / sub).glob("*.yaml"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problems", nargs="*", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rows = []
    for path in a.problems or default_problems():
        times, fits = [], None
        for _ in range(a.repeat + 1):  # the first run warms the file cache and is not counted
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "optimizer.cli", "check", str(path), "--json"], cwd=ROOT,
                               capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if p.returncode not in (0, 3):
                print(p.stderr, file=sys.stderr)
                return 1
            fits = json.loads(p.stdout)["fits"]
        rows.append({"problem": str(path.relative_to(ROOT)), "median_s": round(statistics.median(times[1:]), 3),
                     "fits": fits})
    if a.json:
        print(json.dumps({"cases": [{"problem": r["problem"], "median_s": r["median_s"]} for r in rows]}))
    else:
        for r in rows:
            print(f"{r['problem']:55s} {r['median_s']:6.3f} s  {'fits' if r['fits'] else 'does not fit'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
