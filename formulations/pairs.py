"""Per-pair terms: the step-time and memory terms of each (triple, block) pair: the factor tables of
`formulations.tables` (which the analytical model fills) composed by the model's own functions
(`optimizer.model.compose`: pipeline, DP links and exposure per ZeRO stage, activations), called here on
integers (ns, KiB) as `optimizer.model.step` calls them on floats. Both the bounds (`formulations.bounds`)
and the CP-SAT model (`formulations.step_time`, `formulations.memory`) read these columns.

A pair is a legal (layout, vpp, micro-batch) triple with one block setting (recompute, SP, TP overlap).
What a pair does not decide is left to the solver: the ZeRO stage z, DP overlap on/off, hence the DP time
and the state memory. Columns (integers; time in TIME_UNIT, memory in KiB, usage rounded up):

    pipe_layers_s = n_mb*Ls*tau    = A1[l]*tau_mb[beta]       (Narayanan 2021, Sec. 2.2)
    pipe_head_s = n_mb*head        = A2[l]*edge_head(head_s[beta, hc, tier_pp], t_p2p, pp)/mb (hc: pp = 1;
                                   pp > 1; pp > 1 with the embedding and loss as layer slots, where the head
                                   hides behind the layer it replaces); with pp > 1 the edge stage's extra
                                   work hides one p2p exchange per micro-batch: max(head - t_p2p, 0)
    bubble_s    = (pp-1)/vpp*Ls*tau = Bf[lv]*layer_s[beta] (- Bf[lv]*bubble_fill_s[beta], zero-bubble)
    p2p_steady_s = 2*n_mb*vpp*t_p2p = E[lv]*p2p_s[beta, tier_pp]/mb;  p2p_fill_s = 2(pp-1)*t_p2p; interleaved
                                   (vpp > 1, overlap_p2p_comm) t_p2p -> max(t_p2p - Lc*fw, 0) in both and in
                                   the edge stage's head (`compose.p2p_steady`)
    offload_exposed_s = n_mb*Ls*exposed weight/activation streaming per layer = A1[l]*offx_mb[beta]
    pipeline_s  their sum (`compose.pipeline`)
    link{z}     DP traffic of ZeRO stage z on its link: AR; RS+AG; n_mb*RS+AG (PyTorch FSDP stacks:
                n_mb*(RS+AG)); n_mb*(2AG+RS)
    exp{z}      its exposed part with overlap: max(one bucket, traffic - backward window) (Calculon's window)
    ovl{z}      Q x DP time with overlap = pu*link + (Q-pu)*exp (pu: processor usage of the DP tier, x Q)
    opt{z}      optimizer step, plus PyTorch FSDP's copies around its reductions and gathers, counted as the
                traffic is (the fsdp_copy_* columns through dp_links)
    state_hbm_bytes_z{z}      weights + gradients + optimizer state in HBM
    state_offload_bytes_z{z}  weights, gradients and optimizer state in offload memory (per the variant's
                offload flags)
    act         activations of the worst stage + runtime reserve (first: in-flight layers x stored +
                working + embedding output; last: Ls x stored + working + logits; Korthikanti 2022;
                GPipe: every micro-batch in flight; activation offload: two layers in HBM)
    offact      activations in offload memory (in-flight layers less the two kept in HBM)
The tables (hence the columns) belong to one variant (`formulations.tables.OTHER_KNOBS`).
"""

from __future__ import annotations

import numpy as np

from formulations.tables import DP_COLUMNS, FSDP_COPY_COLUMNS, Tables
from optimizer.model.compose import (
    activations,
    dp_exposed,
    dp_links,
    edge_head,
    fsdp_traffic,
    p2p_steady,
    pipeline,
    v_schedule,
)
from optimizer.model.terms import compose_step
from optimizer.rules.layout import zero_allowed
from optimizer.schema import Schedule
from optimizer.schema.common import SCHEDULE_CODES, V_SCHEDULES
from optimizer.schema.stack import zero2_regathers

Q = 10_000  # fixed-point scale of the processor-usage fractions


