"""The training step: pipeline schedule, data-parallel traffic, optimizer, offload; memory per tier.

Time of one optimizer step on the slowest pipeline stage (the last, which also runs the LM head and
loss; Narayanan et al. 2021, Sec. 2.2):

    T = n_mb * (Ls * tau + head) + bubble + p2p + dp_exposed + optimizer + offload_exposed + fsdp_copies

with Ls = L/pp layers per stage ((L+2)/pp on a middle stage when the embedding and loss take a layer
slot each, Megatron-Core's account_for_embedding/loss_in_pipeline_split), tau the per-layer per-micro-batch
time of `layer.block_cost` (compute, recompute and exposed TP/CP traffic), n_mb = B/(dp*b) micro-batches and,
for 1F1B with vpp virtual stages (interleaving), bubble = (pp-1)/vpp * Ls * tau; p2p = 2*(n_mb*vpp +
pp-1)*t_p2p less, per micro-batch, the min(t_p2p, head) that the edge stage's extra work hides (with
interleaving and overlap_p2p_comm a steady-state exchange costs only what exceeds a chunk's forward; the
steady-state cycle of 1F1B: a middle stage waits on two neighbours per chunk, the edge stage on one).

Data-parallel gradient traffic (over dp*cp ranks) is a ring all-reduce, or with ZeRO >= 1 a
reduce-scatter of gradients plus an all-gather of parameters; ZeRO-2 reduces at every micro-batch and
ZeRO-3 also gathers parameters in forward and backward of every micro-batch (FSDP). With overlap the
gradient reduction hides behind the backward of the last micro-batch (and, interleaved, behind the
other chunks' cool-down: Calculon's window), the gather behind the first forward; one bucket (a layer)
is always exposed. Overlapped traffic slows compute by the tier's processor usage.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from optimizer.model.compose import (
    PIPE,
    dp_links,
    edge_extra,
    edge_head,
    fsdp_traffic,
    layout_factors,
    layout_slack,
    layout_units,
    mb_factors,
    p2p_steady,
    pipeline,
    split_slots,
    v_schedule,
    vpp_factors,
)
from optimizer.model.compose import activations as compose_activations
from optimizer.model.compose import dp_exposed as dp_exposed_by_zero
from optimizer.model.fitted import FITTED
from optimizer.model.hardware import Hardware, Tiers, collective_time, tier_of
from optimizer.model.knobs import Knobs
from optimizer.model.layer import BlockCost, Ctx, block_cost, kv_per_rank
from optimizer.model.params import attention_params, count, mlp_matrices, model_flops_per_token
from optimizer.model.terms import StepTerms, step_of
from optimizer.rules.layout import dp_last, has_dp_group
from optimizer.schema import Precision, Problem, Schedule
from optimizer.schema.common import SCHEDULE_CODES
from optimizer.schema.stack import Stack, dp_bucket_params, fsdp_copy_bytes, zero2_regathers

GIB = 2.0**30
ALLOCATOR_SLACK = FITTED.allocator_slack_ratio  # PyTorch caching allocator: reserved / allocated - 1 at the
# peak; fitted by scripts/calibrate_memory.py on the published runs with a measured peak (fitted.yaml)


def make_ctx(problem: Problem) -> Ctx:
    tr = problem.training
    grad_bytes = 4 if tr.grad_precision == Precision.FP32 else 2
    return Ctx(
        llm=problem.llm,
        hw=Hardware(problem.system, tr.precision, problem.stack),
        tiers=Tiers.of(problem.system),
        seq_len=problem.seq_len,
        global_batch=tr.global_batch,
        precision=tr.precision,
        grad_bytes=grad_bytes,
        master_weights=tr.master_weights,
        stack=problem.stack,
        dp_last=dp_last(problem.execution),
    )


@dataclass(frozen=True)
class StepResult:
    """Breakdown of one step for every candidate (arrays). Seconds, bytes, FLOP."""

    # time, s
    fw: np.ndarray
    bw: np.ndarray
    recompute: np.ndarray
    optimizer: np.ndarray
    tp_exposed: np.ndarray
    cp_exposed: np.ndarray
    ep_exposed: np.ndarray  # MoE all-to-all dispatch/combine and expert-TP gathers (not overlapped)
    pp_exposed: np.ndarray
    dp_exposed: np.ndarray
    bubble: np.ndarray
    offload_exposed: np.ndarray
    head: np.ndarray  # embedding, LM head and loss
    overlap_slowdown: np.ndarray  # compute lost to overlapped collectives (processor usage)
    fsdp_copies: np.ndarray  # PyTorch FSDP's copies and casts of the unsharded gradients and gathered weights
    host_wait: np.ndarray  # GPU idle while the host issues eager dropless MoE layers (layer.MOE_HOST_FW_S)
    step_time: np.ndarray
    # link times (before overlap), s
    tp_link: np.ndarray
    dp_link: np.ndarray
    pp_link: np.ndarray
    cp_link: np.ndarray
    ep_link: np.ndarray
    # memory per GPU, bytes (worst stage)
    weights: np.ndarray
    grads: np.ndarray
    optim_state: np.ndarray
    activations: np.ndarray
    reserved: np.ndarray
    hbm: np.ndarray
    hbm_reserved: np.ndarray  # what the caching allocator holds at the peak (allocated tensors + its slack)
    act_loss_logits: np.ndarray  # of `activations`: the loss's logits held by the worst stage
    act_working: np.ndarray  # of `activations`: one layer's recompute working set
    offload_mem: np.ndarray
    offload_bw_need: np.ndarray  # byte/s the offload link must sustain to hide transfers
    # throughput
    n_mb: np.ndarray
    model_flops: np.ndarray  # per step, whole job
    hw_flops: np.ndarray  # per step, whole job (with recompute)
    mfu: np.ndarray
    hfu: np.ndarray
    tokens_per_s: np.ndarray
    samples_per_s: np.ndarray
    # the parts the step time is composed of (`compose_step`), for the solvers' tables
    terms: StepTerms | None = None

    def row(self, i: int = 0) -> dict[str, float]:
        return {
            f.name: float(
                np.asarray(getattr(self, f.name)).reshape(-1)[i]
                if np.ndim(getattr(self, f.name))
                else getattr(self, f.name)
            )
            for f in fields(self)
            if f.name != "terms"
        }


def _attention_norm_params(llm, tp):
    """Attention and norm weights of one layer on one of `tp` ranks (column-parallel biases split, the
    row-parallel output bias replicated)."""
    attn = sum(attention_params(llm, tp))
    if llm.bias:
        attn = attn + (llm.heads / tp + 2 * kv_per_rank(llm, tp)) * llm.dhead + llm.hidden
    return attn + count(llm).norms


def _mlp_params(llm, f, tp):
    """A dense MLP of width f on one of `tp` ranks (with biases: the up bias split, the down bias (h)
    replicated)."""
    k, h = mlp_matrices(llm), llm.hidden
    return k * h * f / tp + ((f * (k - 1)) / tp + h if llm.bias else 0.0)


def layer_params_per_gpu(ctx: Ctx, k: Knobs):
    """Weights of one dense layer held by one GPU (TP-sharded matrices, replicated norms)."""
    tp = k.tp.astype(float)
    return _attention_norm_params(ctx.llm, tp) + _mlp_params(ctx.llm, ctx.llm.ffn, tp)


def moe_layer_params_per_gpu(ctx: Ctx, k: Knobs):
    """Weights of one MoE layer held by one GPU, as (non-expert, routed-expert) parameters: attention and
    norms as a dense layer, the router (h x E, replicated), shared experts TP-sharded; the E routed experts
    split over ep ranks, each expert's matrices over etp ranks (Megatron-Core expert parallelism;
    routed experts are *not* divided by tp)."""
    llm, mo = ctx.llm, ctx.llm.moe
    tp = k.tp.astype(float)
    non_expert = (
        _attention_norm_params(llm, tp)
        + llm.hidden * mo.experts
        + _mlp_params(llm, mo.shared_experts * mo.expert_ffn, tp)
    )
    expert = (
        mo.experts / k.ep.astype(float) * mlp_matrices(llm) * llm.hidden * mo.expert_ffn / k.etp.astype(float)
    )
    return non_expert, expert


def moe_layers_on_stage(llm, pp):
    """MoE layers on the pipeline stage that holds the most of them: min(L/pp, moe_layers) (a model whose
    first layers are dense, as DeepSeek-V3, puts them on the first stage)."""
    return np.minimum(llm.layers / np.asarray(pp, dtype=float), float(llm.moe_layer_count))


def state_bytes(ctx: Ctx) -> tuple[float, float, float]:
    """(weight, gradient, optimizer-state) bytes per parameter: the 16-bit compute copy (4 in FP32), the
    gradient (fp32 main grads or 16-bit), Adam's two moments (8) plus the fp32 master copy (4) when kept."""
    ob = 12.0 if ctx.keeps_master else 8.0
    return float(ctx.w_bytes), float(ctx.grad_bytes), ob


