"""Heterogeneous pipelines: pipeline stages on different node types, with uneven layer counts.

The modelled family (as Metis, Sailor and FlashFlex plan it; Narayanan et al. 2021 for 1F1B): the job is one
pipeline of P stages replicated over d data-parallel ranks, every replica with the same micro-batch b and
n_mb = B/(d*b) micro-batches per step. The stages form G groups in pipeline order; group g runs on node type
t_g (a type holds at most one group) with its own tensor-parallel degree tp_g, its own recomputation, s_g
stages of L_g transformer layers each (sum_g s_g*L_g = L: the split is uneven across groups), on
d*s_g*tp_g GPUs of that type. The first group's first stage also holds the embedding, the last group's last
stage the LM head and loss. Sequence parallelism is on where tp > 1, the distributed optimizer (ZeRO-1) shards
the optimizer state over the d replicas of a stage, gradient reduction overlaps the backward; no interleaving,
context or expert parallelism, offload (a dense model; these stay with the homogeneous search).

Per group, the per-layer terms are the homogeneous model's own (`optimizer.model.step.evaluate` on that
type: tau, the per-layer forward + backward (+ recompute) time per micro-batch with its exposed TP traffic;
the LM head; stored and working activations; layer weights), so the two agree by construction. Per stage
of group g, per micro-batch, u_g = L_g * tau_g; the last stage adds the LM head it does not hide behind a p2p
exchange, he = max(head - t_p2p, 0) (`compose.edge_head`).

Step time (1F1B with unequal stages: the steady state runs at the slowest stage, the fill and drain pass
every stage once):

    T = (n_mb - 1) * M + sum_g s_g*u_g + he                                 pipeline
        + 2*n_mb*max_b p2p_b + 2*sum_b p2p_b                                p2p, b over the P-1 boundaries
        + max_g (dp_exposed_g + dp_slowdown_g + optimizer_g)                per group, in parallel
    M = max(max_g u_g, u_last + he)

Inside a group a boundary costs the p2p of one activation (1/tp with SP) on the tier its placement gives;
between groups it crosses the joining network (`catalog.joining_network`, default each type's outermost tier,
the slower of the two in time) with the larger of the two sides' messages. With one type this is exactly the
homogeneous model's step time for the same layout (vpp = 1, no embedding/loss layer slots; tested).

Memory per GPU, for the busiest stage of each group on its own GPU: weights (16-bit) and gradients of
its stage, optimizer state / d, activations: the group's first stage keeps min(n_mb, P - k_g) micro-batches
in flight (k_g stages before it; Korthikanti et al. 2022) of L_g layers' stored activations, plus the
working set of recomputation; the first stage adds the embedding output, the last stage keeps one micro-
batch and the fp32 logits. Per stage, not the homogeneous model's conservative max-of-parts, so a mix of one
type needs at most what the homogeneous plan needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.model.compose import dp_exposed as dp_exposed_by_zero
from optimizer.model.compose import edge_head
from optimizer.model.hardware import Tiers, collective_time
from optimizer.model.knobs import RECOMPUTE, Knobs, from_execution
from optimizer.model.layer import Ctx
from optimizer.model.step import (
    GIB,
    adam_time,
    dp_calls,
    dp_reductions,
    evaluate,
    layer_params_per_gpu,
    make_ctx,
    mtp_params,
    state_bytes,
)
from optimizer.rules.layout import domain_used, placement
from optimizer.schema import Execution, Problem, Recompute

FIRST, MIDDLE, LAST = "first", "middle", "last"


@dataclass(frozen=True)
class StageGroup:
    """Consecutive pipeline stages on one node type."""

    node_type: str
    tp: int
    stages: int
    layers: int  # transformer layers per stage
    recompute: Recompute = Recompute.NONE

    def gpus(self, dp: int) -> int:
        return dp * self.stages * self.tp


@dataclass(frozen=True)
class MixPlan:
    """A heterogeneous pipeline: groups in pipeline order, one data-parallel degree and micro-batch."""

    groups: tuple[StageGroup, ...]
    dp: int
    micro_batch: int

    def label(self) -> str:
        return (
            " | ".join(
                f"{g.node_type}: {g.stages} stage(s) x {g.layers} layers, tp {g.tp}"
                + ("" if g.recompute == Recompute.NONE else f", {g.recompute.value} recompute")
                for g in self.groups
            )
            + f"; dp {self.dp}, micro-batch {self.micro_batch}"
        )


def role_of(g: int, G: int) -> str:
    return FIRST if g == 0 else (LAST if g == G - 1 else MIDDLE)


def join_network(problem: Problem, joining=None) -> Tiers:
    """The network a node type reaches other types on: `joining` (catalog.joining_network), else its own
    outermost tier."""
    net = joining or problem.system.networks[-1]
    return Tiers.of(problem.system.model_copy(update={"networks": [net]}))


def join_time(msg, tiers: list[Tiers]):
    """One p2p exchange between two groups of different types: the larger message of the two sides
    (`msg` already the max) over the slower of the two sides' networks (the larger time)."""
    return np.maximum.reduce([collective_time("p2p", msg, 2.0, 0, t) for t in tiers])


