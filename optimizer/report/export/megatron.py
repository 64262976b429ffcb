"""Megatron-LM (Megatron-Core) command line of a plan.

Argument names are those declared in Megatron-LM's ``megatron/training/arguments.py``.
The output is one bash command (``torchrun pretrain_gpt.py`` with continued lines); anything
that has no Megatron flag is written as comment lines *before* the command, never inside it.
"""

from __future__ import annotations

import shlex

from optimizer.model.compose import layout_slack, layout_units
from optimizer.model.hardware import QUANTIZED
from optimizer.rules.layout import dp_last
from optimizer.schema import Precision

# Megatron-Core's low-precision recipes (TransformerEngine; NeMo 2 sets the same through trainer.plugins):
# precision -> (format, recipe). MXFP8 from Megatron-Core 0.13, NVFP4 (the --fp4-* flags) from 0.14.
LOW_PRECISION = {
    Precision.FP8: ("hybrid", "delayed"),
    Precision.FP8_CURRENT: ("hybrid", "tensorwise"),
    Precision.FP8_BLOCK: ("e4m3", "blockwise"),
    Precision.MXFP8: ("e4m3", "mxfp8"),
    Precision.NVFP4: ("e2m1", "nvfp4"),
}
assert set(LOW_PRECISION) == set(QUANTIZED)


