"""`paraplan solve`'s report: the plans of a `SolveResult` as a JSON object and as text (each plan's
evaluation, and its launch command for a framework with `emit`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optimizer.drivers.solve import SolveResult
    from optimizer.schema import Problem


def result_dict(problem: Problem, r: SolveResult) -> dict:
    from optimizer.report.text import evaluation_dict

    return {
        "method": r.method,
        "status": r.status,
        "solve_time_s": r.seconds,
        "candidates": r.candidates,
        "feasible_candidates": r.feasible_candidates,
        "bound_step_time_s": r.bound_s,
        "gap": r.gap,
        "plans": [evaluation_dict(p.evaluation) | {"objective_step_time_s": p.objective_s} for p in r.plans],
        "notes": r.notes,
    } | ({"phases": phased_dict(r)} if r.phased is not None else {})


def phased_dict(r: SolveResult) -> dict:
    """The sums of a batch-size schedule (the plans are its phases, in order)."""
    from dataclasses import asdict

    return asdict(r.phased) | {
        "per_phase": [
            {
                "tokens": p.evaluation.problem.training.tokens,
                "global_batch": p.evaluation.problem.training.global_batch,
                "seq_len": p.evaluation.problem.seq_len,
            }
            for p in r.plans
        ]
    }


def _phased_lines(r: SolveResult) -> list[str]:
    t = r.phased
    out = [
        f"batch-size schedule of {len(r.plans)} phases: expected time to train "
        f"{t.expected_time_to_train_s / 86400:.2f} days (P10 {t.p10_time_to_train_s / 86400:.2f} - P90 "
        f"{t.p90_time_to_train_s / 86400:.2f}); {t.failure_free_time_s / 86400:.2f} days without "
        f"interruptions; {t.relayouts} re-layouts ({t.relayout_s / 60:.1f} min)"
    ]
    if t.energy_kwh is not None:
        out.append(f"  energy {t.energy_kwh / 1000:,.1f} MWh, expected cost ${t.expected_cost_usd:,.0f}")
    return out


def render(problem: Problem, r: SolveResult, emit: str | None = None) -> str:
    from optimizer.report.text import render_evaluation

    out = [
        f"paraplan solve ({r.method}): {r.status}; {r.candidates:,} candidates in the space"
        + (f", {r.feasible_candidates:,} fit" if r.feasible_candidates is not None else "")
        + f"; solved in {r.seconds:.3f} s"
    ]
    if r.phased is not None:
        out += _phased_lines(r)
    if r.bound_s is not None:
        out.append(
            f"best step time {r.plans[0].objective_s:.4f} s, bound {r.bound_s:.4f} s, "
            f"gap {100 * (r.gap or 0):.3f}%"
        )
    for i, p in enumerate(r.plans):
        step = p.evaluation.result["step_time"]
        if r.phased is not None:
            tr = p.evaluation.problem.training
            head = (
                f"=== phase {i + 1} of {len(r.plans)}: {tr.tokens:.3g} tokens at {tr.global_batch} x "
                f"{p.evaluation.problem.seq_len}-token sequences: step time {step:.4f} s ==="
            )
        else:
            head = f"=== plan {i + 1} of {len(r.plans)}: step time {step:.4f} s ==="
        out += ["", head]
        out.append(render_evaluation(p.evaluation))
        if emit:
            from optimizer.report.export import block

            out += ["", block(emit, problem, p.evaluation.execution)]
    for n in r.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
