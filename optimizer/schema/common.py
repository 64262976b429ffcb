"""Shared schema pieces: the frozen base model, enums and the parallel-axis glossary."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict


class Frozen(BaseModel):
    """Base of every schema: immutable, unknown keys rejected, numbers finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False)


# Numbers in problem files: strict (``tp: "8"`` and ``true`` are not numbers) and bounded by what is
# physically meaningful, so that nothing downstream overflows or loops over a value.
MAX_COUNT = 2**24  # GPUs, sequences, tokens per sequence, layer widths: 16.7M is beyond any machine or model
MAX_AMOUNT = 1.0e15  # USD, tokens, kW, GiB, GB/s, TFLOP/s, seconds, days: above any real quantity
MAX_CAPACITY_GIB = float(
    2**24
)  # one GPU's memory (HBM, offload tier), GiB: 16 PiB, beyond any device; in KiB
# (the memory constraints' unit) it stays within 2^44, far inside CP-SAT's int64 coefficients
# The memory model's stated error: leave-one-out MAPE of the predicted against the measured peak memory on the
# 20 published runs that report it (`python scripts/calibrate_memory.py ../shared/calibration/public_runs.yaml
# problems/runs/torchtitan-h100-h200.yaml`: 5.05%, max 14.7%; 5.60% before torchtitan's TP was read as keeping
# its all-gathered inputs; 15.68% on the one run before the allocator, per-op checkpointing and FSDP2 memory
# were modelled). The default headroom plans with that margin; reports warn when a plan's margin is below it.
MEMORY_ERROR_PCT = 5.1

# (the caps are validators, not `le`: a field's own tighter `Field(le=...)` must keep applying)


def _count(v: int) -> int:
    if abs(v) > MAX_COUNT:
        raise ValueError(f"must be <= {MAX_COUNT:,} in size (the largest physically meaningful count)")
    return v


def _amount(v: float) -> float:
    if abs(v) > MAX_AMOUNT:
        raise ValueError(f"must be <= {MAX_AMOUNT:g} in size (the largest physically meaningful amount)")
    return v


def _capacity(v: float) -> float:
    if abs(v) > MAX_CAPACITY_GIB:
        raise ValueError(f"must be <= {MAX_CAPACITY_GIB:,.0f} GiB (the largest physically meaningful memory)")
    return v


Int = Annotated[int, Strict(), AfterValidator(_count)]
PositiveInt = Annotated[int, Strict(), Field(gt=0), AfterValidator(_count)]
Float = Annotated[float, Strict(), AfterValidator(_amount)]
PositiveFloat = Annotated[float, Strict(), Field(gt=0), AfterValidator(_amount)]
NonNegativeFloat = Annotated[float, Strict(), Field(ge=0), AfterValidator(_amount)]
CapacityGiB = Annotated[float, Strict(), AfterValidator(_capacity)]  # sign: the field's own ge/gt


class Axis(StrEnum):
    """Parallel axes (glossary).

    - ``tp``: tensor parallelism. Each GEMM of a block is split over ``tp`` GPUs (Megatron column/row
      parallel linears); activations are all-reduced (or reduce-scattered + all-gathered) twice per block
      in forward and twice in backward.
    - ``pp``: pipeline parallelism. The layers are split into ``pp`` stages (``pp*vpp`` chunks with
      interleaving); micro-batches flow through them, point-to-point.
    - ``dp``: data parallelism. Replicas process different sequences; gradients are reduced once per step.
    - ``cp``: context parallelism. The sequence is split over ``cp`` GPUs; K/V are exchanged in a ring
      during attention.
    - ``ep``: expert parallelism (MoE). Experts are split over ``ep`` GPUs drawn from the dp x cp ranks.
    """

    TP = "tp"
    PP = "pp"
    DP = "dp"
    CP = "cp"
    EP = "ep"


