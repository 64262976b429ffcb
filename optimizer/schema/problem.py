"""Schema of a problem file: LLM + training + system + execution knobs (+ search space, options)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, PrivateAttr, StrictBool, StrictInt, field_validator, model_validator

from optimizer.schema.common import (
    MEMORY_ERROR_PCT,
    AttentionKernel,
    CpComm,
    CudaGraphs,
    Float,
    Frozen,
    GradAccumulation,
    Int,
    MoeDispatcher,
    PositiveFloat,
    PositiveInt,
    Precision,
    RankOrder,
    Recompute,
    RecomputeModule,
    Schedule,
    TpComm,
    TpOverlap,
)
from optimizer.schema.goodput import Goodput
from optimizer.schema.llm import LLM
from optimizer.schema.stack import Stack, mtp_modules
from optimizer.schema.system import System


class Phase(Frozen):
    """One phase of a batch-size schedule: `tokens` trained at `global_batch` sequences of `seq_len`."""

    tokens: PositiveFloat = Field(description="Tokens trained in this phase.")
    global_batch: PositiveInt = Field(le=1_048_576, description="Sequences per optimizer step in this phase.")
    seq_len: PositiveInt | None = Field(None, description="Sequence length in this phase; null = training's.")


MAX_PHASES = 16


class Training(Frozen):
    """What one optimizer step processes, and in which precision."""

    global_batch: PositiveInt = Field(
        le=1_048_576,
        description="Sequences per optimizer step (at most 1,048,576 = 2^20: billions of tokens per step, "
        "past any published run; larger ones overflow the solver's 64-bit integer step times).",
    )
    seq_len: PositiveInt | None = Field(None, description="Override of the LLM's sequence length (tokens).")
    precision: Precision = Field(Precision.BF16, description="Datatype of matrix math and activations.")
    grad_precision: Precision = Field(
        Precision.FP32,
        description="Datatype of accumulated/reduced gradients (Megatron main_grad: fp32; "
        "ZeRO paper's 16 B/param accounting: bf16).",
    )
    master_weights: bool = Field(
        True, description="Keep an fp32 master copy of the weights (mixed precision)."
    )
    tokens: PositiveFloat | None = Field(None, description="Tokens to train, for time-to-train.")
    phases: list[Phase] | None = Field(
        None,
        description="A batch-size schedule (runs ramp the batch: Llama 3 405B trained 252M tokens at "
        "4M-token batches of 4,096-token sequences, then 8M of 8,192 to 2.87T, then 16M): `solve` plans each "
        "phase on the same GPUs, a re-layout between phases costs a restart and a checkpoint reload, and the "
        "times and costs to train sum. tokens, when given, must equal the phases' sum (null: the sum); each "
        "phase's global_batch and seq_len replace training's.",
    )

    @model_validator(mode="after")
    def _phases(self) -> Training:
        ph = self.phases
        if ph is None:
            return self
        if not ph or len(ph) > MAX_PHASES:
            raise ValueError(f"phases: give 1 to {MAX_PHASES} phases")
        total = sum(p.tokens for p in ph)
        if self.tokens is not None and abs(self.tokens - total) > 1e-6 * total:
            raise ValueError(
                f"phases: their tokens sum to {total:.6g}, not training.tokens {self.tokens:.6g}"
            )
        if self.tokens is None:
            object.__setattr__(self, "tokens", total)
        return self

    def phase_trainings(self) -> list[Training]:
        """Each phase as a `Training` of its own (batch, sequence, tokens), without phases."""
        return [
            self.model_copy(
                update={
                    "global_batch": p.global_batch,
                    "seq_len": p.seq_len or self.seq_len,
                    "tokens": p.tokens,
                    "phases": None,
                }
            )
            for p in self.phases or []
        ]


class Execution(Frozen):
    """The knobs of one parallel execution (Calculon's 18 optimizations plus ZeRO-2/3, CP and EP).

    Every knob has a default, so an execution may name only what it changes."""

    tp: PositiveInt = Field(1, description="Tensor-parallel degree.")
    pp: PositiveInt = Field(1, description="Pipeline-parallel degree (stages).")
    dp: PositiveInt | None = Field(None, description="Data-parallel degree; null = num_gpus / (tp*pp*cp).")
    cp: PositiveInt = Field(1, description="Context-parallel degree (sequence split, ring attention).")
    ep: PositiveInt = Field(1, description="Expert-parallel degree (MoE), drawn from the dp x cp ranks.")
    etp: PositiveInt | None = Field(None, description="Expert tensor-parallel degree; null = tp.")
    vpp: PositiveInt = Field(
        1, description="Interleaved virtual stages per pipeline rank (1 = not interleaved)."
    )
    micro_batch: PositiveInt = Field(1, description="Sequences per micro-batch (per data-parallel rank).")
    schedule: Schedule = Field(
        Schedule.ONE_F_ONE_B, description="Pipeline schedule: 1f1b, gpipe, zb, dualpipev or zbv."
    )
    recompute: Recompute = Field(
        Recompute.NONE, description="Activation recomputation: none, selective, full."
    )
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (needs tp_comm rs_ag).")
    tp_comm: TpComm | None = Field(
        None, description="TP collective: allreduce or rs_ag; null = rs_ag with SP, allreduce without."
    )
    sp_ag_redo: bool = Field(
        True,
        description="With SP: redo the all-gather in backward instead of storing "
        "its output (Korthikanti 2022, 'TP redo for SP').",
    )
    tp_overlap: TpOverlap = Field(TpOverlap.NONE, description="TP communication overlap: none, pipe, ring.")
    pp_embedding_loss: bool = Field(
        False,
        description="The embedding and the loss each take one layer slot of the pipeline split "
        "(Megatron-Core account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split): "
        "layers + 2 divide by pp*vpp, the first and last stages hold one transformer layer less.",
    )
    pp_uneven: bool = Field(
        False,
        description="Layers need not divide the pipeline: a custom split (Megatron-Core's "
        "pipeline_model_parallel_layout, or first/last-stage layer counts) puts ceil(slots / (pp*vpp)) "
        "layers on the busiest chunk, and the model times and sizes that stage. `solve` keeps even splits "
        "unless `search` names it (then with vpp dividing ceil(slots / pp)).",
    )
    pp_rs_ag: bool = Field(
        True,
        description="PP p2p sends 1/tp of the activation and all-gathers it over the "
        "TP group (scatter-gather, Narayanan 2021).",
    )
    dp_overlap: bool = Field(
        True, description="Overlap gradient reduction (and parameter gathering) with compute."
    )
    pp_overlap: bool = Field(
        True,
        description="With interleaving (vpp > 1), overlap each pipeline send/receive with "
        "the compute of a chunk (Megatron-Core overlap_p2p_comm, which NeMo and Megatron-Bridge "
        "set whenever vpp > 1); the non-interleaved schedule batches its p2p on the critical "
        "path. For `evaluate` and published runs; `solve` keeps it on.",
    )
    recompute_modules: list[RecomputeModule] | None = Field(
        None,
        description="With recompute: selective, what is recomputed (Megatron-Core recompute_modules); null = "
        "the attention core. For `evaluate` and published runs; `solve` recomputes the attention core.",
    )
    cp_comm: CpComm = Field(
        CpComm.P2P,
        description="Context parallelism's K/V exchange: p2p (ring), all_gather, a2a (Ulysses: the heads per "
        "rank must divide by cp) or a2a_p2p (a2a inside an NVLink domain, p2p between); moot with cp 1; "
        "`solve` keeps p2p unless `search` names it (or the attention cannot run as a ring: sliding windows, "
        "attention sinks).",
    )
    moe_dispatcher: MoeDispatcher = Field(
        MoeDispatcher.ALLTOALL,
        description="MoE token dispatcher: alltoall "
        "(Megatron-Core default) or flex (DeepEP / HybridEP, node-deduplicated); `solve` "
        "keeps alltoall unless `search` names it.",
    )
    ep_overlap: bool = Field(
        False,
        description="MoE: overlap the expert-parallel all-to-all of one micro-batch "
        "with the computation of another (Megatron-Core overlap_moe_expert_parallel_comm); "
        "needs ep > 1; `solve` keeps it off unless `search` names it.",
    )
    moe_fused_mlp: bool = Field(
        False,
        description="MoE: the routed experts' MLP runs as Transformer Engine's fused op "
        "sequence (Megatron-Core use_transformer_engine_op_fuser, TE >= 2.14: grouped GEMMs "
        "with their biases, the clamped GLU and the probability scaling fused); otherwise "
        "Megatron-Core's eager path adds the clamps and the down-projection's biases in passes "
        "of their own. Not searched.",
    )
    moe_probs_in_act: bool = Field(
        True,
        description="MoE: the router's probabilities scale the experts' activation output (Megatron-Core "
        "from 0.13, 'memory efficient token permutation': the fused weighted SwiGLU), so the combine is an "
        "unweighted sum that keeps nothing for backward; false: they weight the experts' outputs in the "
        "combine (Megatron-Core before 0.13, torchtitan, DeepSpeed), which keeps every routed row's output "
        "for the probabilities' gradient. Fixed by the stack (`stack.FIXED_BY_STACK`); not searched.",
    )
    grad_accumulation: GradAccumulation = Field(
        GradAccumulation.FUSED,
        description="How each micro-batch's weight gradients are added into the main-gradient buffer: "
        "fused into the weight-gradient GEMM (Megatron-Core), a 16-bit add kernel of its own (Megatron-LM "
        "before its fusion: FP32 accumulation from 2022-02, 16-bit from 2022-09; autograd) or a cast and an "
        "add (DeepSpeed's BF16 optimizer: the megatron-deepspeed stack's in bf16, an add in fp16). Not "
        "searched: `solve` plans with the value given.",
    )
    cuda_graphs: CudaGraphs = Field(
        CudaGraphs.NONE,
        description="CUDA graphs the stack replays (Megatron-Core "
        "cuda_graph_impl): none (eager), partial (Transformer Engine graphs of the "
        "attention, router and dispatcher preprocessing) or full (the whole iteration). "
        "Under eager launch a dropless MoE layer's forward takes at least the host time "
        "to issue it (it synchronises with the GPU once per layer); partial graphs issue "
        "half of it, full graphs none. Not searched: `solve` plans with the value given.",
    )
    zero: Int = Field(
        0,
        ge=0,
        le=3,
        description="ZeRO stage: 0 none, 1 optimizer sharding (distributed "
        "optimizer), 2 + gradients, 3 + weights (FSDP full shard).",
    )
    fused_layers: bool = Field(
        True,
        description="Fused element-wise kernels (bias-GeLU, bias-dropout-add, "
        "softmax, norms): one memory pass instead of several.",
    )
    attention: AttentionKernel = Field(
        AttentionKernel.FLASH,
        description="Attention kernel: flash, flash2 (FlashAttention-2 class kernels) or standard.",
    )
    kv_repeat: bool = Field(
        False,
        description="K/V heads repeated to the query heads before the attention kernel "
        "(torchtitan until its 'GQA without kv repeats', pytorch/torchtitan#2259, 2026-01): the "
        "kernel reads, and a context-parallel ring carries, K/V for every query head. For "
        "`evaluate` and published runs; `solve` keeps GQA's own K/V heads.",
    )
    fused_loss: bool = Field(
        True,
        description="The cross-entropy loss as fused kernels (Megatron-Core's vocab-parallel "
        "loss, a torch.compile'd loss) rather than PyTorch's cross_entropy on an fp32 upcast of the "
        "logits, which holds 12 bytes per logit at its peak; fused_layers: false implies it. For "
        "`evaluate` and published runs; `solve` keeps it fused.",
    )
    weight_offload: bool = Field(
        False, description="Keep weights in offload memory, stream 2 layers at a time."
    )
    activation_offload: bool = Field(False, description="Move stored activations to offload memory.")
    activation_offload_layers: PositiveInt | None = Field(
        None,
        description="With activation_offload: the transformer layers per pipeline stage whose stored "
        "activations go to offload memory, the others staying in HBM (Megatron-Core "
        "cpu_offloading_num_layers); null = all but the two in use. For `evaluate` and published runs; "
        "`solve` offloads all or none.",
    )
    optimizer_offload: bool = Field(
        False, description="Keep optimizer state and fp32 gradients in offload memory."
    )
    rank_order: RankOrder = Field(
        RankOrder.TP_CP_DP_PP,
        description="Rank order of the axes, innermost first: tp-cp-dp-pp (Megatron's default) or "
        "tp-cp-pp-dp (--use-tp-pp-dp-mapping: data parallelism outermost).",
    )
    placement: dict[str, str | int] | None = Field(
        None,
        description="Network tier (name or index) of each parallel axis, e.g. {tp: nvlink, dp: infiniband}; "
        "null = the rank order (`rank_order`), each axis on the innermost tier that holds it.",
    )

    @model_validator(mode="after")
    def _check(self) -> Execution:
        if self.placement:
            bad = set(self.placement) - {"tp", "pp", "dp", "cp", "ep"}
            if bad:
                raise ValueError(f"placement: unknown axis {sorted(bad)}")
        if self.activation_offload_layers is not None and not self.activation_offload:
            raise ValueError("activation_offload_layers needs activation_offload: true")
        if self.recompute_modules and self.recompute != Recompute.SELECTIVE:
            raise ValueError("recompute_modules needs recompute: selective")
        return self


class Options(Frozen):
    """Problem-wide options."""

    memory_headroom_gib: Float | None = Field(
        None,
        ge=0,
        description="HBM kept free on every GPU, GiB. Default "
        "(null): the memory model's stated error, a margin of 5.1% of the "
        "use at the limit (4.9% of the HBM); 0 plans to the last byte.",
    )
    allow_idle_gpus: bool = Field(False, description="Allow tp*pp*dp*cp < num_gpus.")
    gpu_multiple: PositiveInt = Field(
        1,
        description="GPUs used (tp*pp*dp*cp) must be a multiple of this, e.g. "
        "whole nodes when hardware is bought (`procure`).",
    )


class Goal(StrEnum):
    """What `solve` optimises."""

    STEP_TIME = "step_time"  # minimum step time (fastest training on the GPUs given)
    TOKENS_PER_GPU = "tokens_per_gpu"  # maximum tokens/s per GPU used (with idle GPUs allowed)
    FEWEST_GPUS = "fewest_gpus"  # fewest GPUs that meet a step-time or time-to-train target
    EXPECTED_TIME = "expected_time"  # least expected wall time to train (failures, checkpoints, spares)


class Objective(Frozen):
    """The objective of `solve` (default: minimum step time)."""

    goal: Goal = Field(
        Goal.STEP_TIME,
        description="step_time | tokens_per_gpu | fewest_gpus | expected_time (the least expected wall time "
        "to train training.tokens with failures, checkpoints and spares: goodput).",
    )
    max_step_time_s: PositiveFloat | None = Field(
        None, description="Step-time target, s: the target of fewest_gpus, a constraint for the other goals."
    )
    max_days: PositiveFloat | None = Field(
        None, description="Time-to-train target for training.tokens, days (instead of max_step_time_s)."
    )
    max_gpu_hours: PositiveFloat | None = Field(
        None,
        description="Cap on GPU-hours to train training.tokens "
        "(GPUs used x time to train): a rental budget over its rate.",
    )
    target_includes_failures: bool = Field(
        False,
        description="max_days (or max_step_time_s) is met by the expected time to train with failures, "
        "restarts and checkpoints (step x W(n), optimizer.model.goodput), not by the failure-free time.",
    )

    @model_validator(mode="after")
    def _target(self):
        if self.goal == Goal.FEWEST_GPUS and (self.max_step_time_s is None) == (self.max_days is None):
            raise ValueError("fewest_gpus needs exactly one of max_step_time_s, max_days")
        if self.max_step_time_s is not None and self.max_days is not None:
            raise ValueError("give at most one of max_step_time_s, max_days")
        return self


class Range(Frozen):
    """A range restriction of an integer knob: min <= value <= max (and one of `in` when given)."""

    min: StrictInt | None = Field(None, ge=0, description="Smallest value allowed.")
    max: StrictInt | None = Field(None, ge=0, description="Largest value allowed.")
    in_: list[StrictInt] | None = Field(
        None, alias="in", description="Values allowed (with min/max: all must hold)."
    )


IntRule = StrictInt | list[StrictInt] | Range
BoolRule = StrictBool | list[StrictBool]


class Search(Frozen):
    """Restrictions of the knob space that `solve` searches: per knob a value (`tp: 8`), a list
    (`tp: [4, 8]`) or, for integers, a range (`vpp: {max: 4}`). A knob left out takes every legal value (fused
    kernels, flash attention, scatter-gather p2p, 1F1B and the SP all-gather redo stay fixed unless named).
    Naming a knob also lifts its default cap (`optimizer.rules.layout.Caps`)."""

    tp: IntRule | None = Field(None, description="Tensor-parallel degrees.")
    pp: IntRule | None = Field(None, description="Pipeline-parallel degrees.")
    dp: IntRule | None = Field(None, description="Data-parallel degrees.")
    cp: IntRule | None = Field(None, description="Context-parallel degrees.")
    ep: IntRule | None = Field(None, description="Expert-parallel degrees (MoE).")
    etp: IntRule | None = Field(None, description="Expert tensor-parallel degrees (MoE).")
    vpp: IntRule | None = Field(None, description="Virtual pipeline stages per rank.")
    micro_batch: IntRule | None = Field(None, description="Micro-batch sizes, sequences.")
    zero: IntRule | None = Field(None, description="ZeRO stages (0-3).")
    pp_embedding_loss: BoolRule | None = Field(
        None, description="Embedding and loss as pipeline layer slots."
    )
    pp_uneven: BoolRule | None = Field(
        None,
        description="Pipeline splits the layer slots need not divide: ceil(slots / pp) layers on the busiest "
        "stage, vpp dividing that count (fixed even unless named).",
    )
    sequence_parallel: BoolRule | None = Field(None, description="Sequence parallelism.")
    dp_overlap: BoolRule | None = Field(None, description="Overlap of DP traffic with compute.")
    weight_offload: BoolRule | None = Field(None, description="Weight offload (needs offload memory).")
    activation_offload: BoolRule | None = Field(
        None, description="Activation offload (needs offload memory)."
    )
    optimizer_offload: BoolRule | None = Field(
        None, description="Optimizer-state offload (needs offload memory)."
    )
    fused_layers: BoolRule | None = Field(
        None, description="Fused element-wise kernels (fixed on unless named)."
    )
    pp_rs_ag: BoolRule | None = Field(None, description="Scatter-gather p2p (fixed on unless named).")
    sp_ag_redo: BoolRule | None = Field(
        None, description="Redo the SP all-gather in backward (fixed on unless named)."
    )
    recompute: Recompute | list[Recompute] | None = Field(None, description="none | selective | full.")
    tp_overlap: TpOverlap | list[TpOverlap] | None = Field(None, description="none | pipe | ring.")
    attention: AttentionKernel | list[AttentionKernel] | None = Field(
        None, description="flash | standard (fixed flash unless named)."
    )
    schedule: Schedule | list[Schedule] | None = Field(
        None, description="1f1b | gpipe (fixed 1F1B unless named)."
    )
    moe_dispatcher: MoeDispatcher | list[MoeDispatcher] | None = Field(
        None, description="MoE token dispatcher: alltoall | flex (fixed alltoall unless named)."
    )
    cp_comm: CpComm | list[CpComm] | None = Field(
        None, description="CP K/V exchange: p2p | all_gather | a2a | a2a_p2p (fixed p2p unless named)."
    )
    ep_overlap: BoolRule | None = Field(None, description="MoE all-to-all overlap (fixed off unless named).")
    precision: Precision | list[Precision] | None = Field(
        None,
        description="Training precisions to choose from "
        "(bf16, fp16, fp8, mxfp8, nvfp4; default: training.precision "
        "only): solve decides among those the system has a peak for.",
    )

    def rules(self) -> dict:
        """{knob: value | list | {min, max, in}} of the knobs named (the form `optimizer.prepare.space`
        reads)."""
        out = {}
        for k in type(self).model_fields:
            v = getattr(self, k)
            if v is None:
                continue
            out[k] = v.model_dump(by_alias=True, exclude_none=True) if isinstance(v, Range) else v
        return out


class Problem(Frozen):
    """A planning problem: train `llm` with `training` on `num_gpus` GPUs of `system`."""

    name: str | None = Field(None, description="Problem name.")
    description: str | None = Field(None, description="Free text.")
    llm: LLM = Field(description="The model: a name in problems/llms/, or inline.")
    system: System = Field(
        description="The node type: a name in problems/systems/, or inline "
        "(`base: NAME` plus overrides is allowed)."
    )
    num_gpus: PositiveInt = Field(description="GPUs available.")
    training: Training = Field(description="Batch, precision, tokens.")
    execution: Execution = Field(default_factory=Execution, description="Knobs for `evaluate`.")
    search: Search | None = Field(None, description="Restrictions of the knob space for `solve`.")
    options: Options = Field(default_factory=Options, description="Headroom, idle GPUs.")
    objective: Objective = Field(default_factory=Objective, description="What `solve` optimises.")
    goodput: Goodput | None = Field(
        None,
        description="Failures, checkpoints, spares and energy: with training.tokens, every plan's expected "
        "time and cost to train (optimizer.model.goodput); null = the cited defaults.",
    )
    stack: Stack = Field(
        Stack.MEGATRON_CORE,
        description="Training framework the plan is for: megatron-core "
        "(default; also NeMo, Megatron-Bridge), torchtitan, fsdp (PyTorch FSDP via Composer / "
        "llm-foundry) or deepspeed; `solve`, `check` and `procure` search only the knobs it offers "
        "(optimizer.schema.stack).",
    )

    _source: Any = PrivateAttr(None)  # the document the problem was loaded from (optimizer.io.loader.Sourced)

    def source_document(self):
        """The loaded document (to locate a field's line), or None for a problem built in code."""
        return self._source

    @field_validator("goodput")
    @classmethod
    def _one_spare_count(cls, g):
        if g is not None and isinstance(g.spare_nodes, list):
            raise ValueError(
                "spare_nodes: a list of counts is procure's choice; solve takes one count (with "
                "options.allow_idle_gpus, idle whole nodes are spares too)"
            )
        return g

    @model_validator(mode="after")
    def _phases_objective(self):
        o = self.objective
        if self.training.phases and (
            o.max_step_time_s is not None or o.max_days is not None or o.max_gpu_hours is not None
        ):
            raise ValueError(
                "training.phases: the objective's targets (max_step_time_s, max_days, max_gpu_hours) are "
                "per batch; with phases give none"
            )
        if self.training.phases and o.goal not in (Goal.STEP_TIME, Goal.EXPECTED_TIME):
            raise ValueError("training.phases: objective.goal must be step_time or expected_time")
        return self

    @model_validator(mode="after")
    def _objective_needs_tokens(self):
        if self.objective.goal == Goal.EXPECTED_TIME and not (self.training.tokens or self.training.phases):
            raise ValueError("objective.goal expected_time needs training.tokens")
        if (
            self.objective.max_days is not None or self.objective.max_gpu_hours is not None
        ) and not self.training.tokens:
            raise ValueError("objective.max_days and objective.max_gpu_hours need training.tokens")
        return self

    def headroom_gib(self) -> float:
        """HBM kept free per GPU, GiB: options.memory_headroom_gib, by default the memory model's stated error
        (`optimizer.model.capacity.MEMORY_ERROR_PCT` of the use at the limit)."""
        h = self.options.memory_headroom_gib
        if h is not None:
            return h
        return self.system.hbm_gib * (1 - 1 / (1 + MEMORY_ERROR_PCT / 100))

    def hbm_to_hold_gib(self, use_gib: float) -> float:
        """The HBM per GPU (GiB) whose part left after the headroom (`headroom_gib`) holds `use_gib`: use plus
        the fixed headroom, or, with the default headroom (a share of the HBM), use x (1 + the stated
        error)."""
        h = self.options.memory_headroom_gib
        return use_gib + h if h is not None else use_gib * (1 + MEMORY_ERROR_PCT / 100)

    @model_validator(mode="after")
    def _stack_offers_search(self):
        from optimizer.schema.stack import precision_unsupported, unsupported, written_unsupported

        prec = None if "precision" in self.user_search_rules() else self.training.precision
        errs = [(f"search.{k}", m) for k, m in unsupported(self.stack, self.user_search_rules(), prec)]
        errs += [(f"execution.{k}", m) for k, m in written_unsupported(self.stack, self.execution, prec)]
        why = precision_unsupported(self.stack, self.training.precision)
        if why and "precision" not in self.user_search_rules():
            errs.append(("training.precision", why))
        if errs:
            raise ValueError("; ".join(f"{k}: {m}" for k, m in errs))
        return self

    @model_validator(mode="after")
    def _stack_defaults(self):
        """Execution knobs the file left at their default take the stack's value where the stack does not
        offer the default (torchtitan sends whole activations between stages: pp_rs_ag false), so that
        `evaluate` and published runs model what the framework runs; the knobs stay unwritten (not fixed by
        the file)."""
        from optimizer.schema.stack import stack_defaults

        ex = stack_defaults(self.stack, self.execution, self.training.precision)
        if ex is not self.execution:
            object.__setattr__(self, "execution", ex)
        return self

    def user_search_rules(self) -> dict:
        """The problem file's own `search` restrictions as {knob: rule} (a problem changed in code may hold a
        plain dict)."""
        s = self.search
        if s is None:
            return {}
        return dict(s) if isinstance(s, dict) else s.rules()

    def search_rules(self) -> dict:
        """The knob space's restrictions: the file's `search` narrowed to what the stack offers at the
        training precision (a search over precisions solves each at its own: `solve._solve_precisions`)."""
        from optimizer.schema.stack import restrict

        return restrict(self.stack, self.user_search_rules(), self.training.precision)

    def steps_to_train(self) -> float | None:
        """Optimizer steps to train training.tokens (None without tokens)."""
        if not self.training.tokens:
            return None
        return self.training.tokens / (self.training.global_batch * self.seq_len)

    def step_time_target_s(self) -> float | None:
        """The largest step time that meets the objective's target (days -> s via training.tokens); None:
        none."""
        o = self.objective
        if o.max_step_time_s is not None:
            return o.max_step_time_s
        if o.max_days is None:
            return None
        return o.max_days * 86400.0 / self.steps_to_train()

    def gpu_seconds_per_step_cap(self) -> float | None:
        """objective.max_gpu_hours as a cap on GPUs x step time (s); None: no cap."""
        o = self.objective
        if o.max_gpu_hours is None:
            return None
        return o.max_gpu_hours * 3600.0 / self.steps_to_train()

    @property
    def seq_len(self) -> int:
        return self.training.seq_len or self.llm.seq_len

    @property
    def mtp_layers(self) -> int:
        """Multi-token prediction modules trained (`stack.mtp_modules`)."""
        return mtp_modules(self.llm.mtp_layers, self.stack)

    @property
    def pipeline_blocks(self) -> int:
        """Transformer blocks a custom pipeline layout (`Execution.pp_uneven`) places: the layers and each
        MTP module's block."""
        return self.llm.layers + self.mtp_layers
