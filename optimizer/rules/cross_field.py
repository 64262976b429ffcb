"""Stage 2, validate: checks across fields that a schema alone cannot express.

`execution_errors` lists, for one execution, every integer constraint it breaks (the same constraints the
solver enforces): degrees multiply to the GPU count, heads and K/V heads split over tp, layers over
pp*vpp, the global batch over dp*micro_batch, the sequence over cp, network placement and memory tiers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.errors import ProblemError, ProblemErrors
from optimizer.rules.layout import moot
from optimizer.schema.stack import Stack, layout_unsupported, not_offered, profile

if TYPE_CHECKING:
    from optimizer.io.loader import Sourced
    from optimizer.schema import Execution, Problem


def execution_errors(problem: "Problem", ex: "Execution | None" = None) -> list[tuple[str, str]]:
    """(field path, message) for every rule the execution breaks: `optimizer.rules.layout`'s rule groups on this
    one execution, worded on the user's fields, plus the knob rules a layout does not cover (sequence
    parallelism with all-reduce, offload without offload memory, a precision the system lacks, explicit
    placement)."""
    from optimizer.rules.layout import Group, placement, rule_masks, tier_index, tier_spans

    p = problem
    ex = ex or p.execution
    llm, sysm = p.llm, p.system
    out: list[tuple[str, str]] = []
    n = p.num_gpus
    dp = ex.dp if ex.dp is not None else n // (ex.tp * ex.pp * ex.cp)
    used = ex.tp * ex.pp * ex.cp * dp
    if dp < 1:
        out.append(("execution.tp", f"tp*pp*cp = {ex.tp * ex.pp * ex.cp} exceeds num_gpus = {n}"))
        return out
    etp = ex.etp or ex.tp
    el = int(ex.pp_embedding_loss)
    ok = {g: bool(v) for g, v in rule_masks(p, ex.tp, ex.pp, dp, ex.cp, ex.vpp, ex.micro_batch, ex.ep, etp,
                                              el, int(ex.pp_uneven)).items()}
    if not ok[Group.GPUS]:
        if used > n:
            out.append(("execution.dp", f"tp*pp*dp*cp = {used} exceeds num_gpus = {n}"))
        elif used < n and not p.options.allow_idle_gpus:
            out.append(("execution.dp" if ex.dp is not None else "execution.tp",
                        f"tp*pp*dp*cp = {used} leaves {n - used} of {n} GPUs idle (set options.allow_idle_gpus)"))
        if used % p.options.gpu_multiple:
            out.append(("execution.dp", f"tp*pp*dp*cp = {used} is not a multiple of options.gpu_multiple = "
                        f"{p.options.gpu_multiple}"))
    if not ok[Group.TP_SPLIT]:
        if llm.heads % ex.tp:
            out.append(("execution.tp", f"heads ({llm.heads}) not divisible by tp ({ex.tp})"))
        if llm.kv % ex.tp and ex.tp % llm.kv:
            out.append(("execution.tp", f"kv_heads ({llm.kv}) and tp ({ex.tp}): neither divides the other"))
        if llm.ffn % ex.tp:
            out.append(("execution.tp", f"ffn ({llm.ffn}) not divisible by tp ({ex.tp})"))
    # no rule on vocab % tp: Megatron pads the vocabulary to a multiple of tp
    if not ok[Group.LAYERS]:
        slots = llm.layers + 2 * el
        if ex.pp_embedding_loss and ex.pp == 1:
            out.append(("execution.pp_embedding_loss", "the embedding/loss pipeline split needs pp > 1"))
        elif ex.vpp > 1 and ex.pp == 1:
            out.append(("execution.vpp", "interleaving (vpp > 1) needs pp > 1"))
        else:
            what = f"layers + 2 ({slots})" if ex.pp_embedding_loss else f"layers ({llm.layers})"
            out.append(("execution.pp", f"{what} not divisible by pp*vpp ({ex.pp}*{ex.vpp})"))
    B = p.training.global_batch
    if not ok[Group.BATCH]:
        out.append(("training.global_batch",
                    f"global batch {B} not divisible by dp*micro_batch = {dp}*{ex.micro_batch}"))
    elif not ok[Group.INTERLEAVE]:
        n_mb = B // (dp * ex.micro_batch)
        out.append(("execution.vpp", f"interleaved schedule needs micro-batches ({n_mb}) divisible by pp ({ex.pp})"))
    if not ok[Group.CONTEXT]:
        out.append(("execution.cp", f"seq_len {p.seq_len} not divisible by 2*cp = {2 * ex.cp} (load-balanced causal)"))
    if not ok[Group.EXPERTS]:
        if llm.moe is None:
            if ex.ep > 1:
                out.append(("execution.ep", "expert parallelism needs an MoE model"))
            if etp != ex.tp:
                out.append(("execution.etp", "expert tensor parallelism needs an MoE model"))
        elif llm.moe.experts % ex.ep:
            out.append(("execution.ep", f"experts ({llm.moe.experts}) not divisible by ep ({ex.ep})"))
        elif ex.tp % etp:
            out.append(("execution.etp", f"etp ({etp}) must divide tp ({ex.tp})"))
        elif llm.moe.expert_ffn % etp:
            out.append(("execution.etp", f"expert_ffn ({llm.moe.expert_ffn}) not divisible by etp ({etp})"))
        else:
            out.append(("execution.ep", f"ep*etp ({ex.ep}*{etp}) must divide the tp*cp*dp = {ex.tp * ex.cp * dp} "
                        "ranks of a pipeline stage (Megatron-Core expert groups)"))
    if ex.sequence_parallel and ex.tp_comm is not None and ex.tp_comm.value == "allreduce":
        out.append(("execution.tp_comm", "sequence parallelism needs tp_comm rs_ag"))
    if (ex.weight_offload or ex.activation_offload or ex.optimizer_offload) and sysm.offload.capacity_gib <= 0:
        out.append(("execution.weight_offload", "offload needs system.offload.capacity_gib > 0"))
    out += precision_errors(sysm, p.training.precision)
    # network placement: nested tiers hold the product of the degrees placed on them and below
    sizes = [x.size for x in sysm.networks]
    try:
        tiers = placement(sizes, ex.tp, ex.cp, dp, ex.pp, ex.ep, etp)
        for ax, v in (ex.placement or {}).items():
            tiers[ax] = tier_index(sysm, v)
    except ValueError as e:
        out.append(("execution.placement", str(e)))
        return out
    for net, span in zip(sysm.networks, tier_spans(sizes, tiers, ex.tp, ex.cp, dp, ex.pp)):
        span = int(span)
        if span > net.size:
            out.append(("execution.placement", f"axes on tier '{net.name}' and below span {span} GPUs > its size {net.size}"))
        if net.must_fill and net.size % span:
            out.append(("execution.placement", f"tier '{net.name}' must be filled: {span} does not divide {net.size}"))
    return out


def precision_errors(system, precision, field: str = "training.precision") -> list[tuple[str, str]]:
    """The training precision needs the system's matrix peak in it."""
    if system.peak_tflops(precision) is not None:
        return []
    have = ", ".join(str(getattr(p, "value", p)) for p in system.matrix_tflops) or "none"
    return [(field, f"system {system.name} has no {precision.value} matrix peak (it has: {have})")]


