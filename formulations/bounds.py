"""Exact pruning and redundant bounds per (layout, vpp, micro-batch) triple (constraint group ``bounds``).

For a triple t, the pipeline part of the step (layers, LM head, bubble, p2p) depends only on the block
(recompute, SP, TP overlap) chosen within it, and the other terms (DP traffic, optimizer) are >= 0, so
LB[t] = min over the triple's blocks of the pipeline part bounds the objective from below. Memory alike:
the smallest state memory over ZeRO stages plus the block's activations. Blocks that cannot fit even then
are left out of the minimum; triples with no such block are removed. Both come from `evaluate(...).terms`
on the grid of every triple and block (the model's own composition); LB is lowered by the rounding the
formulation's integer tables may introduce, so it never exceeds the solver's objective.
"""

from __future__ import annotations

import numpy as np

from optimizer.model.step import evaluate

from .tables import KIB, TIME_UNIT, Tables, knob_grid


def triple_bounds(T: Tables) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """(legal triples that can fit, a lower bound of the objective for each, in TIME_UNIT)."""
    tri = np.array(T.legal_lvm, dtype=np.int64).reshape(-1, 3)
    subs = np.array([(r, s, o) for r in T.rec_vals for s in T.sp_vals for o in T.ov_vals], dtype=np.int64)
    li, vi, mi = (np.repeat(tri[:, j], len(subs)) for j in range(3))
    sub = np.tile(subs, (len(tri), 1))
    lay = {k: v[li] for k, v in T.lay.items()}
    tp1 = lay["tp"] == 1  # the space allows no SP and no TP overlap without a TP group
    ok = ~(tp1 & ((sub[:, 1] != 0) | (sub[:, 2] != 0)))
    k = knob_grid(T.fixed, len(li), **lay, vpp=np.array(T.v_vals)[vi], mb=np.array(T.mb_vals)[mi],
                  recompute=sub[:, 0], sp=sub[:, 1], tp_overlap=sub[:, 2])
    r = evaluate(T.problem, k).terms
    pipe = (r["pipe"] + r["bubble"] + r["pp_exposed"]) * TIME_UNIT
    # the solver's terms are products of integer-rounded tables: allow half a unit per product factor
    lv = li * T.nV + vi
    margin = 0.5 * (T.L["A1"][li] + T.L["A2"][li] + T.LV["Bf"][lv] + T.LV["E"][lv] + T.L["pm2"][li]) + 1.0
    state_min = np.min(np.stack([T.L[f"wgo{z}"] for z in T.z_vals]), axis=0)[li]  # KiB, rounded up
    fits = ok & (state_min * KIB + r["activations"] + r["reserved"] <= T.cap_kib * KIB)
    lb = np.where(fits, np.floor(pipe - margin), np.inf).reshape(len(tri), len(subs)).min(axis=1)
    keep = np.isfinite(lb)
    return [tuple(int(x) for x in t) for t in tri[keep]], np.maximum(lb[keep], 0).astype(np.int64)
