"""Tables of the CP-SAT formulation, filled by the analytical model (never a second copy of the physics).

The step time (`optimizer.model.step`) is composed of terms that each depend on few knobs:
- per *layout* l = (tp, pp, dp, cp, ep, etp, placement): B*L/(dp*pp), B/dp, L/pp, the DP collectives (AR, RS,
  AG of the stage's gradients/weights), optimizer time and weight/gradient/optimizer memory per ZeRO stage;
- per *layout+vpp* lv: layers per chunk L/(pp*vpp), the overlap window factor, p2p count factors,
  in-flight layers of the interleaved schedule;
- per (layout, micro-batch) lm: micro-batches n_mb and n_mb*L/pp, in-flight layers of 1F1B;
- per *block* beta = (tp, cp, ep, etp, micro-batch, recompute, SP, TP overlap): per-layer time tau, forward
  and backward parts, LM-head/loss time, p2p time, stored and working activations, logits.
The knobs in `OTHER_KNOBS` (kernels, p2p, schedule, SP redo, offload flags) change every table: each
combination the space allows is a *variant* with its own tables (`build_all`), all filled by the same
model calls (the variant knobs are extra columns of each grid).
Each table is read from `evaluate(...).terms` (an `optimizer.model.terms.StepTerms`) on a small grid of
candidates, so the numbers are the model's own; `formulations.pairs` combines them with the composition
functions of `optimizer.model.compose` and the step-time sum `optimizer.model.terms.compose_step`. Units: time
in `TIME_UNIT` = 1 ns, memory in KiB (usage rounded up, capacity rounded down: a plan the solver accepts never
exceeds a capacity of the exact model). A column named after a `StepTerms` field is that field in these
integer units (a `_s` field in ns, a `_bytes` field in KiB); `_z{z}` names its value at ZeRO stage z.

Columns (the composition factors are defined in `optimizer.model.compose`):

    per layout (L)      A1 [sequences x layers], A2 [sequences], Ls [layers], pm2 [exchanges]: layout factors
                        tpcp [index]: the block group (tp, cp, ep, etp, tiers); ppgt1, dpg1 [0/1]: pp > 1, no
                        (expert-)data-parallel group (`rules.layout.has_dp_group`); hc [0..2]: head column
                        (pp = 1; pp > 1; pp > 1 with embedding/loss slots); rso [bit mask]: the block settings
                        (recompute, SP, TP overlap) the layout allows (`block_settings`)
                        dp_allreduce_s, dp_reduce_scatter_s, dp_allgather_s [ns]: the stage's DP collectives;
                        (in the stack's buckets, ZeRO 0-2); F [ns]: FSDP traffic per micro-batch (2 AG +
                        RS, per-layer calls, ZeRO-3); ARb, RSb, AGb, Fb [ns]: one
                        bucket (a layer) of each; optimizer_s_z{z} [ns], state_hbm_bytes_z{z} /
                        state_offload_bytes_z{z} [KiB]: per ZeRO stage z; reserved_bytes [KiB];
                        fsdp_copy_allreduce_s, fsdp_copy_reduce_s, fsdp_copy_gather_s [ns]: PyTorch FSDP's
                        copies around one gradient all-reduce / reduce-scatter / parameter gather (0 on other
                        stacks)
    per (layout, vpp)   Lc [layers], Wm [layer backwards], E [exchanges x sequences], Bf [layer times],
                        inflv [layers]: vpp factors; ARv, RSv [ns]: the all-reduce and reduce-scatter over vpp
    per (layout, mb)    nmb [micro-batches], NL [layers x micro-batches], infl1 [layers]: micro-batch factors
    per block (BETA)    layer_s [ns]: one layer, one micro-batch; tau_mb [ns/sequence]: layer_s / mb;
                        layer_fw_s, layer_bw_s, fbt [ns]: its forward, backward, both; bubble_fill_s
                        [ns]: what zero-bubble fills the bubble with per layer; head_s [ns] per
                        (head column, PP tier): the edge stage's LM head and loss per micro-batch (the p2p it
                        hides is taken off per pair, `formulations.pairs.compose`); p2p_s [ns] per PP tier:
                        one exchange; p2p_window [ns]: a layer's forward, which Lc of hide an interleaved
                        exchange (`compose.p2p_steady`); offx_mb [ns/sequence]: exposed offload streaming of a
                        layer; act_stored_bytes, act_working_bytes, emb_out_bytes, logits_bytes [KiB]:
                        activations of a layer kept, rebuilt by recompute, the embedding output and the logits
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields, replace
from itertools import product

import numpy as np

from optimizer.errors import TimeLimit
from optimizer.model.capacity import capacity_bytes
from optimizer.model.compose import (
    edge_extra,
    fsdp_traffic,
    layout_factors,
    layout_slack,
    layout_units,
    mb_factors,
    split_slots,
    vpp_factors,
)
from optimizer.model.knobs import Knobs
from optimizer.model.step import evaluate, make_ctx
from optimizer.model.terms import StepTerms
from optimizer.prepare.space import Compact, given_knobs, triple_sizes, v_runs_at
from optimizer.rules.layout import has_dp_group
from optimizer.schema import Problem
from optimizer.schema.common import SCHEDULE_CODES, V_SCHEDULES

TIME_UNIT = 1e9  # integer time unit per second (1 ns)
KIB = 1024.0
DP_COLUMNS = ("dp_allreduce_s", "dp_reduce_scatter_s", "dp_allgather_s")
FSDP_COPY_COLUMNS = ("fsdp_copy_allreduce_s", "fsdp_copy_reduce_s", "fsdp_copy_gather_s")


def t_int(x) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=float) * TIME_UNIT).astype(np.int64)


def kib_up(x) -> np.ndarray:
    return np.ceil(np.asarray(x, dtype=float) / KIB - 1e-9).astype(np.int64)


@dataclass
class Tables:
    problem: Problem
    # layouts
    lay: dict[str, np.ndarray]  # columns tp, pp, dp, cp, tier_* per layout
    L: dict[str, np.ndarray]  # integer tables per layout
    # values of the per-candidate knobs
    v_vals: list[int]
    mb_vals: list[int]
    rec_vals: list[int]
    sp_vals: list[int]
    ov_vals: list[int]
    z_vals: list[int]
    dpo_vals: list[int]
    tpcp: list[
        tuple[int, ...]
    ]  # block groups (GROUP_AXES: tp, cp, ep, etp, their tiers); layout -> L["tpcp"]
    LV: dict[str, np.ndarray]  # per (layout, v index), flattened l*nV + vi
    LM: dict[str, np.ndarray]  # per (layout, mb index), flattened l*nM + mi
    BETA: dict[str, np.ndarray]  # per block index (see beta_index)
    legal_lvm: np.ndarray  # rows: legal (l, vi, mi)
    cap_kib: int
    n_candidates: int
    fixed: dict[str, int] = field(default_factory=dict)  # the variant: codes of the OTHER_KNOBS
    pu_tiers: list[float] = field(default_factory=list)
    off_cap_kib: int = 0  # offload memory per GPU, KiB (rounded down)
    var: int = 0  # index of the variant among `build_all`'s
    cand_per_layout: np.ndarray | None = None  # candidates of the space per layout (sizes of subsets)

    @property
    def n_head_cols(self) -> int:
        """Head columns of BETA["head_s"] (per block and PP tier): pp = 1, pp > 1, el slots, and one per
        custom layout's slack (`_layout_tables`)."""
        return len(self.BETA["head_s"]) // max(len(self.BETA["p2p_s"]), 1)

    def gpus(self, li: np.ndarray) -> np.ndarray:
        """GPUs used by layouts l: tp*pp*dp*cp."""
        return (self.lay["tp"] * self.lay["pp"] * self.lay["dp"] * self.lay["cp"])[li]

    @property
    def nV(self) -> int:
        return len(self.v_vals)

    @property
    def nM(self) -> int:
        return len(self.mb_vals)


