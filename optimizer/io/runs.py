"""Published training runs (the schema of shared/calibration/README.md) mapped onto problems.

Each run becomes a `Problem` whose execution is the run's own configuration. Knobs the run does not
state are resolved by stated, documented assumptions, reported per run:

- unknown ``micro_batch``, ``recompute``, ``sequence_parallel``, ``optimizer_sharding``: the model
  chooses them, within the run's fixed tp/pp/dp/cp, as the fastest setting that fits in memory (the
  published run was tuned; this is what `paraplan solve` would do); an unknown ``vpp`` is 1, since
  interleaving is an opt-in schedule that a paper would state, unless the run states an interleaved
  schedule without its depth (``software.pp_interleaved``): the model then chooses the depth as well;
- the choice is limited to what the software of the run's time offered, read from its typed
  ``software.year`` (`FEATURE_YEAR`: sequence parallelism and selective recompute from 2022, the
  distributed optimizer, FlashAttention and communication overlap from 2023; null: current software);
  knobs a run does not state follow the same rule: runs of software up to 2022 used Megatron-LM of that
  time (materialised attention, dropout 0.1, no TP-communication overlap, gradient all-reduce not
  overlapped); later runs use FlashAttention, no dropout, and may overlap communication (the model
  chooses). The typed facts of ``software:`` (`optimizer.schema.run.RunSoftware`: attention kernel, eager,
  fused loss, FP8 recipe, CUDA graphs, activation offload, MoE dispatcher / overlap / fused MLP,
  recompute modules, TP and DP overlap, gradient-reduce dtype) win over these defaults; the stack is
  the framework's (`FRAMEWORK_STACK`, null: megatron-core);
- ``model.architecture`` (`optimizer.schema.run.RunArchitecture`) gives MLA, the dense layers' MLP of an
  MoE, a sliding window, attention sinks and a clamped GLU; ``notes`` are prose and change nothing;
- ``precision: null`` (16-bit, fp16 or bf16 not stated) is fp16 for runs published up to 2022 (the
  Megatron GPT recipes of the time), bf16 after; both have the same peak;
- gradients are accumulated and reduced in fp32 with bf16 (Megatron forces main_grad fp32 for bf16;
  FSDP's reduce dtype), in fp16 with fp16 (Megatron's default without
  --accumulate-allreduce-grads-in-fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from optimizer.errors import ProblemError
from optimizer.io.loader import Sourced, available, find_in_library, read_yaml, validate_model
from optimizer.schema import LLM, MLA, Execution, MoE, Options, Problem, System, Training
from optimizer.schema.common import GradAccumulation, RecomputeModule
from optimizer.schema.llm import SlidingWindow
from optimizer.schema.stack import REMAT_POLICY, fixed_by_stack

MAX_FREE_MICRO_BATCH = 4  # an unstated micro-batch is chosen among 1..4 (Megatron recipes use 1-4)
ZERO = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
# First year a feature was in the frameworks' public releases (Megatron-LM: Korthikanti 2022,
# Megatron-Core 2023; torchtitan: GQA passed to SDPA without repeating K/V, pytorch/torchtitan#2259, 2026-01;
# Megatron-Core 0.13, 2025-07: MoE probabilities applied in the experts' activation, "memory efficient token
# permutation", so a 2025 run counts as having it).
FEATURE_YEAR = {
    "sequence_parallel": 2022,
    "selective_recompute": 2022,
    "distributed_optimizer": 2023,
    "flash_attention": 2023,
    "tp_overlap": 2023,
    "dp_overlap": 2023,
    "pp_overlap": 2023,
    "gqa_without_kv_repeat": 2026,
    "moe_probs_in_activation": 2025,
    # Megatron-LM's gradient_accumulation_fusion: merged 2022-02 for FP32 gradient accumulation only, for FP16
    # from 2022-09 (NVIDIA/Megatron-LM 83b1e42, 07916bf)
    "grad_accumulation_fusion": 2022,
    "grad_accumulation_fusion_fp16": 2023,
}


def _has(year: int | None, feature: str) -> bool:
    return year is None or year >= FEATURE_YEAR[feature]


@dataclass
class Mapped:
    """A run as a problem, the knob values left to choose, and what was assumed."""

    run: dict
    problem: Problem | None = None
    free: dict[str, list] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)
    skip: str | None = None


_LIBRARY_DOCS: dict[str, tuple[tuple, list]] = {}  # kind -> (its files' (path, mtime, size), [(path, data)])


def _library_docs(kind: str) -> list[tuple[Path, Any]]:
    """(path, parsed YAML) of every library file of `kind`, read once per state of those files (one added,
    removed or changed: all read again); a file that does not read is passed over (loading it by name says
    why). `validate` maps every run through what is derived from them."""
    paths = [p for p in (find_in_library(kind, n) for n in available(kind)) if p is not None]
    key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    hit = _LIBRARY_DOCS.get(kind)
    if hit is None or hit[0] != key:
        docs = []
        for p in paths:
            try:
                docs.append((p, read_yaml(p).data))
            except ProblemError:
                continue
        _LIBRARY_DOCS[kind] = hit = (key, docs)
    return hit[1]


def gpu_systems() -> dict[str, str]:
    """Calibration-schema GPU name -> system file name, read from the ``gpu:`` field of every system file
    in the library (first file, in name order, wins when several share a GPU)."""
    out: dict[str, str] = {}
    for p, doc in _library_docs("system"):
        gpu = doc.get("gpu") if isinstance(doc, dict) else None
        if isinstance(gpu, str):
            out.setdefault(gpu, p.stem)
    return out


def software(run: dict) -> dict:
    """The run's typed software facts (`optimizer.schema.run.RunSoftware`; empty when not stated)."""
    return run.get("software") or {}


