"""`paraplan check`: does the problem fit, why not, and what smallest change would make it fit.

Knobs the problem fixes: every knob written in its `execution` (the run the user means to launch) and the
`search` restrictions. Stages:
1. integer rules (space): if no (tp, pp, dp, cp, vpp, micro-batch) is legal, the solver's minimal conflicting
   set of named groups (`formulations.rules`) is the explanation;
2. the fastest plan that fits (`solve`); if there is one: it fits, with memory per tier and the margin;
3. otherwise memory (`formulations.fit`): the smallest HBM any legal plan needs, and which plan needs it;
4. relaxations, each computed by a solve of the changed problem: smallest HBM per GPU, fewest GPUs, largest
   global batch and sequence length, fixed knobs to release, uneven pipeline splits where the layers do not
   divide the pipeline, offload memory.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from optimizer.errors import Infeasible, Reason
from optimizer.prepare.space import SEARCHABLE
from optimizer.schema import Problem

GIB = 2.0**30


@dataclass
class Relaxation:
    kind: str  # hbm | gpus | global_batch | seq_len | release | uneven | offload
    change: str  # in words
    value: Any
    fits: bool
    step_time_s: float | None = None


@dataclass
class CheckResult:
    problem: Problem
    fixed: dict[str, list]
    fits: bool
    plan: Any = None  # SolveResult when it fits
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (group, words)
    explanation: list[str] = field(default_factory=list)
    min_hbm_gib: float | None = None
    relaxations: list[Relaxation] = field(default_factory=list)
    seconds: float = 0.0
    freed: dict[str, tuple] = field(
        default_factory=dict
    )  # knob: (chosen, default) for knobs the problem left free


def _val(v):
    return v.value if hasattr(v, "value") else v


def fixed_knobs(problem: Problem, written: dict | None) -> dict[str, list]:
    """Knobs fixed by the file: the execution's written keys, narrowed by `search`."""
    out: dict[str, list] = {}
    ex = problem.execution
    for k in written or {}:
        if k in SEARCHABLE:  # a written execution key that the search space has
            out[k] = [_val(getattr(ex, k))]
    for k, rule in problem.user_search_rules().items():  # the file's, not the stack's offer
        if isinstance(rule, dict):
            continue  # ranges stay search restrictions, not fixed values
        vals = [_val(x) for x in (rule if isinstance(rule, list) else [rule])]
        out[k] = [x for x in out[k] if x in vals] if k in out else vals
    return out


def freed_knobs(problem: Problem, fixed: dict[str, list], ex) -> dict[str, tuple]:
    """Searchable knobs the problem did not fix whose chosen value differs from the execution default:
    (chosen, default), so a "fits" never hides a knob the solver moved (cp, say) that the user did not
    write."""
    from optimizer.schema import Execution

    default = Execution()
    out = {}
    for k in SEARCHABLE:
        if k in fixed or k == "dp" or not hasattr(ex, k):
            continue
        got, dflt = _val(getattr(ex, k)), _val(getattr(default, k))
        if k == "etp":
            dflt = dflt if dflt is not None else ex.tp
        if got != dflt:
            out[k] = (got, dflt)
    return out


def with_fixed(problem: Problem, fixed: dict[str, list], **changes) -> Problem:
    # single values and lists of `search` are fixed knobs (`fixed_knobs`): one left out of `fixed` is released
    search = {k: r for k, r in problem.user_search_rules().items() if isinstance(r, dict) or k in fixed}
    for k, vals in fixed.items():
        search[k] = vals if len(vals) != 1 else vals[0]
    return problem.model_copy(update={"search": search, **changes})


def _with_training(problem: Problem, fixed: dict[str, list], **update) -> Problem:
    return with_fixed(problem, fixed, training=problem.training.model_copy(update=update))


