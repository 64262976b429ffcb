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

A mixture-of-experts layer (``moe=True``; Megatron-Core MoE, Shazeer 2017, Fedus 2021) replaces the MLP:
router GEMM (T_sp x E x h) and top-k softmax; permutation of the T_sp*k*cf routed rows (T_sp = tokens
of the SP shard, k = top_k, cf = capacity factor: the busiest expert's load over the balanced one);
all-to-all *dispatch* over the EP group (ep ranks, ``tier_ep``), all-gather over the expert-TP group
(etp ranks) so each rank runs its E/ep local experts, sharded etp ways, on R = T_sp*k*cf*etp rows as
grouped GEMMs (one per local expert, m = R*ep/E rows each); reduce-scatter over etp, all-to-all
*combine*, un-permutation and the weighted sum. Shared experts run as a dense TP-sharded MLP of width
shared*expert_ffn. Per GPU, routed-expert FLOPs are 2*T*k*cf*h*f_e*(2|3)/tp whatever ep and etp are;
ep and etp move the cost into communication and GEMM shape. Dispatch and combine are exposed (no
overlap), forward and backward (and again under full recompute).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import NamedTuple

import numpy as np

from ..rules.layout import cp_a2a_degree
from ..schema import LLM, MlpKind, MoE, Precision
from ..schema.common import MOE_DISPATCHER_CODES, RECOMPUTE_BITS, MoeDispatcher, RecomputeModule
from ..schema.stack import Stack, mtp_modules
from .fitted import FITTED
from .hardware import (
    BYTES,
    CAST_COPIES,
    CAST_READS,
    QUANTIZED,
    Hardware,
    Tiers,
    a2a_time,
    collective_time,
    tier_of,
)
from .knobs import Knobs, ep_overlap_runs
from .params import attention_params

# Host time to issue one dropless MoE layer's forward under eager launch (Python dispatch and kernel launches
# of the attention, router, dispatcher, grouped experts and combine, between two of the host's
# synchronisations with the GPU): one value for the Megatron-Core stack, fitted by scripts/calibrate_host.py
# on the published MoE runs (its leave-one-out error is printed there and in the README). The share of it CUDA
# graphs leave to the host, by `Knobs.cuda_graphs` code (none, partial, full): partial graphs replay the
# attention, the router and the dispatcher's preprocessing, taken as half of the layer's host work (those
# modules against the dispatch, experts and combine they leave eager, by a reading of Megatron-Core's MoE
# layer: an estimate, neither counted kernel by kernel nor fitted); full graphs replay everything.
# BW_HOST_RATIO: host time to issue a layer's backward against its forward's: autograd issues a data-gradient
# and a weight-gradient kernel for each forward GEMM, and Transformer Engine's backward passes are Python
# autograd functions as its forward ones are (a structural ratio, not fitted).
MOE_HOST_FW_S = FITTED.moe_host_fw_s
GRAPH_HOST_SHARE = np.array([1.0, 0.5, 0.0])
A2A, FLEX, ALLGATHER = (MOE_DISPATCHER_CODES.index(d) for d in MoeDispatcher)  # `Knobs.moe_dispatcher` codes
BW_HOST_RATIO = 2.0


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
    stack: Stack = Stack.MEGATRON_CORE  # the framework: what `selective` recompute keeps (see `block_cost`)
    dp_last: bool = False  # ranks numbered tp, cp, pp, dp (`Execution.rank_order`): DP groups span domains

    @property
    def mtp(self) -> int:
        """Multi-token prediction modules trained (`stack.mtp_modules`)."""
        return mtp_modules(self.llm.mtp_layers, self.stack)

    @property
    def e(self) -> int:
        """Bytes of an activation element (16-bit; FP8 recipes keep 16-bit activations between ops)."""
        return 2 if self.precision != Precision.FP32 else 4

    @property
    def gemm_in(self) -> float:
        """Bytes of a GEMM operand (1 in FP8; 1 + 1/32 in MXFP8, 0.5 + 1/16 in NVFP4 with block scales)."""
        return BYTES[self.precision]

    @property
    def keeps_master(self) -> bool:
        """Whether the optimizer state holds an fp32 master copy of the weights (mixed precision; not in
        fp32)."""
        return self.master_weights and self.precision != Precision.FP32

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
    ep_link: (
        np.ndarray
    )  # MoE token dispatch/combine (all-to-all over ep) + expert-TP gather/scatter, fw+bw+re
    ep_fw: np.ndarray  # ... its forward part
    ep_exp: np.ndarray  # ... on the critical path (all of it unless ep_overlap hides it behind compute)
    act_stored: np.ndarray  # bytes kept from forward to backward
    act_full: np.ndarray  # bytes a layer would keep with no recompute (working set while recomputing)
    ckpt: np.ndarray  # bytes of the layer input kept under full recompute
    hw_flops_fw: np.ndarray  # hardware FLOPs forward (for HFU)
    hw_flops_bw: np.ndarray
    hw_flops_re: np.ndarray
    # host launch wait of an eager dropless MoE layer (MOE_HOST_FW_S): in its forward, and again when full
    # recompute issues the forward in backward
    host_fw: np.ndarray | float = 0.0
    host_re: np.ndarray | float = 0.0

    @property
    def tp_exposed(self):
        return self.tp_fw_exp + self.tp_bw_exp + self.tp_re_exp

    @property
    def total(self):
        """Per layer per micro-batch critical-path time: compute + exposed TP, CP and EP traffic + host
        wait."""
        return (
            self.fw
            + self.bw
            + self.re
            + self.tp_exposed
            + self.tp_slow
            + self.cp_exp
            + self.ep_exp
            + self.host_fw
            + self.host_re
        )

    def _ep_fw_exp(self):
        """The forward's share of the exposed EP time."""
        return self.ep_exp * np.where(self.ep_link > 0, self.ep_fw / np.maximum(self.ep_link, 1e-30), 0.0)

    @property
    def fw_total(self):
        return self.fw + self.tp_fw_exp + self._ep_fw_exp() + self.host_fw

    @property
    def bw_total(self):
        return (
            self.bw
            + self.re
            + self.tp_bw_exp
            + self.tp_re_exp
            + self.tp_slow
            + self.cp_exp
            + (self.ep_exp - self._ep_fw_exp())
            + self.host_re
        )

    def mix(self, other: BlockCost, w) -> BlockCost:
        """Per-field weighted mean (1-w)*self + w*other: a stage whose layers are a w share of `other`
        (MoE) and the rest `self` (dense). Working sets (`act_full`) take the larger of the two."""
        w = np.asarray(w, dtype=float)
        vals = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            vals[f.name] = np.maximum(a, b) if f.name == "act_full" else (1.0 - w) * a + w * b
        return BlockCost(**vals)


def kv_per_rank(llm: LLM, tp):
    """K/V heads held by one TP rank: g/tp, or 1 (replicated) when tp > g."""
    return np.maximum(llm.kv / tp, 1.0)


def flash_attention(
    hw: Hardware,
    b,
    q_heads,
    kv_heads,
    d,
    sq,
    sk,
    e,
    fa2=False,
    cp=1.0,
    window=None,
    triton=False,
    sinks=False,
):
    """Causal flash attention of `b` sequences, `q_heads` query and `kv_heads` K/V heads of size `d` per GPU,
    `sq` queries against `sk` keys (the causal half of the scores computed; load-balanced over cp ranks):
    (forward s, backward s, forward FLOPs). One kernel each way, the backward 2.5x the forward's work; it
    reads Q, K, V, O and writes the softmax statistics (`Hardware.attention_kernel` times it by size; `fa2`:
    FlashAttention-2 class kernels; `triton`: FlashAttention's Triton implementation).

    Context parallelism (ring attention, load-balanced: each rank holds two of the 2*cp sequence chunks;
    Megatron-Core / Transformer Engine, torch context_parallel) runs cp kernels per direction, one per K/V
    chunk pair received, each looping over the keys of that step only. A causal kernel over k keys does per
    query tile the work of a full one over k/2, so in causal-equivalent keys (the convention of
    `attention_overhead_keys`) the first step's kernel loops over s/cp keys and each later one either all the
    rank's queries against one received chunk of s/(2cp) keys (s/cp) or its second chunk's queries against
    both received chunks (2s/cp): 1.5 s/cp on average. After each step but the first the partial output is
    rescaled and merged in fp32 (read and write O and the log-sum-exp; backward: the same for dQ).

    A sliding `window` of W keys (W < sk): each query attends to its W predecessors, W - W^2/(2 sk) keys on
    average, and a query tile's loop covers that band (2x it in causal-equivalent keys), so short windows run
    at a small fraction of peak (`attention_overhead_keys`) on few FLOPs.

    Learned attention `sinks` (GPT-OSS) leave the forward as it is and add `Hardware.sink_backward` per query
    row of this rank to the backward (measured on cuDNN's fused kernels: the sinks' gradient)."""
    heads = b * q_heads
    sk = np.asarray(sk, dtype=float)
    avg_keys = sk * 0.5  # causal: a query attends to half the keys on average
    if window is not None:
        avg_keys = np.where(window < sk, window - window * window / (2.0 * sk), avg_keys)
    flops = 4.0 * heads * sq * avg_keys * d
    nbytes = e * b * sq * d * (2.0 * q_heads + 2.0 * kv_heads) + 4.0 * heads * sq
    keys = np.where(np.asarray(cp) > 1, np.minimum(1.5 * sk / cp, 2.0 * avg_keys), 2.0 * avg_keys)
    fw = hw.attention_kernel(
        flops, nbytes, rows=sq, keys=keys, heads=heads, fa2=fa2, head_dim=d, triton=triton
    )
    bw = hw.attention_kernel(
        2.5 * flops, 2.5 * nbytes, rows=sq, keys=keys, heads=heads, fa2=fa2, head_dim=d, triton=triton
    )
    n_o = heads * sq * (d + 1.0)  # output (or dQ) and log-sum-exp elements of this rank
    merge = (cp - 1.0) * hw.vector(4.0 * n_o, 2.0 * 4.0 * n_o, fp32=True)
    if sinks:
        bw = bw + hw.sink_backward(heads * sq)
    return fw + merge, bw + merge, flops


def per_op_sac(ctx: Ctx, k: Knobs, T, Tn, ah, kvr, d, f, ew_fw, moe_fw, ckpt):
    """torchtitan's per-op selective activation checkpointing (activation_checkpoint.selective_ac_option
    "op"; torchtitan parallelize_llama `_save_list` and `_custom_policy`): in each block the outputs of the
    matmuls are saved except every second one, counted in forward order (q, k, v, o, then w1, w3, w2 of a
    gated MLP or w1, w2: q, v, w1, w2 saved and k, o, w3 recomputed), and so are the flash-attention output
    with its log-sum-exp and reduce-scatter outputs; every other op is recomputed in backward from those and
    the block's input. An MoE MLP's grouped expert matmuls and all-to-alls are not in the save list: they run
    again (`moe_fw`: their forward time and the dispatch link time). Returns (recompute time s, its hardware
    FLOPs, stored bytes, the recomputed matmuls' time s) per layer per micro-batch."""
    hw, llm, e = ctx.hw, ctx.llm, ctx.e
    h = llm.hidden
    tp = k.tp.astype(float)
    gi = ctx.gemm_in
    sp = k.sequence_parallel.astype(bool)
    gated = llm.mlp.gated
    mlp = (
        ([("w1", f / tp), ("w3", f / tp), ("w2", h)] if gated else [("w1", f / tp), ("w2", h)])
        if f > 0
        else []
    )
    mms = [("q", ah * d), ("k", kvr * d), ("v", kvr * d), ("o", h)] + mlp
    k_in = {"o": ah * d, "w2": f / tp}  # the reduction dimension of each matmul (h for the others)
    re_t = re_fl = 0.0
    stored = ckpt + e * T * ah * d + 4.0 * T * ah  # the block input, the SDPA output and its log-sum-exp
    for i, (name, n) in enumerate(mms, start=1):
        kk = k_in.get(name, h)
        if i % 2:  # odd positions are saved
            stored = stored + e * T * n
        else:
            re_t = re_t + hw.gemm(T, n, kk, in_bytes=gi, out_bytes=e)
            re_fl = re_fl + 2.0 * T * n * kk
    # row-parallel outputs (o, w2) are reduced over TP: the reduce-scatter output (Tn x h) is saved under SP
    stored = stored + np.where(sp & (tp > 1), e * Tn * h * (2.0 if f > 0 else 1.0), 0.0)
    moe_t, moe_link = moe_fw
    return re_t + ew_fw + moe_t + moe_link, re_fl, stored, re_t


def _elementwise(hw: Hardware, n, flops_per, bytes_per, passes):
    """n elements, `passes` memory passes of `bytes_per` each (fused kernels: 1 pass)."""
    return hw.vector(n * flops_per, n * bytes_per * passes)


# Megatron-Core's eager expert-MLP passes (below) against the model's pricing of the bytes they are counted to
# move, measured: (forward, backward) time / the counted passes' time on the system's element-wise tables.
# Eager PyTorch kernels on the GLU's strided halves and autograd's masks, copies and reductions run at about 2
# TB/s forward and 1.3 TB/s backward on a 4.8 TB/s H200 where the tables give the counted bytes 4.3
# (scripts/microbench_expert_eager.py, problems/measurements/h200-expert-eager.json: 65536 rows of GPT-OSS
# widths, 2 and 16 local experts; at 16384 rows over 16 experts the biases' 64 small kernels take longer
# still, host-bound: the eager MoE host floor's part). `python scripts/bench_kernels.py --measurements
# problems/measurements/h200-expert-eager.json --system h200-sxm-141gb` prints these values from the file.
EAGER_EXPERT_MEASURED = {"clamp": FITTED.eager_expert_clamp_ratio, "bias": FITTED.eager_expert_bias_ratio}


def clamp_passes(hw: Hardware, n_up, e):
    """(forward s, backward s) of a clamped GLU's clamps in Megatron-Core's eager expert MLP, over `n_up`
    elements of the experts' up-projection output of `e` bytes: its two halves are clamped and concatenated
    before the fused activation kernel (fused_bias_geglu.weighted_bias_quick_geglu_impl with
    activation_func_clamp_value, core_v0.15-0.18): 2 passes of 2 elements each forward; backward the clamps'
    masked gradients (3 elements) and the halves' concatenation (2); at the measured rate of such kernels
    (`EAGER_EXPERT_MEASURED`)."""
    kf, kb = EAGER_EXPERT_MEASURED["clamp"]
    return kf * _elementwise(hw, n_up, 1.0, 2.0 * e, 2.0), kb * _elementwise(hw, n_up, 1.0, 2.5 * e, 2.0)


def expert_bias_passes(hw: Hardware, n_h, e):
    """(forward s, backward s) of the experts' down-projection biases in Megatron-Core's eager expert MLP,
    over `n_h` elements of its output of `e` bytes: each expert's bias, scaled by its rows' routing
    probabilities, is added after the grouped GEMM and the experts' rows concatenated
    (TEGroupedMLP._apply_bias, core_v0.15-0.18: b * p, t + b * p, torch.cat: 1 + 3 + 2 elements in 3 passes);
    backward the product's two gradients, each a product pass and a reduction (the bias's over the rows, the
    probability's over the hidden size): 6 in 4; at the measured rate of such kernels
    (`EAGER_EXPERT_MEASURED`)."""
    kf, kb = EAGER_EXPERT_MEASURED["bias"]
    return kf * _elementwise(hw, n_h, 2.0, 2.0 * e, 3.0), kb * _elementwise(hw, n_h, 2.0, 1.5 * e, 4.0)


# ------------------------------------------------------------------------------------- one block, by physics
# `block_cost` composes the functions below, one per kind of work. Where several add into one of the block's
# sums they are added in the order the model always has: float addition is not associative, and that order is
# part of the model's numbers.


@dataclass(frozen=True)
class BlockShape:
    """Per-GPU shape of one block for every candidate (arrays over the candidates of `Knobs`; see the module
    docstring): sizes in elements, tokens and heads; `e` and `gi` in bytes per element."""

    moe: MoE | None  # the routed experts (None: a dense layer)
    h: int  # hidden size
    d: float  # per-head size of the attention core (head_dim; MLA: mean of q/k and v sizes)
    f: int  # width of the TP-sharded dense MLP: the layer's MLP, or an MoE layer's shared experts (0: none)
    tp: np.ndarray
    cp: np.ndarray
    b: np.ndarray  # sequences of the micro-batch
    s: float  # sequence length
    sq: np.ndarray  # queries of a sequence on this rank (s/cp)
    T: np.ndarray  # tokens of the micro-batch on this rank (b s/cp)
    Tn: np.ndarray  # tokens seen by norms / dropouts (T/tp under sequence parallelism)
    sp: np.ndarray  # sequence parallelism (bool)
    fused: np.ndarray  # fused kernels (bool)
    flash: np.ndarray  # flash, flash2 or flash-triton: a fused attention kernel (bool)
    rec: np.ndarray  # recompute code: 0 none, 1 selective, 2 full
    titan: bool  # torchtitan's stack
    e: int  # bytes of an activation element
    gi: float  # bytes of a GEMM input as cast, gathered and kept for wgrad (16-bit: e)
    kvr: np.ndarray  # K/V heads held per rank (`kv_per_rank`)
    ah: np.ndarray  # q heads per rank
    kva: np.ndarray  # K/V heads the attention kernel reads and a CP ring carries
    gated: bool  # a gated MLP
    up_n: np.ndarray  # width of the dense up-projection per rank (gated: 2f/tp)
    drop: bool  # dropout
    qkv_p: np.ndarray  # per-rank input-projection weights (MLA included)
    out_p: np.ndarray  # per-rank output-projection weights


def block_shape(ctx: Ctx, k: Knobs, moe: bool) -> BlockShape:
    """The per-GPU shape of the block (dense, or with an MoE MLP when `moe`) for every candidate in `k`:
    tokens T = b*s/cp, q heads a/tp, K/V heads g/tp (at least 1), MLP width f/tp (module docstring)."""
    llm = ctx.llm
    mo = llm.moe if moe else None
    # the TP-sharded dense MLP: the layer's MLP, or the shared experts of an MoE layer (width 0: none)
    f = llm.ffn if mo is None else mo.shared_experts * mo.expert_ffn
    tp = k.tp.astype(float)
    cp = k.cp.astype(float)
    b = k.micro_batch.astype(float)
    s = float(ctx.seq_len)
    T = b * s / cp
    sp = k.sequence_parallel.astype(bool)
    kvr = kv_per_rank(llm, tp)
    ah = llm.heads / tp
    qkv_p, out_p = attention_params(llm, tp)
    # K/V heads the attention kernel reads (and a CP ring carries): the model's, or every query head's when
    # they are repeated before the kernel (`Execution.kv_repeat`)
    kva = np.where(k.kv_repeat.astype(bool), ah, kvr)
    return BlockShape(
        moe=mo,
        h=llm.hidden,
        d=llm.core_dim,
        f=f,
        tp=tp,
        cp=cp,
        b=b,
        s=s,
        sq=s / cp,
        T=T,
        Tn=np.where(sp, T / tp, T),
        sp=sp,
        fused=k.fused_layers.astype(bool),
        flash=k.attention > 0,
        rec=k.recompute,
        titan=ctx.stack == Stack.TORCHTITAN,
        e=ctx.e,
        gi=ctx.gemm_in,
        kvr=kvr,
        ah=ah,
        kva=kva,
        gated=llm.mlp.gated,
        up_n=f / tp * (2 if llm.mlp.gated else 1),
        drop=llm.dropout,
        qkv_p=qkv_p,
        out_p=out_p,
    )


def recomputes(k: Knobs, module: RecomputeModule) -> np.ndarray:
    """Whether selective recompute re-runs `module` (Megatron-Core recompute_modules; none named: the
    attention core), per candidate."""
    rm = np.where(k.recompute_modules == 0, RECOMPUTE_BITS[RecomputeModule.CORE_ATTN], k.recompute_modules)
    return (k.recompute == 1) & ((rm & RECOMPUTE_BITS[module]) > 0)


# ------------------------------------------------------------------------------------------------ GEMMs
class LinearCost(NamedTuple):
    """One linear layer (or a group of them) per micro-batch: forward s, backward s (activation and weight
    gradients: two GEMMs the size of the forward's), forward FLOPs (2mnk)."""

    fw_s: np.ndarray | float
    bw_s: np.ndarray | float
    flops: np.ndarray | float


NO_LINEAR = LinearCost(0.0, 0.0, 0.0)


@dataclass(frozen=True)
class DenseLinears:
    """The block's TP-sharded linear layers: QKV, output projection, MLP up and down (0 without a dense
    MLP)."""

    qkv: LinearCost
    proj: LinearCost
    up: LinearCost
    down: LinearCost

    @property
    def fw_s(self):
        return self.qkv.fw_s + self.proj.fw_s + self.up.fw_s + self.down.fw_s

    @property
    def bw_s(self):
        return self.qkv.bw_s + self.proj.bw_s + self.up.bw_s + self.down.bw_s

    @property
    def flops(self):
        return self.qkv.flops + self.proj.flops + self.up.flops + self.down.flops


def dense_linears(ctx: Ctx, k: Knobs, sh: BlockShape) -> DenseLinears:
    """The dense linear layers' GEMMs (`Hardware.linear`: seconds and FLOPs; fw one GEMM, bw two of its size).

    torchtitan's async TP (PyTorch's micro-pipelined TP: torch._inductor fx_passes/micro_pipeline_tp fuses
    each all-gather -> matmul and matmul -> reduce-scatter of the compiled graph into fused_all_gather_matmul
    / fused_matmul_reduce_scatter) runs every matmul next to a TP collective, forward and data gradient, as tp
    matmuls of T/tp rows, one per chunk the copy engines deliver or send (Wang et al., "Introducing Async
    Tensor Parallelism in PyTorch", 2024): smaller GEMMs at the efficiency of their size (`Hardware.linear`
    split)."""
    split = np.where((k.tp_overlap > 0) & (sh.tp > 1) & sh.titan, sh.tp, 1.0)

    def g3(m, n, kk):
        return LinearCost(*ctx.hw.linear(m, n, kk, in_bytes=sh.gi, out_bytes=sh.e, split=split))

    T, h = sh.T, sh.h
    qkv, proj = g3(T, sh.qkv_p / h, h), g3(T, h, sh.out_p / h)
    if sh.f > 0:
        return DenseLinears(qkv, proj, g3(T, sh.up_n, h), g3(T, h, sh.f / sh.tp))
    return DenseLinears(qkv, proj, NO_LINEAR, NO_LINEAR)


# -------------------------------------------------------------------------------------------- attention core
@dataclass(frozen=True)
class AttentionCore:
    """The attention core (QK^T, softmax, PV) of the micro-batch on this rank, standard or flash per
    candidate: seconds, FLOPs, and the standard path's score matrix (its elements, over `batch`
    sequence-heads)."""

    fw_s: np.ndarray
    bw_s: np.ndarray
    flops_fw: np.ndarray
    flops_bw: np.ndarray
    batch: np.ndarray  # sequence-heads of this rank (b a/tp)
    n_scores: np.ndarray  # score elements of the standard path (batch x sq x s)


def standard_attention(ctx: Ctx, sh: BlockShape) -> tuple:
    """Standard attention with materialised scores (forward s, backward s, forward FLOPs): the QK^T and PV
    batched GEMMs over the full (masked) sq x s scores, softmax (scale, mask, softmax: 3 memory passes
    unfused, 1 fused) and attention dropout as memory-bound kernels; backward two GEMMs per forward GEMM."""
    hw, e, d = ctx.hw, sh.e, sh.d
    sq, sk = sh.sq, sh.s
    batch = sh.b * sh.ah
    qk_fw = hw.gemm(sq, sk, d, batch=batch, in_bytes=e, out_bytes=e)
    pv_fw = hw.gemm(sq, d, sk, batch=batch, in_bytes=e, out_bytes=e)
    n_sc = batch * sq * sk  # score elements
    sm_passes = np.where(sh.fused, 1.0, 3.0)  # scale, mask, softmax unfused
    softmax_fw = _elementwise(hw, n_sc, 5.0, 2.0 * e, sm_passes)
    softmax_bw = _elementwise(hw, n_sc, 8.0, 3.0 * e, sm_passes)
    adrop_fw = _elementwise(hw, n_sc, 2.0, 2.0 * e + 1.0, 1.0) if sh.drop else 0.0
    adrop_bw = _elementwise(hw, n_sc, 1.0, 2.0 * e + 1.0, 1.0) if sh.drop else 0.0
    std_fw = qk_fw + pv_fw + softmax_fw + adrop_fw
    std_bw = 2.0 * (qk_fw + pv_fw) + softmax_bw + adrop_bw
    return std_fw, std_bw, 4.0 * batch * sq * sk * d


class CpView(NamedTuple):
    """What the attention kernel of one CP rank sees under the K/V exchange (`Knobs.cp_comm`), arrays over
    the candidates: a2a of degree `a` trades the sequence split for a head split (a = cp for a2a, the
    NVLink-domain share of cp for a2a_p2p, 1 otherwise); the ring of `ring` ranks runs what is left of cp as
    ring attention (p2p: cp; a2a_p2p: cp / a; all_gather and a2a: 1, the whole keys in one pass)."""

    a: np.ndarray  # all-to-all degree
    ring: np.ndarray  # ring attention ranks
    ah: np.ndarray  # q heads per rank in the kernel
    kva: np.ndarray  # K/V heads per rank in the kernel
    sq: np.ndarray  # queries per sequence in the kernel


def cp_view(ctx: Ctx, k: Knobs, sh: BlockShape) -> CpView:
    code = np.asarray(k.cp_comm)
    cp = sh.cp
    a = np.where(code == 2, cp, np.where(code == 3, cp_a2a_degree(sh.tp, cp, ctx.tiers.size[0]), 1.0))
    ring = np.where((code == 1) | (code == 2), 1.0, cp / a)
    return CpView(a=a, ring=ring, ah=sh.ah / a, kva=sh.kva / a, sq=sh.sq * a)


def fused_attention(ctx: Ctx, k: Knobs, sh: BlockShape) -> tuple:
    """The fused kernel (`flash_attention`: forward s, backward s, forward FLOPs) of the knob's class (2:
    FlashAttention-2, 3: Triton), with learned sinks if the model has them, on what the CP exchange leaves
    the rank (`cp_view`: all_gather and a2a one pass over the whole keys, without the ring's merges). Layers
    with a sliding window weigh in by their share of the layers (`LLM.window_share`): the per-layer mean."""
    llm = ctx.llm
    kern = {
        "fa2": k.attention == 2,
        "triton": k.attention == 3,
        "sinks": llm.attention_sinks,
    }  # the kernel class
    v = cp_view(ctx, k, sh)
    args = (ctx.hw, sh.b, v.ah, v.kva, sh.d, v.sq, sh.s, sh.e)
    fla_fw, fla_bw, fl_flops = flash_attention(*args, cp=v.ring, **kern)
    ws = llm.window_share  # layers with sliding-window attention: their share of every layer's attention
    if ws > 0:
        w_fw, w_bw, w_fl = flash_attention(*args, cp=v.ring, window=float(llm.sliding_window.tokens), **kern)
        fla_fw, fla_bw, fl_flops = (
            (1 - ws) * x + ws * y for x, y in ((fla_fw, w_fw), (fla_bw, w_bw), (fl_flops, w_fl))
        )
    return fla_fw, fla_bw, fl_flops


def attention_core(ctx: Ctx, k: Knobs, sh: BlockShape) -> AttentionCore:
    """The attention core per candidate: the fused kernel where `Knobs.attention` names one, else standard
    attention (seconds; FLOPs forward, backward: 2.5x forward for flash, 2x for standard)."""
    std_fw, std_bw, std_fl = standard_attention(ctx, sh)
    fla_fw, fla_bw, fl_flops = fused_attention(ctx, k, sh)
    flash = sh.flash
    batch = sh.b * sh.ah
    return AttentionCore(
        fw_s=np.where(flash, fla_fw, std_fw),
        bw_s=np.where(flash, fla_bw, std_bw),
        flops_fw=np.where(flash, fl_flops, std_fl),
        flops_bw=np.where(flash, 2.5 * fl_flops, 2.0 * std_fl),
        batch=batch,
        n_scores=batch * sh.sq * sh.s,
    )


# ------------------------------------------------------------------------------------------ element-wise ops
class MlpActivation(NamedTuple):
    """The MLP activation kernel's shape, shared by the dense MLP and the routed experts."""

    inputs: float  # elements read per output element (gated: 2)
    flops: float  # FLOPs per output element
    passes: np.ndarray  # memory passes (fused: 1)


def mlp_activation(llm: LLM, fused: np.ndarray) -> MlpActivation:
    """The activation's inputs, FLOPs and memory passes per output element: unfused, one pass, one more with a
    bias, two more when gated (a gated activation: act, cast, multiply); fused, one."""
    gated = llm.mlp.gated
    act_flops = {
        MlpKind.GELU: 8.0,
        MlpKind.GEGLU: 9.0,
        MlpKind.SWIGLU: 6.0,
        MlpKind.RELU: 1.0,
        MlpKind.SQUARED_RELU: 2.0,
    }[llm.mlp]
    act_passes = np.where(fused, 1.0, (2.0 if llm.bias else 1.0) + (2.0 if gated else 0.0))
    return MlpActivation(2.0 if gated else 1.0, act_flops, act_passes)


def activation_pass_s(hw: Hardware, n, act: MlpActivation, e) -> tuple:
    """(forward s, backward s) of the MLP activation over `n` output elements of `e` bytes (backward: 1.6x the
    FLOPs, reading the inputs and the output gradient, writing the input gradients)."""
    return (
        _elementwise(hw, n, act.flops, (act.inputs + 1.0) * e, act.passes),
        _elementwise(hw, n, 1.6 * act.flops, (act.inputs * 2.0 + 1.0) * e, act.passes),
    )


@dataclass(frozen=True)
class DenseElementwise:
    """The dense block's memory-bound kernels (seconds): norms, bias-dropout-adds, MLP activation, rotary."""

    norm_fw_s: np.ndarray  # one norm, forward
    act_fw_s: np.ndarray  # the dense MLP activation, forward
    fw_s: np.ndarray  # all of them, forward
    bw_s: np.ndarray  # all of them, backward


def dense_elementwise(ctx: Ctx, sh: BlockShape, act: MlpActivation) -> DenseElementwise:
    """Element-wise kernels of the dense block (seconds): two norms and two (bias-)dropout-adds on the Tn
    tokens of the norm region, the MLP activation, rotary embedding on q and k. Unfused (eager) kernels make
    one memory pass each: a norm is ~4 (square-mean, rsqrt, scale, weight), rotary embedding ~6 (split, 2 mul,
    2 add, cat); bias + dropout + residual add is one fused kernel (read x, residual; write y), else 2-3
    kernels."""
    llm, hw, e, fused = ctx.llm, ctx.hw, sh.e, sh.fused
    n_h = sh.Tn * sh.h
    norm_passes = np.where(fused, 1.0, 4.0)
    norm_fw = _elementwise(hw, n_h, 5.0, 2.0 * e, norm_passes)
    norm_bw = _elementwise(hw, n_h, 8.0, 3.0 * e, norm_passes)
    drop = sh.drop
    bda_passes = np.where(fused, 1.0, (1.0 if llm.bias else 0.0) + (1.0 if drop else 0.0) + 1.0)
    bda_fw = _elementwise(hw, n_h, 3.0, 3.0 * e + (1.0 if drop else 0.0), bda_passes)
    bda_bw = _elementwise(hw, n_h, 2.0, 3.0 * e + (1.0 if drop else 0.0), bda_passes)
    act_fw, act_bw = activation_pass_s(hw, sh.T * sh.f / sh.tp, act, e)
    rope_fw = _elementwise(hw, sh.T * (sh.ah + sh.kvr) * sh.d, 3.0, 2.0 * e, np.where(fused, 1.0, 6.0))
    return DenseElementwise(
        norm_fw_s=norm_fw,
        act_fw_s=act_fw,
        fw_s=2 * norm_fw + 2 * bda_fw + act_fw + rope_fw,
        bw_s=2 * norm_bw + 2 * bda_bw + act_bw + rope_fw,
    )


# -------------------------------------------------------------------------------------------- routed experts
@dataclass(frozen=True)
class MoeShape:
    """Where a rank's routed tokens go (module docstring): counts of experts, rows and elements."""

    ep: np.ndarray  # expert-parallel ranks
    etp: np.ndarray  # expert-TP ranks
    E: float  # routed experts
    kk: float  # top_k
    load: np.ndarray  # the busiest EP rank's rows over the mean (`rank_load`; 1: balanced routing)
    cf: float  # capacity factor
    Ts: np.ndarray  # tokens routed by this rank (its SP shard; Megatron-Core requires SP with TP and MoE)
    R: np.ndarray  # expert rows this rank computes after dispatch and the expert-TP gather (Ts k cf etp)
    n_loc: np.ndarray  # local experts (E/ep)
    m_e: np.ndarray  # rows per local expert (grouped GEMM)
    fe_r: np.ndarray  # expert width per expert-TP rank
    up_e: np.ndarray  # expert up-projection width per rank (gated: 2 fe_r)


def rank_load(cv: float, ep, n_loc):
    """The busiest of `ep` expert-parallel ranks' routed rows over the mean, with `n_loc` experts per rank
    whose loads vary with coefficient of variation `cv` independently: a rank's load averages its experts'
    (relative std cv / sqrt(n_loc)), and the largest of ep such loads lies about sqrt(2 ln ep) standard
    deviations above the mean (the expected maximum of ep Gaussians, to leading order). 1 for one rank or
    balanced routing (cv 0)."""
    ep = np.asarray(ep, dtype=float)
    spread = np.sqrt(2.0 * np.log(np.maximum(ep, 1.0)) / np.maximum(np.asarray(n_loc, dtype=float), 1.0))
    return 1.0 + cv * spread


def moe_shape(k: Knobs, sh: BlockShape) -> MoeShape:
    """The routed experts' shape on this rank, for every candidate."""
    mo = sh.moe
    ep = k.ep.astype(float)
    etp = k.etp.astype(float)
    E, kk, cf, fe = float(mo.experts), float(mo.top_k), float(mo.capacity_factor), float(mo.expert_ffn)
    Ts = sh.Tn
    load = rank_load(float(mo.routing_cv), ep, E / ep)
    R = Ts * kk * cf * etp * load
    n_loc = E / ep
    fe_r = fe / etp
    return MoeShape(
        ep=ep,
        etp=etp,
        E=E,
        kk=kk,
        load=load,
        cf=cf,
        Ts=Ts,
        R=R,
        n_loc=n_loc,
        m_e=R / n_loc,
        fe_r=fe_r,
        up_e=fe_r * (2 if sh.gated else 1),
    )


@dataclass(frozen=True)
class MoeLinears:
    """The router GEMM and the routed experts' grouped GEMMs."""

    router: LinearCost
    up: LinearCost
    down: LinearCost

    @property
    def fw_s(self):
        """Router and routed experts, forward (s)."""
        return self.router.fw_s + self.up.fw_s + self.down.fw_s

    def added_to(self, fw_s, bw_s, flops) -> tuple:
        """The block's GEMM sums (forward s, backward s, forward FLOPs) with these added."""
        return (
            fw_s + self.fw_s,
            bw_s + self.router.bw_s + self.up.bw_s + self.down.bw_s,
            flops + self.router.flops + (self.up.flops + self.down.flops),
        )  # experts: 2 R h (up_e + fe_r)


def moe_linears(ctx: Ctx, sh: BlockShape, ms: MoeShape) -> MoeLinears:
    """The router, a GEMM of Ts x E x h outside the FP8 autocast (Megatron-Core's router_gating_linear, 16-bit
    or fp32 logits), and the E/ep local experts as grouped GEMMs of m_e rows each (`Hardware.linear`: s,
    FLOPs)."""
    hw, h, e, gi = ctx.hw, sh.h, sh.e, sh.gi
    return MoeLinears(
        router=LinearCost(*hw.linear(ms.Ts, ms.E, h, in_bytes=e, out_bytes=e, wide=True)),
        up=LinearCost(*hw.linear(ms.m_e, ms.up_e, h, batch=ms.n_loc, in_bytes=gi, out_bytes=e)),
        down=LinearCost(*hw.linear(ms.m_e, h, ms.fe_r, batch=ms.n_loc, in_bytes=gi, out_bytes=e)),
    )


def eager_expert_passes(ctx: Ctx, k: Knobs, sh: BlockShape, ms: MoeShape) -> tuple:
    """Megatron-Core's eager expert MLP (without Transformer Engine's op fuser, whose fused ops do both): the
    clamped GLU's clamps (part of the activation, so `moe_act` recompute repeats them) and the experts'
    probability-scaled down-projection biases, as (clamps, biases), each (forward s, backward s); clamps None
    for a model without `activation_clamp`, biases 0 without `expert_bias`."""
    eager = 1.0 - k.moe_fused_mlp.astype(float)
    clamps, biases = None, (0.0, 0.0)
    if ctx.llm.activation_clamp is not None:
        c_fw, c_bw = clamp_passes(ctx.hw, ms.R * ms.up_e, sh.e)
        clamps = eager * c_fw, eager * c_bw
    if sh.moe.expert_bias:
        biases = tuple(eager * x for x in expert_bias_passes(ctx.hw, ms.R * sh.h, sh.e))
    return clamps, biases


@dataclass(frozen=True)
class MoeElementwise:
    """The MoE layer's memory-bound kernels, each (forward s, backward s)."""

    topk: tuple  # router softmax / top-k
    perm_fw_s: np.ndarray  # permute, un-permute and weighted combine, forward (backward: twice that)
    resort_s: np.ndarray  # rows sorted into expert order and back, each direction
    act: tuple  # the experts' activation (with the eager clamps)
    bias: tuple  # the eager experts' biases

    def added_to(self, fw_s, bw_s) -> tuple:
        """The block's element-wise sums (forward s, backward s) with these added."""
        return (
            fw_s + self.topk[0] + self.perm_fw_s + self.resort_s + self.act[0] + self.bias[0],
            bw_s + self.topk[1] + 2.0 * self.perm_fw_s + self.resort_s + self.act[1] + self.bias[1],
        )


def moe_elementwise(ctx: Ctx, k: Knobs, sh: BlockShape, ms: MoeShape, act: MlpActivation) -> MoeElementwise:
    """Softmax/top-k over Ts x E (fp32); permute and un-permute (gather/scatter of rows); the activation
    function on the R x f_e/etp expert rows; the eager expert passes (`eager_expert_passes`). Where the
    probabilities apply (`Knobs.moe_probs_in_act`): weighting the experts' outputs in the combine is a pass of
    its own over the routed rows; in the activation (Megatron-Core from 0.13) it is part of the fused weighted
    SwiGLU kernel, and unfused a product over the activation's output (its backward: the input's and the
    probabilities' gradients, two passes).

    The plain all-to-all delivers rows grouped by source rank; with several local experts they are sorted into
    expert order after the dispatch (and the expert-TP gather: R rows) and back before the combine
    (Megatron-Core MoEAlltoAllTokenDispatcher sort_chunks_by_idxs, one fused gather pass each way; its
    backward is the reverse gather, one pass each way). The flex dispatchers (DeepEP, HybridEP) hand over rows
    the local permutation already orders."""
    hw, h, e, fused = ctx.hw, sh.h, sh.e, sh.fused
    n_r = ms.Ts * ms.E
    topk_fw = _elementwise(hw, n_r, 6.0, 4.0 + 4.0, np.where(fused, 1.0, 3.0))
    topk_bw = _elementwise(hw, n_r, 6.0, 3.0 * 4.0, np.where(fused, 1.0, 3.0))
    n_rows = ms.Ts * ms.kk * ms.cf * h
    perm_fw = _elementwise(hw, n_rows, 1.0, 2.0 * e, 2.0)  # permute + un-permute (one pass each)
    weighted = _elementwise(hw, n_rows, 2.0, 2.0 * e, 1.0)  # the combine weighted by the probabilities
    perm_fw = perm_fw + (1 - k.moe_probs_in_act) * weighted
    resort = (k.moe_dispatcher == A2A) & (ms.n_loc > 1)
    sort_t = np.where(resort, _elementwise(hw, ms.R * h, 1.0, 2.0 * e, 2.0), 0.0)
    eact_fw, eact_bw = activation_pass_s(hw, ms.R * ms.fe_r, act, e)
    scaled = k.moe_probs_in_act * np.where(fused, 0.0, _elementwise(hw, ms.R * ms.fe_r, 1.0, 2.0 * e, 1.0))
    eact_fw, eact_bw = eact_fw + scaled, eact_bw + 2.0 * scaled
    clamps, biases = eager_expert_passes(ctx, k, sh, ms)
    if clamps is not None:
        eact_fw, eact_bw = eact_fw + clamps[0], eact_bw + clamps[1]
    return MoeElementwise(
        topk=(topk_fw, topk_bw), perm_fw_s=perm_fw, resort_s=sort_t, act=(eact_fw, eact_bw), bias=biases
    )


def moe_dispatch_combine_s(ctx: Ctx, k: Knobs, sh: BlockShape, ms: MoeShape) -> tuple:
    """Link time (s) of the MoE token movement, as (forward s, backward s), each the dispatch and combine
    all-to-alls over ep (rows of h, 16-bit; `a2a_time`, whose `copies` = top_k models the flex dispatchers'
    node deduplication) and the expert-TP all-gather and reduce-scatter over etp. The all-gather
    dispatcher instead gathers the Ts tokens of each of the etp*ep ranks and reduce-scatters the combined
    rows (forward), the reverse in backward: no top_k, no routing skew in the traffic (every token moves),
    and no separate expert-TP collectives (the group is etp x ep)."""
    h, e = sh.h, sh.e
    n = ms.ep * ms.etp
    group_rows = n * ms.Ts * h * e  # the gathered buffer, 16-bit
    gather = collective_time("ag", group_rows, n, k.tier_ep, ctx.tiers) + collective_time(
        "rs", group_rows, n, k.tier_ep, ctx.tiers
    )
    a2a = a2a_time(
        ms.Ts
        * ms.kk
        * ms.cf
        * h
        * e
        * ms.load,  # the busiest rank receives (dispatch) and sends back its load
        ms.ep,
        k.tier_ep,
        ctx.tiers,
        stride=ms.etp,
        copies=np.where(k.moe_dispatcher == FLEX, ms.kk, 1.0),
    )  # flex: node-deduplicated
    t_etp = tier_of(ctx.tiers, ms.etp, k.tp * k.cp * k.dp * k.pp)
    etp_c = collective_time("ag", ms.R * h * e, ms.etp, t_etp, ctx.tiers) + collective_time(
        "rs", ms.R * h * e, ms.etp, t_etp, ctx.tiers
    )
    t = np.where(k.moe_dispatcher == ALLGATHER, gather, 2.0 * a2a + etp_c)
    return t, t


def moe_stored_bytes(k: Knobs, sh: BlockShape, ms: MoeShape, act: MlpActivation) -> tuple:
    """Bytes an MoE layer keeps for backward: router input and probabilities, permuted rows (GEMM input),
    expert up-projection output and activation output, and, where the probabilities weight the experts'
    outputs in the combine (`Knobs.moe_probs_in_act` 0), those outputs (e bytes per routed row and hidden
    unit: the product's saved operand for the probabilities' gradient). Megatron-Core from 0.13 multiplies
    the probabilities into the activation's output instead (experts.py `weighted_bias_swiglu_impl`, its
    backward recomputes the SwiGLU from the stored up-projection output) and un-permutes with a plain sum;
    unfused (`fused_layers` off: experts.py multiplies the activation's output by the probabilities as an op
    of its own) that product keeps the activation's output as well, e bytes per routed row and expert ffn
    unit. Returns (all of them, the expert down-projection's input: what `moe_act` recompute drops)."""
    gi, e, h = sh.gi, sh.e, sh.h
    Ts, R, fe_r = ms.Ts, ms.R, ms.fe_r
    moe_act_in = gi * R * fe_r  # the expert down-projection's input (the activation's output)
    return (
        gi * Ts * h
        + 4.0 * Ts * ms.E
        + gi * R * h
        + e * R * fe_r * act.inputs
        + moe_act_in
        + (1 - k.moe_probs_in_act) * e * Ts * ms.kk * ms.cf * h
        + k.moe_probs_in_act * np.where(sh.fused, 0.0, e * R * fe_r)
    ), moe_act_in


@dataclass(frozen=True)
class MoeCost:
    """The routed experts of an MoE layer; a dense layer's (`MoeCost()`) is 0 throughout."""

    gemm_fw_s: np.ndarray | float = 0.0  # router and routed experts, forward
    act_fw_s: np.ndarray | float = 0.0  # the experts' activation, forward
    ep_fw_s: np.ndarray | float = 0.0  # dispatch/combine + expert-TP link time, forward
    ep_bw_s: np.ndarray | float = 0.0  # ... backward
    stored_bytes: np.ndarray | float = 0.0  # kept for backward
    act_out_bytes: np.ndarray | float = 0.0  # the activation's output (what `moe_act` recompute drops)
    shape: MoeShape | None = None
    linears: MoeLinears | None = None
    elementwise: MoeElementwise | None = None


def moe_cost(ctx: Ctx, k: Knobs, sh: BlockShape, act: MlpActivation) -> MoeCost:
    """The routed experts of the MoE layer `sh` (module docstring): GEMMs, element-wise kernels, token
    movement and stored bytes."""
    ms = moe_shape(k, sh)
    lin = moe_linears(ctx, sh, ms)
    ew = moe_elementwise(ctx, k, sh, ms, act)
    ep_fw, ep_bw = moe_dispatch_combine_s(ctx, k, sh, ms)
    stored, act_out = moe_stored_bytes(k, sh, ms, act)
    return MoeCost(
        gemm_fw_s=lin.fw_s,
        act_fw_s=ew.act[0],
        ep_fw_s=ep_fw,
        ep_bw_s=ep_bw,
        stored_bytes=stored,
        act_out_bytes=act_out,
        shape=ms,
        linears=lin,
        elementwise=ew,
    )


# ------------------------------------------------------------------------------------------- precision casts
def quantisation_casts_s(ctx: Ctx, sh: BlockShape, ms: MoeShape | None) -> tuple:
    """(forward s, backward s) of the casts of a quantised recipe (FP8 with Transformer Engine; MXFP8, NVFP4).

    Every FP8 GEMM operand is cast from 16 bit (read e, write 1 byte, amax): forward, the activations entering
    each GEMM unless the producing kernel writes FP8 itself (fused norm / activation: only the attention
    output is cast); backward, the output gradient of every GEMM. Weights are cast once a step. MXFP8 / NVFP4:
    the same casts, writing gemm_in bytes per element (block scales included)."""
    T, h, f, tp, fused, e = sh.T, sh.h, sh.f, sh.tp, sh.fused, sh.e
    n_in = T * sh.out_p / h + np.where(fused, 0.0, T * h + (T * h if f > 0 else 0.0) + T * f / tp)
    n_go = T * (sh.qkv_p / h + h) + (T * (sh.up_n + h) if f > 0 else 0.0)
    if ms is not None:
        n_in = n_in + ms.R * h + np.where(fused, 0.0, ms.R * ms.fe_r)
        n_go = n_go + ms.R * (ms.up_e + h)
    rd = CAST_READS.get(ctx.precision, 1.0) * e  # current scaling: an amax pass, then the cast
    wr = CAST_COPIES.get(ctx.precision, 1.0) * sh.gi  # block-scaled formats: a rowwise and a columnwise copy
    return _elementwise(ctx.hw, n_in, 2.0, rd + wr, 1.0), _elementwise(ctx.hw, n_go, 2.0, rd + wr, 1.0)


# -------------------------------------------------------------------------------------------- TP collectives
class TpLinks(NamedTuple):
    """TP collective link time (s) of one block, before overlap."""

    fw_s: np.ndarray
    bw_s: np.ndarray
    re_s: np.ndarray  # re-issued by recompute


def tp_collectives_s(ctx: Ctx, k: Knobs, sh: BlockShape) -> TpLinks:
    """The TP collectives of the attention and MLP column+row pairs (an MoE layer without shared experts has
    no TP-sharded MLP: one pair): an all-reduce after each, or with SP an all-gather before and a
    reduce-scatter after (module docstring).

    A sequence-parallel all-gather carries the GEMM input as cast (gi: Transformer Engine's
    gather_along_first_dim with the input / grad-output quantizer, _all_gather_fp8 / _fp8_blockwise / _mxfp8 /
    _nvfp4; torchao Float8ColwiseParallel), the forward only the rowwise copy its GEMM reads
    (layernorm_linear.py sets the quantizer to rowwise before the gather) and backward again for the weight
    gradient (`sp_ag_redo`), so one copy per gather in block-scaled formats too; reduce-scatters carry GEMM
    outputs: 16 bit. The backward's gather of a row-parallel GEMM's output gradient carries both copies in
    block-scaled formats: the data gradient reads it rowwise, the weight gradient columnwise, and a row-scaled
    copy cannot be turned into a column-scaled one (Transformer Engine linear.py backward: a second,
    columnwise all-gather beside the data-gradient GEMM under Userbuffers; `_all_gather_mxfp8` /
    `_all_gather_nvfp4` gather both usages without); per-tensor FP8 gathers one.

    Full recompute re-issues the forward's; torchtitan's per-op policy recomputes k and w3 from the
    all-gathered norm outputs, which it does not save (its save list holds reduce-scatter outputs, not
    all-gathers): the sequence-parallel all-gathers run again."""
    T, h, tp, sp, rec, tiers = sh.T, sh.h, sh.tp, sh.sp, sh.rec, ctx.tiers
    M = T * h * sh.e  # one full activation of the micro-batch
    ar = collective_time("ar", M, tp, k.tier_tp, tiers)
    ag = collective_time("ag", T * h * sh.gi, tp, k.tier_tp, tiers)
    ag_go = collective_time("ag", T * h * sh.gi * CAST_COPIES.get(ctx.precision, 1.0), tp, k.tier_tp, tiers)
    rs = collective_time("rs", M, tp, k.tier_tp, tiers)
    rs_ag = k.tp_comm.astype(bool)
    one = np.where(rs_ag, ag + rs, ar)  # one column+row pair (attention or MLP)
    pairs = 2.0 if sh.f > 0 else 1.0
    tp_fw = pairs * one
    redo = sp & k.sp_ag_redo.astype(bool) & (rec != 2)
    tp_bw = pairs * np.where(rs_ag, ag_go + rs, ar) + np.where(redo, pairs * ag, 0.0)
    sac_ag = sh.titan & (rec == 1) & sp & (tp > 1)
    return TpLinks(tp_fw, tp_bw, np.where(rec == 2, tp_fw, np.where(sac_ag, pairs * ag, 0.0)))


@dataclass(frozen=True)
class TpCost:
    """TP collectives of one block (s), 0 at tp 1: link time, exposed time after overlap, compute slowdown."""

    fw_s: np.ndarray
    bw_s: np.ndarray
    re_s: np.ndarray
    fw_exp_s: np.ndarray
    bw_exp_s: np.ndarray
    re_exp_s: np.ndarray
    slow_s: np.ndarray  # compute slowed by overlapped collectives (processor usage)


def tp_exposure(ctx: Ctx, k: Knobs, sh: BlockShape, links: TpLinks, gemm_fw, gemm_bw, gemm_re) -> TpCost:
    """What of the TP traffic stays on the critical path (s). With overlap (`tp_overlap`: pipe or ring) the
    collectives hide behind the GEMMs of the same pass (`gemm_re`: the matmuls recompute runs again) except
    the first ring tile (1/tp of the traffic), which cannot overlap; pipe adds half a chunk more (Calculon).
    The collectives' share of the SMs (`processor_usage`) slows the GEMMs they hide under."""
    tp = sh.tp
    tp_fw, tp_bw, tp_re = links
    ov = k.tp_overlap
    pu = ctx.tiers.processor_usage[k.tier_tp]
    first = np.where(ov == 2, 1.0 / tp, 1.5 / tp)

    def exposed(c, g):
        return np.where(ov > 0, np.minimum(c, np.maximum(c - g, 0.0) + c * first), c)

    tp_fw_exp = exposed(tp_fw, gemm_fw)
    tp_bw_exp = exposed(tp_bw, gemm_bw)
    tp_re_exp = np.where(tp_re > 0, exposed(tp_re, gemm_re), 0.0)
    slow = np.where(
        ov > 0,
        pu * (np.minimum(tp_fw, gemm_fw) + np.minimum(tp_bw, gemm_bw) + np.minimum(tp_re, gemm_re)),
        0.0,
    )
    on = tp > 1
    return TpCost(
        fw_s=np.where(on, tp_fw, 0.0),
        bw_s=np.where(on, tp_bw, 0.0),
        re_s=np.where(on, tp_re, 0.0),
        fw_exp_s=np.where(on, tp_fw_exp, 0.0),
        bw_exp_s=np.where(on, tp_bw_exp, 0.0),
        re_exp_s=np.where(on, tp_re_exp, 0.0),
        slow_s=np.where(tp > 1, slow, 0.0),
    )


# ------------------------------------------------------------------------------------------------ CP ring
def cp_ring_s(ctx: Ctx, k: Knobs, sh: BlockShape, att: AttentionCore, attn_redone) -> tuple:
    """Context parallelism's K/V exchange (s): (link time fw + bw + recompute, exposed time). Each of the cp -
    1 steps moves one K/V chunk to the next rank (`collective_time` p2p), behind the attention kernels.

    Transformer Engine's p2p ring: one exchange per step, each behind that step's kernel; dK, dV travel back
    with K, V. PyTorch's context parallel (torch.distributed.tensor.experimental._attention, torchtitan's
    default rotate method): K/V are all-gathered once, before the first step, so the gather hides behind that
    step's kernel only (1/cp of the attention); backward gathers them again and rotates dK/dV, accumulated in
    fp32, one send per step behind the next step's kernel, the last one exposed. `attn_redone`: recompute runs
    the core and its ring again."""
    v = cp_view(ctx, k, sh)
    cp, e, attn_fw, attn_bw = v.ring, sh.e, att.fw_s, att.bw_s
    kv_chunk = 2.0 * sh.b * (sh.s / cp) * v.kva * sh.d * e
    step = collective_time("p2p", kv_chunk, cp, k.tier_cp, ctx.tiers)
    cp_fw = (cp - 1.0) * step
    att_re = np.where(attn_redone, attn_fw, 0.0)
    cp_re = np.where(attn_redone, cp_fw, 0.0)
    if sh.titan:
        dstep = step * 4.0 / e
        cp_bw = cp_fw + (cp - 1.0) * dstep
        cp_exp = np.where(
            cp > 1,
            np.maximum(cp_fw - attn_fw / cp, 0.0)
            + np.maximum(cp_fw - attn_bw / cp, 0.0)
            + (cp - 1.0) * np.maximum(dstep - attn_bw / cp, 0.0)
            + dstep
            + np.where(attn_redone, np.maximum(cp_re - att_re / cp, 0.0), 0.0),
            0.0,
        )
    else:
        cp_bw = 2.0 * cp_fw  # dK, dV travel back with K, V
        cp_exp = np.where(
            cp > 1,
            np.maximum(cp_fw - attn_fw * (cp - 1) / cp, 0.0)
            + step
            + np.maximum(cp_bw - attn_bw * (cp - 1) / cp, 0.0)
            + step
            + np.where(attn_redone, np.maximum(cp_re - att_re * (cp - 1) / cp, 0.0) + step, 0.0),
            0.0,
        )
    return cp_fw + cp_bw + cp_re, cp_exp


def cp_exchange_s(ctx: Ctx, k: Knobs, sh: BlockShape, att: AttentionCore, attn_redone) -> tuple:
    """Context parallelism's K/V exchange by `Knobs.cp_comm` (s): (link time fw + bw + recompute, exposed
    time), Transformer Engine's implementations (cp_comm_type):

    - p2p: the ring (`cp_ring_s`), each exchange behind an attention step;
    - all_gather: K and V all-gathered before the attention, not overlapped; backward gathers them again
      and reduce-scatters dK, dV (2 b s g d e bytes gathered per layer);
    - a2a (Ulysses): all-to-alls of Q, K, V before the kernel and of O after it, of dO and of dQ, dK, dV in
      backward, on the critical path (T (2 a_h + 2 g) d e bytes per rank each way);
    - a2a_p2p: those all-to-alls over the a ranks of an NVLink domain, then the ring over cp / a domains.
    Recomputing the attention core runs its forward exchange again."""
    code = np.asarray(k.cp_comm)
    e, T, d = sh.e, sh.T, sh.d
    v = cp_view(ctx, k, sh)
    ring_link, ring_exp = cp_ring_s(ctx, k, sh, att, attn_redone)
    gathered = 2.0 * sh.b * sh.s * sh.kva * d * e
    ag = collective_time("ag", gathered, sh.cp, k.tier_cp, ctx.tiers)
    rs = collective_time("rs", gathered, sh.cp, k.tier_cp, ctx.tiers)
    ag_fw, ag_bw = ag, ag + rs
    a2a_tier = np.where(code == 3, 0, k.tier_cp)
    per_dir = T * (2.0 * sh.ah + 2.0 * sh.kva) * d * e  # Q, K, V in and O out (backward: dO in, dQ dK dV out)
    a2a_fw = a2a_time(per_dir, v.a, a2a_tier, ctx.tiers, stride=sh.tp)
    redo = np.asarray(attn_redone, dtype=bool)
    ag_total = ag_fw + ag_bw + np.where(redo, ag_fw, 0.0)
    a2a_total = 2.0 * a2a_fw + np.where(redo, a2a_fw, 0.0)
    link = np.select(
        [code == 1, code == 2, code == 3], [ag_total, a2a_total, a2a_total + ring_link], ring_link
    )
    exp = np.select([code == 1, code == 2, code == 3], [ag_total, a2a_total, a2a_total + ring_exp], ring_exp)
    return np.where(sh.cp > 1, link, 0.0), np.where(sh.cp > 1, exp, 0.0)


# ---------------------------------------------------------------------------------------- stored activations
def checkpoint_bytes(sh: BlockShape):
    """Bytes of the layer's input (what full recompute keeps): 16-bit, SP-sharded in the norm region."""
    split_n = np.where(sh.sp, 1.0 / sh.tp, 1.0)  # norm/dropout region
    return sh.e * sh.T * sh.h * split_n


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes a block keeps from forward to backward with no recompute (Korthikanti 2022, Sec. 4, generalised),
    by what keeps them; `full` is their sum."""

    norms: np.ndarray  # the two norms' inputs
    qkv_in: np.ndarray  # QKV GEMM input (as cast; SP-sharded if re-gathered in backward)
    q_k_v: np.ndarray  # attention-core inputs
    scores: (
        np.ndarray
    )  # standard: softmax output (with dropout, its mask and output); flash: fp32 log-sum-exp
    proj_in: np.ndarray  # output projection input
    drop_masks: np.ndarray  # the two dropout masks after the attention and the MLP
    up_in: np.ndarray | float  # MLP up-projection input
    act_store: np.ndarray | float  # MLP activation input and output
    full: np.ndarray


def activation_bytes(
    k: Knobs, sh: BlockShape, att: AttentionCore, act: MlpActivation, moe_store
) -> ActivationBytes:
    """Stored activations of the block (bytes), `moe_store` those of its routed experts (Korthikanti et al.
    2022, Sec. 4: 34 sbh + 5 a s^2 b with dropout, 16-bit; generalised to GQA, gated MLPs, flash and no
    dropout)."""
    T, h, e, gi, tp, f = sh.T, sh.h, sh.e, sh.gi, sh.tp, sh.f
    split_n = np.where(sh.sp, 1.0 / tp, 1.0)  # norm/dropout region
    # QKV/up input: SP-sharded if re-gathered
    gemm_in_rep = np.where(sh.sp & k.sp_ag_redo.astype(bool), 1.0 / tp, 1.0)
    drop = sh.drop
    dmask = 1.0 if drop else 0.0
    norms = 2.0 * e * T * h * split_n
    qkv_in = gi * T * h * gemm_in_rep
    q_k_v = e * T * sh.d * (sh.ah + 2.0 * sh.kva)
    scores = np.where(sh.flash, 4.0 * att.batch * sh.sq, att.n_scores * (e + (dmask + e if drop else 0.0)))
    proj_in = gi * T * sh.out_p / h
    drop_masks = 2.0 * dmask * T * h * split_n
    up_in = gi * T * h * gemm_in_rep if f > 0 else 0.0
    act_store = e * T * f / tp * act.inputs + gi * T * f / tp
    full = norms + qkv_in + q_k_v + scores + proj_in + drop_masks + up_in + act_store + moe_store
    return ActivationBytes(
        norms=norms,
        qkv_in=qkv_in,
        q_k_v=q_k_v,
        scores=scores,
        proj_in=proj_in,
        drop_masks=drop_masks,
        up_in=up_in,
        act_store=act_store,
        full=full,
    )


def selective_recompute(
    ctx: Ctx,
    k: Knobs,
    sh: BlockShape,
    lin: DenseLinears,
    att: AttentionCore,
    ew: DenseElementwise,
    mc: MoeCost,
    mem: ActivationBytes,
) -> tuple:
    """Selective recompute of the modules `recompute_modules` names (none named: the attention core), as
    Megatron-Core's recompute_modules or a JAX rematerialisation policy runs it: (forward time run again s,
    its hardware FLOPs, bytes no longer kept). Time and FLOPs add up over the modules chosen; a tensor two
    modules both drop (the MLP input, dropped by the norm's recompute and the MLP's) is counted once, and
    `mlp_up` is part of `mlp`."""
    rc = {m: recomputes(k, m) for m in RecomputeModule}
    rc[RecomputeModule.MLP_UP] = rc[RecomputeModule.MLP_UP] & ~rc[RecomputeModule.MLP]  # part of the MLP's
    mla = ctx.llm.mla is not None
    work = {  # module -> (forward time run again s, its hardware FLOPs)
        RecomputeModule.CORE_ATTN: (att.fw_s, att.flops_fw),
        RecomputeModule.LAYERNORM: (2.0 * ew.norm_fw_s, 0.0),
        RecomputeModule.MOE_ACT: (mc.act_fw_s, 0.0),
        RecomputeModule.MLA_UP_PROJ: (lin.qkv.fw_s, lin.qkv.flops) if mla else (0.0, 0.0),
        RecomputeModule.MLP: (lin.up.fw_s + lin.down.fw_s + ew.act_fw_s, lin.up.flops + lin.down.flops),
        RecomputeModule.MLP_UP: (lin.up.fw_s + ew.act_fw_s, lin.up.flops),
        RecomputeModule.ATTN_PROJ: (lin.proj.fw_s, lin.proj.flops),
    }
    mlp = rc[RecomputeModule.MLP] | rc[RecomputeModule.MLP_UP]
    dropped = (  # (tensor's bytes, whether a chosen module drops it)
        (np.where(sh.flash, mem.proj_in, mem.scores), rc[RecomputeModule.CORE_ATTN]),
        (mem.qkv_in, rc[RecomputeModule.LAYERNORM]),
        (mem.up_in, rc[RecomputeModule.LAYERNORM] | mlp),
        (mem.act_store, mlp),
        (mc.act_out_bytes, rc[RecomputeModule.MOE_ACT]),
        (mem.q_k_v if mla else 0.0, rc[RecomputeModule.MLA_UP_PROJ]),
        (0.5 * mem.norms, rc[RecomputeModule.ATTN_PROJ]),  # the second norm's input
    )
    t = sum(np.where(rc[m], w[0], 0.0) for m, w in work.items())
    fl = sum(np.where(rc[m], w[1], 0.0) for m, w in work.items())
    return t, fl, sum(np.where(on, b, 0.0) for b, on in dropped)


def recompute_and_stored(
    sh: BlockShape, fw, hw_fw, ckpt, selective: tuple | None, sac: tuple | None, full
) -> tuple:
    """(recompute s, its hardware FLOPs, stored bytes) per layer per micro-batch: full recompute re-runs the
    forward and keeps the layer input (`ckpt`); selective recompute runs what `selective` (Megatron-Core's
    modules) or `sac` (torchtitan's per-op policy, `per_op_sac`) says and keeps the rest of `full`; none keeps
    `full`."""
    rec = sh.rec
    if sh.titan:
        sac_t, sac_fl, sac_stored, _ = sac
        on = rec == 1  # without checkpointing nothing runs again and every activation is kept
        sel_t, sel_fl = np.where(on, sac_t, 0.0), np.where(on, sac_fl, 0.0)
        sel_stored = np.where(on, sac_stored, full)
    else:
        sel_t, sel_fl, saved = selective
        sel_stored = full - saved
    return (
        np.where(rec == 2, fw, sel_t),
        np.where(rec == 2, hw_fw, sel_fl),
        np.where(rec == 2, ckpt, sel_stored),
    )


# ------------------------------------------------------------------------------------------------ EP exposure
def ep_overlapped(k: Knobs) -> np.ndarray:
    """Whether the MoE all-to-all overlaps another micro-batch's compute (`knobs.ep_overlap_runs`: where
    Megatron-Core runs it)."""
    return ep_overlap_runs(k.ep_overlap, k.ep, k.moe_dispatcher, k.recompute)


def ep_exposed_s(ctx: Ctx, k: Knobs, sh: BlockShape, mc: MoeCost, fw, bw, re) -> tuple:
    """(link time s, exposed s) of the MoE token movement, forward, backward and again under full recompute.

    MoE all-to-all overlapped with another micro-batch's compute (Megatron-Core
    overlap_moe_expert_parallel_comm: the 1F1B steady state merges one micro-batch's forward with another's
    backward, so the forward's dispatch/combine runs under the other's backward compute and the backward's
    under the other's forward): what exceeds that compute stays exposed, and the communication kernels' share
    of the SMs slows the compute they hide under."""
    ep_fw = mc.ep_fw_s
    ep_link = ep_fw + mc.ep_bw_s + np.where(sh.rec == 2, ep_fw, 0.0)
    if sh.moe is None:
        return ep_link, ep_link
    pu_ep = ctx.tiers.processor_usage[k.tier_ep]
    bw_c = bw + re
    ep_b = ep_link - ep_fw
    hidden = np.minimum(ep_fw, bw_c) + np.minimum(ep_b, fw)
    return ep_link, np.where(ep_overlapped(k), ep_link - hidden + pu_ep * hidden, ep_link)


# ------------------------------------------------------------------------------------------------ host floor
def host_floor_s(k: Knobs, blk: BlockCost) -> tuple:
    """(forward s, recompute s) the GPU waits for the host issuing an eager dropless MoE layer
    (Megatron-Core).

    The layer reads its routed token counts on the host once per forward (Megatron-Core TEGroupedMLP.forward
    `tokens_per_expert.tolist()`, the dispatchers' cuda_sync_point), so the host cannot run ahead of it and
    the forward takes at least the host time to issue it (MOE_HOST_FW_S, less what CUDA graphs replay); the
    backward, which reads no counts, is issued while the GPU runs. Full recompute issues the forward again.

    With the all-to-all overlap (Megatron-Core's combined 1F1B) one micro-batch's forward runs merged with
    another's backward, issued by the same Python thread sub-module by sub-module (attention, dispatch,
    experts, combine of each), and the forward's routing sync drains the stream between them: the merged
    chunk takes at least the host time to issue both, the forward's and the backward's (BW_HOST_RATIO times
    it), against the GPU time of both (the overlap runs without full recompute, `ep_overlapped`). This is the
    CPU overhead for which NVIDIA's Megatron-Bridge recipes turn the overlap off (Megatron-Bridge pull
    request 1760, "Disable moe_a2a_overlap due to CPU overhead", Qwen3-235B on B200)."""
    host = MOE_HOST_FW_S * GRAPH_HOST_SHARE[np.asarray(k.cuda_graphs, dtype=int)]
    full = k.recompute == 2
    alone = np.maximum(host - blk.fw_total, 0.0)  # the GPU's critical path while the host issues
    merged = np.maximum(host * (1.0 + BW_HOST_RATIO) - (blk.fw_total + blk.bw_total), 0.0)
    ov = ep_overlapped(k)
    return np.where(ov, merged, alone), np.where(ov | ~full, 0.0, alone)


# ------------------------------------------------------------------------------------------------ the block
class BlockCompute(NamedTuple):
    """The block's compute per layer per micro-batch: GEMM time forward and backward (s) and FLOPs, the
    element-wise kernels' time forward and backward (s), each summed over the dense part, the routed experts
    and a quantised recipe's casts in that order; and the routed experts' cost (`MoeCost()` for a dense
    block)."""

    gemm_fw: np.ndarray
    gemm_bw: np.ndarray
    gemm_flops: np.ndarray
    ew_fw: np.ndarray
    ew_bw: np.ndarray
    mc: MoeCost


def block_compute(
    ctx: Ctx, k: Knobs, sh: BlockShape, lin: DenseLinears, ew: DenseElementwise, act: MlpActivation
) -> BlockCompute:
    """The block's GEMM and element-wise sums (`BlockCompute`): the dense linears `lin` and element-wise
    kernels `ew`, plus the routed experts (`moe_cost`) of an MoE layer, plus the casts of a quantised recipe
    (`quantisation_casts_s`)."""
    gemm_fw, gemm_bw, gemm_fl = lin.fw_s, lin.bw_s, lin.flops
    ew_fw, ew_bw = ew.fw_s, ew.bw_s
    mc = MoeCost()
    if sh.moe is not None:
        mc = moe_cost(ctx, k, sh, act)
        gemm_fw, gemm_bw, gemm_fl = mc.linears.added_to(gemm_fw, gemm_bw, gemm_fl)
        ew_fw, ew_bw = mc.elementwise.added_to(ew_fw, ew_bw)
    if ctx.precision in QUANTIZED:
        c_fw, c_bw = quantisation_casts_s(ctx, sh, mc.shape)
        ew_fw, ew_bw = ew_fw + c_fw, ew_bw + c_bw
    return BlockCompute(gemm_fw, gemm_bw, gemm_fl, ew_fw, ew_bw, mc)


def block_sac(ctx: Ctx, k: Knobs, sh: BlockShape, bc: BlockCompute, ckpt) -> tuple | None:
    """torchtitan's per-op selective checkpointing of the block (`per_op_sac`: recompute s, its hardware
    FLOPs, stored bytes, the recomputed matmuls' s), its routed experts' forward and dispatch run again; None
    for the other stacks, whose `selective` is Megatron-Core's modules (`selective_recompute`)."""
    if not sh.titan:
        return None
    mc = bc.mc
    return per_op_sac(
        ctx,
        k,
        sh.T,
        sh.Tn,
        sh.ah,
        sh.kvr,
        sh.d,
        sh.f,
        bc.ew_fw,
        moe_fw=(mc.gemm_fw_s + mc.act_fw_s, mc.ep_fw_s),
        ckpt=ckpt,
    )