OTHER_KNOBS = (
    "fused_layers",
    "attention",
    "sp_ag_redo",
    "pp_rs_ag",
    "schedule",
    "moe_dispatcher",
    "ep_overlap",
    "cp_comm",
    "weight_offload",
    "activation_offload",
    "optimizer_offload",
)
"""Knobs that set a *variant* (one set of tables each): kernels, p2p, schedule, MoE dispatch and offload
flags."""


def knob_grid(fixed: dict, n: int, **cols) -> Knobs:
    """n candidates: the given columns, the variant's knobs (`fixed`: scalars or arrays of n), everything else
    at its neutral value."""
    base = dict(
        tp=1,
        pp=1,
        dp=1,
        cp=1,
        ep=1,
        pp_embedding_loss=0,
        vpp=1,
        micro_batch=1,
        recompute=0,
        sequence_parallel=0,
        tp_overlap=0,
        dp_overlap=0,
        zero=0,
        tier_tp=0,
        tier_cp=0,
        tier_ep=0,
        tier_dp=0,
        tier_pp=0,
    )
    base.update(fixed)  # the variant's knobs and the given ones (`Compact.given`)
    base.update(cols)
    base["tp_comm"] = base["sequence_parallel"]
    base.setdefault("etp", base["tp"])
    return Knobs(**{k: np.broadcast_to(np.asarray(v, dtype=np.int64), (n,)).copy() for k, v in base.items()})


