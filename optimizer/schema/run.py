"""Schema of a published training run (the calibration-run schema of `shared/calibration/README.md`).

Every file in this schema is a YAML list of these records; `paraplan validate` reads any of them. Keys the
schema does not know are errors (a typo must not silently drop a field); nullable keys may be omitted.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from optimizer.schema.common import (
    Frozen,
    MlpKind,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Precision,
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
    tier: str = Field(
        pattern="^[ABC]$", description="A: all core fields known; B: one or two unknown; C: more."
    )
    notes: str | None = Field(None, description="Derivations, assumptions, FLOP conventions.")
