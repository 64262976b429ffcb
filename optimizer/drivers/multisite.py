"""`paraplan procure` on a file with `sites`: the sites, nodes per site, WAN links, synchronisation scheme
and the plan inside each site, chosen together under each site's power cap and the budget.

Stages: load (`optimizer.io.loader.load_multisite`) -> prepare (`site_options`: per number of sites k, each
site's offers: nodes of a type up to its power cap, availability and budget, each with the proven-best plan
for B / k sequences per step from `optimizer.drivers.purchase.best_of_type`) -> build and solve (per k and
scheme, `formulations.multisite`: which sites, which option at each, the ring and its links, by CP-SAT)
-> rank across (k, scheme) by the goal -> verify (the WAN and round re-evaluated by `optimizer.model.wan`)
-> report (`optimizer.report.multisite`). Branching on k and on the scheme is exact, so the best is a
proven optimum of the whole problem; the one-site optimum is reported beside it as the verdict.

Modelled: every used site trains an equal share B / k of the global batch (a data-parallel replica group
each), or with `sync.batch_units` U a whole number of B / U chosen per site (`shares`); nodes are bought
(price_usd + extra_usd) and links priced for the run; energy is reported at the nodes' power (catalog
power_kw, else the system's rating) x PUE, not minimised; failures price the job as one over every site
(`plan_goodput`). Pipeline stages across sites (scheme pipeline) are the family of
`optimizer.drivers.multisite_pipeline`, solved per k beside the other schemes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from formulations.multisite import LinkRow, SiteRow, SitesSolution, SitesTables, ring_wan_s, solve_cpsat
from optimizer.drivers.evaluate import sourced_field_error
from optimizer.drivers.purchase import Group, TablesCache, best_of_type
from optimizer.errors import Infeasible, TimeLimit, VerificationError
from optimizer.model import wan
from optimizer.model.params import count
from optimizer.progress import progress
from optimizer.schema.common import MAX_COUNT
from optimizer.schema.multisite import LinkOption, MultisiteProblem, Scheme, Site, SitesGoal
from optimizer.schema.procure import NodeType, Procure, ProcureGoal, ProcureProblem


@dataclass(frozen=True)
class SiteOffer:
    """Nodes of one type at one site and the proven-best plan they run for the site's share of the batch."""

    site: Site
    node_type: NodeType
    nodes: int
    group: Group
    units: int = 0  # its share of the batch in `sync.batch_units` (0: an equal share)

    @property
    def step_time_s(self) -> float:
        return self.group.step_time_s

    @property
    def cost_usd(self) -> float:
        return self.nodes * self.node_type.node_usd

    @property
    def power_mw(self) -> float:
        """Facility power: nodes x node power x PUE, MW."""
        return self.nodes * node_kw(self.node_type) * self.site.pue / 1e3


@dataclass(frozen=True)
class LinkChoice:
    sites: tuple[str, str]
    option: LinkOption
    latency_s: float


@dataclass
class SitesPlan:
    """One configuration: the sites used, the ring's links, the scheme and what it takes to train."""

    scheme: str  # single-site | sync | diloco
    inner_steps: int
    overlap: bool
    sites: list[SiteOffer]  # in ring order
    links: list[LinkChoice]
    slowest_step_s: float
    wan_s: float  # one all-reduce across sites (per step for sync, per H steps for diloco)
    round_s: float  # H steps and the all-reduce (sync: one step)
    tokens_multiplier: float
    days_to_train: float
    nodes_usd: float
    links_usd: float
    energy_mwh: float
    energy_usd: float
    status: str = "optimal"
    goodput: object = None  # optimizer.model.goodput.PlanGoodput: the whole job's expected time and cost
    never_finishes: str | None = None  # why, when interruptions come faster than the job restarts

    @property
    def expected_days(self) -> float:
        """Expected days to train with failures (`goodput`; infinite when the job never finishes), else the
        failure-free days."""
        if self.never_finishes:
            return math.inf
        return self.days_to_train if self.goodput is None else self.goodput.expected_time_to_train_s / 86400

    @property
    def k(self) -> int:
        return len(self.sites)

    @property
    def cost_usd(self) -> float:
        """What the goal cost minimises: nodes and links (energy is reported beside it)."""
        return self.nodes_usd + self.links_usd

    @property
    def compute_utilisation(self) -> float:
        """Share of the wall time spent computing (INTELLECT-1's 'compute utilisation')."""
        return self.inner_steps * self.slowest_step_s / self.round_s if self.round_s > 0 else 1.0

    def label(self) -> str:
        if self.scheme == "single-site":
            return "one site"
        extra = f", H = {self.inner_steps}" + (", overlapped" if self.overlap else "")
        return f"{self.k} sites, {self.scheme}" + (extra if self.scheme == "diloco" else "")


