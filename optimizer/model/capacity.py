"""Capacity: does a candidate fit the memories of the system (the model's side of feasibility).

    HBM:     hbm (weights, gradients, optimizer state, activations, reserve; `step.evaluate`) <=
             (system.hbm_gib - options.memory_headroom_gib) GiB
    offload: offload_mem <= system.offload.capacity_gib GiB
Shared by every solve method (enumeration, the CP-SAT tables, presolve incumbents, validation of runs).
"""

from __future__ import annotations

import numpy as np

from ..schema import Problem
from .knobs import Knobs
from .step import GIB, StepResult


def capacity_bytes(problem: Problem) -> float:
    """HBM per GPU a plan may use, bytes: the GPU's HBM less the problem's headroom."""
    return (problem.system.hbm_gib - problem.options.memory_headroom_gib) * GIB


def feasible(problem: Problem, k: Knobs, res: StepResult) -> np.ndarray:
    """Per candidate: within HBM (minus headroom) and within offload memory."""
    off = problem.system.offload
    ok = res.hbm <= capacity_bytes(problem)
    ok &= res.offload_mem <= off.capacity_gib * GIB
    return ok