class Precision(StrEnum):
    """Datatype of the matrix math. Master weights and optimizer state stay in fp32."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"  # FP8 with delayed (per-tensor, amax-history) scaling: Transformer Engine DelayedScaling
    FP8_CURRENT = (
        "fp8_current"  # FP8, per-tensor current scaling (TE Float8CurrentScaling; torchao tensorwise)
    )
    FP8_BLOCK = "fp8_block"  # FP8, block scaling: 1x128 activation and 128x128 weight blocks, FP32 scales
    # (TE Float8BlockScaling, DeepSeek-V3's recipe; Hopper and later)
    MXFP8 = "mxfp8"  # OCP microscaling FP8 (E4M3 values, one E8M0 scale per 32 elements; Blackwell, MI355X)
    NVFP4 = "nvfp4"  # NVIDIA FP4 (E2M1 values, one E4M3 scale per 16 elements + a per-tensor FP32 scale;
    # Blackwell)
    FP32 = "fp32"


# precisions computed at another's matrix peak: the FP8 scaling recipes use the FP8 tensor cores
PEAK_OF = {Precision.FP8_CURRENT: Precision.FP8, Precision.FP8_BLOCK: Precision.FP8}


def peak_precision(p: Precision) -> Precision:
    """The datatype whose matrix peak `p` runs at (`matrix_tflops` key)."""
    return PEAK_OF.get(Precision(p), Precision(p))


# precisions whose GEMM efficiency is another's unless a system states their own (`matrix_efficiency_scale`):
# the FP8 recipes run FP8's kernels, and MXFP8 (a peak of its own on the datasheets) FP8's at the measured
# block-scaled kernel factor (`model.hardware.BLOCK_SCALED_KERNEL`)
EFFICIENCY_OF = {**PEAK_OF, Precision.MXFP8: Precision.FP8}


class MlpKind(StrEnum):
    """MLP non-linearity. Gated kinds (swiglu, geglu) have three weight matrices."""

    GELU = "gelu"
    RELU = "relu"
    SQUARED_RELU = "squared_relu"
    SWIGLU = "swiglu"
    GEGLU = "geglu"

    @property
    def gated(self) -> bool:
        return self in (MlpKind.SWIGLU, MlpKind.GEGLU)


class Recompute(StrEnum):
    """Activation recomputation (Korthikanti et al. 2022).

    ``none`` stores every activation; ``selective`` recomputes the attention core (QK^T, softmax,
    dropout, .V) in backward; ``full`` stores only each layer's input and recomputes the whole forward.
    """

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class RecomputeModule(StrEnum):
    """What selective recompute re-runs in backward instead of storing (Megatron-Core recompute_modules)."""

    CORE_ATTN = "core_attn"  # the attention core (the default; Korthikanti et al. 2022)
    LAYERNORM = "layernorm"  # the two norms: their outputs (the QKV and MLP GEMM inputs) are not kept
    MOE_ACT = "moe_act"  # the experts' activation function: its output (the expert down-projection input)
    MLA_UP_PROJ = "mla_up_proj"  # MLA's up-projections: the per-head Q, K, V
    MLP = "mlp"  # the dense MLP: its inputs and activation output
    # (JAX rematerialisation, MaxText remat policies: only what the backward needs is run again)
    MLP_UP = "mlp_up"  # the dense MLP's input projection(s) and activation, its down-projection output unused
    ATTN_PROJ = "attn_proj"  # the attention's output projection, rebuilding the residual after the attention


RECOMPUTE_BITS = {
    m: 1 << i for i, m in enumerate(RecomputeModule)
}  # Knobs.recompute_modules bit of each module


class MoeDispatcher(StrEnum):
    """How MoE tokens reach their experts over the expert-parallel group (Megatron-Core
    moe_token_dispatcher_type).

    ``alltoall``: one NCCL all-to-all, every (token, expert) row sent on its own. ``flex``: a hierarchical
    dispatcher (DeepEP, HybridEP) that sends a token once to each remote node holding one of its experts and
    forwards it over NVLink there (DeepSeek-V3 report, section 3.2.2); only matters when ep spans nodes.
    ``allgather``: every rank of the expert tensor x expert parallel group gathers all the group's tokens,
    computes the rows routed to its local experts and reduce-scatters the results back (Megatron-Core
    MoEAllGatherTokenDispatcher; its MoE guide: "TP-only setups, small EP, large Top-K"): (n-1) tokens'
    rows each way whatever top_k, against the all-to-all's top_k (n-1)/n, so it pays where ep < top_k.
    """

    ALLTOALL = "alltoall"
    FLEX = "flex"
    ALLGATHER = "allgather"


MOE_DISPATCHER_CODES = (MoeDispatcher.ALLTOALL, MoeDispatcher.FLEX, MoeDispatcher.ALLGATHER)  # Knobs codes


class RankOrder(StrEnum):
    """How ranks are numbered across the parallel axes, innermost first (Megatron-Core
    `initialize_model_parallel` order; the expert axes follow the same rule). ``tp-cp-dp-pp``: the default,
    data-parallel replicas inside a pipeline stage's ranks. ``tp-cp-pp-dp``: the pipeline inside, data
    parallelism outermost (Megatron --use-tp-pp-dp-mapping, order tp-cp-ep-pp-dp; NVIDIA's MLPerf
    Training v5.1 Llama 3.1 405B runs): a pipeline's stages share a domain and a data-parallel group has
    one member (its cp ranks) per pipeline of tp x cp x pp GPUs."""

    TP_CP_DP_PP = "tp-cp-dp-pp"
    TP_CP_PP_DP = "tp-cp-pp-dp"


class CpComm(StrEnum):
    """How context parallelism exchanges the sequence's keys and values (Megatron-Core --cp-comm-type,
    Transformer Engine's cp_comm_type).

    ``p2p``: a ring of cp - 1 K/V chunk exchanges, each behind an attention step (ring attention).
    ``all_gather``: K and V all-gathered before the attention, not overlapped (Llama 3's context
    parallelism); backward reduce-scatters dK, dV. ``a2a``: all-to-all of Q, K, V to the full sequence with
    the heads split over the cp ranks, and of the output back (DeepSpeed Ulysses); the heads per rank must
    divide by cp. ``a2a_p2p``: all-to-all inside each NVLink domain, a p2p ring between domains (Megatron
    `a2a+p2p`, hierarchical_context_parallel_sizes)."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    A2A = "a2a"
    A2A_P2P = "a2a_p2p"


