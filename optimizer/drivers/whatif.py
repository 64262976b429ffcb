"""`paraplan whatif PROBLEM.yaml`: what +X% of each resource is worth, and the plan that is best in the worst
case over the model's uncertainty.

Resources (each a solve of the changed problem, the fastest plan re-optimised for it): HBM capacity, HBM
bandwidth, matrix FLOP/s (every precision), each network tier's bandwidth, offload capacity and bandwidth
(when the system has offload memory), GPUs (whole nodes). The value of a resource is the step time saved.

Robustness: the efficiency bands are GEMM (matrix) efficiency, HBM efficiency and network efficiency, each
scaled by 1 -/+ `band`. Every part of the step time (compute, memory-bound kernels, collectives, p2p, offload,
the bubble that follows them) is non-increasing in each efficiency, and the composition (sums, maxima of
overlapped parts) keeps that, so for every plan the worst case over the band's 8 corners is the all-low
corner. The plan that is best in the worst case is therefore the proven optimum of one solve, on the system at
that corner: exact over the whole space, not among a short list. The nominal optimum's regret is its own worst
case against the robust plan's. The K best nominal plans (`--top K`) are also evaluated at every corner, which
checks the monotonicity claim on them (`worst_corner_is_low`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass

from optimizer.drivers.purchase import TablesCache
from optimizer.errors import Infeasible, TimeLimit
from optimizer.schema import Problem


@dataclass
class Lever:
    name: str
    problem: Problem
    # the problem the lever is valued against (None: the base problem); the GPU lever compares like with like
    reference: Problem | None = None


def _scale_table(table, f):
    return [[x, min(1.0, y * f)] for x, y in table]


def levers(problem: Problem, pct: float) -> list[Lever]:
    """The changed problems, one per resource, each with +pct% of it."""
    f = 1 + pct / 100
    s = problem.system
    out = [
        Lever(
            f"HBM capacity +{pct:g}%",
            problem.model_copy(update={"system": s.model_copy(update={"hbm_gib": s.hbm_gib * f})}),
        ),
        Lever(
            f"HBM bandwidth +{pct:g}%",
            problem.model_copy(
                update={"system": s.model_copy(update={"hbm_bandwidth_gbps": s.hbm_bandwidth_gbps * f})}
            ),
        ),
        Lever(
            f"matrix FLOP/s +{pct:g}%",
            problem.model_copy(
                update={
                    "system": s.model_copy(
                        update={"matrix_tflops": {k: v * f for k, v in s.matrix_tflops.items()}}
                    )
                }
            ),
        ),
    ]
    for i, net in enumerate(s.networks):
        nets = list(s.networks)
        nets[i] = net.model_copy(update={"bandwidth_gbps": net.bandwidth_gbps * f})
        out.append(
            Lever(
                f"{net.name} bandwidth +{pct:g}%",
                problem.model_copy(update={"system": s.model_copy(update={"networks": nets})}),
            )
        )
    if s.offload.capacity_gib > 0:
        for field, label in (("capacity_gib", "offload capacity"), ("bandwidth_gbps", "offload bandwidth")):
            off = s.offload.model_copy(update={field: getattr(s.offload, field) * f})
            out.append(
                Lever(
                    f"{label} +{pct:g}%",
                    problem.model_copy(update={"system": s.model_copy(update={"offload": off})}),
                )
            )
    out.append(_gpu_lever(problem, pct))
    return out


def _gpu_lever(problem: Problem, pct: float) -> Lever:
    """GPUs: the whole nodes that hold at least +pct% of the problem's GPUs (always more of them), with idle
    GPUs allowed so that the space holds every base plan. Where the problem itself does not allow idle
    GPUs, the lever is valued against the problem with idle GPUs allowed on its own GPUs: the saving is
    that of more GPUs, not of leaving some idle."""
    node = problem.system.gpus_per_node
    more = math.ceil(problem.num_gpus * (1 + pct / 100) / node) * node
    if more <= problem.num_gpus:
        more += node
    opts = problem.options.model_copy(update={"allow_idle_gpus": True})
    if problem.options.allow_idle_gpus:
        return Lever(f"GPUs +{pct:g}% ({more})", problem.model_copy(update={"num_gpus": more}))
    return Lever(
        f"GPUs +{pct:g}% ({more}, idle GPUs allowed)",
        problem.model_copy(update={"num_gpus": more, "options": opts}),
        problem.model_copy(update={"options": opts}),
    )


@dataclass(frozen=True)
class LeverValue:
    """What +pct% of one resource is worth: the best plan's step with it under the problem's objective (s;
    None: nothing fits, or no plan within the time limit) and the time saved against the base problem's
    (s, and % of it); the GPUs the plan uses and how many fewer than the base's (goal fewest_gpus)."""

    name: str
    step_s: float | None
    saved_s: float | None
    saved_pct: float | None
    gpus: int | None = None
    saved_gpus: int | None = None
    # how much the objective's score (`optimizer.prepare.objective.score`) improves: the ranking
    score_saved: float | None = None
    # optimal | feasible (the solve's status); infeasible (nothing fits, proven); time_limit (the command's
    # time limit passed before a plan: not evaluated, or none found)
    status: str = "optimal"


