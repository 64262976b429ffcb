"""torchtitan job config (TOML) of a plan: the [parallelism], [training] and [activation_checkpoint] tables
of torchtitan's JobConfig (`torchtitan/config`), with FSDP as data_parallel_shard_degree when ZeRO >= 1."""

from __future__ import annotations

SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe"}


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    return str(v)


def tables(problem, ex) -> dict[str, dict]:
    tr = problem.training
    dp = ex.dp or 1
    shard = dp if ex.zero >= 1 else 1  # FSDP (ZeRO-1/2/3 all map onto FSDP2's sharding)
    par = {
        "data_parallel_replicate_degree": dp // shard,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": "always" if ex.zero >= 3 else "never",
        "tensor_parallel_degree": ex.tp,
        "context_parallel_degree": ex.cp,
        "pipeline_parallel_degree": ex.pp,
        "enable_async_tensor_parallel": ex.tp_overlap.value != "none",
    }
    if ex.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if ex.vpp > 1 else SCHEDULES[ex.schedule.value]
        par["pipeline_parallel_microbatch_size"] = ex.micro_batch
    if problem.llm.moe is not None:
        par["expert_parallel_degree"] = ex.ep
        par["expert_tensor_parallel_degree"] = ex.etp or ex.tp
    local = tr.global_batch // dp  # sequences per data-parallel rank per step
    training = {
        "local_batch_size": local,
        "global_batch_size": tr.global_batch,
        "seq_len": problem.seq_len,
        "mixed_precision_param": "bfloat16" if tr.precision.value != "fp16" else "float16",
    }
    ac = {"mode": ex.recompute.value}
    out = {"parallelism": par, "training": training, "activation_checkpoint": ac}
    if tr.precision.value in ("fp8", "fp8_current"):  # torchao Float8 training: tensorwise (current) scaling
        out["float8"] = {"enable_fsdp_float8_all_gather": ex.zero >= 1, "recipe_name": "tensorwise"}
    return out


def emit(problem, ex) -> str:
    lines = [
        f"# torchtitan job config for {problem.name or problem.llm.name} (paraplan plan); merge into the "
        "model's train config"
    ]
    for name, tab in tables(problem, ex).items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in tab.items()]
    return "\n".join(lines) + "\n"