def cp_comm_sizes(problem, ex) -> tuple[str, list[int] | None]:
    """Megatron's --cp-comm-type for the plan's K/V exchange, and for a2a+p2p the hierarchical sizes (the
    all-to-all degree inside an NVLink domain, the ring across domains)."""
    from optimizer.rules.layout import cp_a2a_degree

    kind = ex.cp_comm.value.replace("a2a_p2p", "a2a+p2p")
    if ex.cp_comm.value != "a2a_p2p":
        return kind, None
    a = int(cp_a2a_degree(ex.tp, ex.cp, problem.system.networks[0].used))
    return kind, [a, ex.cp // a]


def chunk_layers(blocks: int, pp: int, vpp: int, keep: int = 0) -> list[int]:
    """Slots (layers, the MTP modules' blocks, the embedding and the loss where they are slots) of each of
    the pp*vpp model chunks of a custom layout, in Megatron-Core's chunk order (virtual stage major: rank r
    holds chunks r, r + pp, ...): each chunk ceil(blocks / (pp vpp)) as the model times it
    (`compose.edge_extra`), the last stage the padding fewer (at most a stage's), taken from its last chunk
    first while that keeps `keep` (the MTP modules and the loss), the rest of the padding from the chunks
    nearest the first edge."""
    n = pp * vpp
    counts = [-(-blocks // n)] * n  # each chunk's ceil(blocks / (pp vpp)) (`split_slots`)
    shed = int(layout_slack(blocks, pp, vpp, keep))  # as the model's (`_Shape.slack`)
    rest = sum(counts) - blocks - shed  # the padding the last stage keeps: from the chunks nearest the first
    last_stage = [n - 1 - k * pp for k in range(vpp)]  # its last chunk first
    for i in last_stage:
        cut = max(min(shed, counts[i] - (keep if i == n - 1 else 0)), 0)
        counts[i] -= cut
        shed -= cut
    rest += shed
    for i in (i for i in range(n) if i not in last_stage):
        cut = min(rest, counts[i])
        counts[i] -= cut
        rest -= cut
    return counts


def pipeline_layout(llm, ex, mtp: int = 0) -> str | None:
    """Megatron-Core's --pipeline-model-parallel-layout of a custom layout (`Execution.pp_uneven`): chunks
    separated by "|", E the embedding, t a transformer layer, m an MTP module, L the loss, the blocks per
    chunk of `chunk_layers`; None where the split is by layers (or the layout is that split)."""
    el = int(bool(ex.pp_embedding_loss))  # the embedding and the loss as slots of the layout
    units = int(layout_units(llm.layers, el, True, mtp))
    if not (ex.pp > 1 and ex.pp_uneven) or (mtp == 0 and units % (ex.pp * ex.vpp) == 0):
        return None  # a split by layers, or a custom layout that is one
    counts = chunk_layers(units, ex.pp, ex.vpp, mtp + el)
    seq = "E" * el + "t" * llm.layers + "m" * mtp + "L" * el
    edges = [0, *(sum(counts[: i + 1]) for i in range(len(counts)))]
    chunks = [seq[a:b] for a, b in zip(edges, edges[1:], strict=False)]
    if not el:
        chunks[0], chunks[-1] = "E" + chunks[0], chunks[-1] + "L"
    runs: list[list] = []  # runs of equal consecutive chunks, written (chunk|)*k
    for c in chunks:
        if runs and runs[-1][0] == c:
            runs[-1][1] += 1
        else:
            runs.append([c, 1])
    *head, (last, k) = runs
    out = "".join(f"({c}|)*{n}," if n > 1 else f"{c}|" for c, n in head)
    return out + (f"({last}|)*{k - 1},{last}" if k > 1 else last)


def _parallel_flags(problem, ex) -> list[str]:
    """Tensor, pipeline (interleaved, with the embedding and loss as slots, an uneven split as a layout) and
    context parallel sizes, the CP exchange, and data parallelism outermost (--use-tp-pp-dp-mapping)."""
    a = [f"--tensor-model-parallel-size {ex.tp}", f"--pipeline-model-parallel-size {ex.pp}"]
    if dp_last(ex):
        a.append("--use-tp-pp-dp-mapping")
    layout = pipeline_layout(problem.llm, ex, problem.mtp_layers)
    if layout is not None:
        # the layout fixes the chunks: no virtual-stage count, no embedding/loss accounting flags
        return a + [f"--pipeline-model-parallel-layout {layout}"] + _cp_flags(problem, ex)
    if ex.vpp > 1:
        a.append(f"--num-virtual-stages-per-pipeline-rank {ex.vpp}")
    if ex.pp > 1 and ex.pp_embedding_loss:
        # Layer count stays the model's; Megatron counts the embedding and loss as pipeline slots.
        a += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    return a + _cp_flags(problem, ex)


def _cp_flags(problem, ex) -> list[str]:
    """The context-parallel size and its exchange."""
    a = []
    if ex.cp > 1:
        a.append(f"--context-parallel-size {ex.cp}")
        kind, sizes = cp_comm_sizes(problem, ex)
        a.append(f"--cp-comm-type {kind}")
        if sizes:
            a.append(f"--hierarchical-context-parallel-sizes {sizes[0]} {sizes[1]}")
    return a


def _shape_flags(problem, ex) -> list[str]:
    """Batch sizes and the transformer's shape: layers, hidden and ffn sizes, heads (head size when not
    hidden / heads, query groups for GQA) and sequence length."""
    llm = problem.llm
    a = [
        f"--micro-batch-size {ex.micro_batch}",
        f"--global-batch-size {problem.training.global_batch}",
        f"--num-layers {llm.layers}",
        f"--hidden-size {llm.hidden}",
        f"--ffn-hidden-size {llm.ffn}",
        f"--num-attention-heads {llm.heads}",
        f"--seq-length {problem.seq_len}",
        f"--max-position-embeddings {problem.seq_len}",
    ]
    if llm.head_dim is not None and llm.head_dim * llm.heads != llm.hidden:
        a.append(f"--kv-channels {llm.head_dim}")
    if problem.mtp_layers:
        a.append(f"--mtp-num-layers {problem.mtp_layers}")
    kv = llm.kv_heads or llm.heads
    if kv != llm.heads:
        a += ["--group-query-attention", f"--num-query-groups {kv}"]
    return a


def _architecture_flags(llm, notes: list[str]) -> list[str]:
    """The MLP kind (gated ones Llama-style, with RMSNorm and rotary positions), untied embeddings, bias-free
    linears."""
    a = []
    mlp = llm.mlp.value
    if mlp in ("swiglu", "geglu"):
        a += ["--swiglu", "--normalization RMSNorm", "--position-embedding-type rope"]
        if mlp == "geglu":
            notes.append("GeGLU: Megatron has no flag; --swiglu gives the same shapes")
    elif mlp == "squared_relu":
        a.append("--squared-relu")
    a += _rope_flags(llm, notes)
    if not llm.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if not llm.bias:
        a.append("--disable-bias-linear")
    return a


def _rope_flags(llm, notes: list[str]) -> list[str]:
    """The rotary base and Llama 3.1's frequency rescaling (`--use-rope-scaling --rope-scaling-factor`) or
    position interpolation (`--rotary-seq-len-interpolation-factor`), as Megatron-LM's
    `_add_network_size_args` declares them; YaRN has no flag for GPT models there (a note)."""
    rope = llm.rope
    if rope is None:
        return []
    a = [f"--rotary-base {int(rope.theta) if rope.theta.is_integer() else rope.theta}"]  # an int there
    kind = rope.scaling.value if rope.scaling is not None else None
    if kind == "llama3":
        a += ["--use-rope-scaling", f"--rope-scaling-factor {rope.factor:g}"]
    elif kind == "linear":
        a.append(f"--rotary-seq-len-interpolation-factor {rope.factor:g}")
    elif kind == "yarn":
        notes.append(
            f"YaRN rope scaling (factor {rope.factor:g}): no pretrain_gpt.py flag; set it in the model"
        )
    return a


def moe_layer_freq(llm) -> str | None:
    """Megatron's --moe-layer-freq pattern when only some layers are MoE: the dense ones first, as the model
    places them (DeepSeek-V3: "([0]*3+[1]*58)"); None when every layer is."""
    n = llm.moe_layer_count
    if llm.moe is None or n == llm.layers:
        return None
    return f"([0]*{llm.layers - n}+[1]*{n})"


def _moe_flags(llm, ex) -> list[str]:
    """Mixture of experts: experts, top-k, expert ffn, expert and expert-tensor parallel sizes, shared
    experts, which layers are MoE (`moe_layer_freq`; the dense ones take --ffn-hidden-size), the grouped
    expert GEMM and the all-to-all dispatcher that were priced (Megatron's defaults are one GEMM per expert
    and the allgather dispatcher); the flex dispatcher is `_overlap_flags`'."""
    if llm.moe is None:
        return []
    m = llm.moe
    a = [
        f"--num-experts {m.experts}",
        f"--moe-router-topk {m.top_k}",
        f"--moe-ffn-hidden-size {m.expert_ffn}",
        f"--expert-model-parallel-size {ex.ep}",
        f"--expert-tensor-parallel-size {ex.etp or ex.tp}",
        "--moe-grouped-gemm",
    ]
    if m.shared_experts:
        a.append(f"--moe-shared-expert-intermediate-size {m.shared_experts * m.expert_ffn}")
    freq = moe_layer_freq(llm)
    if freq is not None:
        a.append(f"--moe-layer-freq {freq}")
    if ex.moe_dispatcher.value in ("alltoall", "allgather"):
        a.append(f"--moe-token-dispatcher-type {ex.moe_dispatcher.value}")
    return a


def _mla_flags(llm) -> list[str]:
    """Multi-latent attention: its low ranks and head sizes."""
    a = []
    if llm.mla is not None:
        ml = llm.mla
        a += [
            "--multi-latent-attention",
            f"--kv-lora-rank {ml.kv_lora_rank}",
            f"--qk-pos-emb-head-dim {ml.qk_rope_head_dim}",
            f"--v-head-dim {ml.v_head_dim}",
        ]
        if ml.q_lora_rank:
            a.append(f"--q-lora-rank {ml.q_lora_rank}")
    return a


def _precision_flags(prec) -> list[str]:
    """16-bit compute (bf16 also around low-precision GEMMs) and the FP8 / FP4 format and recipe
    (`LOW_PRECISION`)."""
    a = []
    if prec == Precision.BF16 or prec in QUANTIZED:
        a.append("--bf16")  # 16-bit master compute around the low-precision GEMMs
    if prec == Precision.FP16:
        a.append("--fp16")
    if prec in QUANTIZED:
        fmt, recipe = LOW_PRECISION[prec]
        bits = "fp4" if prec == Precision.NVFP4 else "fp8"
        a += [f"--{bits}-format {fmt}", f"--{bits}-recipe {recipe}"]
    return a


# ZeRO stage -> Megatron FSDP's --data-parallel-sharding-strategy (ZeRO-1 is the distributed optimizer)
FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def _memory_flags(ex, notes: list[str]) -> list[str]:
    """Sequence parallelism, recomputation and the distributed optimizer (ZeRO-1); ZeRO-2/3 run on
    Megatron FSDP, its sharding strategy the stage's (`FSDP_SHARDING`), with the checkpoint format it
    requires. Megatron FSDP rather than --use-torch-fsdp2, which refuses pipeline and expert parallelism and
    the distributed optimizer."""
    a = []
    if ex.sequence_parallel:
        a.append("--sequence-parallel")
    if ex.recompute.value == "selective":
        a.append("--recompute-granularity selective")
    elif ex.recompute.value == "full":
        a += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if ex.zero >= 1:
        a.append("--use-distributed-optimizer")  # Megatron FSDP (v1) runs its optimizer too
    if ex.zero >= 2:
        a += [
            "--use-megatron-fsdp",
            f"--data-parallel-sharding-strategy {FSDP_SHARDING[ex.zero]}",
            "--ckpt-format fsdp_dtensor",
        ]
        notes.append(
            f"ZeRO-{ex.zero}: Megatron FSDP ({FSDP_SHARDING[ex.zero]}) needs "
            "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1"
        )
    return a


def _overlap_flags(ex) -> list[str]:
    """Communication overlap and dispatch: gradient reduce and parameter gather, the MoE token dispatcher and
    expert-parallel overlap, TP communication, interleaved pipeline exchanges."""
    a = []
    if ex.dp_overlap:
        a.append("--overlap-grad-reduce")
        if ex.zero >= 1:
            a.append("--overlap-param-gather")
    if ex.moe_dispatcher.value == "flex":
        a += [
            "--moe-token-dispatcher-type flex",
            "--moe-flex-dispatcher-backend deepep",
        ]  # DeepEP (or hybridep)
    if ex.ep_overlap:
        a.append("--overlap-moe-expert-parallel-comm")  # Megatron-Core >= 0.14
    if ex.tp_overlap.value != "none":
        a.append("--tp-comm-overlap")
    if ex.pp > 1 and ex.vpp > 1 and not ex.pp_overlap:
        a.append("--no-overlap-p2p-communication")  # Megatron-LM overlaps interleaved p2p by default
    return a


def _kernel_offload_flags(ex, notes: list[str]) -> list[str]:
    """FlashAttention, the fused cross-entropy loss and optimizer CPU offload; weight and activation offload
    have no flag."""
    a = []
    if ex.attention.value in ("flash", "flash2", "flash-triton"):
        a.append("--use-flash-attn")
    if ex.attention.value == "flash-triton":
        notes.append(
            "attention: flash-triton (FlashAttention's Triton kernel) has no Megatron-LM flag; "
            "--use-flash-attn runs Megatron's fused kernel, faster than the plan assumed"
        )
    if ex.optimizer_offload:
        a.append("--optimizer-cpu-offload")
    if ex.fused_loss:
        a.append("--cross-entropy-loss-fusion")
    if ex.weight_offload or ex.activation_offload:
        notes.append("weight/activation offload has no Megatron-LM flag")
    return a


def args(problem, ex) -> tuple[list[str], list[str]]:
    """(arguments, notes) for the plan ``ex`` (a resolved Execution) of ``problem``: the flag groups in
    order (parallel sizes, shape, architecture, MoE and MLA, precision, memory, overlap, kernels and offload);
    the notes say what has no flag."""
    llm = problem.llm
    notes: list[str] = []
    a = _parallel_flags(problem, ex) + _shape_flags(problem, ex)
    a += _architecture_flags(llm, notes)
    a += _moe_flags(llm, ex) + _mla_flags(llm)
    a += _precision_flags(problem.training.precision)
    a += _memory_flags(ex, notes)
    a += _overlap_flags(ex)
    a += _kernel_offload_flags(ex, notes)
    return a, notes


def emit(problem, ex) -> str:
    """A bash command running Megatron-LM's pretrain_gpt.py with the plan's arguments."""
    a, notes = args(problem, ex)
    head = [f"# {n}" for n in notes]
    cmd = f"torchrun --nproc-per-node {problem.system.gpus_per_node} pretrain_gpt.py \\\n  " + " \\\n  ".join(
        " ".join(shlex.quote(w) for w in x.split()) for x in a
    )
    return "\n".join(head + [cmd]) + "\n"
