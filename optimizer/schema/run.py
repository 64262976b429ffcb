"""Schema of a published training run (the calibration-run schema of `shared/calibration/README.md`).

Every file in this schema is a YAML list of these records; `paraplan validate` reads any of them. Keys the
schema does not know are errors (a typo must not silently drop a field); nullable keys may be omitted.

Every fact that changes a prediction is a typed field: the model's shape (`RunModel`, with `RunArchitecture`
for
MLA, dense layers of an MoE, sliding windows, attention sinks and a clamped GLU) and the software that ran it
(`RunSoftware`). `notes` is prose for the reader and never changes a prediction. The facts of runs in files
the
project does not own are kept in sidecar files (`RunFacts`, `optimizer.io.runs.load_runs`).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from optimizer.schema.common import (
    Frozen,
    Int,
    MlpKind,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Precision,
    RankOrder,
    Recompute,
)


class Sharding(StrEnum):
    """Optimizer sharding of a run: the distributed optimizer is zero1, FSDP full shard zero3."""

    NONE = "none"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"


class RunMoE(Frozen):
    """Mixture of experts of the run's model."""

    experts: PositiveInt = Field(description="Routed experts per MoE layer.")
    top_k: PositiveInt = Field(description="Experts each token is routed to.")
    expert_ffn: PositiveInt = Field(description="Intermediate size of one routed expert.")
    shared_experts: int | None = Field(None, ge=0, description="Shared experts (null: none stated).")
    moe_layers: PositiveInt | None = Field(None, description="Layers whose MLP is MoE (null: all).")


