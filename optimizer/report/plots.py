"""Charts of plans (matplotlib, headless): the breakdown of each plan's step time and memory per GPU as
stacked bars, one bar per plan, parts in the order and names of the text report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.report.text import MEM_PARTS, TIME_PARTS
from optimizer.schema.procure import Pricing

if TYPE_CHECKING:
    from optimizer.drivers.fleet import FleetResult
    from optimizer.drivers.procure import ProcureResult
    from optimizer.drivers.whatif import WhatifResult
    from optimizer.schema.fleet import FleetProblem

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
        left = [a + b for a, b in zip(left, vals, strict=True)]
    at.set_yticks(ys, names, fontsize=7)
    at.set_xlabel("step time, s")
    at.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, frameon=False)
    at.grid(True, axis="x", alpha=0.3)
    left = [0.0] * n
    for j, (name, key) in enumerate(MEM_PARTS):
        vals = [float(ev.result[key]) / GIB for ev in evaluations]
        am.barh(ys, vals, left=left, color=cmap((2 * j + 1) % 20), label=name, height=0.6)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    cap = evaluations[0].problem.system.hbm_gib if evaluations else 0
    am.axvline(cap, color="crimson", lw=1.2, ls="--", label=f"HBM {cap:g} GiB")
    am.set_xlabel("memory per GPU (worst stage), GiB")
    am.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=3, frameon=False)
    am.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title or "plans: step time and memory by part", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_study(rows: list[dict], study, folder: str | Path) -> list[str]:
    """Line plot over the first axis (step time and MFU), heatmap over the first two (step time), stacked
    breakdown of step time per point; PNG files in `folder`, their paths returned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    keys = list(study.axes)
    ok = [r for r in rows if r.get("step_time_s") not in (None, "")]
    drawn = []
    if ok and (len(keys) == 1 or study.mode.value == "zip"):
        drawn.append(("line.png", _study_line(plt, ok, study, keys)))
    if ok and len(keys) >= 2 and study.mode.value == "cross":
        drawn.append(("heatmap.png", _study_heatmap(plt, rows, ok, study, keys)))
    if ok and len(ok) <= 64:
        drawn.append(("breakdown.png", _study_breakdown(plt, ok, study, keys)))
    files = []
    for name, fig in drawn:
        files.append(str(folder / name))
        fig.savefig(files[-1], bbox_inches="tight")  # legends outside the axes are kept whole
        plt.close(fig)
    return files


# readable names of the study axes people sweep (a field path otherwise: its last part, with its unit)
AXIS_LABELS = {
    "num_gpus": "GPUs",
    "search.tp": "tensor parallel (tp)",
    "search.pp": "pipeline parallel (pp)",
    "search.cp": "context parallel (cp)",
    "search.ep": "expert parallel (ep)",
    "training.global_batch": "global batch, sequences",
    "training.seq_len": "sequence length, tokens",
    "system.hbm_gib": "HBM capacity, GiB",
}
UNIT_SUFFIXES = {
    "_gib": ", GiB",
    "_gbps": ", GB/s",
    "_tflops": ", TFLOP/s",
    "_usd": ", $",
    "_s": ", s",
    "_w": ", W",
}


def axis_label(key: str) -> str:
    """The label of a study axis: `AXIS_LABELS`, else the field's last part in words (after its parent's
    name where that says what it is of) with its unit."""
    if key in AXIS_LABELS:
        return AXIS_LABELS[key]
    parts = key.split(".")
    name, unit = parts[-1], ""
    for suffix, u in UNIT_SUFFIXES.items():
        if name.endswith(suffix):
            name, unit = name[: -len(suffix)], u
            break
    parent = parts[-2] if len(parts) > 1 and parts[-2] not in ("search", "training", "system") else ""
    return " ".join(p for p in (parent, name.replace("_", " ")) if p) + unit


def _log_if_wide(ax, axis: str, values) -> None:
    """Log scale on `axis` (x or y) when its positive values span 10x or more (cliffs stay visible)."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and v > 0]
    if vals and max(vals) >= 10 * min(vals):
        getattr(ax, f"set_{axis}scale")("log")


def _study_line(plt, ok: list[dict], study, keys: list[str]):
    """Step time (s) and MFU (%) of the points that have a plan, over the first axis."""
    k0 = f"axis.{keys[0]}"
    numeric = all(isinstance(r.get(k0), (int, float)) for r in ok)
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=130)
    xs = [r[k0] if numeric else i for i, r in enumerate(ok)]
    steps = [r["step_time_s"] for r in ok]
    (h1,) = ax.plot(xs, steps, ".-", color="tab:blue", label="step time, s")
    ax.set_xlabel(axis_label(keys[0]))
    ax.set_ylabel("step time, s")
    if numeric:
        _log_if_wide(ax, "x", xs)
    _log_if_wide(ax, "y", steps)
    ax2 = ax.twinx()
    (h2,) = ax2.plot(xs, [100 * r["mfu"] for r in ok], ".-", color="tab:orange", label="MFU, %")
    ax2.set_ylabel("MFU, %")
    ax.legend(
        handles=[h1, h2], fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, frameon=False
    )
    ax.grid(True, alpha=0.3)
    ax.set_title(study.name or "study", fontsize=9)
    fig.tight_layout()
    return fig


def _axis_order(vals) -> list:
    """An axis's distinct values, numeric order when all are numbers, else by their text."""
    vals = set(vals)
    num = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)
    return sorted(vals, key=(lambda v: v) if num else str)