def dp_reductions(params, gb: float, wb: float, group, tier, tiers: Tiers, stride, calls=1.0):
    """(reduce-scatter, all-reduce) of the gradients (`gb` bytes each) and the all-gather of the weights
    (`wb`) of `params` parameters over a data-parallel group of `group` ranks `stride` apart on `tier`, in
    `calls` collectives each (`dp_calls`: the stack's buckets or its layers), each paying its latency."""
    return (
        collective_time("rs", params * gb, group, tier, tiers, stride=stride, calls=calls),
        collective_time("ar", params * gb, group, tier, tiers, stride=stride, calls=calls),
        collective_time("ag", params * wb, group, tier, tiers, stride=stride, calls=calls),
    )


def dp_calls(stack, zero, params, group, layers, pp=1):
    """Collective calls that a stage's data-parallel traffic of `params` parameters over `group` ranks goes
    out in: one per layer at ZeRO-3 and where the stack buckets per layer, else one per bucket of the
    stack's size (`stack.dp_bucket_params`), at least one. Megatron-Core buckets only the first pipeline
    stage's first model chunk (distributed_data_parallel.py: no bucketing where pp_rank > 0; training.py:
    none for the later chunks): the stage the model times (the last, pp > 1) reduces each chunk as one
    bucket, counted here as one call (the tables are per layout, not per vpp). The exposed floor of the
    overlap stays one layer's share of the traffic (`_dp_time`'s `bucket`)."""
    layers = np.maximum(np.asarray(layers, dtype=float), 1.0)
    bucket = dp_bucket_params(stack, group)
    if bucket is None:
        return layers
    buckets = np.maximum(np.ceil(np.asarray(params) / bucket), 1.0)
    if Stack(stack) == Stack.MEGATRON_CORE:
        buckets = np.where(np.asarray(pp) > 1, 1.0, buckets)
    return np.where(np.asarray(zero) >= 3, layers, buckets)


def adam_time(hw: Hardware, P_upd, gb: float, ob: float, wb: float):
    """The optimizer step on the GPU, memory-bound Adam over the P_upd parameters a GPU updates: read the
    gradient, read and write the fp32 state, write the 16-bit weight (12 fp32 FLOP per parameter)."""
    return hw.vector(12.0 * P_upd, P_upd * (gb + 2.0 * ob + wb), fp32=True)


