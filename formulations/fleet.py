"""The portfolio MILP of `paraplan fleet` (Pyomo; HiGHS through highspy in a worker process,
`formulations.pyomo_model.run_highs`): which nodes to buy per period and which job runs on which
allocation, over a throughput table of (job, node type, size) rates that the CP-SAT planner proved
(`optimizer.drivers.fleet`).

    own[t,q]   >= 0 integer      nodes of type t owned in period q (bought ones are kept to the horizon's end)
    buy[t,q] = own[t,q] - own[t,q-1] >= 0            nodes bought at the start of period q (own[t,0] = 0)
    x[j,t,s,q] binary            job j runs on s nodes of type t during period q
    sum_{t,s} x[j,t,s,q] <= 1                        a job runs on one allocation per period
    sum_{j,s} s x[j,t,s,q] <= own[t,q]               nodes in use <= nodes owned
    own[t,q] <= max_nodes[t]                         availability
    sum_t power[t] own[t,q] <= power_kw              power cap
    cost = sum_t node_usd[t] own[t,P]                capex (price_usd + extra_usd per node) = sum_q buy
  No row sums over earlier periods: the model grows linearly with the number of periods.
  goal cost:   sum_{t,s,q<=deadline_j} tok[j,t,s] x[j,t,s,q] >= tokens_j; minimise cost
               (ties: fewer node-periods)
  goal tokens: cost <= budget; done_j <= tokens_j, done_j <= sum_{t,s,q} tok x;
               maximise sum_j weight_j done_j
"""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.schema.fleet import FleetGoal, FleetProblem


@dataclass
class Rate:
    """One row of the throughput table: job `job` on `nodes` nodes of `node_type` (`gpus_used` of their GPUs)
    takes `step_time_s` per step, trains `tokens_per_s` and so `tokens_per_period` tokens per period (times
    the `effective_fraction` when the fleet states its goodput); `status`: whether the CP-SAT solve behind
    it proved the optimum."""

    job: str
    node_type: str
    nodes: int
    gpus_used: int
    step_time_s: float
    tokens_per_s: float
    tokens_per_period: float
    status: str  # optimal | feasible
    effective_fraction: float = 1.0  # expected share of wall time training (optimizer.model.goodput)
    busy_share: float = 1.0  # the share of a step its GPUs compute (optimizer.model.goodput.busy_share)
    energy_usd_per_period: float = 0.0  # the row's nodes training through one period (energy x PUE x price)


def token_scale(fp: FleetProblem) -> float:
    """Tokens per unit in the MILP's rows: the largest job's tokens are 1000 units (well-scaled rows)."""
    return max(j.training.tokens for j in fp.jobs) / 1e3


@dataclass(frozen=True)
class PortfolioIndex:
    """The sets of the portfolio MILP: node types and jobs by name, each job's deadline period, the periods
    1..P, the (rate row, period) pairs of the allocation binaries, and the nodes owned per (type, period)."""

    types: dict
    jobs: dict
    deadline: dict[str, int]
    periods: list[int]
    pairs: list[tuple[int, int]]
    owned: dict


def build_portfolio(
    fp: FleetProblem,
    rates: list[Rate],
    budget_usd: float | None = "default",
    deadlines: dict[str, int] | None = None,
    goal: FleetGoal | None = None,
):
    """The Pyomo model of the portfolio (module docstring), built group by group: (model, the (rate row,
    period) pairs, each job's deadline period)."""
    import pyomo.environ as pyo

    goal = goal or fp.fleet.goal
    budget = fp.fleet.budget_usd if budget_usd == "default" else budget_usd
    m = pyo.ConcreteModel(name=fp.name or "fleet")
    ix = define_purchases_and_allocations(pyo, m, fp, rates, deadlines)
    define_one_allocation_per_job(pyo, m, ix, rates)
    define_capacity(pyo, m, ix, rates)
    define_power(pyo, m, fp, ix)
    cost = define_cost(pyo, m, ix, budget)
    if goal == FleetGoal.COST:
        define_cost_goal(pyo, m, fp, ix, rates, cost)
    else:
        define_tokens_goal(pyo, m, fp, ix, rates)
    return m, ix.pairs, ix.deadline


def define_purchases_and_allocations(
    pyo, m, fp: FleetProblem, rates: list[Rate], deadlines
) -> PortfolioIndex:
    """own[t,q] (integer nodes owned, never fewer than the period before: group `owned`), buy[t,q] (nodes
    bought, an expression) and x[i,q] (rate row i runs in period q, binary); the sets."""
    P = fp.fleet.periods
    types = {t.name: t for t in fp.node_types}
    Q = list(range(1, P + 1))
    pairs = [(i, q) for i, _ in enumerate(rates) for q in Q]
    # nodes owned per (type, period), kept to the horizon's end: buy[t,q] = own[t,q] - own[t,q-1] >= 0 holds
    # O(types x periods) terms (a sum over q' <= q per period would hold O(periods^2))
    m.own = pyo.Var(list(types), Q, domain=pyo.NonNegativeIntegers)
    m.x = pyo.Var(pairs, domain=pyo.Binary)
    m.buy = pyo.Expression(
        list(types), Q, rule=lambda m, t, q: m.own[t, q] - (m.own[t, q - 1] if q > 1 else 0)
    )
    m.owned = pyo.ConstraintList()
    for t in types:
        for q in Q[1:]:
            m.owned.add(m.own[t, q] >= m.own[t, q - 1])
    owned = {(t, q): m.own[t, q] for t in types for q in Q}
    deadline = {j.name: (deadlines or {}).get(j.name, j.deadline_period or P) for j in fp.jobs}
    return PortfolioIndex(types, {j.name: j for j in fp.jobs}, deadline, Q, pairs, owned)


