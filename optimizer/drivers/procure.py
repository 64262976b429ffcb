"""`paraplan procure`: what hardware to buy (or rent) and how to run on it, chosen together.

Stages: load -> prepare (one sub-problem per node type: its system, the most GPUs the budget, power cap and
availability allow, whole nodes, idle GPUs allowed) -> solve (each sub-problem by CP-SAT with the objective
that ranks purchases of that type: within one type cost is proportional to the GPUs used) -> rank across
types -> report. The best purchase is the best of the per-type proven optima, so it is a proven optimum
of the whole catalog (branching on the node type is exact).

Per node type t with g GPUs per node, price c_t per node (price_usd + extra_usd) and power p_t:
    nodes <= min(max_nodes_t, floor(budget / c_t), floor(power_cap / p_t))          (capex)
    nodes <= min(max_nodes_t, floor(power_cap / p_t));  GPUs x hours <= budget / rent  (rental)
Goals (B sequences of S tokens per step, T the step time, n GPUs, steps = tokens / (B S)):
    throughput, time_to_train   min T            (tokens/s = B S / T; days = steps T / 86400)
    cost                        capex: min n (fewest GPUs) with steps T <= deadline; rental: min n T
    throughput_per_usd          min n T (capex: tokens/s per $ = B S / (T n c_t / g); rental: per $/h)
Heterogeneous mixes (`procure.heterogeneous: data`, two node types): `optimizer.drivers.hetero`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from optimizer.prepare.objective import BIG_S
from optimizer.progress import progress
from optimizer.drivers.purchase import (Group, Purchase, TablesCache, TypeRow, best_of_type, node_limit, purchase_of,  # noqa: F401
                       rank_key, sub_problem, system_tables_key)
from optimizer.schema.problem import Goal, Objective
from optimizer.schema.procure import Pricing, ProcureGoal, ProcureProblem


@dataclass
class ProcureResult:
    problem: ProcureProblem
    best: Purchase | None
    rows: list[TypeRow]
    candidates: int
    seconds: float
    status: str
    pareto: list[Purchase] | None = None
    mixes_considered: int = 0
    pipeline: object = None  # optimizer.drivers.pipeline_mix.PipelineChoice (heterogeneous: pipeline | all)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- prepare
def procure(pp: ProcureProblem, pareto: bool = False, time_limit_s: float = 60.0) -> ProcureResult:
    t0 = time.perf_counter()
    cache = TablesCache()  # tables at the most GPUs serve every smaller purchase of the same node system
    limits = {t.name: node_limit(pp, t) for t in pp.catalog.node_types}
    todo = [t for t in sorted(pp.catalog.node_types, key=lambda t: -limits[t.name][0] * t.gpus_per_node)
            if not (pp.procure.calibrated_only and t.system.calibration.status() == "prior")]
    with TypePool(todo) as pool:
        return _procure(pp, pareto, time_limit_s, t0, cache, limits, todo, pool)


def _procure(pp, pareto, time_limit_s, t0, cache, limits, todo, pool) -> ProcureResult:
    rows: list[TypeRow] = []
    solved = {}
    with progress("procure: node types", len(todo)) as step:
        for name, out in per_type(pp, todo, "best", {t.name: limits[t.name][0] for t in todo}, time_limit_s,
                                  cache, step, pool):
            solved[name] = out
    for t in pp.catalog.node_types:
        if pp.procure.calibrated_only and t.system.calibration.status() == "prior":
            rows.append(TypeRow(t, 0, "calibrated_only", None, 0, "excluded"))
            continue
        (n, why), (grp, size, status) = limits[t.name], solved[t.name]
        pur = purchase_of(pp, [grp], grp.step_time_s) if grp else None
        rows.append(TypeRow(t, n, why, pur, size, status))
    cands = [r.purchase for r in rows if r.purchase is not None]
    res = ProcureResult(pp, None, rows, sum(r.candidates for r in rows), 0.0, "infeasible")
    if pp.procure.max_types >= 2 and pp.procure.heterogeneous.value in ("pipeline", "all"):
        from optimizer.drivers.pipeline_mix import procure_pipeline

        res.pipeline = procure_pipeline(pp, rows, time_limit_s=time_limit_s)
        if res.pipeline is not None:
            cands.append(res.pipeline.purchase)
    if pp.procure.max_types >= 2 and pp.procure.heterogeneous.value in ("data", "all"):
        from optimizer.drivers.hetero import best_mix

        mix, n_mix = best_mix(pp, rows, time_limit_s=time_limit_s, cache=cache,
                              solve_group=lambda t, n, b: pool.run("group", pp, t, (n, b), time_limit_s, cache))
        res.mixes_considered = n_mix
        if mix is not None:
            cands.append(mix)
    if cands:
        res.best = min(cands, key=lambda p: rank_key(pp, p))
        statuses = {r.status for r in rows if r.purchase is not None}
        if res.pipeline is not None:
            statuses.add(res.pipeline.solution.status)
        res.status = "optimal" if statuses <= {"optimal"} else "feasible"
    if pareto:
        res.pareto = pareto_front(pp, time_limit_s=time_limit_s, cache=cache, pool=pool)
    res.seconds = time.perf_counter() - t0
    return res


def pareto_front(pp: ProcureProblem, points: int = 10, time_limit_s: float = 60.0,
                 cache: TablesCache | None = None, pool: TypePool | None = None) -> list[Purchase]:
    """Cost against time to train: for budgets from the cheapest purchase that fits to the problem's budget,
    the fastest purchase within each (each a proven optimum for its budget), dominated points removed.
    Each node type's work (its cheapest fitting purchase, then its best within every budget) is independent
    of the others' and runs in parallel over types (`per_type`)."""
    types = [t for t in pp.catalog.node_types
             if not (pp.procure.calibrated_only and t.system.calibration.status() == "prior")]
    # the cheapest purchase that fits at all (any speed): fewest GPUs per type
    cheapest = []
    min_nodes: dict[str, int] = {}
    cache = cache if cache is not None else TablesCache()
    with progress("procure: Pareto, cheapest per type", len(types)) as step:
        for name, g in per_type(pp, types, "fewest", {t.name: node_limit(pp, t)[0] for t in types}, time_limit_s,
                                cache, step, pool):
            if g is not None:
                cheapest.append(purchase_of(pp, [g], g.step_time_s))
                min_nodes[name] = g.nodes
    if not cheapest:
        return []
    lo = min(p.cost_usd for p in cheapest)
    hi = pp.procure.budget_usd
    if hi is None:  # no budget: up to the cost of the fastest purchase
        hi = max(lo, max(p.cost_usd for p in cheapest)) * 8
    budgets = sorted({lo * (hi / lo) ** (i / max(1, points - 1)) for i in range(points)}) if hi > lo else [lo]
    found: list[Purchase] = list(cheapest)
    live = [t for t in types if t.name in min_nodes]
    per_budget: dict[float, list[Group]] = {b: [] for b in budgets}
    with progress("procure: Pareto budgets per type", len(live)) as step:
        for name, groups in per_type(pp, live, "budgets", {t.name: (budgets, min_nodes[t.name]) for t in live},
                                     time_limit_s, cache, step, pool):
            for b, g in groups:
                per_budget[b].append(g)
    for b in budgets:
        cands = [purchase_of(pp, [g], g.step_time_s) for g in per_budget[b]]
        if cands:
            found.append(min(cands, key=lambda p: (p.step_time_s, p.cost_usd)))
    front: list[Purchase] = []
    for p in sorted(found, key=lambda p: (p.cost_usd, p.step_time_s)):
        if not front or p.step_time_s < front[-1].step_time_s * (1 - 1e-9):
            front.append(p)
    return front


