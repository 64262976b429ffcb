"""Presolve by bounds (constraint group ``bounds``): which (triple, block) pairs can still be optimal.

A *pair* is a legal (layout, vpp, micro-batch) triple t with one block setting s = (recompute, SP, TP
overlap). From the pair's terms (`formulations.pairs`, the same columns the CP-SAT model reads) every pair
gets

    LB(t, s) = pipeline(t, s) + min over ZeRO stages z that fit of [optimizer_z + pu * link_z]

where pipeline is exactly the solver's pipeline part, and the DP time is at least pu x its link time
(with overlap the model charges pu*link + (1-pu)*exposed, without it the whole link), so LB never exceeds
the solver's objective of any assignment using the pair.
Memory alike: a pair is dropped when no ZeRO stage fits (state + activations + reserve > capacity).
Triples are bounded first, with every block column at its minimum over the triple's block settings (each
term is monotone in them, so that bounds every pair of the triple); only the surviving triples are expanded.

An incumbent (the best of the model's evaluation of the pairs with the smallest LB, every ZeRO stage and
DP overlap; widened 4x at a time, up to 16x, while more than 4x as many triples stay within its bound) gives
an upper bound UB; pairs with LB > UB cannot hold an optimal plan and are left out of the
CP-SAT model. The optimality proof is then CP-SAT's over the kept pairs plus LB > UB >= optimum for the
rest. With ``top`` K plans, UB is the K-th best distinct incumbent, so the K best plans all survive.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from formulations.pairs import compose, pair_columns, state_min
from formulations.tables import TIME_UNIT, Tables, knob_grid, or_masks
from optimizer.model.capacity import feasible
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate
from optimizer.prepare.objective import gpu_time_cap, gpu_time_limit, score, step_limit, target
from optimizer.rules.layout import dp_overlap_allowed, zero_allowed
from optimizer.schema.stack import overlaps_pipelined_dp

UB_SLACK = 1e-4  # relative: the integer objective of the incumbent may differ from the model's by rounding


@dataclass
class Pairs:
    """Candidate (triple, block) pairs with their bounds; arrays of equal length."""

    li: np.ndarray
    vi: np.ndarray
    mi: np.ndarray
    ri: np.ndarray
    si: np.ndarray
    oi: np.ndarray
    lb: np.ndarray  # lower bound of the step time, TIME_UNIT
    var: np.ndarray  # variant index (formulations.tables.build_all)
    slb: np.ndarray | None = None  # lower bound of the score (optimizer.prepare.objective), TIME_UNIT

    def __len__(self) -> int:
        return len(self.li)

    def take(self, idx) -> Pairs:
        return Pairs(
            *(getattr(self, n)[idx] for n in ("li", "vi", "mi", "ri", "si", "oi", "lb", "var")),
            None if self.slb is None else self.slb[idx],
        )

    @staticmethod
    def concat(parts: list[Pairs]) -> Pairs:
        names = ("li", "vi", "mi", "ri", "si", "oi", "lb", "var")
        slb = None if any(p.slb is None for p in parts) else np.concatenate([p.slb for p in parts])
        return Pairs(*(np.concatenate([getattr(p, n) for p in parts]) for n in names), slb)


def _as_list(Ts: Tables | list[Tables]) -> list[Tables]:
    return Ts if isinstance(Ts, list) else [Ts]


def expand(T: Tables, tri: np.ndarray) -> Pairs:
    """Every legal pair of the triples `tri` (rows l, vi, mi): the block settings (recompute, SP, TP overlap)
    its layout allows (`tables.block_settings`)."""
    nR, nS, nO = len(T.rec_vals), len(T.sp_vals), len(T.ov_vals)
    subs = np.indices((nR, nS, nO)).reshape(3, -1).T
    li, vi, mi = (np.repeat(tri[:, j], len(subs)) for j in range(3))
    ri, si, oi = (np.tile(subs[:, j], len(tri)) for j in range(3))
    setting = np.tile(np.arange(len(subs), dtype=np.int64), len(tri))
    ok = ((T.L["rso"][li] >> setting) & 1).astype(bool)
    idx = np.nonzero(ok)[0]
    return Pairs(
        li[idx],
        vi[idx],
        mi[idx],
        ri[idx],
        si[idx],
        oi[idx],
        np.zeros(len(idx), dtype=np.int64),
        np.full(len(idx), T.var, dtype=np.int64),
    )


def _bound(T: Tables, terms: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(LB of the objective, can fit) from the terms of `formulations.pairs.compose`."""
    _, _, lb, fits = state_min(T, terms, act_kib=terms["act"])
    return lb, fits


