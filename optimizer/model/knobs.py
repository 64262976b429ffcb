"""Knobs of a parallel execution as numpy arrays, so that the model evaluates many candidates at once.

Every field is an integer array (booleans as 0/1, enums as their code below); all fields broadcast
together. A single execution is an array of length 1.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from ..schema import AttentionKernel, Execution, Recompute, Schedule, System, TpComm, TpOverlap

RECOMPUTE = [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL]  # code = index
TP_OVERLAP = [TpOverlap.NONE, TpOverlap.PIPE, TpOverlap.RING]


@dataclass(frozen=True)
class Knobs:
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    mb: np.ndarray  # micro-batch, sequences
    recompute: np.ndarray  # 0 none, 1 selective, 2 full
    sp: np.ndarray  # sequence parallel (implies reduce-scatter + all-gather TP collectives)
    rs_ag: np.ndarray  # TP collective is RS+AG instead of AR
    sp_redo: np.ndarray  # redo the SP all-gather in backward instead of storing it
    tp_overlap: np.ndarray  # 0 none, 1 pipe, 2 ring
    pp_rs_ag: np.ndarray  # scatter-gather p2p
    pp_el: np.ndarray  # embedding and loss take a layer slot each in the pipeline split
    dp_overlap: np.ndarray
    zero: np.ndarray  # 0..3
    fused: np.ndarray
    flash: np.ndarray
    gpipe: np.ndarray  # 1 = GPipe schedule, 0 = 1F1B
    w_off: np.ndarray
    a_off: np.ndarray
    o_off: np.ndarray
    tier_tp: np.ndarray
    tier_cp: np.ndarray
    tier_ep: np.ndarray
    tier_dp: np.ndarray
    tier_pp: np.ndarray

    @property
    def size(self) -> int:
        return int(np.broadcast(*[getattr(self, f.name) for f in fields(self)]).size)

    def take(self, idx) -> "Knobs":
        """The candidates at positions `idx` (after broadcasting all fields to a common shape)."""
        arrs = np.broadcast_arrays(*[getattr(self, f.name) for f in fields(self)])
        return Knobs(*[a.reshape(-1)[idx] for a in arrs])

    def replace(self, **kw) -> "Knobs":
        return replace(self, **{k: np.asarray(v) for k, v in kw.items()})

    def row(self, i: int = 0) -> dict[str, int]:
        arrs = np.broadcast_arrays(*[getattr(self, f.name) for f in fields(self)])
        return {f.name: int(a.reshape(-1)[i]) for f, a in zip(fields(self), arrs)}

    @classmethod
    def concat(cls, parts: list["Knobs"]) -> "Knobs":
        """One set of candidates from several (each broadcast to its own size first)."""
        flat = []
        for k in parts:
            arrs = np.broadcast_arrays(*[np.atleast_1d(getattr(k, f.name)) for f in fields(k)])
            flat.append([a.reshape(-1) for a in arrs])
        return cls(*[np.concatenate([p[i] for p in flat]) for i in range(len(fields(cls)))])

    @classmethod
    def from_dict(cls, d: dict) -> "Knobs":
        return cls(**{f.name: np.atleast_1d(np.asarray(d[f.name], dtype=np.int64)) for f in fields(cls)})


def default_tiers(system: System, degrees: dict[str, int]) -> dict[str, int]:
    """Tier of each axis of one layout by `optimizer.layout.placement` (Megatron rank order)."""
    from ..layout import placement

    g = {ax: int(degrees.get(ax, 1)) for ax in ("tp", "cp", "dp", "pp", "ep")}
    etp = int(degrees.get("etp") or g["tp"])
    return placement([n.size for n in system.networks], g["tp"], g["cp"], g["dp"], g["pp"], g["ep"], etp)


def tier_index(system: System, value: str | int) -> int:
    if isinstance(value, int):
        if not 0 <= value < len(system.networks):
            raise ValueError(f"tier {value} out of range (0..{len(system.networks) - 1})")
        return value
    names = [n.name for n in system.networks]
    if value not in names:
        raise ValueError(f"unknown network '{value}' (system has {', '.join(names)})")
    return names.index(value)


def from_execution(ex: Execution, system: System, num_gpus: int) -> Knobs:
    """The knobs of one `Execution` (arrays of length 1)."""
    dp = ex.dp if ex.dp is not None else max(1, num_gpus // (ex.tp * ex.pp * ex.cp))
    degrees = {"tp": ex.tp, "pp": ex.pp, "dp": dp, "cp": ex.cp, "ep": ex.ep, "etp": ex.etp or ex.tp}
    tiers = default_tiers(system, degrees)
    for ax, v in (ex.placement or {}).items():
        tiers[ax] = tier_index(system, v)
    rs_ag = ex.sequence_parallel if ex.tp_comm is None else ex.tp_comm == TpComm.RS_AG
    d = dict(
        tp=ex.tp, pp=ex.pp, dp=dp, cp=ex.cp, ep=ex.ep, etp=ex.etp or ex.tp, vpp=ex.vpp, mb=ex.micro_batch,
        recompute=RECOMPUTE.index(ex.recompute), sp=int(ex.sequence_parallel), rs_ag=int(rs_ag),
        sp_redo=int(ex.sp_ag_redo), tp_overlap=TP_OVERLAP.index(ex.tp_overlap), pp_rs_ag=int(ex.pp_rs_ag),
        pp_el=int(ex.pp_embedding_loss),
        dp_overlap=int(ex.dp_overlap), zero=ex.zero, fused=int(ex.fused_layers),
        flash=int(ex.attention == AttentionKernel.FLASH), gpipe=int(ex.schedule == Schedule.GPIPE),
        w_off=int(ex.weight_offload), a_off=int(ex.activation_offload), o_off=int(ex.optimizer_offload),
        tier_tp=tiers["tp"], tier_cp=tiers["cp"], tier_ep=tiers["ep"], tier_dp=tiers["dp"], tier_pp=tiers["pp"],
    )
    return Knobs.from_dict(d)


def to_execution(k: Knobs, system: System, i: int = 0) -> Execution:
    """The `Execution` of candidate `i` (inverse of `from_execution`)."""
    r = k.row(i)
    names = [n.name for n in system.networks]
    return Execution(
        tp=r["tp"], pp=r["pp"], dp=r["dp"], cp=r["cp"], ep=r["ep"], etp=r["etp"], vpp=r["vpp"],
        micro_batch=r["mb"], schedule=Schedule.GPIPE if r["gpipe"] else Schedule.ONE_F_ONE_B,
        recompute=RECOMPUTE[r["recompute"]], sequence_parallel=bool(r["sp"]),
        tp_comm=TpComm.RS_AG if r["rs_ag"] else TpComm.ALLREDUCE, sp_ag_redo=bool(r["sp_redo"]),
        tp_overlap=TP_OVERLAP[r["tp_overlap"]], pp_rs_ag=bool(r["pp_rs_ag"]), pp_embedding_loss=bool(r["pp_el"]),
        dp_overlap=bool(r["dp_overlap"]),
        zero=r["zero"], fused_layers=bool(r["fused"]),
        attention=AttentionKernel.FLASH if r["flash"] else AttentionKernel.STANDARD,
        weight_offload=bool(r["w_off"]), activation_offload=bool(r["a_off"]), optimizer_offload=bool(r["o_off"]),
        placement={ax: names[r[f"tier_{ax}"]] for ax in ("tp", "cp", "ep", "dp", "pp")},
    )
