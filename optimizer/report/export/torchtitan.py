"""torchtitan job config (TOML) of a plan: the [parallelism], [training], [activation_checkpoint] and
[compile] tables of torchtitan's JobConfig (`torchtitan/config/job_config.py` of its TOML releases, v0.2),
with FSDP as data_parallel_shard_degree when ZeRO >= 1."""

from __future__ import annotations

from optimizer.model.compose import layout_slack

SCHEDULES = {
    "1f1b": "1F1B",
    "gpipe": "GPipe",
    "zb": "InterleavedZeroBubble",
    "dualpipev": "DualPipeV",
    "zbv": "ZBVZeroBubble",
}
SPLIT_BACKWARD = ("zb", "dualpipev", "zbv")  # schedules PyTorch runs with split input/weight backward


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


def _pipeline(llm, ex, notes: list[str]) -> dict:
    """The pipeline split: schedule, micro-batch size and pp*vpp stages of equal layer counts.

    torchtitan counts the embedding and the output as layer slots of the first and last stage
    (`pipeline_parallel_first/last_stage_less_layers`, 1 each by default) and builds
    ceil(slots / pipeline_parallel_layers_per_stage) stages; without layers_per_stage an interleaved schedule
    gets 2 stages per rank whatever vpp is. Both are written so that it builds the modelled pp*vpp stages,
    the embedding and loss taking a slot each only where the plan counted them (pp_embedding_loss)."""
    w = 1 if ex.pp_embedding_loss else 0
    slots, stages = llm.layers + 2 * w, ex.pp * ex.vpp
    per_stage = -(-slots // stages)
    last_less = w
    if ex.pp_uneven:  # the model's custom layout: the last stage holds the padding fewer (`_Shape.slack`)
        slack = int(layout_slack(slots, ex.pp, ex.vpp, w))
        last_less = w + min(slack, per_stage - w)
        if slack > per_stage - w:
            notes.append(
                f"the last stage holds {slack} layers fewer in the modelled split, more than its last chunk: "
                "set module_fqns_per_model_part for it"
            )
    par = {
        "pipeline_parallel_schedule": (
            "Interleaved1F1B"
            if ex.vpp > 1 and ex.schedule.value not in SPLIT_BACKWARD
            else SCHEDULES[ex.schedule.value]
        ),
        "pipeline_parallel_microbatch_size": ex.micro_batch,
        "pipeline_parallel_first_stage_less_layers": w,
        "pipeline_parallel_last_stage_less_layers": last_less,
        "pipeline_parallel_layers_per_stage": per_stage,
    }
    if -(-(slots - w + last_less) // per_stage) != stages:
        notes.append(
            f"{slots} layer slots do not split into {stages} stages of at most {per_stage}: set "
            "module_fqns_per_model_part for the modelled split"
        )
    return par


def _parallelism(problem, ex, notes: list[str]) -> dict:
    """Degrees of every axis (FSDP sharding over the data-parallel ranks from ZeRO-1 on, resharding after
    forward at ZeRO-3), async TP, the pipeline split (`_pipeline`) and the expert degrees."""
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
        par |= _pipeline(problem.llm, ex, notes)
    if problem.llm.moe is not None:
        par["expert_parallel_degree"] = ex.ep
        par["expert_tensor_parallel_degree"] = ex.etp or ex.tp
    return par


def _activation_checkpoint(ex) -> dict:
    """Recomputation: `selective` is torchtitan's per-op SAC (selective_ac_option "op"), the one priced;
    torchtitan's selective default ("2") would checkpoint every second whole layer instead."""
    ac = {"mode": ex.recompute.value}
    if ex.recompute.value == "selective":
        ac["selective_ac_option"] = "op"
    return ac


def _compile(ex, notes: list[str]) -> dict:
    """torch.compile of the model (fused element-wise kernels, and what async TP needs: torchtitan's async TP
    has no effect without a compiled model) and of the loss (the fused loss)."""
    async_tp = ex.tp_overlap.value != "none"
    components = (["model"] if ex.fused_layers or async_tp else []) + (["loss"] if ex.fused_loss else [])
    if async_tp and not ex.fused_layers:
        notes.append(
            "async TP needs the model compiled: compile also fuses the element-wise ops the plan priced "
            "unfused"
        )
    if ex.pp > 1 and ex.schedule.value in SPLIT_BACKWARD and "model" in components:
        notes.append(
            f"PyTorch's {SCHEDULES[ex.schedule.value]} schedule refuses compiled stage modules (its split "
            "backward, _check_torch_compile_compatibility): run the model uncompiled, which unfuses the "
            "element-wise ops the plan priced fused"
        )
    return {"enable": bool(components), "components": components} if components else {"enable": False}


def _training(problem, ex) -> dict:
    """Batch sizes per step and per data-parallel rank, sequence length and parameter precision."""
    tr = problem.training
    return {
        "local_batch_size": tr.global_batch // (ex.dp or 1),  # sequences per data-parallel rank per step
        "global_batch_size": tr.global_batch,
        "seq_len": problem.seq_len,
        "mixed_precision_param": "bfloat16" if tr.precision.value != "fp16" else "float16",
    }


def tables(problem, ex, notes: list[str] | None = None) -> dict[str, dict]:
    """The job-config tables of the plan ``ex``; ``notes`` gathers what the tables cannot say."""
    notes = [] if notes is None else notes
    out = {
        "parallelism": _parallelism(problem, ex, notes),
        "training": _training(problem, ex),
        "activation_checkpoint": _activation_checkpoint(ex),
        "compile": _compile(ex, notes),
    }
    if problem.training.precision.value in ("fp8", "fp8_current"):  # torchao Float8: tensorwise scaling
        out["float8"] = {"enable_fsdp_float8_all_gather": ex.zero >= 1, "recipe_name": "tensorwise"}
    return out


def emit(problem, ex) -> str:
    """TOML tables to merge into the model's torchtitan train config, notes as comments above them."""
    notes: list[str] = []
    tabs = tables(problem, ex, notes)
    lines = [
        f"# torchtitan job config for {problem.name or problem.llm.name} (paraplan plan); merge into the "
        "model's train config"
    ] + [f"# {n}" for n in notes]
    for name, tab in tabs.items():
        lines += ["", f"[{name}]"] + [f"{k} = {_toml(v)}" for k, v in tab.items()]
    return "\n".join(lines) + "\n"
