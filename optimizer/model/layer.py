"""One transformer block on one GPU, per micro-batch: time of every op and the bytes it stores.

The block follows Megatron-LM's GPT layer (Shoeybi 2019; Narayanan 2021; Korthikanti 2022):
norm -> QKV GEMM -> attention core -> output GEMM -> [TP collective] -> (bias-)dropout-add ->
norm -> up GEMM -> activation -> down GEMM -> [TP collective] -> (bias-)dropout-add.
With sequence parallelism (SP) the norms and dropouts run on s/tp tokens and the collectives are an
all-gather before each column-parallel GEMM and a reduce-scatter after each row-parallel GEMM.

Shapes (per GPU): tokens T = b*s/cp; q heads a/tp; kv heads g/tp, or 1 replicated head when g < tp
(Megatron replicates K/V heads over TP ranks when tp > g); MLP width f/tp (gated: 2f/tp up).
Every GEMM costs 2mnk FLOPs forward and two GEMMs of the same size backward (activation and weight
gradients). Attention is either ``standard`` (materialised scores: QK^T and PV batched GEMMs, softmax
and dropout memory-bound kernels) or ``flash`` (one fused kernel, causal half skipped, backward 2.5x
forward; Dao 2023). Stored activations follow Korthikanti et al. 2022, Sec. 4 (34 sbh + 5 a s^2 b
bytes per layer for GPT with dropout, 16-bit), generalised to GQA, gated MLPs, flash and no dropout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schema import LLM, MlpKind, Precision
from .hardware import BYTES, Hardware, Tiers, collective_time
from .knobs import Knobs


@dataclass(frozen=True)
class Ctx:
    """Everything scalar the model needs: model shape, hardware, batch."""

    llm: LLM
    hw: Hardware
    tiers: Tiers
    seq_len: int
    global_batch: int
    precision: Precision
    grad_bytes: int
    master_weights: bool

    @property
    def e(self) -> int:
        """Bytes of an activation element (16-bit; FP8 recipes keep 16-bit activations between ops)."""
        return 2 if self.precision != Precision.FP32 else 4

    @property
    def gemm_in(self) -> int:
        """Bytes of a GEMM operand (1 in FP8)."""
        return BYTES[self.precision]

    @property
    def w_bytes(self) -> int:
        """Bytes of a model weight as held for compute (16-bit copy; FP32 training: 4)."""
        return 4 if self.precision == Precision.FP32 else 2


@dataclass(frozen=True)
class BlockCost:
    """Per layer, per micro-batch, on one GPU. Times in seconds, memory in bytes."""

    fw: np.ndarray  # forward compute
    bw: np.ndarray  # backward compute (activation + weight gradients)
    re: np.ndarray  # recompute (forward ops re-run in backward)
    gemm_fw: np.ndarray  # GEMM part of fw (what TP collectives can overlap with)
    gemm_bw: np.ndarray
    attn_fw: np.ndarray  # attention-core compute (what CP ring traffic overlaps with)
    attn_bw: np.ndarray
    tp_fw: np.ndarray  # TP collective link time in forward
    tp_bw: np.ndarray  # ... in backward
    tp_re: np.ndarray  # ... re-issued by recompute
    tp_fw_exp: np.ndarray  # exposed TP time (after overlap), forward
    tp_bw_exp: np.ndarray
    tp_re_exp: np.ndarray
    tp_slow: np.ndarray  # compute slowed by overlapped collectives (processor usage)
    cp_link: np.ndarray  # CP ring traffic link time (fw + bw)
    cp_exp: np.ndarray  # exposed CP time
    act_stored: np.ndarray  # bytes kept from forward to backward
    act_full: np.ndarray  # bytes a layer would keep with no recompute (working set while recomputing)
    ckpt: np.ndarray  # bytes of the layer input kept under full recompute
    hw_flops_fw: np.ndarray  # hardware FLOPs forward (for HFU)
    hw_flops_bw: np.ndarray
    hw_flops_re: np.ndarray

    @property
    def tp_exposed(self):
        return self.tp_fw_exp + self.tp_bw_exp + self.tp_re_exp

    @property
    def total(self):
        """Per layer per micro-batch critical-path time: compute + exposed TP and CP traffic."""
        return self.fw + self.bw + self.re + self.tp_exposed + self.tp_slow + self.cp_exp

    @property
    def fw_total(self):
        return self.fw + self.tp_fw_exp

    @property
    def bw_total(self):
        return self.bw + self.re + self.tp_bw_exp + self.tp_re_exp + self.tp_slow + self.cp_exp


def kv_per_rank(llm: LLM, tp):
    """K/V heads held by one TP rank: g/tp, or 1 (replicated) when tp > g."""
    return np.maximum(llm.kv / tp, 1.0)


def _elementwise(hw: Hardware, n, flops_per, bytes_per, passes):
    """n elements, `passes` memory passes of `bytes_per` each (fused kernels: 1 pass)."""
    return hw.vector(n * flops_per, n * bytes_per * passes)


def block_cost(ctx: Ctx, k: Knobs, dense_ffn: int | None = None) -> BlockCost:
    """Cost of one dense transformer block for every candidate in `k`."""
    llm, hw = ctx.llm, ctx.hw
    h, a, d = llm.hidden, llm.heads, llm.dhead
    f = dense_ffn if dense_ffn is not None else llm.ffn
    tp = k.tp.astype(float)
    cp = k.cp.astype(float)
    b = k.mb.astype(float)
    s = float(ctx.seq_len)
    T = b * s / cp  # tokens of the micro-batch on this rank
    sp = k.sp.astype(bool)
    fused = k.fused.astype(bool)
    flash = k.flash.astype(bool)
    rec = k.recompute
    e, gi = ctx.e, ctx.gemm_in
    kvr = kv_per_rank(llm, tp)
    ah = a / tp  # q heads per rank
    Tn = np.where(sp, T / tp, T)  # tokens seen by norms / dropouts
    gated = llm.mlp.gated
    up_n = f / tp * (2 if gated else 1)
    drop = llm.dropout

    # ---------------------------------------------------------------- GEMMs (fw; bw = 2 GEMMs each)
    def g3(m, n, kk):
        fw = hw.gemm(m, n, kk, in_bytes=gi, out_bytes=e)
        dgrad = hw.gemm(m, kk, n, in_bytes=gi, out_bytes=e)
        wgrad = hw.gemm(kk, n, m, in_bytes=gi, out_bytes=4)
        return fw, dgrad + wgrad, 2.0 * m * n * kk

    qkv_fw, qkv_bw, qkv_fl = g3(T, (ah + 2 * kvr) * d, h)
    prj_fw, prj_bw, prj_fl = g3(T, h, ah * d)
    up_fw, up_bw, up_fl = g3(T, up_n, h)
    dn_fw, dn_bw, dn_fl = g3(T, h, f / tp)
    gemm_fw = qkv_fw + prj_fw + up_fw + dn_fw
    gemm_bw = qkv_bw + prj_bw + up_bw + dn_bw
    gemm_fl = qkv_fl + prj_fl + up_fl + dn_fl

    # ---------------------------------------------------------------- attention core
    sq, sk = s / cp, s
    # standard: two batched GEMMs over the full (masked) s x s scores
    batch = b * ah
    qk_fw = hw.gemm(sq, sk, d, batch=batch, in_bytes=e, out_bytes=e)
    pv_fw = hw.gemm(sq, d, sk, batch=batch, in_bytes=e, out_bytes=e)
    n_sc = batch * sq * sk  # score elements
    sm_passes = np.where(fused, 1.0, 3.0)  # scale, mask, softmax unfused
    softmax_fw = _elementwise(hw, n_sc, 5.0, 2.0 * e, sm_passes)
    softmax_bw = _elementwise(hw, n_sc, 8.0, 3.0 * e, sm_passes)
    adrop_fw = _elementwise(hw, n_sc, 2.0, 2.0 * e + 1.0, 1.0) if drop else 0.0
    adrop_bw = _elementwise(hw, n_sc, 1.0, 2.0 * e + 1.0, 1.0) if drop else 0.0
    std_fw = qk_fw + pv_fw + softmax_fw + adrop_fw
    std_bw = 2.0 * (qk_fw + pv_fw) + softmax_bw + adrop_bw
    std_fl = 4.0 * batch * sq * sk * d
    # flash: one kernel; causal half of the scores computed (load-balanced over cp ranks)
    fl_flops = 4.0 * batch * sq * sk * d * 0.5
    fl_bytes = e * T * d * (2.0 * ah + 2.0 * kvr) + 4.0 * batch * sq
    fla_fw = hw.attention_kernel(fl_flops, fl_bytes)
    fla_bw = hw.attention_kernel(2.5 * fl_flops, 2.5 * fl_bytes)
    attn_fw = np.where(flash, fla_fw, std_fw)
    attn_bw = np.where(flash, fla_bw, std_bw)
    attn_fl_fw = np.where(flash, fl_flops, std_fl)
    attn_fl_bw = np.where(flash, 2.5 * fl_flops, 2.0 * std_fl)

    # ---------------------------------------------------------------- element-wise ops
    # Unfused (eager) kernels make one memory pass each: a norm is ~4 (square-mean, rsqrt, scale,
    # weight), a gated activation 3 (act, cast, multiply), rotary embedding ~6 (split, 2 mul, 2 add, cat).
    n_h = Tn * h
    norm_passes = np.where(fused, 1.0, 4.0)
    norm_fw = _elementwise(hw, n_h, 5.0, 2.0 * e, norm_passes)
    norm_bw = _elementwise(hw, n_h, 8.0, 3.0 * e, norm_passes)
    # bias + dropout + residual add: fused one kernel (read x, residual; write y), else 2-3 kernels
    bda_passes = np.where(fused, 1.0, (1.0 if llm.bias else 0.0) + (1.0 if drop else 0.0) + 1.0)
    bda_fw = _elementwise(hw, n_h, 3.0, 3.0 * e + (1.0 if drop else 0.0), bda_passes)
    bda_bw = _elementwise(hw, n_h, 2.0, 3.0 * e + (1.0 if drop else 0.0), bda_passes)
    n_f = T * f / tp
    act_in = 2.0 if gated else 1.0
    act_flops = {MlpKind.GELU: 8.0, MlpKind.GEGLU: 9.0, MlpKind.SWIGLU: 6.0, MlpKind.RELU: 1.0,
                 MlpKind.SQUARED_RELU: 2.0}[llm.mlp]
    act_passes = np.where(fused, 1.0, (2.0 if llm.bias else 1.0) + (2.0 if gated else 0.0))
    act_fw = _elementwise(hw, n_f, act_flops, (act_in + 1.0) * e, act_passes)
    act_bw = _elementwise(hw, n_f, 1.6 * act_flops, (act_in * 2.0 + 1.0) * e, act_passes)
    rope_fw = _elementwise(hw, T * (ah + kvr) * d, 3.0, 2.0 * e, np.where(fused, 1.0, 6.0))
    ew_fw = 2 * norm_fw + 2 * bda_fw + act_fw + rope_fw
    ew_bw = 2 * norm_bw + 2 * bda_bw + act_bw + rope_fw

    fw = gemm_fw + attn_fw + ew_fw
    bw = gemm_bw + attn_bw + ew_bw
    # recompute: full re-runs the forward; selective re-runs the attention core
    re = np.where(rec == 2, fw, np.where(rec == 1, attn_fw, 0.0))
    hw_fw = gemm_fl + attn_fl_fw
    hw_bw = 2 * gemm_fl + attn_fl_bw
    hw_re = np.where(rec == 2, hw_fw, np.where(rec == 1, attn_fl_fw, 0.0))

    # ---------------------------------------------------------------- TP collectives
    M = T * h * e  # one full activation of the micro-batch
    ar = collective_time("ar", M, tp, k.tier_tp, ctx.tiers)
    ag = collective_time("ag", M, tp, k.tier_tp, ctx.tiers)
    rs = collective_time("rs", M, tp, k.tier_tp, ctx.tiers)
    rs_ag = k.rs_ag.astype(bool)
    one = np.where(rs_ag, ag + rs, ar)  # one column+row pair (attention or MLP)
    tp_fw = 2.0 * one
    redo = sp & k.sp_redo.astype(bool) & (rec != 2)
    tp_bw = 2.0 * one + np.where(redo, 2.0 * ag, 0.0)
    tp_re = np.where(rec == 2, tp_fw, 0.0)
    ov = k.tp_overlap
    pu = ctx.tiers.processor_usage[k.tier_tp]
    # the first ring tile (1/tp of the traffic) cannot overlap; pipe adds half a chunk more (Calculon)
    first = np.where(ov == 2, 1.0 / tp, 1.5 / tp)

    def exposed(c, g):
        return np.where(ov > 0, np.minimum(c, np.maximum(c - g, 0.0) + c * first), c)

    tp_fw_exp = exposed(tp_fw, gemm_fw)
    tp_bw_exp = exposed(tp_bw, gemm_bw)
    tp_re_exp = np.where(rec == 2, exposed(tp_re, gemm_fw), 0.0)
    slow = np.where(ov > 0, pu * (np.minimum(tp_fw, gemm_fw) + np.minimum(tp_bw, gemm_bw)
                                  + np.where(rec == 2, np.minimum(tp_re, gemm_fw), 0.0)), 0.0)
    tp_slow = np.where(tp > 1, slow, 0.0)

    # ---------------------------------------------------------------- CP ring (K/V exchange)
    kv_chunk = 2.0 * b * (s / cp) * kvr * d * e
    step = collective_time("p2p", kv_chunk, cp, k.tier_cp, ctx.tiers)
    cp_fw = (cp - 1.0) * step
    cp_bw = 2.0 * cp_fw  # dK, dV travel back with K, V
    cp_re = np.where(rec >= 1, cp_fw, 0.0)
    cp_link = cp_fw + cp_bw + cp_re
    att_re = np.where(rec >= 1, attn_fw, 0.0)
    cp_exp = np.where(cp > 1, np.maximum(cp_fw - attn_fw * (cp - 1) / cp, 0.0) + step
                      + np.maximum(cp_bw - attn_bw * (cp - 1) / cp, 0.0) + step
                      + np.where(rec >= 1, np.maximum(cp_re - att_re * (cp - 1) / cp, 0.0) + step, 0.0), 0.0)

    # ---------------------------------------------------------------- stored activations (bytes)
    ge = gi if ctx.precision == Precision.FP8 else e  # GEMM inputs kept for wgrad
    split_n = np.where(sp, 1.0 / tp, 1.0)  # norm/dropout region
    gemm_in_rep = np.where(sp & k.sp_redo.astype(bool), 1.0 / tp, 1.0)  # QKV/up input: SP-sharded if re-gathered
    dmask = 1.0 if drop else 0.0
    norms = 2.0 * e * T * h * split_n
    qkv_in = ge * T * h * gemm_in_rep
    q_k_v = e * T * d * (ah + 2.0 * kvr)
    scores = np.where(flash, 4.0 * batch * sq, n_sc * (e + (dmask + e if drop else 0.0)))
    proj_in = ge * T * ah * d
    drop_masks = 2.0 * dmask * T * h * split_n
    up_in = ge * T * h * gemm_in_rep
    act_store = e * T * f / tp * act_in + ge * T * f / tp
    full = norms + qkv_in + q_k_v + scores + proj_in + drop_masks + up_in + act_store
    sel = full - np.where(flash, proj_in, scores)
    ckpt = e * T * h * split_n
    stored = np.where(rec == 2, ckpt, np.where(rec == 1, sel, full))

    return BlockCost(fw=fw, bw=bw, re=re, gemm_fw=gemm_fw, gemm_bw=gemm_bw, attn_fw=attn_fw, attn_bw=attn_bw,
                     tp_fw=np.where(tp > 1, tp_fw, 0.0), tp_bw=np.where(tp > 1, tp_bw, 0.0),
                     tp_re=np.where(tp > 1, tp_re, 0.0),
                     tp_fw_exp=np.where(tp > 1, tp_fw_exp, 0.0), tp_bw_exp=np.where(tp > 1, tp_bw_exp, 0.0),
                     tp_re_exp=np.where(tp > 1, tp_re_exp, 0.0), tp_slow=tp_slow,
                     cp_link=cp_link, cp_exp=cp_exp, act_stored=stored, act_full=full, ckpt=ckpt,
                     hw_flops_fw=hw_fw, hw_flops_bw=hw_bw, hw_flops_re=hw_re)