@dataclass(frozen=True)
class RobustPlan:
    """The plan best in the worst case over efficiency bands of +-`band` (module docstring): step times in
    s."""

    band: float
    plans: int  # nominal plans evaluated at every corner (`--top`)
    # the worst-corner solve's status: optimal or feasible; infeasible (proven: no plan meets the problem's
    # memory and targets at the all-low corner) or time_limit (none found in time), with no robust plan
    status: str
    worst_corner_is_low: bool  # every evaluated plan's worst case was the all-low corner
    nominal_worst_s: float  # the nominal optimum's worst case
    robust_worst_s: float | None  # the robust plan's worst case (None: no robust plan)
    robust_plan: dict | None  # the robust plan's execution (JSON form)
    robust_is_nominal: bool
    regret_s: float | None  # the nominal optimum's worst case minus the robust plan's
    robust_nominal_s: float | None  # the robust plan's step at nominal efficiencies
    note: str | None = None  # why there is no robust plan


@dataclass(frozen=True)
class WhatifResult:
    """`paraplan whatif`'s answer: the base problem's fastest step (s), each resource's value (most saved
    first) and the robust plan."""

    base_step_s: float
    pct: float
    levers: list[LeverValue]
    robust: RobustPlan

    def as_dict(self) -> dict:
        """The `--json` object."""
        return dataclasses.asdict(self)


def whatif(
    problem: Problem, pct: float = 20.0, top: int = 10, band: float = 0.1, time_limit_s: float = 60.0
) -> WhatifResult:
    """Each resource's value and the robust plan (module docstring); `time_limit_s` bounds the whole
    command: each solve gets what is left of it, and a lever (or the robust plan) reached after it passed is
    reported as not evaluated (status time_limit)."""
    from optimizer.drivers.evaluate import one_batch_only
    from optimizer.drivers.solve import solve
    from optimizer.prepare.objective import gpus_used
    from optimizer.progress import progress

    if not 0 < band < 1:  # NaN fails too
        raise ValueError(f"band must be a fraction in (0, 1), got {band!r}")
    one_batch_only(problem, "whatif")
    deadline = time.perf_counter() + time_limit_s
    base = solve(problem, top=top, time_limit_s=time_limit_s)
    t0 = base.plans[0].evaluation.result["step_time"]
    n0 = gpus_used(base.plans[0].evaluation.execution)
    rows = []
    lv = levers(problem, pct)
    with progress("whatif: resources", len(lv)) as step:
        for lever in lv:
            step()
            # the GPU lever and its reference (idle GPUs allowed both): one set of tables, at the more GPUs
            cache = TablesCache() if lever.reference is not None else None
            rows.append(_lever_value(lever, t0, n0, deadline, cache))
            if lever.reference is not None and rows[-1].step_s is not None:
                try:
                    ref = _best(lever.reference, deadline, cache)
                except (Infeasible, TimeLimit) as e:
                    why = "time_limit" if isinstance(e, TimeLimit) else "infeasible"
                    rows[-1] = dataclasses.replace(rows[-1], status=why, step_s=None, saved_s=None)
                    continue
                rows[-1] = _lever_value(lever, *ref, deadline, cache)
    # most valuable first under the problem's objective (its score, as the solver ranks plans); then the
    # step time saved; nothing found last
    rows.sort(key=lambda r: (r.score_saved is None, -(r.score_saved or 0.0), -(r.saved_s or 0.0)))
    return WhatifResult(t0, pct, rows, robust(problem, base, band, _left(deadline)))


def _left(deadline: float) -> float:
    """Seconds left until `deadline` (perf_counter s; <= 0: passed)."""
    return deadline - time.perf_counter()