def triple_cols(T: Tables, tri: np.ndarray):
    """Per triple, each block column's minimum over the triple's block settings (a lower bound)."""
    nM, nR, nS, nO = T.nM, len(T.rec_vals), len(T.sp_vals), len(T.ov_vals)
    nT = len(T.problem.system.networks)
    nS_all = nR * nS * nO
    BE = T.BETA
    li, mi = tri[:, 0], tri[:, 2]
    # the rows the triples read: (group, micro-batch) x the settings their layouts allow
    g_all = T.L["tpcp"][li] * nM + mi
    g_rows, mask = or_masks(g_all, T.L["rso"][li])
    g = np.searchsorted(g_rows, g_all)
    allowed = ((mask[:, None] >> np.arange(nS_all, dtype=np.int64)) & 1).astype(bool)
    big = np.iinfo(np.int64).max

    def gmin(arr: np.ndarray, extra: int = 1) -> np.ndarray:
        a = arr.reshape(-1, nS_all, extra)[g_rows]
        return np.where(allowed[:, :, None], a, big).min(axis=1)  # (rows read, extra)

    mins = {
        n: gmin(BE[n])[:, 0]
        for n in (
            "tau_mb",
            "layer_s",
            "act_stored_bytes",
            "act_working_bytes",
            "emb_out_bytes",
            "logits_bytes",
            "mtp_act_bytes",
            "offx_mb",
        )
    }
    # the overlapped exchange max(p2p - Lc*window, 0) falls with the window: its largest keeps the bound a
    # bound
    mins["p2p_window"] = -gmin(-BE["p2p_window"])[:, 0]
    # zero-bubble's fill is taken off the bubble: its largest keeps the bound a bound
    mins["bubble_fill_s"] = -gmin(-BE["bubble_fill_s"])[:, 0]
    # the pipeline's head and exchanges grow with the head and t_p2p (2*vpp >= 2 exchanges per head hidden)
    head, p2p = gmin(BE["head_s"], T.n_head_cols * nT), gmin(BE["p2p_s"], nT)
    tpp = T.lay["tier_pp"][li]
    got = {"head_s": head[g, T.L["hc"][li] * nT + tpp], "p2p_s": p2p[g, tpp]}
    return lambda name: got[name] if name in got else mins[name][g]


@dataclass
class Presolved:
    pairs: Pairs  # kept pairs (LB <= UB)
    cols: dict[str, np.ndarray]  # their terms (formulations.pairs)
    n_triples: int  # legal triples
    n_triples_kept: int  # triples whose bound survives the incumbent
    n_pairs_fit: int  # pairs of the kept triples that can fit
    incumbent: Incumbent


NONE = np.iinfo(np.int64).max // 2  # "no bound"


def score_int(T: Tables, li: np.ndarray, step: np.ndarray) -> np.ndarray:
    """`optimizer.prepare.objective.score` of integer step times (TIME_UNIT); NONE where a target is
    missed."""
    return score(T.problem, T.gpus(li), step, unit=TIME_UNIT, missed=NONE)


