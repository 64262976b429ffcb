"""CP-SAT model of a multi-site purchase for a fixed number of sites k and a fixed synchronisation scheme
(`optimizer.drivers.multisite` branches on both, exactly), and the exhaustive oracle it is tested against.

Decisions: one option per site or none (`SiteRow`: nodes of one type and their proven-best plan's step),
exactly k sites; a ring through the used sites (`AddCircuit`, an unused site takes its self-loop); one link
option per pair of ring neighbours. With T the slowest used site's step, the ring's transfer term W_bw
(its slowest link's) and latency term W_lat (its longest hop's), all in integer microseconds:

    round R = H T + W_bw + W_lat           (sync: H = 1; diloco without overlap)
    R >= H T,  R >= W_bw + W_lat           (diloco with overlap)
    cost = sum of the chosen options' and links' prices  <= budget

Goal time: minimise R, then the cost at that R. Goal cost: R <= the deadline's round, minimise cost, then R.
Each link option's transfer and latency terms come from `optimizer.model.wan` for this k (`LinkRow`).

Pipeline stages across sites (`SitesTables.chain`): a path through the k used sites instead of a ring (a
circuit through a depot joined to every site), each chosen option's exchange J (`LinkRow.transfer_s`) for
one candidate plan of n_mb micro-batches whose exchanges inside a site take t (`Chain`):

    R = T + 2 n_mb P + 2 sum_j J_j - 2 (k - 1) t,   P >= J_j - t, P >= 0   (`optimizer.model.wan`)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ortools.sat.python import cp_model

from optimizer.errors import OutOfRange
from optimizer.model.wan import pipeline_wan_s, round_s

US = 1e6  # integer microseconds
MAX_INT = 2**62  # what CP-SAT's 64-bit sums may reach


@dataclass(frozen=True)
class SiteRow:
    """One way to equip a site: its step time (s) at its share of the batch and its price (USD); `units`:
    that share in batch units when the split is free (`SitesTables.batch_units`), else 0."""

    step_s: float
    cost_usd: float
    units: int = 0


@dataclass(frozen=True)
class LinkRow:
    """One option of one link for this k: transfer seconds of the ring on it, its latency term (s: the
    ring's latency term if this hop is the ring's longest) and its price (USD)."""

    transfer_s: float
    latency_term_s: float
    price_usd: float


@dataclass(frozen=True)
class Chain:
    """Pipeline stages across sites: the candidate plan's micro-batches per step and its exchange inside a
    site (s); the links' rows then hold one exchange each (`LinkRow.transfer_s`, latency included)."""

    n_mb: int
    p2p_s: float


@dataclass(frozen=True)
class SitesTables:
    """What one (k, scheme) model needs; `links[(i, j)]` with i < j."""

    k: int
    sites: list[list[SiteRow]]
    links: dict[tuple[int, int], list[LinkRow]]
    inner_steps: int = 1
    overlap: bool = False
    budget_usd: float | None = None
    max_round_s: float | None = None  # goal cost: the round that meets the deadline
    minimise_cost: bool = False
    batch_units: int | None = None  # a free split: the chosen sites' units sum to this
    chain: Chain | None = None  # pipeline stages across sites: a path, priced per exchange


@dataclass(frozen=True)
class SitesSolution:
    choice: dict[int, int]  # site -> option index (used sites only)
    ring: list[int]  # used sites in ring order
    link_choice: dict[tuple[int, int], int]  # ring pair (i < j) -> option index
    round_s: float
    cost_usd: float


def evaluate(
    t: SitesTables, choice: dict[int, int], ring: list[int], link_choice: dict
) -> tuple[float, float]:
    """(round s, cost USD) of a configuration, in the model's own floats (`optimizer.model.wan.round_s`)."""
    slow = max(t.sites[s][o].step_s for s, o in choice.items())
    rnd = round_s(slow, ring_wan_s(t, link_choice), t.inner_steps, t.overlap)
    rows = [t.links[p][o] for p, o in link_choice.items()]
    cost = sum(_usd(t.sites[s][o].cost_usd) for s, o in choice.items()) + sum(_usd(r.price_usd) for r in rows)
    return rnd, float(cost)


