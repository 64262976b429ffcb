#!/usr/bin/env python3
"""Fuzz every command of the CLI with mutated shipped inputs and hostile files, and count what goes wrong.

    python scripts/fuzz_problems.py N [--seed S] [--limit-s 60] [--show 5] [--keep DIR]

Each case draws a command (and reader) uniformly, one of its shipped files, a --time-limit where the command
takes one, and a mutation (tests/fuzzing.py says which), and runs `paraplan <command>` on it in this process
under an alarm of --limit-s. Prints the counts per command and per outcome (ok; traceback; hang; no_line, an
input error without file:line; exit3_timed, exit 3 after the time limit passed where the case without it
finds a plan), and the first few defects, each written under --keep with the command line that reruns it.
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

from test_modules import load  # noqa: E402

_fuzzing = load("fuzzing")
DEFECTS, draw, mutate, reproduce, run_case, seeds = (
    _fuzzing.DEFECTS,
    _fuzzing.draw,
    _fuzzing.mutate,
    _fuzzing.reproduce,
    _fuzzing.run_case,
    _fuzzing.seeds,
)


def _table(by: dict[str, Counter], seconds: Counter) -> str:
    kinds = ["ok", *DEFECTS]
    rows = [f"{'command':16}" + "".join(f"{k:>12}" for k in kinds) + f"{'exit 0/2/3/4':>18}{'s':>8}"]
    for label in sorted(by):
        c = by[label]
        rcs = "/".join(str(c[f"rc{r}"]) for r in (0, 2, 3, 4))
        rows.append(
            f"{label:16}" + "".join(f"{c[k]:>12}" for k in kinds) + f"{rcs:>18}{seconds[label]:>8.0f}"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit-s", type=int, default=60)
    ap.add_argument("--show", type=int, default=5)
    ap.add_argument("--keep", default=str(Path(tempfile.gettempdir()) / "paraplan-fuzz"))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    base = seeds()
    by: dict[str, Counter] = {}
    seconds: Counter = Counter()
    total: Counter = Counter()
    bad: list = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.n):
            case = mutate(rng, *draw(rng, base))
            out = run_case(case, Path(tmp), a.limit_s)
            c = by.setdefault(case.label, Counter())
            c[out.kind] += 1
            c[f"rc{out.rc}"] += 1
            total[out.kind] += 1
            total["slow proof"] += out.note == "slow proof"
            seconds[case.label] += out.seconds
            if out.note:
                line = f"--- {out.note} at case {i} ({out.seconds:.2f} s, --time-limit {case.time_limit:g}): "
                print(line + f"{case.label} {case.source} [{case.what}]", file=sys.stderr, flush=True)
            if out.kind != "ok":
                bad.append((i, case, out))
                print(
                    f"--- {out.kind} at case {i}: {case.label} {case.source} [{case.what}]", file=sys.stderr
                )
            if (i + 1) % 50 == 0:
                print(
                    f"{i + 1} cases, {time.perf_counter() - t0:.0f} s: {dict(total)}",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"{a.n} cases in {time.perf_counter() - t0:.0f} s (seed {a.seed}): ok {total['ok']}, tracebacks "
        f"{total['traceback']}, hangs over {a.limit_s} s {total['hang']}, errors without file:line "
        f"{total['no_line']}, exit 3 after the time limit with a plan without it {total['exit3_timed']} "
        f"(exit 3 after the time limit and again without it: {total['slow proof']})"
    )
    print(_table(by, seconds))
    shown: Counter = Counter()
    for i, case, out in bad:
        if shown[out.kind] < a.show:
            shown[out.kind] += 1
            cmd = reproduce(case, Path(a.keep) / f"seed{a.seed}-case{i}")
            print(f"--- {out.kind} (case {i}): {case.source} [{case.what}]\n$ {cmd}\n{out.detail.rstrip()}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