def _union(c: Compact) -> dict[str, set[int]]:
    """Per knob of `c.other`, the coded values any layout allows."""
    union: dict[str, set[int]] = {}
    seen: set[int] = set()
    for per in c.other:  # layouts share a few distinct lists: look at each once
        if id(per) in seen:
            continue
        seen.add(id(per))
        for n, vs in per:
            union.setdefault(n, set()).update(vs)
    return union


def variants(c: Compact) -> list[dict[str, int]]:
    """Every combination of the values the space gives the variant knobs (`OTHER_KNOBS`), as codes, each with
    the knobs no candidate chooses (`Compact.given`)."""
    union = _union(c)
    return [
        dict(zip(OTHER_KNOBS, combo, strict=True)) | c.given
        for combo in product(*[sorted(union[n]) for n in OTHER_KNOBS])
    ]


def build_tables(problem: Problem, c: Compact) -> Tables:
    """The tables of a space with a single variant (tests and tools; the solver uses `build_all`)."""
    Ts = build_all(problem, c)
    if len(Ts) != 1:
        raise ValueError(f"{len(Ts)} variants: use build_all")
    return Ts[0]


def same_given(Ts: list[Tables], problem: Problem) -> bool:
    """Whether the tables were filled with the problem's given knobs (`Compact.given`: CUDA graphs, the fused
    expert MLP, where the router's probabilities apply); tables of other ones cannot be restricted to it."""
    return bool(Ts) and all(Ts[0].fixed.get(k) == code for k, code in given_knobs(problem).items())


def restrict(Ts: list[Tables], problem: Problem) -> tuple[list[Tables], int]:
    """The tables of `problem` from those of the same problem with more GPUs and idle GPUs allowed (the same
    LLM, batch, search and options, and a system that differs at most in its memory capacities, which enter
    no table: only the capacity rows): a larger GPU count's space holds every smaller layout, so the subset
    is the rows of layouts within problem.num_gpus. Returns the tables and the subset's size."""
    T0 = Ts[0]
    keep_l = T0.gpus(np.arange(len(T0.lay["tp"]))) <= problem.num_gpus
    cap = int(np.floor(capacity_bytes(problem) / KIB))
    off_cap = int(np.floor(problem.system.offload.capacity_gib * 2.0**30 / KIB))
    out = [
        replace(
            T,
            problem=problem,
            legal_lvm=T.legal_lvm[keep_l[T.legal_lvm[:, 0]]],
            cap_kib=cap,
            off_cap_kib=off_cap,
        )
        for T in Ts
    ]
    return out, int(T0.cand_per_layout[keep_l].sum())


def _variants_admitted(c: Compact) -> tuple[list[dict[str, int]], np.ndarray]:
    """The variants some layout admits (the space narrows some knobs per layout: no p2p without pp, ...) and,
    per variant, which layouts admit it (a bool array variants x layouts)."""
    allv = variants(c)
    admits = np.zeros((len(allv), len(c.layouts)), dtype=bool)
    for li in range(len(c.layouts)):
        per = {n: set(vs) for n, vs in c.other[li] if n in OTHER_KNOBS}
        for vi_, v in enumerate(allv):
            admits[vi_, li] = all(v[k] in per[k] for k in OTHER_KNOBS)
    keep_v = [i for i in range(len(allv)) if admits[i].any()]
    return [allv[i] for i in keep_v], admits[keep_v]


