"""Solve driver for heterogeneous pipelines (`optimizer.model.pipeline_mix`): stages on different node types.

prepare: the node types on offer (`TypeOffer`: each type's problem, node limit, price, power); for every
data-parallel degree d and micro-batch b with d*b dividing the batch, and every pipeline position, a
candidate table (type, tp, recompute, stages, layers per stage) filled by the analytical model and filtered
by what must hold whatever the other positions choose (GPUs within the type's limit, the position's memory
with the fewest micro-batches in flight it can have). build/solve: one CP-SAT model per (d, b)
(`formulations.pipeline_mix`), each cut by the best step time found so far, so the best over all is proven
optimal within the modelled family when every model is solved or proven unable to beat it. extract/verify:
the plan re-evaluated by `evaluate_mix`; objective and model agree within 0.1% and memory fits.

`enumerate_pipeline_mix` is the exhaustive oracle on the same family (small instances; tests).
"""

from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from optimizer.errors import TimeLimit, VerificationError
from optimizer.model.capacity import capacity_bytes
from optimizer.model.hardware import collective_time
from optimizer.model.knobs import RECOMPUTE
from optimizer.model.pipeline_mix import (
    LAST,
    MIDDLE,
    MixPlan,
    MixResult,
    StageGroup,
    compose_mix_step,
    evaluate_mix,
    group_terms,
    join_network,
    join_time,
    role_of,
)
from optimizer.rules.layout import axis_values, divisors
from optimizer.schema import Problem
from optimizer.schema.procure import whole_units

MICRO_BATCHES = (1, 2, 4, 8)


