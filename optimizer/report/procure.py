"""`paraplan procure`'s report: a `ProcureResult` as a JSON object and as text (per node type its limit and
best purchase, costs in USD, step times in s, days to train; the best purchase and its plan; the Pareto
front)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from optimizer.model import bands

if TYPE_CHECKING:
    from optimizer.drivers.procure import ProcureResult
    from optimizer.drivers.purchase import Purchase


def _purchase_dict(p: Purchase) -> dict:
    from optimizer.report.goodput import goodput_dict
    from optimizer.report.text import evaluation_dict

    return {
        "label": p.label(),
        "nodes": p.nodes,
        "gpus": p.gpus,
        "cost_usd": p.cost_usd,
        "power_kw": p.power_kw,
        "step_time_s": p.step_time_s,
        "tokens_per_s": p.tokens_per_s,
        "days_to_train": p.days_to_train,
        "tokens_per_s_per_musd": p.tokens_per_s_per_musd(),
        "sync_s": p.sync_s,
        "spare_nodes": p.spare_nodes,
        "goodput": None if p.goodput is None else goodput_dict(p.goodput),
        "groups": [
            {
                "node_type": g.node_type.name,
                "nodes": g.nodes,
                "gpus_used": g.gpus_used,
                "global_batch": g.global_batch,
                "step_time_s": g.step_time_s,
                "plan": None if g.plan is None else evaluation_dict(g.plan.evaluation),
            }
            for g in p.groups
        ],
    }


def result_dict(r: ProcureResult) -> dict:
    pr = r.problem.procure
    return {
        "problem": r.problem.name,
        "goal": pr.goal.value,
        "pricing": pr.pricing.value,
        "budget_usd": pr.budget_usd,
        "power_cap_kw": pr.power_kw,
        "status": r.status,
        "solve_time_s": r.seconds,
        "candidates": r.candidates,
        "best": None if r.best is None else _purchase_dict(r.best),
        "best_prior_only_types": _prior_in_best(r),
        "not_searched": r.not_searched,
        "node_types": [
            {
                "node_type": x.node_type.name,
                "max_nodes": x.max_nodes,
                "bound_by": x.bound_by,
                "status": x.status,
                "calibration": x.node_type.system.calibration.status(),
                "step_time_band_pct": bands.band_pct(
                    x.node_type.system, r.problem.stack, bands.kind_of(r.problem.llm)
                ),
                "calibration_detail": bands.summary(
                    x.node_type.system, r.problem.stack, bands.kind_of(r.problem.llm)
                ),
                "candidates": x.candidates,
                "best": None
                if x.purchase is None
                else {k: v for k, v in _purchase_dict(x.purchase).items() if k != "groups"},
            }
            for x in r.rows
        ],
        "mixes_considered": r.mixes_considered,
        "pipeline": None if r.pipeline is None else _pipeline_dict(r.pipeline),
        "pareto": None
        if r.pareto is None
        else [{k: v for k, v in _purchase_dict(p).items() if k != "groups"} for p in r.pareto],
        "notes": r.notes,
    }


def _pipeline_dict(c) -> dict:
    sol = c.solution
    return {
        "label": c.purchase.label(),
        "plan": sol.plan.label(),
        "status": sol.status,
        "models": sol.models,
        "solve_time_s": sol.seconds,
        "step_time_s": sol.result.step_time_s,
        "cost_usd": c.purchase.cost_usd,
        "parts_s": sol.result.parts_s,
        "offered": c.offered,
        "verdict": c.verdict,
        "groups": [
            {
                "node_type": g.node_type,
                "tp": g.tp,
                "stages": g.stages,
                "layers_per_stage": g.layers,
                "recompute": g.recompute.value,
                "gpus": n,
                "stage_time_s": t,
                "hbm_gib": h / 2**30,
                "capacity_gib": cap / 2**30,
                "reason": why,
            }
            for g, n, t, h, cap, why in zip(
                sol.plan.groups,
                sol.result.gpus,
                sol.result.stage_time_s,
                sol.result.hbm_bytes,
                sol.result.capacity_bytes,
                c.reasons,
                strict=True,
            )
        ],
        "dp": sol.plan.dp,
        "micro_batch": sol.plan.micro_batch,
    }


def _render_pipeline(c) -> list[str]:
    sol = c.solution
    out = [
        f"pipelined mix ({', '.join(c.offered)} offered; {sol.models} CP-SAT models, {sol.status}, "
        f"{sol.seconds:.1f} s): {c.purchase.label()}, cost {_money(c.purchase.cost_usd)}, step "
        f"{sol.result.step_time_s:.3f} s; dp {sol.plan.dp}, micro-batch {sol.plan.micro_batch}; stages in "
        "pipeline order:"
    ]
    out += [f"  {x}" for x in c.reasons]
    out.append(f"  {c.verdict}")
    return out


def _money(x: float) -> str:
    return f"${x / 1e6:,.2f}M" if x >= 1e5 else f"${x:,.0f}"


def render(r: ProcureResult) -> str:
    """`paraplan procure`'s report: the limits, a row per node type, the pipelined mix, the best purchase
    and its plans, the Pareto front and the notes."""
    out = _render_header(r) + _render_types(r)
    if r.best is None:
        out.append(
            "NOTHING FITS: no node type of the catalog trains the model within the limits "
            "(run `paraplan check` on a node type for why)"
            + (
                f"; not a proof over every family asked for: {'; '.join(r.not_searched)}"
                if r.not_searched
                else ""
            )
        )
        return "\n".join(out + [f"note: {n}" for n in r.notes])
    out += _render_best(r) + _render_pareto(r)
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)


def _render_header(r: ProcureResult) -> list[str]:
    """The title line: goal, pricing, limits (USD, kW, days), node types, candidates, status, time in s."""
    pp, pr = r.problem, r.problem.procure
    lim = [
        f"budget {_money(pr.budget_usd)}" if pr.budget_usd else "no budget",
        f"power cap {pr.power_kw:g} kW" if pr.power_kw else None,
        f"deadline {pr.deadline_days:g} days" if pr.deadline_days else None,
    ]
    out = [
        f"paraplan procure: {pp.name or ''}  goal {pr.goal.value} ({pr.pricing.value}; "
        + ", ".join(x for x in lim if x)
        + f"); {len(pp.catalog.node_types)} node types, "
        f"{r.candidates:,} candidates searched; {r.status}; {r.seconds:.2f} s"
        + (f"; UNCALIBRATED best ({', '.join(prior)}: prior only)" if (prior := _prior_in_best(r)) else "")
    ]
    return out


def _prior_in_best(r: ProcureResult) -> list[str]:
    """Names of the prior-only node types (efficiencies not calibrated on any run) in the best purchase."""
    if r.best is None:
        return []
    return sorted(
        {g.node_type.name for g in r.best.groups if g.node_type.system.calibration.status() == "prior"}
    )


def _render_types(r: ProcureResult) -> list[str]:
    """A row per node type (nodes, GPUs, cost in USD, step time in s, tokens/s, days to train, calibration),
    then the mixes evaluated and the pipelined mix."""
    pp, pr = r.problem, r.problem.procure
    out: list[str] = []
    out.append("")
    lw = max([len(f"{x.max_nodes} ({x.bound_by})") for x in r.rows] + [5])
    nw = max([len(x.node_type.name) for x in r.rows] + [9])
    out.append(
        f"{'node type':{nw}s} {'limit':>{lw}s} {'nodes':>6s} {'GPUs':>6s} {'cost':>10s} {'step s':>8s} "
        f"{'tokens/s':>11s} {'tok/s/$M':>9s} {'days':>7s} {'exp. d':>7s}  calibration, step-time uncertainty"
    )
    for x in r.rows:
        head = f"{x.node_type.name:{nw}s} {f'{x.max_nodes} ({x.bound_by})':>{lw}s}"
        c = x.node_type.system.calibration
        band = bands.band_pct(x.node_type.system, pp.stack, bands.kind_of(pp.llm))
        cal = c.status() + (f" +-{band:.0f}%" if band is not None else "")
        if x.status == "excluded":
            out.append(f"{head}  excluded: prior-only system (procure.calibrated_only)")
            continue
        if x.purchase is None:
            what = "not solved within the time limit" if x.status == "time_limit" else "nothing fits"
            out.append(f"{head}  {what}  [{cal}]")
            continue
        p = x.purchase
        days = f"{p.days_to_train:7.1f}" if p.days_to_train is not None else "      -"
        exp = f"{p.goodput.expected_time_to_train_s / 86400:7.1f}" if p.goodput is not None else "      -"
        out.append(
            f"{head} {p.nodes:6d} {p.groups[0].gpus_used:6d} "
            f"{_money(p.cost_usd):>10s} {p.step_time_s:8.3f} {p.tokens_per_s:11,.0f} "
            f"{p.tokens_per_s_per_musd():9,.0f} {days} {exp}  [{cal}]"
        )
    if r.mixes_considered:
        out.append(f"heterogeneous mixes evaluated: {r.mixes_considered}")
    if r.pipeline is not None:
        out += _render_pipeline(r.pipeline)
    elif pr.heterogeneous.value in ("pipeline", "all") and pr.max_types >= 2:
        skipped = [n for n in r.not_searched if n.startswith("pipelined")]
        out.append(
            f"pipelined mix: {skipped[0].split(': ', 1)[1]} (not searched)"
            if skipped
            else "pipelined mix: none fits within the limits"
        )
    out.append("")
    return out


def _render_best(r: ProcureResult) -> list[str]:
    """The best purchase (cost in USD, power in kW, step time in s, days to train) and each group's plan."""
    from optimizer.report.text import render_evaluation

    pp = r.problem
    out: list[str] = []
    b = r.best
    prior = _prior_in_best(r)
    if prior:
        out.append(
            f"WARNING: the best purchase uses prior-only node type(s) {', '.join(prior)}: their "
            "efficiencies are uncalibrated priors, so this ranking is a guess (procure.calibrated_only: true "
            "excludes them)"
        )
    spare = b.spare_nodes
    out.append(
        f"BEST: {b.label()} = {b.gpus} GPUs"
        + (f" + {spare} spare node{'' if spare == 1 else 's'}" if spare else "")
        + f", cost {_money(b.cost_usd)}"
        + (f", power {b.power_kw:,.0f} kW" if b.power_kw is not None else "")
        + f"; step {b.step_time_s:.3f} s, {b.tokens_per_s:,.0f} tokens/s"
        + (
            f", {b.days_to_train:.1f} days to train {pp.training.tokens:.3g} tokens"
            if b.days_to_train
            else ""
        )
    )
    if b.sync_s:
        out.append(f"  cross-type gradient sync {b.sync_s:.3f} s per step")
    if b.goodput is not None:
        from optimizer.report.goodput import goodput_lines

        goal = pp.procure.goal.value
        ranked = pp.goodput is not None and goal == "time_to_train"
        how = "reported; ranked without failures (add a goodput section to plan with them)"
        if pp.goodput is not None:
            how = {
                "time_to_train": "purchases ranked by expected time to train",
                "cost": "the deadline met in expectation, purchases ranked by expected cost",
            }.get(goal, "reported; ranked by throughput")
        out.append(f"  goodput of the purchase ({how}):")
        out += ["  " + line for line in goodput_lines(b.goodput)]
        if ranked:
            out += _goodput_changed(r)
    close = r.runner_up_note
    if close:
        out.append(f"  note: {close}")
    for g in b.groups:
        if g.plan is None:
            continue  # a pipelined mix: its stages are listed above
        out += [
            "",
            f"=== {g.nodes} x {g.node_type.name} ({g.gpus_used} GPUs used, batch {g.global_batch}): "
            f"step {g.step_time_s:.4f} s ===",
        ]
        out.append(render_evaluation(replace(g.plan.evaluation, goodput=None)))  # the purchase's, above
    return out