@dataclass(frozen=True)
class _Shape:
    """A candidate's layout as floats (the module docstring's symbols): the knobs, the global batch B, the
    sequence length s, the layers L, n_mb micro-batches, el (the embedding and loss take a layer slot
    each), un (a custom layout of the blocks, the MTP modules' included), the layer slots of the split and Ls
    of the busiest stage, slack (blocks the last stage of a custom layout holds fewer), T tokens of a
    micro-batch on one CP rank."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    vpp: np.ndarray
    mb: np.ndarray
    B: float
    s: float
    L: float
    n_mb: np.ndarray
    el: np.ndarray
    un: np.ndarray
    slots: np.ndarray
    Ls: np.ndarray
    slack: np.ndarray
    T: np.ndarray
    sp: np.ndarray


def _shape(ctx: Ctx, k: Knobs) -> _Shape:
    tp, pp, dp, cp, vpp, mb = (x.astype(float) for x in (k.tp, k.pp, k.dp, k.cp, k.vpp, k.micro_batch))
    B, s, L = float(ctx.global_batch), float(ctx.seq_len), float(ctx.llm.layers)
    n_mb = B / (dp * mb)
    un = (k.pp_uneven.astype(bool) & (pp > 1)).astype(float)  # a custom layout (pp_uneven)
    el = (k.pp_embedding_loss.astype(bool) & (pp > 1)).astype(float)
    # layer slots of the split: the layers, with el the embedding and the loss too; a custom layout also
    # places the MTP modules' blocks (Megatron-Core counts an MTP module only in a layout), padded to the
    # busiest chunk's ceil, so that every per-stage factor below is the busiest stage's
    units = layout_units(L, el, un, float(ctx.mtp))
    slots = split_slots(units, pp, vpp, un)
    Ls = slots / pp  # transformer layers of the busiest stage (a middle one when el)
    # slots the last stage holds fewer: the padding, as long as it keeps the loss and the MTP blocks
    slack = np.where(un > 0, layout_slack(units, pp, vpp, el + ctx.mtp), 0.0)
    return _Shape(
        tp,
        pp,
        dp,
        cp,
        vpp,
        mb,
        B,
        s,
        L,
        n_mb,
        el,
        un,
        slots,
        Ls,
        slack,
        mb * s / cp,
        k.sequence_parallel.astype(bool),
    )


def grad_accumulation_bytes(code, g: float):
    """HBM bytes per parameter per micro-batch of adding its weight gradient into the main-gradient buffer
    of `g` bytes an element, outside the weight-gradient GEMM (`Knobs.grad_accumulation`,
    `optimizer.schema.common.GradAccumulation`): fused none; add reads the 16-bit gradient and reads and
    writes the buffer (2 + 2g); cast_add first writes and reads an FP32 copy of the gradient (2 + 8 + 2g)."""
    code = np.asarray(code)
    return np.select([code == 1, code == 2], [2.0 + 2.0 * g, 10.0 + 2.0 * g], 0.0)


def grad_accumulation_s(ctx: Ctx, k: Knobs, params):
    """One micro-batch's gradient accumulation of `params` parameters (per GPU), s: memory-bound."""
    nbytes = np.asarray(params, dtype=float) * grad_accumulation_bytes(k.grad_accumulation, ctx.grad_bytes)
    return np.where(nbytes > 0, ctx.hw.mem_time(np.maximum(nbytes, 1.0)), 0.0)


def _with_accumulation(ctx: Ctx, k: Knobs, blk: BlockCost, params) -> BlockCost:
    """The block with its gradient accumulation (`grad_accumulation_s`) in its backward."""
    acc = grad_accumulation_s(ctx, k, params)
    return replace(blk, bw=blk.bw + acc)


def _layer(ctx: Ctx, k: Knobs, pp):
    """(one layer's cost, the MoE layers' share of the busiest stage's weights; None for a dense model)."""
    llm = ctx.llm
    blk_d: BlockCost = _with_accumulation(ctx, k, block_cost(ctx, k), layer_params_per_gpu(ctx, k))
    if llm.moe is None:
        return blk_d, None
    # per-layer time and activations: the model-wide share of MoE layers (a stage of a model whose few
    # dense layers come first is modelled at the mean; this keeps tau independent of pp, as the
    # solver's tables need); weights: the stage holding the most MoE layers (`_stage_params`)
    blk_m = _with_accumulation(ctx, k, block_cost(ctx, k, moe=True), sum(moe_layer_params_per_gpu(ctx, k)))
    w_stage = moe_layers_on_stage(llm, pp) / (llm.layers / pp)
    return blk_d.mix(blk_m, llm.moe_layer_count / llm.layers), w_stage


def _edge_work(ctx: Ctx, k: Knobs, g: _Shape):
    """The edge stages' extra work per micro-batch, s: (the last stage's, the first stage's, M a
    micro-batch's activation in bytes). The last stage runs the LM head and loss and, for each
    multi-token prediction module (`Ctx.mtp`; DeepSeek-AI 2024, Sec. 2.2), the embedding of the next
    tokens, a 2h -> h projection of [normed hidden; normed embedding] and the shared head and loss again
    (its block is a layer's, `compose.edge_extra`; its two RMSNorms are left out); the first the
    embedding."""
    hw, tiers, tp, T, sp = ctx.hw, ctx.tiers, g.tp, g.T, g.sp
    h, V, e = ctx.llm.hidden, ctx.llm.vocab, ctx.e
    emb_fw = hw.mem_time(2.0 * T * h * e)
    emb_bw = hw.mem_time(T * h * (e + 4.0))
    M = T * h * e
    emb_comm = np.where(
        sp, collective_time("rs", M, tp, k.tier_tp, tiers), collective_time("ar", M, tp, k.tier_tp, tiers)
    )
    # the LM head stays 16-bit in quantised recipes: Megatron-Core's output layer is its own
    # ColumnParallelLinear, outside Transformer Engine's FP8 autocast (TE's LM head only with the opt-in MXFP8
    # output projection, Megatron-LM #4825, 2026), and torchtitan's Float8 conversion skips the `output`
    # linear
    head_fw, head_bw, _ = hw.linear(T, V / tp, h, in_bytes=e, out_bytes=e, wide=True)
    n_logit = T * V / tp
    loss_fw = hw.vector(10.0 * n_logit, n_logit * (e + 3 * 4.0), fp32=True)
    loss_bw = hw.vector(4.0 * n_logit, n_logit * (4.0 + e), fp32=True)
    head_comm = np.where(
        sp, collective_time("ag", M, tp, k.tier_tp, tiers) * 2.0, 0.0
    ) + 3.0 * collective_time("ar", T * 4.0, tp, k.tier_tp, tiers)
    last_stage_extra = head_fw + head_bw + loss_fw + loss_bw + head_comm
    first_stage_extra = emb_fw + emb_bw + emb_comm
    if ctx.mtp:
        proj_fw, proj_bw, _ = hw.linear(T, h / tp, 2.0 * h, in_bytes=e, out_bytes=e)
        module = last_stage_extra + first_stage_extra + proj_fw + proj_bw
        last_stage_extra = last_stage_extra + ctx.mtp * module
    # the embedding's gradient accumulation, and the head's (untied, or the tied copy a pipeline keeps); MTP
    # modules share both
    emb_acc = grad_accumulation_s(ctx, k, V * h / tp)
    head_acc = np.where((g.pp > 1) | (not ctx.llm.tied_embeddings), emb_acc, 0.0)
    return last_stage_extra + head_acc, first_stage_extra + emb_acc, M