class RunMLA(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values through low-rank latents."""

    q_lora_rank: int = Field(ge=0, description="Rank of the query latent (0: queries not compressed).")
    kv_lora_rank: PositiveInt = Field(description="Rank of the joint key/value latent.")
    qk_nope_head_dim: PositiveInt = Field(description="Non-rotary part of each query/key head.")
    qk_rope_head_dim: PositiveInt = Field(description="Rotary (decoupled) part of each query/key head.")
    v_head_dim: PositiveInt = Field(description="Size of one value head.")


class RunSlidingWindow(Frozen):
    """Local causal attention in some layers (GPT-OSS: 128 tokens in every other layer)."""

    tokens: PositiveInt = Field(description="Keys each query attends to (the window, the query included).")
    layers: PositiveInt | None = Field(
        None, description="Layers with the window (null: every layer; alternating with full attention: half)."
    )


class RunArchitecture(Frozen):
    """Shape facts of the model beyond `RunModel`'s core fields (null or omitted: not present)."""

    mla: RunMLA | None = Field(None, description="Multi-head latent attention (null: standard attention).")
    dense_ffn: PositiveInt | None = Field(
        None, description="MLP intermediate size of the dense (non-MoE) layers of an MoE model."
    )
    sliding_window: RunSlidingWindow | None = Field(None, description="Sliding-window attention, or null.")
    attention_sinks: bool | None = Field(
        None, description="Learned per-head attention sinks (a logit added to every softmax row; GPT-OSS)."
    )
    activation_clamp: PositiveFloat | None = Field(
        None, description="Limit the GLU's gate and linear halves are clamped at (GPT-OSS: 7.0), or null."
    )
    mtp_layers: Int | None = Field(
        None,
        ge=0,
        le=16,
        description="Multi-token prediction modules trained with the model (Megatron-Core mtp_num_layers; "
        "DeepSeek-V3 recipes: 1), or null: none.",
    )


class RunModel(Frozen):
    """The model trained."""

    hidden: PositiveInt = Field(description="Model width.")
    ffn: PositiveInt | None = Field(
        None, description="MLP intermediate size (gated size for gated MLPs; per expert for MoE)."
    )
    layers: PositiveInt = Field(description="Transformer blocks.")
    heads: PositiveInt | None = Field(None, description="Query heads.")
    kv_heads: PositiveInt | None = Field(None, description="K/V heads (= heads for MHA).")
    head_dim: PositiveInt | None = Field(None, description="Size of one head.")
    seq_len: PositiveInt = Field(description="Training sequence length, tokens.")
    vocab: PositiveInt | None = Field(None, description="Vocabulary size.")
    mlp: MlpKind | None = Field(None, description="gelu | swiglu | geglu | squared_relu | relu.")
    moe: RunMoE | None = Field(None, description="Mixture of experts, or null for a dense model.")
    architecture: RunArchitecture | None = Field(
        None, description="MLA, dense-layer MLP of an MoE, sliding window, sinks, clamp (null: none of them)."
    )


class RunHardware(Frozen):
    """Where it ran."""

    gpu: str = Field(description="GPU name: a system file's `gpu` field maps it onto a system.")
    num_gpus: PositiveInt = Field(description="GPUs used.")
    gpus_per_node: PositiveInt = Field(description="GPUs per node (tray for NVL72 racks).")


class RunParallel(Frozen):
    """How it ran (null: not stated by the source)."""

    tp: PositiveInt = Field(description="Tensor-parallel degree.")
    pp: PositiveInt = Field(description="Pipeline-parallel degree.")
    dp: PositiveInt = Field(description="Data-parallel degree (tp*pp*dp*cp = num_gpus).")
    cp: PositiveInt = Field(description="Context-parallel degree.")
    ep: PositiveInt = Field(description="Expert-parallel degree.")
    vpp: PositiveInt | None = Field(None, description="Interleaved virtual stages per pipeline rank.")
    sequence_parallel: bool | None = Field(None, description="Sequence parallelism.")
    micro_batch: PositiveInt | None = Field(None, description="Sequences per micro-batch.")
    global_batch: PositiveInt = Field(description="Sequences per optimizer step.")
    recompute: Recompute | None = Field(None, description="none | selective | full.")
    optimizer_sharding: Sharding | None = Field(None, description="none | zero1 | zero2 | zero3.")
    precision: Precision | None = Field(None, description="bf16 | fp16 | fp8 | mxfp8 | nvfp4 (null: 16-bit).")


class Framework(StrEnum):
    """The training framework that ran a run (its software stack: `optimizer.io.runs.FRAMEWORK_STACK`)."""

    MEGATRON_LM = "megatron-lm"
    MEGATRON_CORE = "megatron-core"
    NEMO = "nemo"
    MEGATRON_BRIDGE = "megatron-bridge"
    MEGATRON_DEEPSPEED = "megatron-deepspeed"
    DEEPSPEED = "deepspeed"
    TORCHTITAN = "torchtitan"
    FSDP = "fsdp"
    LLM_FOUNDRY = "llm-foundry"
    MAXTEXT = "maxtext"
    # Meta's in-house 4D-parallel PyTorch stack (The Llama 3 Herd of Models, arXiv:2407.21783, Sec. 3.3.2)
    META_4D = "meta-4d"


class RematPolicy(StrEnum):
    """A MaxText remat policy (configs/base.yml `remat_policy`; layers/decoders.py): which named activations
    of a decoder layer JAX keeps for backward, everything else being run again (`optimizer.schema.stack.
    REMAT_POLICY` maps each onto the recompute modules it runs again)."""

    FULL = "full"  # nothing saved but the layer input
    MINIMAL = "minimal"  # every dot without a batch dimension saved: the attention core runs again
    MINIMAL_FLASH = "minimal_flash"  # minimal, and the flash attention's output (context) saved
    SAVE_DOT_WITH_CONTEXT_EXCEPT_MLP = "save_dot_with_context_except_mlp"
    SAVE_DOT_EXCEPT_MLPWI = "save_dot_except_mlpwi"
    SAVE_DOT_EXCEPT_MLP = "save_dot_except_mlp"
    SAVE_QKV_PROJ = "save_qkv_proj"


class RunAttention(StrEnum):
    """The attention kernel a run used.

    ``standard``: materialised scores; ``flash``: FlashAttention at the GPU's best fused kernel; ``flash2``:
    FlashAttention-2 class kernels (PyTorch SDPA's flash backend); ``flash-triton``: FlashAttention's Triton
    kernel (llm-foundry ``attn_impl: triton``); ``cudnn`` and ``fa3``: cuDNN fused attention and
    FlashAttention-3
    (modelled as ``flash``)."""

    STANDARD = "standard"
    FLASH = "flash"
    FLASH2 = "flash2"
    FLASH_TRITON = "flash-triton"
    CUDNN = "cudnn"
    FA3 = "fa3"


class Fp8Recipe(StrEnum):
    """How FP8 scaling factors are obtained (Transformer Engine recipes): ``delayed`` from an amax history,
    ``current`` per tensor from an amax pass before each cast (Float8CurrentScaling)."""

    DELAYED = "delayed"
    CURRENT = "current"


class RunCudaGraphs(StrEnum):
    """How much of an iteration was replayed as CUDA graphs: ``none`` (eager launches), ``partial``
    (Transformer Engine graphs of the attention, router and dispatcher preprocessing), ``full`` (the whole
    iteration; Megatron-Core cuda_graph_impl full_iteration)."""

    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"


class MoeDispatcher(StrEnum):
    """The MoE token dispatcher: ``alltoall`` (one NCCL all-to-all), ``deepep`` / ``hybridep`` (hierarchical:
    a token sent once per remote node; Megatron-Core moe_token_dispatcher_type flex), ``allgather``
    (Megatron-Core's all-gather dispatcher)."""

    ALLGATHER = "allgather"
    ALLTOALL = "alltoall"
    DEEPEP = "deepep"
    HYBRIDEP = "hybridep"


class ReduceDtype(StrEnum):
    """Precision gradients are accumulated and reduced in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class RunSoftware(Frozen):
    """The software that ran the run, as its source states it (null or omitted: not stated; the mapping then
    uses the framework's documented default, `optimizer.io.runs`)."""

    framework: Framework | None = Field(None, description="Training framework (null: megatron-core).")
    release: str | None = Field(None, description="Framework release or commit, as the source names it.")
    year: int | None = Field(
        None,
        ge=2017,
        le=2100,
        description="Year of the software the run used (its publication year): gates the features the era "
        "offered (`optimizer.io.runs.FEATURE_YEAR`); null: current software.",
    )
    attention: RunAttention | None = Field(
        None, description="Attention kernel (null: FlashAttention from 2023, else materialised)."
    )
    eager: bool | None = Field(
        None, description="True: no torch.compile or fused kernels, element-wise ops unfused (null: fused)."
    )
    fused_loss: bool | None = Field(
        None,
        description="False: the loss is cross_entropy on an fp32 upcast of the logits, not compiled (null: "
        "the stack's default).",
    )
    fp8_recipe: Fp8Recipe | None = Field(
        None,
        description="FP8 scaling recipe (null: the framework's default, optimizer.io.runs."
        "FP8_RECIPE_DEFAULT: torchtitan's tensorwise dynamic scaling is current scaling; else delayed).",
    )
    cuda_graphs: RunCudaGraphs | None = Field(None, description="CUDA graphs (null: the stack's default).")
    activation_offload_layers: int | None = Field(
        None,
        ge=1,
        description="Layers whose activations are offloaded to CPU memory (Megatron-Core "
        "cpu_offloading_num_layers; null: none).",
    )
    moe_dispatcher: MoeDispatcher | None = Field(None, description="MoE token dispatcher (null: alltoall).")
    moe_a2a_overlap: bool | None = Field(
        None,
        description="MoE all-to-all overlapped with another micro-batch's compute "
        "(moe_a2a_overlap; null: off).",
    )
    moe_fused_mlp: bool | None = Field(
        None,
        description="Experts' MLP as Transformer Engine fused ops (op fuser, fused grouped MLP; null: off).",
    )
    recompute_modules: list[str] | None = Field(
        None,
        description="Megatron-Core recompute_modules of a selective recompute "
        "(null: the default, core_attn); names the model does not know are reported, not modelled.",
    )
    remat_policy: RematPolicy | None = Field(
        None,
        description="MaxText remat_policy (framework maxtext): it states the recompute, full for `full` and "
        "otherwise selective of what the policy does not save; null: the run's recompute as stated.",
    )
    tp_comm_overlap: bool | None = Field(
        None,
        description="TP communication overlapped with the GEMMs (tp_comm_overlap, async TP; null: chosen by "
        "the model where the era offered it).",
    )
    dp_comm_overlap: bool | None = Field(
        None,
        description="Gradient reduction overlapped with backward (null: chosen by the model where the era "
        "offered it).",
    )
    grad_reduce_dtype: ReduceDtype | None = Field(
        None,
        description="Precision gradients are reduced in (null: fp16 for fp16 training, else fp32).",
    )
    pp_embedding_slots: bool | None = Field(
        None,
        description="The embedding and the output layer each count as a layer slot of the pipeline split "
        "(Megatron-Core account_for_embedding/loss_in_pipeline_split; Megatron-DeepSpeed "
        "--pp-partition-method 'type:transformer|embedding'); null: only where layers + 2, not layers, "
        "divide by pp x vpp on Megatron-Core.",
    )
    rank_order: RankOrder | None = Field(
        None,
        description="Rank order of the axes, innermost first (Megatron-Core --use-tp-pp-dp-mapping: "
        "tp-cp-pp-dp; null: the framework's default, tp-cp-dp-pp).",
    )
    pp_interleaved: bool | None = Field(
        None,
        description="The source states an interleaved pipeline schedule (Narayanan et al. 2021, Sec. 2.2.2) "
        "but not its depth: with parallel.vpp null, vpp is chosen by the model (the fastest that fits among "
        "the depths the stack can run); false: not interleaved (vpp 1); null: as parallel.vpp states "
        "(unstated: 1).",
    )


class RunFacts(Frozen):
    """Typed facts of one run kept beside a runs file the project does not own (`problems/runs/facts`):
    transcribed from the run's source, reviewable, never fitted; merged into the record of that id."""

    software: RunSoftware | None = None
    architecture: RunArchitecture | None = None


class RunMeasured(Frozen):
    """What was measured (null: not published)."""

    step_time_s: PositiveFloat | None = Field(None, description="Step time as stated, s.")
    derived_step_time_s: PositiveFloat | None = Field(
        None, description="Step time worked out from stated figures, s."
    )
    mfu: float | None = Field(
        None, gt=0, le=1, description="Model FLOPs utilisation, in `tflops_convention`."
    )
    tflops_per_gpu: PositiveFloat | None = Field(None, description="Achieved TFLOP/s per GPU.")
    tflops_convention: str | None = Field(None, description="How the source counts FLOPs.")
    tokens_per_s_per_gpu: PositiveFloat | None = Field(None, description="Throughput, tokens/s per GPU.")
    peak_memory_gib: NonNegativeFloat | None = Field(None, description="Peak memory, max over GPUs, GiB.")


class Run(Frozen):
    """One published run."""

    id: str = Field(description="Unique id.")
    source: str = Field(description="Citation, with the table.")
    model: RunModel
    hardware: RunHardware
    parallel: RunParallel
    measured: RunMeasured
    software: RunSoftware | None = Field(None, description="The software that ran it (null: not stated).")
    tier: str = Field(
        pattern="^[ABC]$", description="A: all core fields known; B: one or two unknown; C: more."
    )
    notes: str | None = Field(None, description="Derivations, assumptions, FLOP conventions.")

    @model_validator(mode="after")
    def _remat_policy_is_maxtexts(self) -> Run:
        sw = self.software
        if sw is not None and sw.remat_policy is not None and sw.framework != Framework.MAXTEXT:
            raise ValueError("software.remat_policy is MaxText's: it needs software.framework: maxtext")
        return self

    @model_validator(mode="after")
    def _interleaving_agrees_with_vpp(self) -> Run:
        sw, vpp = self.software, self.parallel.vpp
        stated = sw is not None and sw.pp_interleaved is not None
        if stated and vpp is not None and (vpp > 1) != sw.pp_interleaved:
            raise ValueError(
                f"software.pp_interleaved {sw.pp_interleaved} contradicts parallel.vpp {vpp} "
                "(interleaved means vpp > 1)"
            )
        if sw is not None and sw.pp_interleaved and self.parallel.pp < 2:
            raise ValueError("software.pp_interleaved needs a pipeline (parallel.pp > 1)")
        return self
