"""Stage 2, validate: checks across fields that a schema alone cannot express.

`execution_errors` lists, for one execution, every integer constraint it breaks (the same constraints the
solver enforces): degrees multiply to the GPU count, heads and K/V heads split over tp, layers over
pp*vpp, the global batch over dp*micro_batch, the sequence over cp, network placement and memory tiers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from optimizer.errors import ProblemError, ProblemErrors
from optimizer.rules.layout import (
    Group,
    cp_a2a_degree,
    cp_comm_limits,
    domain_used,
    dp_last,
    moot,
    placement,
    rule_masks,
    tier_index,
    tier_spans,
)
from optimizer.schema.common import CP_COMM_CODES, CpComm, Schedule
from optimizer.schema.stack import (
    Stack,
    layout_unsupported,
    not_offered,
    profile,
    recompute_modules_unsupported,
    written_unsupported,
)

if TYPE_CHECKING:
    from optimizer.io.loader import Sourced
    from optimizer.schema import Execution, Problem


def execution_errors(problem: Problem, ex: Execution | None = None) -> list[tuple[str, str]]:
    """(field path, message) for every rule the execution breaks: `optimizer.rules.layout`'s rule groups on
    this one execution, worded on the user's fields, plus the knob rules a layout does not cover (sequence
    parallelism with all-reduce, offload without offload memory, a precision the system lacks, explicit
    placement)."""
    p = problem
    ex = ex or p.execution
    n = p.num_gpus
    dp = ex.dp if ex.dp is not None else n // (ex.tp * ex.pp * ex.cp)
    if dp < 1:
        return [("execution.tp", f"tp*pp*cp = {ex.tp * ex.pp * ex.cp} exceeds num_gpus = {n}")]
    etp = ex.etp or ex.tp
    ok = {
        g: bool(v)
        for g, v in rule_masks(
            p,
            ex.tp,
            ex.pp,
            dp,
            ex.cp,
            ex.vpp,
            ex.micro_batch,
            ex.ep,
            etp,
            int(ex.pp_embedding_loss),
            int(ex.pp_uneven),
        ).items()
    }
    out: list[tuple[str, str]] = []
    if not ok[Group.GPUS]:
        out += _gpu_errors(p, ex, dp)
    if not ok[Group.TP_SPLIT]:
        out += _tp_split_errors(p.llm, ex.tp)
    # no rule on vocab % tp: Megatron pads the vocabulary to a multiple of tp
    if not ok[Group.LAYERS]:
        out += _layer_errors(p.llm, ex)
    out += _batch_errors(p, ex, dp, ok)
    if not ok[Group.CONTEXT]:
        out.append(
            (
                "execution.cp",
                f"seq_len {p.seq_len} not divisible by 2*cp = {2 * ex.cp} (load-balanced causal)",
            )
        )
    if not ok[Group.EXPERTS]:
        out += _expert_errors(p.llm, ex, dp, etp)
    out += _knob_errors(p, ex)
    return out + _placement_errors(p.system, ex, dp, etp)


def _gpu_errors(p: Problem, ex: Execution, dp: int) -> list[tuple[str, str]]:
    """The GPUS group: tp*pp*dp*cp within num_gpus, leaving none idle unless allowed, a multiple of
    options.gpu_multiple."""
    n = p.num_gpus
    used = ex.tp * ex.pp * ex.cp * dp
    out = []
    if used > n:
        out.append(("execution.dp", f"tp*pp*dp*cp = {used} exceeds num_gpus = {n}"))
    elif used < n and not p.options.allow_idle_gpus:
        out.append(
            (
                "execution.dp" if ex.dp is not None else "execution.tp",
                f"tp*pp*dp*cp = {used} leaves {n - used} of {n} GPUs idle (set options.allow_idle_gpus)",
            )
        )
    if used % p.options.gpu_multiple:
        out.append(
            (
                "execution.dp",
                f"tp*pp*dp*cp = {used} is not a multiple of options.gpu_multiple = {p.options.gpu_multiple}",
            )
        )
    return out


def _tp_split_errors(llm, tp: int) -> list[tuple[str, str]]:
    """The TP_SPLIT group: heads and ffn divisible by tp; K/V heads and tp, one dividing the other."""
    out = []
    if llm.heads % tp:
        out.append(("execution.tp", f"heads ({llm.heads}) not divisible by tp ({tp})"))
    if llm.kv % tp and tp % llm.kv:
        out.append(("execution.tp", f"kv_heads ({llm.kv}) and tp ({tp}): neither divides the other"))
    if llm.ffn % tp:
        out.append(("execution.tp", f"ffn ({llm.ffn}) not divisible by tp ({tp})"))
    return out


def _layer_errors(llm, ex: Execution) -> list[tuple[str, str]]:
    """The LAYERS group: the embedding/loss split and interleaving need pp > 1; else layers (+ 2 with the
    embedding and loss as slots) divisible by pp*vpp."""
    if ex.pp_embedding_loss and ex.pp == 1:
        return [("execution.pp_embedding_loss", "the embedding/loss pipeline split needs pp > 1")]
    if ex.vpp > 1 and ex.pp == 1:
        return [("execution.vpp", "interleaving (vpp > 1) needs pp > 1")]
    slots = llm.layers + 2 * int(ex.pp_embedding_loss)
    what = f"layers + 2 ({slots})" if ex.pp_embedding_loss else f"layers ({llm.layers})"
    return [("execution.pp", f"{what} not divisible by pp*vpp ({ex.pp}*{ex.vpp})")]


def _batch_errors(p: Problem, ex: Execution, dp: int, ok: dict) -> list[tuple[str, str]]:
    """The BATCH group (global batch divisible by dp*micro_batch), else the INTERLEAVE group (micro-batches
    divisible by pp for the interleaved schedule)."""
    B = p.training.global_batch
    if not ok[Group.BATCH]:
        return [
            (
                "training.global_batch",
                f"global batch {B} not divisible by dp*micro_batch = {dp}*{ex.micro_batch}",
            )
        ]
    if not ok[Group.INTERLEAVE]:
        n_mb = B // (dp * ex.micro_batch)
        return [
            (
                "execution.vpp" if ex.vpp > 1 else "execution.pp",
                f"{'interleaved schedule' if ex.vpp > 1 else 'the maxtext pipeline'} needs micro-batches "
                f"({n_mb}) divisible by pp ({ex.pp})",
            )
        ]
    n_mb = B // (dp * ex.micro_batch)
    if ex.schedule in (Schedule.DUALPIPE_V, Schedule.ZERO_BUBBLE_V) and ex.pp > 1 and n_mb < 2 * ex.pp:
        return [
            (
                "execution.schedule",
                f"{ex.schedule.value} needs at least 2*pp = {2 * ex.pp} micro-batches (one per stage: "
                f"PyTorch's DualPipeV requires it, ZB-V fills its pipeline from 2*pp-1), {n_mb} here",
            )
        ]
    return []


def _expert_errors(llm, ex: Execution, dp: int, etp: int) -> list[tuple[str, str]]:
    """The EXPERTS group: ep and etp need an MoE model; experts divisible by ep, etp dividing tp and the
    expert ffn, ep*etp dividing a pipeline stage's ranks (Megatron-Core expert groups)."""
    if llm.moe is None:
        out = []
        if ex.ep > 1:
            out.append(("execution.ep", "expert parallelism needs an MoE model"))
        if etp != ex.tp:
            out.append(("execution.etp", "expert tensor parallelism needs an MoE model"))
        return out
    if llm.moe.experts % ex.ep:
        return [("execution.ep", f"experts ({llm.moe.experts}) not divisible by ep ({ex.ep})")]
    if ex.tp % etp:
        return [("execution.etp", f"etp ({etp}) must divide tp ({ex.tp})")]
    if llm.moe.expert_ffn % etp:
        return [("execution.etp", f"expert_ffn ({llm.moe.expert_ffn}) not divisible by etp ({etp})")]
    if dp_last(ex) and ex.pp > 1 and ex.ep * etp != ex.tp * ex.cp:
        return [
            (
                "execution.ep",
                f"with rank_order {ex.rank_order.value} and pp > 1, ep*etp ({ex.ep}*{etp}) must equal "
                f"tp*cp ({ex.tp}*{ex.cp}): Megatron-Core needs equal expert and dense data-parallel sizes",
            )
        ]
    return [
        (
            "execution.ep",
            f"ep*etp ({ex.ep}*{etp}) must divide the tp*cp*dp = {ex.tp * ex.cp * dp} "
            "ranks of a pipeline stage (Megatron-Core expert groups)",
        )
    ]