def _p2p_time(ctx: Ctx, k: Knobs, g: _Shape, M):
    """One pipeline exchange, s. p2p: one activation per micro-batch per chunk boundary, forward and backward.
    In the 1F1B steady state a middle stage exchanges with both neighbours per chunk (2*vpp exchanges per
    micro-batch, each a rendezvous on the critical path), while an edge stage has one neighbour for its edge
    chunk: its cycle is stage + head + (2*vpp-1)*t_p2p against a middle stage's stage + 2*vpp*t_p2p, so the
    period is stage + 2*vpp*t_p2p + max(head - t_p2p, 0): the edge's extra work hides one exchange. Fill and
    drain cross pp-1 boundaries each way."""
    tp, sp, tiers = g.tp, g.sp, ctx.tiers
    scatter = sp | k.pp_rs_ag.astype(bool)
    msg = np.where(scatter, M / tp, M)
    return collective_time("p2p", msg, 2.0, k.tier_pp, tiers) + np.where(
        k.pp_rs_ag.astype(bool) & ~sp, collective_time("ag", M, tp, k.tier_tp, tiers), 0.0
    )


@dataclass(frozen=True)
class _Params:
    """Parameters per GPU of the busiest stage: of one layer (`layer`), of the stage (`stage`: routed-expert
    `expert` and the rest `non_expert`), its transformer layers `L_stage`, over the DP groups dpg = dp*cp and,
    MoE, edp (expert-data-parallel)."""

    layer: np.ndarray
    stage: np.ndarray
    non_expert: np.ndarray
    expert: np.ndarray
    L_stage: np.ndarray
    dpg: np.ndarray
    edp: np.ndarray

    def sharded(self, shard):
        """Parameters of the stage held per GPU when `shard` (ZeRO) divides them over their DP groups."""
        return np.where(shard, self.non_expert / self.dpg + self.expert / self.edp, self.stage)


def mtp_params(ctx: Ctx, tp, p_block, blocks, pipelined):
    """Parameters per GPU of the MTP modules on the last stage: each one's 2h x h projection and two norms,
    `blocks` blocks of `p_block` (those outside a custom layout's slots), and where `pipelined` a copy of the
    embedding they look the next tokens up in."""
    h, V = ctx.llm.hidden, ctx.llm.vocab
    emb = np.where(np.asarray(pipelined, dtype=bool) & (ctx.mtp > 0), V * h / tp, 0.0)
    return ctx.mtp * (2.0 * h * h / tp + 2.0 * h) + blocks * p_block + emb


def _stage_params(ctx: Ctx, k: Knobs, g: _Shape, w_stage) -> _Params:
    """Parameters per GPU of the stage that bounds DP traffic and the optimizer (the worst stage)."""
    llm, tp, pp, Ls, el = ctx.llm, g.tp, g.pp, g.Ls, g.el
    h, V = llm.hidden, llm.vocab
    P_layer = layer_params_per_gpu(ctx, k)
    P_ex_layer = 0.0
    P_last_block = P_layer  # the model's last layer, which an MTP module's block copies
    if w_stage is not None:
        ne, ex = moe_layer_params_per_gpu(ctx, k)
        P_layer = (1.0 - w_stage) * P_layer + w_stage * (ne + ex)
        P_ex_layer = w_stage * ex
        P_last_block = ne + ex  # dense layers come first (`moe_layers_on_stage`)
    P_emb = V * h / tp
    P_head = V * h / tp  # tied embeddings keep a copy on the last stage when pp > 1
    tied = llm.tied_embeddings
    # MTP modules (last stage): a block each (a slot of a custom layout, else beyond the split) and the
    # 2h x h projection, and, with a pipeline, a copy of the embedding they look the next tokens up in; a
    # custom layout's last stage holds `slack` fewer blocks
    mtp = ctx.mtp
    mtp_blocks = mtp * (1.0 - g.un)  # outside the stage's slots
    P_mtp = mtp_params(ctx, tp, P_last_block, mtp_blocks, pp > 1)
    P_first = (Ls - el) * P_layer + P_emb + np.where(pp > 1, 0.0, 0.0 if tied else P_head)
    final_norm = h * (2 if llm.bias else 1)
    P_first = P_first + np.where(pp > 1, 0.0, final_norm + P_mtp)
    P_last = (Ls - el - g.slack) * P_layer + np.where(pp > 1, P_head, 0.0) + final_norm + P_mtp
    # a V schedule's first rank holds the first and the last stage: both edges' extras on one rank, with
    # one copy of tied embeddings
    vee = v_schedule_named(k) & (pp > 1)
    P_v = (Ls - 2 * el - g.slack) * P_layer + P_emb + (0.0 if tied else P_head) + final_norm + P_mtp
    P_edge = np.where(vee, P_v, np.maximum(P_first, P_last))
    P_mid = Ls * P_layer  # a middle stage (more layers than the edges when el)
    P_stage = np.maximum(P_edge, P_mid)  # the stage that bounds DP traffic and the optimizer
    # routed-expert weights are reduced and sharded over the expert-data-parallel group
    # edp = tp*cp*dp/(ep*etp) (Megatron-Core), everything else over dp*cp
    L_edge = np.where(
        vee,
        Ls - 2 * el - g.slack + mtp_blocks,
        np.where(P_last >= P_first, Ls - el - g.slack + mtp_blocks, Ls - el + np.where(pp > 1, 0.0, mtp)),
    )
    L_stage = np.where(P_mid >= P_edge, Ls, L_edge)  # the stage's blocks
    P_ex = L_stage * P_ex_layer
    dpg = g.dp * g.cp
    edp = tp * g.cp * g.dp / (k.ep * k.etp) if w_stage is not None else dpg
    return _Params(P_layer, P_stage, P_stage - P_ex, P_ex, L_stage, dpg, edp)


