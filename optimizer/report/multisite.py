"""`paraplan procure`'s report across sites: a `MultisiteResult` as a JSON object and as text (the chosen
sites, nodes and plans, the ring of links, the scheme, days to train, costs in USD, energy in MWh, the
verdict against the best single site, and every (sites, scheme) configuration considered)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.report.goodput import goodput_dict, goodput_lines
from optimizer.report.text import evaluation_dict, table

if TYPE_CHECKING:
    from optimizer.drivers.multisite import MultisiteResult, SitesPlan


def _knobs(plan) -> str:
    ex = plan.evaluation.execution
    d = evaluation_dict(plan.evaluation)["execution"]
    return (
        f"tp {ex.tp} pp {ex.pp} dp {d['dp']}"
        + (f" cp {ex.cp}" if ex.cp > 1 else "")
        + (f" ep {ex.ep}" if ex.ep > 1 else "")
        + f" mb {ex.micro_batch} zero {ex.zero} recompute {ex.recompute.value}"
    )


def _stages(p: SitesPlan, i: int) -> dict:
    """Pipeline stages across sites: the stages (0-based, first and last) the i-th site of the path holds."""
    if p.scheme != "pipeline":
        return {}
    per = p.sites[0].group.plan.evaluation.execution.pp // p.k
    return {"pipeline_stages": [i * per, (i + 1) * per - 1]}


def plan_dict(p: SitesPlan) -> dict:
    return {
        "label": p.label(),
        "scheme": p.scheme,
        "inner_steps": p.inner_steps,
        "overlap": p.overlap,
        "sites": [
            {
                "site": s.site.name,
                "node_type": s.node_type.name,
                "nodes": s.nodes,
                "gpus": s.nodes * s.node_type.gpus_per_node,
                "gpus_used": s.group.gpus_used,
                "global_batch": s.group.global_batch,
                "power_mw": s.power_mw,
                "cost_usd": s.cost_usd,
                "step_time_s": s.step_time_s,
                "plan": evaluation_dict(s.group.plan.evaluation),
            }
            | _stages(p, i)
            for i, s in enumerate(p.sites)
        ],
        "ring": [s.site.name for s in p.sites],  # neighbours in order, the last beside the first
        "links": [
            {
                "sites": list(c.sites),
                "option": c.option.name,
                "bandwidth_gbps": c.option.bandwidth_gbps,
                "latency_ms": c.latency_s * 1e3,
                "price_usd": c.option.price_usd,
            }
            for c in p.links
        ],
        "slowest_step_s": p.slowest_step_s,
        "all_reduce_across_sites_s": 0.0 if p.scheme == "pipeline" else p.wan_s,
        "pipeline_exchanges_s": p.wan_s if p.scheme == "pipeline" else 0.0,  # what they add per step
        "round_s": p.round_s,
        "compute_utilisation": p.compute_utilisation,
        "tokens_multiplier": p.tokens_multiplier,
        "days_to_train": p.days_to_train,
        "nodes_usd": p.nodes_usd,
        "links_usd": p.links_usd,
        "cost_usd": p.cost_usd,
        "energy_mwh": p.energy_mwh,
        "energy_usd": p.energy_usd,
        "status": p.status,
        "expected_days": p.expected_days,
        "goodput": None if p.goodput is None else goodput_dict(p.goodput),
    }


def result_dict(r: MultisiteResult) -> dict:
    pr = r.problem.procure
    return {
        "problem": r.problem.name,
        "kind": "sites",
        "goal": pr.goal.value,
        "budget_usd": pr.budget_usd,
        "deadline_days": pr.deadline_days,
        "status": r.status,
        "solve_time_s": r.seconds,
        "best": None if r.best is None else plan_dict(r.best),
        "best_single_site": None if r.single_site is None else plan_dict(r.single_site),
        "verdict": r.verdict(),
        "considered": r.considered,
        "pareto": [plan_dict(p) for p in r.pareto],
        "notes": r.notes,
    }


def _money(x: float) -> str:
    if abs(x) >= 1e9:
        return f"${x / 1e9:,.2f}B"
    return f"${x / 1e6:,.2f}M" if abs(x) >= 1e5 else f"${x:,.0f}"


def plan_lines(p: SitesPlan) -> list[str]:
    """A configuration: a row per site, its ring of links, the round and what training takes."""
    rows = [
        [
            s.site.name,
            f"{s.nodes} x {s.node_type.name}",
            f"{s.group.gpus_used}",
            f"{s.group.global_batch}",
            f"{s.power_mw:,.3g}",
            f"{s.step_time_s:.3f}",
            _knobs(s.group.plan),
        ]
        for s in p.sites
    ]
    out = [
        table(
            rows,
            ["site", "nodes", "GPUs used", "batch", "MW", "step s"]
            + [
                "plan (the whole pipeline's)"
                if p.scheme == "pipeline"
                else "plan (for its share of the batch)"
            ],
        )
    ]
    for c in p.links:
        out.append(
            f"link {c.sites[0]} - {c.sites[1]}: {c.option.name or 'option'} "
            f"{c.option.bandwidth_gbps:g} Gb/s, {c.latency_s * 1e3:.1f} ms, {_money(c.option.price_usd)}"
        )
    if p.scheme == "pipeline":
        g = p.sites[0].group.plan.evaluation.execution
        out.append(
            f"pipeline stages across sites: {g.pp // p.k} of the {g.pp} stages at each site, in the order "
            f"above; the exchanges across sites add {p.wan_s:.3f} s per step; compute utilisation "
            f"{100 * p.compute_utilisation:.1f}%"
        )
    elif p.k > 1:
        per = "per step" if p.scheme == "sync" else f"every {p.inner_steps} steps"
        how = "under the next steps" if p.overlap else "in sequence"
        out.append(
            f"all-reduce across sites {p.wan_s:.3f} s {per} ({how}); compute utilisation "
            f"{100 * p.compute_utilisation:.1f}%"
            + (
                f"; tokens x {p.tokens_multiplier:.3f} (DiLoCo's sample efficiency)"
                if p.scheme == "diloco"
                else ""
            )
        )
    out += _goodput_lines(p)
    out.append(
        f"{p.days_to_train:.2f} days to train; nodes {_money(p.nodes_usd)}, links {_money(p.links_usd)}; "
        f"energy {p.energy_mwh:,.0f} MWh ({_money(p.energy_usd)}, reported, not minimised)"
    )
    return out


def _goodput_lines(p: SitesPlan) -> list[str]:
    """With failures (the whole job as one: `drivers.multisite.plan_goodput`); a job whose interruptions
    come faster than it restarts is said to never finish rather than given a number of days."""
    g = p.goodput
    if p.never_finishes:
        return [f"with failures: never finishes at these rates ({p.never_finishes})"]
    if g is None:
        return []
    if g.effective_fraction < 1e-3:
        return [
            f"with failures: never finishes at these rates (an interruption every {g.mtbf_s / 60:,.1f} min "
            f"across {sum(s.group.gpus_used for s in p.sites):,} GPUs)"
        ]
    return ["with failures (the job as one over every site):"] + ["  " + x for x in goodput_lines(g)]


def render(r: MultisiteResult) -> str:
    mp = r.problem
    out = [
        f"paraplan procure (sites): {mp.name or ''}  {mp.llm.name}, {mp.training.tokens:.3g} tokens, goal "
        f"{mp.procure.goal.value}, {len(mp.sites)} sites offered; {r.status} in {r.seconds:.1f} s",
        f"VERDICT: {r.verdict()}",
    ]
    if r.best is not None:
        out += ["", f"BEST: {r.best.label()}"] + plan_lines(r.best)
    if r.single_site is not None and r.single_site is not r.best:
        out += ["", "best single site:"] + plan_lines(r.single_site)
    gp = mp.goodput is not None  # ranked by expected days: show them
    rows = [
        [str(c["sites"]), c["scheme"], str(c["inner_steps"]) if c["scheme"] == "diloco" else "-"]
        + [f"{c['tokens_multiplier']:.3f}", f"{c['days_to_train']:.2f}" if "days_to_train" in c else "-"]
        + ([f"{c['expected_days']:.2f}" if "expected_days" in c else "-"] if gp else [])
        + [_money(c["cost_usd"]) if "cost_usd" in c else "-", c["status"]]
        for c in r.considered
    ]
    proven = all(c["status"] in ("optimal", "infeasible") for c in r.considered)
    out += ["", "considered (each proven by CP-SAT):" if proven else "considered (status: proven or not):"]
    head = (
        ["sites", "scheme", "H", "tokens x", "days"] + (["expected days"] if gp else []) + ["cost", "status"]
    )
    out.append(table(rows, head))
    if r.pareto:
        out += ["", "Pareto front of cost against days (each the fastest within its cost):"]
        days = "expected days" if gp else "days"
        prow = [
            [
                _money(p.nodes_usd + p.links_usd),
                f"{p.expected_days if gp else p.days_to_train:.2f}",
                p.label(),
            ]
            for p in r.pareto
        ]
        out.append(table(prow, ["cost", days, "configuration"]))
    out += [f"note: {n}" for n in r.notes]
    return "\n".join(out)