CP_COMM_CODES = (CpComm.P2P, CpComm.ALL_GATHER, CpComm.A2A, CpComm.A2A_P2P)  # the model's integer codes


class GradAccumulation(StrEnum):
    """How the weight gradients of a step's micro-batches are summed into the main-gradient buffer, the HBM
    traffic per parameter per micro-batch that costs outside the weight-gradient GEMM
    (`optimizer.model.step.grad_accumulation_bytes`).

    ``fused``: the linear layers' weight-gradient GEMMs accumulate into the buffer themselves (Megatron-LM's
    gradient_accumulation_fusion: with FP32 accumulation from 2022-02, with 16-bit from 2022-09;
    Megatron-Core, Transformer Engine): no pass (the embedding's and the norms' small gradients are still
    added, not counted).

    ``add``: the GEMM writes a 16-bit gradient that a kernel of its own adds into the buffer (Megatron-LM
    before the fusion, megatron/model/distributed.py `param.main_grad.add_(param.grad.data)`; autograd's
    accumulation into `.grad`): 2 + 2g bytes a parameter, g the buffer's bytes (6 in fp16, 10 into FP32).

    ``cast_add``: the 16-bit gradient is cast to an FP32 temporary, then added (DeepSpeed's BF16 optimizer,
    bf16_optimizer.py `update_hp_grads`: `hp_grad.add_(lp.grad.to(hp_grad.dtype))`): 18 bytes.
    """

    FUSED = "fused"
    ADD = "add"
    CAST_ADD = "cast_add"


class CudaGraphs(StrEnum):
    """How much of a training iteration the stack replays as CUDA graphs (Megatron-Core cuda_graph_impl and
    cuda_graph_scope). Eager execution launches every kernel from Python on the host; a dropless MoE layer
    also synchronises the host with the GPU once per forward to read the routed token counts (the grouped
    GEMM's and the all-to-all's split sizes), so the host cannot run ahead of that layer and the layer's
    forward takes at least the host time to issue it (Megatron-Core MoE README, "CPU Overhead Bottleneck":
    gaps between kernels; its remedies: CUDA graphs, a larger micro-batch).

    ``none``: eager. ``partial``: Transformer Engine graphs of the attention, the router and the dispatcher's
    preprocessing (cuda_graph_impl transformer_engine, cuda_graph_scope attn moe_router moe_preprocess).
    ``full``: the whole iteration captured (cuda_graph_impl full_iteration, static shapes): no launch cost.
    """

    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"


class TpOverlap(StrEnum):
    """Tensor-parallel communication overlap with the adjacent GEMMs (Wang et al. 2022).

    ``ring`` decomposes the GEMM into tp tiles with a ring of p2p transfers; ``pipe`` pipelines chunks of
    the collective with chunks of the GEMM.
    """

    NONE = "none"
    PIPE = "pipe"
    RING = "ring"


