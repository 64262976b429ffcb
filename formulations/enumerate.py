"""Exhaustive oracle: every candidate of the space through the vectorised model, in chunks.

Used by `paraplan solve --method enumerate` and by tests as the reference optimum for CP-SAT.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from formulations.bounds import LAYOUT_DEGREES
from optimizer.model.capacity import feasible
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate, make_ctx
from optimizer.prepare.objective import score
from optimizer.prepare.space import Space, build_space, compact_space, triple_sizes
from optimizer.schema import Problem


@dataclass
class EnumResult:
    knobs: Knobs  # the top candidates, best first
    step_time_s: np.ndarray
    n_candidates: int  # the whole space's
    n_feasible: int  # within memory (before any objective target), of those evaluated
    seconds: float
    score: np.ndarray | None = None  # optimizer.prepare.objective.score of the top candidates
    n_evaluated: int | None = None  # candidates evaluated (fewer than n_candidates: the deadline passed)

    @property
    def complete(self) -> bool:
        """Every candidate evaluated: the top candidates are proven."""
        return self.n_evaluated is None or self.n_evaluated >= self.n_candidates


def pieces(problem: Problem, chunk: int):
    """The space in parts of about `chunk` candidates (whole layouts; a layout larger than that is split),
    built one at a time: the whole space is never held in memory."""
    c = compact_space(problem)
    li = c.triples[:, 0]
    per_layout = np.bincount(li, weights=triple_sizes(problem, c), minlength=len(c.layouts)).astype(np.int64)
    group, size = [], 0
    for j in np.nonzero(per_layout)[0].tolist() + [None]:
        if j is not None:
            group.append(j)
            size += int(per_layout[j])
        if group and (j is None or size >= chunk):
            sub = replace(c, triples=c.triples[np.isin(li, group)], size=size)
            k = build_space(problem, sub).knobs
            for lo in range(0, size, chunk):
                yield k.take(np.arange(lo, min(size, lo + chunk)))
            group, size = [], 0


def _best_of(t: np.ndarray, k: Knobs, top: int, distinct: bool) -> np.ndarray:
    """Indices of the `top` smallest scores `t`, best first (ties in index order); `distinct`: only the best
    candidate of each layout counts."""
    if not distinct:
        return np.argpartition(t, top)[:top] if top < len(t) else np.arange(len(t))
    order = np.argsort(t, kind="stable")
    degrees = np.stack([np.asarray(getattr(k, n))[order] for n in LAYOUT_DEGREES], axis=1)
    _, first = np.unique(degrees, axis=0, return_index=True)
    return order[np.sort(first)][:top]


def enumerate_best(
    problem: Problem,
    space: Space | None = None,
    top: int = 1,
    chunk: int = 250_000,
    deadline: float | None = None,
    distinct: bool = False,
) -> EnumResult:
    """The `top` best candidates of `space` (default: the problem's whole space, built in `pieces`) by the
    objective's score, within memory; `deadline` (perf_counter s): stop there with the best so far.
    `distinct`: the best candidate of each of the `top` best layouts (parallel degrees,
    `bounds.LAYOUT_DEGREES`)."""
    t0 = time.perf_counter()
    if space is not None:
        n = space.size
        parts = (space.knobs.take(np.arange(lo, min(n, lo + chunk))) for lo in range(0, n, chunk))
    else:
        n = compact_space(problem).size
        parts = pieces(problem, chunk)
    ctx = make_ctx(problem)
    best_t, best_s, best_k = np.empty(0), np.empty(0), None
    n_ok = n_done = 0
    for k in parts:
        if deadline is not None and time.perf_counter() > deadline:
            break
        res = evaluate(problem, k, ctx)
        ok = feasible(problem, k, res)
        n_ok += int(ok.sum())
        n_done += k.size
        t = np.where(ok, score(problem, k.tp * k.pp * k.dp * k.cp, res.step_time), np.inf)
        part = _best_of(t, k, top, distinct)
        best_t = np.concatenate([best_t, t[part]])
        best_s = np.concatenate([best_s, res.step_time[part]])
        best_k = k.take(part) if best_k is None else Knobs.concat([best_k, k.take(part)])
        order = (
            _best_of(best_t, best_k, top, distinct) if distinct else np.argsort(best_t, kind="stable")[:top]
        )
        best_t, best_s, best_k = best_t[order], best_s[order], best_k.take(order)
    keep = np.nonzero(np.isfinite(best_t))[0]
    knobs = (
        best_k.take(keep)
        if best_k is not None
        else Knobs.from_dict({f: [] for f in Knobs.__dataclass_fields__})
    )
    return EnumResult(knobs, best_s[keep], n, n_ok, time.perf_counter() - t0, best_t[keep], n_done)
