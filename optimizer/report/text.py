"""Plain-text rendering of an evaluation (profile-like) and of a validation."""

from __future__ import annotations

from typing import Any

from optimizer.model import bands
from optimizer.prepare.objective import gpus_used
from optimizer.report.goodput import goodput_dict, goodput_lines

GIB = 2.0**30


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:9.3f} s "
    if x >= 1e-3:
        return f"{x * 1e3:9.2f} ms"
    return f"{x * 1e6:9.1f} us"


def table(rows: list[list[str]], header: list[str] | None = None) -> str:
    allrows = ([header] if header else []) + rows
    widths = [max(len(str(r[i])) for r in allrows) for i in range(len(allrows[0]))]
    lines = []
    for j, r in enumerate(allrows):
        lines.append(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
        )
        if header and j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


TIME_PARTS = [
    ("forward", "fw"),
    ("backward", "bw"),
    ("recompute", "recompute"),
    ("embedding/LM head/loss", "head"),
    ("optimizer", "optimizer"),
    ("TP communication (exposed)", "tp_exposed"),
    ("CP communication (exposed)", "cp_exposed"),
    ("EP all-to-all (exposed)", "ep_exposed"),
    ("PP communication (exposed)", "pp_exposed"),
    ("DP communication (exposed)", "dp_exposed"),
    ("pipeline bubble", "bubble"),
    ("offload (exposed)", "offload_exposed"),
    ("overlap slowdown", "overlap_slowdown"),
    ("FSDP gradient/weight copies", "fsdp_copies"),
    ("host launch wait (eager MoE)", "host_wait"),
]
MEM_PARTS = [
    ("weights", "weights"),
    ("gradients", "grads"),
    ("optimizer state", "optim_state"),
    ("activations", "activations"),
    ("runtime reserved", "reserved"),
]


def evaluation_dict(ev: Any) -> dict[str, Any]:
    """The JSON object of `paraplan evaluate --json`."""
    r = ev.result
    cap = ev.problem.system.hbm_gib
    return {
        "problem": ev.problem.name,
        "llm": ev.problem.llm.name,
        "system": ev.problem.system.name,
        "num_gpus": ev.problem.num_gpus,
        "precision": ev.problem.training.precision.value,
        "execution": ev.execution.model_dump(mode="json"),
        "step_time_s": r["step_time"],
        "time_s": {key: r[key] for _, key in TIME_PARTS},
        "link_time_s": {
            "tp": r["tp_link"],
            "cp": r["cp_link"],
            "ep": r["ep_link"],
            "pp": r["pp_link"],
            "dp": r["dp_link"],
        },
        "memory_gib": {key: r[key] / GIB for _, key in MEM_PARTS}
        | {
            "activations_loss_logits": r["act_loss_logits"] / GIB,
            "activations_recompute_working_set": r["act_working"] / GIB,
            "total": r["hbm"] / GIB,
            "allocator_reserved_peak": r["hbm_reserved"] / GIB,
            "capacity": cap,
        },
        "offload_memory_gib": r["offload_mem"] / GIB,
        "offload_bandwidth_need_gbps": r["offload_bw_need"] / 1e9,
        "fits": ev.fits,
        "mfu": r["mfu"],
        "hfu": r["hfu"],
        "tokens_per_s": r["tokens_per_s"],
        "samples_per_s": r["samples_per_s"],
        "micro_batches": r["n_mb"],
        "time_to_train_s": ev.time_to_train_s,
        "warnings": ev.warnings,
    } | ({"goodput": goodput_dict(ev.goodput)} if getattr(ev, "goodput", None) is not None else {})


def calibration_line(system: Any, stack: Any = None, kind: str | None = None) -> str:
    """One line: whether the system's efficiencies were fitted on published runs (of which stacks), copied
    from a same-die system, or are priors (then its step times are guesses, not predictions)."""
    cal = system.calibration
    line = f"calibration: {system.name}: {bands.summary(system, stack, kind)}"
    if cal.status() == "prior":
        line += " -- efficiencies are priors: step times are uncalibrated estimates"
    return line