def _layer_terms(problem: Problem, ctx: Ctx, dp: int, mb: int, tp, rec) -> dict | None:
    """The homogeneous model's per-layer terms for candidates of tensor-parallel degrees `tp` and recompute
    codes `rec` (arrays of one shape): each distinct (tp, rec) pair evaluated once (`evaluate`) as a two-stage
    plan of `dp` replicas and micro-batch `mb` (sequence parallelism where tp > 1, ZeRO-1, DP overlap, no
    scatter-gather), then spread to the candidates: layer time, LM head, forward and backward time per layer
    (s), stored and working activations, logits and embedding output (bytes), layer parameters per GPU.
    None when there are no candidates."""
    keys = sorted(set(zip(tp.ravel().tolist(), rec.ravel().tolist(), strict=True)))
    if not keys:
        return None
    exs = [
        Execution(
            tp=t,
            pp=2,
            dp=dp,
            micro_batch=mb,
            recompute=RECOMPUTE[r],
            sequence_parallel=t > 1,
            pp_rs_ag=False,
            zero=1,
            dp_overlap=True,
        )
        for t, r in keys
    ]
    kn = Knobs.concat([from_execution(e, problem.system, 2 * dp * e.tp) for e in exs])
    res = evaluate(problem, kn, ctx)
    te = res.terms
    idx = {k: i for i, k in enumerate(keys)}
    pos = np.vectorize(lambda a, b: idx[(int(a), int(b))], otypes=[np.int64])(tp, rec) if tp.size else tp

    def per(name):
        v = np.broadcast_to(np.asarray(getattr(te, name), dtype=float), (len(keys),))
        return v[pos]

    names = ("layer_s", "head_s", "layer_fw_s", "layer_bw_s")
    names += ("act_stored_bytes", "act_working_bytes", "logits_bytes", "mtp_act_bytes", "emb_out_bytes")
    out = {name: per(name) for name in names}
    out["p_layer"] = np.broadcast_to(np.asarray(layer_params_per_gpu(ctx, kn), dtype=float), (len(keys),))[
        pos
    ]
    return out


def _boundary(problem: Problem, ctx: Ctx, dp: int, mb: int, tp, stages) -> tuple:
    """One in-group stage boundary: (the message, bytes: a micro-batch's activation, 1/tp with SP; its p2p
    time, s, on the tier the group's placement gives the pipeline axis; that placement's DP tier)."""
    llm = ctx.llm
    e = ctx.e
    M = float(mb) * problem.seq_len * llm.hidden * e
    msg = np.where(tp > 1, M / tp, M)
    sizes = [n.size for n in problem.system.networks]
    pl = placement(sizes, tp, 1, dp, np.maximum(stages, 2), used=domain_used(problem.system))
    tier_pp, tier_dp = np.asarray(pl["pp"]), np.asarray(pl["dp"])
    p2p = collective_time("p2p", msg, 2.0, tier_pp, ctx.tiers)
    return msg, p2p, tier_dp


def _stage_params(ctx: Ctx, role: str, tp, L, p_layer):
    """Parameters of the group's busiest stage on one GPU: its L layers, plus the embedding on the first
    stage and the LM head and final norm on the last (vocab x hidden / tp each)."""
    llm, h = ctx.llm, ctx.llm.hidden
    vh = llm.vocab * h / tp
    mtp = mtp_params(ctx, tp, p_layer, ctx.mtp, True)  # the MTP modules on the last stage
    return (
        L * p_layer
        + (vh if role == FIRST else 0.0)
        + (vh + h * (2 if llm.bias else 1) + mtp if role == LAST else 0.0)
    )


