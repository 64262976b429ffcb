"""MaxText configuration overrides of a plan: `key=value` arguments after `configs/base.yml`, as MaxText's
trainer takes them (AI-Hypercomputer/maxtext configs/base.yml). The mesh axes within a node (`ici_*`) and
across nodes (`dcn_*`), the model's dimensions, the batch per device with gradient accumulation or pipeline
micro-batches, the remat policy (`optimizer.schema.stack.REMAT_POLICY` read backwards), quantization and
attention.
The fsdp axis is ZeRO-3 and the data axis replication (`optimizer.schema.stack`, maxtext)."""

from __future__ import annotations

from math import gcd

from optimizer.schema.stack import REMAT_POLICY


def _split(degrees: dict[str, int], per_node: int) -> tuple[dict[str, int], dict[str, int]]:
    """(ici, dcn) degree of each mesh axis: the axes fill a node in the order given (tensor innermost), each
    taking the part of its degree that divides what is left of the node; the rest of it crosses nodes."""
    left, ici, dcn = per_node, {}, {}
    for axis, d in degrees.items():
        ici[axis] = gcd(d, left)
        dcn[axis] = d // ici[axis]
        left //= ici[axis]
    return ici, dcn


def remat_policy(ex) -> tuple[str, str | None]:
    """The remat policy of the plan's recompute, and a note where none runs exactly what the plan does: full
    recompute is `full`; a selective one the policy whose modules `REMAT_POLICY` lists; no recompute is
    `minimal_flash` (every projection and the attention output saved; the norms run again)."""
    if ex.recompute.value == "full":
        return "full", None
    if ex.recompute.value == "none":
        return "minimal_flash", "no remat policy saves everything: minimal_flash runs the norms again"
    mods = {m.value for m in ex.recompute_modules or []} or {"core_attn"}
    for name, listed in REMAT_POLICY.items():
        if listed is not None and set(listed) == mods:
            return name, None
    return "minimal", f"no remat policy runs exactly {sorted(mods)} again: minimal (attention core and norms)"


def overrides(problem, ex) -> tuple[dict[str, object], list[str]]:
    """(the overrides, notes on what they leave to the user)."""
    llm, tr, notes = problem.llm, problem.training, []
    n = problem.num_gpus
    per_node = min(problem.system.gpus_per_node, n)
    data = "fsdp" if ex.zero == 3 else "data"
    ep = ex.ep if llm.moe is not None else 1
    # sequence parallelism: MaxText's tensor_sequence axis shards the heads and the MLP as tensor does, and
    # the norms' sequence too
    tensor = "tensor_sequence" if ex.sequence_parallel and ex.tp > 1 else "tensor"
    degrees = {tensor: ex.tp, "context": ex.cp, "expert": ep, data: ex.dp // ep, "pipeline": ex.pp}
    ici, dcn = _split(degrees, per_node)
    n_mb = tr.global_batch // (ex.micro_batch * ex.dp)
    out: dict[str, object] = {
        "base_emb_dim": llm.hidden,
        "base_mlp_dim": llm.ffn,
        "base_num_decoder_layers": llm.layers,
        "base_num_query_heads": llm.heads,
        "base_num_kv_heads": llm.kv,
        "head_dim": llm.dhead,
        "vocab_size": llm.vocab,
        "max_target_length": problem.seq_len,
        "hardware": "gpu_multiprocess" if n > per_node else "gpu",
        "scan_layers": True,
    }
    for axis in degrees:
        out[f"ici_{axis}_parallelism"] = ici[axis]
        out[f"dcn_{axis}_parallelism"] = dcn[axis]
    if ex.pp > 1:  # the whole batch each step, split into the pipeline's micro-batches
        out["per_device_batch_size"] = tr.global_batch / n
        out["num_pipeline_microbatches"] = n_mb
        # one repeat: each stage holds its layers once (more repeats would run a circular pipeline)
        out["num_layers_per_pipeline_stage"] = -(-llm.layers // ex.pp)
        if llm.layers % ex.pp:
            notes.append(f"{llm.layers} layers do not split evenly over {ex.pp} stages")
    else:
        out["per_device_batch_size"] = ex.micro_batch * ex.dp / n
        out["gradient_accumulation_steps"] = n_mb
    policy, note = remat_policy(ex)
    out["remat_policy"] = policy
    if note:
        notes.append(note)
    out["attention"] = "dot_product" if ex.attention.value == "standard" else "cudnn_flash_te"
    out["dtype"] = "float32" if tr.precision.value == "fp32" else "bfloat16"
    if tr.precision.value == "fp8":
        out["quantization"] = "fp8"
    elif tr.precision.value not in ("bf16", "fp32"):
        notes.append(f"precision {tr.precision.value}: MaxText's GPU quantization is fp8 (delayed scaling)")
    if ex.tp_overlap.value != "none" and ex.tp > 1:
        notes.append("collective matmul: XLA_FLAGS=--xla_gpu_multi_streamed_windowed_einsum=true")
    if ep > 1:
        notes.append(f"expert parallelism {ep} is taken from the data-parallel ranks ({data} x expert = dp)")
    if ex.zero == 0 and (ex.cp > 1 or ep > 1):
        notes.append(
            "MaxText shards the weights over its context and expert axes too (its embed rule); the plan "
            "counted them replicated"
        )
    if llm.moe is not None:
        notes.append(
            f"MoE: set num_experts={llm.moe.experts}, num_experts_per_tok={llm.moe.top_k} and "
            f"base_moe_mlp_dim={llm.moe.expert_ffn} (with a model_name, override_model_config=true lets "
            "these keys override it)"
        )
    return out, notes


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):  # exact: MaxText truncates per-device batch x devices to an integer
        return repr(v)
    return str(v)


def emit(problem, ex) -> str:
    out, notes = overrides(problem, ex)
    head = "".join(f"# {x}\n" for x in notes)
    return head + "".join(f"{k}={_value(v)}\n" for k, v in out.items())