def architecture(run: dict) -> dict:
    """The run's typed architecture facts (`optimizer.schema.run.RunArchitecture`; empty when none)."""
    return run["model"].get("architecture") or {}


def run_year(run: dict) -> int | None:
    """The year of the software the run used (``software.year``; None: current software)."""
    return software(run).get("year")


_SHAPE = ("hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "mlp")


def _moe_shape(m: dict) -> tuple:
    mo = m.get("moe") if isinstance(m.get("moe"), dict) else {}
    return tuple(m.get(f) for f in _SHAPE) + tuple(mo.get(f) for f in ("experts", "top_k", "expert_ffn"))


def _library_expert_bias(m: dict) -> bool:
    """Whether a library model of the record's shape (`problems/llms`: hidden, ffn, layers, heads, K/V heads,
    head size, vocabulary, MLP kind and its experts) has biased experts: the run schema has no field for them
    and the records do not state them (GPT-OSS's name its QKV bias only; its checkpoint and Megatron-Bridge's
    provider, add_bias_linear=True, give every expert linear one)."""
    return any(
        isinstance(doc, dict)
        and isinstance(doc.get("moe"), dict)
        and doc["moe"].get("expert_bias")
        and _moe_shape(doc) == _moe_shape(m)
        for _, doc in _library_docs("llm")
    )


def target_step_time(run: dict) -> tuple[float | None, str | None]:
    """The README's evaluation-target rule; returns (seconds, how it was obtained)."""
    m = run["measured"]
    if m.get("step_time_s") is not None:
        return float(m["step_time_s"]), None
    if m.get("derived_step_time_s") is not None:
        return float(m["derived_step_time_s"]), None
    tps = m.get("tokens_per_s_per_gpu")
    if tps:
        p = run["parallel"]
        t = p["global_batch"] * run["model"]["seq_len"] / (tps * run["hardware"]["num_gpus"])
        return t, "target step time = global_batch*seq_len/(tokens_per_s_per_gpu*num_gpus)"
    return None, None


def convention_flops(run: dict, llm: LLM) -> tuple[float, str]:
    """Model FLOPs of one step in the run's own FLOP convention (for MFU / TFLOP/s targets)."""
    conv = f"{run['measured'].get('tflops_convention') or ''}"
    p = run["parallel"]
    B, s, L, h, V = p["global_batch"], llm.seq_len, llm.layers, llm.hidden, llm.vocab
    if "eq.3" in conv.lower():  # Narayanan 2021 Eq. 3, with recompute
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), "Narayanan 2021 Eq. 3"
    if "full-mha" in conv.lower():  # MHA and a 4h MLP regardless of the real shape
        return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)), "full-MHA 4h-MLP formula"
    from optimizer.model.params import model_flops_per_token

    return model_flops_per_token(llm, s) * B * s, "6N + attention (PaLM App. B)"


def run_target(run: dict, problem: Problem) -> tuple[float | None, str | None]:
    """Step-time target of a run and how it was obtained: the README's rule, else converted from MFU or
    TFLOP/s per GPU with the run's own FLOP convention (and, for MFU, the system's peak)."""
    target, how = target_step_time(run)
    meas = run["measured"]
    if target is not None or not (meas.get("mfu") or meas.get("tflops_per_gpu")):
        return target, how
    flops, conv = convention_flops(run, problem.llm)
    n = run["hardware"]["num_gpus"]
    if meas.get("mfu"):
        peak = problem.system.peak_tflops(problem.training.precision) * 1e12
        return (
            flops / (n * peak * meas["mfu"]),
            f"target from MFU {meas['mfu']} with the run's convention ({conv}) and {peak / 1e12:g} TF peak",
        )
    return (
        flops / (n * meas["tflops_per_gpu"] * 1e12),
        f"target from {meas['tflops_per_gpu']} TFLOP/s per GPU ({conv})",
    )


