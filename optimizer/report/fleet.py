"""`paraplan fleet`'s report: a `FleetResult` as a JSON object and as text (cost in USD, nodes bought per
period, the schedule, tokens trained per job)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.report.goodput import goodput_dict

if TYPE_CHECKING:
    from optimizer.drivers.fleet import FleetResult
    from optimizer.schema.fleet import FleetProblem


def result_dict(r: FleetResult) -> dict:
    return {
        "status": r.status,
        "goal": r.goal,
        "cost_usd": r.cost_usd,
        "solve_time_s": r.seconds,
        "buy_nodes": r.buy,
        "schedule": r.schedule,
        "trained_tokens": r.trained,
        "throughput_table": [vars(x) for x in r.rates],
        "explanation": r.explanation,
        "goodput": {
            "energy_kwh": r.energy_kwh,
            "energy_usd": r.energy_usd,
            "expected_cost_usd": None if r.cost_usd is None else r.cost_usd + (r.energy_usd or 0.0),
            "tokens_scaled_by_effective_fraction": fp_has_goodput(r),
            "jobs": {
                name: None if v is None else {"allocation": v[0]} | goodput_dict(v[1])
                for name, v in r.job_goodput.items()
            },
        },
    }


def fp_has_goodput(r: FleetResult) -> bool:
    return r.problem is not None and r.problem.goodput is not None


def render(fp: FleetProblem, r: FleetResult) -> str:
    out = [
        f"paraplan fleet: {r.status} (goal {r.goal}); {len(r.rates)} (job, type, size) plans proven by "
        f"CP-SAT; solved in {r.seconds:.2f} s"
    ]
    if r.status == "infeasible":
        out += [f"  {e}" for e in r.explanation]
        return "\n".join(out)
    out.append(
        f"cost ${r.cost_usd:,.0f}"
        + (f" of a ${fp.fleet.budget_usd:,.0f} budget" if fp.fleet.budget_usd else "")
    )
    out.append("")
    out.append("purchase (nodes bought at the start of each period):")
    out.append(f"  {'type':18}" + "".join(f"{'P' + str(q):>7}" for q in range(1, fp.fleet.periods + 1)))
    for t, ns in r.buy.items():
        if any(ns):
            out.append(f"  {t:18}" + "".join(f"{n:>7}" for n in ns))
    out += [
        "",
        "schedule:",
        f"  {'job':16} {'period':>6} {'type':18} {'nodes':>6} {'step s':>8} {'tokens (B)':>11} {'eff.':>6}",
    ]
    for s in r.schedule:
        out.append(
            f"  {s['job']:16} {s['period']:>6} {s['node_type']:18} {s['nodes']:>6} {s['step_time_s']:8.3f} "
            f"{s['tokens'] / 1e9:11.1f} {100 * s.get('effective_fraction', 1.0):5.1f}%"
        )
    scaled = fp.goodput is not None
    out.append(
        "  (eff.: expected share of wall time training, with failures, restarts and checkpoints: "
        + (
            "tokens are that share of each period's)"
            if scaled
            else "reported; tokens assume none, add a goodput section to plan with it)"
        )
    )
    if r.energy_kwh is not None:
        out.append(
            f"energy {r.energy_kwh / 1000:,.0f} MWh (${r.energy_usd:,.0f}); expected cost with energy "
            f"${r.cost_usd + r.energy_usd:,.0f}"
        )
    if r.job_goodput:
        out += ["", "each job trained whole on its main allocation, with failures, restarts and checkpoints:"]
        for name, v in r.job_goodput.items():
            if v is None:
                continue
            label, g = v
            out.append(
                f"  {name:16} {label}: expected {g.expected_time_to_train_s / 86400:.1f} days (P10 "
                f"{g.p10_time_to_train_s / 86400:.1f} - P90 {g.p90_time_to_train_s / 86400:.1f}), effective "
                f"{100 * g.effective_fraction:.1f}%: lost work {g.parts_s['lost_work_s'] / 3600:,.1f} h, "
                f"restarts {g.parts_s['restarts_s'] / 3600:,.1f} h, checkpoint stalls "
                f"{g.parts_s['checkpoint_stalls_s'] / 3600:,.1f} h, "
                f"waits {g.parts_s['spare_waits_s'] / 3600:,.1f} h"
                + (f", energy {g.energy_kwh / 1000:,.0f} MWh" if g.energy_kwh is not None else "")
            )
    out += ["", "trained by the deadline (B tokens):"]
    for j in fp.jobs:
        out.append(f"  {j.name:16} {r.trained[j.name] / 1e9:10.1f} of {j.training.tokens / 1e9:,.1f}")
    return "\n".join(out)
