"""NeMo 2 recipe overrides of a plan: Python assignments to a NeMo 2 pretraining recipe (`recipe =
llm.<model>.pretrain_recipe(...)`), with the names of NeMo 2's MegatronStrategy, data module, model config
and optimizer config (NeMo Framework user guide, "Batching" and "Parallelisms" of NeMo 2.0)."""

from __future__ import annotations

from optimizer.model.hardware import QUANTIZED
from optimizer.report.export.megatron import LOW_PRECISION, pipeline_layout
from optimizer.rules.layout import dp_last


def _val(v):
    return repr(v.value if hasattr(v, "value") else v)


def overrides(problem, ex) -> list[tuple[str, object]]:
    """(attribute path under `recipe`, value) for the plan `ex` of `problem`."""
    tr, sysm = problem.training, problem.system
    gpus = ex.tp * ex.pp * ex.cp * (ex.dp or 1)
    # an uneven split or MTP slots: the chunks, in place of the slot flags
    layout = pipeline_layout(problem.llm, ex, problem.mtp_layers)
    out: list[tuple[str, object]] = [
        ("trainer.num_nodes", -(-gpus // sysm.gpus_per_node)),
        ("trainer.devices", min(sysm.gpus_per_node, gpus)),
        ("trainer.strategy.tensor_model_parallel_size", ex.tp),
        ("trainer.strategy.pipeline_model_parallel_size", ex.pp),
        ("trainer.strategy.virtual_pipeline_model_parallel_size", ex.vpp if ex.vpp > 1 else None),
        ("trainer.strategy.context_parallel_size", ex.cp),
        ("trainer.strategy.sequence_parallel", bool(ex.sequence_parallel)),
    ]
    if dp_last(ex):  # MegatronStrategy(use_tp_pp_dp_mapping=True)
        out.append(("trainer.strategy.use_tp_pp_dp_mapping", True))
    if ex.cp > 1:
        from optimizer.report.export.megatron import cp_comm_sizes

        kind, _ = cp_comm_sizes(problem, ex)
        out.append(("model.config.cp_comm_type", kind))
    if problem.llm.moe is not None:
        out += [
            ("trainer.strategy.expert_model_parallel_size", ex.ep),
            ("trainer.strategy.expert_tensor_parallel_size", ex.etp or ex.tp),
        ]
    if problem.mtp_layers:
        out.append(("model.config.mtp_num_layers", problem.mtp_layers))
    if layout is not None:
        # MegatronStrategy copies its own (None by default) onto the model config: set it on the strategy
        out.append(("trainer.strategy.pipeline_model_parallel_layout", layout))
    elif ex.pp > 1 and ex.pp_embedding_loss:
        out += [
            ("trainer.strategy.account_for_embedding_in_pipeline_split", True),
            ("trainer.strategy.account_for_loss_in_pipeline_split", True),
        ]
    out += [
        ("data.micro_batch_size", ex.micro_batch),
        ("data.global_batch_size", tr.global_batch),
        ("data.seq_length", problem.seq_len),
        ("model.config.seq_length", problem.seq_len),
    ]
    rec = ex.recompute.value
    out += [("model.config.recompute_granularity", None if rec == "none" else rec)]
    if rec == "full":
        out += [("model.config.recompute_method", "uniform"), ("model.config.recompute_num_layers", 1)]
    out += [
        ("optim.config.use_distributed_optimizer", ex.zero >= 1),
        ("trainer.strategy.ddp.overlap_grad_reduce", bool(ex.dp_overlap)),
        ("trainer.strategy.ddp.overlap_param_gather", bool(ex.dp_overlap and ex.zero >= 1)),
    ]
    if ex.moe_dispatcher.value == "allgather":
        out.append(("model.config.moe_token_dispatcher_type", "allgather"))
    if ex.moe_dispatcher.value == "flex":
        out += [
            ("model.config.moe_token_dispatcher_type", "flex"),
            ("model.config.moe_flex_dispatcher_backend", "deepep"),
        ]
    if ex.ep_overlap:
        out.append(("model.config.overlap_moe_expert_parallel_comm", True))
    if tr.precision in QUANTIZED:
        fmt, recipe = LOW_PRECISION[tr.precision]
        bits = (
            "fp4" if tr.precision.value == "nvfp4" else "fp8"
        )  # Megatron-Core TransformerConfig fp8 / fp4 fields
        out += [(f"trainer.plugins.{bits}", fmt), (f"trainer.plugins.{bits}_recipe", recipe)]
    return out


COMM_OVERLAP = "nemo.lightning.pytorch.callbacks.megatron_comm_overlap"


def _tp_comm_overlap(ex) -> list[str]:
    """Python lines turning on the plan's TP communication overlap: NeMo 2 sets it through
    MegatronCommOverlapCallback (it also initialises Transformer Engine's userbuffers, which a bare
    model.config.tp_comm_overlap leaves undone), appended as NeMo's performance recipes do. The callback also
    sets the data-parallel and interleaved-pipeline overlaps to defaults of its own, so the plan's are passed
    to it."""
    if ex.tp_overlap.value == "none":
        return []
    kw = {
        "tp_comm_overlap": True,
        "overlap_grad_reduce": bool(ex.dp_overlap),
        "overlap_param_gather": bool(ex.dp_overlap and ex.zero >= 1),
    }
    if ex.pp > 1 and ex.vpp > 1:
        kw["overlap_p2p_comm"] = bool(ex.pp_overlap)
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return [
        "# TP communication overlap (the plan's tp_overlap) through NeMo's comm-overlap callback:",
        "import nemo_run as run",
        f"from {COMM_OVERLAP} import MegatronCommOverlapCallback",
        "if not recipe.trainer.callbacks:",
        "    recipe.trainer.callbacks = []",
        f"recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, {args}))",
    ]


def notes(problem, ex) -> list[str]:
    out = []
    if ex.zero >= 2:
        out.append(f"ZeRO-{ex.zero}: NeMo 2 uses Megatron FSDP for it (trainer.strategy.fsdp='megatron')")
    if ex.weight_offload or ex.activation_offload or ex.optimizer_offload:
        out.append("offload: set the strategy's offload options (not emitted)")
    if ex.tp_overlap.value != "none" and not ex.sequence_parallel:
        out.append("TP overlap: NeMo overlaps TP communication only with sequence parallelism")
    if ex.cp > 1 and ex.cp_comm.value == "a2a_p2p":
        out.append(
            "a2a+p2p: NeMo 2's strategy does not pass hierarchical_context_parallel_sizes to "
            "initialize_model_parallel, so its two-level CP groups are not built: run it through Megatron-LM "
            "(--emit megatron) or Megatron-Bridge"
        )
    return out


def emit(problem, ex) -> str:
    """Python lines assigning the plan to `recipe` (a NeMo 2 pretraining recipe), then the TP-overlap
    callback (`_tp_comm_overlap`)."""
    head = [
        f"# NeMo 2 recipe overrides for {problem.name or problem.llm.name} (paraplan plan):",
        "# recipe = llm.<your model>.pretrain_recipe(...); then",
    ] + [f"# {n}" for n in notes(problem, ex)]
    body = [f"recipe.{k} = {_val(v)}" for k, v in overrides(problem, ex)] + _tp_comm_overlap(ex)
    return "\n".join(head + body) + "\n"
