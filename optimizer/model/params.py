"""Parameter and FLOP counts of an LLM (exact for the modelled architecture).

MoE layers: routed experts ``E*k*h*f_e``, shared experts ``S*k*h*f_e``, router ``h*E``; a token uses
top_k routed and all shared experts (active parameters). Attention per `attention_params` (MLA included).

Dense layer parameters: attention Q, K, V and output projections ``h*(a + 2g)*d + a*d*h``; MLP
``k*h*f`` with k = 3 for gated MLPs, else 2; norms ``2h`` (``4h`` with biases: LayerNorm beta);
biases ``(a+2g)d + h + f_k + h`` when `bias`. Embedding ``V*h``; the LM head ``V*h`` unless tied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.schema import LLM


@dataclass(frozen=True)
class ParamCounts:
    attention: int
    mlp: int  # dense MLP of one layer (for MoE layers: all experts, see moe_*)
    norms: int
    per_layer: int
    embedding: int
    head: int  # 0 when tied
    total: int
    active: int  # per token (= total for dense models)
    non_embedding: int


def mlp_matrices(llm: LLM) -> int:
    return 3 if llm.mlp.gated else 2


def attention_params(llm: LLM, tp=1):
    """Attention weights one of `tp` ranks holds, as (input projections, output projection).

    MHA/GQA/MQA: Q, K, V ``h*(a/tp + 2*g_r)*d`` with g_r = g/tp K/V heads (at least 1: Megatron replicates
    K/V heads when tp > g), output ``(a/tp)*d*h``. MLA (DeepSeek-V3): the down-projections ``h*q_lora`` and
    ``h*(kv_lora + rope)`` are replicated on every rank, the up-projections ``q_lora*a*(d + rope)`` (or
    ``h*a*(d + rope)`` without a query latent) and ``kv_lora*a*(d + v)`` and the output ``a*v*h`` split
    over tp, plus the two latent RMSNorms."""
    h, a, d = llm.hidden, llm.heads, llm.dhead
    tp = np.asarray(tp, dtype=float)
    if llm.mla is None:
        g = np.maximum(llm.kv / tp, 1.0)
        return h * (a / tp + 2 * g) * d, (a / tp) * d * h
    m = llm.mla
    dqk = d + m.qk_rope_head_dim
    q = (
        (h * m.q_lora_rank + m.q_lora_rank * a * dqk / tp + m.q_lora_rank)
        if m.q_lora_rank
        else h * a * dqk / tp
    )
    kv = (
        h * (m.kv_lora_rank + m.qk_rope_head_dim)
        + m.kv_lora_rank * a * (d + m.v_head_dim) / tp
        + m.kv_lora_rank
    )
    return q + kv, a * m.v_head_dim * h / tp


def count(llm: LLM) -> ParamCounts:
    h, a, g, d, f, L, V = llm.hidden, llm.heads, llm.kv, llm.dhead, llm.ffn, llm.layers, llm.vocab
    attn = int(round(float(sum(attention_params(llm)))))
    k = mlp_matrices(llm)
    mlp = k * h * f
    norms = 2 * h
    if llm.bias:
        attn += (a + 2 * g) * d + h
        mlp += (f * (k - 1)) + h
        norms += 2 * h
    emb = V * h
    head = 0 if llm.tied_embeddings else V * h
    final_norm = h * (2 if llm.bias else 1)
    if llm.moe is None:
        per_layer = attn + mlp + norms
        total = L * per_layer + emb + head + final_norm
        return ParamCounts(attn, mlp, norms, per_layer, emb, head, total, total, total - emb - head)
    m = llm.moe
    n_moe = llm.moe_layer_count
    expert = k * h * m.expert_ffn
    moe_mlp = (m.experts + m.shared_experts) * expert + h * m.experts  # + router
    moe_active = (m.top_k + m.shared_experts) * expert + h * m.experts
    total = L * (attn + norms) + n_moe * moe_mlp + (L - n_moe) * mlp + emb + head + final_norm
    active = L * (attn + norms) + n_moe * moe_active + (L - n_moe) * mlp + emb + head + final_norm
    return ParamCounts(attn, mlp, norms, attn + mlp + norms, emb, head, total, active, total - emb - head)


def model_flops_per_token(llm: LLM, seq_len: int, causal_attention: bool = False) -> float:
    """Forward+backward FLOPs per token of the useful (model) math: 6 x active matmul parameters
    (embedding lookup excluded, LM head included) + attention scores and values 12 x L x s x a x d
    (PaLM, Chowdhery et al. 2022, App. B), halved when counting only the causal half."""
    pc = count(llm)
    # active parameters without the embedding lookup and the (untied) head, plus the head GEMM itself
    matmul_params = pc.active - pc.embedding - pc.head + llm.vocab * llm.hidden
    attn = 12.0 * llm.layers * seq_len * llm.heads * llm.core_dim * (0.5 if causal_attention else 1.0)
    return 6.0 * matmul_params + attn