def _layout_columns(c: Compact) -> dict[str, np.ndarray]:
    """Knob columns per layout: tp, pp, cp, dp, ep, etp, pp_embedding_loss, pp_uneven and the tier of each
    axis."""
    lay = {
        n: np.array([lt[i] for lt in c.layouts])
        for i, n in enumerate(("tp", "pp", "cp", "dp", "ep", "etp", "pp_embedding_loss", "pp_uneven"))
    }
    for ax in ("tp", "cp", "dp", "pp", "ep"):
        lay[f"tier_{ax}"] = np.array([t[ax] for t in c.tiers])
    return lay


def _values(c: Compact) -> dict[str, list[int]]:
    """The values of the per-candidate knobs: vpp and micro-batch of the triples, the others coded."""
    union = _union(c)
    return {
        "vpp": np.unique(c.triples[:, 1]).tolist(),
        "mb": np.unique(c.triples[:, 2]).tolist(),
        "recompute": sorted(union["recompute"]),
        "sp": sorted(union["sequence_parallel"]),
        "tp_overlap": sorted(union["tp_overlap"]),
        "zero": sorted(union["zero"]),
        "dp_overlap": sorted(union["dp_overlap"]),
    }


RUN_CHUNK_ROWS = 1 << 18  # model rows (rows x variants) per evaluation while the tables are filled


def _runner(problem: Problem, allv: list[dict[str, int]], deadline: float | None = None):
    """run(n, **cols): the model's `StepTerms` on n rows per variant, every field an array (nVar, n),
    evaluated in chunks of about RUN_CHUNK_ROWS model rows (bounded memory, and the time limit checked
    between chunks); TimeLimit once `deadline` (perf_counter s) has passed."""
    fixed_cols = {k: np.array([v[k] for v in allv], dtype=np.int64) for k in allv[0]}
    nVar, ctx = len(allv), make_ctx(problem)

    def chunk(n: int, cols: dict) -> dict[str, np.ndarray]:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeLimit("the time limit passed while the model's tables were filled, before any plan")
        fx = {k: np.repeat(v, n) for k, v in fixed_cols.items()}
        tiled = {k: np.tile(np.broadcast_to(np.asarray(v), (n,)), nVar) for k, v in cols.items()}
        t = evaluate(problem, knob_grid(fx, nVar * n, **tiled), ctx).terms
        return {
            f.name: np.broadcast_to(np.asarray(getattr(t, f.name), dtype=float), (nVar * n,)).reshape(nVar, n)
            for f in fields(StepTerms)
        }

    def run(n: int, **cols) -> StepTerms:
        step = max(1, RUN_CHUNK_ROWS // max(nVar, 1))
        parts = [
            chunk(
                min(n, lo + step) - lo,
                {k: v[lo : lo + step] if np.ndim(v) and np.size(v) == n else v for k, v in cols.items()},
            )
            for lo in range(0, max(n, 1), step)
        ]
        if len(parts) == 1:
            return StepTerms(**parts[0])
        return StepTerms(**{k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]})

    run.n_variants = nVar
    return run


GROUP_AXES = ("tp", "cp", "ep", "etp", "tier_tp", "tier_cp", "tier_ep")


def _group_keys(lay: dict) -> list[tuple[int, ...]]:
    """Each layout's block group: (tp, cp, ep, etp) and the tiers of the TP, CP and EP groups (a group's
    tier also depends on the job's GPUs per domain, `optimizer.rules.layout.placement`)."""
    return [tuple(int(x) for x in key) for key in zip(*(lay[a] for a in GROUP_AXES), strict=True)]


def _cut_codes(cut: np.ndarray, custom: np.ndarray) -> np.ndarray:
    """The (el, slack) codes, el + 2 slack, of the custom layouts, sorted: head column 3 + i is the i-th."""
    return np.unique(cut[custom])


