"""Exact pruning and redundant bounds per (layout, vpp, micro-batch) triple (constraint group ``bounds``).

For a triple t, the pipeline part of the step (n_mb*Ls*tau + n_mb*head + bubble + p2p) depends only on
the block beta among the triple's (tp, cp, micro-batch) blocks, and the other terms (DP, optimizer) are
>= 0, so LB[t] = min over those blocks of the pipeline part is a valid lower bound of the objective.
Memory likewise: the smallest state memory over ZeRO stages plus the block's activations. Blocks that
cannot fit even then are left out of the minimum, and triples with no such block are removed (no plan
there fits). Both are computed from the formulation's tables (numbers of the model), in numpy.
"""

from __future__ import annotations

import numpy as np

from .tables import Tables


def triple_bounds(T: Tables) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """(legal triples that can fit, lower bound of the objective for each)."""
    shape = T.beta_shape()
    nT = len(T.problem.system.networks)
    BE, L, LV, LM = T.BETA, T.L, T.LV, T.LM
    nsub = int(np.prod(shape[2:]))  # recompute x sp x overlap per (tpcp, mb)

    def block(name, extra=None):
        a = BE[name]
        if extra is None:
            return a.reshape(shape[0], shape[1], nsub)
        return a.reshape(shape[0], shape[1], nsub, extra)

    tau, tau_mb = block("tau"), block("tau_mb")
    head = block("head_mb", 2)
    p2p_mb, p2p = block("p2p_mb", nT), block("p2p", nT)
    stored, working = block("stored"), block("working")
    embout, logits = block("embout"), block("logits")
    state_min = np.min(np.stack([L[f"wgo{z}"] for z in T.z_vals]), axis=0)
    keep, lbs = [], []
    for li, vi, mi in T.legal_lvm:
        ti = int(L["tpcp"][li])
        lv, lm = li * T.nV + vi, li * T.nM + mi
        ppg = int(L["ppgt1"][li])
        tpp = int(T.lay["tier_pp"][li])
        NL = int(LM["NL"][lm])
        infl = int(LM["infl1"][lm]) if T.v_vals[vi] == 1 else min(int(LV["inflv"][lv]), NL)
        st, wk = stored[ti, mi], working[ti, mi]
        first = infl * st + wk + embout[ti, mi]
        if ppg:
            act = np.maximum(first, int(L["Ls"][li]) * st + wk + logits[ti, mi])
        else:
            act = first + logits[ti, mi]
        fits = state_min[li] + act + int(L["reserved"][li]) <= T.cap_kib
        if not fits.any():
            continue
        pipe = (int(L["A1"][li]) * tau_mb[ti, mi] + int(L["A2"][li]) * head[ti, mi, :, ppg]
                + int(LV["Bf"][lv]) * tau[ti, mi] + int(LV["E"][lv]) * p2p_mb[ti, mi, :, tpp]
                + int(L["pm2"][li]) * p2p[ti, mi, :, tpp])
        keep.append((li, vi, mi))
        lbs.append(int(pipe[fits].min()))
    return keep, np.array(lbs, dtype=np.int64)