@dataclass
class MultisiteResult:
    problem: MultisiteProblem
    best: SitesPlan | None
    single_site: SitesPlan | None  # the best one-site configuration (the verdict's reference)
    considered: list[dict]  # one row per (k, scheme, H): its status and, when solved, days and cost
    seconds: float
    status: str
    notes: list[str] = field(default_factory=list)
    searched_one_site: bool = True
    pareto: list[SitesPlan] = field(default_factory=list)  # `pareto_front`: cost against days, cheapest last

    def verdict(self) -> str:
        b, s = self.best, self.single_site
        if b is None:
            return "nothing fits"
        if s is None:
            if not self.searched_one_site:
                return f"{b.label()} (one site not searched: sync.min_sites or sync.site_counts)"
            within = " within the deadline" if self.problem.procure.goal == SitesGoal.COST else ""
            return f"{b.label()}: no single site can train it{within}"
        if b is s or b.k == 1:
            return f"one site wins: {b.sites[0].site.name}"
        if self.problem.procure.goal == SitesGoal.COST:
            return f"{b.label()} is ${s.cost_usd - b.cost_usd:,.0f} cheaper than the best single site"
        if self.problem.goodput is not None:  # ranked by expected days: say them
            bd, sd, what = b.expected_days, s.expected_days, " expected"
        else:
            bd, sd, what = b.days_to_train, s.days_to_train, ""
        if not math.isfinite(sd):
            return f"{b.label()} trains in {bd:.1f}{what} days; the best single site never finishes"
        return (
            f"{b.label()} trains in {bd:.1f}{what} days, {sd / bd:.2f}x faster than the best single site "
            f"({sd:.1f}{what} days)"
        )


def node_kw(t: NodeType) -> float:
    """Power one node of the type draws, kW: the catalog's power_kw, else its system's nameplate."""
    return t.power_kw if t.power_kw is not None else t.system.node_power_w / 1e3