def _layout_tables(problem: Problem, lay: dict, tpcp_index: dict, z_vals: list[int], run, nVar: int):
    """Per layout: the composition factors and flags (variant-independent, L0) and, per variant, the DP
    collectives, FSDP's copies, the reserve and the optimizer and state of each ZeRO stage; and the terms
    of a bucketed (ZeRO 0-2) stage."""
    L0: dict[str, np.ndarray] = {}
    # the embedding and loss take a layer slot each; a custom layout (uneven) also places the MTP blocks,
    # padded to its busiest stage, and its last stage holds `slack` fewer slots (`_Shape`)
    pp, un, el = lay["pp"], (lay["pp_uneven"] == 1) & (lay["pp"] > 1), lay["pp_embedding_loss"]
    units = layout_units(problem.llm.layers, el, un, problem.mtp_layers)
    slots = split_slots(units, pp, 1, un)
    keep = el + problem.mtp_layers  # the last stage keeps the loss and the MTP blocks
    L0["slack"] = np.where(un, layout_slack(units, pp, 1, keep), 0).astype(np.int64)
    L0["un"] = un.astype(np.int64)
    L0.update(layout_factors(problem.training.global_batch, slots, lay["dp"], lay["pp"]))  # A1, A2, Ls, pm2
    L0["tpcp"] = np.array([tpcp_index[key] for key in _group_keys(lay)])
    edp = lay["tp"] * lay["cp"] * lay["dp"] // (lay["ep"] * lay["etp"])
    L0["dpg1"] = (~has_dp_group(lay["dp"] * lay["cp"], edp)).astype(np.int64)
    L0["ppgt1"] = (lay["pp"] > 1).astype(np.int64)
    # head column: pp = 1; pp > 1; pp > 1 with el slots; 3 + i: a custom layout with the i-th (el, slack)
    cut = el + 2 * L0["slack"]  # (el, slack) as one code
    L0["hc"] = np.where(un, 3 + np.searchsorted(_cut_codes(cut, un), cut), L0["ppgt1"] + el).astype(np.int64)
    L0["cut"] = cut
    nL = len(lay["tp"])
    r = run(nL, **lay)
    by_zero = {z: run(nL, **lay, zero=z) for z in z_vals}
    # the traffic goes out in the stack's buckets at ZeRO 0-2 and per layer at ZeRO-3 (`step.dp_calls`): the
    # all-reduce, reduce-scatter and all-gather columns (ZeRO 0-2) come from a bucketed stage, F from ZeRO-3's
    r_b = by_zero.get(min(z_vals), r) if min(z_vals, default=3) < 3 else r
    r_3 = by_zero.get(3, r)
    Lv: list[dict[str, np.ndarray]] = [dict(L0) for _ in range(nVar)]
    bkt = r.dp_bucket_fraction
    for j, Lt in enumerate(Lv):
        for name in FSDP_COPY_COLUMNS:
            Lt[name] = t_int(getattr(r, name)[j])
        for name, b in zip(DP_COLUMNS, ("ARb", "RSb", "AGb"), strict=True):
            Lt[name] = t_int(getattr(r_b, name)[j])
            Lt[b] = t_int(getattr(r_b, name)[j] * bkt[j])
        F = fsdp_traffic(r_3.dp_allgather_s[j], r_3.dp_reduce_scatter_s[j])
        Lt["F"], Lt["Fb"] = t_int(F), t_int(F * bkt[j])
        Lt["reserved_bytes"] = kib_up(r.reserved_bytes[j])
    for z in z_vals:
        rz = by_zero[z]
        for j, Lt in enumerate(Lv):
            Lt[f"optimizer_s_z{z}"] = t_int(rz.optimizer_s[j])
            Lt[f"state_hbm_bytes_z{z}"] = kib_up(rz.state_hbm_bytes[j])
            Lt[f"state_offload_bytes_z{z}"] = kib_up(rz.state_offload_bytes[j])
    return slots, L0, Lv, r_b


def _lv_lm_tables(B: int, slots, lay: dict, vals: dict):
    """Per (layout, vpp) and (layout, micro-batch) rows: the vpp and micro-batch factors; rows of an illegal
    combination are zero (never read by a legal triple)."""
    nL, nV, nM = len(lay["tp"]), len(vals["vpp"]), len(vals["mb"])
    pp2, dp2 = np.repeat(lay["pp"], nV), np.repeat(lay["dp"], nV)
    v2 = np.tile(np.array(vals["vpp"]), nL)
    okv = (np.repeat(slots, nV) % (pp2 * v2)) == 0
    fv = vpp_factors(B, np.repeat(slots, nV), dp2, pp2, v2)
    LV = {"v": v2} | {k: np.where(okv, x, 0) for k, x in fv.items()}
    ppm, dpm = np.repeat(lay["pp"], nM), np.repeat(lay["dp"], nM)
    m2 = np.tile(np.array(vals["mb"]), nL)
    okm = (B % (dpm * m2)) == 0
    LM = {k: np.where(okm, x, 0) for k, x in mb_factors(B, np.repeat(slots, nM), dpm, ppm, m2).items()}
    return LV, LM