def _goodput_changed(r: ProcureResult) -> list[str]:
    """Where the fastest step (a row of the node-type table) is not the best purchase under the expected time
    to train: why (the failures' days on each, days and dollars between them)."""
    b = r.best
    rows = [x.purchase for x in r.rows if x.purchase is not None and x.purchase.goodput is not None]
    if not rows:
        return []
    fast = min(rows, key=lambda p: (p.step_time_s, p.cost_usd))
    if fast.label() == b.label() or fast.step_time_s >= b.step_time_s:
        return []

    def lost(p) -> float:
        return (p.goodput.expected_time_to_train_s - p.goodput.failure_free_time_s) / 86400

    sooner = (fast.goodput.expected_time_to_train_s - b.goodput.expected_time_to_train_s) / 86400
    return [
        f"  failures change the purchase: ranked by step time the best would be {fast.label()} (step "
        f"{fast.step_time_s:.3f} s, {fast.gpus} GPUs); failures, restarts and waits add {lost(fast):.1f} "
        f"days to it and {lost(b):.1f} to this purchase, which trains {sooner:.1f} days sooner in "
        f"expectation and costs {_money(fast.cost_usd - b.cost_usd)} less"
    ]


def _render_pareto(r: ProcureResult) -> list[str]:
    """The Pareto front of cost (USD) against days to train (step time in s without a token count)."""
    pp = r.problem
    out: list[str] = []
    if r.pareto:
        out += [
            "",
            "Pareto front, cost against time to train (each point the "
            + (
                "single-type purchase with the least expected time to train (failures included) "
                if pp.goodput is not None and pp.training.tokens
                else "fastest single-type purchase "
            )
            + "within its budget; at the problem's budget, the best purchase, mixes included):",
            f"  {'cost':>10s} {'days' if pp.training.tokens else 'step s':>8s}  purchase",
        ]
        for p in r.pareto:
            t = p.days_to_train if p.days_to_train is not None else p.step_time_s
            g = p.goodput
            exp = f" (expected {g.expected_time_to_train_s / 86400:.2f})" if g is not None else ""
            out.append(f"  {_money(p.cost_usd):>10s} {t:8.2f}  {p.label()}{exp}")
    return out
