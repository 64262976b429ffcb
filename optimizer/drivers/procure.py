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

from optimizer.drivers.purchase import (
    Group,
    Purchase,
    TablesCache,
    TypeRow,
    best_of_type,
    node_limit,
    purchase_of,
    rank_key,
    system_tables_key,
    time_key,
)
from optimizer.errors import TimeLimit
from optimizer.model import bands
from optimizer.prepare.objective import BIG_S
from optimizer.progress import progress
from optimizer.schema.problem import Goal, Objective
from optimizer.schema.procure import ProcureGoal, ProcureProblem


@dataclass(frozen=True)
class Deadline:
    """The end of the command's time limit as a wall-clock time (`time.time()`, s: worker processes read
    the same clock), so that every solve of every phase gets only what is left of one `--time-limit`."""

    at: float

    @staticmethod
    def after(seconds: float) -> Deadline:
        return Deadline(time.time() + seconds)

    def left(self) -> float:
        """Seconds left (<= 0: passed)."""
        return self.at - time.time()


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
    runner_up_note: str | None = None  # the runner-up type is within the step-time bands (`_within_bands`)

    @property
    def not_searched(self) -> list[str]:
        """The requested search families that were not searched, each with its reason (from `notes`)."""
        return [n for n in self.notes if " not searched: " in n]


# ---------------------------------------------------------------------------------------------- prepare
def procure(pp: ProcureProblem, pareto: bool = False, time_limit_s: float = 60.0) -> ProcureResult:
    choices = pp.goodput.spare_choices() if pp.goodput is not None else [None]
    if len(choices) > 1:
        return _choose_spares(pp, choices, pareto, time_limit_s)
    t0 = time.perf_counter()
    cache = TablesCache()  # tables at the most GPUs serve every smaller purchase of the same node system
    limits = {t.name: node_limit(pp, t) for t in pp.catalog.node_types}
    todo = [
        t
        for t in sorted(pp.catalog.node_types, key=lambda t: -limits[t.name][0] * t.gpus_per_node)
        if not (pp.procure.calibrated_only and t.system.calibration.status() == "prior")
    ]
    with TypePool(todo) as pool:
        return _procure(pp, pareto, Deadline.after(time_limit_s), t0, cache, limits, todo, pool)


def _choose_spares(pp: ProcureProblem, choices: list, pareto: bool, time_limit_s: float) -> ProcureResult:
    """Spare nodes as a decision: the whole procurement once per offered count (spares bought with the
    purchase, within its budget and power), the best purchase over the counts by the goal's ranking
    (`rank_key`); exact, since each count's answer is proven. All within one `time_limit_s`."""
    t0 = time.perf_counter()
    dl = Deadline.after(time_limit_s)
    done: list[tuple[int, ProcureResult]] = []
    skipped = []
    for s in choices:
        q = pp.model_copy(update={"goodput": pp.goodput.model_copy(update={"spare_nodes": s})})
        if dl.left() <= 0:
            skipped.append(s)
            continue
        try:
            done.append((s, procure(q, pareto, max(0.01, dl.left()))))
        except TimeLimit:
            skipped.append(s)
    if not done:
        raise TimeLimit(
            f"procure: the time limit ({time_limit_s:g} s) passed before any spare-node count was solved: "
            "not a proof that nothing fits; raise --time-limit"
        )
    fits = [(s, r) for s, r in done if r.best is not None]
    s_best, best = min(fits, key=lambda x: rank_key(x[1].problem, x[1].best)) if fits else done[0]
    if fits:  # of counts as good within 0.1% (more spares past the need add nothing), the cheapest
        top = rank_key(best.problem, best.best)[0]
        near = [(s, r) for s, r in fits if rank_key(r.problem, r.best)[0] <= top + 1e-3 * abs(top)]
        s_best, best = min(near, key=lambda x: (x[1].best.cost_usd, x[0]))
    lines = [
        f"{s} spare node{'' if s == 1 else 's'}: "
        + (
            "nothing fits"
            if r.best is None
            else f"{r.best.label()}, {_money(r.best.cost_usd)}, expected "
            f"{r.best.goodput.expected_time_to_train_s / 86400:.2f} days"
            if r.best.goodput is not None
            else f"{r.best.label()}, {_money(r.best.cost_usd)}"
        )
        for s, r in done
    ]
    best.notes = (
        [
            f"spare nodes chosen from {choices}: {s_best}, the cheapest within 0.1% of the best (each count "
            "solved in full; " + "; ".join(lines) + ")"
        ]
        + ([f"spare-node counts not solved within the time limit: {skipped}"] if skipped else [])
        + best.notes
    )
    if skipped or any(r.status != "optimal" for _, r in done):
        best.status = "feasible" if best.best is not None else best.status
    best.candidates = sum(r.candidates for _, r in done)
    best.seconds = time.perf_counter() - t0
    return best