def block_settings(c: Compact, vals: dict) -> np.ndarray:
    """Per layout, the block settings (recompute, SP, TP overlap) its space allows, as a bit mask over the
    setting index (ri * nS + si) * nO + oi of the value lists `vals` (e.g. Megatron-Core's MoE with TP
    only with SP, while layouts without TP only without)."""
    nR, nS, nO = len(vals["recompute"]), len(vals["sp"]), len(vals["tp_overlap"])
    if nR * nS * nO > 62:
        raise ValueError(f"{nR * nS * nO} block settings: more than a 64-bit mask holds")
    ri, si, oi = (a.reshape(-1) for a in np.indices((nR, nS, nO)))
    rec, sp, ov = (np.array(vals[k]) for k in ("recompute", "sp", "tp_overlap"))
    bits = np.left_shift(np.int64(1), np.arange(nR * nS * nO, dtype=np.int64))
    memo: dict[tuple, int] = {}
    out = np.zeros(len(c.other), dtype=np.int64)
    for li, per in enumerate(c.other):
        d = dict(per)
        key = tuple(tuple(d[n]) for n in ("recompute", "sequence_parallel", "tp_overlap"))
        if key not in memo:
            ok = np.isin(rec[ri], key[0]) & np.isin(sp[si], key[1]) & np.isin(ov[oi], key[2])
            memo[key] = int(bits[ok].sum())
        out[li] = memo[key]
    return out