def dp_stride(tiers: Tiers, tier, tp, cp, pp, dp_last: bool):
    """The spacing of a dense stage's gradient group (dp x cp ranks) as `collective_time` reads it: the
    inner domain's GPUs over the group's members in one domain. Megatron order (tp, cp, dp, pp): the members
    are tp apart. Data parallelism outermost (tp, cp, pp, dp): a domain of D GPUs holds min(cp, D/tp) of the
    cp ranks and D/(tp cp pp) of the replicas (at least one)."""
    if not dp_last:
        return tp
    tp, cp, pp = (np.asarray(x, dtype=float) for x in (tp, cp, pp))
    dom = tiers.size[np.maximum(np.asarray(tier, dtype=int) - 1, 0)].astype(float)
    members = np.clip(np.floor(dom / tp), 1.0, cp) * np.maximum(np.floor(dom / (tp * cp * pp)), 1.0)
    return dom / (members + 1e-6)  # `members_per_domain` floors dom / stride: keep it at `members`


def _dp_collectives(ctx: Ctx, k: Knobs, g: _Shape, P: _Params):
    """(reduce-scatter, all-reduce, all-gather) of the stage's gradients / weights over its DP groups, s."""
    wb, gb, _ = state_bytes(ctx)
    tiers = ctx.tiers
    calls = dp_calls(ctx.stack, k.zero, P.non_expert, P.dpg, P.L_stage, g.pp)
    stride = dp_stride(tiers, k.tier_dp, g.tp, g.cp, g.pp, ctx.dp_last)
    RS, AR, AG = dp_reductions(P.non_expert, gb, wb, P.dpg, k.tier_dp, tiers, stride=stride, calls=calls)
    if ctx.llm.moe is not None:
        # expert-data-parallel ranks are ep*etp apart (Megatron-Core expert rank order), ep*etp*pp with data
        # parallelism outermost; their group spans the stage's ranks, or the whole job
        span = g.tp * g.cp * g.dp * np.where(ctx.dp_last, g.pp, 1)
        tier = tier_of(tiers, span, g.tp * g.cp * g.dp * g.pp)
        ex_calls = dp_calls(ctx.stack, k.zero, P.expert, P.dpg, P.L_stage, g.pp)
        ex_stride = k.ep * k.etp * np.where(ctx.dp_last, g.pp, 1)
        ex_rs, ex_ar, ex_ag = dp_reductions(
            P.expert, gb, wb, P.edp, tier, tiers, stride=ex_stride, calls=ex_calls
        )
        RS, AR, AG = RS + ex_rs, AR + ex_ar, AG + ex_ag
    return RS, AR, AG


def _at_zero(z, per_stage: dict):
    """Each candidate's entry of a {ZeRO stage: value} composition (`compose.dp_links`, `dp_exposed`)."""
    return np.select([z == i for i in range(4)], [per_stage[i] for i in range(4)])


def _fsdp_copies(ctx: Ctx, P: _Params):
    """PyTorch FSDP's copies and casts (stack.fsdp_copy_bytes), s: element-wise passes over a layer's
    unsharded parameters around one gradient all-reduce, reduce-scatter and parameter gather of the stage."""
    wb, gb, _ = state_bytes(ctx)
    cb_ar, cb_red, cb_gat = fsdp_copy_bytes(ctx.stack, wb, gb)
    unit = np.maximum(P.layer, 1.0)  # one layer's parameters: FSDP's unit (a FlatParameter / parameter group)

    def passes(nbytes_per_param):
        if not nbytes_per_param:
            return 0.0 * unit
        return (P.stage / unit) * ctx.hw.vector(unit, unit * nbytes_per_param)

    return passes(cb_ar), passes(cb_red), passes(cb_gat)


def _dp_time(ctx: Ctx, k: Knobs, g: _Shape, P: _Params, blk: BlockCost, f_v: dict, f_m: dict) -> dict:
    """Data-parallel traffic (its link time per ZeRO stage, what overlap leaves exposed, the overlap's
    slowdown) and FSDP's copies, s; the collectives and copies themselves for the tables."""
    RS, AR, AG = _dp_collectives(ctx, k, g, P)
    z, vpp, Ls, n_mb = k.zero, g.vpp, g.Ls, g.n_mb
    F = fsdp_traffic(AG, RS)
    regather = zero2_regathers(ctx.stack)
    dp_link = _at_zero(z, dp_links(AR, RS, AG, F, n_mb, regather))
    # FSDP's copies are counted as the traffic is (dp_links)
    fsdp_ar, fsdp_red, fsdp_gat = _fsdp_copies(ctx, P)
    cps = dp_links(fsdp_ar, fsdp_red, fsdp_gat, fsdp_traffic(fsdp_gat, fsdp_red), n_mb, regather)
    ov = k.dp_overlap.astype(bool)
    bucket = 1.0 / np.maximum(Ls, 1.0)
    t_cb = f_v["Lc"] * blk.bw_total  # backward of one chunk for one micro-batch
    window = f_v["Wm"] * blk.bw_total
    exp = dp_exposed_by_zero(
        AR,
        RS,
        AG,
        F,
        AR * bucket,
        RS * bucket,
        AG * bucket,
        F * bucket,
        AR / vpp,
        RS / vpp,
        t_cb,
        window,
        Ls * blk.fw_total,
        n_mb,
        f_m["NL"],
        blk.bw_total,
        blk.fw_total + blk.bw_total,
        regather,
    )
    dp_exp_ov = _at_zero(z, exp)
    has_dp = has_dp_group(P.dpg, P.edp)
    dp_exposed = np.where(has_dp, np.where(ov, dp_exp_ov, dp_link), 0.0)
    pu = ctx.tiers.processor_usage[k.tier_dp]
    return dict(
        AR=AR,
        RS=RS,
        AG=AG,
        bucket=bucket,
        dp_link=dp_link,
        dp_exposed=dp_exposed,
        dp_slow=np.where(ov & has_dp, pu * (dp_link - dp_exposed), 0.0),
        fsdp_copies=np.where(has_dp, _at_zero(z, cps), 0.0),
        fsdp_ar=fsdp_ar,
        fsdp_red=fsdp_red,
        fsdp_gat=fsdp_gat,
    )


def _offload_bw_s(problem: Problem) -> float:
    """The offload link's sustained bandwidth, byte/s."""
    off = problem.system.offload
    return max(off.bandwidth_gbps * 1e9 * off.efficiency, 1.0)