@dataclass(frozen=True)
class TypeOffer:
    """A node type that may take pipeline stages."""

    name: str
    problem: Problem  # that type's problem (system, llm, training, options)
    max_nodes: int
    node_usd: float | None = None
    power_kw: float | None = None
    unit_nodes: int = 1  # nodes sold together (a rack)

    @property
    def gpus_per_node(self) -> int:
        return self.problem.system.gpus_per_node

    def nodes_for(self, gpus):
        """Nodes bought to hold `gpus` GPUs: whole nodes, whole units (racks). Integers or numpy arrays."""
        return whole_units(-(-gpus // self.gpus_per_node), self.unit_nodes)

    @property
    def max_gpus(self) -> int:
        return self.max_nodes * self.gpus_per_node


@dataclass
class MixSolution:
    plan: MixPlan
    result: MixResult
    status: str  # optimal | feasible
    models: int  # CP-SAT models solved (or candidate tuples enumerated by the oracle)
    seconds: float
    nodes: dict  # node type -> nodes bought
    cost_usd: float | None
    power_kw: float | None


def outer(offers: list[TypeOffer], G: int) -> list[tuple[int, int]]:
    """(d, b): d*b divides the batch; the G groups need at least d GPUs each of what is on offer."""
    B = offers[0].problem.training.global_batch
    total = sum(o.max_gpus for o in offers)
    return [(d, b) for d in divisors(B) for b in MICRO_BATCHES if B % (d * b) == 0 and d * G <= total]


def _undominated(keys: np.ndarray, worse: np.ndarray) -> np.ndarray:
    """Rows not dominated by another row of the same key: no other row is <= in every column of `worse`
    (smaller is better) and < in one. Rows of a key are few (tp x recompute), compared by padding."""
    order = np.lexsort(keys.T[::-1])
    k, w = keys[order], worse[order]
    start = np.r_[True, np.any(k[1:] != k[:-1], axis=1)]
    gid = np.cumsum(start) - 1
    first = np.flatnonzero(start)
    slot = np.arange(len(k)) - first[gid]
    width = int(slot.max()) + 1
    pad = np.full((len(first), width, w.shape[1]), np.inf)
    pad[gid, slot] = w
    le = (pad[:, None, :, :] <= pad[:, :, None, :]).all(-1)  # [g, i, j]: j <= i everywhere
    lt = (pad[:, None, :, :] < pad[:, :, None, :]).any(-1)
    dom = (le & lt).any(-1)  # some j dominates i
    keep = np.empty(len(k), dtype=bool)
    keep[order] = ~dom[gid, slot]
    return keep


def candidates(
    o: TypeOffer, g: int, G: int, d: int, b: int, jt: list, prune: bool = True
) -> dict[str, np.ndarray] | None:
    """The candidate rows of type o at position g (floats; module docstring of `formulations.pipeline_mix`);
    `prune` drops rows another (tp, recompute) of the same stages and layers beats on every column; `jt`:
    every offered type's join network (`join_network`), giving the columns join0, join1, ... (this row's
    message over type i's network)."""
    p = o.problem
    L = p.llm.layers
    B = p.training.global_batch
    n_mb = B // (d * b)
    tps = [
        t for t in axis_values(p.model_copy(update={"num_gpus": o.max_gpus}), "tp") if t <= o.gpus_per_node
    ]
    rows = []
    for t in tps:
        smax = o.max_gpus // (d * t)
        for s in range(1, min(smax, L) + 1):
            for ell in range(1, (L - (G - 1)) // s + 1):
                for r in range(3):
                    rows.append((t, r, s, ell))
    if not rows:
        return None
    tp, rec, st, ly = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
    role = role_of(g, G)
    te = group_terms(p, d, b, n_mb, role, tp, rec, ly, st)
    cap = capacity_bytes(p)
    after = G - 1 - g  # later positions hold at least one stage each
    if role == LAST:
        need = np.maximum(te["fixed"] + np.minimum(n_mb, st) * te["a"], te["last_alt"])
    else:
        need = te["fixed"] + np.minimum(n_mb, st + after) * te["a"]
    gpus = d * st * tp
    nodes = o.nodes_for(gpus)
    keep = need <= cap
    jn = [collective_time("p2p", te["msg"], 2.0, 0, t) for t in jt]
    if prune and keep.any():
        w = np.stack(
            [
                te["u"],
                te["he"],
                np.where(st > 1, te["p2p"], 0.0),
                te["msg"],
                te["x"],
                te["a"],
                nodes,
                te["fixed"] - cap,
                np.where(role == LAST, need, 0.0),
            ],
            axis=1,
        )
        sub = np.flatnonzero(keep)
        keep[sub] &= _undominated(np.stack([st, ly], axis=1)[sub], w[sub])
    out = (
        {
            "tp": tp,
            "rec": rec,
            "stages": st,
            "layers": ly,
            "nodes": nodes,
            "gpus": gpus,
            "cap": np.full(tp.shape, cap),
        }
        | {f"join{i}": j for i, j in enumerate(jn)}
        | te
    )
    return {k: np.asarray(v)[keep] if np.ndim(v) else np.full(int(keep.sum()), v) for k, v in out.items()}


def _rmax(c: dict, n_mb: int) -> np.ndarray:
    """Per row: the most stages after it for which its first stage's memory fits, fixed + a*min(n_mb, s + r)
    <= cap (the model's rule; n_mb when even n_mb micro-batches in flight fit)."""
    slack = c["cap"] - c["fixed"]
    a = np.maximum(c["a"], 1e-300)
    fit_all = c["fixed"] + n_mb * c["a"] <= c["cap"]
    most = np.floor(slack / a + 1e-9) - c["stages"]  # largest r with s + r <= slack / a
    return np.where(fit_all, n_mb, np.clip(most, 0, n_mb)).astype(np.int64)


def _ints(c: dict, tid: int, o: TypeOffer, role: str, n_mb: int) -> dict[str, np.ndarray]:
    """Integer columns (ns, KiB, USD, W) of one type's candidates for the CP-SAT tables."""
    from formulations.pipeline_mix import NS

    ns = lambda x: np.rint(np.asarray(x) * NS).astype(np.int64)  # noqa: E731
    n = len(c["tp"])
    st = c["stages"]
    return (
        {
            "type": np.full(n, tid),
            "stages": st,
            "sl": st * c["layers"],
            "u": ns(c["u"]),
            "he": ns(c["he"]) if role == LAST else np.zeros(n, np.int64),
            "p2p_in": np.where(st > 1, ns(c["p2p"]), 0),
            "su": ns(st * c["u"]),
            "fill": ns((st - 1) * c["p2p"]),
            "x": ns(c["x"]),
            "rmax": _rmax(c, n_mb),
            "cost": (c["nodes"] * round(o.node_usd or 0)).astype(np.int64),
            "power": (c["nodes"] * round(1000 * (o.power_kw or 0))).astype(np.int64),
        }
        | {k: ns(v) for k, v in c.items() if k.startswith("join")}
        | {"join_own": ns(c[f"join{tid}"])}
    )


def _plan(offers, picks: list[tuple[int, dict, int]], d: int, b: int) -> MixPlan:
    return MixPlan(
        tuple(
            StageGroup(
                offers[t].name,
                int(c["tp"][i]),
                int(c["stages"][i]),
                int(c["layers"][i]),
                RECOMPUTE[int(c["rec"][i])],
            )
            for t, c, i in picks
        ),
        d,
        b,
    )


def _solution(offers, plan: MixPlan, status: str, models: int, t0: float, joining) -> MixSolution:
    by = {o.name: o for o in offers}
    res = evaluate_mix({o.name: o.problem for o in offers}, plan, joining)
    nodes = {g.node_type: by[g.node_type].nodes_for(g.gpus(plan.dp)) for g in plan.groups}
    cost = (
        None
        if any(by[n].node_usd is None for n in nodes)
        else sum(k * by[n].node_usd for n, k in nodes.items())
    )
    power = (
        None
        if any(by[n].power_kw is None for n in nodes)
        else sum(k * by[n].power_kw for n, k in nodes.items())
    )
    return MixSolution(plan, res, status, models, time.perf_counter() - t0, nodes, cost, power)


def _bounded_outer(offers: list[TypeOffer], G: int) -> list[tuple[float, int, int, int]]:
    """(lower bound s, d, b, n_mb) for every (d, b) of `outer` that G positions can fill, fastest bound first.
    The bound comes from the per-layer times alone (every type, tp and recomputation: a superset of the rows,
    so it holds): each micro-batch needs >= L*min(tau*tp) GPU-seconds from at most N/d GPUs per replica
    pipeline in the steady state, and fill and drain pass every layer once."""
    B = offers[0].problem.training.global_batch
    L = offers[0].problem.llm.layers
    N = sum(o.max_gpus for o in offers)
    prepared = []
    for d, b in outer(offers, G):
        n_mb = B // (d * b)
        taus, gpu_taus = [], []
        for o in offers:
            tps = [
                t
                for t in axis_values(o.problem.model_copy(update={"num_gpus": o.max_gpus}), "tp")
                if t <= o.gpus_per_node and d * t <= o.max_gpus
            ]
            if not tps:
                continue
            tp = np.repeat(np.array(tps, dtype=np.int64), 3)
            rec = np.tile(np.arange(3, dtype=np.int64), len(tps))
            u = group_terms(o.problem, d, b, n_mb, MIDDLE, tp, rec, 1, 1)["u"]  # per-layer time, no ends
            taus.append(u)
            gpu_taus.append(u * tp)
        if len(taus) < G:
            continue
        lb = (n_mb - 1) * L * np.concatenate(gpu_taus).min() * d / N + L * np.concatenate(taus).min()
        prepared.append((float(lb), d, b, n_mb))
    prepared.sort(key=lambda x: x[0])
    return prepared


def _positions(
    offers: list[TypeOffer], G: int, d: int, b: int, n_mb: int, jt: list
) -> tuple[list, list] | None:
    """The CP-SAT tables of the G positions at (d, b) (`formulations.pipeline_mix.Position`, every offered
    type's candidates stacked) and, per position, the (type id, float candidates) they were stacked from;
    None when a position has no candidate."""
    from formulations.pipeline_mix import Position

    pos, raw = [], []
    for g in range(G):
        cols, rw = [], []
        for tid, o in enumerate(offers):
            c = candidates(o, g, G, d, b, jt)
            if c is None or len(c["tp"]) == 0:
                continue
            cols.append(_ints(c, tid, o, role_of(g, G), n_mb))
            rw.append((tid, c))
        if not cols:
            return None
        pos.append(Position({k: np.concatenate([x[k] for x in cols]) for k in cols[0]}))
        raw.append(rw)
    return pos, raw


def _solve_position_model(
    pos: list,
    L: int,
    n_mb: int,
    budget_usd: float | None,
    power_kw: float | None,
    best_ns: int | None,
    deadline: float,
) -> tuple[tuple[list[int], int] | None, bool]:
    """Build and solve one CP-SAT model (`formulations.pipeline_mix.build`), cut below the incumbent
    `best_ns` (ns) and stopped at `deadline` (perf_counter s). Returns ((chosen row per position, step ns) or
    None, proven): proven is False when the solver stopped before proving its answer (unknown, or feasible
    only)."""
    from formulations.cp_sat import cp_model
    from formulations.pipeline_mix import build

    m = cp_model.CpModel()
    budget = None if budget_usd is None else int(math.floor(budget_usd + 1e-6))
    power = None if power_kw is None else int(math.floor(1000 * power_kw + 1e-6))
    pv = build(m, pos, L, n_mb, budget, power, upper=None if best_ns is None else best_ns - 1)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(1.0, deadline - time.perf_counter())
    solver.parameters.num_workers = min(8, os.cpu_count() or 1)  # CP-SAT's portfolio on every core
    st = solver.Solve(m)
    if st == cp_model.UNKNOWN:
        return None, False
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, True
    return (pv.extract(solver), solver.Value(pv.objective)), st == cp_model.OPTIMAL


def _picks(rows: list[int], raw: list) -> list[tuple[int, dict, int]]:
    """(type id, candidates, row) per position from the stacked row the solver chose (`_positions`)."""
    picks = []
    for g, r in enumerate(rows):
        off = 0
        for tid, c in raw[g]:
            if r < off + len(c["tp"]):
                picks.append((tid, c, r - off))
                break
            off += len(c["tp"])
    return picks


def solve_pipeline_mix(
    offers: list[TypeOffer],
    groups: int = 2,
    budget_usd: float | None = None,
    power_kw: float | None = None,
    joining=None,
    time_limit_s: float = 60.0,
    step=None,
) -> MixSolution | None:
    """The fastest heterogeneous pipeline of `groups` positions over the offered types (None: proven that
    none fits; TimeLimit: the time limit passed before any was found):
    one CP-SAT model per (d, b), lowest bound first (`_bounded_outer`), each cut by the incumbent; a (d, b)
    whose bound cannot beat it is passed over. The plan is re-evaluated by `evaluate_mix` and must agree with
    the solver's step time within 0.1% and fit (else VerificationError)."""
    from formulations.pipeline_mix import NS

    t0 = time.perf_counter()
    G = groups
    if len(offers) < G:
        return None
    jt = [join_network(o.problem, joining) for o in offers]
    L = offers[0].problem.llm.layers
    best, best_ns, status, models = None, None, "optimal", 0
    deadline = t0 + time_limit_s
    for lb, d, b, n_mb in _bounded_outer(offers, G):
        if step:
            step()
        if best_ns is not None and lb * NS >= best_ns:
            continue  # cannot beat the incumbent
        if time.perf_counter() > deadline:
            status = "feasible"  # the time limit: the best found so far, not proven
            break
        tables = _positions(offers, G, d, b, n_mb, jt)
        if tables is None:
            continue
        found, proven = _solve_position_model(tables[0], L, n_mb, budget_usd, power_kw, best_ns, deadline)
        models += 1
        if not proven:
            status = "feasible"
        if found is None:
            continue
        best = (_plan(offers, _picks(found[0], tables[1]), d, b), found[1])
        best_ns = best[1]
    if best is None and status != "optimal":
        raise TimeLimit(
            f"pipelined mix of {G} groups: the time limit ({time_limit_s:g} s) passed before any plan was "
            f"found ({models} CP-SAT models solved): not a proof that none fits"
        )
    if best is None:
        return None
    sol = _solution(offers, best[0], status, models, t0, joining)
    err = abs(sol.result.step_time_s - best[1] / NS) / sol.result.step_time_s
    if err > 1e-3 or not sol.result.fits:
        raise VerificationError(
            f"heterogeneous pipeline {best[0].label()}: solver {best[1] / NS:.6g} s against the "
            f"model's {sol.result.step_time_s:.6g} s (fits: {sol.result.fits})"
        )
    return sol


def enumerate_pipeline_mix(
    offers: list[TypeOffer],
    groups: int = 2,
    budget_usd: float | None = None,
    power_kw: float | None = None,
    joining=None,
) -> MixSolution | None:
    """Exhaustive oracle over the same family: every (d, b), ordered choice of distinct types and tuple of
    candidates, composed by `compose_mix_step` and checked with the model's memory rule; small instances
    only."""
    t0 = time.perf_counter()
    G = groups
    jt = [join_network(o.problem, joining) for o in offers]
    B = offers[0].problem.training.global_batch
    L = offers[0].problem.llm.layers
    best, best_t, n = None, math.inf, 0
    for d, b in outer(offers, G):
        n_mb = B // (d * b)
        table = {
            (g, t): candidates(o, g, G, d, b, jt, prune=False) for g in range(G) for t, o in enumerate(offers)
        }
        for types in itertools.permutations(range(len(offers)), G):
            cs = [table[(g, t)] for g, t in enumerate(types)]
            if any(c is None or len(c["tp"]) == 0 for c in cs):
                continue
            grids = np.meshgrid(*[np.arange(len(c["tp"])) for c in cs], indexing="ij")
            ix = [gr.reshape(-1) for gr in grids]

            def col(k, cs=cs, ix=ix):
                return [cs[g][k][ix[g]] for g in range(G)]

            st, ly = col("stages"), col("layers")
            ok = sum(s * y for s, y in zip(st, ly, strict=True)) == L
            nodes = col("nodes")
            if budget_usd is not None:
                ok &= sum(
                    nd * (offers[t].node_usd or 0) for nd, t in zip(nodes, types, strict=True)
                ) <= budget_usd * (1 + 1e-12)
            if power_kw is not None:
                ok &= sum(
                    nd * (offers[t].power_kw or 0) for nd, t in zip(nodes, types, strict=True)
                ) <= power_kw * (1 + 1e-12)
            infl = [np.minimum(n_mb, sum(st[g:])) for g in range(G)]
            fixed, a, alt, cap = col("fixed"), col("a"), col("last_alt"), col("cap")
            for g in range(G):
                ok &= np.maximum(fixed[g] + infl[g] * a[g], alt[g]) <= cap[g]
            n += int(ok.sum())
            if not ok.any():
                continue
            msg = col("msg")
            joins = [
                join_time(np.maximum(msg[g], msg[g + 1]), [jt[types[g]], jt[types[g + 1]]])
                for g in range(G - 1)
            ]
            t = compose_mix_step(n_mb, col("u"), st, col("he")[-1], col("p2p"), joins, col("x"))["step_time"]
            t = np.where(ok, t, np.inf)
            i = int(np.argmin(t))
            if t[i] < best_t:
                best_t = float(t[i])
                best = _plan(offers, [(tt, cs[g], int(ix[g][i])) for g, tt in enumerate(types)], d, b)
    return None if best is None else _solution(offers, best, "optimal", n, t0, joining)


# ---------------------------------------------------------------------------------------------- procure
OFFERED = 4  # node types offered to the pipeline search (module docstring of `procure_pipeline`)


@dataclass
class PipelineChoice:
    """The best pipelined mix of a procurement, as a purchase, with why each type holds what it holds."""

    solution: MixSolution
    purchase: object  # optimizer.drivers.purchase.Purchase
    reasons: list[str]  # per group, in pipeline order
    verdict: str  # against the best single-type purchase
    offered: list[str]


def _offers(pp, rows) -> list:
    """Which node types the pipeline search is given (at most OFFERED): the two best single-type purchases,
    then the types with the most HBM within their limit (memory the pipeline can pool), then the most
    FLOP/s."""
    from optimizer.drivers.purchase import rank_key

    live = [r for r in rows if r.max_nodes >= 1 and r.status != "excluded"]
    ranked = sorted([r for r in live if r.purchase is not None], key=lambda r: rank_key(pp, r.purchase))
    out = ranked[:2]
    by_hbm = sorted(live, key=lambda r: -r.max_nodes * r.node_type.gpus_per_node * r.node_type.system.hbm_gib)
    by_flops = sorted(
        live,
        key=lambda r: (
            -r.max_nodes * r.node_type.gpus_per_node * max(r.node_type.system.matrix_tflops.values())
        ),
    )
    for r in by_hbm[:2] + by_flops:
        if len(out) >= OFFERED:
            break
        if r not in out:
            out.append(r)
    return out


def procure_pipeline(
    pp, rows, time_limit_s: float = 60.0, notes: list[str] | None = None
) -> PipelineChoice | None:
    """The fastest heterogeneous pipeline the procurement allows over the offered types (`_offers`), with
    2..min(max_types, 3) groups (None: proven that none fits; TimeLimit: none found in the time limit);
    capex budgets and power caps are constraints of the solve, a rental budget is checked on the result
    (its cost follows the time to train), and so is the deadline (the fastest mix over it: none meets it).
    `notes`: where given, why there is no mix when the search was not made or its answer was dropped."""
    from optimizer.drivers.purchase import Group, purchase_of, sub_problem
    from optimizer.progress import progress
    from optimizer.schema.procure import Pricing

    pr = pp.procure
    chosen = _offers(pp, rows)
    if len(chosen) < 2:
        return None
    if pp.llm.moe is not None or pp.stack.value != "megatron-core":  # the family's plans (ZeRO-1, SP) are
        if notes is not None:  # Megatron-Core's, of dense models
            why = "an MoE model" if pp.llm.moe is not None else f"stack {pp.stack.value}"
            notes.append(
                f"pipelined mixes not searched: the family covers dense models on megatron-core, not {why}"
            )
        return None
    offers = [
        TypeOffer(
            r.node_type.name,
            sub_problem(pp, r.node_type, r.max_nodes),
            r.max_nodes,
            r.node_type.node_usd,
            r.node_type.power_kw,
            r.node_type.unit_nodes,
        )
        for r in chosen
    ]
    capex = pr.pricing == Pricing.CAPEX
    best, timed_out = None, None
    sizes = [g for g in (2, 3) if g <= min(pr.max_types, len(offers))]
    with progress("procure: pipelined mixes", sum(len(outer(offers, g)) for g in sizes)) as step:
        for G in sizes:
            try:
                sol = solve_pipeline_mix(
                    offers,
                    G,
                    pr.budget_usd if capex else None,
                    pr.power_kw,
                    pp.catalog.joining_network,
                    time_limit_s,
                    step,
                )
            except TimeLimit as e:
                sol, timed_out = None, e
            if sol is not None and (best is None or sol.result.step_time_s < best.result.step_time_s):
                best = sol
    if best is None and timed_out is not None:
        raise timed_out
    if best is None:
        return None
    if timed_out is not None:
        best.status = "feasible"  # a group count ran out of time: the best found, not proven
    by = {r.node_type.name: r.node_type for r in chosen}
    B = pp.training.global_batch
    groups = [
        Group(
            by[g.node_type], best.nodes[g.node_type], g.gpus(best.plan.dp), B, best.result.step_time_s, None
        )
        for g in best.plan.groups
    ]
    pur = purchase_of(pp, groups, best.result.step_time_s)
    if pr.budget_usd is not None and pur.cost_usd > pr.budget_usd * (1 + 1e-9):
        return None
    if _over_deadline(pp, best, pur, notes):
        return None
    reasons = _stage_reasons(pp, best)
    verdict = _verdict(pp, rows, best, pur)
    return PipelineChoice(best, pur, reasons, verdict, [r.node_type.name for r in chosen])


def _over_deadline(pp, best, pur, notes: list[str] | None) -> bool:
    """Does the mix's time to train (days) pass procure.deadline_days? (noted in `notes`)"""
    dl, days = pp.procure.deadline_days, pur.days_to_train
    if dl is None or days is None or days <= dl * (1 + 1e-9):
        return False
    if notes is not None:
        mix = ", ".join(f"{n} x {t}" for t, n in best.nodes.items() if n)
        notes.append(
            f"pipelined mix: the fastest ({mix}) needs {days:.3g} days, over the deadline of {dl:g} days"
        )
    return True


def _stage_reasons(pp, best) -> list[str]:
    """Per group, in pipeline order: its share of the layers and GPUs, and what bounds it: memory (its GPUs
    at least 90% full) or speed (its stage time, ms per micro-batch, against the slowest stage's)."""
    L = pp.llm.layers
    r = best.result
    slow = r.parts_s["slowest_stage"]
    reasons = []
    for g, stage, hbm, cap in zip(
        best.plan.groups, r.stage_time_s, r.hbm_bytes, r.capacity_bytes, strict=True
    ):
        share = (
            f"{g.stages * g.layers}/{L} layers ({g.stages} stage(s) x {g.layers}, tp {g.tp}, "
            f"{g.recompute.value} recompute) on {g.gpus(best.plan.dp)} GPUs"
        )
        use = f"memory {hbm / 2**30:.1f} of {cap / 2**30:.1f} GiB"
        if hbm >= 0.9 * cap:
            why = (
                f"memory: its GPUs are {100 * hbm / cap:.0f}% full ({use}); "
                f"stage {1e3 * stage:.1f} ms per micro-batch"
            )
        else:
            why = (
                f"speed: stage {1e3 * stage:.1f} ms per micro-batch against the slowest "
                f"{1e3 * slow:.1f} ms; {use}"
            )
        reasons.append(f"{g.node_type}: {share}: {why}")
    return reasons


def _verdict(pp, rows, best, pur) -> str:
    """The mix against the best single-type purchase (`rank_key`): why it wins, or the step-time parts (s)
    that make it lose; where no single type fits, the memory the pipeline pools."""
    from optimizer.drivers.purchase import rank_key

    r = best.result
    slow = r.parts_s["slowest_stage"]
    singles = [x.purchase for x in rows if x.purchase is not None]
    if not singles:
        verdict = (
            "no single node type trains the model within its limits (nothing fits); the pipeline pools the "
            "types' memory: " + " + ".join(f"{n} x {t}" for t, n in best.nodes.items())
        )
    else:
        s1 = min(singles, key=lambda p: rank_key(pp, p))
        gain = 100 * (s1.step_time_s - pur.step_time_s) / s1.step_time_s
        if rank_key(pp, pur) < rank_key(pp, s1):
            verdict = (
                f"beats the best single-type purchase ({s1.label()}, step {s1.step_time_s:.3f} s) by "
                f"{gain:.1f}% in step time"
            )
        else:
            p = r.parts_s
            verdict = (
                f"loses to the best single-type purchase ({s1.label()}, step {s1.step_time_s:.3f} s, "
                f"{-gain:.1f}% faster): the mix's slowest stage ({1e3 * slow:.1f} ms per micro-batch) "
                f"sets its steady state; pipeline {p['pipeline']:.3f} s, p2p {p['p2p']:.3f} s, "
                f"DP and optimizer {p['dp_optimizer']:.3f} s"
            )
    return verdict
