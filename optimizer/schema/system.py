"""Schema of a hardware system: one node type (GPUs, memories, networks) and its calibration.

Units are in the field names: ``*_tflops`` dense peak in 10^12 FLOP/s, ``*_gbps`` in 10^9 byte/s,
``*_gib`` in 2^30 byte, ``*_us`` in microseconds.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field, field_validator, model_validator

from optimizer.schema.common import (
    EFFICIENCY_OF,
    CapacityGiB,
    Float,
    Frozen,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    Precision,
    ProcessingMode,
    peak_precision,
)
from optimizer.schema.goodput import Reliability
from optimizer.schema.stack import Stack

EfficiencyTable = list[tuple[Float, Float]]


def _check_table(table: EfficiencyTable, what: str) -> EfficiencyTable:
    if not table:
        raise ValueError(f"{what} needs at least one [size, efficiency] point")
    sizes = [p[0] for p in table]
    if any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(f"{what} sizes must be strictly increasing")
    if any(not (0 < p[1] <= 1) for p in table):
        raise ValueError(f"{what} efficiencies must be in (0, 1]")
    if sizes[0] <= 0:
        raise ValueError(f"{what} sizes must be > 0")
    return table


class Network(Frozen):
    """One network tier. Tiers are nested: tier 0 (e.g. NVLink inside a node) sits inside tier 1
    (e.g. InfiniBand between nodes). A parallel group placed on a tier runs its collectives at that
    tier's per-GPU bandwidth."""

    name: str = Field(description="Tier name, e.g. nvlink, infiniband.")
    size: PositiveInt = Field(description="GPUs one domain of this tier spans (8 for an NVLink node).")
    bandwidth_gbps: PositiveFloat = Field(description="Per-GPU unidirectional injection bandwidth, GB/s.")
    latency_us: NonNegativeFloat = Field(
        description="Per-step latency of a collective (one ring hop), microseconds."
    )
    efficiency: Float = Field(
        gt=0, le=1, description="Achieved fraction of bandwidth_gbps for large collectives."
    )
    processor_usage: Float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Fraction of compute a collective overlapped with compute steals (SMs used by NCCL).",
    )
    must_fill: bool = Field(
        False,
        description="Groups placed on this tier must tile its domain exactly "
        "(tier size divisible by the product of the degrees placed on it).",
    )
    gpus_used: PositiveInt | None = Field(
        None,
        description="GPUs a job uses in each domain of this tier (null: all `size`; NVL72 racks run "
        "64 of their 72 GPUs in NVIDIA's published runs). Consecutive ranks fill each domain to this "
        "count, so a group of g consecutive ranks stays inside one domain only when g divides it (or the "
        "whole job fits in one domain); a group that does not spans two domains and runs at the next "
        "tier (`optimizer.rules.layout.placement`).",
    )

    @property
    def used(self) -> int:
        """GPUs a job uses per domain (`gpus_used`, else `size`)."""
        return self.gpus_used or self.size

    @model_validator(mode="after")
    def _check_used(self) -> Network:
        if self.gpus_used is not None and self.gpus_used > self.size:
            raise ValueError(f"gpus_used ({self.gpus_used}) exceeds the domain's size ({self.size})")
        return self


class OffloadMemory(Frozen):
    """Second memory tier for weight/activation/optimizer offload (host DDR, CXL)."""

    capacity_gib: CapacityGiB = Field(0.0, ge=0, description="Offload capacity per GPU, GiB (0 = none).")
    bandwidth_gbps: NonNegativeFloat = Field(
        0.0, description="Per-GPU bandwidth to offload memory, GB/s, each way."
    )
    efficiency: Float = Field(0.8, gt=0, le=1, description="Achieved fraction of bandwidth_gbps.")


PRIOR_BAND_PCT = 30.0  # a prior-only system's step-time uncertainty: the uncalibrated GEMM-efficiency prior
# (0.85) against the values fitted on published H100/A100 runs (0.60-0.65) is ~30% off
STACK_TRANSFER_BAND_PCT = 8.2  # the added step-time uncertainty of a plan for a stack none of the system's
# calibration runs used, measured on runs of one stack predicted with a calibration from another's:
# torchtitan's two H200 runs (problems/runs/torchtitan-h100-h200.yaml) on H200's Megatron-Core calibration,
# -4.5% and -6.2%, and llm-foundry's 62 H100 FSDP runs (problems/runs/llmfoundry-mpt.yaml) on H100's (without
# the Triton kernel's fitted per-tile overhead), 8.31%: 8.2% over the 64 (8.6% before FSDP's copies were
# modelled)


