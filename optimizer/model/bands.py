"""The stated uncertainty of a predicted step time, from the leave-one-source-out cross-validation.

`bands.yaml` beside this module is written by `python scripts/crossval.py --by source --write-bands`: for
each GPU type (the calibration-schema name a system file states as `gpu`), software stack and kind of model
(dense, moe), the grouped (held-out-source) step-time errors of its public runs. The band, +-%, is the bound
that covers `coverage` (80%) of the errors of its scope: the (GPU type, stack, kind) where it has at least
`min_runs` errors, else the wider of the bands of the GPU type (every stack) and of the stack (every GPU
type), else the kind's over every run, else every run's; never less than the largest error of a GPU type
or a stack with fewer than `min_runs` grouped errors. A system whose GPU type the file does not list
takes the band of the system its tables were transferred from, else falls back to its own calibration
block (`Calibration.band_pct`: its leave-one-out figure, or the prior's band).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import yaml

from optimizer.schema import System

PATH = Path(__file__).with_name("bands.yaml")
ANY = "*"


@dataclass(frozen=True)
class Band:
    """A stated step-time uncertainty: +-`pct` %, from `n` grouped errors of `scope` (a GPU type and stack,
    a GPU type, a stack, every run, or the system file's own calibration)."""

    pct: float
    n: int
    scope: str


def band_of(errors: list[float], coverage: float) -> float:
    """The smallest |error| bound, %, that covers `coverage` of `errors` (rounded up to 0.1)."""
    a = np.sort(np.abs(np.asarray(errors, dtype=float)))
    k = int(np.ceil(coverage * len(a))) - 1
    return float(np.ceil(a[max(k, 0)] * 10.0) / 10.0)


@cache
def load(path: Path = PATH) -> dict:
    """The bands file (empty where it does not exist)."""
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def _pick(errors: dict, gpu: str | None, stack: str | None, kind: str | None) -> list[float]:
    """The errors of every (GPU type, stack, kind) matching the given ones (None: any)."""
    return [
        e
        for g, by_stack in errors.items()
        if gpu is None or g == gpu
        for s, by_kind in by_stack.items()
        if stack is None or s == stack
        for k, errs in by_kind.items()
        if kind is None or k == kind
        for e in errs
    ]


def grouped_band(
    gpu: str | None, stack: str | None, kind: str | None = None, doc: dict | None = None
) -> Band | None:
    """The grouped band of (`gpu`, `stack`, `kind`: dense or moe, None: either) by the fallbacks of the
    module docstring; None where the file has no runs of `gpu`."""
    doc = load() if doc is None else doc
    errors = doc.get("errors") or {}
    if gpu not in errors:
        return None
    cov, least = float(doc["coverage"]), int(doc["min_runs"])
    stack = str(getattr(stack, "value", stack)) if stack is not None else None
    what = f" {kind}" if kind else ""
    own = _pick(errors, gpu, stack, kind) if stack else []
    if len(own) >= least:
        return Band(band_of(own, cov), len(own), f"{gpu} / {stack}{what}")
    # too few runs of the pair: the wider of the GPU type's band (every stack) and the stack's (every GPU
    # type), so that a plan on a stack this GPU never ran carries both uncertainties
    wider = [
        Band(band_of(errs, cov), len(errs), scope)
        for scope, errs in (
            (f"{gpu}{what}, every stack", _pick(errors, gpu, None, kind)),
            (f"{stack}{what}, every GPU type", _pick(errors, None, stack, kind) if stack else []),
        )
        if len(errs) >= least
    ]
    for scope, errs in (
        (f"every{what} run", _pick(errors, None, None, kind)),
        ("every run", _pick(errors, None, None, None)),
    ):
        if not wider and len(errs) >= least:
            wider.append(Band(band_of(errs, cov), len(errs), scope))
    # the GPU type's and the stack's own few errors still bound the band from below: a part or a stack
    # whose only source was far off is not given the fleet's band
    for name, picked in ((gpu, _pick(errors, gpu, None, None)), (stack, _pick(errors, None, stack, None))):
        few = [abs(e) for e in picked] if name else []
        if few and len(few) < least:
            wider.append(Band(float(np.ceil(max(few) * 10.0) / 10.0), len(few), f"{name}'s {len(few)} runs"))
    return max(wider, key=lambda b: b.pct) if wider else None


def _grouped(system: System, stack: str | None, kind: str | None) -> Band | None:
    """The grouped band of the system's GPU type, else of the system its fitted tables were transferred
    from (same die: an H800 or H200 carries H100's fit, so it carries H100's errors)."""
    b = grouped_band(system.gpu, stack, kind)
    src = system.calibration.transferred_from
    if b is None and src:
        b = grouped_band(src, stack, kind)
        if b is not None:
            b = Band(b.pct, b.n, f"{b.scope} (tables transferred from {src})")
    return b


def band(system: System, stack: str | None = None, kind: str | None = None) -> Band | None:
    """The step-time band of plans of a `kind` of model (dense, moe; None: either) on `system` with `stack`:
    the grouped band of its GPU type, else its calibration block's (None where neither states one)."""
    b = _grouped(system, stack, kind)
    if b is not None:
        return b
    pct = system.calibration.band_pct(stack)
    return None if pct is None else Band(pct, len(system.calibration.runs), f"{system.name}'s calibration")


def band_pct(system: System, stack: str | None = None, kind: str | None = None) -> float | None:
    """`band(system, stack, kind).pct`, or None."""
    b = band(system, stack, kind)
    return None if b is None else b.pct


def kind_of(llm) -> str:
    """The kind of model a band is kept for: `moe` (mixture of experts) or `dense`."""
    return "moe" if getattr(llm, "moe", None) else "dense"


def summary(system: System, stack: str | None = None, kind: str | None = None) -> str:
    """The system's calibration line with the band that applies to `stack`'s plans of a `kind` of model."""
    line = system.calibration.summary(stack)
    b = _grouped(system, stack, kind)
    if b is None:
        return line
    return (
        f"{line}; held-out-source error band +-{b.pct:.1f}% (covers {load()['coverage']:.0%} of {b.n} "
        f"grouped errors of {b.scope})"
    )
