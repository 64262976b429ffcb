"""One model-wide value fitted on a grid, as the calibration scripts that fit one do (calibrate_memory.py,
calibrate_host.py; tests/helpers.grid_leave_one_out for a system's parameters): the grid row with the smallest
mean |error|, each run's leave-one-out error on that rule, and writing the fitted value into the model's
fitted-constants file (optimizer/model/fitted.yaml, read by optimizer/model/fitted.py) as YAML data."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

FITTED_YAML = Path(__file__).resolve().parent.parent / "optimizer" / "model" / "fitted.yaml"


def best_row(err: np.ndarray) -> int:
    """The grid row (rows: grid values, columns: runs; signed % errors) with the smallest mean |error|, the
    first one on ties."""
    return int(np.argmin(np.round(np.mean(np.abs(err), axis=1), 9)))


def held_out(err: np.ndarray) -> np.ndarray:
    """Each run's error at the grid row fitted on the other runs (leave-one-out)."""
    return np.array([err[best_row(np.delete(err, j, axis=1)), j] for j in range(err.shape[1])])


def round_trip():
    """A ruamel.yaml round-trip reader/writer laid out as the project's YAML files are (2-space mappings, list
    items indented 2 under their key, long lines kept whole): loading and dumping a file unchanged gives it
    back byte for byte, comments, order and flow style included."""
    from ruamel.yaml import YAML  # script-only dependency (the `calibrate` extra)

    rt = YAML(typ="rt")
    rt.indent(mapping=2, sequence=4, offset=2)
    rt.preserve_quotes = True
    rt.width = 4096
    return rt


def set_fitted(name: str, value, data: str | None = None, path: Path = FITTED_YAML) -> int:
    """Set the `value` (and, given, the `data` files) of entry `name` of the fitted-constants file
    (optimizer/model/fitted.yaml) through a round-trip dump: every other line, comments included, stays as it
    is. 0, or 2 (with a message) when the file has no such entry."""
    rt = round_trip()
    doc = rt.load(path.read_text())
    if name not in (doc or {}):
        print(f"no {name} entry in {path}", file=sys.stderr)
        return 2
    doc[name]["value"] = value
    if data is not None:
        doc[name]["data"] = data
    with path.open("w") as f:
        rt.dump(doc, f)
    print(f"wrote {name} = {value} into {path}")
    return 0
