"""Exhaustive oracle: every candidate of the space through the vectorised model, in chunks.

Used by `paraplan solve --method enumerate` and by tests as the reference optimum for CP-SAT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from optimizer.model.capacity import feasible
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate, make_ctx
from optimizer.prepare.objective import score
from optimizer.prepare.space import Space, build_space
from optimizer.schema import Problem


@dataclass
class EnumResult:
    knobs: Knobs  # the top candidates, best first
    step_time_s: np.ndarray
    n_candidates: int
    n_feasible: int  # within memory (before any objective target)
    seconds: float
    score: np.ndarray | None = None  # optimizer.prepare.objective.score of the top candidates


def enumerate_best(
    problem: Problem, space: Space | None = None, top: int = 1, chunk: int = 250_000
) -> EnumResult:
    t0 = time.perf_counter()
    space = space or build_space(problem)
    ctx = make_ctx(problem)
    n = space.size
    best_t = np.empty(0)
    best_s = np.empty(0)
    best_i = np.empty(0, dtype=np.int64)
    n_ok = 0
    for lo in range(0, n, chunk):
        idx = np.arange(lo, min(n, lo + chunk))
        k = space.knobs.take(idx)
        res = evaluate(problem, k, ctx)
        ok = feasible(problem, k, res)
        n_ok += int(ok.sum())
        t = np.where(ok, score(problem, k.tp * k.pp * k.dp * k.cp, res.step_time), np.inf)
        stp = res.step_time
        if top < len(t):
            part = np.argpartition(t, top)[:top]
        else:
            part = np.arange(len(t))
        best_t = np.concatenate([best_t, t[part]])
        best_s = np.concatenate([best_s, stp[part]])
        best_i = np.concatenate([best_i, idx[part]])
        order = np.argsort(best_t, kind="stable")[:top]
        best_t, best_s, best_i = best_t[order], best_s[order], best_i[order]
    keep = np.isfinite(best_t)
    best_t, best_s, best_i = best_t[keep], best_s[keep], best_i[keep]
    return EnumResult(space.knobs.take(best_i), best_s, n, n_ok, time.perf_counter() - t0, best_t)