def site_limit(mp: MultisiteProblem, site: Site, t: NodeType) -> tuple[int, str]:
    """The most nodes of type t the site can hold (whole units), and what binds: power, availability,
    budget or the largest modelled count."""
    avail = site.node_types[t.name] if site.node_types[t.name] is not None else t.max_nodes
    lim = [
        (int(math.floor(site.power_mw * 1e3 / (node_kw(t) * site.pue) + 1e-9)), "power"),
        (MAX_COUNT // t.gpus_per_node, "the largest GPU count modelled"),
    ]
    if avail is not None:
        lim.append((avail, "availability"))
    if mp.procure.budget_usd is not None:
        lim.append((int(math.floor(mp.procure.budget_usd / t.node_usd + 1e-9)), "budget"))
    n, why = min(lim, key=lambda x: x[0])
    return n // t.unit_nodes * t.unit_nodes, why


def proxy(mp: MultisiteProblem) -> ProcureProblem:
    """The single-site procurement each site's plan is solved through (`best_of_type`)."""
    pp = ProcureProblem(
        name=mp.name or "sites",
        llm=mp.llm,
        catalog=mp.catalog,
        training=mp.training,
        procure=Procure(goal=ProcureGoal.THROUGHPUT),
        search=mp.search,
        stack=mp.stack,
        options=mp.options,
    )
    pp._source = mp._source
    return pp


class OfferCache:
    """Proven-best groups per (node type, batch), reused across node limits: the best group with at most n
    nodes that uses n' <= m nodes is also the best with at most m nodes for n' <= m <= n (a smaller space
    that still holds it), and nothing fits at m if nothing fits at n >= m. Only proven groups are reused;
    one a time limit cut short (status feasible) is kept for its own limit and marks the answer feasible."""

    def __init__(self, mp: MultisiteProblem, deadline: float):
        self.pp, self.deadline = proxy(mp), deadline
        self.tables = TablesCache(max_entries=4)
        self.done: dict[tuple[str, int], list[tuple[int, Group | None, bool]]] = {}
        self.solves = 0
        self.unproven = 0  # site plans a time limit cut short

    def best(self, t: NodeType, nodes: int, batch: int) -> Group | None:
        seen = self.done.setdefault((t.name, batch), [])
        for limit, g, proven in seen:
            if limit == nodes or (proven and limit >= nodes and (g is None or g.nodes <= nodes)):
                return g
        left = self.deadline - time.time()
        if left <= 0:
            raise TimeLimit("procure (sites): the time limit passed while solving the sites' plans")
        g, _, status = best_of_type(
            self.pp, t, nodes, global_batch=batch, time_limit_s=left, cache=self.tables
        )
        self.solves += 1
        proven = status in ("optimal", "infeasible")
        self.unproven += not proven
        seen.append((nodes, g, proven))
        return g


MAX_FRONT = 12  # purchases per node type and site on the nodes-against-step front (goal cost, a budget)


def front(mp: MultisiteProblem, t: NodeType, n: int, batch: int, cache: OfferCache) -> tuple[list, bool]:
    """The proven-best groups of type t on at most n nodes, then on fewer nodes than each found uses, until
    nothing fits: every point of the nodes-against-step-time front, the fastest first. Only the first
    without a budget and with goal time (the fastest is all that can win). (groups, complete): complete is
    false when MAX_FRONT cut the walk short."""
    out: list[Group] = []
    while n > 0:
        g = cache.best(t, n, batch)
        if g is None:
            return out, True
        out.append(g)
        if mp.procure.goal == SitesGoal.TIME_TO_TRAIN and mp.procure.budget_usd is None:
            return out, True
        if len(out) == MAX_FRONT:
            return out, g.nodes <= t.unit_nodes  # cut short only if smaller purchases remained
        n = (g.nodes - 1) // t.unit_nodes * t.unit_nodes
    return out, True


def shares(mp: MultisiteProblem, k: int) -> list[tuple[int, int]]:
    """(units, sequences per step) a site may train with k sites used: B / k each (units 0), or with
    `sync.batch_units` U every whole number of units from 1 to U - k + 1 (the others need one each)."""
    B, U = mp.training.global_batch, mp.sync.batch_units
    if U is None:
        return [(0, B // k)]
    if k == 1:
        return [(U, B)]
    return [(u, B * u // U) for u in range(1, U - k + 2)]


def site_options(mp: MultisiteProblem, k: int, cache: OfferCache) -> tuple[list[list[SiteOffer]], list[str]]:
    """Each site's offers for k sites used, at every share of the batch it may train (`shares`), and notes
    where a front was cut short."""
    types = {t.name: t for t in mp.catalog.node_types}
    out, notes = [], []
    for site in mp.sites:
        offers: dict[tuple[str, int, int], SiteOffer] = {}
        for name in site.node_types:
            t = types[name]
            n, _ = site_limit(mp, site, t)
            for units, batch in shares(mp, k):
                groups, complete = front(mp, t, n, batch, cache)
                for g in groups:
                    offers[(name, g.nodes, units)] = SiteOffer(site, t, g.nodes, g, units)
                if not complete:
                    notes.append(
                        f"{k} sites: {site.name}'s {name} purchases for {batch} sequences below "
                        f"{groups[-1].nodes} nodes not searched (the {MAX_FRONT} fastest kept): not a proof"
                    )
        out.append(list(offers.values()))
    return out, notes


def outer_bytes(mp: MultisiteProblem, scheme: Scheme) -> float:
    """Bytes all-reduced across sites per round: every parameter's gradient (sync) or pseudo-gradient."""
    per = mp.sync.gradient_bytes_per_param if scheme == Scheme.SYNC else mp.sync.outer_bytes_per_param
    return count(mp.llm).total * per


def link_rows(mp: MultisiteProblem, k: int, nbytes: float) -> dict[tuple[int, int], list[LinkRow]]:
    """Each link's options as the k-site ring's transfer and latency terms on it."""
    index = {s.name: i for i, s in enumerate(mp.sites)}
    out = {}
    for ln in mp.links:
        i, j = sorted(index[x] for x in ln.sites)
        rows = []
        for o in ln.options:
            transfer, per_latency = wan.ring_terms_s(
                nbytes, k, o.bandwidth_gbps, mp.sync.bidirectional_ring, mp.sync.link_efficiency
            )
            rows.append(
                LinkRow(transfer, per_latency * wan.latency_s(o.latency_ms, ln.distance_km), o.price_usd)
            )
        out[(i, j)] = rows
    return out


def variants(mp: MultisiteProblem, k: int) -> list[tuple[Scheme | None, int, bool]]:
    """(scheme, H, overlap) searched with k sites; one site has no WAN: (None, 1, False)."""
    if k == 1:
        return [(None, 1, False)]
    out: list[tuple[Scheme | None, int, bool]] = []
    if not splits_batch(mp, k):
        return [(Scheme.PIPELINE, 1, False)] if Scheme.PIPELINE in mp.sync.schemes else []
    if Scheme.SYNC in mp.sync.schemes:
        out.append((Scheme.SYNC, 1, False))
    if Scheme.DILOCO in mp.sync.schemes:
        out += [(Scheme.DILOCO, h, mp.sync.overlap) for h in mp.sync.inner_steps]
    if Scheme.PIPELINE in mp.sync.schemes:
        out.append((Scheme.PIPELINE, 1, False))
    return out


def multiplier(mp: MultisiteProblem, k: int, scheme: Scheme | None) -> float:
    """Tokens to train relative to data parallelism (DiLoCo across k replicas; 1 otherwise)."""
    if scheme != Scheme.DILOCO:
        return 1.0
    given = mp.sync.tokens_multiplier
    if given is not None and k in given:
        return given[k]
    return wan.diloco_tokens_multiplier(count(mp.llm).total, mp.training.tokens, k)


def steps_to_train(mp: MultisiteProblem) -> float:
    seq = mp.training.seq_len or mp.llm.seq_len
    return mp.training.tokens / (mp.training.global_batch * seq)


# ------------------------------------------------------------------------------------------- solve
def multisite(
    mp: MultisiteProblem, time_limit_s: float = 60.0, cache: OfferCache | None = None
) -> MultisiteResult:
    """The best configuration of the problem's goal over every number of sites and scheme: proven when the
    status is optimal (a time limit that cuts a site plan or a model short makes it feasible, and a count
    of sites it leaves unsolved is noted). `cache`: the site plans of an earlier call on a problem with the
    same llm, catalog, training, stack, search and options (studies that vary only links or sync)."""
    t0 = time.perf_counter()
    deadline = time.time() + time_limit_s
    if cache is None:
        cache = OfferCache(mp, deadline)
    cache.deadline = deadline
    ks, notes = site_counts(mp)
    plans: list[SitesPlan] = []
    rows: list[dict] = []
    status = "optimal"
    with progress("procure: sites", len(ks)) as step:
        for k in ks:
            try:
                shared = any(v[0] != Scheme.PIPELINE for v in variants(mp, k))
                offers, cut = site_options(mp, k, cache) if shared else ([], [])
            except TimeLimit:
                notes.append(f"{k} sites not solved: the time limit passed while solving their plans")
                status = "feasible"
                continue
            notes += cut
            status = "feasible" if cut else status
            for scheme, h, overlap in variants(mp, k):
                try:
                    plan, row = _solve_variant(mp, k, offers, scheme, h, overlap, deadline)
                except TimeLimit:  # the pipeline's enumeration: the other configurations stand
                    notes.append(f"{k} sites, {scheme.value}: the time limit passed before it was searched")
                    status = "feasible"
                    continue
                rows.append(row)
                status = "feasible" if row["status"] in ("feasible", "time_limit") else status
                if plan is not None:
                    plans.append(plan)
            step()
    status = "feasible" if cache.unproven else status
    best = min(plans, key=lambda p: rank_key(mp, p), default=None)
    single = min((p for p in plans if p.k == 1), key=lambda p: rank_key(mp, p), default=None)
    if best is None:
        if status != "optimal":
            raise TimeLimit(f"procure (sites): the time limit ({time_limit_s:g} s) passed before any plan")
        raise Infeasible(why_nothing(mp, ks, cache, rows), "rules")
    for p in {id(best): best, id(single): single}.values():
        if p is not None:
            verify(mp, p)
    notes += diloco_notes(mp, best)
    notes.append(f"{cache.solves} site plans solved")
    notes = list(dict.fromkeys(notes))  # one note per cut front, however many variants met it
    r = MultisiteResult(mp, best, single, rows, time.perf_counter() - t0, status, notes)
    r.searched_one_site = 1 in ks
    return r


MAX_PARETO = 12  # points of the front of cost against days across sites


def plan_cost(p: SitesPlan) -> float:
    """What a configuration's budget covers: its nodes and its links, USD."""
    return p.nodes_usd + p.links_usd


def pareto_front(mp: MultisiteProblem, time_limit_s: float = 60.0, cache: OfferCache | None = None):
    """The front of cost (nodes and links) against days to train (expected days with a goodput section)
    across sites, by the epsilon-constraint method: the fastest configuration within the budget (goal
    time_to_train, any deadline dropped), then the fastest that costs less than it, until nothing fits or
    MAX_PARETO points. Each point is proven optimal for its budget when its solve is; (points, notes)."""
    t_end = time.time() + time_limit_s
    cache = cache or OfferCache(mp, t_end)
    proc = mp.procure.model_copy(update={"goal": SitesGoal.TIME_TO_TRAIN, "deadline_days": None})
    budget, points, notes = proc.budget_usd, [], []
    while True:
        if len(points) == MAX_PARETO:
            notes.append(f"the front stops at {MAX_PARETO} points; cheaper configurations not searched")
            break
        q = mp.model_copy(update={"procure": proc.model_copy(update={"budget_usd": budget})})
        try:
            r = multisite(q, time_limit_s=max(t_end - time.time(), 0.0), cache=cache)
        except Infeasible:
            break
        except TimeLimit:
            notes.append(f"the front stops at {len(points)} points: the time limit passed")
            break
        if r.status != "optimal":
            notes.append(f"front point at {_usd(plan_cost(r.best))}: not proven (status {r.status})")
        points.append(r.best)
        budget = plan_cost(r.best) - 1.0
    return _non_dominated(mp, points, notes), notes


def _non_dominated(mp: MultisiteProblem, points: list[SitesPlan], notes: list[str]) -> list[SitesPlan]:
    """The points no cheaper point trains as soon as (in expected days with a goodput section: each site
    plan is the fastest failure-free, so a costlier configuration can train later in expectation)."""
    keep, best = [], math.inf
    for p in reversed(points):  # cheapest first
        days = p.expected_days if mp.goodput is not None else p.days_to_train
        if days < best:
            keep.append(p)
            best = days
    if mp.goodput is not None:
        notes.append(
            "the front is in expected days, over site plans that are each the fastest failure-free: "
            "not a proof in expected days"
        )
    return keep[::-1]


def multisite_with_front(mp: MultisiteProblem, time_limit_s: float = 60.0) -> MultisiteResult:
    """`multisite`, and the front of cost against days (`pareto_front`) on the same site plans, within one
    time limit."""
    t_end = time.time() + time_limit_s
    cache = OfferCache(mp, t_end)
    r = multisite(mp, time_limit_s=time_limit_s, cache=cache)
    r.pareto, notes = pareto_front(mp, max(t_end - time.time(), 0.0), cache)
    r.notes += notes
    return r


def _usd(x: float) -> str:
    return f"${x / 1e9:.2f}B" if x >= 1e9 else f"${x / 1e6:.2f}M"


def site_counts(mp: MultisiteProblem) -> tuple[list[int], list[str]]:
    """The numbers of sites searched (`sync.site_counts`, else min_sites..max_sites): those that split the
    global batch evenly (or into `sync.batch_units`), and with pipeline stages across sites every count
    (a pipeline does not split the batch); a note for each count a scheme cannot take."""
    top = min(mp.sync.max_sites or len(mp.sites), len(mp.sites))
    ks = sorted(set(mp.sync.site_counts or range(mp.sync.min_sites, top + 1)) & set(range(1, top + 1)))
    pipe = Scheme.PIPELINE in mp.sync.schemes
    data = [k for k in ks if splits_batch(mp, k)]
    B, U = mp.training.global_batch, mp.sync.batch_units
    what = "" if not pipe else " by data parallelism"
    if U is not None:
        why = f"more than the {U} batch units (sync.batch_units)"
    else:
        why = f"the global batch {B} does not split evenly"
    notes = [f"{k} sites not searched{what}: {why}" for k in ks if k not in data]
    return (ks if pipe else data), notes


def splits_batch(mp: MultisiteProblem, k: int) -> bool:
    """Whether k sites can each train a share of the global batch (data parallelism across sites)."""
    U = mp.sync.batch_units
    return k <= U if U is not None else mp.training.global_batch % k == 0


def diloco_notes(mp: MultisiteProblem, p: SitesPlan) -> list[str]:
    """What the chosen DiLoCo plan rests on beyond the scaling-law fit (H = 30, M <= 8, 35M-2.4B)."""
    if p.scheme != "diloco":
        return []
    out = []
    if len({s.group.global_batch for s in p.sites}) > 1:
        out.append(
            "DiLoCo over unequal batch shares: the outer step is taken as the token-weighted mean of the "
            "sites' pseudo-gradients, and the tokens multiplier as for equal replicas (the fit's)"
        )
    if mp.sync.tokens_multiplier is None or p.k not in mp.sync.tokens_multiplier:
        out.append(
            f"DiLoCo's tokens multiplier {p.tokens_multiplier:.3f} is the scaling-law fit's (Charles et al. "
            "2025: H = 30, M <= 8, 35M-2.4B parameters) extrapolated; it does not depend on H, and loss "
            "grows with H (their section 5.1): give sync.tokens_multiplier where you know better"
        )
    return out


def rank_key(mp: MultisiteProblem, p: SitesPlan) -> tuple[float, float]:
    """Smaller is better: goal cost by the bill, then the days; goal time by the days (expected, with a
    goodput section), then the bill."""
    if mp.procure.goal == SitesGoal.COST:
        return (round(p.cost_usd), p.days_to_train)
    return (p.expected_days if mp.goodput is not None else p.days_to_train, p.cost_usd)


def plan_goodput(mp: MultisiteProblem, p: SitesPlan):
    """Expected time and cost to train of a configuration (`optimizer.model.goodput`), the job priced as one
    over every site's GPUs: a failure anywhere stops a synchronous step, and stops DiLoCo's next outer step
    as long as a site's restart is shorter than the H steps it skips. Reliability and checkpoint bandwidth
    of the first site's node type; the nodes' catalog power; the nodes and links as the capital."""
    from optimizer.model import goodput as G

    t0 = p.sites[0].node_type
    nodes = sum(s.nodes for s in p.sites)
    rated = sum(s.nodes * (G.node_rated_w(s.node_type.system) or 0.0) for s in p.sites) / nodes
    job = G.Job(
        checkpoint_bytes=G.checkpoint_bytes(mp.llm, mp.training.precision, mp.training.master_weights),
        n_gpus=sum(s.group.gpus_used for s in p.sites),
        gpus_per_node=t0.gpus_per_node,
        step_s=p.round_s / p.inner_steps,
        steps=steps_to_train(mp) * p.tokens_multiplier,
        spare_nodes=mp.goodput.spare_count() if mp.goodput else None,
        node_rated_w=rated or None,
        node_training_w=sum(s.nodes * node_kw(s.node_type) for s in p.sites) * 1e3 / nodes,
        capex_usd=p.cost_usd,
        busy_share=G.busy_share(p.sites[0].group.plan.evaluation.result) * p.compute_utilisation,
    )
    return G.expected(G.Inputs.of(mp.goodput, t0.system.reliability), job)


def _solve_variant(mp, k, offers, scheme, h, overlap, deadline) -> tuple[SitesPlan | None, dict]:
    """One (k, scheme, H) model solved: its plan (None: infeasible) and its row of the considered table."""
    if scheme == Scheme.PIPELINE:
        return _with_goodput(mp, *_solve_pipeline(mp, k, deadline))
    row = {"sites": k, "scheme": "single-site" if scheme is None else scheme.value, "inner_steps": h}
    m = multiplier(mp, k, scheme)
    row["tokens_multiplier"] = m
    if not math.isfinite(m):
        return None, row | {"status": "infeasible", "why": "DiLoCo never reaches data parallelism's loss"}
    steps = steps_to_train(mp) * m
    if h > 1 and h >= steps:
        return None, row | {"status": "infeasible", "why": f"H = {h} inner steps is the whole run or more"}
    nbytes = outer_bytes(mp, scheme) if scheme is not None else 0.0
    max_round = None
    if mp.procure.goal == SitesGoal.COST:
        max_round = mp.procure.deadline_days * 86400.0 * h / steps
    tables = SitesTables(
        k=k,
        sites=[[SiteRow(o.step_time_s, o.cost_usd, o.units) for o in site] for site in offers],
        links=link_rows(mp, k, nbytes) if k > 1 else {},
        inner_steps=h,
        overlap=overlap,
        budget_usd=mp.procure.budget_usd,
        max_round_s=max_round,
        minimise_cost=mp.procure.goal == SitesGoal.COST,
        batch_units=mp.sync.batch_units,
    )
    sol, status = solve_cpsat(tables, max(0.05, deadline - time.time()))
    row["status"] = status
    if sol is None:
        return None, row
    return _with_goodput(mp, _plan(mp, offers, tables, sol, scheme, h, overlap, m, status), row)


def site_limits(mp: MultisiteProblem) -> dict[str, dict[str, int]]:
    """Per site, per node type it hosts: the most nodes it can hold (`site_limit`)."""
    types = {t.name: t for t in mp.catalog.node_types}
    return {s.name: {n: site_limit(mp, s, types[n])[0] for n in s.node_types} for s in mp.sites}


def _solve_pipeline(mp: MultisiteProblem, k: int, deadline: float) -> tuple[SitesPlan | None, dict]:
    """Pipeline stages across k sites (`optimizer.drivers.multisite_pipeline`): the best configuration as a
    `SitesPlan` (None: none) and its row of the considered table."""
    from optimizer.drivers.multisite_pipeline import group_of, solve_chain

    best, status, row = solve_chain(mp, proxy(mp), site_limits(mp), k, steps_to_train(mp), deadline)
    if best is None:
        return None, row
    c, _, sol = best
    group = group_of(c, k, mp.training.global_batch)
    used = [SiteOffer(mp.sites[s], c.node_type, c.site_nodes, group) for s in sol.ring]  # in path order
    pairs = list(zip(sol.ring, sol.ring[1:], strict=False))
    label = Scheme.PIPELINE.value
    plan = _sites_plan(mp, used, sol, pairs, label, 1, False, 1.0, c.step_s, sol.round_s - c.step_s, status)
    return plan, row


def _with_goodput(mp, plan: SitesPlan | None, row: dict) -> tuple[SitesPlan | None, dict]:
    """The plan with its expected time and cost to train (`plan_goodput`), and its row with its figures."""
    if plan is None:
        return None, row
    from optimizer.model.goodput import GoodputInputError

    try:
        plan.goodput = plan_goodput(mp, plan)
    except GoodputInputError as e:
        if e.field != "goodput":  # an interval the configuration's run cannot use: bad input at its field
            raise sourced_field_error(mp._source, e.field, f"{plan.label()}: {e}") from None
        plan.never_finishes = str(e)
    return plan, row | {
        "days_to_train": plan.days_to_train,
        "expected_days": plan.expected_days,
        "cost_usd": plan.cost_usd,
    }


def _plan(mp, offers, tables: SitesTables, sol: SitesSolution, scheme, h, overlap, m, status) -> SitesPlan:
    """The solution as sites, links and times (the times from the model's floats: `formulations.multisite.
    evaluate`)."""
    used = [offers[s][sol.choice[s]] for s in sol.ring]  # in ring order
    label = "single-site" if scheme is None else scheme.value
    slow = max(u.step_time_s for u in used)
    wan_s = ring_wan_s(tables, sol.link_choice)
    return _sites_plan(mp, used, sol, sorted(sol.link_choice), label, h, overlap, m, slow, wan_s, status)


def _sites_plan(mp, used, sol: SitesSolution, pairs, label, h, overlap, m, slow, wan_s, status) -> SitesPlan:
    """A configuration from its used sites' offers, the solver's solution, the link pairs to report (i < j,
    in order), its scheme and times: the links chosen, the days (tokens x multiplier x round / H), the
    nodes' and links' prices and the energy at the sites' prices."""
    links = []
    for i, j in pairs:
        ln = next(x for x in mp.links if {x.sites[0], x.sites[1]} == {mp.sites[i].name, mp.sites[j].name})
        opt = ln.options[sol.link_choice[(min(i, j), max(i, j))]]
        lat = wan.latency_s(opt.latency_ms, ln.distance_km)
        links.append(LinkChoice((mp.sites[i].name, mp.sites[j].name), opt, lat))
    days = steps_to_train(mp) * m * sol.round_s / h / 86400.0
    hours = days * 24.0
    return SitesPlan(
        scheme=label,
        inner_steps=h,
        overlap=overlap,
        sites=used,
        links=links,
        slowest_step_s=slow,
        wan_s=wan_s,
        round_s=sol.round_s,
        tokens_multiplier=m,
        days_to_train=days,
        nodes_usd=sum(u.cost_usd for u in used),
        links_usd=sum(c.option.price_usd for c in links),
        energy_mwh=sum(u.power_mw for u in used) * hours,
        energy_usd=sum(u.power_mw * hours * 1e3 * u.site.energy_usd_per_kwh for u in used),
        status=status,
    )


def verify(mp: MultisiteProblem, p: SitesPlan) -> None:
    """Re-evaluate a configuration from its parts (pipeline stages across sites: `multisite_pipeline.
    verify_pipeline`): each site's step from its plan's evaluation, the ring's
    all-reduce by `optimizer.model.wan` from the slowest link's bandwidth and the longest hop's latency, the
    days from the tokens, the multiplier and the round; both agree with the solver's within 0.1% (or its
    microsecond rounding), or fail loudly (exit 5)."""
    if p.scheme == Scheme.PIPELINE:
        from optimizer.drivers.multisite_pipeline import verify_pipeline

        return verify_pipeline(mp, p)
    wan_s = 0.0
    if p.k > 1:
        scheme = Scheme(p.scheme)
        wan_s = wan.ring_all_reduce_s(
            outer_bytes(mp, scheme),
            p.k,
            min(c.option.bandwidth_gbps for c in p.links),
            max(c.latency_s for c in p.links),
            mp.sync.bidirectional_ring,
            mp.sync.link_efficiency,
        )
    rnd = wan.round_s(
        max(s.group.plan.evaluation.result["step_time"] for s in p.sites), wan_s, p.inner_steps, p.overlap
    )
    days = (
        steps_to_train(mp) * multiplier(mp, p.k, None if p.k == 1 else Scheme(p.scheme)) * rnd / p.inner_steps
    )
    days /= 86400.0
    tol = 1e-3 * rnd + 2e-6 * (p.inner_steps + 1)
    if abs(rnd - p.round_s) > tol or abs(days - p.days_to_train) > 1e-3 * days + tol:
        raise VerificationError(
            f"procure (sites): the solver's round {p.round_s:.6g} s ({p.days_to_train:.6g} days) and the "
            f"model's {rnd:.6g} s ({days:.6g} days) disagree"
        )


def why_nothing(mp: MultisiteProblem, ks: list[int], cache: OfferCache, rows: list[dict]) -> str:
    """Which caps bind when no configuration exists: each site's largest purchase and whether a plan fits on
    it, each number of sites that no ring of links joins, the reasons of configurations ruled out, the
    budget and the deadline."""
    lines = ["no configuration trains it:"]
    types = {t.name: t for t in mp.catalog.node_types}
    holds = []
    data = mp.sync.schemes != [Scheme.PIPELINE]  # site plans for a share of the batch were solved
    for site in mp.sites:
        parts, any_fit = [], False
        for name in site.node_types:
            n, why = site_limit(mp, site, types[name])
            if not data:
                parts.append(f"{n} x {name} (bound by {why})")
                continue
            fits = n > 0 and any(
                g is not None
                for (tn, _), seen in cache.done.items()
                if tn == name
                for lim, g, _ in seen
                if lim <= n
            )
            any_fit |= fits
            what = "not one unit" if n == 0 else "a plan fits" if fits else "no plan fits in memory"
            parts.append(f"{n} x {name} (bound by {why}): {what}")
        holds.append(any_fit)
        lines.append(f"  site {site.name} ({site.power_mw:g} MW): " + "; ".join(parts))
    if not ks:
        lines.append(
            f"  no number of sites in {mp.sync.min_sites}..{mp.sync.max_sites or len(mp.sites)} "
            "splits the global batch"
        )
    lines += [
        f"  {k} sites: no ring of links joins {k} of the sites that hold a plan"
        for k in ks
        if data and splits_batch(mp, k) and not _ring(mp, k, holds)
    ]
    lines += sorted({f"  {r['sites']} sites, {r['scheme']}: {r['why']}" for r in rows if r.get("why")})
    if mp.procure.budget_usd is not None:
        lines.append(f"  budget ${mp.procure.budget_usd:,.0f}")
    if mp.procure.deadline_days is not None:
        lines.append(f"  deadline {mp.procure.deadline_days:g} days")
    return "\n".join(lines)


def _ring(mp: MultisiteProblem, k: int, holds: list[bool]) -> bool:
    """Whether some ring of links joins k of the sites marked in `holds` (CP-SAT's circuit on free
    offers)."""
    if k == 1:
        return any(holds)
    index = {s.name: i for i, s in enumerate(mp.sites)}
    links = {tuple(sorted(index[x] for x in ln.sites)): [LinkRow(0.0, 0.0, 0.0)] for ln in mp.links}
    t = SitesTables(k=k, sites=[[SiteRow(0.0, 0.0)] if h else [] for h in holds], links=links)
    return solve_cpsat(t, 5.0)[1] != "infeasible"