def ring_wan_s(t: SitesTables, link_choice: dict) -> float:
    """The ring's all-reduce time (s): the transfer on its slowest chosen link plus the latency term of its
    longest hop (a chain: what its exchanges add to the step)."""
    if t.chain is not None:
        joins = [t.links[p][o].transfer_s for p, o in link_choice.items()]
        return pipeline_wan_s(t.chain.n_mb, joins, t.chain.p2p_s)
    rows = [t.links[p][o] for p, o in link_choice.items()]
    return max((r.transfer_s for r in rows), default=0.0) + max((r.latency_term_s for r in rows), default=0.0)


def within_budget(t: SitesTables, cost_usd: float) -> bool:
    return t.budget_usd is None or cost_usd <= math.floor(t.budget_usd)


def chain_pairs(path: list[int]) -> list[tuple[int, int]]:
    """The neighbour pairs (i < j) of a path."""
    return sorted((min(a, b), max(a, b)) for a, b in zip(path, path[1:], strict=False))


def ring_pairs(ring: list[int]) -> list[tuple[int, int]]:
    """The distinct neighbour pairs (i < j) of a ring (k = 2: one pair; k = 1: none)."""
    if len(ring) < 2:
        return []
    return sorted({(min(a, b), max(a, b)) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)})


def _usd(x: float) -> int:
    """Whole dollars, rounded up (a budget is rounded down: `within_budget`)."""
    return math.ceil(x - 1e-6)


def _us(x: float) -> int:
    return int(round(x * US))


def _bounds(t: SitesTables) -> tuple[int, int]:
    """Upper bounds (us) of the slowest step and of the ring's terms, from the data; OutOfRange (bad input,
    exit 2) when the round or the bill could overflow CP-SAT's 64-bit sums."""
    top = max((_us(r.step_s) for rows in t.sites for r in rows), default=0)
    wan = max(
        (_us(r.transfer_s) + _us(r.latency_term_s) for rows in t.links.values() for r in rows), default=0
    )
    bill = sum(max((_usd(r.cost_usd) for r in rows), default=0) for rows in t.sites) + sum(
        max(_usd(r.price_usd) for r in rows) for rows in t.links.values()
    )
    if t.chain is not None:  # P and every J at most the slowest exchange; the sum over k - 1 links
        wan = (2 * t.chain.n_mb + 2 * max(t.k - 1, 0)) * wan
    if t.inner_steps * top + wan > MAX_INT or bill > MAX_INT:
        raise OutOfRange(
            "procure (sites): a round of inner steps and the all-reduce, or the bill, is beyond 2^62 "
            "microseconds or dollars: lower sync.inner_steps or the prices, or raise the link bandwidths"
        )
    return top, wan


def _build(t: SitesTables):
    top, wan_top = _bounds(t)
    m = cp_model.CpModel()
    x = {(s, o): m.NewBoolVar(f"site{s}_opt{o}") for s, rows in enumerate(t.sites) for o in range(len(rows))}
    used = [m.NewBoolVar(f"used{s}") for s in range(len(t.sites))]
    for s, rows in enumerate(t.sites):
        m.Add(sum(x[s, o] for o in range(len(rows))) == used[s])
    m.Add(sum(used) == t.k)
    if t.batch_units is not None:  # the sites' shares make up the whole batch
        m.Add(sum(t.sites[s][o].units * v for (s, o), v in x.items()) == t.batch_units)
    slow = m.NewIntVar(0, top, "slowest_step_us")
    for (s, o), v in x.items():
        m.Add(slow >= _us(t.sites[s][o].step_s)).OnlyEnforceIf(v)
    if t.chain is not None:
        y, wan = _define_chain(m, t, used, wan_top)
    else:
        y, wan = _define_ring(m, t, used, wan_top)
    rnd = m.NewIntVar(0, t.inner_steps * top + wan_top, "round_us")
    if t.overlap:
        m.Add(rnd >= t.inner_steps * slow)
        m.Add(rnd >= wan)
    else:
        m.Add(rnd == t.inner_steps * slow + wan)
    cost = sum(_usd(t.sites[s][o].cost_usd) * v for (s, o), v in x.items()) + sum(
        _usd(t.links[p][o].price_usd) * v for (p, o), v in y.items()
    )
    if t.budget_usd is not None:
        m.Add(cost <= math.floor(t.budget_usd))
    if t.max_round_s is not None:
        m.Add(rnd <= math.floor(t.max_round_s * US))
    return m, x, y, rnd, cost