def _money(usd: float) -> str:
    return f"${usd / 1e6:,.2f}M"


def _procure(pp, pareto, dl: Deadline, t0, cache, limits, todo, pool) -> ProcureResult:
    """The phases (per type, pipelined mix, data-parallel mixes, Pareto front), each solve within what is
    left of the deadline `dl`; a phase cut short by it leaves a note and the status feasible, and no plan
    at all is TimeLimit (exit 4), never "nothing fits"."""
    rows: list[TypeRow] = []
    solved = {}
    with progress("procure: node types", len(todo)) as step:
        for name, out in per_type(
            pp, todo, "best", {t.name: limits[t.name][0] for t in todo}, dl, cache, step, pool
        ):
            solved[name] = out
    for t in pp.catalog.node_types:
        if pp.procure.calibrated_only and t.system.calibration.status() == "prior":
            rows.append(TypeRow(t, 0, "calibrated_only", None, 0, "excluded"))
            continue
        (n, why), (grp, size, status) = limits[t.name], solved[t.name]
        pur = purchase_of(pp, [grp], grp.step_time_s) if grp else None
        rows.append(TypeRow(t, n, why, pur, size, status))
    cands = [r.purchase for r in rows if r.purchase is not None]
    # a type whose solve the time limit stopped before any plan: unknown, not "nothing fits"
    timed_out = [r.node_type.name for r in rows if r.status == "time_limit"]
    res = ProcureResult(pp, None, rows, sum(r.candidates for r in rows), 0.0, "infeasible")
    if timed_out:
        res.notes.append(f"node types not solved within the time limit: {', '.join(timed_out)}")
    cut = bool(timed_out)  # some phase was cut short by the deadline
    if pp.procure.max_types >= 2 and pp.procure.heterogeneous.value in ("pipeline", "all"):
        cut |= _pipeline_phase(pp, rows, res, cands, dl)
    if pp.procure.max_types >= 2 and pp.procure.heterogeneous.value in ("data", "all"):
        from optimizer.drivers.hetero import best_mix

        mix, n_mix = best_mix(
            pp,
            rows,
            time_limit_s=max(0.01, dl.left()),
            cache=cache,
            solve_group=lambda t, n, b: pool.run("group", pp, t, (n, b), dl, cache),
        )
        res.mixes_considered = n_mix
        if mix is not None:
            cands.append(mix)
        if dl.left() <= 0:
            cut = True
            res.notes.append("two-type mixes: the time limit passed before every mix was solved")
    if cands:
        res.best = min(cands, key=lambda p: rank_key(pp, p))
        statuses = {r.status for r in rows if r.purchase is not None}
        if res.pipeline is not None:
            statuses.add(res.pipeline.solution.status)
        res.status = "optimal" if statuses <= {"optimal"} and not cut else "feasible"
    elif cut:
        why = "; ".join(res.notes)
        raise TimeLimit(
            f"procure: the time limit passed before any purchase was found ({why}): not a proof that nothing "
            "fits; raise --time-limit"
        )
    res.runner_up_note = _within_bands(res)
    if pareto:
        res.pareto = pareto_front(
            pp, cache=cache, pool=pool, include=[res.best] if res.best else [], deadline=dl, notes=res.notes
        )
    res.seconds = time.perf_counter() - t0
    return res


def _pipeline_phase(pp, rows, res: ProcureResult, cands: list, dl: Deadline) -> bool:
    """The pipelined mix within what is left of `dl` (its purchase appended to `cands`); True when the
    time limit cut it short."""
    from optimizer.drivers.pipeline_mix import procure_pipeline

    if dl.left() <= 0:
        res.notes.append("pipelined mixes not searched: the time limit passed before them")
        return True
    try:
        res.pipeline = procure_pipeline(pp, rows, time_limit_s=dl.left(), notes=res.notes)
    except TimeLimit as e:
        res.notes.append(f"{e} (a longer --time-limit may find one)")
        return True
    if res.pipeline is not None:
        cands.append(res.pipeline.purchase)
    return False