def _step(problem: Problem) -> float | None:
    """The fastest step time of a changed problem by `solve` (None: nothing fits). One solve answers both
    "does it fit" and "how fast then"."""
    from optimizer.drivers.solve import solve
    from optimizer.progress import tick

    tick()
    try:
        return solve(problem, "cpsat").plans[0].objective_s
    except Infeasible:
        return None


def _fits(problem: Problem) -> bool:
    return _step(problem) is not None


def _record_if_fits(out: CheckResult, kind: str, change: str, value, q: Problem) -> bool:
    """Add the relaxation (with its fastest step time) when the changed problem `q` fits."""
    st = _step(q)
    if st is None:
        return False
    out.relaxations.append(Relaxation(kind, change, value, True, st))
    return True


def _without(fixed: dict[str, list], *knobs: str) -> dict[str, list]:
    return {k: v for k, v in fixed.items() if k not in knobs}


def check(
    problem: Problem,
    written_execution: dict | None = None,
    offload_gib: float = 512.0,
    offload_gbps: float = 64.0,
) -> CheckResult:
    from optimizer.drivers.evaluate import one_batch_only
    from optimizer.progress import progress

    one_batch_only(problem, "check")
    with progress("check: solves", None):
        return _check(problem, written_execution, offload_gib, offload_gbps)


def _check(
    problem: Problem, written_execution: dict | None, offload_gib: float, offload_gbps: float
) -> CheckResult:
    t0 = time.perf_counter()
    fixed = fixed_knobs(problem, written_execution)
    p = with_fixed(problem, fixed)
    out = CheckResult(problem, fixed, False)
    from optimizer.drivers.solve import solve

    try:
        out.plan = solve(p, "cpsat")
        out.fits = True
        out.freed = freed_knobs(problem, fixed, out.plan.plans[0].evaluation.execution)
    except Infeasible as e:
        if e.reason == Reason.RULES:
            _explain_rules(p, fixed, out)
            _relax_rules(problem, p, fixed, out)
        elif e.reason == Reason.TARGET:
            _explain_target(p, fixed, out)
        else:
            _explain_memory(p, out)
            _relax_memory(problem, p, fixed, out, offload_gib, offload_gbps)
    out.seconds = time.perf_counter() - t0
    return out