def _define_links(m: cp_model.CpModel, t: SitesTables, arcs: list) -> dict:
    """Both arcs of every link (appended to `arcs`) and one option literal per link and option, exactly one of
    a link's options where either of its arcs is used: {((i, j), option): literal}."""
    y: dict = {}
    for (i, j), rows in t.links.items():
        a, b = m.NewBoolVar(f"arc{i}_{j}"), m.NewBoolVar(f"arc{j}_{i}")
        arcs += [(i, j, a), (j, i, b)]
        pair = m.NewBoolVar(f"pair{i}_{j}")
        m.AddMaxEquality(pair, [a, b])
        for o in range(len(rows)):
            y[(i, j), o] = m.NewBoolVar(f"link{i}_{j}_opt{o}")
        m.Add(sum(y[(i, j), o] for o in range(len(rows))) == pair)
    return y


def _define_ring(m: cp_model.CpModel, t: SitesTables, used, wan_top: int):
    """Arcs of the ring through the used sites, one link option per neighbour pair, and the ring's all-reduce
    time (us): the transfer on its slowest chosen link plus the latency term of its longest hop."""
    bw = m.NewIntVar(0, wan_top, "ring_transfer_us")
    lat = m.NewIntVar(0, wan_top, "ring_latency_us")
    y: dict = {}
    if t.k >= 2:
        arcs = [(s, s, used[s].Not()) for s in range(len(t.sites))]
        y = _define_links(m, t, arcs)
        for (p, o), v in y.items():
            m.Add(bw >= _us(t.links[p][o].transfer_s)).OnlyEnforceIf(v)
            m.Add(lat >= _us(t.links[p][o].latency_term_s)).OnlyEnforceIf(v)
        m.AddCircuit(arcs)
    wan = m.NewIntVar(0, 2 * wan_top, "wan_us")
    m.Add(wan == bw + lat)
    return y, wan


def _define_chain(m: cp_model.CpModel, t: SitesTables, used, wan_top: int):
    """Arcs of a path through the used sites (a circuit through a depot that starts and ends it), one link
    option per neighbour pair, and what the path's exchanges add to the step (us, `Chain`)."""
    depot = len(t.sites)
    arcs = [(s, s, used[s].Not()) for s in range(len(t.sites))]
    for s in range(len(t.sites)):
        arcs += [(depot, s, m.NewBoolVar(f"start{s}")), (s, depot, m.NewBoolVar(f"end{s}"))]
    y = _define_links(m, t, arcs)
    m.AddCircuit(arcs)
    tp2p = _us(t.chain.p2p_s)
    excess = m.NewIntVar(0, wan_top, "slowest_exchange_excess_us")
    for (p, o), v in y.items():
        m.Add(excess >= _us(t.links[p][o].transfer_s) - tp2p).OnlyEnforceIf(v)
    joins = sum(_us(t.links[p][o].transfer_s) * v for (p, o), v in y.items())
    wan = m.NewIntVar(-2 * max(t.k - 1, 0) * tp2p, wan_top, "chain_wan_us")
    m.Add(wan == 2 * t.chain.n_mb * excess + 2 * joins - 2 * (t.k - 1) * tp2p)
    return y, wan


