#!/usr/bin/env python3
"""Fuzz the CLI with mutated shipped problems and hostile files, and count what goes wrong.

    python scripts/fuzz_problems.py N [--seed S] [--limit-s 60] [--show 5]

Each case mutates a shipped problem (problems/, not the library parts) or writes hostile YAML
(tests/fuzzing.py says which mutations) and runs `paraplan <command>` on it in this process under an alarm.
Prints the count of tracebacks, hangs (over --limit-s) and input errors without file:line, with the first few
of each.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fuzzing import mutate, run_case, seeds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-s", type=int, default=60)
    ap.add_argument("--show", type=int, default=5)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    base = seeds()
    counts: Counter = Counter()
    rcs: Counter = Counter()
    bad: dict[str, list] = {"traceback": [], "hang": [], "no_line": []}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.n):
            path, cmd = rng.choice(base)
            if cmd == "solve":
                cmd = rng.choice(["solve", "solve", "check", "evaluate"])
            case = mutate(rng, path, cmd)
            out = run_case(case, Path(tmp), a.limit_s)
            counts[out.kind] += 1
            rcs[out.rc] += 1
            if out.kind != "ok":
                bad[out.kind].append((case, out))
                print(
                    f"--- {out.kind} at case {i}: {case.command} {case.source} [{case.what}]\n{out.detail}",
                    file=sys.stderr,
                    flush=True,
                )
            if (i + 1) % 100 == 0:
                print(
                    f"{i + 1} cases, {time.perf_counter() - t0:.0f} s: {dict(counts)}",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"{a.n} cases in {time.perf_counter() - t0:.0f} s: tracebacks {counts['traceback']}, hangs over "
        f"{a.limit_s} s {counts['hang']}, errors without file:line {counts['no_line']};"
        f" exit codes {dict(rcs)}"
    )
    for kind, items in bad.items():
        for case, out in items[: a.show]:
            print(f"--- {kind}: {case.command} {case.source} [{case.what}]\n{out.detail}")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