# ---------------------------------------------------------------------------------------------- target
def _explain_target(p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Plans fit in memory but none meets the objective's target: name the target, and the best the space
    can do without it (a solve with the target dropped)."""
    from optimizer.schema.problem import Objective

    o = p.objective
    what = (
        f"max_step_time_s = {o.max_step_time_s:g} s"
        if o.max_step_time_s is not None
        else f"max_days = {o.max_days:g} (a step time of {p.step_time_target_s():.4g} s)"
        if o.max_days is not None
        else f"max_gpu_hours = {o.max_gpu_hours:g}"
    )
    free = with_fixed(p, fixed, objective=Objective())
    best = _step(free)
    tail = f"; the fastest plan that fits takes {best:.4g} s per step" if best is not None else ""
    out.conflicts = [("objective.target", f"no plan that fits meets the objective's target ({what}){tail}")]
    out.explanation.append(out.conflicts[0][1])
    if best is not None:
        out.relaxations.append(
            Relaxation("target", f"a step-time target of at least {best:.4g} s", best, True, best)
        )


# ---------------------------------------------------------------------------------------------- rules
def _explain_rules(p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    from formulations import rules

    core = rules.conflict(p, fixed)
    if core is None:  # the rule groups hold together: a search restriction of another knob left no value
        cp_why = _cp_comm_conflict(p, fixed)
        if cp_why:
            out.conflicts = [("fixed.cp_comm", cp_why)]
            out.explanation.append("no legal plan: " + cp_why)
            return
        v_why = _v_schedule_conflict(p, fixed)
        if v_why:
            out.conflicts = [("fixed.schedule", v_why)]
            out.explanation.append("no legal plan: " + v_why)
            return
        out.explanation.append(
            "no legal plan: the integer rules of the space leave no (tp, pp, dp, cp, vpp, micro_batch)"
        )
        return
    out.conflicts = [(g, rules.describe(p, g, fixed)) for g in core]
    n, B = p.num_gpus, p.training.global_batch
    if "rules.batch" in core:
        from optimizer.prepare.space import divisors

        dps = rules.values(p, fixed, "dp", {"rules.batch", "rules.interleave"}, divisors(n))
        out.explanation.append(
            f"global batch {B} cannot be split: no dp in {dps} (what the other rules leave on "
            f"{n} GPUs) divides it" + (" with the fixed micro-batch" if "fixed.micro_batch" in core else "")
        )
    out.explanation.append("no legal plan: these rules conflict: " + "; ".join(t for _, t in out.conflicts))


def _cp_comm_conflict(p: Problem, fixed: dict[str, list]) -> str | None:
    """Why the fixed CP exchanges run on none of the fixed (tp, cp > 1) layouts: the heads an all-to-all
    splits, or the attention Transformer Engine runs only some ways (`layout.cp_comm_codes`,
    `cp_comm_limits`); None when some layout admits one of them, or cp_comm is not fixed."""
    from optimizer.prepare.space import compact_space
    from optimizer.rules.layout import cp_comm_codes, cp_comm_limits
    from optimizer.schema.common import CP_COMM_CODES

    names = fixed.get("cp_comm")
    if not names:
        return None
    lay = compact_space(with_fixed(p, _without(fixed, "cp_comm"))).layouts  # the exchange released
    cps, tps = sorted({x[2] for x in lay}), sorted({x[0] for x in lay})
    if not lay or 1 in cps:  # no layout at all, or one without context parallelism: not the exchange
        return None
    codes = {[c.value for c in CP_COMM_CODES].index(str(n)) for n in names}
    dom = p.system.networks[0].used
    allowed, why = cp_comm_limits(p.llm, p.stack)
    if any(set(cp_comm_codes(p.llm.heads, p.llm.kv, t, c, dom, allowed)) & codes for t in tps for c in cps):
        return None
    if allowed is not None and not (codes & allowed):  # the attention, not the heads
        return f"cp_comm {', '.join(map(str, names))}: {why} in Transformer Engine"
    msg = (
        f"cp_comm {', '.join(map(str, names))} runs on no layout with cp {cps} and tp {tps}: an all-to-all "
        f"needs tp x its degree to divide the {p.llm.heads} heads and {p.llm.kv} K/V heads"
    )
    return msg + (f"; {why}" if why else "")


def _v_schedule_conflict(p: Problem, fixed: dict[str, list]) -> str | None:
    """Why the fixed V schedules (dualpipev, zbv) run on no candidate: they need two stages per rank and at
    least one micro-batch per stage (`optimizer.prepare.space.v_runs_at`); None when some other schedule
    is fixed too, or releasing the schedule leaves no plan either."""
    from optimizer.prepare.space import compact_space
    from optimizer.schema.common import V_SCHEDULES

    names = [str(getattr(n, "value", n)) for n in fixed.get("schedule") or []]
    if not names or any(n not in V_SCHEDULES for n in names):
        return None
    if compact_space(with_fixed(p, _without(fixed, "schedule"))).size == 0:
        return None
    return (
        f"schedule {', '.join(names)} runs two stages per rank (vpp 2) with at least 2 x pp micro-batches "
        f"(global batch {p.training.global_batch} / (dp x micro_batch)) on no layout the other rules leave; "
        "release the schedule or allow vpp 2 and a larger batch"
    )


def _relax_uneven(problem: Problem, fixed: dict[str, list], core: list[str], out: CheckResult) -> None:
    """Where the layers do not divide the pipeline (rules.layers in the conflict) and uneven splits are not
    open: the solve with them open, unless every pipeline the file allows is pp 1 (nothing to split)."""
    if "rules.layers" not in core or True in fixed.get("pp_uneven", []):
        return
    if fixed.get("pp") and max(int(v) for v in fixed["pp"]) == 1:
        return
    st = _step(with_fixed(problem, {**fixed, "pp_uneven": [False, True]}))
    change = "allow uneven pipeline splits (search: {pp_uneven: [false, true]})"
    if "pp_uneven" in fixed:
        change = f"release pp_uneven (fixed to {fixed['pp_uneven']}): uneven pipeline splits"
    out.relaxations.append(Relaxation("uneven", change, True, st is not None, st))


def _relax_rules(problem: Problem, p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    from formulations import rules

    core = [g for g, _ in out.conflicts]
    for g in core:
        if g.startswith("fixed."):
            k = g.split(".", 1)[1]
            st = _step(with_fixed(problem, _without(fixed, k)))
            out.relaxations.append(
                Relaxation("release", f"release {k} (fixed to {fixed[k]})", k, st is not None, st)
            )
    _relax_uneven(problem, fixed, core, out)
    B = p.training.global_batch
    if "rules.batch" in core or "rules.interleave" in core:
        from optimizer.prepare.space import divisors

        dps = rules.values(p, fixed, "dp", {"rules.batch", "rules.interleave"}, divisors(p.num_gpus))
        cands = sorted({(B // d) * d for d in dps if B // d} | {-(-B // d) * d for d in dps})
        below = [b for b in cands if b < B][::-1]
        above = [b for b in cands if b > B]
        for label, seq in (("largest global batch below", below), ("smallest global batch above", above)):
            for b in seq[:6]:
                if _record_if_fits(
                    out,
                    "global_batch",
                    f"{label} {B} that fits: {b}",
                    b,
                    _with_training(problem, fixed, global_batch=b),
                ):
                    break
    if "rules.gpus" in core:
        _nearest_gpus(problem, fixed, out)


# ---------------------------------------------------------------------------------------------- memory
def _explain_memory(p: Problem, out: CheckResult):
    """The memory conflict; returns the smallest-memory plan (formulations.fit.MinMemory)."""
    from formulations.fit import min_memory
    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.model.capacity import capacity_bytes
    from optimizer.model.knobs import to_execution

    mm = min_memory(p)
    cap = capacity_bytes(p) / GIB
    ev = evaluate_execution(p, to_execution(mm.knobs, p.system, rank_order=p.execution.rank_order))
    need = ev.result["hbm"] / GIB
    out.min_hbm_gib = p.hbm_to_hold_gib(need)
    ex = ev.execution
    plan = (
        f"tp={ex.tp} pp={ex.pp} dp={ex.dp} cp={ex.cp} vpp={ex.vpp} micro_batch={ex.micro_batch} "
        f"recompute={_val(ex.recompute)} sp={ex.sequence_parallel} zero={ex.zero}"
    )
    if p.llm.moe is not None:
        plan += f" ep={ex.ep} etp={ex.etp or ex.tp}"
    r = ev.result
    parts = ", ".join(
        f"{k} {r[k] / GIB:.1f}" for k in ("weights", "grads", "optim_state", "activations", "reserved")
    )
    head = f" minus {p.headroom_gib():.1f} GiB headroom" if p.headroom_gib() else ""
    out.conflicts = [
        (
            "memory.hbm",
            f"HBM: every plan needs at least {need:.1f} GiB per GPU (smallest: {plan}; "
            f"{parts} GiB), the GPU has {p.system.hbm_gib:g} GiB{head} = {cap:.1f} GiB",
        )
    ]
    out.explanation.append(out.conflicts[0][1])
    return mm


def _relax_memory(
    problem: Problem,
    p: Problem,
    fixed: dict[str, list],
    out: CheckResult,
    offload_gib: float,
    offload_gbps: float,
) -> None:
    """Memory relaxations of a problem that does not fit, in order: HBM per GPU, GPU count, sequence length,
    global batch, each fixed knob released, the minimal conflicting set of fixed knobs, offload memory."""
    _relax_hbm(problem, fixed, out)
    _relax_gpus(problem, fixed, out)
    _relax_seq_len(problem, p, fixed, out)
    _relax_batch(problem, p, fixed, out)
    _relax_fixed(problem, p, fixed, out)
    # offload memory
    _relax_offload(problem, fixed, out, offload_gib, offload_gbps)


def _relax_hbm(problem: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Smallest HBM per GPU (GiB, rounded up to 0.1) that fits, and the step time there."""
    if out.min_hbm_gib is not None:
        hbm = math.ceil(out.min_hbm_gib * 10 + 1e-9) / 10
        q = with_fixed(problem, fixed, system=problem.system.model_copy(update={"hbm_gib": hbm}))
        st = _step(q)
        out.relaxations.append(
            Relaxation("hbm", f"HBM per GPU of at least {hbm:g} GiB", hbm, st is not None, st)
        )


def _relax_seq_len(problem: Problem, p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Largest sequence length (tokens) that fits: memory grows with it, so a bisection over multiples of
    128 below the problem's own."""
    S = p.seq_len

    def seq_fits(s_: int) -> bool:
        return _fits(_with_training(problem, fixed, seq_len=s_))

    lo, hi, best = 0, S // 128, None
    if S > 128 and not seq_fits(128):
        hi = 0  # not even the shortest: the sequence is not the problem
    while lo < hi:
        mid = (lo + hi + 1) // 2
        s_ = mid * 128
        if s_ < S and seq_fits(s_):
            lo, best = mid, s_
        else:
            hi = mid - 1
    if best:
        out.relaxations.append(
            Relaxation(
                "seq_len",
                f"largest sequence length that fits (multiple of 128): {best}",
                best,
                True,
                _step(_with_training(problem, fixed, seq_len=best)),
            )
        )
    else:
        out.relaxations.append(
            Relaxation("seq_len", "no shorter sequence (multiple of 128) fits", None, False)
        )


def _relax_batch(problem: Problem, p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Largest global batch B/2^k that fits (in-flight micro-batches shrink with fewer of them): halving."""
    B = p.training.global_batch
    b = B // 2

    def batch_fits(b_: int) -> bool:
        return _fits(_with_training(problem, fixed, global_batch=b_))

    if b >= 1 and not batch_fits(1):
        b = 0  # not even a single sequence: the batch is not the problem
    while b >= 1:
        if _record_if_fits(
            out,
            "global_batch",
            f"largest global batch B/2^k that fits: {b}",
            b,
            _with_training(problem, fixed, global_batch=b),
        ):
            break
        b //= 2
    else:
        out.relaxations.append(Relaxation("global_batch", f"no global batch {B}/2^k fits", None, False))


def _relax_fixed(problem: Problem, p: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Each fixed knob released on its own, then the minimal conflicting set: memory.hbm and the fixed
    knobs it needs (deletion filter: a knob whose release still leaves nothing that fits is not part of
    the conflict, and stays released)."""
    for k in fixed:
        _record_if_fits(
            out, "release", f"release {k} (fixed to {fixed[k]})", k, with_fixed(problem, _without(fixed, k))
        )
    # the minimal conflicting set: memory.hbm and the fixed knobs it needs (deletion filter: a knob whose
    # release still leaves nothing that fits is not part of the conflict, and stays released)
    keep = dict(fixed)
    for k in list(fixed):
        trial = _without(keep, k)
        if not _fits(with_fixed(problem, trial)):
            keep = trial
    from formulations import rules

    out.conflicts += [(f"fixed.{k}", rules.describe(p, f"fixed.{k}", fixed)) for k in keep]
    if keep:
        out.explanation.append(
            "with these knobs fixed: "
            + ", ".join(f"{k}={v[0] if len(v) == 1 else v}" for k, v in keep.items())
        )
    else:
        out.explanation.append("no fixed knob is to blame: nothing in the whole space fits")


def _relax_gpus(problem: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Fewest GPUs (multiples of a node) that fit: the first fitting of N*{1.25..8}, then refined
    downwards."""
    n, node = problem.num_gpus, problem.system.gpus_per_node
    fixed_n = _without(fixed, "dp")  # dp follows the GPU count

    def fits(m: int) -> bool:
        return _fits(with_fixed(problem, fixed_n, num_gpus=m))

    grid = sorted({max(node, int(round(n * f / node)) * node) for f in (1.25, 1.5, 2, 3, 4, 6, 8)} - {n})
    prev, found = n, None
    for m in grid:
        if m > n and fits(m):
            found = m
            break
        prev = max(prev, m)
    if found is None:
        out.relaxations.append(
            Relaxation("gpus", f"no GPU count up to {8 * n} (multiples of {node}) fits", None, False)
        )
        return
    step = max(node, ((found - prev) // 8 // node) * node)
    for m in range(prev + step, found, step):
        if fits(m):
            found = m
            break
    _record_if_fits(
        out,
        "gpus",
        f"fewest GPUs that fit (multiples of {node} tried between {prev} and {found}): {found}",
        found,
        with_fixed(problem, fixed_n, num_gpus=found),
    )


def _nearest_gpus(problem: Problem, fixed: dict[str, list], out: CheckResult) -> None:
    """Nearest GPU counts (multiples of a node, up to 64 nodes away) below and above that fit."""
    n, node = problem.num_gpus, problem.system.gpus_per_node
    fixed_n = _without(fixed, "dp")  # dp follows the GPU count
    below = range(n - n % node if n % node else n - node, max(0, n - 64 * node), -node)
    above = range((n // node + 1) * node, n + 64 * node + 1, node)
    for label, seq in (("largest GPU count below", below), ("smallest GPU count above", above)):
        for m in seq:
            if _record_if_fits(
                out, "gpus", f"{label} {n} that fits: {m}", m, with_fixed(problem, fixed_n, num_gpus=m)
            ):
                break
        else:
            out.relaxations.append(
                Relaxation("gpus", f"no {label.split(' ', 1)[1]} {n} within 64 nodes fits", None, False)
            )


def _relax_offload(
    problem: Problem, fixed: dict[str, list], out: CheckResult, offload_gib: float, offload_gbps: float
) -> None:
    """Would `offload_gib` of offload memory per GPU at `offload_gbps` make it fit? A solve of the problem
    with that offload tier, the fixed knobs kept and the offload flags free (the solver decides what to
    offload)."""
    sysm = problem.system
    off = sysm.offload.model_copy(
        update={
            "capacity_gib": max(sysm.offload.capacity_gib, offload_gib),
            "bandwidth_gbps": sysm.offload.bandwidth_gbps or offload_gbps,
        }
    )
    free = _without(fixed, "weight_offload", "activation_offload", "optimizer_offload")
    q = with_fixed(problem, free, system=sysm.model_copy(update={"offload": off}))
    from optimizer.drivers.solve import solve

    try:
        plan = solve(q, "cpsat").plans[0]
    except Infeasible:
        out.relaxations.append(
            Relaxation(
                "offload",
                f"offload memory of {off.capacity_gib:g} GiB per GPU at "
                f"{off.bandwidth_gbps:g} GB/s would not make anything fit",
                off.capacity_gib,
                False,
            )
        )
        return
    ex, used = plan.evaluation.execution, plan.evaluation.result["offload_mem"] / GIB
    names = [
        n
        for n, f in (
            ("weights", ex.weight_offload),
            ("activations", ex.activation_offload),
            ("optimizer state", ex.optimizer_offload),
        )
        if f
    ]
    out.relaxations.append(
        Relaxation(
            "offload",
            f"offloading {', '.join(names)} ({used:.1f} GiB of "
            f"{off.capacity_gib:g} GiB offload memory per GPU at {off.bandwidth_gbps:g} "
            "GB/s)",
            round(used, 2),
            True,
            plan.objective_s,
        )
    )
