#!/usr/bin/env python3
"""Fit the exponent of a power-capped GPU's sustained clock, and print it.

    python scripts/fit_clock_power.py [--write]

A part run below the power of the same die at its full rating (`rated_power_w`: an H100 SXM at 500 W, an
HGX B200 at 1,000 W against GB200's 1,200 W) sustains a lower clock on every compute-bound kernel. The model's
prior for such a part's `clock_scale` is

    clock = (tdp_w / rated_power_w) ** clock_power_exponent

(`optimizer.model.hardware.sustained_clock`). The exponent is one model-wide constant, fitted here by least
squares of log(clock_scale) on log(tdp_w / rated_power_w) over the system files that state both a fitted
`clock_scale` and `rated_power_w` (each fitted on its own runs by scripts/calibrate.py). Each file's value
predicted by the exponent of the others is printed (leave-one-GPU-out). `--write` sets
`clock_power_exponent` in optimizer/model/fitted.yaml.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grid_fit import set_fitted  # noqa: E402

from optimizer.io.loader import read_yaml, validate_model  # noqa: E402
from optimizer.schema import System  # noqa: E402

SYSTEMS = ROOT / "problems" / "systems"


def capped_parts(systems: Path = SYSTEMS) -> list[tuple[str, float, float]]:
    """(file stem, log power ratio, log fitted clock) of every system file with a clock_scale below its
    rated power."""
    out = []
    for path in sorted(systems.glob("*.yaml")):
        s = validate_model(System, read_yaml(path))
        if s.clock_scale is None or not (s.rated_power_w and s.tdp_w and s.tdp_w < s.rated_power_w):
            continue
        out.append((path.stem, math.log(s.tdp_w / s.rated_power_w), math.log(s.clock_scale)))
    return out


def exponent(parts: list[tuple[str, float, float]]) -> float:
    """The least-squares exponent through the origin of log clock on log power ratio."""
    return sum(x * y for _, x, y in parts) / sum(x * x for _, x, _ in parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="set clock_power_exponent in fitted.yaml")
    args = ap.parse_args()
    parts = capped_parts()
    if len(parts) < 2:
        print("fewer than two power-capped system files with a fitted clock_scale", file=sys.stderr)
        return 2
    k = round(exponent(parts), 2)
    for i, (name, x, y) in enumerate(parts):
        k_rest = exponent(parts[:i] + parts[i + 1 :])
        print(
            f"{name:18s} power x{math.exp(x):.3f}: fitted clock {math.exp(y):.4f}, "
            f"others' exponent {k_rest:.3f} predicts {math.exp(k_rest * x):.4f}"
        )
    print(f"clock_power_exponent = {k} over {len(parts)} parts")
    if args.write:
        data = " ".join(f"problems/systems/{name}.yaml" for name, _, _ in parts)
        return set_fitted("clock_power_exponent", k, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
