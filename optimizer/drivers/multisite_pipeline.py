"""Pipeline stages across sites (`sync.schemes: [pipeline]`): one pipeline whose stages are split over k
sites in a chain, so that only activations and their gradients cross the WAN, never the gradients of the
weights.

The family: every used site holds pp / k consecutive stages of every data-parallel replica (the same node
type and layout at each site, 1F1B without interleaving or uneven splits, so that a stage never straddles
two sites), and each site's nodes are those of its stages; the data-parallel gradient reduction stays
inside each site. The step is the homogeneous model's step of the whole job (`optimizer.model.step`) plus
what the WAN exchanges add (`optimizer.model.wan.pipeline_wan_s`), whose exchange carries every replica's
micro-batch over the chosen link.

Stages: prepare (`candidates`: every plan of the family on k x the site's nodes, enumerated exhaustively by
the vectorised model and kept per (micro-batches, exchange time inside a site) on the front of nodes per
site against step time) -> build and solve (per candidate, lowest bound first, `formulations.multisite`
with a `Chain`: which k sites, the path through them and the option of each link, by CP-SAT; a candidate
whose bound cannot beat the incumbent is passed over) -> extract (the plan re-evaluated and verified by
`optimizer.drivers.solve`) -> verify (`verify_pipeline`: the step and the exchanges re-priced from the
plan and the links). Exhaustive over the family and exact per candidate, so the answer is proven optimal
within the family.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from formulations.enumerate import pieces
from formulations.multisite import Chain, LinkRow, SiteRow, SitesTables, solve_cpsat
from optimizer.drivers.purchase import Group, sub_problem
from optimizer.errors import TimeLimit, VerificationError
from optimizer.model import wan
from optimizer.model.capacity import feasible
from optimizer.model.step import evaluate, make_ctx
from optimizer.rules.layout import axis_values
from optimizer.schema import Problem
from optimizer.schema.multisite import MultisiteProblem, SitesGoal
from optimizer.schema.procure import NodeType, ProcureProblem

Limits = dict[str, dict[str, int]]  # site -> node type -> the most nodes it can hold (whole units)

ACT_BYTES = 2  # bytes per activation element exchanged between stages (16-bit, as Megatron-Core sends them)


@dataclass(frozen=True)
class PipeCandidate:
    """One plan of the family: nodes of one type at each of the k sites, its step before the WAN, and what
    its exchanges need."""

    node_type: NodeType
    problem: Problem  # the family's solve problem it belongs to (`family_problem`)
    knobs: object  # optimizer.model.knobs.Knobs of one candidate
    step_s: float  # the homogeneous model's step of the whole job (every exchange inside a site)
    n_mb: int  # micro-batches per step
    p2p_s: float  # one exchange inside a site
    exchange_bytes: float  # one exchange across a WAN link: every replica's micro-batch
    site_nodes: int  # nodes bought at each site (whole units)
    gpus: int  # GPUs the whole pipeline uses


def family_problem(pp: ProcureProblem, t: NodeType, k: int, nodes: int) -> Problem | None:
    """The solve problem of the family on k sites of at most `nodes` nodes each (`pp`: the sites' problem
    as one procurement): the whole job on k x nodes (idle GPUs allowed), pp a multiple of k, no
    interleaving or uneven split, 1F1B; None when no pp is."""
    from optimizer.prepare.space import restrict_values
    from optimizer.schema.problem import Search

    q = sub_problem(pp, t, k * nodes, pp.training.global_batch)
    pps = [x for x in axis_values(q, "pp") if x % k == 0]
    rules = q.search_rules()  # the file's search, narrowed to what the stack offers
    if (
        not pps
        or not restrict_values(["1f1b"], rules.get("schedule"))
        or not restrict_values([1], rules.get("vpp"))
    ):
        return None
    base = q.search.model_dump(exclude_none=True) if q.search is not None else {}
    search = base | {"pp": pps, "vpp": 1, "pp_uneven": False, "schedule": "1f1b"}
    return q.model_copy(update={"search": Search(**search)})


def candidates(pp: ProcureProblem, t: NodeType, k: int, nodes: int, deadline: float) -> list[PipeCandidate]:
    """Every plan of the family that fits, kept per (micro-batches, exchange inside a site) on the front of
    nodes per site against step time (what decides the WAN's price and the sites that can hold it); the
    search space is walked whole, or TimeLimit."""
    q = family_problem(pp, t, k, nodes)
    if q is None:
        return []
    ctx = make_ctx(q)
    S, h = q.seq_len, q.llm.hidden
    g = t.gpus_per_node
    best: dict[tuple[int, int, int, int], tuple[float, object, float]] = {}
    for kn in pieces(q, 250_000):
        if time.time() > deadline:
            raise TimeLimit("procure (sites): the time limit passed while enumerating pipelines across sites")
        r = evaluate(q, kn, ctx)
        ok = feasible(q, kn, r) & (kn.pp % k == 0) & (kn.pp >= k)
        if not ok.any():
            continue
        idx = np.flatnonzero(ok)
        n_mb = np.broadcast_to(r.n_mb, ok.shape)[idx].astype(np.int64)
        t_p2p = inside_exchange_s(np.broadcast_to(r.pp_link, ok.shape)[idx], n_mb)
        gpus = (np.broadcast_to(kn.tp * kn.pp * kn.dp * kn.cp, ok.shape))[idx]
        site_nodes = t.bought(-(-(gpus // k) // g))
        step = r.step_time[idx]
        copies = np.broadcast_to(copies_sent(kn.tp, kn.sequence_parallel, kn.pp_rs_ag), ok.shape)[idx]
        us = np.rint(t_p2p * 1e6).astype(np.int64)
        order = np.lexsort((step, site_nodes, us, copies, n_mb))
        for i in order.tolist():
            key = (int(n_mb[i]), int(copies[i]), int(us[i]), int(site_nodes[i]))
            if key not in best or step[i] < best[key][0]:
                best[key] = (float(step[i]), (kn, int(idx[i])), float(t_p2p[i]))
    out = []
    for (n_mb, copies, _, site_nodes), (step, (kn, i), t_p2p) in best.items():
        one = kn.take(np.array([i]))
        gpus = int(np.asarray(one.tp * one.pp * one.dp * one.cp).ravel()[0])
        nbytes = exchange_bytes(pp.training.global_batch, n_mb, S, h, copies)
        out.append(PipeCandidate(t, q, one, step, n_mb, t_p2p, nbytes, site_nodes, gpus))
    return _front(out)


def inside_exchange_s(pp_link_s, n_mb):
    """One pipeline exchange inside a site (s) from the step model's `pp_link` (2 n_mb vpp t_p2p, vpp 1 in
    this family)."""
    return pp_link_s / (2.0 * n_mb)


def copies_sent(tp, sequence_parallel, pp_rs_ag):
    """Copies of each activation a stage boundary sends (integers or arrays): one, split over the tp ranks,
    with sequence parallelism or scatter-gather; else each of the tp ranks sends the whole activation (as
    `optimizer.model.step._p2p_time` prices it)."""
    return np.where((np.asarray(sequence_parallel) > 0) | (np.asarray(pp_rs_ag) > 0), 1, np.asarray(tp))


def exchange_bytes(global_batch: int, n_mb: int, seq_len: int, hidden: int, copies: int) -> float:
    """One exchange across a WAN link: every replica's micro-batch (B / n_mb sequences) of 16-bit
    activations, `copies` times (`copies_sent`)."""
    return float(global_batch // n_mb) * seq_len * hidden * ACT_BYTES * copies


def _front(cands: list[PipeCandidate]) -> list[PipeCandidate]:
    """Per (type, micro-batches, bytes exchanged, exchange inside a site): the candidates no other one beats
    with as few nodes per site and a step as short."""
    out = []
    groups: dict = {}
    for c in cands:
        groups.setdefault((c.node_type.name, c.n_mb, c.exchange_bytes, round(c.p2p_s * 1e6)), []).append(c)
    for rows in groups.values():
        top = math.inf
        for c in sorted(rows, key=lambda c: (c.site_nodes, c.step_s)):
            if c.step_s < top:
                out.append(c)
                top = c.step_s
    return out


def chain_tables(
    mp: MultisiteProblem, limits: Limits, k: int, c: PipeCandidate, max_round_s: float | None
) -> SitesTables:
    """The CP-SAT tables of one candidate: a site can hold it when it hosts the type with enough nodes under
    its cap (`limits`); each link option's row is one exchange of the candidate's bytes."""
    rows = []
    for site in mp.sites:
        ok = limits[site.name].get(c.node_type.name, 0) >= c.site_nodes
        rows.append([SiteRow(c.step_s, c.site_nodes * c.node_type.node_usd)] if ok else [])
    links = {pair: [LinkRow(j, 0.0, usd) for j, usd in opts] for pair, opts in link_exchanges(mp, c).items()}
    return SitesTables(
        k=k,
        sites=rows,
        links=links,
        budget_usd=mp.procure.budget_usd,
        max_round_s=max_round_s,
        minimise_cost=mp.procure.goal == SitesGoal.COST,
        chain=Chain(c.n_mb, c.p2p_s),
    )


def link_exchanges(
    mp: MultisiteProblem, c: PipeCandidate
) -> dict[tuple[int, int], list[tuple[float, float]]]:
    """Per link (site indices i < j), each option's (one exchange of the candidate over it, s; its price,
    USD), by `optimizer.model.wan`."""
    index = {s.name: i for i, s in enumerate(mp.sites)}
    out = {}
    for ln in mp.links:
        pair = tuple(sorted(index[x] for x in ln.sites))
        out[pair] = [
            (
                wan.exchange_s(
                    c.exchange_bytes,
                    o.bandwidth_gbps,
                    wan.latency_s(o.latency_ms, ln.distance_km),
                    mp.sync.link_efficiency,
                ),
                o.price_usd,
            )
            for o in ln.options
        ]
    return out


def lower_bound(mp: MultisiteProblem, k: int, c: PipeCandidate) -> tuple[float, float]:
    """(round s, cost USD) no configuration of the candidate beats: its step with the fastest exchange on
    every one of the k - 1 links, and its nodes at k sites with free links."""
    fastest = min((j for opts in link_exchanges(mp, c).values() for j, _ in opts), default=math.inf)
    round_s = c.step_s + wan.pipeline_wan_s(c.n_mb, [fastest] * (k - 1), c.p2p_s)
    return round_s, k * c.site_nodes * c.node_type.node_usd


def group_of(c: PipeCandidate, k: int, batch: int) -> Group:
    """The candidate as one site's group: its share of the GPUs, the whole job's plan (re-evaluated and
    verified by the model, `optimizer.drivers.solve._plans`)."""
    from dataclasses import replace

    from optimizer.drivers.solve import _plans

    plan = _plans(c.problem, [c.knobs], [c.step_s])[0]
    ev = plan.evaluation
    whole = ev.problem.model_copy(update={"num_gpus": k * c.site_nodes * c.node_type.gpus_per_node})
    plan = replace(plan, evaluation=replace(ev, problem=whole))
    return Group(c.node_type, c.site_nodes, c.gpus // k, batch, c.step_s, plan)


def pipeline_candidates(pp: ProcureProblem, limits: Limits, k: int, deadline: float) -> list[PipeCandidate]:
    """Every node type's candidates for k sites (each at the most nodes any site hosting it can hold)."""
    out = []
    for t in pp.catalog.node_types:
        held = [lim[t.name] for lim in limits.values() if t.name in lim]
        n = max(held, default=0)
        if n < 1 or sum(1 for x in held if x > 0) < k:
            continue
        out += candidates(pp, t, k, n, deadline)
    return out


