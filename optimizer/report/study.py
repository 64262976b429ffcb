"""`paraplan study`'s report as text: the count of points per status, then one line per point (its axis
values, status, step time in s and MFU, or why it has no plan)."""

from __future__ import annotations


def summary(r) -> str:
    """One line: the study's name, its points and how many of each status."""
    name = r.study.name or "study"
    counts = ", ".join(f"{v} {k}" for k, v in r.counts().items())
    return f"paraplan study: {name}: {len(r.rows)} points ({counts})"


def render(r) -> str:
    out = [summary(r)]
    for row in r.rows:
        axes = " ".join(f"{k[5:]}={v}" for k, v in row.items() if k.startswith("axis."))
        step = row.get("step_time_s")
        what = (
            f"step {step:.4g} s, MFU {100 * row['mfu']:.1f}%"
            if isinstance(step, (int, float)) and isinstance(row.get("mfu"), (int, float))
            else (row.get("reason") or "")
        )
        out.append(f"  {row['point']:4d} {axes}  {row['status']}  {what}".rstrip())
    return "\n".join(out)