def render_evaluation(ev: Any) -> str:
    """One evaluation as text: the execution's knobs, the step time's parts (s), memory per GPU (GiB),
    MFU/HFU and throughput, time to train (days) and whether it fits."""
    d = evaluation_dict(ev)
    ex = ev.execution
    p = ev.problem
    used = gpus_used(ex)
    idle = f" ({used} used, {p.num_gpus - used} idle)" if used < p.num_gpus else ""
    out = [
        f"paraplan evaluate: {p.name or ''}  {p.llm.name} on {p.num_gpus} x {p.system.name}{idle}",
        calibration_line(p.system, p.stack, bands.kind_of(p.llm)),
    ]
    out.append("execution: " + _knobs_text(ex, d, p))
    if ex.activation_offload and ex.activation_offload_layers:
        out.append(f"activation offload: {ex.activation_offload_layers} layers per stage")
    if ex.weight_offload or ex.activation_offload or ex.optimizer_offload:
        out.append(
            f"offload: weights={ex.weight_offload} activations={ex.activation_offload} "
            f"optimizer={ex.optimizer_offload}"
        )
    total = d["step_time_s"]
    rows = [
        [name, _fmt_s(d["time_s"][key]), f"{100 * d['time_s'][key] / total:5.1f}%"]
        for name, key in TIME_PARTS
        if d["time_s"][key] > 0
    ]
    rows.append(["step time", _fmt_s(total), "100.0%"])
    out += ["", table(rows, ["time per step", "time", "share"])]
    mem = d["memory_gib"]
    mrows = _memory_rows(mem)
    out += ["", table(mrows, ["memory per GPU (worst stage)", "GiB"])]
    if d["offload_memory_gib"] > 0:
        out.append(
            f"offload memory: {d['offload_memory_gib']:.2f} GiB, link need "
            f"{d['offload_bandwidth_need_gbps']:.1f} GB/s"
        )
    out += [
        "",
        f"MFU {100 * d['mfu']:.1f}%  HFU {100 * d['hfu']:.1f}%  "
        f"{d['tokens_per_s']:.0f} tokens/s  {d['samples_per_s']:.2f} samples/s  "
        f"{d['micro_batches']:.0f} micro-batches",
        "  (MFU: the model's FLOPs, 6 x active parameters + 12 L s a d attention per token with full "
        "attention as published (PaLM, App. B), over peak; HFU: the FLOPs the kernels execute, recompute "
        "included and causal flash attention at half the scores, so HFU < MFU when that half outweighs the "
        "recompute)",
    ]
    if d["time_to_train_s"]:
        out.append(
            f"time to train {p.training.tokens:.3g} tokens: {d['time_to_train_s'] / 86400:.2f} days without "
            "interruptions"
        )
    if getattr(ev, "goodput", None) is not None:
        out += goodput_lines(ev.goodput)
    out.append(f"fits in memory: {'yes' if d['fits'] else 'NO'}")
    from optimizer.model.capacity import memory_margin_warning

    margin = memory_margin_warning(ev.result["hbm"], p) if d["fits"] else None
    if margin:
        out.append(f"warning: {margin}")
    for w in d["warnings"]:
        out.append(f"warning: {w}")
    return "\n".join(out)


def _knobs_text(ex: Any, d: dict, p: Any) -> str:
    """The execution's knobs as `name=value` words (MoE and selective-recompute knobs where they apply)."""
    knobs = (
        f"tp={ex.tp} pp={ex.pp} dp={d['execution']['dp']} cp={ex.cp} vpp={ex.vpp} "
        f"micro_batch={ex.micro_batch} recompute={ex.recompute.value} sp={ex.sequence_parallel} "
        f"zero={ex.zero} tp_overlap={ex.tp_overlap.value} "
        f"dp_overlap={ex.dp_overlap} attention={ex.attention.value} schedule={ex.schedule.value}"
    )
    if ex.pp > 1 and ex.pp_embedding_loss:
        knobs += " embedding_loss_slots"
    if ex.pp > 1 and ex.pp_uneven:  # a custom layout
        knobs += " uneven_split"
    if ex.cp > 1:
        knobs += f" cp_comm={ex.cp_comm.value}"
    if p.llm.moe is not None:
        knobs += f" ep={ex.ep} etp={ex.etp or ex.tp} cuda_graphs={ex.cuda_graphs.value}"
        knobs += " fused_expert_mlp" if ex.moe_fused_mlp else ""
        if ex.ep > 1:
            knobs += f" moe_dispatcher={ex.moe_dispatcher.value} ep_overlap={ex.ep_overlap}"
    if ex.recompute.value == "selective" and ex.recompute_modules:
        knobs += f" recompute_modules={','.join(m.value for m in ex.recompute_modules)}"
    return knobs