def _dp_time(ctx: Ctx, dp: int, n_mb: int, P, gb, wb, tier_dp, tp, L, fwt, bwt, u) -> tuple:
    """The group's ZeRO-1 data-parallel traffic of `P` parameters over `dp` replicas (reduce-scatter of the
    gradients, all-gather of the weights on `tier_dp`, `compose.dp_links`) overlapped with the backward of
    its L layers (`compose.dp_exposed`, per-layer times fwt and bwt, s): (exposed s, the compute it slows
    by its share of the SMs, s); zeros (shaped as `u`) without data parallelism."""
    tiers = ctx.tiers
    d = float(dp)
    calls = dp_calls(ctx.stack, 1, P, d, L, pp=2)  # ZeRO-1 on a pipeline (pp > 1)
    RS, AR, AG = dp_reductions(P, gb, wb, d, tier_dp, tiers, stride=tp, calls=calls)
    link = RS + AG  # ZeRO-1 (`compose.dp_links`)
    bucket = 1.0 / np.maximum(L, 1.0)
    nl = n_mb * L
    exp = dp_exposed_by_zero(
        AR,
        RS,
        AG,
        2 * AG + RS,
        AR * bucket,
        RS * bucket,
        AG * bucket,
        (2 * AG + RS) * bucket,
        AR,
        RS,
        L * bwt,
        L * bwt,
        L * fwt,
        n_mb,
        nl,
        bwt,
        fwt + bwt,
    )[1]
    has_dp = dp > 1
    dp_exp = exp if has_dp else np.zeros_like(u)
    dp_slow = tiers.processor_usage[tier_dp] * (link - dp_exp) if has_dp else np.zeros_like(u)
    return dp_exp, dp_slow


def group_terms(problem: Problem, dp: int, mb: int, n_mb: int, role: str, tp, rec, layers, stages) -> dict:
    """Per candidate (arrays tp, rec (code), layers, stages of one shape) of one node type (`problem` is that
    type's problem: system, llm, training, options) in pipeline position `role`: the stage time u (s, per
    micro-batch), the LM head not hidden (he, last only), the p2p time of one in-group boundary (p2p) and
    the message (msg, bytes), the per-group DP + optimizer time (x), memory in bytes: fixed (weights,
    gradients, optimizer state, reserve, working set, edge extras), stored activations per micro-batch in
    flight (a), the last stage's alternative (last_alt; 0 elsewhere), GPUs (gpus)."""
    tp, rec, layers, stages = (
        np.asarray(x, dtype=np.int64) for x in np.broadcast_arrays(tp, rec, layers, stages)
    )
    sys_ = problem.system
    ctx = make_ctx(problem)
    lt = _layer_terms(problem, ctx, dp, mb, tp, rec)
    if lt is None:
        return {}
    tau, head, fwt, bwt = lt["layer_s"], lt["head_s"], lt["layer_fw_s"], lt["layer_bw_s"]
    stored, working = lt["act_stored_bytes"], lt["act_working_bytes"]
    logits, emb_out = lt["logits_bytes"] + lt["mtp_act_bytes"], lt["emb_out_bytes"]
    L = layers.astype(float)
    msg, p2p, tier_dp = _boundary(problem, ctx, dp, mb, tp, stages)
    u = L * tau
    he = edge_head(head, p2p, 2) if role == LAST else np.zeros_like(u)
    P = _stage_params(ctx, role, tp, L, lt["p_layer"])
    wb, gb, ob = state_bytes(ctx)
    d = float(dp)
    dp_exp, dp_slow = _dp_time(ctx, dp, n_mb, P, gb, wb, tier_dp, tp, L, fwt, bwt, u)
    opt = adam_time(ctx.hw, P / d, gb, ob, wb)
    fixed = (
        P * (wb + gb) + P / d * ob + sys_.reserved_gib * GIB + working + (emb_out if role == FIRST else 0.0)
    )
    a = L * stored
    last_alt = (
        a + working + logits + P * (wb + gb) + P / d * ob + sys_.reserved_gib * GIB
        if role == LAST
        else np.zeros_like(u)
    )
    return {
        "u": u,
        "he": he,
        "p2p": p2p,
        "msg": msg,
        "x": dp_exp + dp_slow + opt,
        "dp_exposed": dp_exp + dp_slow,
        "optimizer": opt,
        "fixed": fixed,
        "a": a,
        "last_alt": last_alt,
        "gpus": dp * stages * tp,
        "params": P,
    }


