"""Can anything fit? The smallest HBM per GPU over the whole space (constraint group ``memory.hbm`` as an
objective), exact with respect to the formulation's tables, for `paraplan check`.

Memory depends on the pair (triple x block setting, of one variant) and the ZeRO stage only, so the
minimum is min over variants and pairs of [act(pair) + min_z wgo_z(pair)], over the ZeRO stages whose
offload memory fits. Triples are bounded first with every block column at
its minimum (formulations.bounds); only triples whose bound is within the best pair found are expanded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.bounds import expand, knobs_of_pairs, triple_cols
from formulations.pairs import compose, pair_columns, state_min
from formulations.tables import KIB, build_all
from optimizer.prepare.space import compact_space
from optimizer.schema import Problem


@dataclass
class MinMemory:
    legal: int  # candidates that satisfy the integer rules
    need_bytes: float | None  # smallest HBM any legal plan needs (bytes, formulation rounding), None: no plan
    knobs: object | None  # a Knobs row of that plan (ZeRO stage and overlap included)


def min_memory(problem: Problem, n_first: int = 64) -> MinMemory:
    c = compact_space(problem)
    if c.size == 0:
        return MinMemory(0, None, None)
    best_tot, best_k = None, None
    for T in build_all(problem, c):  # one pass per variant (kernels, schedule, offload flags)
        tri = np.array(T.legal_lvm, dtype=np.int64).reshape(-1, 3)
        if len(tri) == 0:
            continue
        tc = compose(T, tri[:, 0], tri[:, 1], tri[:, 2], triple_cols(T, tri))
        lb = tc["act"] + state_min(T, tc)[0]
        order = np.argsort(lb, kind="stable")
        first = tri[order[: min(n_first, len(order))]]
        P = expand(T, first)
        cols = pair_columns(T, P.li, P.vi, P.mi, P.ri, P.si, P.oi)
        best = float((cols["act"] + state_min(T, cols)[0]).min())
        P = expand(T, tri[lb <= best])  # every triple that may hold a smaller plan
        cols = pair_columns(T, P.li, P.vi, P.mi, P.ri, P.si, P.oi)
        smin, zarg, _, _ = state_min(T, cols)
        tot = cols["act"] + smin
        i = int(np.argmin(tot))
        if best_tot is not None and tot[i] >= best_tot:
            continue
        one = P.take(np.array([i]))
        d = np.array([T.dpo_vals.index(1) if 1 in T.dpo_vals else 0])
        best_tot, best_k = int(tot[i]), knobs_of_pairs(T, one, np.array([zarg[i]]), d)
    if best_tot is None or best_tot >= np.iinfo(np.int64).max // 8:
        return MinMemory(c.size, None, None)
    return MinMemory(c.size, float(best_tot) * KIB, best_k)
