"""`paraplan solve` of a batch-size schedule (`training.phases`): one proven plan per phase on the same GPUs.

Each phase is the problem with its own batch, sequence length and tokens, solved by
`optimizer.drivers.solve` under the problem's objective (step time, or expected time with failures). Between
two phases whose plans differ the job stops, checkpoints and restarts in the new layout (a re-layout: the
restart time, one checkpoint write and its reload, `optimizer.model.goodput`). The expected time and cost
to train are the phases' sums; their P10-P90 band adds the phases' variances (independent failures).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from optimizer.schema import Problem


@dataclass
class PhasedTotals:
    """Sums over the phases (s, kWh, USD; None where a phase lacks the figure)."""

    failure_free_time_s: float
    expected_time_to_train_s: float
    p10_time_to_train_s: float
    p90_time_to_train_s: float
    relayouts: int
    relayout_s: float
    energy_kwh: float | None
    expected_cost_usd: float | None


def phase_problems(problem: Problem) -> list[Problem]:
    """The problem of each phase: its batch, sequence length and tokens, named `name#N`."""
    return [
        problem.model_copy(update={"training": tr, "name": f"{problem.name or 'problem'}#{i + 1}"})
        for i, tr in enumerate(problem.training.phase_trainings())
    ]


def relayout_s(problem: Problem, before, after) -> float:
    """The cost of changing plans between phases, s: one checkpoint write by the old layout (synchronous: the
    job stops), a restart, and the reload by the new one; 0 when the plan does not change."""
    from optimizer.model import goodput as G

    if before.execution == after.execution:
        return 0.0
    from optimizer.prepare.objective import gpus_used

    inp = G.problem_inputs(problem)
    t = problem.training
    c = G.checkpoint_bytes(problem.llm, t.precision, t.master_weights)
    g = problem.system.gpus_per_node
    write = G.checkpoint_cost(inp, c, gpus_used(before.execution), g).write_s
    reload = G.checkpoint_cost(inp, c, gpus_used(after.execution), g).reload_s
    return inp.reliability.restart_s + float(write) + float(reload)


def relayout_kwh(problem: Problem, seconds: float, nodes: int) -> float | None:
    """Energy of `nodes` nodes waiting `seconds` on a re-layout (the idle draw, times PUE), kWh."""
    from optimizer.model import goodput as G

    rated = G.node_rated_w(problem.system)
    if rated is None:
        return None
    idle = rated * G.defaults()["power"]["idle_of_rated"]
    return nodes * idle * seconds * G.problem_inputs(problem).energy.pue / 3.6e6


def _sum(xs) -> float | None:
    xs = list(xs)
    return None if any(x is None for x in xs) else sum(xs)


def totals(problem: Problem, evaluations: list) -> PhasedTotals:
    """`PhasedTotals` of the phases' evaluations, in order."""
    from optimizer.model import goodput as G

    gs = [ev.goodput for ev in evaluations]
    moves = [relayout_s(problem, a, b) for a, b in zip(evaluations, evaluations[1:], strict=False)]
    nodes = -(-problem.num_gpus // problem.system.gpus_per_node)  # every node waits on a re-layout
    move_kwh = relayout_kwh(problem, sum(moves), nodes)
    energy = _sum(g.energy_kwh for g in gs)
    cost = _sum(g.expected_cost_usd for g in gs)
    if energy is not None and move_kwh is not None:
        energy += move_kwh
        rented = any(g.compute_usd and g.energy_usd == 0 for g in gs)  # the rent includes the power
        if cost is not None and not rented:
            cost += move_kwh * G.problem_inputs(problem).energy.usd_per_kwh
    mean = sum(g.expected_time_to_train_s for g in gs) + sum(moves)
    # each phase's band is mean -+ z sd: its variance back from the P90 half-width
    var = sum(((g.p90_time_to_train_s - g.expected_time_to_train_s) / 1.2815515655446004) ** 2 for g in gs)
    sd = math.sqrt(var)
    return PhasedTotals(
        failure_free_time_s=sum(g.failure_free_time_s for g in gs),
        expected_time_to_train_s=mean,
        p10_time_to_train_s=mean - 1.2815515655446004 * sd,
        p90_time_to_train_s=mean + 1.2815515655446004 * sd,
        relayouts=sum(m > 0 for m in moves),
        relayout_s=sum(moves),
        energy_kwh=energy,
        expected_cost_usd=cost,
    )


def solve_phases(problem: Problem, solve, kw: dict):
    """Solve each phase (`solve(problem, **kw)`), then one `SolveResult` whose plans are the phases' best,
    in order, with `phases` (the phase problems) and `phased` (`PhasedTotals`); `--top` is one per phase."""
    t0 = time.perf_counter()
    results = []
    for q in phase_problems(problem):
        results.append(solve(q, **(kw | {"top": 1})))
    first = results[0]
    plans = [r.plans[0] for r in results]
    notes = [f"phase {i + 1}: {n}" for i, r in enumerate(results) for n in r.notes]
    out = type(first)(
        first.method,
        "optimal" if all(r.status == "optimal" for r in results) else "feasible",
        plans,
        sum(r.candidates for r in results),
        None,
        time.perf_counter() - t0,
        notes=notes,
    )
    out.phased = totals(problem, [p.evaluation for p in plans])
    return out