def type_within_budgets(pp, t, budgets, min_nodes: int, time_limit_s, cache) -> list[tuple[float, Group]]:
    """Type t's fastest purchase within each budget, from the largest budget down: an optimum under a larger
    budget that is also within a smaller one (its nodes and its cost) is that budget's optimum too (the
    smaller budget's purchases are a subset), so it is reused without a solve; a budget below the type's
    fewest fitting nodes is skipped."""
    fast_goal = ProcureGoal.TIME_TO_TRAIN if pp.training.tokens else ProcureGoal.THROUGHPUT
    solved: list[Group] = []
    out = []
    for b in sorted(budgets, reverse=True):
        n, _ = node_limit(pp, t, budget_usd=b * (1 + 1e-9))
        if n < min_nodes:
            continue
        grp = next((g for g in solved if g.nodes <= n
                    and purchase_of(pp, [g], g.step_time_s).cost_usd <= b * (1 + 1e-9)), None)
        if grp is None:
            grp, _, _ = best_of_type(pp, t, n, budget_usd=b * (1 + 1e-9), goal=fast_goal,
                                     time_limit_s=time_limit_s, cache=cache)
            if grp is None:
                continue
            solved.append(grp)
        out.append((b, grp))
    return out


# ---------------------------------------------------------------------------------------------- parallel
_WORKER_CACHE: TablesCache | None = None