def presolve(
    Ts: Tables | list[Tables],
    top: int = 1,
    n_triples: int = 96,
    deadline: float | None = None,
    distinct: bool = False,
) -> Presolved:
    """Bounds per triple (block columns at their minimum), an incumbent from the most promising triples of
    every variant, then exact pair bounds for the triples that survive; pairs with LB > UB are dropped.
    Past `deadline` (perf_counter s) the incumbent is not widened nor refined further (both only prune).
    `distinct`: the bound keeps the `top` best distinct layouts (`layout_groups`), not the `top` best
    plans."""
    Ts = _as_list(Ts)
    tris, lbs = [], []
    n_tri = 0
    for T in Ts:
        tri = np.array(T.legal_lvm, dtype=np.int64).reshape(-1, 3)
        n_tri += len(tri)
        lb_t, fit_t = _bound(T, compose(T, tri[:, 0], tri[:, 1], tri[:, 2], triple_cols(T, tri)))
        ok = np.nonzero(fit_t)[0]
        tri_ok, lb_ok = tri[ok], score_int(T, tri[ok, 0], lb_t[ok])
        ok2 = lb_ok < NONE
        tris.append(tri_ok[ok2])
        lbs.append(lb_ok[ok2])
    # the most promising triples over all variants feed the incumbent
    lb_all = np.concatenate(lbs)
    var_all = np.concatenate([np.full(len(x), j) for j, x in enumerate(lbs)]).astype(np.int64)
    pos_all = np.concatenate([np.arange(len(x)) for x in lbs]).astype(np.int64)
    n = min(len(lb_all), max(n_triples, 4 * top))
    while True:
        first = np.argpartition(lb_all, n - 1)[:n] if 0 < n < len(lb_all) else np.arange(len(lb_all))
        sel = [expand(T, tris[j][pos_all[first][var_all[first] == j]]) for j, T in enumerate(Ts)]
        inc = incumbent(Ts, Pairs.concat(sel), top, distinct)
        # a weak incumbent leaves many triples within its bound (and CP-SAT a long proof): widen it, 4x at a
        # time
        if n >= len(lb_all) or int((lb_all <= inc.ub).sum()) <= 4 * n or n >= 16 * n_triples:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        n = min(len(lb_all), 4 * n)
    parts, cols_parts, n_kept_t, n_fit = [], [], 0, 0
    for j, T in enumerate(Ts):
        keep_t = tris[j][lbs[j] <= inc.ub]
        n_kept_t += len(keep_t)
        P = expand(T, keep_t)
        cols = pair_columns(T, P.li, P.vi, P.mi, P.ri, P.si, P.oi)
        P.lb, fit = _bound(T, cols)
        P.slb = score_int(T, P.li, P.lb)
        n_fit += int(fit.sum())
        keep = np.nonzero(fit & (P.slb <= inc.ub) & (P.slb < NONE))[0]
        parts.append(P.take(keep))
        cols_parts.append({k: v[keep] for k, v in cols.items()})
    P = Pairs.concat(parts)
    cols = {k: np.concatenate([c[k] for c in cols_parts]) for k in cols_parts[0]}
    P, cols, inc = refine(Ts, P, cols, inc, top, deadline=deadline, distinct=distinct)
    return Presolved(P, cols, n_tri, n_kept_t, n_fit, inc)


def refine(
    Ts: list[Tables],
    P: Pairs,
    cols: dict[str, np.ndarray],
    inc: Incumbent,
    top: int,
    keep_at_most: int = 64,
    batch: int = 8192,
    rounds: int = 32,
    deadline: float | None = None,
    distinct: bool = False,
):
    """While more than `keep_at_most` pairs survive, evaluate the `batch` pairs of smallest bound with the
    model (every ZeRO stage and DP overlap): their bound becomes their exact score (less the integer
    objective's rounding slack), and a better incumbent prunes the rest again. The triple-level incumbent is
    weak where the score multiplies GPUs by time (tokens_per_gpu) or idle GPUs widen the space, and the
    column bounds are loose where the DP exposure depends on the ZeRO stage; a few thousand model
    evaluations cost far less than a CP-SAT proof over thousands of pairs, which then proves the optimum
    among the few pairs left; past `deadline` (perf_counter s) it stops (CP-SAT proves the rest)."""
    done = np.zeros(len(P), dtype=bool)
    for _ in range(rounds):
        todo = np.nonzero(~done)[0]
        if len(P) <= keep_at_most or len(todo) == 0:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        k = min(len(todo), batch)
        best = todo[np.argpartition(P.slb[todo], k - 1)[:k]] if k < len(todo) else todo
        better = incumbent(Ts, P.take(best), top, distinct)
        slb = P.slb.copy()
        slb[best] = np.maximum(slb[best], better.pair_lb)
        done[best] = True
        if better.hint is not None and better.ub < inc.ub:
            inc = Incumbent(better.ub, better.hint, inc.evaluated + better.evaluated)
        else:
            inc = Incumbent(inc.ub, inc.hint, inc.evaluated + better.evaluated)
        keep = np.nonzero(slb <= inc.ub)[0]
        P = P.take(keep)
        P.slb = slb[keep]
        cols, done = {c: v[keep] for c, v in cols.items()}, done[keep]
    return P, cols, inc