def block_cost(ctx: Ctx, k: Knobs, moe: bool = False) -> BlockCost:
    """Cost of one transformer block (dense, or with an MoE MLP when `moe`) for every candidate in `k`:
    seconds, bytes and FLOPs per layer per micro-batch on one GPU, composed of the functions above."""
    sh = block_shape(ctx, k, moe)
    rec, tp = sh.rec, sh.tp
    lin = dense_linears(ctx, k, sh)
    att = attention_core(ctx, k, sh)
    act = mlp_activation(ctx.llm, sh.fused)
    ew = dense_elementwise(ctx, sh, act)
    bc = block_compute(ctx, k, sh, lin, ew, act)
    gemm_fw, gemm_bw, gemm_fl, mc = bc.gemm_fw, bc.gemm_bw, bc.gemm_flops, bc.mc
    fw = gemm_fw + att.fw_s + bc.ew_fw
    bw = gemm_bw + att.bw_s + bc.ew_bw
    ckpt = checkpoint_bytes(sh)
    sac = block_sac(ctx, k, sh, bc, ckpt)
    # the attention core (and its CP ring) runs again; torchtitan's per-op policy saves the SDPA output and
    # its log-sum-exp (the ring runs inside that op), and it has no recompute_modules
    attn_redone = (rec == 2) | (recomputes(k, RecomputeModule.CORE_ATTN) & (not sh.titan))
    hw_fw = gemm_fl + att.flops_fw
    hw_bw = 2 * gemm_fl + att.flops_bw
    # re-issued collectives hide behind the matmuls that run again: the whole forward's under full recompute,
    # the recomputed k and w3 under torchtitan's per-op policy
    g_re = np.where(rec == 2, gemm_fw, sac[3] if sh.titan else 0.0)
    tpc = tp_exposure(ctx, k, sh, tp_collectives_s(ctx, k, sh), gemm_fw, gemm_bw, g_re)
    cp_link, cp_exp = cp_exchange_s(ctx, k, sh, att, attn_redone)
    mem = activation_bytes(k, sh, att, act, mc.stored_bytes)
    selective = None if sh.titan else selective_recompute(ctx, k, sh, lin, att, ew, mc, mem)
    re, hw_re, stored = recompute_and_stored(sh, fw, hw_fw, ckpt, selective, sac, mem.full)
    ep_link, ep_exp = ep_exposed_s(ctx, k, sh, mc, fw, bw, re)
    blk = BlockCost(
        fw=fw,
        bw=bw,
        re=re,
        gemm_fw=gemm_fw,
        gemm_bw=gemm_bw,
        attn_fw=att.fw_s,
        attn_bw=att.bw_s,
        tp_fw=tpc.fw_s,
        tp_bw=tpc.bw_s,
        tp_re=tpc.re_s,
        tp_fw_exp=tpc.fw_exp_s,
        tp_bw_exp=tpc.bw_exp_s,
        tp_re_exp=tpc.re_exp_s,
        tp_slow=tpc.slow_s,
        cp_link=cp_link,
        cp_exp=cp_exp,
        ep_link=ep_link + 0.0 * tp,
        ep_fw=mc.ep_fw_s + 0.0 * tp,
        ep_exp=ep_exp + 0.0 * tp,
        act_stored=stored,
        act_full=mem.full,
        ckpt=ckpt,
        hw_flops_fw=hw_fw,
        hw_flops_bw=hw_bw,
        hw_flops_re=hw_re,
    )
    if sh.moe is None or ctx.stack != Stack.MEGATRON_CORE:  # the host floor: eager dropless MoE layers
        return blk
    host_fw, host_re = host_floor_s(k, blk)
    return replace(blk, host_fw=host_fw, host_re=host_re)