def _memory_rows(mem: dict) -> list[list[str]]:
    """Rows of the memory table (GiB per GPU, worst stage): the parts, the activations' shares, the totals."""
    mrows = []
    for name, key in MEM_PARTS:
        mrows.append([name, f"{mem[key]:8.2f}"])
        if key == "activations":
            mrows += [
                [f"  of which {what}", f"{mem[k]:8.2f}"]
                for what, k in (
                    ("loss logits", "activations_loss_logits"),
                    ("recompute working set", "activations_recompute_working_set"),
                )
                if mem[k] > 0
            ]
    mrows.append(["total HBM", f"{mem['total']:8.2f}"])
    mrows.append(["allocator peak (PyTorch reserved)", f"{mem['allocator_reserved_peak']:8.2f}"])
    mrows.append(["capacity", f"{mem['capacity']:8.2f}"])
    return mrows


def render_validation(v: dict[str, Any]) -> str:
    rows = []
    for r in v["runs"]:
        if r["status"] != "ok":
            rows.append([r["id"], r["status"], "", "", "", "", r["reason"] or ""])
            continue
        mem = (
            f"{r['predicted_peak_memory_gib']:.1f}/{r['target_peak_memory_gib']:.1f}"
            if r["target_peak_memory_gib"]
            else f"{r['predicted_peak_memory_gib']:.1f}"
        )
        rows.append(
            [
                r["id"],
                "ok",
                f"{r['predicted_step_time_s']:.3f}",
                f"{r['target_step_time_s']:.3f}",
                f"{r['error_pct']:+.1f}%",
                mem,
                "" if r["fits"] else "does not fit",
            ]
        )
    out = [table(rows, ["run", "status", "pred s", "target s", "error", "peak GiB", "note"])]
    out.append("")
    out.append("assumptions:")
    for r in v["runs"]:
        if r["assumptions"]:
            out.append(f"  {r['id']}: " + "; ".join(r["assumptions"]))
        if r.get("chosen"):
            out.append(f"  {r['id']}: chosen " + ", ".join(f"{k}={v}" for k, v in r["chosen"].items()))
    s = v["summary"]

    def f(x, unit="%"):
        return "n/a" if x is None else f"{x:.2f}{unit}"

    out.append("")
    out.append(f"runs {s['n_runs']}, scored {s['n_scored']}, not fitting {s['n_not_fitting']}")
    out.append(
        f"MAPE {f(s['mape_pct'])}  max |error| {f(s['max_abs_error_pct'])}  "
        f"memory MAPE {f(s['memory_mape_pct'])}"
    )
    for st, b in (s.get("by_stack") or {}).items():
        out.append(
            f"  stack {st}: {b['n']} runs, MAPE {f(b['mape_pct'])}, mean signed error "
            f"{b['mean_signed_error_pct']:+.2f}%"
        )
    po = s.get("precision_order") or {}
    if po.get("n_groups"):
        out.append(
            f"precision order: {po['n_ordered']} of {po['n_groups']} groups (model, GPU, GPUs, sequence, "
            "global batch) ordered as measured (fastest first)"
        )
        for g in po["groups"]:
            if not g["ordered"]:
                out.append(
                    f"  {' '.join(map(str, g['group']))}: measured {' > '.join(g['measured'])}, "
                    f"model {' > '.join(g['predicted'])}"
                )
    return "\n".join(out)