def or_masks(keys: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct `keys` (ascending) and, per key, the bitwise OR of its rows' `masks`."""
    if len(keys) == 0:
        return keys, masks
    order = np.argsort(keys, kind="stable")
    k, m = keys[order], masks[order]
    uniq, start = np.unique(k, return_index=True)
    return uniq, np.bitwise_or.reduceat(m, start)


def _needed_blocks(lay: dict, L0: dict, legal: np.ndarray, nG: int, nM: int, n_set: int):
    """Which block rows a legal triple reads: those of its layout's group and its micro-batch, at the
    settings its layout allows (`block_settings`); per PP tier, those read at pp > 1 (the exchange and the
    head) and with embedding/loss slots. Rows no triple reads are not evaluated (they stay 0)."""
    li, mi = legal[:, 0], legal[:, 2]
    gm = L0["tpcp"][li] * nM + mi

    def rows(sel: np.ndarray) -> np.ndarray:
        g, mask = or_masks(gm[sel], L0["rso"][li[sel]])
        bits = ((mask[:, None] >> np.arange(n_set, dtype=np.int64)) & 1).astype(bool)
        r, s = np.nonzero(bits)
        return g[r] * n_set + s  # sorted: g ascending, then s

    every = np.ones(len(li), dtype=bool)
    pp2 = lay["pp"][li] > 1
    tiers = sorted(set(int(x) for x in lay["tier_pp"][li[pp2]]))
    at_pp2 = {t: rows(pp2 & (lay["tier_pp"][li] == t)) for t in tiers}
    el = pp2 & (lay["pp_embedding_loss"][li] == 1)
    with_el = {t: rows(el & (lay["tier_pp"][li] == t)) for t in tiers}
    return rows(every), at_pp2, with_el


def _run_rows(run, idx: np.ndarray, cols_of, names: tuple, **fixed) -> dict[str, np.ndarray]:
    """The fields `names` of the model on the block rows `idx` (`cols_of(idx)`: their knob columns), each
    an (nVar, len(idx)) array."""
    if len(idx) == 0:
        return {name: np.zeros((run.n_variants, 0)) for name in names}
    r = run(len(idx), **cols_of(idx), **fixed)
    return {name: np.asarray(getattr(r, name), dtype=float) for name in names}


def _scatter(n: int, idx: np.ndarray, values: np.ndarray) -> np.ndarray:
    """An int64 array of n rows, `values` at `idx`, 0 elsewhere (rows no triple reads)."""
    out = np.zeros(n, dtype=np.int64)
    out[idx] = values
    return out


BLOCK_FIELDS = (
    "layer_s",
    "layer_fw_s",
    "layer_bw_s",
    "bubble_fill_s",
    "act_stored_bytes",
    "act_working_bytes",
    "emb_out_bytes",
    "logits_bytes",
    "mtp_act_bytes",
    "offload_layer_s",
    "head_s",
)


def _block_shape(tpcp: list, vals: dict) -> tuple[int, ...]:
    return (len(tpcp), len(vals["mb"]), len(vals["recompute"]), len(vals["sp"]), len(vals["tp_overlap"]))


def _block_rows(lay: dict, L0: dict, tpcp: list, vals: dict, idx: np.ndarray) -> dict[str, np.ndarray]:
    """The knob columns of the blocks `idx` (flat index over `_block_shape`), a block beta = (tp, cp, ep, etp
    group and their tiers, micro-batch, recompute, SP, TP overlap)."""
    ti, mi, ri, si, oi = np.unravel_index(idx, _block_shape(tpcp, vals))
    grp = np.array(tpcp, dtype=np.int64)[ti]
    mb_b = np.array(vals["mb"])[mi]
    return dict(
        tp=grp[:, 0],
        cp=grp[:, 1],
        ep=grp[:, 2],
        etp=grp[:, 3],
        micro_batch=mb_b,
        recompute=np.array(vals["recompute"])[ri],
        sequence_parallel=np.array(vals["sp"])[si],
        tp_overlap=np.array(vals["tp_overlap"])[oi],
        tier_tp=grp[:, 4],
        tier_cp=grp[:, 5],
        tier_ep=grp[:, 6],
    )


def _block_tables(
    problem: Problem, lay: dict, L0: dict, tpcp: list, vals: dict, run, nVar: int, legal: np.ndarray
) -> list[dict]:
    """Per variant, the per-block columns (module docstring): one layer's times and activations, and the edge
    stage's head per (head column, PP tier) and one p2p exchange per PP tier, from pp = 2 grids; only the
    rows some legal triple (`legal`: rows l, vi, mi) reads (`_needed_blocks`) are evaluated."""
    shape = _block_shape(tpcp, vals)
    nB, nT, n_set = int(np.prod(shape)), len(problem.system.networks), int(np.prod(shape[2:]))
    need, need_pp2, need_el = _needed_blocks(lay, L0, legal, len(tpcp), len(vals["mb"]), n_set)
    mb_n = np.array(vals["mb"])[(need // n_set) % len(vals["mb"])]  # the micro-batch of each row evaluated

    def cols(idx):
        return _block_rows(lay, L0, tpcp, vals, idx)

    rb = _run_rows(run, need, cols, BLOCK_FIELDS, pp=1)
    at_pp2 = ("head_s", "p2p_s", "head_last_s", "head_first_s", "layer_s")
    rps = {t: _run_rows(run, ix, cols, at_pp2, pp=2, tier_pp=t) for t, ix in need_pp2.items()}
    cut_vals = _cut_codes(L0["cut"], L0["un"] == 1)  # the custom layouts' head columns (3 + i)
    mtp = problem.mtp_layers
    rpe = {
        t: _run_rows(run, ix, cols, ("head_s",), pp=2, pp_embedding_loss=1, tier_pp=t)
        for t, ix in need_el.items()
    }
    out = []
    for j in range(nVar):
        BETA = {
            n: _scatter(nB, need, t_int(rb[n][j]))
            for n in ("layer_s", "layer_fw_s", "layer_bw_s", "bubble_fill_s")
        }
        BETA["tau_mb"] = _scatter(nB, need, t_int(rb["layer_s"][j] / mb_n))
        BETA["fbt"] = _scatter(nB, need, t_int(rb["layer_fw_s"][j] + rb["layer_bw_s"][j]))
        for name in (
            "act_stored_bytes",
            "act_working_bytes",
            "emb_out_bytes",
            "logits_bytes",
            "mtp_act_bytes",
        ):
            BETA[name] = _scatter(nB, need, kib_up(rb[name][j]))
        BETA["offx_mb"] = _scatter(nB, need, t_int(rb["offload_layer_s"][j] / mb_n))
        # head column (hc) x PP tier: the edge stage's LM head and loss per micro-batch (hc: pp = 1; pp > 1;
        # pp > 1 with the embedding and loss as layer slots); the exchange it hides is taken off per pair
        # pp > 1 with a custom layout shedding s blocks: `compose.edge_extra` of the pp = 2 row's parts
        head = np.zeros((nB, 3 + len(cut_vals), nT), dtype=np.int64)
        head[need, 0, :] = t_int(rb["head_s"][j])[:, None]
        p2p = np.zeros((nB, nT), dtype=np.int64)
        for tpp, rp in rps.items():
            head[need_pp2[tpp], 1, tpp] = t_int(rp["head_s"][j])
            if tpp in rpe:
                head[need_el[tpp], 2, tpp] = t_int(rpe[tpp]["head_s"][j])
            hl, hf, tau = rp["head_last_s"][j], rp["head_first_s"][j], rp["layer_s"][j]
            for i, c in enumerate(cut_vals.tolist()):
                extra = edge_extra(hl, hf, tau, 2, c % 2, 1, c // 2, mtp * tau)
                head[need_pp2[tpp], 3 + i, tpp] = t_int(extra)
            p2p[need_pp2[tpp], tpp] = t_int(rp["p2p_s"][j])
        BETA["head_s"], BETA["p2p_s"] = head.reshape(-1), p2p.reshape(-1)
        BETA["p2p_window"] = BETA["layer_fw_s"]  # a layer's forward per micro-batch: x Lc hides an exchange
        out.append(BETA)
    return out


def build_all(problem: Problem, c: Compact, deadline: float | None = None) -> list[Tables]:
    """The tables of every variant of the space that has legal triples, filled in one pass: each call to the
    model evaluates the grid of every variant at once (the variant knobs as columns); TimeLimit once
    `deadline` (perf_counter s) has passed."""
    if c.size == 0:
        raise ValueError("empty space: solve_cpsat answers it before building tables")
    allv, admits = _variants_admitted(c)
    nVar, nL = len(allv), len(c.layouts)
    lay, vals = _layout_columns(c), _values(c)
    tpcp = sorted(set(_group_keys(lay)))
    run = _runner(problem, allv, deadline)
    tpcp_index = {x: i for i, x in enumerate(tpcp)}
    slots, L0, Lv, r_dp = _layout_tables(problem, lay, tpcp_index, vals["zero"], run, nVar)
    pu_tiers = [float(n.processor_usage) for n in problem.system.networks]
    LV, LM = _lv_lm_tables(problem.training.global_batch, slots, lay, vals)
    legal_all = np.stack(
        [
            c.triples[:, 0],
            np.searchsorted(vals["vpp"], c.triples[:, 1]),
            np.searchsorted(vals["mb"], c.triples[:, 2]),
        ],
        axis=1,
    )
    L0["rso"] = block_settings(c, vals)
    for Lt in Lv:
        Lt["rso"] = L0["rso"]
    BETAs = _block_tables(problem, lay, L0, tpcp, vals, run, nVar, legal_all)
    cap = int(np.floor(capacity_bytes(problem) / KIB))
    off_cap = int(np.floor(problem.system.offload.capacity_gib * 2.0**30 / KIB))
    cand = np.bincount(c.triples[:, 0], weights=triple_sizes(problem, c), minlength=nL).astype(np.int64)
    v2, nV = LV["v"], len(vals["vpp"])
    out = []
    for j, v in enumerate(allv):
        LVj = dict(
            LV,
            ARv=t_int(np.repeat(r_dp.dp_allreduce_s[j], nV) / v2),
            RSv=t_int(np.repeat(r_dp.dp_reduce_scatter_s[j], nV) / v2),
        )
        legal = legal_all[admits[j][legal_all[:, 0]]]
        if SCHEDULE_CODES[v["schedule"]].value in V_SCHEDULES:  # a V schedule's rows only where it runs
            lv_, vv_, mm_ = legal[:, 0], np.array(vals["vpp"])[legal[:, 1]], np.array(vals["mb"])[legal[:, 2]]
            b_ = problem.training.global_batch
            legal = legal[v_runs_at(b_, lay["pp"][lv_], lay["dp"][lv_], vv_, mm_)]
        out.append(
            Tables(
                problem,
                lay,
                Lv[j],
                vals["vpp"],
                vals["mb"],
                vals["recompute"],
                vals["sp"],
                vals["tp_overlap"],
                vals["zero"],
                vals["dp_overlap"],
                tpcp,
                LVj,
                LM,
                BETAs[j],
                legal,
                cap,
                c.size,
                dict(v),
                pu_tiers,
                off_cap,
                j,
                cand,
            )
        )
    return out