def pareto_front(
    pp: ProcureProblem,
    points: int = 10,
    time_limit_s: float = 60.0,
    cache: TablesCache | None = None,
    pool: TypePool | None = None,
    include: list[Purchase] | None = None,
    deadline: Deadline | None = None,
    notes: list[str] | None = None,
) -> list[Purchase]:
    """Cost against time to train: for budgets from the cheapest purchase that fits to the problem's budget,
    the fastest single-type purchase within each (each a proven optimum for its budget), and the purchases
    `include` (procure's best: a mix or pipeline at the problem's budget), dominated points removed.
    Each node type's work (its cheapest fitting purchase, then its best within every budget) is independent
    of the others' and runs in parallel over types (`per_type`). `deadline` (default: `time_limit_s` from
    now) bounds all of it; a front cut short by it says so in `notes`."""
    dl = deadline or Deadline.after(time_limit_s)
    types = [
        t
        for t in pp.catalog.node_types
        if not (pp.procure.calibrated_only and t.system.calibration.status() == "prior")
    ]
    # the cheapest purchase that fits at all (any speed): fewest GPUs per type
    cheapest = []
    min_nodes: dict[str, int] = {}
    cache = cache if cache is not None else TablesCache()
    with progress("procure: Pareto, cheapest per type", len(types)) as step:
        for name, g in per_type(
            pp,
            types,
            "fewest",
            {t.name: node_limit(pp, t)[0] for t in types},
            dl,
            cache,
            step,
            pool,
        ):
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
    found: list[Purchase] = list(cheapest) + list(include or [])
    live = [t for t in types if t.name in min_nodes]
    per_budget: dict[float, list[Group]] = {b: [] for b in budgets}
    with progress("procure: Pareto budgets per type", len(live)) as step:
        for _name, groups in per_type(
            pp,
            live,
            "budgets",
            {t.name: (budgets, min_nodes[t.name]) for t in live},
            dl,
            cache,
            step,
            pool,
        ):
            for b, g in groups:
                per_budget[b].append(g)
    for b in budgets:
        cands = [purchase_of(pp, [g], g.step_time_s) for g in per_budget[b]]
        if cands:
            found.append(min(cands, key=lambda p: (time_key(pp, p), p.cost_usd)))
    if dl.left() <= 0 and notes is not None:
        notes.append("Pareto front: the time limit passed before every budget was solved (points missing)")
    front: list[Purchase] = []
    for p in sorted(found, key=lambda p: (p.cost_usd, time_key(pp, p))):
        if not front or time_key(pp, p) < time_key(pp, front[-1]) * (1 - 1e-9):
            front.append(p)
    return front


def type_within_budgets(pp, t, budgets, min_nodes: int, dl: Deadline, cache) -> list[tuple[float, Group]]:
    """Type t's fastest purchase within each budget, from the largest budget down: an optimum under a larger
    budget that is also within a smaller one (its nodes and its cost) is that budget's optimum too (the
    smaller budget's purchases are a subset), so it is reused without a solve; a budget below the type's
    fewest fitting nodes is skipped, and so is every budget still to solve once the deadline `dl` passed."""
    fast_goal = ProcureGoal.TIME_TO_TRAIN if pp.training.tokens else ProcureGoal.THROUGHPUT
    solved: list[Group] = []
    out = []
    for b in sorted(budgets, reverse=True):
        n, _ = node_limit(pp, t, budget_usd=b * (1 + 1e-9))
        if n < min_nodes:
            continue
        grp = next(
            (
                g
                for g in solved
                if g.nodes <= n and purchase_of(pp, [g], g.step_time_s).cost_usd <= b * (1 + 1e-9)
            ),
            None,
        )
        if grp is None:
            if dl.left() <= 0:
                break
            grp, _, _ = best_of_type(
                pp, t, n, budget_usd=b * (1 + 1e-9), goal=fast_goal, time_limit_s=dl.left(), cache=cache
            )
            if grp is None:
                continue
            solved.append(grp)
        out.append((b, grp))
    return out


# ---------------------------------------------------------------------------------------------- parallel
_WORKER_CACHE: TablesCache | None = None


