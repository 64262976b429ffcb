"""Op and collective timing on one system (Calculon, Isaev et al. SC'23, Sec. 3, generalised).

An op does F floating-point operations and moves M bytes through HBM. Its time is
``t = max(F / (peak * eta_c(F)), M / (BW_hbm * eta_m(M)))`` (``roofline``) or the sum of both (``sum``),
where ``eta`` are piecewise-linear efficiency tables in log10 of the op size (GFLOP for compute, MB for
memory), clamped at both ends. Collectives follow the alpha-beta model:
``t = volume / (bandwidth * efficiency) + calls * latency`` with, for a group of n GPUs and a message of
S bytes per GPU, all-reduce volume 2(n-1)/n S, reduce-scatter and all-gather (n-1)/n S, all-to-all
(n-1)/n S, point-to-point S. A call's latency follows the step structure of NCCL's tuning model
(src/graph/tuning.cc, `ncclTopoTuneModel`): a ring of n ranks over m domains takes n-1 steps (2(n-1) for
all-reduce), of which m-1 (2(m-1)) cross the outer tier at its per-step latency and the rest stay inside a
domain at the inner tier's; an all-reduce across domains may run as NCCL's tree instead, 2((n/m - 1) inner
+ floor(log2 m) outer) steps, and the cheaper of the two is taken. `collective_latency` holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.model.fitted import FITTED
from optimizer.schema import Precision, ProcessingMode, System
from optimizer.schema.stack import Stack

# Bytes per GEMM-operand element, block scales included: MXFP8 1 byte + one 1-byte E8M0 scale per 32 elements
# (OCP Microscaling Formats spec v1.0); NVFP4 half a byte + one 1-byte E4M3 scale per 16 elements (NVIDIA
# Blackwell / Transformer Engine NVFP4 recipe; the per-tensor FP32 scale is negligible).
BYTES = {
    Precision.FP8: 1.0,
    Precision.FP8_CURRENT: 1.0,
    Precision.FP8_BLOCK: 1.0 + 4.0 / 128,
    Precision.MXFP8: 1.0 + 1.0 / 32,
    Precision.NVFP4: 0.5 + 1.0 / 16,
    Precision.BF16: 2,
    Precision.FP16: 2,
    Precision.FP32: 4,
}
# FP8 block scaling keeps one FP32 scale per 128 elements (1x128 tiles); current scaling reads each tensor
# once more for its amax before the cast (two passes; delayed scaling uses the amax history: one)
CAST_READS = {Precision.FP8_CURRENT: 2.0}
# Block-scaled formats keep their scales along a GEMM's reduction dimension, which is the rows of an operand
# in one GEMM and its columns in the next (activations: forward and weight gradient; output gradients: data
# and weight gradients), so each cast writes a rowwise and a columnwise quantized copy (Transformer Engine
# MXFP8 and NVFP4 recipes; per-tensor FP8 scales need no second copy on Blackwell, and Hopper's transposed FP8
# copy is written by the same fused cast-transpose kernel counted once here)
CAST_COPIES = {Precision.MXFP8: 2.0, Precision.NVFP4: 2.0}
# Throughput of a block-scaled GEMM kernel against a per-tensor-scaled one at the same datasheet peak: the
# tensor cores read one scale per 32 elements of the reduction dimension, and Transformer Engine swizzles the
# scales into their layout inside each GEMM call (tex.generic_gemm). Measured on a B300 by Transformer
# Engine's GEMM profiling tutorial (problems/measurements/b300-te-gemm-precisions.json): a 5B model's 12 GEMMs
# per layer, inputs pre-quantised, 6.812 ms per-tensor FP8 against 7.161 ms MXFP8 (forward 0.91, data gradient
# 0.97, weight gradient 0.97); `scripts/bench_kernels.py` derives it from that file (`block_scaled_kernel`).
# Applied on top of a system's FP8 efficiency (`System.efficiency_scale`); the factor is NVIDIA's kernels'
# (MI355X's MXFP8 is a prior).
BLOCK_SCALED_KERNEL = {Precision.MXFP8: FITTED.mxfp8_kernel_ratio}
# Precisions whose GEMM operands are quantised from 16-bit activations by cast kernels (Transformer Engine);
# attention, element-wise ops and activations between ops stay 16-bit.
QUANTIZED = frozenset(
    {Precision.FP8, Precision.FP8_CURRENT, Precision.FP8_BLOCK, Precision.MXFP8, Precision.NVFP4}
)


def sustained_clock(system: System) -> float:
    """The compute units' sustained clock against the datasheet's: `System.clock_scale` where the file
    states it (fitted on runs, or measured against the part whose tables it takes), else the power cap's
    prior (tdp_w / rated_power_w) ** `FITTED.clock_power_exponent` (dynamic power grows faster than the
    clock, as voltage rises with it), 1 where no lower cap is stated."""
    if system.clock_scale is not None:
        return system.clock_scale
    if system.rated_power_w and system.tdp_w and system.tdp_w < system.rated_power_w:
        return (system.tdp_w / system.rated_power_w) ** FITTED.clock_power_exponent
    return 1.0


def _table(points) -> tuple[np.ndarray, np.ndarray]:
    xs = np.log10(np.array([p[0] for p in points], dtype=float))
    ys = np.array([p[1] for p in points], dtype=float)
    return xs, ys


def interp_log(x, table: tuple[np.ndarray, np.ndarray]):
    """Efficiency at size x (same unit as the table), linear in log10(x), clamped at the ends."""
    xs, ys = table
    lx = np.log10(np.maximum(np.asarray(x, dtype=float), 1e-30))
    return np.interp(lx, xs, ys)


@dataclass(frozen=True)
class Hardware:
    """A `System` turned into fast numeric lookups for one precision and, where the system states a factor
    for it (`System.stack_matrix_scale`), one software stack."""

    system: System
    precision: Precision
    stack: Stack | None = None

    def __post_init__(self) -> None:
        s = self.system
        if s.peak_tflops(self.precision) is None:
            have = ", ".join(str(p) for p in s.matrix_tflops)
            raise ValueError(f"system {s.name} has no {self.precision} matrix peak (has: {have})")
        xs, ys = _table(s.matrix_efficiency)
        st = s.stack_scale(self.stack)
        scale = s.efficiency_scale(self.precision) * BLOCK_SCALED_KERNEL.get(self.precision, 1.0) * st
        object.__setattr__(self, "_mt", (xs, np.minimum(ys * scale, 1.0)))
        scale16 = s.efficiency_scale(self.precision16) * st
        object.__setattr__(self, "_mt16", (xs, np.minimum(ys * scale16, 1.0)))
        object.__setattr__(self, "_vt", _table(s.vector_efficiency))
        object.__setattr__(self, "_ht", _table(s.hbm_efficiency))

    # ------------------------------------------------------------------ peaks
    @property
    def clock(self) -> float:
        """Sustained clock against the datasheet's (`System.clock_scale` where stated, else
        `sustained_clock(system)`)."""
        return sustained_clock(self.system)

    @property
    def matrix_peak(self) -> float:
        """FLOP/s of the matrix unit in the training precision, at the sustained clock (`clock`)."""
        return self.datasheet_peak * self.clock

    @property
    def datasheet_peak(self) -> float:
        """FLOP/s of the matrix unit in the training precision as the datasheet rates it (what MFU is
        against)."""
        return self.system.peak_tflops(self.precision) * 1e12

    @property
    def precision16(self) -> Precision:
        """The 16-bit datatype of the ops a quantised recipe leaves unquantised (the training precision itself
        when that is not quantised)."""
        return Precision.BF16 if self.precision in QUANTIZED else self.precision

    @property
    def matrix_peak16(self) -> float:
        """FLOP/s of the matrix unit for GEMMs kept in 16 bit (`precision16`)."""
        tf = self.system.matrix_tflops.get(self.precision16) or self.system.peak_tflops(self.precision)
        return tf * 1e12 * self.clock

    @property
    def attention_peak(self) -> float:
        """FLOP/s available to attention (flash attention runs in 16 bit even in FP8 recipes)."""
        return self.matrix_peak16

    @property
    def vector_peak(self) -> float:
        v = self.system.vector_tflops
        tf = v.get(self.precision16) or v.get(Precision.FP32)
        return float(tf) * 1e12 * self.clock

    @property
    def vector_peak_fp32(self) -> float:
        v = self.system.vector_tflops
        return float(v.get(Precision.FP32) or min(v.values())) * 1e12 * self.clock

    @property
    def hbm_bw(self) -> float:
        return self.system.hbm_bandwidth_gbps * 1e9

    # ------------------------------------------------------------------ ops
    def _combine(self, t_c, t_m):
        if self.system.processing_mode == ProcessingMode.SUM:
            return t_c + t_m
        return np.maximum(t_c, t_m)

    def mem_time(self, nbytes):
        """Time to stream `nbytes` through HBM at the table's efficiency for that transfer size."""
        nbytes = np.asarray(nbytes, dtype=float)
        return nbytes / (self.hbm_bw * interp_log(nbytes / 1e6, self._ht))

    def matmul(self, flops, nbytes):
        """A GEMM (or batched GEMM) on the matrix unit."""
        flops = np.asarray(flops, dtype=float)
        t_c = flops / (self.matrix_peak * interp_log(flops / 1e9, self._mt))
        return self._combine(t_c, self.mem_time(nbytes))

    def wave_efficiency(self, m, n, batch=1, tile=None):
        """Fraction of the last wave's SMs that are busy: W output tiles on S SMs run ceil(W/S) waves, so
        the GEMM runs at (W/S)/ceil(W/S) of the SMs' throughput (tile/wave quantization). `tile`: (rows,
        columns) of one thread block, default the system's gemm_tile."""
        sms = self.system.sm_count
        if not sms:
            return 1.0
        tm, tn = tile or self.system.gemm_tile
        tiles = np.ceil(np.asarray(m, dtype=float) / tm) * np.ceil(np.asarray(n, dtype=float) / tn) * batch
        waves = tiles / sms
        return waves / np.ceil(waves)

    def gemm(self, m, n, k, batch=1, in_bytes=2, out_bytes=2, wide=False):
        """GEMM C[m,n] = A[m,k] B[k,n] (times `batch`): 2mnk FLOPs, reads A and B, writes C. Compute time is
        divided by the wave efficiency of its m x n output tiles. `wide`: a GEMM that a quantised (FP8, MXFP8,
        NVFP4) recipe keeps in 16 bit, at the 16-bit peak and efficiency (`precision16`)."""
        flops = 2.0 * m * n * k * batch
        nbytes = batch * ((m * k + k * n) * in_bytes + m * n * out_bytes)
        peak, table = (self.matrix_peak16, self._mt16) if wide else (self.matrix_peak, self._mt)
        t_c = flops / (peak * interp_log(flops / 1e9, table) * self.wave_efficiency(m, n, batch))
        return self._combine(t_c, self.mem_time(nbytes))

    def linear(self, m, n, k, batch=1, in_bytes=2, out_bytes=2, wide=False, split=1):
        """A linear layer on m rows, k inputs and n outputs (`batch` of them: grouped experts): (forward s,
        backward s, forward FLOPs). Forward is one m x n x k GEMM; backward two of the same size, the data
        gradient (m x k) and the weight gradient (k x n, written in fp32). `wide` as for `gemm`. `split`: the
        forward and the data gradient run as that many GEMMs of m/split rows each (a TP collective decomposed
        around them), each at the efficiency of its size; the weight gradient, a reduction over the rows,
        stays whole."""
        fw = split * self.gemm(m / split, n, k, batch, in_bytes=in_bytes, out_bytes=out_bytes, wide=wide)
        dgrad = split * self.gemm(m / split, k, n, batch, in_bytes=in_bytes, out_bytes=out_bytes, wide=wide)
        wgrad = self.gemm(k, n, m, batch, in_bytes=in_bytes, out_bytes=4, wide=wide)
        return fw, dgrad + wgrad, 2.0 * m * n * k * batch

    def attention_kernel(
        self, flops, nbytes, rows=None, keys=None, heads=1, fa2=False, head_dim=128, triton=False
    ):
        """A fused (flash) attention kernel: one thread block per 128-row query tile of each (sequence, head),
        `rows` queries against `keys` keys over `heads` sequence-heads. Its efficiency is attention_efficiency
        (`fa2`: attention_efficiency_fa2, FlashAttention-2 class kernels; `triton`: FlashAttention's Triton
        implementation, the FlashAttention-2 class efficiency / TRITON_FA2_SLOWDOWN) times the kernel's
        relative throughput at `head_dim` (`HEAD_DIM_SCALE`) times the wave quantization of its tiles over the
        SMs (as for GEMMs) times keys / (keys + attention_overhead_keys) (each tile's fixed work against its
        loop over the keys; the Triton kernel: attention_overhead_keys_triton where the system states it).
        Without rows and keys: the flat efficiency."""
        s = self.system
        fa2 = np.asarray(fa2) | np.asarray(triton)
        eff = np.where(fa2, s.attention_efficiency_fa2 or s.attention_efficiency, s.attention_efficiency)
        eff = eff / np.where(triton, TRITON_FA2_SLOWDOWN, 1.0)
        lhd = np.log2(np.maximum(np.asarray(head_dim, dtype=float), 1.0))
        eff = eff * np.where(
            fa2, np.interp(lhd, *HEAD_DIM_SCALE["fa2"]), np.interp(lhd, *HEAD_DIM_SCALE["flash"])
        )
        if rows is not None and keys is not None:
            eff = eff * self.wave_efficiency(rows, ATTENTION_TILE[1], heads, tile=ATTENTION_TILE)
            k = np.asarray(keys, dtype=float)
            k0 = np.where(
                triton, self.attention_overhead_keys(triton=True), self.attention_overhead_keys(fa2)
            )
            eff = eff * k / (k + k0)
        t_c = np.asarray(flops, dtype=float) / (self.attention_peak * eff)
        return self._combine(t_c, self.mem_time(nbytes))

    def attention_overhead_keys(self, fa2=False, triton: bool = False):
        """Fixed work of one flash-attention query tile, in key positions (`System.attention_overhead_keys`,
        `attention_overhead_keys_triton` for the Triton kernel, where stated). Otherwise derived: a tile's
        fixed work is memory traffic (load its queries, write its output and statistics; in the backward
        pass, its dQ), so it takes bytes / (HBM bandwidth per SM), while its loop over the keys runs at the
        SM's share of the attention peak x the kernel family's efficiency (FlashAttention-2 class for `fa2`
        and for the Triton kernel). In keys the overhead is then proportional to the kernel's intensity
        attention peak (16-bit, sustained clock) x efficiency / HBM bandwidth (the SM count cancels):
        `FITTED.attention_tile_overhead_keys` at the reference's
        `FITTED.attention_reference_flop_per_byte`."""
        s = self.system
        if triton and s.attention_overhead_keys_triton is not None:
            return s.attention_overhead_keys_triton
        if s.attention_overhead_keys is not None:
            return s.attention_overhead_keys
        fa2 = np.asarray(fa2) | triton
        eff = np.where(fa2, s.attention_efficiency_fa2 or s.attention_efficiency, s.attention_efficiency)
        intensity = self.attention_peak * eff / self.hbm_bw
        return FITTED.attention_tile_overhead_keys * intensity / FITTED.attention_reference_flop_per_byte

    def sink_backward(self, rows):
        """The extra backward time of learned attention sinks over `rows` query rows (sequences x heads x
        queries of this rank): `SINK_BW_SM_S` SM-seconds per row spread over the GPU's SMs (the reference's
        132 where the system does not state them)."""
        return np.asarray(rows, dtype=float) * SINK_BW_SM_S / (self.system.sm_count or SINK_REFERENCE_SMS)

    def vector(self, flops, nbytes, fp32: bool = False):
        """An element-wise / reduction kernel on the vector unit."""
        flops = np.asarray(flops, dtype=float)
        peak = self.vector_peak_fp32 if fp32 else self.vector_peak
        t_c = flops / (peak * interp_log(flops / 1e9, self._vt))
        return self._combine(t_c, self.mem_time(nbytes))


