"""Software stacks and the knobs each one offers (`problem.stack`).

A stack profile restricts the knob space that `solve`, `check` and `procure` search to what that framework's
current release can run; a user's `search` narrows it further. Knobs a profile does not name are offered as in
Megatron-Core. What each profile offers, with its source:

- megatron-core (Megatron-Core / NeMo / Megatron-Bridge; NVIDIA Megatron-LM docs, "parallelism guide"): every
  knob modelled: TP with sequence parallelism and TP-communication overlap, PP with 1F1B and interleaving
  (virtual stages) and the embedding/loss layer slots, scatter-gather p2p, CP, EP, the distributed optimizer
  (ZeRO-1) and FSDP (ZeRO-3), selective and full recomputation, CPU offload; in NVFP4 no TP-communication
  overlap (Transformer Engine's Userbuffers carry FP8 and MXFP8 tensors only: `BY_PRECISION`).
- torchtitan (pytorch/torchtitan README "Key features" and docs/fsdp.md): FSDP2 per-parameter sharding
  (`reshard_after_forward` always: ZeRO-3; never: ZeRO-2-like, gathered weights kept for backward) or DDP
  replication (ZeRO-0); with pipeline parallelism FSDP2 keeps the parameters gathered (reshard_after_forward
  False) and synchronises gradients at the last micro-batch only (torchtitan parallelize_llama,
  torch.distributed.pipelining), i.e. ZeRO-1 in memory and traffic; no distributed optimizer otherwise; TP
  with sequence parallelism and async TP (a collective-matmul decomposition: `ring`); PP with 1F1B,
  interleaved 1F1B and GPipe schedules, stages split by modules (the embedding on the first stage, the output
  on the last: no layer slots), full activations sent between stages (no scatter-gather); CP; selective and
  full activation checkpointing; no CPU offload of weights, activations or optimizer state in the training
  recipes.
- fsdp (PyTorch FSDP1 through MosaicML Composer / llm-foundry; Composer docs "FSDP": sharding_strategy
  FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2), NO_SHARD (DDP); activation_checkpointing per block): data
  parallelism only (no tensor, pipeline or context parallelism in llm-foundry's training configs), full or no
  activation checkpointing, no TP overlap, no offload.
- deepspeed (DeepSpeed docs "ZeRO" and "Pipeline Parallelism"): ZeRO stages 0-3 on the plain DeepSpeed engine,
  full activation checkpointing; no tensor parallelism without Megatron-DeepSpeed (plan that as
  megatron-core), and no pipeline here (DeepSpeed's PipelineModule runs only with ZeRO <= 1 and is not in this
  profile); no CP; ZeRO-Offload/Infinity are not modelled.
- megatron-deepspeed (microsoft/Megatron-DeepSpeed README and examples; the BLOOM and MT-NLG training
  setups): Megatron's tensor parallelism and pipeline stages run by DeepSpeed's pipeline engine (1F1B, no
  interleaved virtual stages, no scatter-gather of the stage exchange; the embedding and the output layer on
  the edge stages, as layer slots of the split with --pp-partition-method 'type:transformer|embedding', as
  BLOOM ran; the gradients reduced after the last micro-batch, `overlaps_pipelined_dp`) with DeepSpeed's
  ZeRO-1 at most (the pipeline engine refuses ZeRO-2/3); no Megatron sequence parallelism or
  TP-communication overlap, no CP (its Ulysses sequence parallelism is not modelled), full or selective
  activation checkpointing, BF16/FP16 (no FP8), no CPU offload.
- maxtext (AI-Hypercomputer/maxtext, JAX/XLA on GPUs; its configs/base.yml parallelism axes and remat
  policies, NVIDIA's dgxc-benchmarking MaxText recipes): the `fsdp` mesh axis shards the parameters, gradients
  and optimizer state (ZeRO-3: XLA all-gathers each layer's weights before its forward and again before its
  backward, reduce-scatters its gradients, pipelined one layer ahead) and the `data` axis replicates
  (ZeRO-0); tensor parallelism, with its norms' sequence sharded (the tensor_sequence axis, from 2025-01) or
  not, and XLA's collective matmul as the decomposed overlap (`ring`,
  --xla_gpu_multi_streamed_windowed_einsum); its pipeline runs every micro-batch's forward, then every
  backward (GPipe; circular repeats are not modelled); context parallelism by all-gathering K and V; a remat
  policy is a selective recompute of the modules the policy does not save (`REMAT_POLICY`); BF16 and FP8
  with delayed scaling (`quantization: fp8`). Its host offload (remat policies that offload, optimizer and
  parameter host offload) is not modelled. The fp32 parameters are the master weights: no 16-bit copy is
  kept, only a layer's cast.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from optimizer.schema.common import (
    CpComm,
    GradAccumulation,
    MoeDispatcher,
    Precision,
    RankOrder,
    Recompute,
    RecomputeModule,
    Schedule,
    TpOverlap,
)


class Stack(StrEnum):
    """The training framework a plan is for."""

    MEGATRON_CORE = "megatron-core"
    TORCHTITAN = "torchtitan"
    FSDP = "fsdp"
    DEEPSPEED = "deepspeed"
    MEGATRON_DEEPSPEED = "megatron-deepspeed"
    MAXTEXT = "maxtext"


def mtp_modules(mtp_layers: int, stack: Stack) -> int:
    """Multi-token prediction modules a stack trains of a model's `LLM.mtp_layers`: Megatron-Core runs them
    (mtp_num_layers); the other stacks have none (torchtitan's DeepSeek-V3 trains without them)."""
    return mtp_layers if stack == Stack.MEGATRON_CORE else 0


NO_OFFLOAD = {
    "weight_offload": [False],
    "activation_offload": [False],
    "optimizer_offload": [False],
    "ep_overlap": [False],
    "moe_dispatcher": [MoeDispatcher.ALLTOALL],
}  # nor Megatron-Core's MoE overlap, DeepEP

# knob -> values the stack offers (knobs not named: as Megatron-Core)
# pipeline schedules: zero-bubble, DualPipeV and ZB-V only in PyTorch's pipelining (torchtitan
# InterleavedZeroBubble, DualPipeV, ZBVZeroBubble)
NO_ZERO_BUBBLE = {"schedule": [Schedule.ONE_F_ONE_B, Schedule.GPIPE]}
PROFILES: dict[Stack, dict[str, list]] = {
    Stack.MEGATRON_CORE: {**NO_ZERO_BUBBLE},
    Stack.TORCHTITAN: {
        "zero": [0, 1, 2, 3],
        "pp_embedding_loss": [False],
        "pp_rs_ag": [False],
        # async TP (PyTorch micro-pipelined TP, its matmuls decomposed: layer.block_cost)
        "tp_overlap": [TpOverlap.NONE, TpOverlap.RING],
        **NO_OFFLOAD,
        # PyTorch TP's linears save their all-gathered input for the weight gradient (DTensor
        # ColwiseParallel, fused_all_gather_matmul): no re-gather in backward (Megatron-Core's is)
        "sp_ag_redo": [False],
        # PyTorch context parallelism is ring attention (its rotate method modelled as `layer.cp_ring_s`)
        "cp_comm": [CpComm.P2P],
        # torchao Float8 (tensorwise = current scaling) and MXFP8 (docs/float8.md, docs/mxfp8.md)
        "precision": [Precision.BF16, Precision.FP32, Precision.FP8_CURRENT, Precision.MXFP8],
    },
    Stack.FSDP: {
        "tp": [1],
        "pp": [1],
        "vpp": [1],
        "cp": [1],
        "zero": [0, 2, 3],
        "sequence_parallel": [False],
        "recompute": [Recompute.NONE, Recompute.FULL],
        "tp_overlap": [TpOverlap.NONE],
        "pp_embedding_loss": [False],
        **NO_OFFLOAD,
        **NO_ZERO_BUBBLE,
        # llm-foundry: bf16/fp16 AMP, FP8 through Transformer Engine (delayed scaling)
        "precision": [Precision.BF16, Precision.FP16, Precision.FP32, Precision.FP8],
    },
    Stack.DEEPSPEED: {
        "tp": [1],
        "pp": [1],
        "vpp": [1],
        "cp": [1],
        "zero": [0, 1, 2, 3],
        "sequence_parallel": [False],
        "recompute": [Recompute.NONE, Recompute.FULL],
        "tp_overlap": [TpOverlap.NONE],
        "pp_embedding_loss": [False],
        **NO_OFFLOAD,
        **NO_ZERO_BUBBLE,
        "precision": [Precision.BF16, Precision.FP16, Precision.FP32],
    },
    Stack.MEGATRON_DEEPSPEED: {
        "vpp": [1],
        "cp": [1],
        "zero": [0, 1],
        "sequence_parallel": [False],
        "tp_overlap": [TpOverlap.NONE],
        "pp_embedding_loss": [False, True],
        "pp_rs_ag": [False],
        **NO_OFFLOAD,
        **NO_ZERO_BUBBLE,
        "precision": [Precision.BF16, Precision.FP16, Precision.FP32],
    },
    Stack.MAXTEXT: {
        "vpp": [1],
        "zero": [0, 3],  # the data axis replicates; the fsdp axis shards parameters, gradients and state
        # XLA's collective matmul (--xla_gpu_multi_streamed_windowed_einsum): the decomposed `ring` overlap
        "tp_overlap": [TpOverlap.NONE, TpOverlap.RING],
        "pp_embedding_loss": [False],
        "pp_rs_ag": [False],
        "schedule": [Schedule.GPIPE],
        "cp_comm": [CpComm.ALL_GATHER],
        **NO_OFFLOAD,
        # quantization: fp8 (Flax's fp8 dot_general with an amax history: delayed scaling)
        "precision": [Precision.BF16, Precision.FP32, Precision.FP8],
    },
}
# knob -> the value a stack runs, where that is not a choice (not searched, not in `PROFILES`): the router's
# probabilities in the experts' activation is Megatron-Core's (0.13 on); torchtitan weights the experts'
# outputs in its combine (models/common/token_dispatcher.py `combine`: routed_output x scores, then
# scatter_add), DeepSpeed MoE in its combine einsum (deepspeed/moe/sharded_moe.py `combine_weights`)
FIXED_BY_STACK: dict[Stack, dict[str, object]] = {
    s: {"moe_probs_in_act": False}
    for s in (Stack.TORCHTITAN, Stack.FSDP, Stack.DEEPSPEED, Stack.MEGATRON_DEEPSPEED, Stack.MAXTEXT)
}
INT_KNOBS = {"tp", "pp", "vpp", "cp", "zero", "dp", "ep", "etp", "micro_batch"}

# knob -> values the stack offers at a training precision, where narrower than PROFILES: Transformer Engine's
# Userbuffers, which run Megatron-Core's TP-communication overlap (tp_comm_overlap), communicate FP8 and MXFP8
# tensors but not NVFP4 ones (transformer_engine/pytorch/module/base.py
# `fill_userbuffers_buffer_for_all_gather`: "Unsupported quantizer for Userbuffers"), and Megatron-Bridge's
# NVFP4 presets turn the overlap off (scripts/performance configs: `tp_comm_overlap = False if precision ==
# "nvfp4"`)
BY_PRECISION: dict[Stack, dict[Precision, dict[str, list]]] = {
    Stack.MEGATRON_CORE: {Precision.NVFP4: {"tp_overlap": [TpOverlap.NONE]}}
}


def _at_precision(stack: Stack, precision) -> dict[str, list]:
    """The knobs `BY_PRECISION` narrows for the stack at `precision` (none without a precision)."""
    return BY_PRECISION.get(Stack(stack), {}).get(Precision(precision), {}) if precision is not None else {}


def profile(stack: Stack, precision=None) -> dict[str, list]:
    """knob -> values the stack offers: `PROFILES`, narrowed at `precision` where `BY_PRECISION` says so."""
    extra = _at_precision(stack, precision)
    return {**PROFILES[Stack(stack)], **extra} if extra else PROFILES[Stack(stack)]


def zero2_regathers(stack: Stack) -> bool:
    """Whether the stack's ZeRO-2 gathers the parameters again for every micro-batch: PyTorch FSDP's
    SHARD_GRAD_OP (FSDP1, stack fsdp) and FSDP2 without resharding after forward (torchtitan) keep the
    gathered parameters from a micro-batch's forward through its backward and free them after it (FSDP1
    `_should_free_in_backward`; FSDP2 post-backward reshard); DeepSpeed's and Megatron-Core's ZeRO-2 keep
    whole parameters and gather once a step (`compose.dp_links`)."""
    return Stack(stack) in (Stack.FSDP, Stack.TORCHTITAN)


def dp_bucket_params(stack: Stack, dp):
    """Parameters per gradient bucket of the stack's ZeRO-0/1/2 reductions and gathers (each bucket one
    collective call, paying its latency: `hardware.collective_latency`), or None where the calls go per layer
    (an FSDP unit, a scanned layer). `dp`: the data-parallel group's ranks (arrays ok).

    - megatron-core: max(40M, 1M x dp) parameters, grown with the group so that a ring's chunks stay
      bandwidth-bound (megatron/core/distributed/distributed_data_parallel.py, `bucket_size` default).
    - deepspeed, megatron-deepspeed: 5e8 elements (DeepSpeed ZeRO config `reduce_bucket_size` and
      `allgather_bucket_size` defaults).
    - torchtitan, fsdp, maxtext: per layer (FSDP2 / FSDP1 wrap each transformer block; MaxText scans its
      layers); ZeRO-3 gathers and reduces per layer on every stack."""
    s = Stack(stack)
    if s == Stack.MEGATRON_CORE:
        return np.maximum(40e6, 1e6 * np.asarray(dp, dtype=float))
    if s in (Stack.DEEPSPEED, Stack.MEGATRON_DEEPSPEED):
        return 5e8 + 0.0 * np.asarray(dp, dtype=float)
    return None


def fsdp_copy_bytes(stack: Stack, wb: float, gb: float) -> tuple[float, float, float]:
    """Bytes of HBM traffic per parameter of a stage that PyTorch FSDP's own copies and casts make, as
    (per gradient all-reduce, per gradient reduce-scatter, per parameter gather); all 0 on the other stacks
    (Megatron-Core's wgrad GEMMs accumulate into its contiguous main-grad buffer and it gathers into the
    parameters' own storage; torchtitan's ZeRO-0 is DDP, whose bucket copies are not modelled).
    `wb`, `gb`: bytes of the compute (16-bit) weights and of the reduced gradients.

    - FSDP1 (stack fsdp; torch/distributed/fsdp/_runtime_utils.py `_post_backward_hook` -> `_reduce_grad`):
      the gradients of a FlatParameter's views are concatenated into the flat gradient (autograd's
      split_with_sizes backward: read and write wb), cast to the reduce dtype when it differs (Composer's
      mixed_precision DEFAULT: bf16 compute, fp32 reduction; read wb, write gb), and pre-divided in place
      (`_div_if_needed` with `_gradient_predivide_factor`, > 1 from 2 ranks on: read and write gb). The
      all-gather writes the flat parameter itself: no copy. Without sharding (NO_SHARD, ZeRO-0) the
      all-reduced full gradient is post-divided as well (the rest of the world size, > 1 from 4 ranks on: read
      and write gb). These passes run on FSDP1's post-backward stream, beside the next layer's backward; they
      are counted as time all the same, since a memory-bound kernel streaming at the HBM's rate needs the SMs
      for that time.
    - FSDP2 (torchtitan; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): `foreach_reduce` copies
      the gradients into the reduce-scatter input in the reduce dtype (`torch._chunk_cat`: read wb, write gb;
      NCCL averages, no divide kernel for bf16/fp32), and each all-gather is copied out into the parameters
      (`foreach_all_gather_copy_out`, split_with_sizes_copy: read and write wb).
    They run on the whole unsharded parameters of a layer, each time it is reduced or gathered (counted as
    the traffic is: `compose.dp_links`), on the SMs the compute uses; modelled as element-wise passes."""
    if Stack(stack) == Stack.FSDP:
        red = 2.0 * wb + (wb + gb if gb != wb else 0.0) + 2.0 * gb
        return red + 2.0 * gb, red, 0.0
    if Stack(stack) == Stack.TORCHTITAN:
        return 0.0, wb + gb, 2.0 * wb
    return 0.0, 0.0, 0.0


# MaxText remat policy (`optimizer.schema.run.RematPolicy`) -> the recompute modules it runs again
# (AI-Hypercomputer/maxtext layers/decoders.py `get_remat_policy`: the names each policy saves, of
# query/key/value/qkv_proj, context, out_proj, mlpwi, mlpwo). What a policy does not save, JAX runs again only
# as far as the backward needs it: the norms (their outputs feed the projections' weight gradients), the
# attention core when `context` is not saved, the MLP's input projections and activation (its output
# projection's output is not needed), and the output projection when `out_proj` is not saved (it rebuilds the
# residual the second norm reads). The policies that save every projection also run the MLP's activation
# function again (element-wise, its inputs saved); that is not counted.
REMAT_POLICY: dict[str, list[str] | None] = {
    "full": None,  # recompute: full
    "minimal": ["core_attn", "layernorm"],
    "minimal_flash": ["layernorm"],
    "save_dot_with_context_except_mlp": ["mlp_up", "layernorm"],
    "save_dot_except_mlpwi": ["core_attn", "mlp_up", "layernorm"],
    "save_dot_except_mlp": ["core_attn", "mlp_up", "layernorm"],
    "save_qkv_proj": ["core_attn", "attn_proj", "mlp_up", "layernorm"],
}

# recompute modules only JAX's rematerialisation runs (MaxText remat policies, `REMAT_POLICY`)
JAX_REMAT_MODULES = (RecomputeModule.MLP_UP, RecomputeModule.ATTN_PROJ)


def recompute_modules_unsupported(stack: Stack, modules) -> str | None:
    """The message for named recompute modules the stack does not run, JAX's (`JAX_REMAT_MODULES`) outside
    maxtext; None when it runs them all."""
    if Stack(stack) == Stack.MAXTEXT:
        return None
    jax = [RecomputeModule(m).value for m in modules or [] if RecomputeModule(m) in JAX_REMAT_MODULES]
    if not jax:
        return None
    return f"{jax} is not offered by stack {Stack(stack).value} (JAX rematerialisation's modules: maxtext)"


# knobs `by_layout` narrows, and the degree it reads
LAYOUT_KNOBS = {"zero": "pp", "sequence_parallel": "tp", "dp_overlap": "pp"}


def overlaps_pipelined_dp(stack: Stack) -> bool:
    """Whether the stack overlaps the data-parallel gradient reduction with backward when pp > 1. DeepSpeed's
    pipeline engine (megatron-deepspeed) reduces the gradients once, after the last micro-batch's backward
    (its TrainSchedule ends with ReduceTiedGrads, ReduceGrads, OptimizerStep)."""
    return Stack(stack) != Stack.MEGATRON_DEEPSPEED


def by_layout(stack: Stack, knob: str, pp: int, tp: int = 1) -> list | None:
    """The values of `knob` the stack offers in a layout of `pp` pipeline stages and `tp` tensor-parallel
    ranks, where they are narrower than `PROFILES` (None: as PROFILES). torchtitan's FSDP2 is ZeRO-1 in
    pipeline-parallel layouts (parameters kept gathered, gradients synchronised at the last micro-batch) and
    ZeRO-2/3 (or DDP) otherwise; its tensor parallelism always shards the norms' sequence
    (SequenceParallel); DeepSpeed's pipeline engine does not overlap the gradient reduction
    (`overlaps_pipelined_dp`)."""
    if Stack(stack) == Stack.TORCHTITAN and knob == "zero":
        return [0, 1] if pp > 1 else [0, 2, 3]
    if Stack(stack) == Stack.TORCHTITAN and knob == "sequence_parallel" and tp > 1:
        return [True]
    if knob == "dp_overlap" and pp > 1 and not overlaps_pipelined_dp(stack):
        return [False]
    return None


def fixed_by_stack(stack: Stack, precision=None) -> dict[str, object]:
    """knob -> the value the stack runs at `precision` (`FIXED_BY_STACK`, and its gradient accumulation).
    Megatron-DeepSpeed has no gradient-accumulation fusion. In bf16, DeepSpeed's BF16 optimizer casts every
    micro-batch's gradients to an FP32 temporary and adds them into its FP32 buffer after each backward
    (bf16_optimizer.py `update_hp_grads`, called by pipe/engine.py; microsoft/DeepSpeed@93e9307, BLOOM's):
    cast_add. In fp16 its FP16 optimizer leaves the accumulation to autograd, a 16-bit add into `.grad`
    (from the second micro-batch on; counted on every one): add."""
    fixed = dict(FIXED_BY_STACK.get(Stack(stack), {}))
    if Stack(stack) == Stack.MEGATRON_DEEPSPEED and precision is not None:
        by_precision = {Precision.BF16: GradAccumulation.CAST_ADD, Precision.FP16: GradAccumulation.ADD}
        scheme = by_precision.get(Precision(precision))
        if scheme is not None:
            fixed["grad_accumulation"] = scheme
    return fixed


def stack_defaults(stack: Stack, ex, precision=None):
    """`ex` with every knob it leaves at its default set to the stack's first offered value where the stack
    does not offer the default, and to the value the stack runs at `precision` (`fixed_by_stack`) where it
    fixes one (the same object when nothing changes); the set of written knobs is kept."""
    update = {}
    for knob, allowed in {"sequence_parallel": [False, True], **PROFILES[Stack(stack)]}.items():
        if knob == "precision" or knob in ex.model_fields_set:
            continue
        offered = by_layout(stack, knob, ex.pp, ex.tp) or allowed
        if getattr(ex, knob) not in offered:
            update[knob] = offered[0]
    for knob, value in fixed_by_stack(stack, precision).items():
        if knob not in ex.model_fields_set and getattr(ex, knob) != value:
            update[knob] = value
    if not update:
        return ex
    new = ex.model_copy(update=update)
    object.__setattr__(new, "__pydantic_fields_set__", set(ex.model_fields_set))
    return new


def layout_unsupported(stack: Stack, ex) -> list[tuple[str, str]]:
    """(knob, message) for each knob of the execution outside what the stack offers in its layout."""
    out = []
    for knob, degree in LAYOUT_KNOBS.items():
        allowed = by_layout(stack, knob, ex.pp, ex.tp)
        if allowed is not None and getattr(ex, knob) not in allowed:
            out.append(
                (
                    knob,
                    f"{getattr(ex, knob)} is not offered by stack {Stack(stack).value} with "
                    f"{degree}={getattr(ex, degree)} (it offers {allowed})",
                )
            )
    return out


def not_offered(stack: Stack, knob: str, value, precision=None) -> str:
    """The one message for a value (or list of values) of `knob` the stack does not offer (at `precision`)."""
    allowed = [getattr(a, "value", a) for a in profile(stack, precision)[knob]]
    v = [getattr(x, "value", x) for x in value] if isinstance(value, list) else getattr(value, "value", value)
    at = f" in {Precision(precision).value}" if knob in _at_precision(stack, precision) else ""
    return f"{v} is not offered by stack {Stack(stack).value}{at} (it offers {allowed})"


def restrict(stack: Stack, rules: dict, precision=None) -> dict:
    """The user's `search` rules ({knob: value | list | {min, max, in}}) narrowed to what the stack offers (at
    `precision`). An integer knob the user left open becomes {"in": offered} (a range, so `check` does not
    report it as a knob the file fixed); other knobs become the list offered; a single value the stack lacks
    leaves none."""
    out = dict(rules)
    for knob, allowed in profile(stack, precision).items():
        r = out.get(knob)
        if r is None and knob in ("precision", "schedule"):
            # the training precision, and the schedule at 1F1B (every stack runs it), stay fixed unless
            # `search` opens them (checked at load time)
            continue
        if r is None:
            out[knob] = {"in": list(allowed)} if knob in INT_KNOBS else list(allowed)
        elif isinstance(r, dict):
            inn = r.get("in")
            out[knob] = {**r, "in": [v for v in (allowed if inn is None else inn) if v in allowed]}
        elif isinstance(r, list):
            out[knob] = [v for v in r if v in allowed]
        elif r not in allowed:  # a single value (a file's is refused at load time: `unsupported`)
            out[knob] = []
    return out


def unsupported(stack: Stack, rules: dict, precision=None) -> list[tuple[str, str]]:
    """(knob, message) for each `search` rule that leaves no value the stack offers (at `precision`)."""
    errs = []
    for knob, allowed in profile(stack, precision).items():
        r = rules.get(knob)
        if isinstance(r, dict):  # a range: only its `in` list can miss the stack
            vals = r.get("in")
        else:
            vals = r if isinstance(r, list) or r is None else [r]
        if vals is not None and not any(v in allowed for v in vals):
            errs.append((knob, not_offered(stack, knob, r if not isinstance(r, dict) else vals, precision)))
    return errs


def written_unsupported(stack: Stack, ex, precision=None) -> list[tuple[str, str]]:
    """(knob, message) for each knob written in the execution (not left at its default) that the stack does
    not offer (at `precision`): a plan for that stack cannot use it."""
    allowed_by = profile(stack, precision)
    out = [
        (knob, not_offered(stack, knob, getattr(ex, knob), precision))
        for knob in sorted(ex.model_fields_set & set(allowed_by))
        if getattr(ex, knob) not in allowed_by[knob]
    ]
    jax = recompute_modules_unsupported(stack, ex.recompute_modules)
    if jax:
        out.append(("recompute_modules", jax))
    if ex.rank_order != RankOrder.TP_CP_DP_PP and Stack(stack) != Stack.MEGATRON_CORE:
        # data parallelism outermost only through Megatron's --use-tp-pp-dp-mapping (not a searched knob)
        out.append(
            (
                "rank_order",
                f"{ex.rank_order.value} is not offered by stack {Stack(stack).value} (it numbers its ranks "
                f"{RankOrder.TP_CP_DP_PP.value}; data parallelism outermost is Megatron's "
                "--use-tp-pp-dp-mapping)",
            )
        )
    zb = ex.schedule == Schedule.ZERO_BUBBLE
    if "schedule" in ex.model_fields_set and zb and ex.pp > 1 and ex.vpp < 2:
        out.append(
            (
                "schedule",
                "zb runs interleaved: PyTorch's InterleavedZeroBubble (torchtitan) needs at least 2 stages "
                "per rank (vpp >= 2)",
            )
        )
    v_shaped = ex.schedule in (Schedule.DUALPIPE_V, Schedule.ZERO_BUBBLE_V)
    if "schedule" in ex.model_fields_set and v_shaped and ex.pp > 1 and ex.vpp != 2:
        out.append(
            (
                "schedule",
                f'{ex.schedule.value} runs two stages per rank in a V (PyTorch\'s "v" style): vpp = 2',
            )
        )
    out += [
        (knob, f"{getattr(ex, knob)} is not what stack {Stack(stack).value} runs ({value})")
        for knob, value in fixed_by_stack(stack, precision).items()
        if knob in ex.model_fields_set and getattr(ex, knob) != value
    ]
    return out + [
        (k, m) for k, m in layout_unsupported(stack, ex) if k in ex.model_fields_set and k not in dict(out)
    ]


def precision_unsupported(stack: Stack, precision) -> str | None:
    """Why the stack cannot train in `precision` (None: it can)."""
    allowed = PROFILES[Stack(stack)].get("precision")
    return None if allowed is None or precision in allowed else not_offered(stack, "precision", precision)