def _study_heatmap(plt, rows: list[dict], ok: list[dict], study, keys: list[str]):
    """Step time (s) over the first two axes; blank where nothing fits."""
    import numpy as np

    k0, k1 = f"axis.{keys[0]}", f"axis.{keys[1]}"
    xv = _axis_order(r[k0] for r in rows)
    yv = _axis_order(r[k1] for r in rows)
    z = np.full((len(yv), len(xv)), np.nan)
    for r in ok:
        z[yv.index(r[k1]), xv.index(r[k0])] = r["step_time_s"]
    fig, ax = plt.subplots(figsize=(1.6 + 0.7 * len(xv), 1.4 + 0.5 * len(yv)), dpi=130)
    im = ax.imshow(z, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(xv)), [str(v) for v in xv], fontsize=7)
    ax.set_yticks(range(len(yv)), [str(v) for v in yv], fontsize=7)
    ax.set_xlabel(axis_label(keys[0]))
    ax.set_ylabel(axis_label(keys[1]))
    for (yi, xi), v in np.ndenumerate(z):
        if v == v:
            ax.text(xi, yi, f"{v:.3g}", ha="center", va="center", fontsize=6, color="white")
    fig.colorbar(im, ax=ax, label="step time, s")
    ax.set_title(f"{study.name or 'study'}: step time (blank: nothing fits)", fontsize=8)
    fig.tight_layout()
    return fig


def _study_breakdown(plt, ok: list[dict], study, keys: list[str]):
    """Step time (s) of each point with a plan, stacked by part as in the text report."""
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.3 * len(ok)), dpi=130)
    left = [0.0] * len(ok)
    cmap = plt.get_cmap("tab20")
    for j, (name, key) in enumerate(TIME_PARTS):
        vals = [float(r.get(f"time_s.{key}") or 0.0) for r in ok]
        if any(vals):
            ax.barh(range(len(ok)), vals, left=left, color=cmap(j % 20), label=name)
            left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_yticks(range(len(ok)), [", ".join(f"{k}={r[f'axis.{k}']}" for k in keys) for r in ok], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("step time, s")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=4, frameon=False)
    ax.set_title(f"{study.name or 'study'}: step time by part", fontsize=9)
    fig.tight_layout()
    return fig


