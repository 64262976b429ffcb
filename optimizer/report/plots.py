"""Charts of plans (matplotlib, headless): the breakdown of each plan's step time and memory per GPU as
stacked bars, one bar per plan, parts in the order and names of the text report."""

from __future__ import annotations

from typing import Any

from optimizer.report.text import MEM_PARTS, TIME_PARTS

GIB = 2.0**30


def label(ev: Any) -> str:
    ex = ev.execution
    s = f"tp{ex.tp} pp{ex.pp} dp{ex.dp} cp{ex.cp}"
    if ex.vpp > 1:
        s += f" v{ex.vpp}"
    return s + f" mb{ex.micro_batch} zero{ex.zero} rec:{ex.recompute.value}"


def plot_breakdown(evaluations: list[Any], path: str, title: str = "") -> None:
    """Two panels: step time by part (s) and HBM per GPU by part (GiB, capacity marked), a bar per plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(evaluations)
    fig, (at, am) = plt.subplots(1, 2, figsize=(11, 2.6 + 0.5 * n), dpi=130, sharey=True)
    names = [label(ev) for ev in evaluations]
    ys = list(range(n))[::-1]
    cmap = plt.get_cmap("tab20")
    left = [0.0] * n
    for j, (name, key) in enumerate(TIME_PARTS):
        vals = [float(ev.result[key]) for ev in evaluations]
        if not any(v > 0 for v in vals):
            continue
        at.barh(ys, vals, left=left, color=cmap(j % 20), label=name, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    at.set_yticks(ys, names, fontsize=7)
    at.set_xlabel("step time, s")
    at.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, frameon=False)
    at.grid(True, axis="x", alpha=0.3)
    left = [0.0] * n
    for j, (name, key) in enumerate(MEM_PARTS):
        vals = [float(ev.result[key]) / GIB for ev in evaluations]
        am.barh(ys, vals, left=left, color=cmap((2 * j + 1) % 20), label=name, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    cap = evaluations[0].problem.system.hbm_gib if evaluations else 0
    am.axvline(cap, color="crimson", lw=1.2, ls="--", label=f"HBM {cap:g} GiB")
    am.set_xlabel("memory per GPU (worst stage), GiB")
    am.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, frameon=False)
    am.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title or "plans: step time and memory by part", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