def raise_errors(errs: list[tuple[str, str]], doc: "Sourced | None") -> None:
    """Raise (field path, message) pairs as file:line:field errors (nothing when empty)."""
    if not errs:
        return
    out = []
    for fieldpath, msg in errs:
        loc = tuple(int(x) if x.isdigit() else x for x in fieldpath.split("."))
        file, line = doc.locate(loc) if doc is not None else ("<problem>", None)
        out.append(ProblemError(file, line, fieldpath, msg))
    raise ProblemErrors(out)


def check_problem(problem: "Problem", doc: "Sourced | None" = None) -> None:
    """Raise file:line:field errors for every broken rule of the problem's execution."""
    errs = execution_errors(problem)
    if not errs:
        return
    out = []
    for fieldpath, msg in errs:
        loc = tuple(fieldpath.split("."))
        if doc is not None:
            file, line = doc.locate(loc)
        else:
            file, line = "<problem>", None
        out.append(ProblemError(file, line, fieldpath, msg))
    raise ProblemErrors(out)


def execution_warnings(stack: Stack, ex, precision=None) -> list[str]:
    """Knobs of an execution (`evaluate`, `--emit`) that the stack does not offer (at `precision`), unless moot in
    its layout (`rules.layout.moot`: e.g. sequence parallelism at tp 1)."""
    no_dp = ex.dp == 1 and ex.cp == 1
    out = [f"{knob}={not_offered(stack, knob, getattr(ex, knob), precision)}"
           for knob, allowed in profile(stack, precision).items()
           if knob != "precision" and getattr(ex, knob) not in allowed
           and not moot(knob, ex.tp, ex.pp, no_dp, ex.ep == 1)]
    return out + [f"{k}={m}" for k, m in layout_unsupported(stack, ex)
                  if not any(w.startswith(f"{k}=") for w in out) and not moot(k, ex.tp, ex.pp, no_dp, ex.ep == 1)]
