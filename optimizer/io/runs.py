"""Published training runs (the schema of shared/calibration/README.md) mapped onto problems.

Each run becomes a `Problem` whose execution is the run's own configuration. Knobs the run does not
state are resolved by stated, documented assumptions, reported per run:

- unknown ``micro_batch``, ``recompute``, ``sequence_parallel``, ``optimizer_sharding``: the model
  chooses them, within the run's fixed tp/pp/dp/cp, as the fastest setting that fits in memory (the
  published run was tuned; this is what `paraplan solve` would do); an unknown ``vpp`` is 1, since
  interleaving is an opt-in schedule that a paper would state;
- the choice is limited to what the software of the run's time offered, read from the year in its
  ``source`` (`FEATURE_YEAR`: sequence parallelism and selective recompute from 2022, the distributed
  optimizer, FlashAttention and communication overlap from 2023); knobs the schema has no field for
  follow the same rule: runs published up to 2022 used Megatron-LM of that time (materialised
  attention, dropout 0.1, no TP-communication overlap, gradient all-reduce not overlapped); later runs
  use FlashAttention, no dropout, and may overlap communication (the model chooses). Phrases in
  ``notes`` that state one of these (``FlashAttention``, ``not overlapped``, ``comm overlap on`` / ``off`` /
  ``disabled``,
  ``eager``: unfused element-wise kernels; ``attn_impl triton``: FlashAttention's Triton kernel, also what
  llm-foundry's benchmark tables ran; ``gradients reduced in bf16``) win;
- ``precision: null`` (16-bit, fp16 or bf16 not stated) is fp16 for runs published up to 2022 (the
  Megatron GPT recipes of the time), bf16 after; both have the same peak;
- gradients are accumulated and reduced in fp32 with bf16 (Megatron forces main_grad fp32 for bf16;
  FSDP's reduce dtype), in fp16 with fp16 (Megatron's default without
  --accumulate-allreduce-grads-in-fp32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from optimizer.errors import ProblemError
from optimizer.io.loader import Sourced, available, find_in_library, read_yaml, validate_model
from optimizer.schema import LLM, MLA, Execution, MoE, Options, Problem, System, Training
from optimizer.schema.common import RecomputeModule
from optimizer.schema.llm import SlidingWindow

MAX_FREE_MICRO_BATCH = 4  # an unstated micro-batch is chosen among 1..4 (Megatron recipes use 1-4)
ZERO = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
# First year a feature was in the frameworks' public releases (Megatron-LM: Korthikanti 2022,
# Megatron-Core 2023; torchtitan: GQA passed to SDPA without repeating K/V, pytorch/torchtitan#2259, 2026-01).
FEATURE_YEAR = {
    "sequence_parallel": 2022,
    "selective_recompute": 2022,
    "distributed_optimizer": 2023,
    "flash_attention": 2023,
    "tp_overlap": 2023,
    "dp_overlap": 2023,
    "pp_overlap": 2023,
    "gqa_without_kv_repeat": 2026,
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


def run_year(run: dict) -> int | None:
    years = [int(y) for y in re.findall(r"(?<!\d)(20[0-3]\d)(?!\d)", f"{run.get('source', '')}")]
    return min(years) if years else None


_SHAPE = ("hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "vocab", "mlp")


def _moe_shape(m: dict) -> tuple:
    mo = m.get("moe") if isinstance(m.get("moe"), dict) else {}
    return tuple(m.get(f) for f in _SHAPE) + tuple(mo.get(f) for f in ("experts", "top_k", "expert_ffn"))


def _library_expert_bias(m: dict) -> bool:
    """Whether a library model of the record's shape (`problems/llms`: hidden, ffn, layers, heads, K/V heads,
    head size, vocabulary, MLP kind and its experts) has biased experts: the run schema has no field for them
    and the records' notes do not state them (GPT-OSS's name its QKV bias only; its checkpoint and
    Megatron-Bridge's provider, add_bias_linear=True, give every expert linear one)."""
    return any(
        isinstance(doc, dict)
        and isinstance(doc.get("moe"), dict)
        and doc["moe"].get("expert_bias")
        and _moe_shape(doc) == _moe_shape(m)
        for _, doc in _library_docs("llm")
    )