def define_one_allocation_per_job(pyo, m, ix: PortfolioIndex, rates: list[Rate]) -> None:
    """A job runs on at most one allocation per period (group `one`)."""
    m.one = pyo.ConstraintList()
    m.cap = pyo.ConstraintList()  # created here to keep the model's component order
    for jn in ix.jobs:
        for q in ix.periods:
            xs = [m.x[i, q] for i, r in enumerate(rates) if r.job == jn]
            if xs:
                m.one.add(sum(xs) <= 1)


def define_capacity(pyo, m, ix: PortfolioIndex, rates: list[Rate]) -> None:
    """Nodes in use <= nodes owned, and nodes owned <= the type's availability (group `cap`)."""
    for t, nt in ix.types.items():
        for q in ix.periods:
            use = [r.nodes * m.x[i, q] for i, r in enumerate(rates) if r.node_type == t]
            if use:
                m.cap.add(sum(use) <= ix.owned[t, q])
            if nt.max_nodes is not None:
                m.cap.add(ix.owned[t, q] <= nt.max_nodes)


def define_power(pyo, m, fp: FleetProblem, ix: PortfolioIndex) -> None:
    """The fleet's power cap (kW) on the nodes owned in every period (group `power`)."""
    if fp.fleet.power_kw is None:
        return
    m.power = pyo.ConstraintList()
    for q in ix.periods:
        m.power.add(sum(ix.types[t].power_kw * ix.owned[t, q] for t in ix.types) <= fp.fleet.power_kw)


def define_cost(pyo, m, ix: PortfolioIndex, budget: float | None):
    """Capex (USD) of the nodes bought, and the budget on it when there is one (group `budget`)."""
    cost = sum(ix.types[t].node_usd * m.own[t, ix.periods[-1]] for t in ix.types)  # sum_q buy[t,q]
    m.cost = pyo.Expression(expr=cost)
    if budget is not None:
        m.budget = pyo.Constraint(expr=cost <= budget)
    return cost


def _trained(m, ix: PortfolioIndex, rates: list[Rate], job: str, scale: float):
    """The tokens (in units of `scale`) job `job` trains by its deadline: a linear expression (0: no rate)."""
    tr = [
        r.tokens_per_period / scale * m.x[i, q]
        for i, r in enumerate(rates)
        if r.job == job
        for q in ix.periods
        if q <= ix.deadline[job]
    ]
    return sum(tr) if tr else 0


def define_cost_goal(pyo, m, fp: FleetProblem, ix: PortfolioIndex, rates: list[Rate], cost) -> None:
    """Goal cost: every job trains its tokens by its deadline (group `tokens`); minimise capex, plus the
    energy of the allocations when the fleet states its goodput (expected total cost), ties broken towards
    fewer node-periods in use (an epsilon far below $1)."""
    scale = token_scale(fp)
    m.tokens = pyo.ConstraintList()
    for jn, j in ix.jobs.items():
        trained = _trained(m, ix, rates, jn, scale)
        if isinstance(trained, int):
            raise ValueError(f"job {jn} has no throughput row: goal cost is infeasible without a solve")
        m.tokens.add(trained >= j.training.tokens / scale)
    eps = 1e-6 / max(1, sum(r.nodes for r in rates) * fp.fleet.periods)
    node_periods = sum(r.nodes * m.x[i, q] for (i, q) in ix.pairs for r in [rates[i]])
    energy = 0
    if fp.goodput is not None:
        energy = sum(rates[i].energy_usd_per_period * m.x[i, q] for (i, q) in ix.pairs)
    m.obj = pyo.Objective(expr=cost + energy + eps * node_periods, sense=pyo.minimize)


def define_tokens_goal(pyo, m, fp: FleetProblem, ix: PortfolioIndex, rates: list[Rate]) -> None:
    """Goal tokens: done_j at most the job's tokens and at most what it trains (group `tokens`); maximise the
    weighted tokens done."""
    scale = token_scale(fp)
    m.done = pyo.Var(list(ix.jobs), domain=pyo.NonNegativeReals)
    m.tokens = pyo.ConstraintList()
    for jn, j in ix.jobs.items():
        m.tokens.add(m.done[jn] <= j.training.tokens / scale)
        m.tokens.add(m.done[jn] <= _trained(m, ix, rates, jn, scale))
    m.obj = pyo.Objective(expr=sum(j.weight * m.done[jn] for jn, j in ix.jobs.items()), sense=pyo.maximize)


def solve_portfolio(fp: FleetProblem, rates: list[Rate], time_limit_s: float = 60.0, **kw):
    from formulations.pyomo_model import run_highs

    m, X, dl = build_portfolio(fp, rates, **kw)
    r = run_highs(m, time_limit_s)
    return m, X, dl, r
