"""What `solve` ranks plans by (problem.objective), shared by the enumerator and the CP-SAT formulation.

    step_time       minimise the step time T
    tokens_per_gpu  maximise B*S/(T*n) tokens/s per GPU used, i.e. minimise n*T (GPU-seconds per step)
    fewest_gpus     minimise n subject to T <= target (a step time, or days to train training.tokens),
                    then T: score n*BIG + T with BIG larger than any step time
n = tp*pp*dp*cp, the GPUs a plan uses (fewer than num_gpus only with options.allow_idle_gpus).
"""

from __future__ import annotations

import numpy as np

from .schema import Problem
from .schema.problem import Goal

BIG_S = 1.0e5  # s: larger than any step time


def score(problem: Problem, n_gpus, step_s) -> np.ndarray:
    """The score to minimise (inf where a target is missed); arrays or scalars."""
    n = np.asarray(n_gpus, dtype=float)
    t = np.asarray(step_s, dtype=float)
    g = problem.objective.goal
    if g == Goal.TOKENS_PER_GPU:
        return n * t
    if g == Goal.FEWEST_GPUS:
        return np.where(t <= problem.step_time_target_s() * (1 + 1e-9), n * BIG_S + t, np.inf)
    return t


def describe(problem: Problem, n_gpus: int, step_s: float) -> str:
    g = problem.objective.goal
    tok = problem.training.global_batch * problem.seq_len / step_s
    if g == Goal.TOKENS_PER_GPU:
        return f"objective: max tokens/s per GPU = {tok / n_gpus:,.1f} ({n_gpus} GPUs used)"
    if g == Goal.FEWEST_GPUS:
        return (f"objective: fewest GPUs with step time <= {problem.step_time_target_s():.4g} s: {n_gpus} GPUs "
                f"({step_s:.4g} s)")
    return f"objective: min step time = {step_s:.4g} s"