def _notes(run: dict) -> str:
    return f"{run.get('notes') or ''}".lower()


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
    notes = _notes(run)
    # the run schema has no MLA fields: DeepSeek records state them in their notes, with the dense layers' ffn
    mla, head_dim, ffn = None, m.get("head_dim"), m["ffn"] or 4 * m["hidden"]
    x = re.search(r"mla \(q_lora (\d+), kv_lora (\d+), qk_nope (\d+) \+ qk_rope (\d+), v_head (\d+)", notes)
    if x:
        q, kv, nope, rope, v = map(int, x.groups())
        mla, head_dim = MLA(q_lora_rank=q, kv_lora_rank=kv, qk_rope_head_dim=rope, v_head_dim=v), nope
    dense = re.search(r"dense with ffn (\d+)", notes)
    if moe is not None and dense:
        ffn = int(dense.group(1))
    # the run schema has no sliding-window fields: GPT-OSS records state them ("alternate 128-token
    # sliding-window attention and full attention (18 each)")
    win = re.search(r"(\d+)-token sliding-window attention and full attention \((\d+) each\)", notes)
    window = SlidingWindow(tokens=int(win.group(1)), layers=int(win.group(2))) if win else None
    sinks = "attention sinks" in notes  # GPT-OSS records: "attention sinks and QKV bias"
    clamp = re.search(
        r"clamped swiglu \(limit (\d+(?:\.\d+)?)\)", notes
    )  # GPT-OSS: "clamped SwiGLU (limit 7.0)"
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
        attention_sinks=sinks,
        activation_clamp=float(clamp.group(1)) if clamp else None,
    )


STACK_WORDS = (
    ("torchtitan", "torchtitan"),
    ("llm-foundry", "fsdp"),
    ("composer", "fsdp"),
    ("deepspeed", "deepspeed"),
)


def stack_of(run: dict) -> str:
    """The run's software stack, read from its source and notes: torchtitan; llm-foundry or Composer (PyTorch
    FSDP: `fsdp`); DeepSpeed; else megatron-core (Megatron-LM, NeMo, Megatron-Bridge)."""
    txt = f"{run.get('source') or ''} {run.get('notes') or ''}".lower()
    return next((stack for word, stack in STACK_WORDS if word in txt), "megatron-core")


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


def _era(year: int | None, notes: str, out: Mapped) -> bool:
    """Whether the run used FlashAttention (notes, else the publication year, `FEATURE_YEAR`), noting it with
    the era's dropout (0.1 up to 2022, none after)."""
    old = year is not None and year <= 2022
    era = f"published {year}" if year else "no year in source"
    flash = ("flash" in notes) or _has(year, "flash_attention")
    out.assumptions.append(
        f"{era}: {'FlashAttention' if flash else 'materialised (standard) attention'}, "
        f"{'dropout 0.1' if old else 'no dropout'}"
    )
    return flash