def verify_pipeline(mp: MultisiteProblem, p) -> None:
    """Re-price a pipeline configuration from its plan and its links: the step from the plan's evaluation,
    each link's exchange by `optimizer.model.wan`; the round agrees with the solver's within 0.1% (or its
    microsecond rounding), or VerificationError (exit 5)."""
    ev = p.sites[0].group.plan.evaluation
    r = ev.result
    n_mb = int(r["n_mb"])
    t_p2p = inside_exchange_s(r["pp_link"], n_mb)
    ex = ev.execution
    copies = int(copies_sent(ex.tp, int(ex.sequence_parallel), int(ex.pp_rs_ag)))
    S = mp.training.seq_len or mp.llm.seq_len
    nbytes = exchange_bytes(mp.training.global_batch, n_mb, S, mp.llm.hidden, copies)
    joins = [
        wan.exchange_s(nbytes, c.option.bandwidth_gbps, c.latency_s, mp.sync.link_efficiency) for c in p.links
    ]
    rnd = r["step_time"] + wan.pipeline_wan_s(n_mb, joins, t_p2p)
    if abs(rnd - p.round_s) > 1e-3 * rnd + 2e-6 * (2 * n_mb + 2 * len(joins) + 1):
        raise VerificationError(
            f"procure (sites, pipeline): the solver's round {p.round_s:.6g} s and the model's {rnd:.6g} s "
            "disagree"
        )