class TpComm(StrEnum):
    """Tensor-parallel collective: one all-reduce, or a reduce-scatter + all-gather pair."""

    ALLREDUCE = "allreduce"
    RS_AG = "rs_ag"


class Schedule(StrEnum):
    """Pipeline schedule: ``1f1b`` (PipeDream-flush, Narayanan 2021; interleaved when vpp > 1), ``gpipe``
    (all forwards, then all backwards: every micro-batch's activations in flight) or ``zb`` (zero-bubble
    1F1B, ZB-H1: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; interleaved when vpp > 1, PyTorch's
    ScheduleInterleavedZeroBubble): the backward is split into its input and weight gradients and the
    weight-gradient GEMMs fill the bubble, (p-1)/v x (T_F + T_B - T_W) instead of (p-1)/v x (T_F + T_B +
    T_W), with 1F1B's activation memory; or ``dualpipev`` (DualPipeV: DeepSeek-AI, DeepSeek-V3 Technical
    Report, arXiv:2412.19437, Sec. 3.2.1 and Table 2, in its V-shaped form of PyTorch's ScheduleDualPipeV):
    two stages per rank (vpp = 2), the first rank holding the first and the last stage, micro-batches fed
    from both ends, each forward chunk run together with another micro-batch's backward chunk; its bubble is
    (d-1) x (T_F&B + T_B - 3 T_W) on d ranks (T_F&B: a forward and a backward chunk run together, taken as
    the layer's critical path: PyTorch runs the pair one after the other unless the model supplies an
    overlapped one), and the first rank keeps 2d+1 chunks of activations (1F1B keeps d stages), with the
    loss's logits and both edge stages' parameters. It needs vpp = 2 and at least 2d micro-batches. Or ``zbv``
    (ZB-V: Qi et al., ICLR 2024, Sec. 6, PyTorch's ScheduleZBVZeroBubble): the same V of two stages per
    rank, the backward split into input and weight gradients, bubble (d-1) x (T_F + T_B - 2 T_W) per chunk
    (T_B the input gradient; zero when the three are equal) with 1F1B's activation memory and the logits on
    the first rank; it fills its pipeline from 2d-1 micro-batches and is priced, like DualPipeV, from 2d with
    vpp = 2."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    ZERO_BUBBLE = "zb"
    DUALPIPE_V = "dualpipev"
    ZERO_BUBBLE_V = "zbv"


V_SCHEDULES = ("dualpipev", "zbv")  # two stages per rank in a V (PyTorch's "v" stage style)
SCHEDULE_CODES = (
    Schedule.ONE_F_ONE_B,
    Schedule.GPIPE,
    Schedule.ZERO_BUBBLE,
    Schedule.DUALPIPE_V,
    Schedule.ZERO_BUBBLE_V,
)  # the model's integer codes


class AttentionKernel(StrEnum):
    """``flash``: fused IO-aware attention (Dao 2022/2023), no s x s scores in memory, causal half
    skipped, at the GPU's best fused-attention kernel (`System.attention_efficiency`: FlashAttention-3 or
    cuDNN on Hopper and Blackwell). ``flash2``: the same algorithm in FlashAttention-2 class kernels, which
    use no Hopper/Blackwell warp-group MMA or tensor-memory copies (`System.attention_efficiency_fa2`;
    PyTorch SDPA's flash backend through 2025). ``flash-triton``: FlashAttention's Triton implementation
    (flash_attn_triton, MosaicML llm-foundry's ``attn_impl: triton``, 2022-2023), which FlashAttention-2's
    CUDA kernels outrun 1.3-2.5x forward+backward (Dao 2023, FlashAttention-2, Sec. 4.1): it runs at the
    FlashAttention-2 class efficiency divided by `TRITON_FA2_SLOWDOWN`. ``standard``: materialised scores,
    softmax and dropout as separate memory-bound kernels (Megatron before 2023)."""

    FLASH = "flash"
    STANDARD = "standard"
    FLASH2 = "flash2"
    FLASH_TRITON = "flash-triton"


class ProcessingMode(StrEnum):
    """How compute time and memory time of one op combine: ``roofline`` max(), ``sum`` adds them."""

    ROOFLINE = "roofline"
    SUM = "sum"