def state_min(T: Tables, cols: dict[str, np.ndarray], act_kib: np.ndarray | None = None):
    """Per row, over the legal ZeRO stages whose offload memory fits (and whose HBM fits next to `act_kib`
    when given): the smallest state memory (KiB), its ZeRO index, and for bounds the cheapest step time
    `compose_step` of the pipeline, pu x the DP link time and the optimizer."""
    big = np.iinfo(np.int64).max // 4
    mem, time = [], []
    for z in T.z_vals:
        hbm, off = cols[f"state_hbm_bytes_z{z}"], cols[f"state_offload_bytes_z{z}"]
        ok = zero_allowed(z, cols["dpg1"]) & (off + cols["offact"] <= T.off_cap_kib)
        if act_kib is not None:
            ok = ok & (hbm + act_kib <= T.cap_kib)
        mem.append(np.where(ok, hbm, big))
        step = compose_step(cols["pipeline_s"], (cols["pu"] * cols[f"link{z}"]) // Q, 0, cols[f"opt{z}"], 0)
        time.append(np.where(ok, step, big))
    mem, time = np.stack(mem), np.stack(time)
    return mem.min(axis=0), mem.argmin(axis=0), time.min(axis=0), time.min(axis=0) < big


def block_index(T: Tables, li, mi, ri, si, oi) -> np.ndarray:
    nM, nR, nS, nO = T.nM, len(T.rec_vals), len(T.sp_vals), len(T.ov_vals)
    return (((T.L["tpcp"][li] * nM + mi) * nR + ri) * nS + si) * nO + oi


def _vee(T: Tables, li, vi, mi) -> np.ndarray:
    """Rows (l, vi, mi) of a V-schedule variant (DualPipeV, ZB-V) that run it (`compose.v_schedule`)."""
    is_v = SCHEDULE_CODES[T.fixed["schedule"]].value in V_SCHEDULES
    pp, vv = T.lay["pp"][li], np.array(T.v_vals)[vi]
    return v_schedule(is_v, pp, vv, T.LM["nmb"][li * T.nM + mi])


def _pipeline_columns(T: Tables, li, vi, mi, col) -> dict[str, np.ndarray]:
    """The pipeline's parts (`compose.pipeline`) of rows (l, vi, mi). Interleaved schedules overlap each
    steady-state exchange with a chunk's forward (Execution.pp_overlap, which `solve` keeps on): what exceeds
    Lc layers' forward stays, and the edge stage's head hides that remainder."""
    lv = li * T.nV + vi
    Lt, LV = T.L, T.LV
    mbv, pp, vv = np.array(T.mb_vals)[mi], T.lay["pp"][li], np.array(T.v_vals)[vi]
    zb = T.fixed["schedule"] == SCHEDULE_CODES.index(Schedule.ZERO_BUBBLE)
    t_ss = p2p_steady(col("p2p_s"), LV["Lc"][lv] * col("p2p_window"), (np.array(T.v_vals)[vi] > 1) & (pp > 1))
    return pipeline(
        Lt["A1"][li],
        Lt["A2"][li],
        LV["Bf"][lv],
        LV["E"][lv],
        Lt["pm2"][li],
        col("tau_mb"),
        edge_head(col("head_s"), t_ss, pp) // mbv,
        col("layer_s"),
        t_ss // mbv,
        col("p2p_s"),
        col("offx_mb"),
        # the zero-bubble variant, interleaved: its weight-gradient GEMMs fill the bubble
        # (`step.zero_bubble`); a V-schedule variant where it runs (`compose.v_schedule`): its own fill
        Zf=LV["Bf"][lv] * ((zb & (vv > 1)) | _vee(T, li, vi, mi)),
        fill=col("bubble_fill_s"),
    )


def compose(T: Tables, li, vi, mi, col) -> dict[str, np.ndarray]:
    """Terms of rows (l, vi, mi) with block columns `col(name)` (exact per pair; for bounds, the minimum
    over a triple's block settings, which makes every term a lower bound since all are monotone)."""
    lv, lm = li * T.nV + vi, li * T.nM + mi
    Lt, LV, LM = T.L, T.LV, T.LM
    out = _pipeline_columns(T, li, vi, mi, col)
    acts = activations(
        LV["inflv"][lv],
        LM["infl1"][lm],
        LM["NL"][lm],
        Lt["Ls"][li],
        np.array(T.v_vals)[vi],
        T.lay["pp"][li],
        T.fixed["schedule"] == SCHEDULE_CODES.index(Schedule.GPIPE),
        bool(T.fixed["activation_offload"]),
        col("act_stored_bytes"),
        col("act_working_bytes"),
        col("emb_out_bytes"),
        col("logits_bytes") + (1 - Lt["un"][li]) * col("mtp_act_bytes"),
        vee=_vee(T, li, vi, mi),
        dual=_vee(T, li, vi, mi) & (T.fixed["schedule"] == SCHEDULE_CODES.index(Schedule.DUALPIPE_V)),
    )
    out["act"] = acts["act"] + Lt["reserved_bytes"][li]
    out["offact"] = acts["offact"]
    out["pu"] = np.rint(np.array(T.pu_tiers)[T.lay["tier_dp"][li]] * Q).astype(np.int64)
    regather = zero2_regathers(T.problem.stack)
    AR, RS, AG = (Lt[n][li] for n in DP_COLUMNS)
    links = dp_links(AR, RS, AG, Lt["F"][li], LM["nmb"][lm], regather)
    for z in range(4):
        out[f"link{z}"] = links[z]
    PA, PR, PG = (Lt[n][li] for n in FSDP_COPY_COLUMNS)
    copies = dp_links(PA, PR, PG, fsdp_traffic(PG, PR), LM["nmb"][lm], regather)
    for z in T.z_vals:
        # the optimizer column holds FSDP's copies too (`compose_step`'s fsdp_copies); none without a DP group
        out[f"opt{z}"] = Lt[f"optimizer_s_z{z}"][li] + (1 - Lt["dpg1"][li]) * copies[z]
        for name in ("state_hbm_bytes", "state_offload_bytes"):
            out[f"{name}_z{z}"] = Lt[f"{name}_z{z}"][li]
    out["dpg1"] = Lt["dpg1"][li]
    out["ppgt1"] = Lt["ppgt1"][li]
    out["n_gpus"] = T.gpus(li)
    return out


def exposures(T: Tables, li, vi, mi, col, out: dict[str, np.ndarray]) -> None:
    """Add exp{z} and ovl{z} (exact per pair: the windows depend on the block's backward/forward time)."""
    lv, lm = li * T.nV + vi, li * T.nM + mi
    Lt, LV, LM = T.L, T.LV, T.LM
    bwt, fwt, fbt = col("layer_bw_s"), col("layer_fw_s"), col("fbt")
    t_cb, W = LV["Lc"][lv] * bwt, LV["Wm"][lv] * bwt
    Lfw, NL = Lt["Ls"][li] * fwt, LM["NL"][lm]
    nmb = LM["nmb"][lm]
    AR, RS, AG = (Lt[n][li] for n in DP_COLUMNS)
    exp = dp_exposed(
        AR,
        RS,
        AG,
        Lt["F"][li],
        Lt["ARb"][li],
        Lt["RSb"][li],
        Lt["AGb"][li],
        Lt["Fb"][li],
        LV["ARv"][lv],
        LV["RSv"][lv],
        t_cb,
        W,
        Lfw,
        nmb,
        NL,
        bwt,
        fbt,
        zero2_regathers(T.problem.stack),
    )
    pu = out["pu"]
    for z in T.z_vals:
        out[f"exp{z}"] = exp[z]
        out[f"ovl{z}"] = pu * out[f"link{z}"] + (Q - pu) * exp[z]


def pair_columns(T: Tables, li, vi, mi, ri, si, oi) -> dict[str, np.ndarray]:
    """Every term of the given pairs (arrays of indices)."""
    b = block_index(T, li, mi, ri, si, oi)
    nT = len(T.problem.system.networks)
    at = {
        "head_s": (T.n_head_cols * b + T.L["hc"][li]) * nT + T.lay["tier_pp"][li],
        "p2p_s": nT * b + T.lay["tier_pp"][li],
    }

    def col(name):
        return T.BETA[name][at.get(name, b)]

    out = compose(T, li, vi, mi, col)
    exposures(T, li, vi, mi, col, out)
    return out
