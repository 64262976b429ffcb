"""Capacity: does a candidate fit the memories of the system (the model's side of feasibility).

    HBM:     hbm (weights, gradients, optimizer state, activations, reserve; `step.evaluate`) <=
             (system.hbm_gib - options.memory_headroom_gib) GiB
    offload: offload_mem <= system.offload.capacity_gib GiB
Shared by every solve method (enumeration, the CP-SAT tables, presolve incumbents, validation of runs).
"""

from __future__ import annotations

import numpy as np

from optimizer.model.knobs import Knobs
from optimizer.model.step import GIB, StepResult
from optimizer.schema import Problem
from optimizer.schema.common import (
    MEMORY_ERROR_PCT,
)  # the memory model's stated error (reports warn below it)


def memory_margin_warning(used_bytes: float, problem: Problem) -> str | None:
    """A warning when the plan's HBM margin (capacity less use, headroom included) is below the memory
    model's stated error; None otherwise."""
    cap = problem.system.hbm_gib * GIB
    margin = cap - used_bytes
    if margin >= MEMORY_ERROR_PCT / 100 * used_bytes:
        return None
    return (
        f"memory margin {margin / GIB:.1f} GiB ({100 * margin / cap:.1f}% of {problem.system.hbm_gib:g} "
        f"GiB) is below the memory model's stated error (+-{MEMORY_ERROR_PCT:g}% of the use, peak-memory "
        "MAPE on published runs): set options.memory_headroom_gib to about "
        f"{MEMORY_ERROR_PCT / 100 * used_bytes / GIB:.0f} GiB to plan with that margin"
    )


def capacity_bytes(problem: Problem) -> float:
    """HBM per GPU a plan may use, bytes: the GPU's HBM less the problem's headroom."""
    return (problem.system.hbm_gib - problem.headroom_gib()) * GIB


def feasible(problem: Problem, k: Knobs, res: StepResult) -> np.ndarray:
    """Per candidate: within HBM (minus headroom) and within offload memory."""
    off = problem.system.offload
    ok = res.hbm <= capacity_bytes(problem)
    ok &= res.offload_mem <= off.capacity_gib * GIB
    return ok
