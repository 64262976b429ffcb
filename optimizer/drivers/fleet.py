"""`paraplan fleet`: procurement for a portfolio of training jobs over a horizon of periods.

Two stages:
1. Throughput table. For every (job, node type, size in nodes of `fleet.sizes_nodes`) the CP-SAT planner
   (`optimizer.drivers.solve`, goal step_time, whole nodes, idle GPUs allowed) proves the fastest step; the
   job then trains rate = global_batch x seq_len / step_time tokens/s, i.e. rate x period_days x 86400 tokens
   per period.
   Sizes where nothing fits are left out.
2. Portfolio MILP (`formulations.fleet`; Pyomo, HiGHS through highspy in a worker process): nodes to buy
   per type and period and the allocation of each job per period, for the least capex (goal cost) or the
   most weighted tokens within the budget (goal tokens).

A job that finishes early in a period holds its nodes to the period's end (periods are the planning grain).
Infeasible: the budget's shortfall (min cost without the budget, less the budget), and per job the tokens its
deadline leaves untrained when every other limit is dropped to what the catalog allows, and the latest-period
extension that would train them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from formulations.fleet import Rate, solve_portfolio, token_scale
from optimizer.errors import Infeasible, TimeLimit
from optimizer.schema import Options, Problem
from optimizer.schema.fleet import FleetGoal, FleetProblem
from optimizer.schema.goodput import Goodput
from optimizer.schema.problem import Objective

SECONDS_PER_DAY = 86400.0


@dataclass
class FleetResult:
    status: str  # optimal | feasible | infeasible
    goal: str
    cost_usd: float | None
    buy: dict[str, list[int]]  # type -> nodes bought per period
    schedule: list[dict]  # {job, period, node_type, nodes, tokens}
    trained: dict[str, float]  # job -> tokens trained (within its deadline for goal cost)
    rates: list[Rate]
    seconds: float
    explanation: list[str] = field(default_factory=list)
    bound: float | None = None
    problem: FleetProblem | None = None  # the fleet problem solved
    energy_kwh: float | None = None  # the schedule's nodes through their periods, times PUE
    energy_usd: float | None = None
    job_goodput: dict = field(default_factory=dict)  # job -> (label, PlanGoodput) on its main allocation


def sub_problem(fp: FleetProblem, job, t, nodes: int) -> Problem:
    """The solve problem of job on `nodes` nodes of type t (whole nodes used, idle GPUs allowed)."""
    opts = Options(
        memory_headroom_gib=fp.options.memory_headroom_gib, allow_idle_gpus=True, gpu_multiple=t.gpus_per_node
    )
    q = Problem(
        name=f"{job.name}@{t.name}x{nodes}",
        llm=job.llm,
        system=t.system,
        num_gpus=nodes * t.gpus_per_node,
        training=job.training,
        search=job.search,
        options=opts,
        objective=Objective(goal="expected_time" if fp.goodput is not None else "step_time"),
        goodput=(fp.goodput or Goodput()).model_copy(update={"idle_nodes_are_spares": False}),
    )
    q._source = fp._source  # goodput errors are located in the fleet file
    return q


def effective_fraction(fp: FleetProblem, job, t, gpus_used: int) -> float:
    """Expected share of wall time a job on `gpus_used` GPUs of node type t trains (optimizer.model.goodput),
    the rest lost to failures, restarts, checkpoints and waits for spares."""
    from optimizer.model import goodput as G

    inp = G.Inputs.of(fp.goodput, t.system.reliability)
    c = G.checkpoint_bytes(job.llm, job.training.precision, job.training.master_weights)
    spares = fp.goodput.spare_count() if fp.goodput is not None else None
    return float(1.0 / G.job_factor(inp, c, gpus_used, t.gpus_per_node, spares)[0])


def throughput_table(fp: FleetProblem, time_limit_s: float = 60.0, t0: float | None = None) -> list[Rate]:
    """The fastest plan of every (job, node type, size): each solve gets what is left of `time_limit_s`
    since `t0` (perf_counter s; default now), so the limit bounds the whole table; TimeLimit once none is
    left."""
    from optimizer.drivers.solve import solve
    from optimizer.model.goodput import busy_share
    from optimizer.prepare.objective import gpus_used

    t0 = time.perf_counter() if t0 is None else t0
    out = []
    for job in fp.jobs:
        S = job.training.seq_len or job.llm.seq_len
        for t in fp.node_types:
            for s in sorted(fp.fleet.sizes_nodes):
                if t.max_nodes is not None and s > t.max_nodes:
                    continue
                left = time_limit_s - (time.perf_counter() - t0)
                stopped = TimeLimit(
                    f"fleet: the time limit ({time_limit_s:g} s) passed while the throughput table was "
                    f"filled ({len(out)} (job, type, size) plans found; stopped at {job.name} on {s} x "
                    f"{t.name}): not a proof that nothing fits; raise --time-limit"
                )
                if left <= 0:
                    raise stopped
                try:
                    r = solve(sub_problem(fp, job, t, s), "cpsat", time_limit_s=left)
                except Infeasible:
                    continue
                except TimeLimit:  # the sub-solve's message names its own leftover seconds, not the user's
                    raise stopped from None
                st = r.plans[0].objective_s
                tps = job.training.global_batch * S / st
                n = gpus_used(r.plans[0].evaluation.execution)
                eff = effective_fraction(fp, job, t, n)
                share = eff if fp.goodput is not None else 1.0
                per = tps * fp.fleet.period_days * SECONDS_PER_DAY * share
                busy = busy_share(r.plans[0].evaluation.result)
                usd = row_energy_usd(fp, t, s, busy)
                out.append(Rate(job.name, t.name, s, n, st, tps, per, r.status, eff, busy, usd))
    return out


def fleet(fp: FleetProblem, time_limit_s: float = 60.0, rates: list[Rate] | None = None) -> FleetResult:
    t0 = time.perf_counter()
    rates = throughput_table(fp, time_limit_s, t0) if rates is None else rates
    nowhere = fits_nowhere(fp, rates)
    if nowhere and fp.fleet.goal == FleetGoal.COST:
        return _infeasible(fp, rates, t0, nowhere)
    m, X, dl, r = solve_portfolio(fp, rates, max(0.05, time_limit_s - (time.perf_counter() - t0)))
    P = fp.fleet.periods
    if r["objective"] is None:
        if not proven_infeasible(r):
            raise TimeLimit(
                f"fleet: no purchase plan found within {time_limit_s:g} s (HiGHS: {r['status']}; no bound "
                f"known); the throughput table holds {len(rates)} (job, type, size) plans, "
                f"{sum(x.status == 'optimal' for x in rates)} proven fastest by CP-SAT: not a proof that "
                "nothing fits; raise --time-limit"
            )
        slow = [x for x in rates if x.status != "optimal"]
        if slow:  # infeasible on rates the time limit left slower than the fastest: no proof
            raise TimeLimit(
                f"fleet: no purchase plan meets the goal with the throughputs found within "
                f"{time_limit_s:g} s, but {len(slow)} of the {len(rates)} (job, type, size) plans were not "
                f"proven fastest by then (e.g. {slow[0].job} on {slow[0].nodes} x {slow[0].node_type}): not "
                "a proof that nothing fits; raise --time-limit"
            )
        left = max(0.05, time_limit_s - (time.perf_counter() - t0))
        return _infeasible(fp, rates, t0, explain(fp, rates, left))
    v = r["by_var"]
    own = {
        t.name: [0] + [int(round(v.get(m.own[t.name, q], 0.0))) for q in range(1, P + 1)]
        for t in fp.node_types
    }
    buy = {t: [o[q] - o[q - 1] for q in range(1, P + 1)] for t, o in own.items()}
    sched, trained = [], {j.name: 0.0 for j in fp.jobs}
    for i, q in X:
        if v.get(m.x[i, q], 0.0) > 0.5:
            rt = rates[i]
            sched.append(
                {
                    "job": rt.job,
                    "period": q,
                    "node_type": rt.node_type,
                    "nodes": rt.nodes,
                    "gpus_used": rt.gpus_used,
                    "step_time_s": rt.step_time_s,
                    "tokens": rt.tokens_per_period,
                    "effective_fraction": rt.effective_fraction,
                    "busy_share": rt.busy_share,
                }
            )
            if q <= dl[rt.job]:
                trained[rt.job] += rt.tokens_per_period
    sched.sort(key=lambda d: (d["job"], d["period"]))
    types = {t.name: t for t in fp.node_types}
    cost = sum(types[t].node_usd * n for t, ns in buy.items() for n in ns)
    status = "optimal" if r["status"] == "Optimal" else "feasible"
    kwh, usd = fleet_energy(fp, sched)
    res = FleetResult(
        status,
        fp.fleet.goal.value,
        cost,
        buy,
        sched,
        trained,
        rates,
        time.perf_counter() - t0,
        bound=r["bound"],
        problem=fp,
        energy_kwh=kwh,
        energy_usd=usd,
    )
    res.job_goodput = {j.name: main_allocation_goodput(fp, j, rates, sched) for j in fp.jobs}
    return res


def main_allocation_goodput(fp: FleetProblem, job, rates: list[Rate], sched: list[dict]):
    """(label, `optimizer.model.goodput.PlanGoodput`) of a job trained whole on the allocation of its schedule
    that trains most of its tokens: expected days with their parts and band; None when it is not scheduled."""
    from optimizer.model import goodput as G

    mine = [s for s in sched if s["job"] == job.name]
    if not mine:
        return None
    s = max(mine, key=lambda s: (s["tokens"], -s["period"]))
    t = next(t for t in fp.node_types if t.name == s["node_type"])
    tr = job.training
    steps = tr.tokens / (tr.global_batch * (tr.seq_len or job.llm.seq_len))
    g = G.expected(
        G.Inputs.of(fp.goodput, t.system.reliability),
        G.Job(
            checkpoint_bytes=G.checkpoint_bytes(job.llm, tr.precision, tr.master_weights),
            n_gpus=s["gpus_used"],
            gpus_per_node=t.gpus_per_node,
            step_s=s["step_time_s"],
            steps=steps,
            spare_nodes=fp.goodput.spare_count() if fp.goodput is not None else None,
            node_rated_w=G.node_rated_w(t.system),
            node_training_w=None if t.power_kw is None else t.power_kw * 1000,
            busy_share=s.get("busy_share", 1.0),
        ),
    )
    return f"{s['nodes']} x {t.name}", g


def fleet_energy(fp: FleetProblem, sched: list[dict]) -> tuple[float | None, float | None]:
    """Energy of the schedule, kWh, and its price, USD: each job's nodes draw their training power through
    its periods (a job holds its nodes to a period's end), idle + (busy - idle) x the plan's busy share, the
    busy draw the catalog's power_kw or the system's rating x the measured peak share
    (optimizer/model/goodput.yaml), times PUE; None when a type states no power."""
    from optimizer.model import goodput as G

    inp = G.Inputs.of(fp.goodput)
    types = {t.name: t for t in fp.node_types}
    kwh = 0.0
    for s in sched:
        kw = node_kw(types[s["node_type"]], s.get("busy_share", 1.0))
        if kw is None:
            return None, None
        kwh += s["nodes"] * kw * fp.fleet.period_days * 24
    kwh *= inp.energy.pue
    return kwh, kwh * inp.energy.usd_per_kwh


def node_kw(t, busy: float) -> float | None:
    """A node's draw in training, kW: idle + (busy - idle) x the plan's busy share, the busy draw the
    catalog's power_kw or the system's rating x the measured peak share; None without either."""
    from optimizer.model import goodput as G

    pw = G.defaults()["power"]
    rated = G.node_rated_w(t.system)
    if t.power_kw is not None:
        rated = t.power_kw * 1000 / pw["peak_of_rated"]
    if rated is None:
        return None
    idle, peak = rated * pw["idle_of_rated"], rated * pw["peak_of_rated"]
    return (idle + (peak - idle) * busy) / 1000


def row_energy_usd(fp: FleetProblem, t, nodes: int, busy: float) -> float:
    """Energy price of `nodes` nodes of type t training through one period, USD (0 without a power)."""
    from optimizer.model import goodput as G

    kw = node_kw(t, busy)
    if kw is None:
        return 0.0
    e = G.Inputs.of(fp.goodput).energy
    return nodes * kw * fp.fleet.period_days * 24 * e.pue * e.usd_per_kwh


def proven_infeasible(r: dict) -> bool:
    """Whether HiGHS proved the portfolio MILP infeasible (not merely stopped, e.g. at its time limit)."""
    return r["objective"] is None and r["status"] == "Infeasible"


def fits_nowhere(fp: FleetProblem, rates: list[Rate]) -> list[str]:
    """Per job without a row in the throughput table (it fits on no considered node type at any size of
    `sizes_nodes`): why goal cost is infeasible, proven by the planner's solves alone."""
    have = {r.job for r in rates}
    types = ", ".join(t.name for t in fp.node_types)
    return [
        f"job {j.name} fits on no node type ({types}) at any size of sizes_nodes "
        f"{sorted(fp.fleet.sizes_nodes)}: it cannot train any tokens"
        for j in fp.jobs
        if j.name not in have
    ]


def _infeasible(fp: FleetProblem, rates: list[Rate], t0: float, explanation: list[str]) -> FleetResult:
    """The result of a portfolio proven infeasible, with its explanation."""
    return FleetResult(
        "infeasible",
        fp.fleet.goal.value,
        None,
        {},
        [],
        {},
        rates,
        time.perf_counter() - t0,
        explanation,
        problem=fp,
    )


def explain(fp: FleetProblem, rates: list[Rate], time_limit_s: float) -> list[str]:
    """Why the portfolio is infeasible: the budget's shortfall, or per job the tokens its deadline leaves
    untrained and how many periods later it would have to end. A solve behind it that stops at the time limit
    is said to, never read as a proof."""
    out = []
    unknown = (
        f"proven infeasible, but the solves that explain it passed the time limit ({time_limit_s:g} s): "
        "raise --time-limit to learn which limit binds"
    )
    if fp.fleet.goal == FleetGoal.COST and fp.fleet.budget_usd is not None:
        _, _, _, r = solve_portfolio(fp, rates, time_limit_s, budget_usd=None)
        if r["objective"] is not None:
            need = r["objective"]
            out.append(
                f"budget binds: the deadlines need ${need:,.0f}, ${need - fp.fleet.budget_usd:,.0f} more "
                f"than the budget of ${fp.fleet.budget_usd:,.0f}"
            )
            return out
        if not proven_infeasible(r):
            return [unknown]
    # deadlines bind: most tokens each job can train by its deadline with the others' needs kept
    m, _, dl, r = solve_portfolio(fp, rates, time_limit_s, budget_usd=None, goal=FleetGoal.TOKENS)
    if r["objective"] is None:  # training nothing is feasible: only a time limit leaves no answer
        return [unknown]
    for j in fp.jobs:
        done = r["by_var"].get(m.done[j.name], 0.0) * token_scale(fp)
        short = j.training.tokens - done
        if short > 1e-6 * j.training.tokens:
            out.append(
                f"deadline of {j.name} (period {dl[j.name]}) binds: {short / 1e9:,.1f}B of "
                f"{j.training.tokens / 1e9:,.1f}B tokens cannot be trained in time"
                + ("" if r["status"] == "Optimal" else " (at most: the time limit passed)")
                + _later_deadline(fp, rates, j.name, dl[j.name], time_limit_s)
            )
    return out or ["infeasible (limits interact: no single deadline or the budget explains it)"]


def _later_deadline(fp: FleetProblem, rates: list[Rate], job: str, deadline: int, time_limit_s: float) -> str:
    """The first later deadline of `job` that makes the portfolio feasible, as a clause of the explanation."""
    for d in range(deadline + 1, fp.fleet.periods + 1):
        _, _, _, r = solve_portfolio(fp, rates, time_limit_s, budget_usd=None, deadlines={job: d})
        if r["objective"] is not None:
            return f"; a deadline at the end of period {d} would do"
        if not proven_infeasible(r):
            return f"; whether period {d} would do is unknown (time limit)"
    return "; no deadline within the horizon would do (more availability, power or larger sizes)"