def solve_cpsat(t: SitesTables, time_limit_s: float = 10.0) -> tuple[SitesSolution | None, str]:
    """The best configuration (None: infeasible, or nothing found in time) and the status: optimal (both
    stages proven), feasible (a limit cut a stage short: the first stage's answer is kept when the second
    finds nothing), infeasible or time_limit. Lexicographic: the goal's objective, then the other one at
    its optimum; two thirds of the time for the first stage, the rest (at least 50 ms) for the second."""
    m, x, y, rnd, cost = _build(t)
    if m.Validate():  # pragma: no cover - the bounds above keep every sum within int64
        raise OutOfRange(f"procure (sites): the model is not valid for CP-SAT: {m.Validate()}")
    first, second = (cost, rnd) if t.minimise_cost else (rnd, cost)
    m.Minimize(first)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = max(0.01, 2.0 * time_limit_s / 3.0)
    st = solver.Solve(m)
    if st == cp_model.INFEASIBLE:
        return None, "infeasible"
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, "time_limit"
    lits = list(x.values()) + list(y.values())
    keep = {v.Index(): solver.Value(v) for v in lits}
    proven = st == cp_model.OPTIMAL
    m.Add(first <= solver.Value(first))  # exact integers (ObjectiveValue is a float)
    m.Minimize(second)
    for v in lits:
        m.AddHint(v, keep[v.Index()])
    solver.parameters.max_time_in_seconds = max(0.05, time_limit_s / 3.0)
    st2 = solver.Solve(m)
    if st2 in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        keep = {v.Index(): solver.Value(v) for v in lits}
    proven = proven and st2 == cp_model.OPTIMAL
    choice = {s: o for (s, o), v in x.items() if keep[v.Index()]}
    link_choice = {p: o for (p, o), v in y.items() if keep[v.Index()]}
    ring = _chain_order(choice, link_choice) if t.chain is not None else _ring_order(choice, link_choice)
    r, c = evaluate(t, choice, ring, link_choice)
    return SitesSolution(choice, ring, link_choice, r, c), "optimal" if proven else "feasible"


def _ring_order(choice: dict[int, int], link_choice: dict) -> list[int]:
    sites = sorted(choice)
    if len(sites) < 3:
        return sites
    nbr: dict[int, list[int]] = {s: [] for s in sites}
    for i, j in link_choice:
        nbr[i].append(j)
        nbr[j].append(i)
    ring = [sites[0]]
    while len(ring) < len(sites):
        nxt = [n for n in nbr[ring[-1]] if n not in ring]
        ring.append(nxt[0])
    return ring


def _chain_order(choice: dict[int, int], link_choice: dict) -> list[int]:
    """The used sites in path order, from an end."""
    nbr: dict[int, list[int]] = {s: [] for s in choice}
    for i, j in link_choice:
        nbr[i].append(j)
        nbr[j].append(i)
    path = [min(s for s in choice if len(nbr[s]) <= 1)]
    while len(path) < len(choice):
        path.append(next(n for n in nbr[path[-1]] if n not in path))
    return path


def solve_exhaustive(t: SitesTables) -> SitesSolution | None:
    """The oracle: every set of k sites, option per site, ring order and link option per hop (small
    instances only). Same lexicographic order as `solve_cpsat`."""
    best, best_key = None, None
    for group in itertools.combinations(range(len(t.sites)), t.k):
        if t.chain is not None:
            orders = [list(p) for p in itertools.permutations(group) if p[0] <= p[-1]]
        else:
            orders = [list(group)] if t.k < 3 else [[group[0], *p] for p in itertools.permutations(group[1:])]
        for ring in orders:
            pairs = chain_pairs(ring) if t.chain is not None else ring_pairs(ring)
            if any(p not in t.links for p in pairs):
                continue
            for opts in itertools.product(*[range(len(t.sites[s])) for s in ring]):
                choice = dict(zip(ring, opts, strict=True))
                if (
                    t.batch_units is not None
                    and sum(t.sites[s][o].units for s, o in choice.items()) != t.batch_units
                ):
                    continue
                for lopts in itertools.product(*[range(len(t.links[p])) for p in pairs]):
                    lc = dict(zip(pairs, lopts, strict=True))
                    r, c = evaluate(t, choice, ring, lc)
                    if not within_budget(t, c):
                        continue
                    if t.max_round_s is not None and _us(r) > math.floor(t.max_round_s * US):
                        continue
                    key = (round(c), round(r * US)) if t.minimise_cost else (round(r * US), round(c))
                    if best_key is None or key < best_key:
                        best, best_key = SitesSolution(choice, ring, lc, r, c), key
    return best