def solve_chain(
    mp: MultisiteProblem, pp: ProcureProblem, limits: Limits, k: int, steps: float, deadline: float
):
    """The best configuration of pipeline stages across k sites for the problem's goal, as (candidate, its
    tables, the CP-SAT solution) or None when none fits or meets the deadline; its status; and its row of
    the considered table. `steps`: steps to train. Candidates in order of their bound, each solved by
    CP-SAT for its sites, path and links, until no bound can beat the incumbent."""
    row = {"sites": k, "scheme": "pipeline", "inner_steps": 1, "tokens_multiplier": 1.0}
    cost_goal = mp.procure.goal == SitesGoal.COST
    max_round = mp.procure.deadline_days * 86400.0 / steps if cost_goal else None
    cands = pipeline_candidates(pp, limits, k, deadline)
    bounds = {id(c): lower_bound(mp, k, c) for c in cands}
    pick = (lambda b: (b[1], b[0])) if cost_goal else (lambda b: b)
    cands.sort(key=lambda c: pick(bounds[id(c)]))
    best, best_key, status, solved = None, None, "optimal", 0
    for c in cands:
        if best_key is not None and pick(bounds[id(c)])[0] > best_key[0]:
            break  # sorted by bound: none of the rest can win
        if max_round is not None and bounds[id(c)][0] > max_round:
            continue
        if mp.procure.budget_usd is not None and bounds[id(c)][1] > mp.procure.budget_usd:
            continue
        left = deadline - time.time()
        if left <= 0:
            status = "feasible"
            break
        tables = chain_tables(mp, limits, k, c, max_round)
        sol, st = solve_cpsat(tables, max(0.05, left))
        solved += 1
        if st in ("feasible", "time_limit"):
            status = "feasible"
        if sol is None:
            continue
        key = (sol.cost_usd, sol.round_s) if cost_goal else (sol.round_s, sol.cost_usd)
        if best_key is None or key < best_key:
            best, best_key = (c, tables, sol), key
    row["status"] = "infeasible" if best is None and status == "optimal" else status
    row["candidates"] = len(cands)
    row["chains_solved"] = solved
    if best is None and status == "optimal":
        row["why"] = (
            f"no plan with pp a multiple of {k} fits on {k} sites' nodes"
            if not cands
            else f"{len(cands)} plans fit, but no path of links through {k} sites that hold one "
            "meets the budget or the deadline"
        )
    return best, status, row