def _knob_errors(p: Problem, ex: Execution) -> list[tuple[str, str]]:
    """Knob rules no layout group covers: sequence parallelism needs reduce-scatter/all-gather TP
    communication, offload needs offload memory, the precision needs the system's matrix peak."""
    out = []
    if ex.sequence_parallel and ex.tp_comm is not None and ex.tp_comm.value == "allreduce":
        out.append(("execution.tp_comm", "sequence parallelism needs tp_comm rs_ag"))
    offload = ex.weight_offload or ex.activation_offload or ex.optimizer_offload
    if offload and p.system.offload.capacity_gib <= 0:
        out.append(("execution.weight_offload", "offload needs system.offload.capacity_gib > 0"))
    if (
        ex.ep_overlap
        and ex.ep > 1
        and (ex.moe_dispatcher.value == "allgather" or ex.recompute.value == "full")
    ):
        out.append(
            (
                "execution.ep_overlap",
                "the MoE all-to-all overlap runs with the alltoall or flex dispatcher and without full "
                "recompute (Megatron-Core overlap_moe_expert_parallel_comm)",
            )
        )
    return out + _cp_comm_errors(p, ex) + precision_errors(p.system, p.training.precision)


def _cp_comm_errors(p: Problem, ex: Execution) -> list[tuple[str, str]]:
    """The CP exchange must run the model's attention (`layout.cp_comm_limits`: sliding windows, attention
    sinks); an all-to-all splits the heads over its ranks: tp*cp (a2a) or tp times the NVLink domain's share
    of cp (a2a_p2p, `layout.cp_a2a_degree`) must divide the q and the K/V heads."""
    code = CP_COMM_CODES.index(CpComm(ex.cp_comm))
    if ex.cp == 1:
        return []
    allowed, why = cp_comm_limits(p.llm, p.stack)
    if allowed is not None and code not in allowed:
        return [("execution.cp_comm", f"{ex.cp_comm.value}: {why} in Transformer Engine")]
    if code < 2:
        return []
    a = ex.cp if code == 2 else int(cp_a2a_degree(ex.tp, ex.cp, p.system.networks[0].used))
    llm = p.llm
    if llm.heads % (ex.tp * a) or llm.kv % (ex.tp * a):
        return [
            (
                "execution.cp_comm",
                f"{ex.cp_comm.value} splits the heads over tp x {a} = {ex.tp * a} ranks: heads {llm.heads} "
                f"and kv_heads {llm.kv} must both divide by it (p2p or all_gather do not split them)",
            )
        ]
    return []