def _llm_of(run: dict, year: int | None) -> LLM:
    m = run["model"]
    old = year is not None and year <= 2022
    moe = None
    if m.get("moe"):
        mo = m["moe"]
        moe = MoE(
            experts=mo["experts"],
            top_k=mo["top_k"],
            expert_ffn=mo["expert_ffn"],
            shared_experts=mo.get("shared_experts") or 0,
            moe_layers=mo.get("moe_layers"),
        )
    arch = architecture(run)
    mla, head_dim, ffn = None, m.get("head_dim"), m["ffn"] or 4 * m["hidden"]
    x = arch.get("mla")
    if x:
        mla = MLA(
            q_lora_rank=x["q_lora_rank"],
            kv_lora_rank=x["kv_lora_rank"],
            qk_rope_head_dim=x["qk_rope_head_dim"],
            v_head_dim=x["v_head_dim"],
        )
        head_dim = x["qk_nope_head_dim"]
    if moe is not None and arch.get("dense_ffn"):
        ffn = arch["dense_ffn"]
    win = arch.get("sliding_window")
    window = SlidingWindow(tokens=win["tokens"], layers=win.get("layers")) if win else None
    clamp = arch.get("activation_clamp")
    if moe is not None and _library_expert_bias(m):
        moe = moe.model_copy(update={"expert_bias": True})
    return LLM(
        name=run["id"],
        hidden=m["hidden"],
        ffn=ffn,
        layers=m["layers"],
        heads=m["heads"] or max(1, m["hidden"] // 128),
        kv_heads=m.get("kv_heads"),
        head_dim=head_dim,
        seq_len=m["seq_len"],
        vocab=m["vocab"] or 51200,
        mlp=m.get("mlp") or "gelu",
        bias=(m.get("mlp") or "gelu") == "gelu",
        dropout=old,
        tied_embeddings=old,
        moe=moe,
        mla=mla,
        sliding_window=window,
        attention_sinks=bool(arch.get("attention_sinks")),
        activation_clamp=float(clamp) if clamp is not None else None,
        mtp_layers=arch.get("mtp_layers") or 0,
    )


# framework (`optimizer.schema.run.Framework`) -> the stack profile it is planned as
# (`optimizer.schema.stack`):
# the Megatron family is megatron-core (Megatron-DeepSpeed has its own profile: Megatron's TP, DeepSpeed's
# pipeline engine and ZeRO-1), llm-foundry runs PyTorch FSDP through Composer, and Meta's Llama 3 stack is
# megatron-core: its paper (arXiv:2407.21783, Sec. 3.3.2) builds tensor parallelism on Megatron's with
# sequence parallelism (Shoeybi 2019, Korthikanti 2023: the sharded norm output is kept and gathered again
# in backward) and the interleaved pipeline on Narayanan 2021, with PyTorch FSDP for data parallelism
FRAMEWORK_STACK = {
    "megatron-lm": "megatron-core",
    "megatron-core": "megatron-core",
    "nemo": "megatron-core",
    "megatron-bridge": "megatron-core",
    "megatron-deepspeed": "megatron-deepspeed",
    "deepspeed": "deepspeed",
    "torchtitan": "torchtitan",
    "fsdp": "fsdp",
    "llm-foundry": "fsdp",
    "maxtext": "maxtext",
    "meta-4d": "megatron-core",
}


def stack_of(run: dict) -> str:
    """The run's software stack: its ``software.framework``'s (`FRAMEWORK_STACK`), megatron-core when not
    stated."""
    return FRAMEWORK_STACK[software(run).get("framework") or "megatron-core"]


def _system_of(run: dict, systems: dict[str, System] | None, out: Mapped) -> System | None:
    """The library system of the run's GPU (`gpu_systems`), from `systems` when it holds it; None (and `out`
    skipped) when no system file names that GPU. A node size other than the system's is noted."""
    hwr = run["hardware"]
    gpu = hwr["gpu"]
    known = gpu_systems()
    sysname = known.get(gpu)
    if sysname is None:
        out.skip = f"no system file for gpu '{gpu}' (known: {', '.join(sorted(known))})"
        return None
    if systems is not None and sysname in systems:
        system = systems[sysname]
    else:
        doc = read_yaml(find_in_library("system", sysname))
        system = validate_model(System, doc)
    if hwr["gpus_per_node"] != system.gpus_per_node:
        out.assumptions.append(
            f"node of {hwr['gpus_per_node']} GPUs modelled as {system.name} ({system.gpus_per_node} per node)"
        )
    return system


def _era(year: int | None, sw: dict, out: Mapped) -> bool:
    """Whether the run used FlashAttention (``software.attention``, else the software's year, `FEATURE_YEAR`),
    noting it with the era's dropout (0.1 up to 2022, none after)."""
    old = year is not None and year <= 2022
    era = f"published {year}" if year else "no software year stated"
    stated = sw.get("attention")
    flash = stated != "standard" if stated else _has(year, "flash_attention")
    out.assumptions.append(
        f"{era}: {'FlashAttention' if flash else 'materialised (standard) attention'}, "
        f"{'dropout 0.1' if old else 'no dropout'}"
    )
    return flash


def _model_of(run: dict, year: int | None, out: Mapped) -> LLM:
    """The run's LLM (`_llm_of`), noting the features read from its architecture facts or the library; a
    shape the LLM
    schema rejects is a ParaplanError naming the run."""
    try:
        llm = _llm_of(run, year)
    except (ValidationError, ValueError) as e:  # a shape the LLM schema rejects (heads vs hidden, ...)
        from optimizer.errors import ParaplanError

        raise ParaplanError(
            f"run {run['id']}: its model is not a valid LLM: {str(e).splitlines()[-1].strip()}"
        ) from None
    if llm.sliding_window is not None:
        w = llm.sliding_window
        out.assumptions.append(
            f"sliding-window attention of {w.tokens} tokens in {w.layers or llm.layers} of "
            f"{llm.layers} layers (model.architecture)"
        )
    if llm.attention_sinks:
        out.assumptions.append(
            "learned attention sinks: the fused attention backward's per-row sink gradient "
            "(model.architecture)"
        )
    if llm.activation_clamp is not None:
        out.assumptions.append(f"the GLU's halves clamped at {llm.activation_clamp:g} (model.architecture)")
    if llm.mtp_layers:
        out.assumptions.append(
            f"{llm.mtp_layers} multi-token prediction module(s) on the last stage (model.architecture)"
        )
    if llm.moe is not None and llm.moe.expert_bias:
        out.assumptions.append(
            "biased experts (the library model of this shape; the run schema has no field for them)"
        )
    return llm


# FP8 recipe of a framework when a run states none (Transformer Engine's stacks: delayed scaling, the
# model's `fp8`): torchtitan's float8 is torchao's, whose default recipe is "tensorwise" with dynamic
# scaling, i.e. per-tensor current scaling (torchtitan docs/float8.md; torchao Float8LinearConfig default)
FP8_RECIPE_DEFAULT = {"torchtitan": "current"}


def _precision_of(run: dict, year: int | None, sw: dict, out: Mapped) -> str:
    """The training precision: the run's, 16-bit null as fp16 up to 2022 and bf16 after; FP8 with
    per-tensor current scaling when ``software.fp8_recipe`` is current (Transformer Engine's
    Float8CurrentScaling: an amax pass before each cast)."""
    prec = run["parallel"].get("precision")
    if prec is None:
        prec = "fp16" if year is not None and year <= 2022 else "bf16"
        out.assumptions.append(f"precision null (16-bit): {prec}")
    recipe = sw.get("fp8_recipe") or FP8_RECIPE_DEFAULT.get(sw.get("framework") or "")
    if prec == "fp8" and recipe == "current":
        prec = "fp8_current"
        why = "software.fp8_recipe" if sw.get("fp8_recipe") else f"{sw.get('framework')}'s default recipe"
        out.assumptions.append(f"FP8 per-tensor current scaling ({why}): fp8_current")
    return prec


def _attention(stack: str, sw: dict, flash: bool, out: Mapped) -> str:
    """The attention kernel: ``software.attention`` as stated (cuDNN and FlashAttention-3 modelled as `flash`,
    the GPU's best fused kernel); unstated, materialised (`standard`) or FlashAttention by the era, and under
    torchtitan FlashAttention-2 (PyTorch SDPA's flash backend; cuDNN attention is its default only from
    PyTorch 2.9)."""
    stated = sw.get("attention")
    if stated:
        attention = {"cudnn": "flash", "fa3": "flash"}.get(stated, stated)
        out.assumptions.append(f"attention kernel {stated} (software.attention): {attention}")
        return attention
    if flash and stack == "torchtitan":
        out.assumptions.append(
            "FlashAttention-2 kernels: torchtitan runs PyTorch SDPA, whose flash backend is FlashAttention-2 "
            "(cuDNN attention is the default only from PyTorch 2.9); a stated software.attention wins"
        )
        return "flash2"
    return "flash" if flash else "standard"


def _kernel_knobs(
    run: dict, llm: LLM, year: int | None, stack: str, sw: dict, flash: bool, out: Mapped
) -> dict[str, Any]:
    """The fixed parallel degrees and kernel knobs: attention (`_attention`), fused element-wise kernels
    unless ``software.eager``, an unfused fp32 loss when ``software.fused_loss`` is false, torchtitan's K/V
    repeat for GQA before `FEATURE_YEAR['gqa_without_kv_repeat']`, and Megatron-Core's MoE combine weighted by
    the probabilities before `FEATURE_YEAR['moe_probs_in_activation']`."""
    par = run["parallel"]
    eager = bool(sw.get("eager"))
    if eager:
        out.assumptions.append("eager mode (software.eager): unfused element-wise kernels")
    attention = _attention(stack, sw, flash, out)
    fixed: dict[str, Any] = dict(
        tp=par["tp"],
        pp=par["pp"],
        dp=par["dp"],
        cp=par["cp"],
        ep=par["ep"],
        attention=attention,
        fused_layers=not eager,
    )
    if sw.get("fused_loss") is False:
        fixed["fused_loss"] = False
        out.assumptions.append(
            "loss: cross_entropy on an fp32 upcast of the logits, not compiled (software.fused_loss)"
        )
    if stack == "torchtitan" and llm.kv < llm.heads and not _has(year, "gqa_without_kv_repeat"):
        fixed["kv_repeat"] = True
        out.assumptions.append(
            "K/V heads repeated to the query heads before SDPA (torchtitan's repeat_kv until "
            "'GQA without kv repeats', pytorch/torchtitan#2259, 2026-01)"
        )
    if stack == "megatron-core" and llm.moe is not None and not _has(year, "moe_probs_in_activation"):
        fixed["moe_probs_in_act"] = False
        out.assumptions.append(
            "MoE probabilities weight the experts' outputs in the combine, which keeps them for backward "
            "(Megatron-Core before 0.13)"
        )
    return fixed


def _software_knobs(run: dict, sw: dict, fixed: dict, free: dict, out: Mapped) -> None:
    """Knobs the run's ``software:`` states: activation offload (Megatron-Core cpu_offloading_num_layers), the
    MoE dispatcher (DeepEP / HybridEP: `flex`) and all-to-all overlap (ep > 1), CUDA graphs (Megatron-Bridge
    presets' cuda_graph_impl / cuda_graph_scope; unstated: the stack's default), the rank order (Megatron
    --use-tp-pp-dp-mapping; unstated: tp-cp-dp-pp), Transformer Engine's fused expert MLP
    (use_transformer_engine_op_fuser, cutedsl_fused_grouped_mlp); and expert tensor parallelism, left free
    between 1 and tp for an MoE with tp > 1 (the schema has no field for it)."""
    par, m = run["parallel"], run["model"]
    off = sw.get("activation_offload_layers")
    if off:
        fixed.update(activation_offload=True, activation_offload_layers=off)
        out.assumptions.append(
            f"activations of {off} layers offloaded to CPU memory (software.activation_offload_layers)"
        )
    if m.get("moe") and par["ep"] > 1 and sw.get("moe_dispatcher") == "allgather":
        fixed["moe_dispatcher"] = "allgather"
        out.assumptions.append("MoE tokens all-gathered over etp x ep (software.moe_dispatcher: allgather)")
    if m.get("moe") and par["ep"] > 1 and sw.get("moe_dispatcher") in ("deepep", "hybridep"):
        fixed["moe_dispatcher"] = "flex"
        out.assumptions.append(
            f"MoE tokens dispatched once per remote node (software.moe_dispatcher: {sw['moe_dispatcher']})"
        )
    if m.get("moe") and par["ep"] > 1 and sw.get("moe_a2a_overlap"):
        fixed["ep_overlap"] = True
        out.assumptions.append(
            "MoE all-to-all overlapped with another micro-batch's compute (software.moe_a2a_overlap)"
        )
    graphs = sw.get("cuda_graphs")
    if graphs == "full":
        fixed["cuda_graphs"] = "full"
        out.assumptions.append("the whole iteration replayed as CUDA graphs (software.cuda_graphs: full)")
    elif graphs == "partial":
        fixed["cuda_graphs"] = "partial"
        out.assumptions.append(
            "Transformer Engine CUDA graphs of the attention, router and dispatcher preprocessing "
            "(software.cuda_graphs: partial)"
        )
    elif graphs == "none":
        fixed["cuda_graphs"] = "none"
        out.assumptions.append("no CUDA graphs (software.cuda_graphs: none)")
    if sw.get("rank_order"):
        fixed["rank_order"] = sw["rank_order"]
        out.assumptions.append(f"ranks numbered {sw['rank_order']}, innermost first (software.rank_order)")
    if m.get("moe") and sw.get("moe_fused_mlp"):
        fixed["moe_fused_mlp"] = True
        out.assumptions.append("the experts' MLP as Transformer Engine's fused ops (software.moe_fused_mlp)")
    if m.get("moe") and par["tp"] > 1:
        free["etp"] = sorted({1, par["tp"]})
        out.assumptions.append(
            "MoE with tp > 1: expert tensor parallelism (etp) not in the schema, chosen by the "
            "model between 1 and tp"
        )


def _pipeline_layout(run: dict, stack: str, fixed: dict, out: Mapped, vpp: int | None = None) -> None:
    """How the layers are split over the stages: with the embedding and the output layer as slots where the
    run says so (`software.pp_embedding_slots`); else, where pp*vpp does not divide the layers, by module
    outside Megatron-Core, with the embedding and the loss as slots when layers + 2 divide, else a custom
    layout. The uneven layouts time and size the busiest chunk. `vpp`: the depth to lay out (None: the
    run's, unstated 1)."""
    par = run["parallel"]
    vpp_known = vpp or par.get("vpp") or 1
    L = run["model"]["layers"]
    slots = software(run).get("pp_embedding_slots")  # None: inferred below (Megatron-Core only)
    if slots and par["pp"] > 1:
        fixed["pp_embedding_loss"] = True
        if (L + 2) % (par["pp"] * vpp_known):
            fixed["pp_uneven"] = True
        out.assumptions.append(
            "the embedding and the output layer take a pipeline layer slot each (software.pp_embedding_slots)"
        )
    elif stack != "megatron-core" and par["pp"] > 1 and L % (par["pp"] * vpp_known):
        fixed["pp_uneven"] = True
        out.assumptions.append(
            f"layers {L} not divisible by pp*vpp = {par['pp'] * vpp_known}: {stack} splits "
            "the stages by module (the embedding on the first, the output on the last); the "
            f"model times and sizes the busiest chunk, ceil({L} / {par['pp'] * vpp_known}) layers"
        )
    elif (
        slots is None
        and par["pp"] > 1
        and L % (par["pp"] * vpp_known)
        and (L + 2) % (par["pp"] * vpp_known) == 0
    ):
        fixed["pp_embedding_loss"] = True
        out.assumptions.append(
            f"layers {L} not divisible by pp*vpp = {par['pp'] * vpp_known} but layers + 2 are: "
            "the embedding and the loss take a pipeline layer slot each (Megatron-Core "
            "account_for_embedding/loss_in_pipeline_split)"
        )
    elif par["pp"] > 1 and L % (par["pp"] * vpp_known):
        fixed["pp_uneven"] = True
        why = "without embedding slots (software.pp_embedding_slots)" if slots is False else "nor layers + 2"
        out.assumptions.append(
            f"layers {L} not divisible by pp*vpp = {par['pp'] * vpp_known}, {why}: a "
            "custom pipeline layout (Megatron-Core pipeline_model_parallel_layout) of the layers and MTP "
            "blocks, the last stage holding the padding's fewer (compose.edge_extra)"
        )


def _interleaving_depths(run: dict, stack: str, fixed: dict) -> list[int]:
    """The interleaving depths the model may choose for a run stating an interleaved schedule without its
    depth: among 2 .. layers / pp, those the stack runs (`optimizer.schema.stack.profile`), whose pipeline
    layout (`_pipeline_layout`) is the one laid out at depth 1, whose knobs `fixed` holds, and, for an uneven
    layout, that divide its busiest stage's slots (`optimizer.rules.layout.uneven_vpps`, the solver's rule).
    Empty where none is left."""
    from optimizer.rules.layout import uneven_vpps
    from optimizer.schema.stack import Stack, profile

    par, layers = run["parallel"], run["model"]["layers"]
    offered = profile(Stack(stack)).get("vpp")
    layout = {k: fixed.get(k) for k in ("pp_embedding_loss", "pp_uneven")}
    busiest = uneven_vpps(layers, [par["pp"]])
    depths = []
    for v in range(2, layers // par["pp"] + 1):
        if offered is not None and v not in offered:
            continue
        trial: dict = {}
        _pipeline_layout(run, stack, trial, Mapped(run), vpp=v)
        if {k: trial.get(k) for k in layout} != layout or (fixed.get("pp_uneven") and v not in busiest):
            continue
        depths.append(v)
    return depths


def _batch_and_pipeline(run: dict, stack: str, fixed: dict, free: dict, out: Mapped) -> None:
    """The micro-batch (an unstated one chosen among the divisors of the per-replica batch up to
    MAX_FREE_MICRO_BATCH), the pipeline layout (`_pipeline_layout`) and vpp (unstated: 1, interleaving being
    opt-in; chosen by the model, `_interleaving_depths`, where the run states an interleaved schedule without
    its depth, `software.pp_interleaved`)."""
    par = run["parallel"]
    B, dp = par["global_batch"], par["dp"]
    if par.get("micro_batch") is None:
        free["micro_batch"] = [
            b for b in range(1, B // dp + 1) if (B // dp) % b == 0 and b <= MAX_FREE_MICRO_BATCH
        ]
        out.assumptions.append("micro_batch null: chosen by the model (fastest that fits)")
    else:
        fixed["micro_batch"] = par["micro_batch"]
    _pipeline_layout(run, stack, fixed, out)
    interleaved = software(run).get("pp_interleaved")
    depths = _interleaving_depths(run, stack, fixed) if par.get("vpp") is None and interleaved else []
    if depths:
        free["vpp"] = depths
        out.assumptions.append(
            "vpp null with an interleaved schedule (software.pp_interleaved): the depth chosen by the model "
            f"among {depths} (fastest that fits)"
        )
    elif par.get("vpp") is None and interleaved:
        fixed["vpp"] = 1
        out.assumptions.append(
            f"an interleaved schedule stated (software.pp_interleaved), but {stack} can lay out no depth of "
            f"{run['model']['layers']} layers over pp {par['pp']} in the run's layout: vpp 1"
        )
    elif par.get("vpp") is None:
        fixed["vpp"] = 1
        if par["pp"] > 1:
            out.assumptions.append(
                "vpp null: 1 (interleaving is opt-in in Megatron-LM; an unstated opt-in "
                "feature is taken as off)"
            )
    else:
        fixed["vpp"] = par["vpp"]


def _memory_knobs(run: dict, year: int | None, sw: dict, fixed: dict, free: dict, out: Mapped) -> None:
    """Recomputation (``software.recompute_modules`` for a selective one, or the modules a MaxText
    ``software.remat_policy`` runs again, `REMAT_POLICY`; unstated: chosen among what the year's software
    offered), sequence parallelism (unstated: chosen when tp > 1 and offered) and optimizer sharding
    (unstated: none before the distributed optimizer, else chosen between none and ZeRO-1)."""
    par = run["parallel"]
    names = sw.get("recompute_modules")
    policy = sw.get("remat_policy") if sw.get("framework") == "maxtext" else None  # MaxText's (`Run`)
    if policy is not None:  # a remat policy states the recompute
        rec = "full" if REMAT_POLICY[policy] is None else "selective"
        was = par.get("recompute")
        par, names = {**par, "recompute": rec}, REMAT_POLICY[policy]
        out.assumptions.append(
            f"remat policy {policy} (software.remat_policy): recompute {rec}"
            + (f", not the stated {was}" if was not in (None, rec) else "")
            + ("" if rec == "full" else " of what it does not save")
        )
    if par.get("recompute") == "selective" and names:
        known = [n for n in names if n in RecomputeModule.__members__.values()]
        unknown = [n for n in names if n not in known]
        if known:
            fixed["recompute_modules"] = known
            field = "software.remat_policy" if policy is not None else "software.recompute_modules"
            out.assumptions.append(
                f"selective recompute of {', '.join(known)} ({field})"
                + (f"; not modelled: {', '.join(unknown)}" if unknown else "")
            )
    if par.get("recompute") is None:
        free["recompute"] = (
            ["none", "selective", "full"] if _has(year, "selective_recompute") else ["none", "full"]
        )
        out.assumptions.append("recompute null: chosen by the model")
    else:
        fixed["recompute"] = par["recompute"]
    if par.get("sequence_parallel") is None:
        free["sequence_parallel"] = (
            [False, True] if par["tp"] > 1 and _has(year, "sequence_parallel") else [False]
        )
        out.assumptions.append("sequence_parallel null: chosen by the model")
    else:
        fixed["sequence_parallel"] = par["sequence_parallel"]
    if par.get("optimizer_sharding") is None:
        if not _has(year, "distributed_optimizer"):
            fixed["zero"] = 0
            out.assumptions.append(
                "optimizer_sharding null: none (Megatron before the distributed optimizer)"
            )
        else:
            free["zero"] = [0, 1]
            out.assumptions.append("optimizer_sharding null: chosen by the model")
    else:
        fixed["zero"] = ZERO[par["optimizer_sharding"]]
        if stack_of(run) == "torchtitan" and par["pp"] > 1 and fixed["zero"] > 1:
            # torchtitan's FSDP2 under a pipeline keeps the parameters gathered (reshard_after_forward
            # False) and reduces gradients at the last micro-batch only (parallelize_llama): ZeRO-1 in
            # memory and traffic, whatever full-shard the run names
            out.assumptions.append(
                f"optimizer_sharding {par['optimizer_sharding']} with pp {par['pp']} on torchtitan: FSDP2 "
                "under a pipeline keeps parameters gathered and reduces gradients once per step: zero 1"
            )
            fixed["zero"] = 1


def _overlap_knobs(run: dict, year: int | None, sw: dict, fixed: dict, free: dict, out: Mapped) -> None:
    """Communication overlap: interleaved pipeline exchanges exposed before overlap_p2p_comm; gradient
    reduction as ``software.dp_comm_overlap`` states it, else not overlapped before the year it was offered
    and
    chosen after; TP communication overlap as ``software.tp_comm_overlap`` states it, else off before it was
    offered and chosen after (tp > 1 only)."""
    par = run["parallel"]
    interleaved = fixed.get("vpp", 1) > 1 or "vpp" in free  # as `_batch_and_pipeline` set the depth
    if par["pp"] > 1 and interleaved and not _has(year, "pp_overlap"):
        fixed["pp_overlap"] = False
        out.assumptions.append(
            "interleaved pipeline exchanges on the critical path (Megatron-LM before overlap_p2p_comm, 2023)"
        )
    dp_stated = sw.get("dp_comm_overlap")
    if dp_stated is True:
        fixed["dp_overlap"] = True
        out.assumptions.append("gradient reduction overlapped with backward (software.dp_comm_overlap)")
    elif dp_stated is False or not _has(year, "dp_overlap"):
        fixed["dp_overlap"] = False
        out.assumptions.append("gradient reduction not overlapped with backward")
    else:
        free["dp_overlap"] = [True, False]
    if par["tp"] > 1:
        tp_stated = sw.get("tp_comm_overlap")
        if tp_stated is True:
            fixed["tp_overlap"] = "ring"
            out.assumptions.append("TP communication overlap on (software.tp_comm_overlap)")
        elif tp_stated is False:
            fixed["tp_overlap"] = "none"
            out.assumptions.append(
                "TP collectives not overlapped with the matmuls (software.tp_comm_overlap)"
            )
        elif not _has(year, "tp_overlap"):
            fixed["tp_overlap"] = "none"
        else:
            free["tp_overlap"] = ["none", "ring"]
            out.assumptions.append("TP communication overlap: chosen by the model")


def _grad_precision(precision: str, sw: dict, out: Mapped) -> str:
    """The precision gradients are accumulated and reduced in: ``software.grad_reduce_dtype`` as stated (bf16
    for the NeMo / Megatron-Bridge performance tables, whose recipes set grad_reduce_in_fp32 = False, and for
    FSDP mixed_precision PURE); unstated, fp16 with fp16, else fp32 (Megatron's main_grad, FSDP's reduce
    dtype)."""
    stated = sw.get("grad_reduce_dtype")
    if stated:
        out.assumptions.append(f"gradients reduced in {stated} (software.grad_reduce_dtype)")
        return stated
    return "fp16" if precision == "fp16" else "fp32"


def _grad_accumulation(
    year: int | None, stack: str, precision: str, grad: str, fixed: dict, out: Mapped
) -> None:
    """Megatron-LM before its gradient-accumulation fusion (`FEATURE_YEAR`: FP32 accumulation from 2022,
    16-bit from 2023) added each micro-batch's 16-bit weight gradients into the main-gradient buffer by a
    kernel of its own (`GradAccumulation.ADD`); Megatron-DeepSpeed's is its stack's at the run's precision
    (`stack.fixed_by_stack`), noted."""
    if stack == "megatron-deepspeed":
        scheme = fixed_by_stack(stack, precision).get("grad_accumulation")
        if scheme is not None:
            out.assumptions.append(f"gradient accumulation: {scheme.value} (the stack's in {precision})")
        return
    if stack != "megatron-core":
        return
    # bf16 training kept FP32 main gradients in Megatron-LM (accumulate_allreduce_grads_in_fp32), whatever
    # dtype a record states it reduced in: only fp16 gradients waited for the 16-bit fusion
    feature = "grad_accumulation_fusion_fp16" if grad == "fp16" else "grad_accumulation_fusion"
    if not _has(year, feature):
        fixed["grad_accumulation"] = GradAccumulation.ADD
        out.assumptions.append(
            f"{grad} gradients added into the main-gradient buffer after each micro-batch's backward "
            "(Megatron-LM before its gradient-accumulation fusion)"
        )


def map_run(run: dict, systems: dict[str, System] | None = None) -> Mapped:
    """Turn one calibration record into a problem (or a reason to skip it): the fixed execution knobs go into
    the problem, the ones left to choose into `Mapped.free`, every assumption into `Mapped.assumptions`
    (module docstring), in the order system, era, model, precision, kernels, software, batch and pipeline,
    memory, overlap, gradient precision. Only typed fields are read: ``notes`` change nothing."""
    out = Mapped(run)
    system = _system_of(run, systems, out)
    if system is None:
        return out
    year, stack, sw = run_year(run), stack_of(run), software(run)
    flash = _era(year, sw, out)
    llm = _model_of(run, year, out)
    precision = _precision_of(run, year, sw, out)
    if system.peak_tflops(precision) is None:
        out.skip = f"system {system.name} has no {precision} peak"
        return out
    fixed = _kernel_knobs(run, llm, year, stack, sw, flash, out)
    free: dict[str, list] = {}
    _software_knobs(run, sw, fixed, free, out)
    _batch_and_pipeline(run, stack, fixed, free, out)
    _memory_knobs(run, year, sw, fixed, free, out)
    _overlap_knobs(run, year, sw, fixed, free, out)
    grad = _grad_precision(precision, sw, out)
    _grad_accumulation(year, stack, precision, grad, fixed, out)
    B = run["parallel"]["global_batch"]
    training = Training(global_batch=B, precision=precision, grad_precision=grad)
    try:
        # a measured run ran: it fits if it fits the physical HBM (no planning headroom)
        out.problem = Problem(
            name=run["id"],
            llm=llm,
            system=system,
            num_gpus=run["hardware"]["num_gpus"],
            training=training,
            execution=Execution(**fixed),
            options=Options(memory_headroom_gib=0.0),
            stack=stack,
        )
    except (ValidationError, ValueError, TypeError) as e:  # a record the schema cannot express
        why = "; ".join(x["msg"] for x in e.errors()) if isinstance(e, ValidationError) else str(e)
        out.skip = f"cannot express as a problem: {' '.join(why.split())}"
        return out
    out.free = free
    return out


@dataclass
class Prediction:
    execution: Execution
    result: Any  # StepResult row (dict)
    fits: bool
    n_candidates: int


def predict(mapped: Mapped) -> Prediction:
    """Evaluate the run's configuration; free knobs are chosen as the fastest setting that fits."""
    from optimizer.model.capacity import feasible
    from optimizer.model.knobs import from_execution
    from optimizer.model.step import evaluate, make_ctx
    from optimizer.rules.cross_field import execution_errors
    from optimizer.schema.stack import stack_defaults

    p = mapped.problem
    assert p is not None
    names = list(mapped.free)
    combos = list(product(*[mapped.free[n] for n in names])) or [()]
    execs, knobs = [], []
    for combo in combos:
        upd = dict(zip(names, combo, strict=True))
        # the stack's own values for the knobs the run leaves unwritten (as Problem does when it is loaded)
        ex = Execution.model_validate({**p.execution.model_dump(exclude_unset=True), **upd})
        ex = stack_defaults(p.stack, ex, p.training.precision)
        if execution_errors(p, ex):
            continue
        execs.append(ex)
        knobs.append(from_execution(ex, p.system, p.num_gpus))
    if not execs:
        raise ProblemError(mapped.run["id"], None, "parallel", "no valid configuration for this run")
    from optimizer.model.knobs import Knobs

    K = Knobs.concat(knobs)
    res = evaluate(p, K, make_ctx(p))
    fits = feasible(p, K, res)
    t = np.where(fits, res.step_time, np.inf)
    i = int(np.argmin(t)) if np.isfinite(t).any() else int(np.argmin(res.step_time))
    return Prediction(execs[i], res.row(i), bool(fits[i]), len(execs))


def facts_file(path: str | Path) -> Path | None:
    """The sidecar facts file of a runs file (`optimizer.schema.run.RunFacts` per run id):
    ``facts/<stem>.yaml``
    beside it, else ``runs/facts/<stem>.yaml`` in the library (`library_dirs`: the project's
    ``problems/runs/facts`` holds the facts of ``../shared/calibration``'s files, which the project does not
    own); None when there is none."""
    from optimizer.io.loader import library_dirs

    p = Path(path)
    for cand in [p.parent / "facts" / p.name] + [
        d / "runs" / "facts" / p.name for d in library_dirs(p.parent)
    ]:
        try:
            if cand.is_file():
                return cand
        except (OSError, ValueError):
            continue
    return None


def load_facts(path: str | Path, errors: list | None = None) -> tuple[Sourced, dict[str, dict]]:
    """A sidecar facts file (run id -> `optimizer.schema.run.RunFacts`), each entry checked by the schema; the
    entries' errors are appended to `errors` (raised when it is None)."""
    from optimizer.errors import ProblemErrors
    from optimizer.schema.run import RunFacts

    doc = read_yaml(path)
    if not isinstance(doc.data, dict):
        raise ProblemError(doc.file, 1, None, "a facts file is a mapping of run id -> facts")
    out, errs = {}, []
    for rid, entry in doc.data.items():
        try:
            out[str(rid)] = validate_model(RunFacts, doc, entry, prefix=(rid,)).model_dump(mode="json")
        except ProblemErrors as e:
            errs += e.errors
    if errors is None and errs:
        raise ProblemErrors(errs)
    if errors is not None:
        errors += errs
    return doc, out


def _merge_facts(records: list[dict], path: str | Path, errors: list) -> None:
    """Merge the sidecar facts of `path` (`facts_file`) into `records` (as dumped by the run schema): its
    ``software`` into the record's, its ``architecture`` into the record's model. A fact stated both in the
    record and in the sidecar, or an id the runs file does not hold, is an error."""
    fp = facts_file(path)
    if fp is None:
        return
    doc, facts_by_id = load_facts(fp, errors)
    by_id = {r["id"]: r for r in records}
    for rid, facts in facts_by_id.items():
        if rid not in by_id:
            file, line = doc.locate((rid,))
            errors.append(ProblemError(file, line, rid, f"no run '{rid}' in {Path(path).name}"))
            continue
        rec = by_id[rid]
        for key, target in (("software", rec), ("architecture", rec["model"])):
            if facts[key] is None:
                continue
            if target.get(key) is not None:
                file, line = doc.locate((rid, key))
                errors.append(ProblemError(file, line, key, f"run '{rid}' states its {key} already"))
            else:
                target[key] = facts[key]


def load_runs(path: str) -> Sourced:
    """A runs file, every record checked against the run schema (`optimizer.schema.run`: unknown keys and
    wrong types are file:line:field errors), with the typed facts of its sidecar file merged in
    (`facts_file`);
    the records come back with every key present."""
    from optimizer.errors import ProblemErrors
    from optimizer.schema.run import Run

    doc = read_yaml(path)
    if not isinstance(doc.data, list):
        raise ProblemError(doc.file, 1, None, "a runs file is a YAML list of run records")
    records, errors = [], []
    for i, rec in enumerate(doc.data):
        try:
            records.append(validate_model(Run, doc, rec, prefix=(i,)).model_dump(mode="json"))
        except ProblemErrors as e:
            errors += e.errors
    if errors:
        raise ProblemErrors(errors)
    ids = [r["id"] for r in records]
    dup = sorted({x for x in ids if ids.count(x) > 1})
    if dup:
        raise ProblemError(doc.file, None, "id", f"duplicate run ids: {', '.join(dup)}")
    _merge_facts(records, path, errors)
    if errors:
        raise ProblemErrors(errors)
    merged = facts_file(path) is not None
    for i, rec in enumerate(records if merged else []):  # merged facts checked against the record's fields
        try:
            validate_model(Run, doc, rec, prefix=(i,))
        except ProblemErrors as e:
            errors += e.errors
    if errors:
        raise ProblemErrors(errors)
    doc.data = records
    return doc


def precision_key(run: dict) -> tuple:
    """The (model, GPU, GPU count, sequence length, global batch) a run's precision is compared within: the
    model keyed on the run id's prefix up to the GPU name (the schema has no model-name field)."""
    gpu = run["hardware"]["gpu"]
    return (
        run["id"].split(f"-{gpu.split('-')[0]}")[0],
        gpu,
        run["hardware"]["num_gpus"],
        run["model"]["seq_len"],
        run["parallel"]["global_batch"],
    )


def order_precisions(entries) -> list[tuple[tuple, list[str], list[str]]]:
    """`entries`: (key, precision, measured step s, predicted step s), the key fixing the tokens of a step
    (`precision_key`). For each key with several precisions, each run once (a key holding two runs of one
    precision, e.g. two micro-batch sizes, is no precision comparison): the precisions fastest first as
    measured and as predicted (`paraplan validate`'s precision order, `scoring._precision_order`)."""
    groups: dict[tuple, list[tuple[str, float, float]]] = {}
    for key, prec, measured, predicted in entries:
        groups.setdefault(tuple(key), []).append((str(prec), measured, predicted))
    out = []
    for key, v in groups.items():
        if len({x[0] for x in v}) < 2 or len({x[0] for x in v}) < len(v):
            continue
        out.append(
            (
                key,
                [x[0] for x in sorted(v, key=lambda x: x[1])],
                [x[0] for x in sorted(v, key=lambda x: x[2])],
            )
        )
    return out
