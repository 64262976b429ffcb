"""Purchases of one node type: the per-type sub-problem, its proven best purchase, and the types that
`optimizer.drivers.procure` (single types, Pareto fronts) and `optimizer.drivers.hetero` (mixes) share.

Per node type t with g GPUs per node, price c_t per node (price_usd + extra_usd) and power p_t:
    nodes <= min(max_nodes_t, floor(budget / c_t), floor(power_cap / p_t))          (capex)
    nodes <= min(max_nodes_t, floor(power_cap / p_t));  GPUs x hours <= budget / rent  (rental)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from optimizer.errors import Infeasible
from optimizer.prepare.objective import gpus_used
from optimizer.schema import Options, Problem
from optimizer.schema.common import MAX_COUNT
from optimizer.schema.goodput import Goodput
from optimizer.schema.problem import Goal, Objective
from optimizer.schema.procure import NodeType, Pricing, ProcureGoal, ProcureProblem


@dataclass
class Group:
    """Nodes of one type and the plan they run (a homogeneous purchase is one group)."""

    node_type: NodeType
    nodes: int
    gpus_used: int
    global_batch: int  # sequences per step this group processes
    step_time_s: float
    plan: object  # optimizer.drivers.solve.Plan
    solve: object = None  # optimizer.drivers.solve.SolveResult


@dataclass
class Purchase:
    groups: list[Group]
    step_time_s: float  # the job's step time (slowest group + cross-type sync)
    tokens_per_s: float
    cost_usd: float  # capex: nodes x price; rental: the whole training run
    power_kw: float | None
    days_to_train: float | None
    sync_s: float = 0.0  # cross-type gradient synchronisation (heterogeneous mixes)
    goodput: object = None  # optimizer.model.goodput.PlanGoodput (with training.tokens)
    spare_nodes: int = 0  # spare nodes bought with it (of the first group's type; in cost_usd and power_kw)

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.nodes * g.node_type.gpus_per_node for g in self.groups)

    def tokens_per_s_per_musd(self) -> float:
        return self.tokens_per_s / (self.cost_usd / 1e6) if self.cost_usd > 0 else math.inf

    def label(self) -> str:
        return " + ".join(
            f"{g.nodes} x {g.node_type.name}"
            + (
                f" ({g.nodes // g.node_type.unit_nodes} units of {g.node_type.unit_nodes})"
                if g.node_type.unit_nodes > 1
                else ""
            )
            for g in self.groups
        )


@dataclass
class TypeRow:
    """What one node type offers: its bound and the best purchase of it (None: nothing fits)."""

    node_type: NodeType
    max_nodes: int
    bound_by: str  # budget | power | availability | procure.max_nodes
    purchase: Purchase | None
    candidates: int
    status: str  # optimal | infeasible | feasible


def bought_spares(pp: ProcureProblem) -> int:
    """Spare nodes bought with the purchase (`goodput.spare_nodes`, one count; 0 without)."""
    g = pp.goodput
    return 0 if g is None or isinstance(g.spare_nodes, list) else g.spare_count() or 0


def node_limit(pp: ProcureProblem, t: NodeType, budget_usd: float | None = None) -> tuple[int, str]:
    """The most nodes of type t the budget (capex), power cap and availability allow, less the spare nodes
    bought with them, and which binds."""
    pr = pp.procure
    budget = pr.budget_usd if budget_usd is None else budget_usd
    lim = [
        (pr.max_nodes, "procure.max_nodes"),
        (MAX_COUNT // t.gpus_per_node, "the largest GPU count modelled"),
    ]
    if t.max_nodes is not None:
        lim.append((t.max_nodes, "availability"))
    if pr.pricing == Pricing.CAPEX and budget is not None and t.node_usd:
        lim.append((int(math.floor(budget / t.node_usd + 1e-9)), "budget"))
    if pr.power_kw is not None:
        lim.append((int(math.floor(pr.power_kw / t.power_kw + 1e-9)), "power"))
    n, why = min(lim, key=lambda x: x[0])
    n = max(0, n - bought_spares(pp))
    return n // t.unit_nodes * t.unit_nodes, why  # whole units (racks)


def sub_problem(
    pp: ProcureProblem,
    t: NodeType,
    nodes: int,
    global_batch: int | None = None,
    budget_usd: float | None = None,
    goal: ProcureGoal | None = None,
    objective: Objective | None = None,
) -> Problem:
    """The solve problem of node type t with at most `nodes` nodes (whole nodes used, idle GPUs allowed);
    its objective follows the procurement goal unless `objective` is given."""
    pr = pp.procure
    goal = goal or pr.goal
    budget = pr.budget_usd if budget_usd is None else budget_usd
    tr = (
        pp.training if global_batch is None else pp.training.model_copy(update={"global_batch": global_batch})
    )
    g = t.gpus_per_node
    obj: dict = {}
    if goal == ProcureGoal.TIME_TO_TRAIN and pp.goodput is not None:
        obj["goal"] = Goal.EXPECTED_TIME
    elif goal in (ProcureGoal.THROUGHPUT, ProcureGoal.TIME_TO_TRAIN):
        obj["goal"] = Goal.STEP_TIME
    elif goal == ProcureGoal.COST:
        obj["goal"] = Goal.FEWEST_GPUS if pr.pricing == Pricing.CAPEX else Goal.TOKENS_PER_GPU
        obj["max_days"] = pr.deadline_days
    else:
        obj["goal"] = Goal.TOKENS_PER_GPU
    if pr.pricing == Pricing.RENTAL and budget is not None and pp.training.tokens:
        obj["max_gpu_hours"] = budget / t.rent_usd_per_gpu_hour
    if pp.goodput is not None and pp.training.tokens:  # deadlines and rental budgets met in expectation
        obj["target_includes_failures"] = True
    opts = Options(memory_headroom_gib=pp.options.memory_headroom_gib, allow_idle_gpus=True, gpu_multiple=g)
    q = Problem(
        name=f"{pp.name or 'procure'}@{t.name}",
        llm=pp.llm,
        system=t.system,
        num_gpus=nodes * g,
        training=tr,
        search=pp.search,
        options=opts,
        objective=objective or Objective(**obj),
        stack=pp.stack,
        goodput=(pp.goodput or Goodput()).model_copy(update={"idle_nodes_are_spares": False}),
    )
    q._source = pp._source  # goodput errors are located in the procurement file
    return q


def purchase_of(pp: ProcureProblem, groups: list[Group], step_s: float, sync_s: float = 0.0) -> Purchase:
    B, S = pp.training.global_batch, pp.training.seq_len or pp.llm.seq_len
    steps = pp.training.tokens / (B * S) if pp.training.tokens else None
    spare, t0 = bought_spares(pp), groups[0].node_type  # spares are of the first group's type
    if pp.procure.pricing == Pricing.CAPEX:
        cost = sum(g.nodes * g.node_type.node_usd for g in groups) + spare * t0.node_usd
    else:
        hours = (steps or 0.0) * step_s / 3600.0
        rate = sum(g.nodes * g.node_type.gpus_per_node * g.node_type.rent_usd_per_gpu_hour for g in groups)
        cost = (rate + spare * t0.gpus_per_node * t0.rent_usd_per_gpu_hour) * hours
    power = (
        None
        if any(g.node_type.power_kw is None for g in groups)
        else sum(g.nodes * g.node_type.power_kw for g in groups) + spare * t0.power_kw
    )
    p = Purchase(
        groups, step_s, B * S / step_s, cost, power, None if steps is None else steps * step_s / 86400, sync_s
    )
    p.spare_nodes = spare
    p.goodput = purchase_goodput(pp, p, steps)
    return p


def _busy(p: Purchase) -> float:
    """The busy share of the purchase's step (`goodput.busy_share` of its first group's plan; 1 without)."""
    from optimizer.model.goodput import busy_share

    plan = p.groups[0].plan
    return 1.0 if plan is None else busy_share(plan.evaluation.result)


def purchase_goodput(pp: ProcureProblem, p: Purchase, steps: float | None):
    """Expected time and cost to train of a purchase (`optimizer.model.goodput`): its GPUs used, the first
    group's node type for reliability and checkpoint bandwidth per node, the nodes' training power (the
    catalog's power_kw, else the systems' ratings), rental GPU-hours or the capital; None without tokens."""
    from optimizer.model import goodput as G

    if not steps:
        return None
    t0 = p.groups[0].node_type
    rated = [G.node_rated_w(g.node_type.system) for g in p.groups]
    train = [None if g.node_type.power_kw is None else g.node_type.power_kw * 1000 for g in p.groups]
    w = [g.nodes for g in p.groups]

    def avg(xs):
        return None if any(x is None for x in xs) else sum(a * b for a, b in zip(xs, w, strict=True)) / sum(w)

    rent = None
    if pp.procure.pricing == Pricing.RENTAL:
        usd_h = sum(g.nodes * g.node_type.gpus_per_node * g.node_type.rent_usd_per_gpu_hour for g in p.groups)
        rent = usd_h / p.gpus
    job = G.Job(
        checkpoint_bytes=G.checkpoint_bytes(pp.llm, pp.training.precision, pp.training.master_weights),
        n_gpus=sum(g.gpus_used for g in p.groups),
        gpus_per_node=t0.gpus_per_node,
        step_s=p.step_time_s,
        steps=steps,
        spare_nodes=pp.goodput.spare_count() if pp.goodput else None,
        node_rated_w=avg(rated),
        node_training_w=avg(train),
        rent_usd_per_gpu_hour=rent,
        capex_usd=p.cost_usd if pp.procure.pricing == Pricing.CAPEX else None,  # spares included
        busy_share=_busy(p),
    )
    return G.expected(G.Inputs.of(pp.goodput, t0.system.reliability), job)


def time_key(pp: ProcureProblem, p: Purchase) -> float:
    """How long a purchase takes: its expected time to train when the problem states its goodput, else its
    step time (the Pareto front's time axis)."""
    if pp.goodput is not None and p.goodput is not None:
        return p.goodput.expected_time_to_train_s
    return p.step_time_s


def rank_key(pp: ProcureProblem, p: Purchase) -> tuple[float, float]:
    """Smaller is better, under the procurement goal (ties: cheaper, then faster)."""
    goal = pp.procure.goal
    if goal == ProcureGoal.TIME_TO_TRAIN and pp.goodput is not None and p.goodput is not None:
        return (p.goodput.expected_time_to_train_s, p.cost_usd)
    if goal in (ProcureGoal.THROUGHPUT, ProcureGoal.TIME_TO_TRAIN):
        return (p.step_time_s, p.cost_usd)
    if goal == ProcureGoal.COST:
        if pp.goodput is not None and p.goodput is not None and p.goodput.expected_cost_usd is not None:
            return (p.goodput.expected_cost_usd, p.step_time_s)
        return (p.cost_usd, p.step_time_s)
    if pp.procure.pricing == Pricing.RENTAL:  # tokens/s per ($ per hour)
        rate = sum(g.nodes * g.node_type.gpus_per_node * g.node_type.rent_usd_per_gpu_hour for g in p.groups)
        return (-p.tokens_per_s / rate, p.step_time_s)
    return (-p.tokens_per_s / p.cost_usd, p.step_time_s)


# ---------------------------------------------------------------------------------------------- solve
def system_tables_key(system) -> str:
    """What of a system the CP-SAT tables depend on: all but its name, calibration and memory capacities (HBM
    and offload capacity enter only the capacity rows, `formulations.tables.restrict`; whether offload exists
    does)."""
    d = system.model_dump(mode="json", exclude={"name", "hbm_gib", "calibration"})
    off = d.get("offload") or {}
    d["offload"] = {k: v for k, v in off.items() if k != "capacity_gib"} | {
        "present": (off.get("capacity_gib") or 0) > 0
    }
    return json.dumps(d, sort_keys=True)


def tables_key(q: Problem) -> str:
    """What a problem's CP-SAT tables depend on: everything but its name, GPU count (a smaller count is a
    subset of a larger one's space with idle GPUs allowed), objective and execution (but the knobs no
    candidate chooses, which it gives: `space.given_knobs`), and the system's `system_tables_key`."""
    from optimizer.prepare.space import given_knobs

    d = q.model_dump(
        mode="json", exclude={"name", "description", "num_gpus", "objective", "execution", "system"}
    )
    d["given"] = given_knobs(q)
    return json.dumps(d, sort_keys=True, default=str) + system_tables_key(q.system)


class TablesCache:
    """CP-SAT tables per `tables_key` at the most GPUs asked so far (or `at_gpus`): a smaller GPU count is a
    subset of that space (idle GPUs allowed), and problems that differ only in HBM or offload capacity (Study
    5's variants) share tables, so each is solved without filling tables again. `max_entries` bounds memory
    (the oldest key goes first)."""

    def __init__(self, max_entries: int | None = None):
        self.by_key: dict[str, tuple[int, list]] = {}
        self.max_entries = max_entries

    def get(self, q: Problem, at_gpus: int | None = None, deadline: float | None = None):
        """Tables that hold `q`'s space (None: it is empty), built at max(q.num_gpus, at_gpus) GPUs when
        needed; TimeLimit once `deadline` (perf_counter s) passes while they are filled."""
        from formulations.tables import build_all
        from optimizer.prepare.space import compact_space

        key = tables_key(q)
        hit = self.by_key.get(key)
        if hit is None or hit[0] < q.num_gpus:
            n = max(q.num_gpus, at_gpus or 0)
            big = q if n == q.num_gpus else q.model_copy(update={"num_gpus": n})
            c = compact_space(big)
            if c.size == 0:
                return None
            if self.max_entries and key not in self.by_key and len(self.by_key) >= self.max_entries:
                self.by_key.pop(next(iter(self.by_key)))
            hit = (n, build_all(big, c, deadline))
            self.by_key[key] = hit
        return hit[1]


def best_of_type(
    pp: ProcureProblem,
    t: NodeType,
    nodes: int,
    global_batch: int | None = None,
    budget_usd: float | None = None,
    goal: ProcureGoal | None = None,
    time_limit_s: float = 60.0,
    objective: Objective | None = None,
    cache: TablesCache | None = None,
) -> tuple[Group | None, int, str]:
    """The proven-best group of type t with at most `nodes` nodes (None: nothing fits), the space size and
    the status. `cache`: reuse tables across calls (Pareto fronts, mixes)."""
    from optimizer.drivers.solve import solve

    if nodes < 1:
        return None, 0, "infeasible"
    q = sub_problem(pp, t, nodes, global_batch, budget_usd, goal, objective)
    try:
        tables = cache.get(q) if cache is not None else None
        if cache is not None and tables is None:
            return None, 0, "infeasible"
        r = solve(q, "cpsat", time_limit_s=time_limit_s, tables=tables)
    except Infeasible:
        from optimizer.prepare.space import compact_space

        return None, compact_space(q).size, "infeasible"
    plan = r.plans[0]
    used = gpus_used(plan.evaluation.execution)
    nodes_bought = t.bought(math.ceil(used / t.gpus_per_node))
    # solved on the type's whole pool of nodes (idle GPUs allowed): the group's plan is on the nodes bought
    ev = plan.evaluation
    plan = replace(
        plan,
        evaluation=replace(
            ev, problem=ev.problem.model_copy(update={"num_gpus": nodes_bought * t.gpus_per_node})
        ),
    )
    return (
        Group(t, nodes_bought, used, q.training.global_batch, plan.objective_s, plan, r),
        r.candidates,
        r.status,
    )