def _job(kind: str, pp: ProcureProblem, t, arg, time_limit_s: float, cache: TablesCache):
    if kind == "best":
        return best_of_type(pp, t, arg, time_limit_s=time_limit_s, cache=cache)
    if kind == "group":  # (nodes, global batch): a DP mix's group
        nodes, batch = arg
        return best_of_type(pp, t, nodes, global_batch=batch, time_limit_s=time_limit_s, cache=cache)
    if kind == "fewest":
        fewest = Objective(goal=Goal.FEWEST_GPUS, max_step_time_s=0.99 * BIG_S)  # any speed
        return best_of_type(pp, t, arg, objective=fewest, time_limit_s=time_limit_s, cache=cache)[0]
    budgets, min_nodes = arg
    return type_within_budgets(pp, t, budgets, min_nodes, time_limit_s, cache)


def _chunk(args):
    """A worker's share: its types in order, with one tables cache for the process (types that differ only in
    memory capacities share tables, so they are given to the same worker)."""
    global _WORKER_CACHE
    kind, pp, types, args_by_name, time_limit_s = args
    _WORKER_CACHE = _WORKER_CACHE or TablesCache()
    return [(t.name, _job(kind, pp, t, args_by_name[t.name], time_limit_s, _WORKER_CACHE)) for t in types]


def workers_for(n: int) -> int:
    """Processes for n independent node types: PARAPLAN_WORKERS, else every core, at most n."""
    w = int(os.environ.get("PARAPLAN_WORKERS") or 0) or os.cpu_count() or 1
    return max(1, min(w, n))


class TypePool:
    """Worker processes for per-type work, each node type pinned to one worker for the whole procurement, so
    the tables a worker filled for a type serve it in every later phase (best purchase, cheapest fit, Pareto
    budgets); types that share tables go to the same worker. One worker (or PARAPLAN_WORKERS=1): serial, in
    this process, with the caller's cache."""

    def __init__(self, types: list):
        self.w = workers_for(len(types))
        self.home: dict[str, int] = {}
        self.ex: list = []
        if self.w == 1:
            return
        from optimizer.drivers.pool import process_pool

        by_key: dict[str, list] = {}
        for t in types:
            by_key.setdefault(system_tables_key(t.system), []).append(t)
        load = [0] * self.w
        for grp in sorted(by_key.values(), key=len, reverse=True):  # whole groups while they balance, else split
            if len(grp) > len(types) / self.w:
                for t in grp:
                    k = load.index(min(load))
                    self.home[t.name] = k
                    load[k] += 1
            else:
                k = load.index(min(load))
                for t in grp:
                    self.home[t.name] = k
                load[k] += len(grp)
        self.ex = [process_pool(1) for _ in range(self.w)]

    def run(self, kind: str, pp: ProcureProblem, t, arg, time_limit_s: float, cache: TablesCache):
        """One job on the type's own worker (its tables are there), or here when serial."""
        if self.w == 1 or t.name not in self.home:
            return _job(kind, pp, t, arg, time_limit_s, cache)
        return self.ex[self.home[t.name]].submit(_chunk, (kind, pp, [t], {t.name: arg}, time_limit_s)).result()[0][1]

    def close(self) -> None:
        for e in self.ex:
            e.shutdown()
        self.ex = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def per_type(pp: ProcureProblem, types: list, kind: str, args_by_name: dict, time_limit_s: float,
             cache: TablesCache, step=None, pool: TypePool | None = None):
    """(type name, result) of `kind` for every type: on the pool's workers (each type on its own worker), or
    serially with `cache`."""
    if pool is None or pool.w == 1:
        for t in types:
            out = _job(kind, pp, t, args_by_name[t.name], time_limit_s, cache)
            if step:
                step()
            yield t.name, out
        return
    from concurrent.futures import as_completed

    chunks: dict[int, list] = {}
    for t in types:
        chunks.setdefault(pool.home[t.name], []).append(t)
    futs = [pool.ex[k].submit(_chunk, (kind, pp, c, {t.name: args_by_name[t.name] for t in c}, time_limit_s))
            for k, c in chunks.items()]
    for f in as_completed(futs):
        for name, out in f.result():
            if step:
                step()
            yield name, out