def _placement_errors(sysm, ex: Execution, dp: int, etp: int) -> list[tuple[str, str]]:
    """Network placement: nested tiers hold the product of the degrees placed on them and below, within each
    tier's size, dividing it when the tier must be filled; an explicit placement must name known tiers."""
    sizes = [x.size for x in sysm.networks]
    try:
        tiers = placement(
            sizes, ex.tp, ex.cp, dp, ex.pp, ex.ep, etp, used=domain_used(sysm), dp_last=dp_last(ex)
        )
        for ax, v in (ex.placement or {}).items():
            tiers[ax] = tier_index(sysm, v)
    except ValueError as e:
        return [("execution.placement", str(e))]
    out = []
    for net, span in zip(sysm.networks, tier_spans(sizes, tiers, ex.tp, ex.cp, dp, ex.pp), strict=True):
        span = int(span)
        if span > net.size:
            out.append(
                (
                    "execution.placement",
                    f"axes on tier '{net.name}' and below span {span} GPUs > its size {net.size}",
                )
            )
        if net.must_fill and net.size % span:
            out.append(
                (
                    "execution.placement",
                    f"tier '{net.name}' must be filled: {span} does not divide {net.size}",
                )
            )
    return out


def precision_errors(system, precision, field: str = "training.precision") -> list[tuple[str, str]]:
    """The training precision needs the system's matrix peak in it."""
    if system.peak_tflops(precision) is not None:
        return []
    have = ", ".join(str(getattr(p, "value", p)) for p in system.matrix_tflops) or "none"
    return [(field, f"system {system.name} has no {precision.value} matrix peak (it has: {have})")]


def raise_errors(errs: list[tuple[str, str]], doc: Sourced | None) -> None:
    """Raise (field path, message) pairs as file:line:field errors (nothing when empty)."""
    if not errs:
        return
    out = []
    for fieldpath, msg in errs:
        loc = tuple(int(x) if x.isdigit() else x for x in fieldpath.split("."))
        file, line = doc.locate(loc) if doc is not None else ("<problem>", None)
        out.append(ProblemError(file, line, fieldpath, msg))
    raise ProblemErrors(out)


def check_problem(problem: Problem, doc: Sourced | None = None) -> None:
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
    """Knobs of an execution (`evaluate`, `--emit`) that the stack does not offer (at `precision`), unless
    moot in its layout (`rules.layout.moot`: e.g. sequence parallelism at tp 1)."""
    no_dp = ex.dp == 1 and ex.cp == 1
    out = [
        f"{knob}={not_offered(stack, knob, getattr(ex, knob), precision)}"
        for knob, allowed in profile(stack, precision).items()
        if knob != "precision"
        and getattr(ex, knob) not in allowed
        and not moot(knob, ex.tp, ex.pp, no_dp, ex.ep == 1, ex.cp == 1)
    ]
    jax = recompute_modules_unsupported(stack, ex.recompute_modules)
    if jax:
        out.append(f"recompute_modules={jax}")
    out += [f"{k}={m}" for k, m in written_unsupported(stack, ex, precision) if k == "rank_order"]
    return out + [
        f"{k}={m}"
        for k, m in layout_unsupported(stack, ex)
        if not any(w.startswith(f"{k}=") for w in out)
        and not moot(k, ex.tp, ex.pp, no_dp, ex.ep == 1, ex.cp == 1)
    ]
