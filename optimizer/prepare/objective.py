"""What `solve` ranks plans by (problem.objective), shared by the enumerator and the CP-SAT formulation.

    step_time       minimise the step time T
    tokens_per_gpu  maximise B*S/(T*n) tokens/s per GPU used, i.e. minimise n*T (GPU-seconds per step)
    fewest_gpus     minimise n subject to T <= target (a step time, or days to train training.tokens),
                    then T: score n*BIG + T with BIG larger than any step time
    expected_time   minimise T*W(n), W the expected wall time per second of training of a job on n GPUs
                    (failures, restarts, checkpoints at the best offered interval, spares: the problem's
                    plus idle whole nodes; optimizer.model.goodput) as an integer in 1/W_SCALE
Constraints any goal may carry: T <= the step-time target (max_step_time_s or max_days), and
n*T <= the GPU-time cap (max_gpu_hours over the steps to train: a rental budget).
n = tp*pp*dp*cp, the GPUs a plan uses (fewer than num_gpus only with options.allow_idle_gpus).
"""

from __future__ import annotations

import numpy as np

from optimizer.schema import Problem
from optimizer.schema.problem import Goal

BIG_S = 1.0e5  # s: larger than any step time
W_SCALE = 4096  # the expected_time factor's integer scale (exact products in int64 with step times in ns)
W_MAX = 10  # a plan whose wall time exceeds 10x its training time (under 10% training) is not planned
W_CAP = W_MAX * W_SCALE


def expected_time_factor(problem: Problem, n_gpus) -> np.ndarray:
    """The factor W(n) of the expected time as integers in 1/W_SCALE (rounded up); W_CAP + 1 marks a factor
    above W_MAX, which `wall_ok` rules out (the products stay within int64)."""
    from optimizer.model.goodput import problem_factor

    w = problem_factor(problem, n_gpus)
    return np.minimum(np.ceil(np.nan_to_num(w, nan=np.inf, posinf=np.inf) * W_SCALE), W_CAP + 1).astype(
        np.int64
    )


def uses_factor(problem: Problem) -> bool:
    """Whether the score reads W(n): goal expected_time, or targets met in expectation."""
    o = problem.objective
    return o.goal == Goal.EXPECTED_TIME or (
        o.target_includes_failures
        and (problem.step_time_target_s() is not None or o.max_gpu_hours is not None)
    )


def gpus_used(ex) -> int:
    """GPUs an execution uses: tp*pp*dp*cp (dp resolved)."""
    return ex.tp * ex.pp * ex.cp * (ex.dp or 1)


def target(problem: Problem, unit: float = 1.0) -> float | None:
    """The largest step time that meets the target, in 1/unit s (a hair of slack for rounding); None: none."""
    t = problem.step_time_target_s()
    return None if t is None else t * unit * (1 + 1e-9)


def gpu_time_cap(problem: Problem, unit: float = 1.0) -> float | None:
    """The cap on GPUs x step time (objective.max_gpu_hours), in 1/unit s; None: none."""
    c = problem.gpu_seconds_per_step_cap()
    return None if c is None else c * unit * (1 + 1e-9)


def failures_in_target(problem: Problem) -> bool:
    """Whether the step-time target is met by the expected time with failures (t W(n) <= target)."""
    return problem.objective.target_includes_failures and problem.step_time_target_s() is not None


def step_limit(problem: Problem, n_gpus, unit: float = 1.0):
    """The largest step time (1/unit s) on n GPUs that meets the target: the target, or with
    `target_includes_failures` the largest integer t with t W_int(n) <= floor(target x W_SCALE); None: no
    target."""
    tg = target(problem, unit)
    if tg is None or not failures_in_target(problem):
        return tg
    w = expected_time_factor(problem, n_gpus)
    return np.floor(np.floor(tg * W_SCALE) / w)


def gpu_time_limit(problem: Problem, n_gpus, unit: float = 1.0):
    """The largest step time (1/unit s) on n GPUs within the GPU-time cap: floor(cap / n), or with
    `target_includes_failures` floor(floor(cap x W_SCALE / n) / W_int(n)) (the expected GPU-time); None: no
    cap."""
    cap = gpu_time_cap(problem, unit)
    if cap is None:
        return None
    n = np.maximum(np.asarray(n_gpus), 1)
    if not problem.objective.target_includes_failures:
        return np.floor(np.floor(cap) / n)
    return np.floor(np.floor(cap * W_SCALE / n) / expected_time_factor(problem, n))


def score(problem: Problem, n_gpus, step, unit: float = 1.0, missed=np.inf) -> np.ndarray:
    """The score to minimise, with the step time in 1/unit s (seconds: unit 1; the formulation's integers:
    unit TIME_UNIT with integer arrays, exact in int64); `missed` where a target is missed."""
    n = np.asarray(n_gpus)
    t = np.asarray(step)
    g = problem.objective.goal
    if g == Goal.TOKENS_PER_GPU:
        s = n * t
    elif g == Goal.FEWEST_GPUS:
        big = int(BIG_S * unit) if float(unit).is_integer() else BIG_S * unit
        s = n * big + t
    elif g == Goal.EXPECTED_TIME:
        w = expected_time_factor(problem, n)
        s = np.minimum(t, 2**62 // w) * w if np.issubdtype(t.dtype, np.integer) else t * w
    else:
        s = t
    tg, cap = target(problem, unit), gpu_time_cap(problem, unit)
    ok = np.ones(np.broadcast(n, t).shape, dtype=bool)
    if tg is not None:
        ok &= t <= step_limit(problem, n, unit)
    if cap is not None:
        ok &= (
            n * t <= cap
            if not problem.objective.target_includes_failures
            else t <= gpu_time_limit(problem, n, unit)
        )
    if uses_factor(problem):
        ok &= expected_time_factor(problem, n) <= W_CAP
    return np.where(ok, s, missed) if (tg is not None or cap is not None or uses_factor(problem)) else s


def describe(problem: Problem, n_gpus: int, step_s: float) -> str:
    g = problem.objective.goal
    tok = problem.training.global_batch * problem.seq_len / step_s
    if g == Goal.TOKENS_PER_GPU:
        return f"objective: max tokens/s per GPU = {tok / n_gpus:,.1f} ({n_gpus} GPUs used)"
    if g == Goal.EXPECTED_TIME:
        w = float(np.ravel(expected_time_factor(problem, n_gpus))[0]) / W_SCALE
        days = step_s * w * problem.steps_to_train() / 86400
        return (
            f"objective: min expected time to train = {days:.4g} days "
            f"(step {step_s:.4g} s x {w:.4f} for failures, restarts and checkpoints; {n_gpus} GPUs used)"
        )
    if g == Goal.FEWEST_GPUS:
        idle = (
            ""
            if problem.options.allow_idle_gpus
            else " (options.allow_idle_gpus is false: every plan uses all num_gpus GPUs, so this is "
            "num_gpus; set it true to find the fewest)"
        )
        return (
            f"objective: fewest GPUs with step time <= {problem.step_time_target_s():.4g} s: {n_gpus} GPUs "
            f"({step_s:.4g} s){idle}"
        )
    return f"objective: min step time = {step_s:.4g} s"