# ---------------------------------------------------------------------------------------------- report
def _purchase_dict(p: Purchase) -> dict:
    from optimizer.report.text import evaluation_dict

    return {
        "label": p.label(), "nodes": p.nodes, "gpus": p.gpus, "cost_usd": p.cost_usd, "power_kw": p.power_kw,
        "step_time_s": p.step_time_s, "tokens_per_s": p.tokens_per_s, "days_to_train": p.days_to_train,
        "tokens_per_s_per_musd": p.tokens_per_s_per_musd(), "sync_s": p.sync_s,
        "groups": [{"node_type": g.node_type.name, "nodes": g.nodes, "gpus_used": g.gpus_used,
                    "global_batch": g.global_batch, "step_time_s": g.step_time_s,
                    "plan": None if g.plan is None else evaluation_dict(g.plan.evaluation)} for g in p.groups],
    }


def result_dict(r: ProcureResult) -> dict:
    pr = r.problem.procure
    return {
        "problem": r.problem.name, "goal": pr.goal.value, "pricing": pr.pricing.value, "budget_usd": pr.budget_usd,
        "power_cap_kw": pr.power_kw, "status": r.status, "solve_time_s": r.seconds, "candidates": r.candidates,
        "best": None if r.best is None else _purchase_dict(r.best),
        "node_types": [{"node_type": x.node_type.name, "max_nodes": x.max_nodes, "bound_by": x.bound_by,
                        "status": x.status, "calibration": x.node_type.system.calibration.status(),
                        "step_time_band_pct": x.node_type.system.calibration.band_pct(r.problem.stack),
                        "calibration_detail": x.node_type.system.calibration.summary(r.problem.stack),
                        "candidates": x.candidates,
                        "best": None if x.purchase is None else {k: v for k, v in _purchase_dict(x.purchase).items()
                                                                 if k != "groups"}} for x in r.rows],
        "mixes_considered": r.mixes_considered,
        "pipeline": None if r.pipeline is None else _pipeline_dict(r.pipeline),
        "pareto": None if r.pareto is None else [{k: v for k, v in _purchase_dict(p).items() if k != "groups"}
                                                 for p in r.pareto],
        "notes": r.notes,
    }


def _pipeline_dict(c) -> dict:
    sol = c.solution
    return {"label": c.purchase.label(), "plan": sol.plan.label(), "status": sol.status, "models": sol.models,
            "solve_time_s": sol.seconds, "step_time_s": sol.result.step_time_s, "cost_usd": c.purchase.cost_usd,
            "parts_s": sol.result.parts_s, "offered": c.offered, "verdict": c.verdict,
            "groups": [{"node_type": g.node_type, "tp": g.tp, "stages": g.stages, "layers_per_stage": g.layers,
                        "recompute": g.recompute.value, "gpus": n, "stage_time_s": t, "hbm_gib": h / 2**30,
                        "capacity_gib": cap / 2**30, "reason": why}
                       for g, n, t, h, cap, why in zip(sol.plan.groups, sol.result.gpus, sol.result.stage_time_s,
                                                       sol.result.hbm_bytes, sol.result.capacity_bytes, c.reasons)],
            "dp": sol.plan.dp, "micro_batch": sol.plan.micro_batch}


def _render_pipeline(c) -> list[str]:
    sol = c.solution
    out = [f"pipelined mix ({', '.join(c.offered)} offered; {sol.models} CP-SAT models, {sol.status}, "
           f"{sol.seconds:.1f} s): {c.purchase.label()}, cost {_money(c.purchase.cost_usd)}, step "
           f"{sol.result.step_time_s:.3f} s; dp {sol.plan.dp}, micro-batch {sol.plan.micro_batch}; stages in "
           "pipeline order:"]
    out += [f"  {x}" for x in c.reasons]
    out.append(f"  {c.verdict}")
    return out