class Calibration(Frozen):
    """Which fitted values this file holds and on which published runs they were fitted."""

    runs: list[str] = Field(
        default_factory=list, description="Ids of the calibration runs used (shared schema)."
    )
    fitted: list[str] = Field(default_factory=list, description="Field names whose values were calibrated.")
    note: str | None = Field(
        None, description="How the fit was made; anything not fitted is a datasheet value."
    )
    transferred_from: str | None = Field(
        None,
        description="System whose fitted values were copied here (same GPU die); runs are that system's.",
    )
    shape_from: str | None = Field(
        None,
        description="System (same die) whose fitted tables this file takes as they are (GEMM efficiency "
        "curve, HBM table, precision factors), its own runs fitting only what `fitted` adds, e.g. "
        "`clock_scale` for a part at a lower power limit; `runs` are this file's own.",
    )
    stacks: dict[str, int] = Field(
        default_factory=dict,
        description="Calibration runs per software stack "
        "(megatron-core, torchtitan, ...), as scripts/calibrate.py read them.",
    )
    loo_mape_pct: NonNegativeFloat | None = Field(
        None,
        description="Leave-one-out mean |error| of the predicted step time, %, on the runs of this GPU type "
        "(each run predicted by a fit on the others: scripts/calibrate.py --loo --write): the stated "
        "uncertainty of its step times. Transferred systems carry their source's. Null: not measured.",
    )
    loo_mape_pct_by_stack: dict[str, NonNegativeFloat] = Field(
        default_factory=dict,
        description="Leave-one-out mean |error| of the step time, %, on this GPU type's runs of one software "
        "stack (scripts/calibrate.py --stack S --loo --write-loo): the stated uncertainty of that stack's "
        "plans, where measured (else loo_mape_pct).",
    )

    def status(self) -> str:
        """One word: 'calibrated' (fitted on runs of this GPU type), 'transferred' (copied from a same-die
        system fitted on its runs) or 'prior' (datasheet values and uncalibrated efficiency priors)."""
        if self.transferred_from:
            return "transferred"
        return "calibrated" if self.fitted and self.runs else "prior"

    def covers(self, stack: str | None) -> bool:
        """Whether a plan for `stack` is within what the calibration runs measured (no stack named, stacks not
        recorded, or a run of that stack among them)."""
        return stack is None or not self.stacks or str(getattr(stack, "value", stack)) in self.stacks

    def band_pct(self, stack: str | None = None) -> float | None:
        """The step-time uncertainty, +-%: the leave-one-out error where measured; a prior-only system's
        PRIOR_BAND_PCT; None when calibrated but its leave-one-out error was not measured. For a `stack` none
        of the calibration runs used, STACK_TRANSFER_BAND_PCT is added in quadrature (independent errors)."""
        name = None if stack is None else str(getattr(stack, "value", stack))
        if name in self.loo_mape_pct_by_stack:
            return self.loo_mape_pct_by_stack[name]
        base = (
            self.loo_mape_pct
            if self.loo_mape_pct is not None
            else (PRIOR_BAND_PCT if self.status() == "prior" else None)
        )
        if base is None or self.covers(stack) or self.status() == "prior":
            return base
        return round(float(np.hypot(base, STACK_TRANSFER_BAND_PCT)), 2)

    def summary(self, stack: str | None = None) -> str:
        """One line for reports: status, source system, number of runs (per stack) and the stated uncertainty;
        for a `stack` the runs do not cover, the wider band that applies to its plans."""
        st = self.status()
        loo = "" if self.loo_mape_pct is None else f", leave-one-out step-time error {self.loo_mape_pct:.1f}%"
        if self.loo_mape_pct_by_stack:
            loo += " (" + ", ".join(f"{s} {v:.1f}%" for s, v in self.loo_mape_pct_by_stack.items()) + ")"
        per = f" ({', '.join(f'{n} {s}' for s, n in self.stacks.items())})" if self.stacks else ""
        extra = ""
        if not self.covers(stack) and st != "prior" and self.band_pct(stack) is not None:
            name = str(getattr(stack, "value", stack))
            extra = f"; no {name} run among them: +-{self.band_pct(stack):.1f}% for {name} plans"
        if st == "transferred":
            return f"transferred from {self.transferred_from} ({len(self.runs)} runs there{per}{loo}){extra}"
        if st == "calibrated":
            on = f" on {self.shape_from}'s tables (same die)" if self.shape_from else ""
            return f"calibrated on {len(self.runs)} runs{per}{on}{loo}{extra}"
        return f"prior only (not calibrated on any run; step times uncertain by about +-{PRIOR_BAND_PCT:g}%)"


