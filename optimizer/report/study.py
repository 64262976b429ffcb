"""`paraplan study`'s report as text: the count of points per status (and how many were read back from the
journal of an earlier run), the fastest point, then one line per point (its axis values, status, step time
in s and MFU, or why it has no plan)."""

from __future__ import annotations


def summary(r) -> str:
    """One line: the study's name, its points and how many of each status."""
    name = r.study.name or "study"
    counts = ", ".join(f"{v} {k}" for k, v in r.counts().items())
    line = f"paraplan study: {name}: {len(r.rows)} points ({counts})"
    if getattr(r, "resumed", 0):
        line += f"; resumed: {r.resumed} of them read from {r.journal}, not solved again"
    best = r.best() if hasattr(r, "best") else None
    if best is not None:
        mfu = best.get("mfu")
        line += f"\nbest: point {best['point']} ({_axes(best)}): step {best['step_time_s']:.4g} s" + (
            f", MFU {100 * mfu:.1f}%" if isinstance(mfu, (int, float)) else ""
        )
    return line


def _axes(row: dict) -> str:
    return " ".join(f"{k[5:]}={v}" for k, v in row.items() if k.startswith("axis."))


def render(r) -> str:
    out = [summary(r)]
    for row in r.rows:
        axes = _axes(row)
        step = row.get("step_time_s")
        what = (
            f"step {step:.4g} s, MFU {100 * row['mfu']:.1f}%"
            if isinstance(step, (int, float)) and isinstance(row.get("mfu"), (int, float))
            else (row.get("reason") or "")
        )
        out.append(f"  {row['point']:4d} {axes}  {row['status']}  {what}".rstrip())
    return "\n".join(out)