def inflight(n_mb: int, stages: list[int]) -> list[int]:
    """Micro-batches in flight on the first stage of each group: min(n_mb, stages from it to the end)."""
    return [min(n_mb, sum(stages[g:])) for g in range(len(stages))]


def compose_mix_step(n_mb, u: list, s: list, he, p2p: list, joins: list, x: list) -> dict:
    """The step time from the groups' terms (module docstring); floats or numpy arrays (candidates)."""
    G = len(u)
    M = np.maximum(np.maximum.reduce(list(u)), u[-1] + he)
    bounds = [np.where(np.asarray(s[g]) > 1, p2p[g], 0.0) for g in range(G)] + list(joins)
    pipe = (n_mb - 1) * M + sum(si * ui for si, ui in zip(s, u, strict=True)) + he
    p2p_t = 2 * n_mb * np.maximum.reduce(bounds) + 2 * (
        sum((np.asarray(s[g]) - 1) * p2p[g] for g in range(G)) + sum(joins)
    )
    xs = np.maximum.reduce(list(x))
    return {
        "pipeline": pipe,
        "p2p": p2p_t,
        "dp_optimizer": xs,
        "step_time": pipe + p2p_t + xs,
        "slowest_stage": M,
    }


@dataclass(frozen=True)
class MixResult:
    plan: MixPlan
    step_time_s: float
    parts_s: dict  # pipeline, p2p, dp_optimizer, slowest_stage
    stage_time_s: list  # per group, per micro-batch (the last with its LM head)
    hbm_bytes: list  # per group, per GPU
    capacity_bytes: list  # per group, per GPU (HBM less headroom)
    gpus: list  # per group

    @property
    def fits(self) -> bool:
        return all(h <= c for h, c in zip(self.hbm_bytes, self.capacity_bytes, strict=True))


def evaluate_mix(problems: dict[str, Problem], plan: MixPlan, joining=None) -> MixResult:
    """Step time and memory of one heterogeneous pipeline plan; `problems` maps node type to its problem."""
    from optimizer.model.capacity import capacity_bytes

    gs = plan.groups
    G = len(gs)
    if G < 2:
        raise ValueError("a heterogeneous pipeline has at least two groups (one type: the homogeneous model)")
    any_p = problems[gs[0].node_type]
    B = any_p.training.global_batch
    if B % (plan.dp * plan.micro_batch):
        raise ValueError(f"global batch {B} is not a multiple of dp x micro-batch")
    n_mb = B // (plan.dp * plan.micro_batch)
    terms = [
        group_terms(
            problems[g.node_type],
            plan.dp,
            plan.micro_batch,
            n_mb,
            role_of(i, G),
            g.tp,
            RECOMPUTE.index(g.recompute),
            g.layers,
            g.stages,
        )
        for i, g in enumerate(gs)
    ]
    t = [{k: float(np.asarray(v).reshape(-1)[0]) for k, v in d.items()} for d in terms]
    jt = [join_network(problems[g.node_type], joining) for g in gs]
    joins = [float(join_time(max(t[i]["msg"], t[i + 1]["msg"]), [jt[i], jt[i + 1]])) for i in range(G - 1)]
    s = [g.stages for g in gs]
    parts = {
        k: float(v)
        for k, v in compose_mix_step(
            n_mb, [x["u"] for x in t], s, t[-1]["he"], [x["p2p"] for x in t], joins, [x["x"] for x in t]
        ).items()
    }
    infl = inflight(n_mb, s)
    hbm = [max(x["fixed"] + i * x["a"], x["last_alt"]) for x, i in zip(t, infl, strict=True)]
    stage = [x["u"] for x in t]
    stage[-1] += t[-1]["he"]
    return MixResult(
        plan,
        parts["step_time"],
        parts,
        stage,
        hbm,
        [capacity_bytes(problems[g.node_type]) for g in gs],
        [g.gpus(plan.dp) for g in gs],
    )