def _job(kind: str, pp: ProcureProblem, t, arg, dl: Deadline, cache: TablesCache):
    """One type's work of a phase within what is left of `dl`: once it passed, or when the solve stops
    before any plan, "best" and "group" answer (None, 0, "time_limit"), "fewest" None, "budgets" what it
    solved."""
    left = dl.left()
    if kind == "budgets":
        budgets, min_nodes = arg
        return type_within_budgets(pp, t, budgets, min_nodes, dl, cache)
    if left <= 0:
        return None if kind == "fewest" else (None, 0, "time_limit")
    try:
        if kind == "best":
            return best_of_type(pp, t, arg, time_limit_s=left, cache=cache)
        if kind == "group":  # (nodes, global batch): a DP mix's group
            nodes, batch = arg
            return best_of_type(pp, t, nodes, global_batch=batch, time_limit_s=left, cache=cache)
        fewest = Objective(goal=Goal.FEWEST_GPUS, max_step_time_s=0.99 * BIG_S)  # any speed
        return best_of_type(pp, t, arg, objective=fewest, time_limit_s=left, cache=cache)[0]
    except TimeLimit:
        return None if kind == "fewest" else (None, 0, "time_limit")


def _chunk(args):
    """A worker's share: its types in order, with one tables cache for the process (types that differ only in
    memory capacities share tables, so they are given to the same worker)."""
    global _WORKER_CACHE
    kind, pp, types, args_by_name, dl = args
    _WORKER_CACHE = _WORKER_CACHE or TablesCache()
    return [(t.name, _job(kind, pp, t, args_by_name[t.name], dl, _WORKER_CACHE)) for t in types]


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
        for grp in sorted(
            by_key.values(), key=len, reverse=True
        ):  # whole groups while they balance, else split
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

    def run(self, kind: str, pp: ProcureProblem, t, arg, dl: Deadline, cache: TablesCache):
        """One job on the type's own worker (its tables are there), or here when serial."""
        if self.w == 1 or t.name not in self.home:
            return _job(kind, pp, t, arg, dl, cache)
        return self.ex[self.home[t.name]].submit(_chunk, (kind, pp, [t], {t.name: arg}, dl)).result()[0][1]

    def close(self) -> None:
        for e in self.ex:
            e.shutdown()
        self.ex = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def per_type(
    pp: ProcureProblem,
    types: list,
    kind: str,
    args_by_name: dict,
    dl: Deadline,
    cache: TablesCache,
    step=None,
    pool: TypePool | None = None,
):
    """(type name, result) of `kind` for every type: on the pool's workers (each type on its own worker), or
    serially with `cache`."""
    if pool is None or pool.w == 1:
        for t in types:
            out = _job(kind, pp, t, args_by_name[t.name], dl, cache)
            if step:
                step()
            yield t.name, out
        return
    from concurrent.futures import as_completed

    chunks: dict[int, list] = {}
    for t in types:
        chunks.setdefault(pool.home[t.name], []).append(t)
    futs = [
        pool.ex[k].submit(_chunk, (kind, pp, c, {t.name: args_by_name[t.name] for t in c}, dl))
        for k, c in chunks.items()
    ]
    for f in as_completed(futs):
        for name, out in f.result():
            if step:
                step()
            yield name, out


def _within_bands(r: ProcureResult) -> str | None:
    """When the runner-up node type's best purchase is within the stated step-time uncertainties of the best
    (each type's `bands.band_pct`), say so: the ranking between them is not settled by the model."""
    from optimizer.drivers.purchase import rank_key

    if (
        r.best is None
        or len(r.best.groups) != 1
        or r.problem.procure.goal.value not in ("throughput", "time_to_train")
    ):
        return None
    best_t = r.best.groups[0].node_type
    others = [x for x in r.rows if x.purchase is not None and x.node_type.name != best_t.name]
    if not others:
        return None
    ru = min(others, key=lambda x: rank_key(r.problem, x.purchase))
    st = r.problem.stack
    kind = bands.kind_of(r.problem.llm)
    b1, b2 = bands.band_pct(best_t.system, st, kind), bands.band_pct(ru.node_type.system, st, kind)
    if b1 is None or b2 is None:
        return None
    t1, t2 = r.best.step_time_s, ru.purchase.step_time_s
    if t1 * (1 + b1 / 100) >= t2 * (1 - b2 / 100):
        return (
            f"the runner-up, {ru.purchase.label()} (step {t2:.3f} s), is within the stated uncertainties "
            f"(+-{b1:.0f}% and +-{b2:.0f}% on step time): the ranking of the two is not settled by the model"
        )
    return None