def plot_tornado(r: WhatifResult, path: str) -> None:
    """Bar chart of the step time (%) each resource's +pct% saves (`paraplan whatif --plot`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [x for x in r.levers if x.saved_pct is not None][::-1]
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.35 * len(rows)), dpi=130)
    ax.barh(
        [x.name for x in rows],
        [x.saved_pct for x in rows],
        color=["tab:green" if x.saved_pct >= 0 else "tab:red" for x in rows],
    )
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_xlabel(f"step time saved by +{r.pct:g}% of the resource, %")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title("what each resource is worth", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_gantt(fp: FleetProblem, r: FleetResult, path: str) -> None:
    """Gantt chart: one row per job, one bar per period it runs, labelled with type x nodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = [j.name for j in fp.jobs]
    colors = {t.name: f"C{i}" for i, t in enumerate(fp.node_types)}
    fig, ax = plt.subplots(figsize=(2 + 1.6 * fp.fleet.periods, 1 + 0.6 * len(jobs)))
    for s in r.schedule:
        y = jobs.index(s["job"])
        ax.barh(y, 1.0, left=s["period"] - 1, color=colors[s["node_type"]], edgecolor="black")
        ax.text(
            s["period"] - 0.5, y, f"{s['node_type']}\nx{s['nodes']}", ha="center", va="center", fontsize=7
        )
    for j in fp.jobs:
        if j.deadline_period:
            ax.plot([j.deadline_period] * 2, [jobs.index(j.name) - 0.45, jobs.index(j.name) + 0.45], "r-")
    ax.set_yticks(range(len(jobs)), jobs)
    ax.set_xticks(range(fp.fleet.periods + 1))
    ax.set_xlabel(f"period ({fp.fleet.period_days:g} days); red: deadline")
    ax.set_title(f"{fp.name or 'fleet'}: cost ${(r.cost_usd or 0) / 1e6:,.1f}M")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_pareto(r: ProcureResult, path: str) -> None:
    """The Pareto front as a PNG (matplotlib, headless): a colour and marker per node type (legend), log-log
    axes (costs and days span decades), the chosen purchase circled, labels offset alternately so they do not
    overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = r.pareto or []
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=130)
    tok = r.problem.training.tokens
    xs = [p.cost_usd / 1e6 for p in pts]
    ys = [p.days_to_train if tok else p.step_time_s for p in pts]
    ax.step(xs, ys, where="post", color="0.6", lw=1, zorder=1)
    kinds = sorted({"+".join(g.node_type.name for g in p.groups) for p in pts})
    cmap = plt.get_cmap("tab10")
    markers = "osD^v<>pXh"
    for j, kind in enumerate(kinds):
        sel = [i for i, p in enumerate(pts) if "+".join(g.node_type.name for g in p.groups) == kind]
        prior = any(g.node_type.system.calibration.status() == "prior" for g in pts[sel[0]].groups)
        ax.scatter(
            [xs[i] for i in sel],
            [ys[i] for i in sel],
            color=cmap(j % 10),
            marker=markers[j % len(markers)],
            s=36,
            zorder=3,
            label=kind + (" (prior only: uncalibrated)" if prior else ""),
        )
    for k, (p, x, y) in enumerate(zip(pts, xs, ys, strict=True)):
        n = sum(g.nodes for g in p.groups)
        ax.annotate(
            f"{n} node{'s' if n > 1 else ''}",
            (x, y),
            fontsize=7,
            xytext=(6, 8 if k % 2 else -12),
            textcoords="offset points",
        )
    best = r.best
    if best is not None:
        bx = best.cost_usd / 1e6
        by = best.days_to_train if tok else best.step_time_s
        ax.scatter(
            [bx],
            [by],
            s=220,
            facecolors="none",
            edgecolors="crimson",
            linewidths=2,
            zorder=4,
            label=f"chosen: {best.label()}",
        )
    if xs and max(xs) / max(min(xs), 1e-9) > 20:
        ax.set_xscale("log")
    if ys and max(ys) / max(min(ys), 1e-9) > 20:
        ax.set_yscale("log")
    ax.set_xlabel(
        "cost, $M" + (" (rental, whole run)" if r.problem.procure.pricing == Pricing.RENTAL else " (capex)")
    )
    ax.set_ylabel("days to train" if tok else "step time, s")
    ax.set_title(
        f"{r.problem.name or 'procure'}: cost against time to train (each point proven fastest "
        "within its budget)",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, title="node type", title_fontsize=7, loc="upper right", frameon=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_sites(rows: list[dict], path: str, title: str = "", x_key: str | None = None) -> None:
    """Days to train of the configurations considered across sites, a colour per scheme: bars over the
    number of sites (`x_key` None: one result's rows), or lines over a swept quantity (`x_key`, e.g. the
    WAN bandwidth, log axis), each scheme at its best number of sites."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"single-site": "0.35", "sync": "tab:blue", "diloco": "tab:orange"}
    fig, ax = plt.subplots(figsize=(7.5, 4.4), dpi=130)
    done = [r for r in rows if r.get("days_to_train") is not None]
    if x_key is None:
        for i, r in enumerate(done):
            lab = f"{r['sites']} {r['scheme']}" + (
                f" H={r['inner_steps']}" if r["scheme"] == "diloco" else ""
            )
            ax.bar(i, r["days_to_train"], color=colours.get(r["scheme"], "tab:green"))
            ax.text(i, r["days_to_train"], f"{r['days_to_train']:.1f}", ha="center", va="bottom", fontsize=7)
            ax.annotate(
                lab,
                (i, 0),
                rotation=60,
                ha="right",
                va="top",
                fontsize=7,
                xytext=(0, -4),
                textcoords="offset points",
            )
        ax.set_xticks([])
    else:
        for scheme, c in colours.items():
            pts: dict[float, dict] = {}
            for r in done:
                if r["scheme"] == scheme and (
                    r[x_key] not in pts or r["days_to_train"] < pts[r[x_key]]["days_to_train"]
                ):
                    pts[r[x_key]] = r
            xs = sorted(pts)
            if xs:
                ax.plot(xs, [pts[x]["days_to_train"] for x in xs], "o-", color=c, label=scheme)
                for x in xs:
                    ax.annotate(
                        str(pts[x]["sites"]),
                        (x, pts[x]["days_to_train"]),
                        fontsize=6,
                        xytext=(3, 3),
                        textcoords="offset points",
                    )
        ax.set_xscale("log")
        ax.set_yscale("log")  # a slow WAN makes synchronous sites take thousands of times longer
        ax.set_xlabel({"bandwidth_gbps": "link bandwidth, Gb/s"}.get(x_key, x_key.replace("_", " ")))
        ax.legend(title="scheme (label: sites used)", fontsize=8)
    ax.set_ylabel("days to train")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