def _solve_within(problem: Problem, deadline: float, cache=None):
    """`solve` within what is left until `deadline`, on the tables of `cache` (a `TablesCache`) when
    given."""
    from optimizer.drivers.solve import solve

    tables = cache.get(problem, deadline=deadline) if cache is not None else None
    if cache is not None and tables is None:
        raise Infeasible("no legal plan", reason="rules")
    return solve(problem, time_limit_s=_left(deadline), tables=tables)


def _best(problem: Problem, deadline: float, cache=None) -> tuple[float, int]:
    """The best plan's step time (s) and GPUs used; TimeLimit once `deadline` (perf_counter s) passed."""
    from optimizer.prepare.objective import gpus_used

    if _left(deadline) <= 0:
        raise TimeLimit("the command's time limit passed")
    ev = _solve_within(problem, deadline, cache).plans[0].evaluation
    return ev.result["step_time"], gpus_used(ev.execution)


def _lever_value(lever: Lever, t0: float, n0: int, deadline: float, cache=None) -> LeverValue:
    """The lever's problem solved under its objective, against the base's step t0 (s) on n0 GPUs, before
    `deadline` (perf_counter s; not solved once it passed); `cache`: tables shared with its reference."""
    from optimizer.prepare.objective import gpus_used, score

    if _left(deadline) <= 0:
        return LeverValue(lever.name, None, None, None, status="time_limit")
    try:
        r = _solve_within(lever.problem, deadline, cache)
    except Infeasible:
        return LeverValue(lever.name, None, None, None, status="infeasible")
    except TimeLimit:
        return LeverValue(lever.name, None, None, None, status="time_limit")
    ev = r.plans[0].evaluation
    t, n = ev.result["step_time"], gpus_used(ev.execution)
    saved = float(score(lever.problem, n0, t0)) - float(score(lever.problem, n, t))
    return LeverValue(lever.name, t, t0 - t, 100 * (t0 - t) / t0, n, n0 - n, saved, r.status)


def _corner(problem: Problem, g: float, h: float, n: float) -> Problem:
    """The problem on a system whose GEMM, HBM and network efficiencies are scaled by g, h, n (capped at
    1)."""
    s = problem.system
    nets = [x.model_copy(update={"efficiency": min(1.0, x.efficiency * n)}) for x in s.networks]
    return problem.model_copy(
        update={
            "system": s.model_copy(
                update={
                    "matrix_efficiency": _scale_table(s.matrix_efficiency, g),
                    "hbm_efficiency": _scale_table(s.hbm_efficiency, h),
                    "networks": nets,
                }
            )
        }
    )


def robust(problem: Problem, base, band: float, time_limit_s: float = 60.0) -> RobustPlan:
    """The plan best in the worst case over the efficiency bands, and the optimum's regret (module
    docstring)."""
    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.drivers.solve import solve

    corners = [_corner(problem, *c) for c in itertools.product((1 - band, 1 + band), repeat=3)]
    low = corners[0]  # (1 - band) on every efficiency: the worst case of every plan
    worst_low = True
    for p in base.plans:
        ts = [evaluate_execution(c, p.evaluation.execution).result["step_time"] for c in corners]
        worst_low &= ts[0] >= max(ts) * (1 - 1e-12)
    nominal = base.plans[0].evaluation.execution
    nominal_worst = evaluate_execution(low, nominal).result["step_time"]
    try:
        if time_limit_s <= 0:
            raise TimeLimit("not solved: the command's time limit passed before it")
        r = solve(low, time_limit_s=time_limit_s)
    except (Infeasible, TimeLimit) as e:
        status = "time_limit" if isinstance(e, TimeLimit) else "infeasible"
        return RobustPlan(
            band=band,
            plans=len(base.plans),
            status=status,
            worst_corner_is_low=bool(worst_low),
            nominal_worst_s=nominal_worst,
            robust_worst_s=None,
            robust_plan=None,
            robust_is_nominal=False,
            regret_s=None,
            robust_nominal_s=None,
            note=str(e),
        )
    ex = r.plans[0].evaluation.execution
    robust_worst = r.plans[0].evaluation.result["step_time"]
    same = ex == nominal or robust_worst >= nominal_worst * (1 - 1e-9)
    return RobustPlan(
        band=band,
        plans=len(base.plans),
        status=r.status,
        worst_corner_is_low=bool(worst_low),
        nominal_worst_s=nominal_worst,
        robust_worst_s=min(robust_worst, nominal_worst),
        robust_plan=(nominal if same else ex).model_dump(mode="json"),
        robust_is_nominal=bool(same),
        regret_s=max(0.0, nominal_worst - robust_worst),
        robust_nominal_s=evaluate_execution(problem, nominal if same else ex).result["step_time"],
    )