class System(Frozen):
    """A node type: GPUs, their memories and the networks that join them."""

    name: str = Field(description="Identifier, e.g. h100-sxm-80gb.")
    description: str | None = Field(None, description="What the node is.")
    gpu: str = Field(description="GPU model (calibration-schema name where one exists).")
    gpus_per_node: PositiveInt = Field(description="GPUs in one node.")
    hbm_gib: CapacityGiB = Field(gt=0, description="HBM capacity per GPU, GiB.")
    hbm_bandwidth_gbps: PositiveFloat = Field(description="HBM bandwidth per GPU, GB/s (datasheet peak).")
    hbm_efficiency: EfficiencyTable = Field(
        description="Achieved fraction of HBM bandwidth by bytes moved per kernel: [[MB, eff], ...], "
        "interpolated linearly in log10(MB), clamped at the ends."
    )
    matrix_tflops: dict[Precision, PositiveFloat] = Field(
        description="Dense tensor-core peak per datatype, TFLOP/s (no sparsity)."
    )
    matrix_efficiency: EfficiencyTable = Field(
        description="Achieved fraction of matrix peak by GEMM size: [[GFLOP, eff], ...], log10-interpolated."
    )
    matrix_efficiency_scale: dict[Precision, Float] = Field(
        default_factory=dict,
        description="Factor on matrix_efficiency for GEMMs in one precision, e.g. "
        "{fp8: 0.8}: FP8 GEMMs reach a smaller fraction of their doubled peak than 16-bit ones of theirs "
        "(power and clock limits, scaling epilogues). Missing precisions: 1 (MXFP8: fp8's, less the measured "
        "block-scaled kernel factor). Calibrated per GPU type.",
    )
    stack_matrix_scale: dict[Stack, Float] = Field(
        default_factory=dict,
        description="Factor on matrix_efficiency (every precision) for plans of one software stack whose "
        "compiler and kernels are not the ones the tables were fitted on (Megatron-Core with Transformer "
        "Engine, and the other stacks' runs fitted with them), e.g. {maxtext: 0.9} for XLA's GEMMs and "
        "fusions. Fitted on that stack's runs on this GPU type (scripts/calibrate.py --params stack_scale "
        "--stack S); a stack not named: 1.",
    )
    sm_count: PositiveInt | None = Field(
        None,
        description="Streaming multiprocessors (compute units) per GPU, datasheet; with gemm_tile it models "
        "wave quantization: a GEMM of W output tiles runs ceil(W/sm_count) waves. null = not modelled.",
    )
    gemm_tile: tuple[PositiveInt, PositiveInt] = Field(
        (256, 128),
        description="Output tile (rows, columns) of one thread block of the library's large GEMM "
        "kernels (cuBLAS/CUTLASS 256x128 on Ampere/Hopper).",
    )
    attention_efficiency: Float = Field(
        0.6,
        gt=0,
        le=1,
        description="Achieved fraction of matrix peak inside a fused (flash) attention kernel with "
        "full waves and long sequences (`attention_overhead_keys`).",
    )
    attention_efficiency_fa2: Float | None = Field(
        None,
        gt=0,
        le=1,
        description="attention_efficiency of FlashAttention-2 class kernels (`attention: flash2`), which do "
        "not use the architecture's newest matrix instructions; null: the same as attention_efficiency (GPUs "
        "where FlashAttention-2 is the best kernel, e.g. A100).",
    )
    clock_scale: Float | None = Field(
        None,
        gt=0,
        le=1,
        description="Sustained clock of the compute units relative to the one the datasheet peaks assume (1: "
        "as rated). A power cap below the part's rating (e.g. an H100 SXM at 500 W instead of 700 W) lowers "
        "the clock of every compute-bound kernel, GEMMs, attention and element-wise alike, so it scales the "
        "matrix, attention and vector peaks together; fitted where runs at that cap exist, or measured where "
        "a part takes another's fitted tables at the same power but sustains another clock under load (the "
        "H200 against the H100: scripts/microbench_sustained.py). Null: derived "
        "from the power cap, (tdp_w / rated_power_w) ** clock_power_exponent (optimizer/model/fitted.yaml), "
        "1 where rated_power_w is not stated or not above tdp_w.",
    )
    rated_power_w: PositiveFloat | None = Field(
        None,
        description="Power per GPU, W, at which this file's compute peaks and efficiency tables hold: the "
        "same die at its full rating (an H100 SXM's 700 W for a 500 W part; the rack part's power for an HGX "
        "part that takes the rack part's tables). With tdp_w below it, the prior of clock_scale.",
    )
    attention_overhead_keys: NonNegativeFloat | None = Field(
        None,
        description="Fixed work of one flash-attention query tile (load Q, rescale, write O; backward dQ), "
        "in key positions: a kernel over s keys runs at s / (s + this) of attention_efficiency. Null: "
        "derived: that work is memory traffic, so the reference's attention_tile_overhead_keys (measured on "
        "an H100 SXM's causal FlashAttention forward+backward, `../shared/measurements`) is scaled by this "
        "GPU's attention FLOP/s over its HBM bytes/s against the reference's (optimizer/model/fitted.yaml).",
    )
    attention_overhead_keys_triton: NonNegativeFloat | None = Field(
        None,
        description="attention_overhead_keys of FlashAttention's Triton kernel (`attention: flash-triton`); "
        "null: attention_overhead_keys where stated, else derived as it is, at the FlashAttention-2 class "
        "efficiency (the Triton kernel runs the same tile algorithm).",
    )
    vector_tflops: dict[Precision, PositiveFloat] = Field(
        description="Non-tensor-core (CUDA core) peak per datatype, TFLOP/s."
    )
    vector_efficiency: EfficiencyTable = Field(
        description="Achieved fraction of vector peak by op size: [[GFLOP, eff], ...], log10-interpolated."
    )
    processing_mode: ProcessingMode = Field(
        ProcessingMode.ROOFLINE, description="roofline: op time = max(compute, memory); sum: their sum."
    )
    reserved_gib: CapacityGiB = Field(
        1.0, ge=0, description="HBM taken by the runtime (CUDA context, NCCL buffers, allocator slack), GiB."
    )
    offload: OffloadMemory = Field(default_factory=OffloadMemory, description="Second memory tier.")
    networks: list[Network] = Field(min_length=1, description="Network tiers, innermost first.")
    tdp_w: PositiveFloat | None = Field(None, description="GPU board power, W (datasheet).")
    node_power_w: PositiveFloat | None = Field(
        None,
        description="Nameplate (maximum) power of one node with its GPUs, CPUs, memory, NICs and fans, W "
        "(datasheet); null = gpus_per_node x tdp_w x the DGX H100 ratio (optimizer/model/goodput.yaml).",
    )
    reliability: Reliability | None = Field(
        None,
        description="Interruption rates and restart costs of jobs on this node type "
        "(optimizer.schema.goodput); null = the default (Llama 3's H100 cluster).",
    )
    calibration: Calibration = Field(
        default_factory=Calibration, description="What was fitted, on which runs."
    )

    def peak_tflops(self, precision: Precision) -> float | None:
        """Dense matrix peak, TFLOP/s, that GEMMs in `precision` run at (the FP8 scaling recipes at the FP8
        peak: `common.peak_precision`); None when the GPU has none."""
        return self.matrix_tflops.get(peak_precision(precision))

    def efficiency_scale(self, precision: Precision) -> float:
        """`matrix_efficiency_scale` of `precision`, else of the datatype whose kernels it runs
        (`common.EFFICIENCY_OF`), else 1."""
        s = self.matrix_efficiency_scale
        p = Precision(precision)
        return float(s.get(p, s.get(EFFICIENCY_OF.get(p, p), 1.0)))

    def stack_scale(self, stack: Stack | str | None) -> float:
        """`stack_matrix_scale` of `stack`, else 1."""
        return 1.0 if stack is None else float(self.stack_matrix_scale.get(Stack(stack), 1.0))

    @field_validator("hbm_efficiency", "matrix_efficiency", "vector_efficiency")
    @classmethod
    def _tables(cls, v: EfficiencyTable, info) -> EfficiencyTable:
        return _check_table(v, info.field_name)

    @model_validator(mode="after")
    def _check(self) -> System:
        sizes = [n.size for n in self.networks]
        if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)):
            raise ValueError("networks must be listed innermost first (non-decreasing size)")
        if self.networks[0].size < self.gpus_per_node and len(self.networks) == 1:
            raise ValueError("a single network tier must span at least one node")
        return self