ATTENTION_TILE = (128, 1)  # flash attention: one thread block per 128 query rows of one (sequence, head)
# Fused attention's throughput by head size relative to head size 128 (log2 of the head size, factor), linear
# in log2 between and clamped outside: per score element the softmax's exponential and rescaling are a fixed
# cost against 4*d matmul FLOPs, so small heads run at a smaller fraction of peak, and each kernel's tiles are
# tuned for some sizes. Measured on an H100 SXM5, forward at 16K tokens (Shah et al. 2024, FlashAttention-3,
# Fig. 5): cuDNN (Transformer Engine's kernels: `flash`) 413 / 595 / 581 TFLOP/s and FlashAttention-2
# (`flash2`) 324 / 370 / 326 at head sizes 64 / 128 / 256.
HEAD_DIM_SCALE = {
    "flash": ([6.0, 7.0, 8.0], [413 / 595, 1.0, 581 / 595]),
    "fa2": ([6.0, 7.0, 8.0], [324 / 370, 1.0, 326 / 370]),
}
# FlashAttention's Triton implementation (flash_attn_triton; `attention: flash-triton`) against
# FlashAttention-2's CUDA kernels: "1.3-2.5x faster than FlashAttention in Triton" forward+backward on an A100
# (Dao 2023, FlashAttention-2, Sec. 4.1, Fig. 4); the geometric middle of that range, not a fitted value.
TRITON_FA2_SLOWDOWN = (1.3 * 2.5) ** 0.5
# Learned attention sinks (GPT-OSS; Transformer Engine's softmax_type "learnable" on cuDNN's fused attention):
# forward time unchanged, backward longer by a cost per query row (sequence x head x query), whatever the
# keys, window and head size. Measured on an H200 SXM (132 SMs, cuDNN 9.19 through the cuDNN frontend's graph
# API: scripts/microbench_cudnn_attention.py, problems/measurements/h200-cudnn-attention-sinks.json):
# 1.18-1.88 ns per row, median 1.57, over 20 causal and 128-token-window kernels of 8-64 heads, head size 64
# and 128, 2K-16K tokens, micro-batch 1-4. Held as SM-seconds per row, so a GPU of more SMs spreads it wider.
SINK_REFERENCE_SMS = 132
SINK_BW_SM_S = 1.57e-9 * SINK_REFERENCE_SMS


