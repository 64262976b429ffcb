"""Knobs of a parallel execution as numpy arrays, so that the model evaluates many candidates at once.

Every field is an integer array named as the `Execution` knob it codes (booleans as 0/1, enums as their
code below); all fields broadcast together. A single execution is an array of length 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from optimizer.rules.layout import dp_last, tier_index
from optimizer.schema import (
    AttentionKernel,
    CudaGraphs,
    Execution,
    GradAccumulation,
    MoeDispatcher,
    RankOrder,
    Recompute,
    Schedule,
    System,
    TpComm,
    TpOverlap,
)
from optimizer.schema.common import (
    CP_COMM_CODES,
    MOE_DISPATCHER_CODES,
    RECOMPUTE_BITS,
    SCHEDULE_CODES,
    CpComm,
)

ZB_CODE = SCHEDULE_CODES.index(Schedule.ZERO_BUBBLE)

RECOMPUTE = [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL]  # code = index
TP_OVERLAP = [TpOverlap.NONE, TpOverlap.PIPE, TpOverlap.RING]
ATTENTION = [
    AttentionKernel.STANDARD,
    AttentionKernel.FLASH,
    AttentionKernel.FLASH2,
    AttentionKernel.FLASH_TRITON,
]  # code = index (> 0: fused)
CUDA_GRAPHS = [CudaGraphs.NONE, CudaGraphs.PARTIAL, CudaGraphs.FULL]  # code = index
GRAD_ACCUMULATION = [GradAccumulation.FUSED, GradAccumulation.ADD, GradAccumulation.CAST_ADD]  # code = index


@dataclass(frozen=True)
class Knobs:
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    micro_batch: np.ndarray  # sequences
    recompute: np.ndarray  # code: index in RECOMPUTE (0 none, 1 selective, 2 full)
    sequence_parallel: np.ndarray  # 0/1 (implies reduce-scatter + all-gather TP collectives)
    tp_comm: np.ndarray  # code: 0 all-reduce, 1 reduce-scatter + all-gather
    sp_ag_redo: np.ndarray  # 0/1: redo the SP all-gather in backward instead of storing it
    tp_overlap: np.ndarray  # code: index in TP_OVERLAP (0 none, 1 pipe, 2 ring)
    pp_rs_ag: np.ndarray  # 0/1: scatter-gather p2p
    pp_embedding_loss: np.ndarray  # 0/1: embedding and loss take a layer slot each in the pipeline split
    dp_overlap: np.ndarray  # 0/1
    zero: np.ndarray  # 0..3
    fused_layers: np.ndarray  # 0/1
    attention: np.ndarray  # code: index in ATTENTION (0 standard, 1 flash, 2 flash2, 3 flash-triton)
    schedule: np.ndarray  # code: 0 1F1B, 1 GPipe
    weight_offload: np.ndarray  # 0/1
    activation_offload: np.ndarray  # 0/1
    optimizer_offload: np.ndarray  # 0/1
    tier_tp: np.ndarray  # network tier index of each axis (optimizer.rules.layout.placement)
    tier_cp: np.ndarray
    tier_ep: np.ndarray
    tier_dp: np.ndarray
    tier_pp: np.ndarray
    pp_uneven: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # 0/1: ceil layers/stage
    activation_offload_layers: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # 0: all
    ep_overlap: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # 0/1: MoE A2A overlap
    moe_dispatcher: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # code: 0 alltoall, 1 flex
    cp_comm: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # code: index in CP_COMM_CODES (0 p2p, 1 all_gather, 2 a2a, 3 a2a_p2p)
    recompute_modules: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # bits; 0: core_attn
    fused_loss: np.ndarray = field(default_factory=lambda: np.ones(1, dtype=np.int64))  # 0/1
    kv_repeat: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))  # 0/1: K/V as q heads
    pp_overlap: np.ndarray = field(
        default_factory=lambda: np.ones(1, dtype=np.int64)
    )  # 0/1 (effective with vpp > 1)
    cuda_graphs: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # code: CUDA_GRAPHS index
    moe_fused_mlp: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # 1: TE's fused expert MLP
    moe_probs_in_act: np.ndarray = field(
        default_factory=lambda: np.ones(1, dtype=np.int64)
    )  # 1: probabilities applied in the experts' activation (the combine keeps nothing)
    grad_accumulation: np.ndarray = field(
        default_factory=lambda: np.zeros(1, dtype=np.int64)
    )  # code: GRAD_ACCUMULATION index

    @property
    def size(self) -> int:
        return int(np.broadcast(*[getattr(self, f.name) for f in fields(self)]).size)

    def take(self, idx) -> Knobs:
        """The candidates at positions `idx` (after broadcasting all fields to a common shape)."""
        arrs = np.broadcast_arrays(*[getattr(self, f.name) for f in fields(self)])
        return Knobs(*[a.reshape(-1)[idx] for a in arrs])

    def replace(self, **kw) -> Knobs:
        return replace(self, **{k: np.asarray(v) for k, v in kw.items()})

    def row(self, i: int = 0) -> dict[str, int]:
        arrs = np.broadcast_arrays(*[getattr(self, f.name) for f in fields(self)])
        return {f.name: int(a.reshape(-1)[i]) for f, a in zip(fields(self), arrs, strict=True)}

    @classmethod
    def concat(cls, parts: list[Knobs]) -> Knobs:
        """One set of candidates from several (each broadcast to its own size first)."""
        flat = []
        for k in parts:
            arrs = np.broadcast_arrays(*[np.atleast_1d(getattr(k, f.name)) for f in fields(k)])
            flat.append([a.reshape(-1) for a in arrs])
        return cls(*[np.concatenate([p[i] for p in flat]) for i in range(len(fields(cls)))])

    @classmethod
    def from_dict(cls, d: dict) -> Knobs:
        return cls(**{f.name: np.atleast_1d(np.asarray(d[f.name], dtype=np.int64)) for f in fields(cls)})


def default_tiers(system: System, degrees: dict[str, int], dp_outermost: bool = False) -> dict[str, int]:
    """Tier of each axis of one layout by `optimizer.rules.layout.placement` (Megatron rank order, data
    parallelism outermost with `dp_outermost`)."""
    from optimizer.rules.layout import domain_used, placement

    g = {ax: int(degrees.get(ax, 1)) for ax in ("tp", "cp", "dp", "pp", "ep")}
    etp = int(degrees.get("etp") or g["tp"])
    sizes, used = [n.size for n in system.networks], domain_used(system)
    return placement(sizes, g["tp"], g["cp"], g["dp"], g["pp"], g["ep"], etp, used=used, dp_last=dp_outermost)


def from_execution(ex: Execution, system: System, num_gpus: int) -> Knobs:
    """The knobs of one `Execution` (arrays of length 1)."""
    dp = ex.dp if ex.dp is not None else max(1, num_gpus // (ex.tp * ex.pp * ex.cp))
    degrees = {"tp": ex.tp, "pp": ex.pp, "dp": dp, "cp": ex.cp, "ep": ex.ep, "etp": ex.etp or ex.tp}
    tiers = default_tiers(system, degrees, dp_last(ex))
    for ax, v in (ex.placement or {}).items():
        tiers[ax] = tier_index(system, v)
    rs_ag = ex.sequence_parallel if ex.tp_comm is None else ex.tp_comm == TpComm.RS_AG
    d = dict(
        tp=ex.tp,
        pp=ex.pp,
        dp=dp,
        cp=ex.cp,
        ep=ex.ep,
        etp=ex.etp or ex.tp,
        vpp=ex.vpp,
        micro_batch=ex.micro_batch,
        recompute=RECOMPUTE.index(ex.recompute),
        sequence_parallel=int(ex.sequence_parallel),
        tp_comm=int(rs_ag),
        sp_ag_redo=int(ex.sp_ag_redo),
        tp_overlap=TP_OVERLAP.index(ex.tp_overlap),
        pp_rs_ag=int(ex.pp_rs_ag),
        pp_embedding_loss=int(ex.pp_embedding_loss),
        dp_overlap=int(ex.dp_overlap),
        zero=ex.zero,
        fused_layers=int(ex.fused_layers),
        attention=ATTENTION.index(ex.attention),
        schedule=SCHEDULE_CODES.index(Schedule(ex.schedule)),
        weight_offload=int(ex.weight_offload),
        activation_offload=int(ex.activation_offload),
        optimizer_offload=int(ex.optimizer_offload),
        tier_tp=tiers["tp"],
        tier_cp=tiers["cp"],
        tier_ep=tiers["ep"],
        tier_dp=tiers["dp"],
        tier_pp=tiers["pp"],
        pp_uneven=int(ex.pp_uneven),
        activation_offload_layers=ex.activation_offload_layers or 0,
        ep_overlap=int(ex.ep_overlap),
        moe_dispatcher=MOE_DISPATCHER_CODES.index(MoeDispatcher(ex.moe_dispatcher)),
        cp_comm=CP_COMM_CODES.index(CpComm(ex.cp_comm)),
        recompute_modules=sum(RECOMPUTE_BITS[m] for m in set(ex.recompute_modules or [])),
        fused_loss=int(ex.fused_loss),
        pp_overlap=int(ex.pp_overlap),
        kv_repeat=int(ex.kv_repeat),
        cuda_graphs=CUDA_GRAPHS.index(ex.cuda_graphs),
        moe_fused_mlp=int(ex.moe_fused_mlp),
        moe_probs_in_act=int(ex.moe_probs_in_act),
        grad_accumulation=GRAD_ACCUMULATION.index(ex.grad_accumulation),
    )
    return Knobs.from_dict(d)


def written_schedule(r: dict) -> Schedule:
    """The schedule a candidate row runs, as a plan writes it: zero-bubble with one stage per rank is 1F1B
    (it runs interleaved). (A V schedule's rows are in the space only where it runs:
    `optimizer.prepare.space.v_runs_at`.)"""
    code = int(r["schedule"])
    return SCHEDULE_CODES[0 if code == ZB_CODE and r["vpp"] == 1 else code]


def ep_overlap_runs(ep_overlap, ep, moe_dispatcher, recompute):
    """Whether the MoE all-to-all overlap runs (arrays or scalars of `Knobs` codes): set, at ep > 1, and as
    Megatron-Core runs it, with the alltoall or flex dispatcher and without full recompute
    (TransformerConfig asserts both); elsewhere a candidate runs, and is written, without it."""
    allgather = MOE_DISPATCHER_CODES.index(MoeDispatcher.ALLGATHER)
    full = RECOMPUTE.index(Recompute.FULL)
    return (
        np.asarray(ep_overlap).astype(bool)
        & (np.asarray(ep) > 1)
        & (np.asarray(moe_dispatcher) != allgather)
        & (np.asarray(recompute) != full)
    )


def written_ep_overlap(r: dict) -> bool:
    """The MoE all-to-all overlap as a plan writes it: only where it runs (`ep_overlap_runs`)."""
    return bool(ep_overlap_runs(r["ep_overlap"], r["ep"], r["moe_dispatcher"], r["recompute"]))


def to_execution(
    k: Knobs, system: System, i: int = 0, rank_order: RankOrder = RankOrder.TP_CP_DP_PP
) -> Execution:
    """The `Execution` of candidate `i` (inverse of `from_execution`), its ranks numbered in `rank_order`
    (the problem's: not a knob)."""
    r = k.row(i)
    names = [n.name for n in system.networks]
    return Execution(
        tp=r["tp"],
        pp=r["pp"],
        dp=r["dp"],
        cp=r["cp"],
        ep=r["ep"],
        etp=r["etp"],
        vpp=r["vpp"],
        micro_batch=r["micro_batch"],
        schedule=written_schedule(r),
        recompute=RECOMPUTE[r["recompute"]],
        sequence_parallel=bool(r["sequence_parallel"]),
        tp_comm=TpComm.RS_AG if r["tp_comm"] else TpComm.ALLREDUCE,
        sp_ag_redo=bool(r["sp_ag_redo"]),
        tp_overlap=TP_OVERLAP[r["tp_overlap"]],
        pp_rs_ag=bool(r["pp_rs_ag"]),
        pp_embedding_loss=bool(r["pp_embedding_loss"]),
        dp_overlap=bool(r["dp_overlap"]),
        zero=r["zero"],
        fused_layers=bool(r["fused_layers"]),
        attention=ATTENTION[r["attention"]],
        weight_offload=bool(r["weight_offload"]),
        activation_offload=bool(r["activation_offload"]),
        optimizer_offload=bool(r["optimizer_offload"]),
        placement={ax: names[r[f"tier_{ax}"]] for ax in ("tp", "cp", "ep", "dp", "pp")},
        pp_uneven=bool(r["pp_uneven"]),
        activation_offload_layers=r["activation_offload_layers"] or None,
        ep_overlap=written_ep_overlap(r),
        moe_dispatcher=MOE_DISPATCHER_CODES[int(r["moe_dispatcher"])],
        cp_comm=CP_COMM_CODES[int(r["cp_comm"])] if r["cp"] > 1 else CpComm.P2P,  # moot without cp
        recompute_modules=[m for m, bit in RECOMPUTE_BITS.items() if r["recompute_modules"] & bit] or None,
        fused_loss=bool(r["fused_loss"]),
        pp_overlap=bool(r["pp_overlap"]),
        kv_repeat=bool(r["kv_repeat"]),
        cuda_graphs=CUDA_GRAPHS[r["cuda_graphs"]],
        moe_fused_mlp=bool(r["moe_fused_mlp"]),
        moe_probs_in_act=bool(r["moe_probs_in_act"]),
        grad_accumulation=GRAD_ACCUMULATION[r["grad_accumulation"]],
        rank_order=rank_order,
    )