def _optimizer_time(problem: Problem, ctx: Ctx, k: Knobs, P: _Params):
    """The optimizer step, s: memory-bound Adam over the parameters a GPU updates (a ZeRO shard), or, with
    optimizer offload, the slower of that and streaming its state over the offload link."""
    wb, gb, ob = state_bytes(ctx)
    P_upd = P.sharded(k.zero >= 1)
    opt_gpu = adam_time(ctx.hw, P_upd, gb, ob, wb)
    opt_off = (P_upd * (gb + 2.0 * ob + wb)) / _offload_bw_s(problem)  # stream state over the offload link
    return np.where(k.optimizer_offload.astype(bool), np.maximum(opt_gpu, opt_off), opt_gpu)


def _state_memory(ctx: Ctx, k: Knobs, P: _Params) -> dict:
    """Weights, gradients and optimizer state per GPU in HBM, and those moved to offload memory, bytes."""
    wb, gb, ob = state_bytes(ctx)
    z, w_off, o_off = k.zero, k.weight_offload.astype(bool), k.optimizer_offload.astype(bool)
    two_layers = 2.0 * P.layer
    # FSDP (ZeRO-3) gathers two layers at a time (the one computing and the one prefetched). PyTorch FSDP2
    # (torchtitan) keeps no sharded 16-bit copy, its sharded fp32 parameters are the master weights (counted
    # in the optimizer state), and it reduce-scatters one layer's unsharded 16-bit gradients through an fp32
    # copy (MixedPrecisionPolicy reduce_dtype fp32): a transient of a layer's parameters x (wb + gb). FSDP1
    # (stack fsdp) keeps none either: its low-precision shard is freed once the parameters are gathered
    # (FlatParamHandle post_unshard -> _free_low_precision_sharded_param), nor MaxText (its fp32 parameters,
    # cast per layer); DeepSpeed ZeRO-3 keeps its 16-bit partitions.
    fsdp2 = ctx.stack == Stack.TORCHTITAN
    # (without an fp32 master copy in the optimizer state, as in fp32 training, the sharded parameters are the
    # weights themselves and count here)
    master_only = ctx.stack in (Stack.TORCHTITAN, Stack.FSDP, Stack.MAXTEXT)
    shard_copy = 0.0 if master_only and ctx.keeps_master else 1.0
    # MaxText keeps no 16-bit copy unsharded either: each layer's fp32 parameters are cast as it runs
    cast_only = ctx.stack == Stack.MAXTEXT and ctx.keeps_master
    unsharded = two_layers * wb if cast_only else P.stage * wb
    weights_full = np.where(z == 3, shard_copy * P.sharded(True) * wb + two_layers * wb, unsharded)
    weights = np.where(w_off, two_layers * wb + (P.stage - P.L_stage * P.layer) * wb, weights_full)
    grads_full = P.sharded(z >= 2) * gb + np.where((z == 3) & fsdp2, P.layer * (wb + gb), 0.0)
    grads = np.where(o_off, P.layer * gb, grads_full)
    optim_full = P.sharded(z >= 1) * ob
    optim_state = np.where(o_off, 0.0, optim_full)
    off_state = np.where(w_off, weights_full - weights, 0.0) + np.where(
        o_off, grads_full - grads + optim_full, 0.0
    )
    return dict(weights=weights, grads=grads, optim_state=optim_state, off_state=off_state)


def _activation_memory(ctx: Ctx, k: Knobs, g: _Shape, blk: BlockCost, f_v: dict, f_m: dict) -> dict:
    """Activations of the worst stage (`compose.activations`) and what activation offload moves, bytes."""
    h, V, e = ctx.llm.hidden, ctx.llm.vocab, ctx.e
    a_on = k.activation_offload.astype(bool)
    a_off = a_on & (k.activation_offload_layers == 0)  # every stored layer but the two in use
    a_part = np.where(
        a_on & ~a_off, np.minimum(k.activation_offload_layers / np.maximum(g.Ls, 1), 1.0), 0.0
    )  # some layers
    rec = k.recompute
    # recompute rebuilds, for one layer at a time, what the forward did not keep
    working = np.where(rec == 2, blk.act_full, np.where(rec == 1, blk.act_full - blk.act_stored, 0.0))
    # the loss's logits at its peak: fused (Megatron-Core's vocab-parallel cross-entropy: the 16-bit logits
    # and their fp32 softmax), else PyTorch cross_entropy on an fp32 upcast: at the start of backward the fp32
    # log-softmax output, its gradient and the input's gradient, 12 bytes per logit (torchtitan before its
    # loss was compiled)
    loss_b = np.where(k.fused_loss.astype(bool) & k.fused_layers.astype(bool), e + 4.0, 12.0)
    # each MTP module's loss keeps its logits too, and without a slot of its own its block's activations
    # (one micro-batch's: the last stage runs a micro-batch's backward right after its forward)
    logits = g.T * V / g.tp * loss_b * (1 + ctx.mtp)
    mtp_act = ctx.mtp * blk.act_stored  # the MTP blocks' (outside a custom layout's slots)
    emb_out = 2.0 * g.T * h * e
    acts = compose_activations(
        f_v["inflv"],
        f_m["infl1"],
        f_m["NL"],
        g.Ls,
        g.vpp,
        g.pp,
        k.schedule == SCHEDULE_CODES.index(Schedule.GPIPE),
        a_off,
        blk.act_stored,
        working,
        emb_out,
        logits + (1.0 - g.un) * mtp_act,
        a_part,
        vee=v_runs(k, g)[0],
        dual=v_runs(k, g)[1],
    )
    return dict(
        acts,
        working=working,
        logits_bytes=logits,
        mtp_act_bytes=mtp_act + 0.0 * logits,
        emb_out=emb_out,
        a_off=a_off,
        a_part=a_part,
    )