def _within_bands(r: ProcureResult) -> str | None:
    """When the runner-up node type's best purchase is within the stated step-time uncertainties of the best
    (each type's `calibration.band_pct`), say so: the ranking between them is not settled by the model."""
    from optimizer.drivers.purchase import rank_key

    if r.best is None or len(r.best.groups) != 1 or r.problem.procure.goal.value not in ("throughput",
                                                                                         "time_to_train"):
        return None
    best_t = r.best.groups[0].node_type
    others = [x for x in r.rows if x.purchase is not None and x.node_type.name != best_t.name]
    if not others:
        return None
    ru = min(others, key=lambda x: rank_key(r.problem, x.purchase))
    st = r.problem.stack
    b1, b2 = best_t.system.calibration.band_pct(st), ru.node_type.system.calibration.band_pct(st)
    if b1 is None or b2 is None:
        return None
    t1, t2 = r.best.step_time_s, ru.purchase.step_time_s
    if t1 * (1 + b1 / 100) >= t2 * (1 - b2 / 100):
        return (f"the runner-up, {ru.purchase.label()} (step {t2:.3f} s), is within the stated uncertainties "
                f"(+-{b1:.0f}% and +-{b2:.0f}% on step time): the ranking of the two is not settled by the model")
    return None


def _money(x: float) -> str:
    return f"${x / 1e6:,.2f}M" if x >= 1e5 else f"${x:,.0f}"


def render(r: ProcureResult) -> str:
    from optimizer.report.text import render_evaluation

    pp, pr = r.problem, r.problem.procure
    lim = [f"budget {_money(pr.budget_usd)}" if pr.budget_usd else "no budget",
           f"power cap {pr.power_kw:g} kW" if pr.power_kw else None,
           f"deadline {pr.deadline_days:g} days" if pr.deadline_days else None]
    out = [f"paraplan procure: {pp.name or ''}  goal {pr.goal.value} ({pr.pricing.value}; "
           + ", ".join(x for x in lim if x) + f"); {len(pp.catalog.node_types)} node types, "
           f"{r.candidates:,} candidates searched; {r.status}; {r.seconds:.2f} s"]
    out.append("")
    lw = max([len(f"{x.max_nodes} ({x.bound_by})") for x in r.rows] + [5])
    nw = max([len(x.node_type.name) for x in r.rows] + [9])
    out.append(f"{'node type':{nw}s} {'limit':>{lw}s} {'nodes':>6s} {'GPUs':>6s} {'cost':>10s} {'step s':>8s} "
               f"{'tokens/s':>11s} {'tok/s/$M':>9s} {'days':>7s}  calibration, step-time uncertainty")
    for x in r.rows:
        head = f"{x.node_type.name:{nw}s} {f'{x.max_nodes} ({x.bound_by})':>{lw}s}"
        c = x.node_type.system.calibration
        band = c.band_pct(pp.stack)
        cal = c.status() + (f" +-{band:.0f}%" if band is not None else "")
        if x.status == "excluded":
            out.append(f"{head}  excluded: prior-only system (procure.calibrated_only)")
            continue
        if x.purchase is None:
            out.append(f"{head}  nothing fits  [{cal}]")
            continue
        p = x.purchase
        days = f"{p.days_to_train:7.1f}" if p.days_to_train is not None else "      -"
        out.append(f"{head} {p.nodes:6d} {p.groups[0].gpus_used:6d} "
                   f"{_money(p.cost_usd):>10s} {p.step_time_s:8.3f} {p.tokens_per_s:11,.0f} "
                   f"{p.tokens_per_s_per_musd():9,.0f} {days}  [{cal}]")
    if r.mixes_considered:
        out.append(f"heterogeneous mixes evaluated: {r.mixes_considered}")
    if r.pipeline is not None:
        out += _render_pipeline(r.pipeline)
    elif pr.heterogeneous.value in ("pipeline", "all") and pr.max_types >= 2:
        out.append("pipelined mix: none fits within the limits")
    out.append("")
    if r.best is None:
        out.append("NOTHING FITS: no node type of the catalog trains the model within the limits "
                   "(run `paraplan check` on a node type for why)")
        return "\n".join(out)
    b = r.best
    prior = sorted({g.node_type.name for g in b.groups if g.node_type.system.calibration.status() == "prior"})
    if prior:
        out.append(f"WARNING: the best purchase uses prior-only node type(s) {', '.join(prior)}: their "
                   "efficiencies are uncalibrated priors, so this ranking is a guess (procure.calibrated_only: true "
                   "excludes them)")
    out.append(f"BEST: {b.label()} = {b.gpus} GPUs, cost {_money(b.cost_usd)}"
               + (f", power {b.power_kw:,.0f} kW" if b.power_kw is not None else "")
               + f"; step {b.step_time_s:.3f} s, {b.tokens_per_s:,.0f} tokens/s"
               + (f", {b.days_to_train:.1f} days to train {pp.training.tokens:.3g} tokens" if b.days_to_train else ""))
    if b.sync_s:
        out.append(f"  cross-type gradient sync {b.sync_s:.3f} s per step")
    close = _within_bands(r)
    if close:
        out.append(f"  note: {close}")
    for g in b.groups:
        if g.plan is None:
            continue  # a pipelined mix: its stages are listed above
        out += ["", f"=== {g.nodes} x {g.node_type.name} ({g.gpus_used} GPUs used, batch {g.global_batch}): "
                f"step {g.step_time_s:.4f} s ==="]
        out.append(render_evaluation(g.plan.evaluation))
    if r.pareto:
        out += ["", "Pareto front, cost against time to train (each point the fastest purchase within its budget):",
                f"  {'cost':>10s} {'days' if pp.training.tokens else 'step s':>8s}  purchase"]
        for p in r.pareto:
            t = p.days_to_train if p.days_to_train is not None else p.step_time_s
            out.append(f"  {_money(p.cost_usd):>10s} {t:8.2f}  {p.label()}")
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)


