"""Model-wide fitted and measured constants, read once at import from fitted.yaml beside this module.

Each entry of the file holds a `value`, its `unit`, `what` it is, the script that fitted or derived it
(`fitted_by`) and the files it read (`data`); the fitting scripts (scripts/calibrate_host.py,
scripts/calibrate_memory.py, scripts/fit_clock_power.py) rewrite the value in place. Fields are named with
their unit: `_s` seconds, `_ratio` and `_exponent` dimensionless (unit '1'), `_keys` key positions,
`_flop_per_byte` FLOP per byte; a pair is (forward, backward). Per-system calibrated values live in the
system files instead (problems/systems, scripts/calibrate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

PATH = Path(__file__).with_name("fitted.yaml")
ENTRY_KEYS = ("value", "unit", "what", "fitted_by", "data")
UNIT_OF_SUFFIX = {
    "_s": "s",
    "_ratio": "1",
    "_keys": "key positions",
    "_flop_per_byte": "FLOP/B",
    "_exponent": "1",
}


@dataclass(frozen=True)
class Fitted:
    """The constants of fitted.yaml, typed; see the file for each one's source."""

    moe_host_fw_s: float  # host time to issue an eager dropless MoE layer's forward, s
    allocator_slack_ratio: float  # PyTorch caching allocator: reserved / allocated - 1 at the peak
    mxfp8_kernel_ratio: float  # MXFP8 GEMM kernel throughput / per-tensor FP8's at the same peak
    eager_expert_clamp_ratio: tuple[float, float]  # eager clamped-GLU passes: measured / counted time
    eager_expert_bias_ratio: tuple[float, float]  # eager expert-bias passes: measured / counted time
    attention_tile_overhead_keys: float  # flash attention's fixed work per query tile at the reference rate
    attention_reference_flop_per_byte: float  # that reference: achieved attention FLOP/s over HBM bytes/s
    clock_power_exponent: float  # sustained clock of a power-capped part ~ (power cap / rating) ** this


def _typed(name: str, kind: str, value):
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if (
        kind.startswith("tuple")
        and isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return tuple(float(v) for v in value)
    raise ValueError(f"fitted constant {name}: value {value!r} is not a {kind}")


def load(path: Path = PATH) -> Fitted:
    """The constants of `path` (fitted.yaml); a missing or unknown entry, an entry without one of
    `ENTRY_KEYS`, a unit that does not match the field's suffix or a value of the wrong type is an error."""
    doc = yaml.safe_load(Path(path).read_text()) or {}
    want = {f.name: str(f.type) for f in fields(Fitted)}
    if set(doc) != set(want):
        raise ValueError(f"{path}: entries {sorted(doc)}, expected {sorted(want)}")
    out = {}
    for name, kind in want.items():
        entry = doc[name]
        if not isinstance(entry, dict) or any(k not in entry for k in ENTRY_KEYS):
            raise ValueError(f"{path}: {name} needs the keys {', '.join(ENTRY_KEYS)}")
        unit = next(u for suffix, u in UNIT_OF_SUFFIX.items() if name.endswith(suffix))
        if str(entry["unit"]) != unit:
            raise ValueError(f"{path}: {name} is in {unit!r}, the file says {entry['unit']!r}")
        out[name] = _typed(name, kind, entry["value"])
    return Fitted(**out)


FITTED = load()
