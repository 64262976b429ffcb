#!/usr/bin/env python3
"""Refit every system file and model-wide constant from the run files, in a fixed order; or check that
the shipped ones are a fixed point of it.

    python scripts/recalibrate.py            # rewrite problems/systems and optimizer/model/fitted.yaml
    python scripts/recalibrate.py --check    # the same on a copy; exit 1 listing what would change

One round is the calibration sequence (`scripts/calibration_sequence.py`, every step, in order: each fit
starts from calibrate.py's fixed start, so a step's result depends only on the run files and the files
and constants it reads), then the model-wide constants (`CONSTANTS`: the MoE host time, the allocator's
slack, the power-capped clock's exponent), each by its own script with `--write`. The constants feed the
step-time model the sequence fits through, so rounds repeat until one changes nothing (at most
`--rounds`). A second run then changes nothing: the files are a fixed point.

`--check` copies the project's model, scripts and problems into a temporary directory (beside a link to
`../shared`), recalibrates the copy and compares every system file and fitted.yaml with the shipped ones.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
FITTED_YAML = ROOT / "optimizer" / "model" / "fitted.yaml"
SYSTEMS = ROOT / "problems" / "systems"
PUBLIC = "../shared/calibration/public_runs.yaml"
PUBLIC_2025 = "../shared/calibration/public_runs_2025.yaml"

sys.path.insert(0, str(ROOT / "scripts"))
from crossval import run_files  # noqa: E402

# every public runs file (crossval's list: the shared ones and the project's), relative to the root
ALL_RUNS = [os.path.relpath(p, ROOT) for p in run_files()]

# (script, arguments) of each model-wide constant's fit, in order; run from the repository root
CONSTANTS: list[tuple[str, list[str]]] = [
    ("calibrate_host.py", ALL_RUNS),
    ("calibrate_memory.py", [PUBLIC, "problems/runs/torchtitan-h100-h200.yaml"]),
    ("fit_clock_power.py", []),
]


def _log(msg: str) -> None:
    print(f"recalibrate: {msg}", file=sys.stderr, flush=True)


def _snapshot() -> dict[str, bytes]:
    """The bytes of every file a round may write."""
    paths = [*sorted(SYSTEMS.glob("*.yaml")), FITTED_YAML]
    return {str(p.relative_to(ROOT)): p.read_bytes() for p in paths}


SEQUENCE_RUN = """
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
import crossval
done, _ = crossval.refit([], Path("problems"), Path(sys.argv[1]), every_step=True)
print(len(done))
"""


def one_round() -> list[str]:
    """The sequence, then the constants, each in a process of its own (the model reads the constants of
    fitted.yaml when it is imported: a round fits with the ones the round before wrote); returns the files
    this round changed."""
    before = _snapshot()
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="recalibrate-") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", SEQUENCE_RUN, tmp],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
    _log(f"the calibration sequence: {out.stdout.split()[-1]} steps [{time.time() - t0:.0f} s]")
    for script, args in CONSTANTS:
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / script), *args, "--write"],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        _log(f"{script} [{time.time() - t0:.0f} s]")
    after = _snapshot()
    return [k for k in after if before.get(k) != after[k]]


def recalibrate(rounds: int) -> int:
    for i in range(1, rounds + 1):
        changed = one_round()
        _log(f"round {i}: {len(changed)} files changed{': ' + ', '.join(changed) if changed else ''}")
        if not changed:
            return 0
    _log(f"not a fixed point after {rounds} rounds")
    return 1


def check(rounds: int) -> int:
    """Recalibrate a copy of the project; 0 when no system file or constant changes, else 1."""
    with tempfile.TemporaryDirectory(prefix="recalibrate-check-") as tmp:
        copy = Path(tmp) / "project"
        for part in ("optimizer", "scripts", "problems"):
            shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
        (Path(tmp) / "shared").symlink_to(SHARED.resolve())
        rc = subprocess.run(
            [sys.executable, str(copy / "scripts" / "recalibrate.py"), "--rounds", str(rounds)], cwd=copy
        ).returncode
        rels = [str(p.relative_to(ROOT)) for p in [*sorted(SYSTEMS.glob("*.yaml")), FITTED_YAML]]
        moved = [r for r in rels if not filecmp.cmp(ROOT / r, copy / r, shallow=False)]
    for r in moved:
        print(f"would change: {r}")
    if rc or moved:
        return 1
    print("the shipped system files and constants are a fixed point of the calibration")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="recalibrate a copy and report what would change")
    ap.add_argument("--rounds", type=int, default=3, help="at most this many rounds (default 3)")
    args = ap.parse_args()
    if not (SHARED / "calibration").is_dir():
        print(f"needs the shared run files in {SHARED / 'calibration'}", file=sys.stderr)
        return 2
    return check(args.rounds) if args.check else recalibrate(args.rounds)


if __name__ == "__main__":
    sys.exit(main())