# ---------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class Tiers:
    """Network tiers as arrays, indexable by a tier-index array."""

    bandwidth: np.ndarray  # byte/s per GPU per direction, after efficiency
    latency: np.ndarray  # s per step
    processor_usage: np.ndarray
    size: np.ndarray

    @classmethod
    def of(cls, system: System) -> Tiers:
        """The system's tiers; `size` is the GPUs a job uses in one domain (`Network.used`): the ranks that
        share it."""
        n = system.networks
        return cls(
            bandwidth=np.array([x.bandwidth_gbps * 1e9 * x.efficiency for x in n]),
            latency=np.array([x.latency_us * 1e-6 for x in n]),
            processor_usage=np.array([x.processor_usage for x in n]),
            size=np.array([x.used for x in n]),
        )


def members_per_domain(tiers: Tiers, tier, n, stride):
    """Members of a group of n ranks placed `stride` ranks apart that share one domain of the tier below
    `tier` (all n on tier 0), and the index of that inner tier."""
    inner = np.maximum(tier - 1, 0)
    return np.where(
        tier > 0, np.clip(np.floor(tiers.size[inner] / np.asarray(stride, dtype=float)), 1.0, n), n
    ), inner


def collective_latency(kind: str, group, tier, tiers: Tiers, local=None):
    """Latency of one collective call over `group` ranks on network `tier`, s (NCCL's tuning model,
    src/graph/tuning.cc: ring latency = intra-domain steps x the inner tier's per-step latency + inter-domain
    steps x the outer tier's; all-reduce also as a tree, whichever is cheaper). `local`: the group's members
    in one domain of the inner tier (`members_per_domain`); None: each member in its own domain on an outer
    tier, all n in one domain on tier 0.

    kind ``ar``: a ring takes 2(n-1) steps, 2(m-1) of them between the m domains; a tree 2((n/m - 1) inner +
    floor(log2 m) outer) steps. ``rs``, ``ag``, ``a2a``: n-1 steps, m-1 of them between domains. ``p2p``:
    one step on the tier. Not modelled: NCCL's fixed base latency per call, its PAT algorithm (reduce-scatter
    and all-gather with one rank per node, NCCL >= 2.23), and its choice by total time (the cheaper latency
    is taken, at the ring's bandwidth)."""
    n = np.asarray(group, dtype=float)
    tier = np.asarray(tier, dtype=int)
    lat_out = tiers.latency[tier]
    inner = np.maximum(tier - 1, 0)
    lat_in = tiers.latency[inner]
    if local is None:
        local = np.where(tier > 0, 1.0, n)
    local = np.clip(np.asarray(local, dtype=float), 1.0, np.maximum(n, 1.0))
    m = np.where(tier > 0, np.ceil(n / local), 1.0)  # domains the group spans
    if kind == "p2p":
        return np.where(n > 1, lat_out, 0.0)
    per = 2.0 if kind == "ar" else 1.0
    steps, between = per * (n - 1.0), per * (m - 1.0)
    ring = (steps - between) * lat_in + between * lat_out  # on tier 0 the inner tier is the tier itself
    if kind == "ar":
        ppn = np.floor(n / np.maximum(m, 1.0))  # ranks per domain, as NCCL's nRanks / nNodes
        tree = 2.0 * ((ppn - 1.0) * lat_in + np.floor(np.log2(np.maximum(m, 1.0))) * lat_out)
        ring = np.where(m > 1, np.minimum(ring, tree), ring)
    return np.where(n > 1, ring, 0.0)