def _memory(problem: Problem, ctx: Ctx, k: Knobs, g: _Shape, P: _Params, blk: BlockCost, f_v, f_m) -> dict:
    """Memory per GPU of the worst stage, bytes: state, activations, the runtime reserve; allocated (`hbm`,
    what has to fit), reserved by the caching allocator, and offload memory."""
    st = _state_memory(ctx, k, P)
    ac = _activation_memory(ctx, k, g, blk, f_v, f_m)
    activations = ac["act"]
    reserved = np.full_like(activations, problem.system.reserved_gib * GIB)
    hbm = st["weights"] + st["grads"] + st["optim_state"] + activations + reserved
    # what PyTorch's caching allocator holds at that peak (torch.cuda.max_memory_reserved, the figure
    # frameworks report): the tensors plus its slack (block rounding, freed blocks kept for reuse), up to the
    # memory the runtime leaves it; `hbm` (allocated) is what has to fit
    usable = problem.system.hbm_gib * GIB - reserved
    hbm_reserved = np.minimum((hbm - reserved) * (1.0 + ALLOCATOR_SLACK), np.maximum(usable, hbm - reserved))
    return (
        st
        | ac
        | dict(
            activations=activations,
            reserved=reserved,
            hbm=hbm,
            hbm_reserved=hbm_reserved,
            offload_mem=st["off_state"] + ac["offact"],
        )
    )


def _offload_streaming(problem: Problem, ctx: Ctx, k: Knobs, P: _Params, blk: BlockCost, mem: dict):
    """Offload transfers per layer per micro-batch: (the time not hidden behind the layer's forward and
    backward, s; the bandwidth the link must sustain to hide them, byte/s)."""
    off, off_bw = problem.system.offload, _offload_bw_s(problem)
    w_off, a_on = k.weight_offload.astype(bool), k.activation_offload.astype(bool)
    wl = P.layer * state_bytes(ctx)[0]
    al = blk.act_stored
    a_frac = np.where(
        mem["a_off"], 1.0, mem["a_part"]
    )  # of each layer's stored activations, spread over the layers
    x_fw = np.where(w_off, wl, 0.0) + a_frac * al
    x_bw = np.where(w_off, wl, 0.0) + a_frac * al
    off_exp_layer = np.maximum(x_fw / off_bw - blk.fw_total, 0.0) + np.maximum(
        x_bw / off_bw - blk.bw_total, 0.0
    )
    need = np.maximum(x_fw / np.maximum(blk.fw_total, 1e-12), x_bw / np.maximum(blk.bw_total, 1e-12))
    return off_exp_layer, np.where(w_off | a_on, need, 0.0) / max(off.efficiency, 1e-9)


def zero_bubble(k: Knobs, g: _Shape):
    """Whether the zero-bubble schedule fills the bubble: `zb`, interleaved (PyTorch's
    InterleavedZeroBubble runs 2+ stages per rank; with one stage per rank the plan is 1F1B)."""
    return (k.schedule == SCHEDULE_CODES.index(Schedule.ZERO_BUBBLE)) & (g.vpp > 1)


DPV, ZBV = SCHEDULE_CODES.index(Schedule.DUALPIPE_V), SCHEDULE_CODES.index(Schedule.ZERO_BUBBLE_V)


def v_schedule_named(k: Knobs):
    """Whether the candidate's schedule is a V schedule (DualPipeV, ZB-V): its rows are in the space only
    where it runs (`optimizer.prepare.space.v_runs_at`), so the first rank's parameters follow the name."""
    return (k.schedule == DPV) | (k.schedule == ZBV)


def v_runs(k: Knobs, g: _Shape):
    """(runs a V schedule, runs DualPipeV) per candidate (`compose.v_schedule`)."""
    vee = v_schedule((k.schedule == DPV) | (k.schedule == ZBV), g.pp, g.vpp, g.n_mb)
    return vee, vee & (k.schedule == DPV)


def bubble_fill(blk: BlockCost, k: Knobs):
    """What a split-backward schedule takes off the pipeline's fill and drain, per layer and micro-batch, s.
    Zero-bubble: the weight-gradient GEMMs fill it, so the bubble's layer time T_F + T_B + T_W becomes
    T_F + T_B - T_W, less 2 T_W = the backward GEMMs (a linear layer's weight and input gradients take the
    same FLOPs; Qi et al., ICLR 2024). DualPipeV: its bubble per chunk is T_F&B + T_B - 3 T_W (DeepSeek-V3
    report, Table 2; T_B the whole backward, T_W its weight gradients), the layer's critical path `tau`
    standing for T_F&B, so the fill is 3 T_W - T_B = 1.5 x the backward GEMMs less the backward. ZB-V: per
    chunk T_F + T_B - 2 T_W with T_B the input gradient (Qi et al., Sec. 6), i.e. the layer time less 3 T_W
    = 1.5 x the backward GEMMs, at most the layer time (no bubble when the three are equal)."""
    return np.where(
        k.schedule == DPV,
        1.5 * blk.gemm_bw - blk.bw_total,
        np.where(k.schedule == ZBV, np.minimum(1.5 * blk.gemm_bw, blk.total), blk.gemm_bw),
    )


def _pipeline_time(k: Knobs, g: _Shape, blk: BlockCost, head, t_p2p, off_exp_layer, f_l, f_v):
    """The pipeline's parts (`compose.pipeline`), s, and the steady-state exchange t_ss it used."""
    pp, vpp, mb, tau = g.pp, g.vpp, g.mb, blk.total
    # interleaved 1F1B with overlap_p2p_comm: a steady-state exchange waits only for what exceeds a chunk's
    # forward
    t_ss = p2p_steady(t_p2p, f_v["Lc"] * blk.fw_total, k.pp_overlap.astype(bool) & (vpp > 1))
    head_mb = edge_head(head, t_ss, pp) / mb
    pl = pipeline(
        f_l["A1"],
        f_l["A2"],
        f_v["Bf"],
        f_v["E"],
        f_l["pm2"],
        tau / mb,
        head_mb,
        tau,
        t_ss / mb,
        np.where(pp > 1, t_p2p, 0.0),
        off_exp_layer / mb,
        Zf=np.where(zero_bubble(k, g) | v_runs(k, g)[0], f_v["Bf"], 0.0),
        fill=bubble_fill(blk, k),
    )
    return pl, t_ss