def plot_pareto(r: ProcureResult, path: str) -> None:
    """The Pareto front as a PNG (matplotlib, headless): a colour and marker per node type (legend), log-log
    axes (costs and days span decades), the chosen purchase circled, labels offset alternately so they do not
    overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = r.pareto or []
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    tok = r.problem.training.tokens
    xs = [p.cost_usd / 1e6 for p in pts]
    ys = [p.days_to_train if tok else p.step_time_s for p in pts]
    ax.step(xs, ys, where="post", color="0.6", lw=1, zorder=1)
    kinds = sorted({"+".join(g.node_type.name for g in p.groups) for p in pts})
    cmap = plt.get_cmap("tab10")
    markers = "osD^v<>pXh"
    for j, kind in enumerate(kinds):
        sel = [i for i, p in enumerate(pts) if "+".join(g.node_type.name for g in p.groups) == kind]
        prior = any(g.node_type.system.calibration.status() == "prior" for g in pts[sel[0]].groups)
        ax.scatter([xs[i] for i in sel], [ys[i] for i in sel], color=cmap(j % 10), marker=markers[j % len(markers)],
                   s=36, zorder=3, label=kind + (" (prior only: uncalibrated)" if prior else ""))
    for k, (p, x, y) in enumerate(zip(pts, xs, ys)):
        n = sum(g.nodes for g in p.groups)
        ax.annotate(f"{n} node{'s' if n > 1 else ''}", (x, y), fontsize=7, xytext=(6, 8 if k % 2 else -12), textcoords="offset points")
    best = r.best
    if best is not None:
        bx = best.cost_usd / 1e6
        by = best.days_to_train if tok else best.step_time_s
        ax.scatter([bx], [by], s=220, facecolors="none", edgecolors="crimson", linewidths=2, zorder=4,
                   label=f"chosen: {best.label()}")
    if xs and max(xs) / max(min(xs), 1e-9) > 20:
        ax.set_xscale("log")
    if ys and max(ys) / max(min(ys), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("cost, $M" + (" (rental, whole run)" if r.problem.procure.pricing == Pricing.RENTAL else " (capex)"))
    ax.set_ylabel("days to train" if tok else "step time, s")
    ax.set_title(f"{r.problem.name or 'procure'}: cost against time to train (each point proven fastest "
                 "within its budget)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, title="node type", title_fontsize=7, loc="upper right", frameon=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