def knobs_of_pairs(Ts: Tables | list[Tables], P: Pairs, z: np.ndarray, d: np.ndarray) -> Knobs:
    """Candidates of the pairs with ZeRO-stage index z and DP-overlap index d (arrays)."""
    Ts = _as_list(Ts)
    T = Ts[0]  # layouts and value lists are shared by the variants
    by_var = np.zeros((max(t.var for t in Ts) + 1, len(T.fixed)), dtype=np.int64)
    for t in Ts:
        by_var[t.var] = [t.fixed[k] for k in T.fixed]
    fixed = {k: by_var[P.var, i] for i, k in enumerate(T.fixed)}
    lay = {k: v[P.li] for k, v in T.lay.items()}
    return knob_grid(
        fixed,
        len(P),
        **lay,
        vpp=np.array(T.v_vals)[P.vi],
        micro_batch=np.array(T.mb_vals)[P.mi],
        recompute=np.array(T.rec_vals)[P.ri],
        sequence_parallel=np.array(T.sp_vals)[P.si],
        tp_overlap=np.array(T.ov_vals)[P.oi],
        zero=np.array(T.z_vals)[z],
        dp_overlap=np.array(T.dpo_vals)[d],
    )


@dataclass
class Incumbent:
    ub: int  # score in TIME_UNIT; pairs with score LB > ub are pruned (huge: nothing evaluated fits)
    hint: dict[str, int] | None  # the best incumbent as indices of the CP-SAT decision variables
    evaluated: int
    pair_lb: np.ndarray | None = (
        None  # per evaluated pair: its exact score less the rounding slack (NONE: none fits)
    )


LAYOUT_DEGREES = ("tp", "pp", "cp", "dp", "ep", "etp")  # what makes two plans different layouts


def layout_groups(T: Tables) -> np.ndarray:
    """Per layout index, the id of its parallel degrees (`LAYOUT_DEGREES`): layouts that differ only in
    tier placement or in where the embedding and loss sit share an id."""
    degrees = np.stack([np.asarray(T.lay[k]) for k in LAYOUT_DEGREES], axis=1)
    return np.unique(degrees, axis=0, return_inverse=True)[1].reshape(-1)


def _nth_best(good: np.ndarray, li: np.ndarray, groups: np.ndarray | None, top: int) -> int | None:
    """Index (into the evaluated candidates) of the `top`-th best in `good` (sorted best first), counting
    only each layout group's best where `groups` is given; None when there are fewer."""
    if groups is not None:
        _, first = np.unique(groups[li[good]], return_index=True)
        good = good[np.sort(first)]
    return int(good[top - 1]) if len(good) >= top else None