def _throughput(ctx: Ctx, g: _Shape, blk: BlockCost, step) -> dict:
    """Model and hardware FLOP per step (whole job), MFU and HFU against the datasheet peak (as published),
    tokens and samples per second."""
    llm, hw, B, s, mb = ctx.llm, ctx.hw, g.B, g.s, g.mb
    tokens = B * s
    mf = model_flops_per_token(llm, int(s)) * tokens
    n_gpus = g.tp * g.pp * g.dp * g.cp
    peak = hw.datasheet_peak
    hw_layer = blk.hw_flops_fw + blk.hw_flops_bw + blk.hw_flops_re
    hwf = (
        hw_layer * g.L * (B / mb) * g.tp * g.cp
    ) + 6.0 * llm.vocab * llm.hidden * tokens  # per step, whole job
    return dict(
        model_flops=np.full_like(step, mf),
        hw_flops=hwf,
        mfu=mf / (step * n_gpus * peak),
        hfu=hwf / (step * n_gpus * peak),
        tokens_per_s=tokens / step,
        samples_per_s=B / step,
    )


def _terms(
    pl: dict, dpt: dict, optimizer, blk: BlockCost, head, t_p2p, off_exp_layer, mem, fill, edges
) -> StepTerms:
    """The `StepTerms` of the evaluation from its parts."""
    return StepTerms(
        **{n: pl[n] for n in PIPE},
        pipeline_s=pl["pipeline_s"],
        dp_exposed_s=dpt["dp_exposed"],
        dp_slowdown_s=dpt["dp_slow"],
        optimizer_s=optimizer,
        fsdp_copies_s=dpt["fsdp_copies"],
        dp_allreduce_s=dpt["AR"],
        dp_reduce_scatter_s=dpt["RS"],
        dp_allgather_s=dpt["AG"],
        dp_bucket_fraction=dpt["bucket"],
        fsdp_copy_allreduce_s=dpt["fsdp_ar"],
        fsdp_copy_reduce_s=dpt["fsdp_red"],
        fsdp_copy_gather_s=dpt["fsdp_gat"],
        layer_s=blk.total,
        layer_fw_s=blk.fw_total,
        layer_bw_s=blk.bw_total,
        bubble_fill_s=fill,
        head_s=head,
        head_last_s=edges[0] + 0.0 * head,
        head_first_s=edges[1] + 0.0 * head,
        p2p_s=t_p2p,
        offload_layer_s=off_exp_layer,
        state_hbm_bytes=mem["weights"] + mem["grads"] + mem["optim_state"],
        state_offload_bytes=mem["off_state"],
        reserved_bytes=mem["reserved"],
        act_stored_bytes=blk.act_stored,
        act_working_bytes=mem["working"],
        emb_out_bytes=mem["emb_out"],
        logits_bytes=mem["logits_bytes"],
        mtp_act_bytes=mem["mtp_act_bytes"],
    )


def evaluate(problem: Problem, k: Knobs, ctx: Ctx | None = None) -> StepResult:
    """Step time and memory of every candidate in `k` (the single source of truth)."""
    ctx = ctx or make_ctx(problem)
    g = _shape(ctx, k)
    pp, n_mb, Ls = g.pp, g.n_mb, g.Ls
    blk, w_stage = _layer(ctx, k, pp)
    tau = blk.total
    h_last, h_first, M = _edge_work(ctx, k, g)
    head = edge_extra(h_last, h_first, tau, pp, g.el, g.un, g.slack, ctx.mtp * tau)
    t_p2p = _p2p_time(ctx, k, g, M)
    f_l, f_v, f_m = (
        layout_factors(g.B, g.slots, g.dp, pp),
        vpp_factors(g.B, g.slots, g.dp, pp, g.vpp),
        mb_factors(g.B, g.slots, g.dp, pp, g.mb),
    )
    P = _stage_params(ctx, k, g, w_stage)
    dpt = _dp_time(ctx, k, g, P, blk, f_v, f_m)
    optimizer = _optimizer_time(problem, ctx, k, P)
    mem = _memory(problem, ctx, k, g, P, blk, f_v, f_m)
    off_exp_layer, offload_bw_need = _offload_streaming(problem, ctx, k, P, blk, mem)
    pl, t_ss = _pipeline_time(k, g, blk, head, t_p2p, off_exp_layer, f_l, f_v)
    terms = _terms(
        pl, dpt, optimizer, blk, head, t_p2p, off_exp_layer, mem, bubble_fill(blk, k), (h_last, h_first)
    )
    step = step_of(terms)
    # the report's parts: layers + head per micro-batch, bubble, p2p less what the edge stage's head hides
    pp_exposed = pl["p2p_steady_s"] + pl["p2p_fill_s"] - np.where(pp > 1, n_mb * np.minimum(t_ss, head), 0.0)
    per_step = n_mb * Ls  # layer passes of the busiest stage per step
    hbm = mem["hbm"]
    return StepResult(
        fw=per_step * blk.fw,
        bw=per_step * blk.bw,
        recompute=per_step * blk.re,
        optimizer=optimizer,
        tp_exposed=per_step * blk.tp_exposed,
        cp_exposed=per_step * blk.cp_exp,
        ep_exposed=per_step * blk.ep_exp,
        pp_exposed=pp_exposed,
        dp_exposed=dpt["dp_exposed"],
        bubble=pl["bubble_s"],
        offload_exposed=pl["offload_exposed_s"],
        head=n_mb * head,
        overlap_slowdown=per_step * blk.tp_slow + dpt["dp_slow"],
        fsdp_copies=dpt["fsdp_copies"],
        host_wait=per_step * (blk.host_fw + blk.host_re),
        step_time=step,
        tp_link=per_step * (blk.tp_fw + blk.tp_bw + blk.tp_re),
        dp_link=dpt["dp_link"],
        pp_link=np.where(pp > 1, 2.0 * n_mb * g.vpp * t_p2p, 0.0),
        cp_link=per_step * blk.cp_link,
        ep_link=per_step * blk.ep_link,
        weights=mem["weights"],
        grads=mem["grads"],
        optim_state=mem["optim_state"],
        activations=mem["activations"],
        reserved=mem["reserved"],
        hbm=hbm,
        hbm_reserved=mem["hbm_reserved"],
        act_loss_logits=mem["logits"] + 0.0 * hbm,
        act_working=mem["working"] + 0.0 * hbm,
        offload_mem=mem["offload_mem"],
        offload_bw_need=offload_bw_need,
        n_mb=n_mb,
        **_throughput(ctx, g, blk, step),
        terms=terms,
    )
