"""`paraplan check`'s report: a `CheckResult` as a JSON object and as text (fits: the plan and its memory
margin per tier in GiB and %; does not fit: why, and each relaxation's solve)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optimizer.model import bands

if TYPE_CHECKING:
    from optimizer.drivers.check import CheckResult

GIB = 2.0**30


def result_dict(r: CheckResult) -> dict:
    cal = r.problem.system.calibration
    d: dict[str, Any] = {
        "problem": r.problem.name,
        "fits": r.fits,
        "fixed": r.fixed,
        "seconds": round(r.seconds, 3),
        "calibration": cal.status(),
        "calibration_detail": bands.summary(r.problem.system, r.problem.stack, bands.kind_of(r.problem.llm)),
        "step_time_band_pct": bands.band_pct(r.problem.system, r.problem.stack, bands.kind_of(r.problem.llm)),
    }
    if r.fits:
        ev = r.plan.plans[0].evaluation
        res = ev.result
        cap = r.problem.system.hbm_gib - r.problem.headroom_gib()
        used = res["hbm"] / GIB
        d["plan"] = {
            "execution": ev.execution.model_dump(mode="json"),
            "step_time_s": res["step_time"],
            "status": r.plan.status,
        }
        d["freed"] = {k: {"chosen": v[0], "default": v[1]} for k, v in r.freed.items()}
        from optimizer.model.capacity import memory_margin_warning

        d["memory_warning"] = memory_margin_warning(res["hbm"], r.problem)
        d["warnings"] = list(ev.warnings)  # the plan's own (a group crossing domains, a large bubble, ...)
        d["memory"] = {
            "hbm": {
                "used_gib": round(used, 3),
                "capacity_gib": cap,
                "margin_gib": round(cap - used, 3),
                "margin_pct": round(100 * (cap - used) / cap, 2),
            }
        }
        if r.problem.system.offload.capacity_gib > 0:
            ou = res["offload_mem"] / GIB
            oc = r.problem.system.offload.capacity_gib
            d["memory"]["offload"] = {
                "used_gib": round(ou, 3),
                "capacity_gib": oc,
                "margin_gib": round(oc - ou, 3),
                "margin_pct": round(100 * (oc - ou) / oc, 2),
            }
    else:
        d["conflicts"] = [{"group": g, "reason": t} for g, t in r.conflicts]
        d["explanation"] = r.explanation
        d["min_hbm_gib"] = r.min_hbm_gib
        d["relaxations"] = [
            {
                "kind": x.kind,
                "change": x.change,
                "value": x.value,
                "fits": x.fits,
                "step_time_s": x.step_time_s,
            }
            for x in r.relaxations
        ]
    return d


def render(r: CheckResult) -> str:
    d = result_dict(r)
    name = r.problem.name or "problem"
    fixed = ", ".join(f"{k}={v[0] if len(v) == 1 else v}" for k, v in r.fixed.items()) or "none"
    from optimizer.report.text import calibration_line

    lines = [
        f"paraplan check: {name}  (fixed knobs: {fixed})",
        calibration_line(r.problem.system, r.problem.stack, bands.kind_of(r.problem.llm)),
    ]
    if r.fits:
        pl, mem = d["plan"], d["memory"]
        ex = pl["execution"]
        lines.append(f"FITS. Fastest plan that fits ({pl['status']}): step time {pl['step_time_s']:.4g} s")
        lines.append(
            "  "
            + " ".join(
                f"{k}={ex[k]}"
                for k in (
                    "tp",
                    "pp",
                    "dp",
                    "cp",
                    "vpp",
                    "micro_batch",
                    "recompute",
                    "sequence_parallel",
                    "zero",
                )
            )
        )
        if r.freed:
            lines.append(
                "  knobs the problem left free, chosen by the solver (default in brackets): "
                + ", ".join(f"{k}={v[0]} [{v[1]}]" for k, v in r.freed.items())
            )
        for tier, m in mem.items():
            lines.append(
                f"  {tier}: {m['used_gib']:.2f} of {m['capacity_gib']:.1f} GiB per GPU, margin "
                f"{m['margin_gib']:.2f} GiB ({m['margin_pct']:.1f}%)"
            )
        if d.get("memory_warning"):
            lines.append(f"  warning: {d['memory_warning']}")
        lines += [f"  warning: {w}" for w in d.get("warnings", [])]
    else:
        lines.append("DOES NOT FIT.")
        for e in r.explanation:
            lines.append(f"  why: {e}")
        if r.conflicts:
            lines.append("  conflicting constraint groups: " + ", ".join(g for g, _ in r.conflicts))
        lines.append("What would make it fit (each computed by a solve):")
        for x in r.relaxations:
            st = f" -> step time {x.step_time_s:.4g} s" if x.step_time_s else ""
            lines.append(f"  {'yes' if x.fits else 'no '}  {x.change}{st}")
    lines.append(f"checked in {r.seconds:.2f} s")
    return "\n".join(lines)
