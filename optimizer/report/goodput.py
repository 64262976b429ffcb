"""The goodput of a plan (`optimizer.model.goodput`) as a JSON object and as text lines: expected time and
cost to train with their parts and P10-P90 band."""

from __future__ import annotations

from typing import Any

PARTS = (
    ("compute_s", "training"),
    ("checkpoint_stalls_s", "checkpoint stalls"),
    ("lost_work_s", "lost work"),
    ("restarts_s", "restarts"),
    ("spare_waits_s", "waits for spares"),
)


def goodput_dict(g: Any) -> dict:
    """`goodput` object of a plan's JSON: units in the names."""
    ck = g.checkpoint
    return {
        "effective_fraction": g.effective_fraction,
        "expected_time_to_train_s": g.expected_time_to_train_s,
        "p10_time_to_train_s": g.p10_time_to_train_s,
        "p90_time_to_train_s": g.p90_time_to_train_s,
        "failure_free_time_s": g.failure_free_time_s,
        "checkpoint_interval_s": g.checkpoint_interval_s,
        "checkpoint_bytes_per_gpu": ck.bytes_per_gpu,
        "checkpoint_total_bytes": ck.bytes_total,
        "checkpoint_write_s": ck.write_s,
        "checkpoint_stall_s": ck.stall_s,
        "reload_s": ck.reload_s,
        "mtbf_s": g.mtbf_s,
        "expected_interruptions": g.expected_interruptions,
        "expected_planned_interruptions": g.expected_planned_interruptions,
        "spare_nodes": g.spare_nodes,
        "parts_s": dict(g.parts_s),
        "energy_kwh": g.energy_kwh,
        "energy_usd": g.energy_usd,
        "compute_usd": g.compute_usd,
        "expected_cost_usd": g.expected_cost_usd,
    }


def _days(s: float) -> str:
    return f"{s / 86400:.2f} days"


def goodput_lines(g: Any) -> list[str]:
    """Text: expected days (P10-P90), effective training share, the parts, checkpoint, energy and cost."""
    ck = g.checkpoint
    out = [
        f"expected time to train: {_days(g.expected_time_to_train_s)} "
        f"(P10 {g.p10_time_to_train_s / 86400:.2f} - P90 {g.p90_time_to_train_s / 86400:.2f}), "
        f"effective training {100 * g.effective_fraction:.1f}%",
        "  parts: "
        + ", ".join(f"{name} {g.parts_s[k] / 3600:,.1f} h" for k, name in PARTS if g.parts_s.get(k, 0) > 0),
        f"  {g.expected_interruptions:,.1f} unplanned interruptions (MTBF {g.mtbf_s / 3600:,.2f} h) and "
        f"{g.expected_planned_interruptions:,.1f} planned; checkpoint every "
        f"{g.checkpoint_interval_s / 60:g} min: "
        f"{ck.bytes_per_gpu / 1e9:,.2f} GB per GPU, written in {ck.write_s:,.1f} s, stalls the step "
        f"{ck.stall_s:,.2f} s, reload {ck.reload_s:,.1f} s"
        + ("" if g.spare_nodes is None else f"; {g.spare_nodes} spare nodes"),
    ]
    cost = []
    if g.energy_kwh is not None:
        paid = "in the rent" if g.energy_usd == 0 and g.compute_usd else f"${g.energy_usd:,.0f}"
        cost.append(f"energy {g.energy_kwh / 1000:,.1f} MWh ({paid})")
    if g.compute_usd is not None:
        cost.append(f"compute ${g.compute_usd:,.0f}")
    if g.expected_cost_usd is not None:
        cost.append(f"expected cost ${g.expected_cost_usd:,.0f}")
    if cost:
        out.append("  " + ", ".join(cost))
    return out
