#!/usr/bin/env python3
"""Wall time of the whole `paraplan check` command, process start included.

    python scripts/bench_check.py [--json] [--repeat 5] [--quick] [PROBLEM ...]

Runs `python -m optimizer.cli check PROBLEM --json` in a fresh process --repeat times per problem (default:
every problem file in problems/ and problems/studies/check|solve/) and prints the median. Target: <= 1.5 s
median on 2 cores (machine-dependent: reported, not checked). Exit 1 when a check command fails (an exit
status other than 0, fits, or 3, does not fit). --quick: problems/default.yaml alone, one counted run and no
warm-up run (a smoke test).
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("problems", nargs="*", type=Path)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="problems/default.yaml, one run (a smoke test)")
    a = ap.parse_args(argv)
    repeat, warm = (1, 0) if a.quick else (a.repeat, 1)  # a warm-up run fills the file cache, not counted
    rows = []
    for path in a.problems or (default_problems()[:1] if a.quick else default_problems()):
        path = path.resolve()
        times, fits = [], None
        for _ in range(repeat + warm):
            t0 = time.perf_counter()
            p = subprocess.run(
                [sys.executable, "-m", "optimizer.cli", "check", str(path), "--json"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            times.append(time.perf_counter() - t0)
            if p.returncode not in (0, 3):
                print(p.stderr, file=sys.stderr)
                return 1
            fits = json.loads(p.stdout)["fits"]
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        rows.append(
            {"problem": str(shown), "median_s": round(statistics.median(times[warm:]), 3), "fits": fits}
        )
    if a.json:
        print(json.dumps({"cases": [{"problem": r["problem"], "median_s": r["median_s"]} for r in rows]}))
    else:
        for r in rows:
            print(f"{r['problem']:55s} {r['median_s']:6.3f} s  {'fits' if r['fits'] else 'does not fit'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