def collective_time(kind: str, nbytes, group, tier, tiers: Tiers, stride=None, calls=1.0):
    """Time of `calls` collectives moving `nbytes` per GPU in all over `group` GPUs on network `tier`
    (arrays ok), the group's ranks `stride` apart (Megatron rank order: a data-parallel group is tp apart):
    the bandwidth term of the whole buffer plus each call's latency (`collective_latency`).

    kind: ``ar`` all-reduce, ``rs`` reduce-scatter (nbytes = full buffer), ``ag`` all-gather (nbytes =
    gathered buffer), ``a2a`` all-to-all (nbytes sent+kept per GPU), ``p2p`` one send of nbytes.
    A group of 1 costs nothing. `calls` > 1: the buffer goes out in that many collectives (a stage's
    per-layer gradient buckets, FSDP's per-layer gathers), each paying the latency once.

    Ring collectives (ar, rs, ag) over an outer tier: NCCL runs one ring channel per NIC, and each ring
    crosses a node boundary once per node, so the group's members inside one inner domain (``local`` =
    min(n, inner size / stride)), one NIC each, carry the inter-node traffic together: the ring moves at
    min(local x outer bandwidth, inner bandwidth) (nccl-tests: all-reduce bus bandwidth across DGX nodes is
    about the node's aggregate NIC bandwidth when all 8 GPUs are in the communicator, one NIC's when one is).
    That holds for the large, bucketed, overlapped data-parallel reductions, whose callers pass `stride`;
    without it (tensor/context-parallel collectives: small, on the critical path, and with TP overlap a ring
    of single-link p2p hops) each member's own link is the bound, as inside one domain.
    """
    n = np.asarray(group, dtype=float)
    s = np.asarray(nbytes, dtype=float)
    tier = np.asarray(tier, dtype=int)
    bw = tiers.bandwidth[tier]
    frac = (n - 1.0) / np.maximum(n, 1.0)
    local = None
    if kind in ("ar", "rs", "ag") and stride is not None:
        local, inner = members_per_domain(tiers, tier, n, stride)
        bw = np.where((tier > 0) & (local > 1), np.minimum(local * bw, tiers.bandwidth[inner]), bw)
    lat = np.asarray(calls, dtype=float) * collective_latency(kind, n, tier, tiers, local)
    if kind == "ar":
        t = 2.0 * frac * s / bw + lat
    elif kind in ("rs", "ag", "a2a"):
        t = frac * s / bw + lat
    elif kind == "p2p":
        t = s / bw + lat
    else:  # pragma: no cover - programming error
        raise ValueError(kind)
    return np.where(n > 1, t, 0.0)


