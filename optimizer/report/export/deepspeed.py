"""DeepSpeed config (JSON) of a plan: batch sizes, precision, ZeRO stage with offload and overlap, activation
checkpointing (DeepSpeed config reference). Tensor, pipeline and context parallelism are the launcher's
(Megatron-DeepSpeed arguments), not this file's."""

from __future__ import annotations

import json


def config(problem, ex) -> dict:
    tr = problem.training
    dp = ex.dp or 1
    gas = tr.global_batch // (dp * ex.micro_batch)
    prec = tr.precision.value
    zero: dict = {"stage": int(ex.zero), "overlap_comm": bool(ex.dp_overlap), "contiguous_gradients": True}
    if ex.optimizer_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ex.weight_offload and ex.zero >= 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    out = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": ex.micro_batch,
        "gradient_accumulation_steps": gas,
        "bf16": {"enabled": prec != "fp16"},
        "fp16": {"enabled": prec == "fp16"},
        "zero_optimization": zero,
    }
    if ex.recompute.value != "none":
        out["activation_checkpointing"] = {
            "partition_activations": bool(ex.sequence_parallel),
            "contiguous_memory_optimization": True,
            "cpu_checkpointing": bool(ex.activation_offload),
        }
    return out


def emit(problem, ex) -> str:
    return json.dumps(config(problem, ex), indent=2) + "\n"