def incumbent(Ts: Tables | list[Tables], sel: Pairs, top: int = 1, distinct: bool = False) -> Incumbent:
    """The model's best plan among the pairs `sel` (of any variant) with every ZeRO stage and DP overlap;
    its bound is that of the `top`-th best plan (`distinct`: of the `top`-th best layout, each layout group
    counted once)."""
    Ts = _as_list(Ts)
    T = Ts[0]
    if len(sel) == 0:
        return Incumbent(np.iinfo(np.int64).max, None, 0)
    nz, nd = len(T.z_vals), len(T.dpo_vals)
    zz, dd = (a.reshape(-1) for a in np.indices((nz, nd)))
    rep = sel.take(np.repeat(np.arange(len(sel)), nz * nd))
    z, d = np.tile(zz, len(sel)), np.tile(dd, len(sel))
    dpg1 = T.L["dpg1"][rep.li]
    # as the space: ZeRO only with a data-parallel group; the DP-overlap flag as `dp_overlap_allowed` says
    legal = zero_allowed(np.array(T.z_vals)[z], dpg1) & dp_overlap_allowed(
        np.array(T.dpo_vals)[d] == 1,
        dpg1,
        T.L["ppgt1"][rep.li] == 1,
        1 in T.dpo_vals,
        overlaps_pipelined_dp(T.problem.stack),
    )
    pos = np.repeat(np.arange(len(sel)), nz * nd)[legal]
    rep, z, d = rep.take(np.nonzero(legal)[0]), z[legal], d[legal]
    k = knobs_of_pairs(Ts, rep, z, d)
    res = evaluate(T.problem, k)
    fits = feasible(T.problem, k, res)
    t = np.where(fits, score(T.problem, T.gpus(rep.li), res.step_time), np.inf)
    # each evaluated pair's exact score (its best ZeRO stage and overlap) less the rounding slack of the
    # integer objective, on the step time: a lower bound as tight as the model
    lo_step = np.floor(res.step_time * TIME_UNIT * (1 - UB_SLACK)).astype(np.int64) - 1
    lb = np.where(fits, score(T.problem, T.gpus(rep.li), lo_step, unit=TIME_UNIT, missed=NONE), NONE).astype(
        np.int64
    )
    pair_lb = np.full(len(sel), NONE, dtype=np.int64)
    np.minimum.at(pair_lb, pos, lb)
    order = np.argsort(t, kind="stable")
    good = order[np.isfinite(t[order])]
    if len(good) == 0:
        return Incumbent(np.iinfo(np.int64).max, None, len(t), pair_lb)
    i = int(good[0])
    hint = dict(
        li=int(rep.li[i]),
        vi=int(rep.vi[i]),
        mi=int(rep.mi[i]),
        ri=int(rep.ri[i]),
        si=int(rep.si[i]),
        oi=int(rep.oi[i]),
        var=int(rep.var[i]),
        zi=int(z[i]),
        di=int(d[i]),
    )
    j = _nth_best(good, rep.li, layout_groups(T) if distinct else None, top)
    if j is None:
        return Incumbent(np.iinfo(np.int64).max, hint, len(t), pair_lb)
    # the slack is on the step time (the integer objective rounds it), not on the score: a relative slack on
    # GPUs x BIG + T (fewest_gpus) would span seconds of step time and prune nothing
    n_j = int(T.gpus(rep.li[j : j + 1])[0])
    step_ub = _step_ub(T.problem, n_j, float(res.step_time[j]))
    ub = float(score(T.problem, np.array([n_j]), np.array([step_ub]), unit=TIME_UNIT)[0])
    if not np.isfinite(ub):
        return Incumbent(np.iinfo(np.int64).max, hint, len(t), pair_lb)
    return Incumbent(int(np.ceil(ub)), hint, len(t), pair_lb)


def _step_ub(problem, n_gpus: int, step_s: float) -> float:
    """The incumbent's step time in TIME_UNIT with the integer objective's rounding slack, capped at the
    largest integer step time the CP-SAT model admits under the objective's targets (`objective_score`):
    the slack must not push a plan that meets a target with less slack than the rounding over it."""
    step_ub = np.ceil(step_s * TIME_UNIT * (1 + UB_SLACK)) + 1
    tg, cap = target(problem, TIME_UNIT), gpu_time_cap(problem, TIME_UNIT)
    if tg is not None:
        step_ub = min(step_ub, float(np.floor(np.ravel(step_limit(problem, n_gpus, TIME_UNIT))[0])))
    if cap is not None and n_gpus > 0:
        step_ub = min(step_ub, float(np.ravel(gpu_time_limit(problem, n_gpus, TIME_UNIT))[0]))
    return step_ub