def _model_of(run: dict, year: int | None, out: Mapped) -> LLM:
    """The run's LLM (`_llm_of`), noting the features read from its notes or the library; a shape the LLM
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
            f"{llm.layers} layers (notes)"
        )
    if llm.attention_sinks:
        out.assumptions.append(
            "learned attention sinks: the fused attention backward's per-row sink gradient (notes)"
        )
    if llm.activation_clamp is not None:
        out.assumptions.append(f"the GLU's halves clamped at {llm.activation_clamp:g} (notes)")
    if llm.moe is not None and llm.moe.expert_bias:
        out.assumptions.append(
            "biased experts (the library model of this shape; the notes do not state them)"
        )
    return llm


def _precision_of(run: dict, year: int | None, notes: str, out: Mapped) -> str:
    """The training precision: the run's, 16-bit null as fp16 up to 2022 and bf16 after; FP8 with
    per-tensor current scaling when the notes name it (Transformer Engine's Float8CurrentScaling: an amax pass
    before each cast)."""
    prec = run["parallel"].get("precision")
    if prec is None:
        prec = "fp16" if year is not None and year <= 2022 else "bf16"
        out.assumptions.append(f"precision null (16-bit): {prec}")
    if prec == "fp8" and "current scaling" in notes:
        prec = "fp8_current"
        out.assumptions.append("FP8 per-tensor current scaling (notes): fp8_current")
    return prec


def _attention(run: dict, stack: str, notes: str, flash: bool, out: Mapped) -> str:
    """The attention kernel: materialised (`standard`) or FlashAttention; its Triton kernel when the notes say
    attn_impl triton or the run is from llm-foundry's benchmark tables (measured with submit_benchmarks.py,
    whose attn_impl default is triton); FlashAttention-2 when the notes name it or under torchtitan (PyTorch
    SDPA's flash backend), unless the notes name cuDNN or FA3."""
    attention = "flash" if flash else "standard"
    bench = "llm-foundry scripts/train/benchmarking" in str(run.get("source") or "")
    if flash and ("attn_impl triton" in notes or bench):
        attention = "flash-triton"
        out.assumptions.append(
            "FlashAttention's Triton kernel ("
            + (
                "notes: attn_impl triton)"
                if "attn_impl triton" in notes
                else "llm-foundry's benchmark script runs attn_impl triton by default)"
            )
        )
    if attention == "flash" and (
        "flashattention-2" in notes or (stack == "torchtitan" and not re.search(r"cudnn|fa3", notes))
    ):
        attention = "flash2"
        out.assumptions.append(
            "FlashAttention-2 kernels: "
            + (
                "notes"
                if "flashattention-2" in notes
                else "torchtitan runs PyTorch SDPA, whose flash backend is FlashAttention-2 (cuDNN "
                "attention is the default only from PyTorch 2.9); notes naming cuDNN or FA3 win"
            )
        )
    return attention


def _kernel_knobs(
    run: dict, llm: LLM, year: int | None, stack: str, notes: str, flash: bool, out: Mapped
) -> dict[str, Any]:
    """The fixed parallel degrees and kernel knobs: attention (`_attention`), fused element-wise kernels
    unless the notes say eager, an unfused fp32 loss when they say not compiled, and torchtitan's K/V repeat
    for GQA before `FEATURE_YEAR['gqa_without_kv_repeat']`."""
    par = run["parallel"]
    eager = "eager" in notes
    if eager:
        out.assumptions.append("eager mode (notes): unfused element-wise kernels")
    attention = _attention(run, stack, notes, flash, out)
    fixed: dict[str, Any] = dict(
        tp=par["tp"],
        pp=par["pp"],
        dp=par["dp"],
        cp=par["cp"],
        ep=par["ep"],
        attention=attention,
        fused_layers=not eager,
    )
    if "not compiled" in notes and not eager:
        fixed["fused_loss"] = False
        out.assumptions.append("loss: cross_entropy on an fp32 upcast of the logits, not compiled (notes)")
    if stack == "torchtitan" and llm.kv < llm.heads and not _has(year, "gqa_without_kv_repeat"):
        fixed["kv_repeat"] = True
        out.assumptions.append(
            "K/V heads repeated to the query heads before SDPA (torchtitan's repeat_kv until "
            "'GQA without kv repeats', pytorch/torchtitan#2259, 2026-01)"
        )
    return fixed


def _notes_knobs(run: dict, notes: str, fixed: dict, free: dict, out: Mapped) -> None:
    """Knobs the schema has no field for, as the notes state them: activation offload (Megatron-Core
    cpu_offloading_num_layers), the MoE dispatcher (DeepEP / HybridEP) and all-to-all overlap, CUDA graphs
    (Megatron-Bridge presets' cuda_graph_impl / cuda_graph_scope; none named: eager), Transformer Engine's
    fused expert MLP (use_transformer_engine_op_fuser, cutedsl_fused_grouped_mlp); and expert tensor
    parallelism, left free between 1 and tp for an MoE with tp > 1."""
    par, m = run["parallel"], run["model"]
    off = re.search(r"cpu_offloading_num_layers\s*=\s*(\d+)", notes)
    if off:
        fixed.update(activation_offload=True, activation_offload_layers=int(off.group(1)))
        out.assumptions.append(
            f"activations of {off.group(1)} layers offloaded to CPU memory (notes: Megatron-Core "
            "cpu_offloading_num_layers)"
        )
    if m.get("moe") and par["ep"] > 1 and re.search(r"deepep|hybridep", notes):
        fixed["ep_dispatcher"] = "flex"
        out.assumptions.append(
            "MoE tokens dispatched once per remote node (notes: DeepEP / HybridEP dispatcher)"
        )
    if m.get("moe") and par["ep"] > 1 and re.search(r"a2a overlap on", notes):
        fixed["ep_overlap"] = True
        out.assumptions.append(
            "MoE all-to-all overlapped with another micro-batch's compute (notes: EP A2A overlap)"
        )
    if re.search(r"full-iteration cuda graphs|cuda_graph_impl[ =]*full_iteration", notes):
        fixed["cuda_graphs"] = "full"
        out.assumptions.append(
            "the whole iteration replayed as CUDA graphs (notes: full-iteration CUDA graphs)"
        )
    elif re.search(r"te cuda graphs", notes):
        fixed["cuda_graphs"] = "partial"
        out.assumptions.append(
            "Transformer Engine CUDA graphs of the attention, router and dispatcher preprocessing (notes)"
        )
    if m.get("moe") and re.search(r"fused grouped mlp|op fuser", notes):
        fixed["moe_fused_mlp"] = True
        out.assumptions.append(
            "the experts' MLP as Transformer Engine's fused ops (notes: fused grouped MLP)"
        )
    if m.get("moe") and par["tp"] > 1:
        free["etp"] = sorted({1, par["tp"]})
        out.assumptions.append(
            "MoE with tp > 1: expert tensor parallelism (etp) not in the schema, chosen by the "
            "model between 1 and tp"
        )


def _pipeline_layout(run: dict, stack: str, fixed: dict, out: Mapped) -> None:
    """How layers that pp*vpp does not divide are split: by module outside Megatron-Core (only it gives the
    embedding and the loss a pipeline layer slot); with the embedding and the loss as slots when layers + 2
    divide; else a custom layout. The uneven layouts time and size the busiest chunk."""
    par = run["parallel"]
    vpp_known = par.get("vpp") or 1
    L = run["model"]["layers"]
    if stack != "megatron-core" and par["pp"] > 1 and L % (par["pp"] * vpp_known):
        fixed["pp_uneven"] = True
        out.assumptions.append(
            f"layers {L} not divisible by pp*vpp = {par['pp'] * vpp_known}: {stack} splits "
            "the stages by module (the embedding on the first, the output on the last); the "
            f"model times and sizes the busiest chunk, ceil({L} / {par['pp'] * vpp_known}) layers"
        )
    elif par["pp"] > 1 and L % (par["pp"] * vpp_known) and (L + 2) % (par["pp"] * vpp_known) == 0:
        fixed["pp_embedding_loss"] = True
        out.assumptions.append(
            f"layers {L} not divisible by pp*vpp = {par['pp'] * vpp_known} but layers + 2 are: "
            "the embedding and the loss take a pipeline layer slot each (Megatron-Core "
            "account_for_embedding/loss_in_pipeline_split)"
        )
    elif par["pp"] > 1 and L % (par["pp"] * vpp_known) and (L + 2) % (par["pp"] * vpp_known):
        fixed["pp_uneven"] = True
        out.assumptions.append(
            f"neither layers {L} nor layers + 2 divide by pp*vpp = {par['pp'] * vpp_known}: a "
            "custom pipeline layout (Megatron-Core pipeline_model_parallel_layout); the model "
            f"times and sizes the busiest chunk, ceil({L} / {par['pp'] * vpp_known}) layers"
        )


def _batch_and_pipeline(run: dict, stack: str, fixed: dict, free: dict, out: Mapped) -> None:
    """The micro-batch (an unstated one chosen among the divisors of the per-replica batch up to
    MAX_FREE_MICRO_BATCH), the pipeline layout (`_pipeline_layout`) and vpp (unstated: 1, interleaving being
    opt-in)."""
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
    if par.get("vpp") is None:
        fixed["vpp"] = 1
        if par["pp"] > 1:
            out.assumptions.append(
                "vpp null: 1 (interleaving is opt-in in Megatron-LM; an unstated opt-in "
                "feature is taken as off)"
            )
    else:
        fixed["vpp"] = par["vpp"]


def _memory_knobs(run: dict, year: int | None, notes: str, fixed: dict, free: dict, out: Mapped) -> None:
    """Recomputation (the modules the notes list for a selective one; unstated: chosen among what the year's
    software offered), sequence parallelism (unstated: chosen when tp > 1 and offered) and optimizer sharding
    (unstated: none before the distributed optimizer, else chosen between none and ZeRO-1)."""
    par = run["parallel"]
    mods = re.search(r"recompute_modules \[([^\]]*)\]", notes)
    if par.get("recompute") == "selective" and mods:
        names = re.findall(r"'([a-z_]+)'", mods.group(1))
        known = [n for n in names if n in RecomputeModule.__members__.values()]
        unknown = [n for n in names if n not in known]
        if known:
            fixed["recompute_modules"] = known
            out.assumptions.append(
                f"selective recompute of {', '.join(known)} (notes: recompute_modules)"
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


def _overlap_knobs(run: dict, year: int | None, notes: str, fixed: dict, free: dict, out: Mapped) -> None:
    """Communication overlap, which the schema does not carry: interleaved pipeline exchanges exposed before
    overlap_p2p_comm; gradient reduction not overlapped when the notes say so or before the year it was
    offered, else chosen; TP communication overlap as the notes state it, else off before it was offered and
    chosen after (tp > 1 only)."""
    par = run["parallel"]
    if par["pp"] > 1 and (par.get("vpp") or 1) > 1 and not _has(year, "pp_overlap"):
        fixed["pp_overlap"] = False
        out.assumptions.append(
            "interleaved pipeline exchanges on the critical path (Megatron-LM before overlap_p2p_comm, 2023)"
        )
    if "not overlapped" in notes or not _has(year, "dp_overlap"):
        fixed["dp_overlap"] = False
        out.assumptions.append("gradient reduction not overlapped with backward")
    else:
        free["dp_overlap"] = [True, False]
    if par["tp"] > 1:
        if re.search(r"tp[_ ]comm[_ ]overlap on|comm overlap on", notes):
            fixed["tp_overlap"] = "ring"
            out.assumptions.append("TP communication overlap on (notes)")
        elif re.search(r"no async tp|tp[_ ]comm[_ ]overlap off|comm overlap (?:off|disabled)", notes):
            fixed["tp_overlap"] = "none"
            out.assumptions.append("TP collectives not overlapped with the matmuls (notes)")
        elif not _has(year, "tp_overlap"):
            fixed["tp_overlap"] = "none"
        else:
            free["tp_overlap"] = ["none", "ring"]
            out.assumptions.append("TP communication overlap: chosen by the model")


def _grad_precision(run: dict, precision: str, notes: str, out: Mapped) -> str:
    """The precision gradients are accumulated and reduced in: fp16 with fp16, else fp32 (Megatron's
    main_grad, FSDP's reduce dtype); bf16 for the NeMo / Megatron-Bridge performance tables (their recipes set
    grad_reduce_in_fp32 = False) and for bf16 runs whose notes say so (e.g. FSDP mixed_precision PURE)."""
    grad = "fp16" if precision == "fp16" else "fp32"
    if "performance summary" in str(run.get("source") or "").lower() and precision != "fp16":
        grad = "bf16"
        out.assumptions.append(
            "gradients reduced in bf16: the NeMo / Megatron-Bridge performance recipes set "
            "grad_reduce_in_fp32 = False"
        )
    if precision == "bf16" and "gradients reduced in bf16" in notes:
        grad = "bf16"
        out.assumptions.append("gradients reduced in bf16 (notes)")
    return grad


def map_run(run: dict, systems: dict[str, System] | None = None) -> Mapped:
    """Turn one calibration record into a problem (or a reason to skip it): the fixed execution knobs go into
    the problem, the ones left to choose into `Mapped.free`, every assumption into `Mapped.assumptions`
    (module docstring), in the order system, era, model, precision, kernels, notes, batch and pipeline,
    memory, overlap, gradient precision."""
    out = Mapped(run)
    system = _system_of(run, systems, out)
    if system is None:
        return out
    year, stack, notes = run_year(run), stack_of(run), _notes(run)
    flash = _era(year, notes, out)
    llm = _model_of(run, year, out)
    precision = _precision_of(run, year, notes, out)
    if system.peak_tflops(precision) is None:
        out.skip = f"system {system.name} has no {precision} peak"
        return out
    fixed = _kernel_knobs(run, llm, year, stack, notes, flash, out)
    free: dict[str, list] = {}
    _notes_knobs(run, notes, fixed, free, out)
    _batch_and_pipeline(run, stack, fixed, free, out)
    _memory_knobs(run, year, notes, fixed, free, out)
    _overlap_knobs(run, year, notes, fixed, free, out)
    grad = _grad_precision(run, precision, notes, out)
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
        ex = stack_defaults(p.stack, ex)
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


def load_runs(path: str) -> Sourced:
    """A runs file, every record checked against the run schema (`optimizer.schema.run`: unknown keys and
    wrong types are file:line:field errors); the records come back with every key present."""
    from optimizer.errors import ProblemErrors
    from optimizer.io.loader import validate_model
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