def tier_of(tiers: Tiers, span, n_job):
    """Innermost tier whose domains hold every group of `span` consecutive ranks of a job of `n_job` GPUs:
    `span` divides the job's GPUs per domain (`Tiers.size`, or the whole job where smaller;
    `optimizer.rules.layout.innermost_tier`, the one placement rule); the outermost when none does."""
    from optimizer.rules.layout import domain_fill, innermost_tier

    span, n_job = np.broadcast_arrays(np.asarray(span, dtype=np.int64), np.asarray(n_job, dtype=np.int64))
    return np.asarray(innermost_tier(tiers.size, span, domain_fill(tiers.size, n_job)))


def a2a_time(nbytes, group, tier, tiers: Tiers, stride=1, copies=1.0):
    """All-to-all of `nbytes` per GPU (each rank sends nbytes/n to every peer) over a group of n ranks
    placed `stride` ranks apart on network `tier`. When the group spans several domains of the inner tier,
    the traffic to peers inside the same inner domain (``min(n, inner_size/stride) - 1`` of them) runs on
    the inner tier while the rest crosses `tier`, in parallel: t = max(inner, outer) + (n-1) * latency.
    Within one domain this is ``collective_time('a2a', ...)``.

    `copies` > 1: MoE token dispatch, `nbytes` holding `copies` rows per token (top-k). A token bound for
    several experts in one remote domain crosses the outer tier once and is forwarded inside it (DeepSeek-V3
    report, section 3.2.2: IB to the same in-node index, then NVLink; DeepEP and Megatron-Core's HybridEP
    dispatchers): with the experts spread evenly over m domains, a token reaches (m-1)(1-(1-1/m)^k) remote
    domains on average instead of k(n-local)/n rows; its forwarded rows load the inner tier."""
    n = np.asarray(group, dtype=float)
    s = np.asarray(nbytes, dtype=float)
    tier = np.asarray(tier, dtype=int)
    stride = np.asarray(stride, dtype=float)
    bw, lat = tiers.bandwidth[tier], tiers.latency[tier]
    local, inner = members_per_domain(tiers, tier, n, stride)
    out_frac = (n - local) / np.maximum(n, 1.0)  # rows bound outside the own domain
    t_in = (local - 1.0) / np.maximum(n, 1.0) * s / tiers.bandwidth[inner]
    copies = np.asarray(copies, dtype=float)
    dedup = copies > 1.0
    m = n / local  # domains the group spans
    remote = (m - 1.0) * (1.0 - (1.0 - 1.0 / np.maximum(m, 1.0)) ** copies)  # remote domains per token
    out_frac = np.where(dedup, np.minimum(out_frac, remote / np.maximum(copies, 1.0)), out_frac)
    t_in = np.where(
        dedup, (n - 1.0) / np.maximum(n, 1.0) * s / tiers.bandwidth[inner], t_in
    )  # + forwarded rows
    t_out = out_frac * s / bw
    t = np.maximum(t_out, t_in) + (n - 1.0) * lat
    return np.where(n > 1, t, 0.0)
