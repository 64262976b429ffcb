"""`llm:` from a Hugging Face `config.json`: the model's shape read from the fields its architecture uses.

Architectures (the config's `model_type`): llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe,
deepseek_v3 (and deepseek_v2), gpt_neox. The training sequence length is the problem's
`training.seq_len` when given, else the config's `max_position_embeddings` (often a long-context length:
set `training.seq_len` to the pre-training length). Mappings:

    hidden_size -> hidden, intermediate_size -> ffn, num_hidden_layers -> layers,
    num_attention_heads -> heads, num_key_value_heads -> kv_heads, head_dim -> head_dim,
    vocab_size -> vocab, tie_word_embeddings -> tied_embeddings,
    hidden_act silu (llama family, qwen, mistral, deepseek) -> swiglu; gelu (gpt_neox) -> gelu
    MoE: num_local_experts (mixtral) | num_experts (qwen) | n_routed_experts (deepseek) -> experts,
         num_experts_per_tok -> top_k, moe_intermediate_size (else intermediate_size) -> expert_ffn,
         n_shared_experts (deepseek) -> shared_experts; first_k_dense_replace (deepseek) or
         mlp_only_layers / decoder_sparse_step (qwen) -> moe_layers
    MLA (deepseek): q_lora_rank, kv_lora_rank, qk_rope_head_dim, v_head_dim; qk_nope_head_dim -> head_dim
Biases: only GPT-NeoX has them on every linear layer (Qwen2's Q/K/V biases are too small to count).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError

SUPPORTED = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_neox",
)
MAX_BYTES = 1 * 2**20


def read(path: Path, where: tuple[str, int | None, str]) -> dict:
    """The config's JSON object; `where` (file, line, field) of the `llm:` that names it, for errors."""
    file, line, field = where
    try:
        raw = path.read_bytes()[: MAX_BYTES + 1]
    except OSError as e:
        raise ProblemError(file, line, field, f"cannot read {path}: {e.strerror}") from None
    if len(raw) > MAX_BYTES:
        raise ProblemError(file, line, field, f"{path}: larger than a config.json (over 1 MiB)")
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProblemError(file, line, field, f"{path}: not a JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise ProblemError(file, line, field, f"{path}: a config.json is a JSON object")
    return cfg


def to_llm(cfg: dict, name: str, seq_len: int | None = None) -> dict[str, Any]:
    """The LLM mapping (as a problem file would write it) of a Hugging Face config; KeyError names a missing
    field, ValueError an unsupported architecture."""
    mt = str(cfg.get("model_type", "")).lower()
    if mt not in SUPPORTED:
        raise ValueError(
            f"model_type {mt or '(none)'!r} is not supported (supported: {', '.join(SUPPORTED)})"
        )
    g = cfg.__getitem__
    heads = int(g("num_attention_heads"))
    out: dict[str, Any] = {
        "name": name,
        "source": f"Hugging Face config.json (model_type {mt})",
        "hidden": int(g("hidden_size")),
        "ffn": int(g("intermediate_size")),
        "layers": int(g("num_hidden_layers")),
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "seq_len": int(seq_len or g("max_position_embeddings")),
        "vocab": int(g("vocab_size")),
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "dropout": False,
    }
    if cfg.get("head_dim"):
        out["head_dim"] = int(cfg["head_dim"])
    act = str(cfg.get("hidden_act", "silu")).lower()
    out["mlp"] = "gelu" if "gelu" in act else "relu" if act == "relu" else "swiglu"  # silu/swish: gated
    out["bias"] = mt == "gpt_neox"
    L = out["layers"]
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if experts:
        moe = {
            "experts": int(experts),
            "top_k": int(g("num_experts_per_tok")),
            "expert_ffn": int(cfg.get("moe_intermediate_size") or g("intermediate_size")),
            "shared_experts": int(cfg.get("n_shared_experts") or 0),
        }
        dense = int(cfg.get("first_k_dense_replace") or 0)
        only = cfg.get("mlp_only_layers") or []
        step = int(cfg.get("decoder_sparse_step") or 1)
        sparse = [i for i in range(L) if i >= dense and i not in only and (i + 1) % step == 0]
        if mt in ("qwen2_moe",) and cfg.get("shared_expert_intermediate_size"):
            moe["shared_experts"] = max(1, int(cfg["shared_expert_intermediate_size"]) // moe["expert_ffn"])
        if len(sparse) != L:
            moe["moe_layers"] = len(sparse)
        out["moe"] = moe
    if mt.startswith("deepseek") and cfg.get("kv_lora_rank"):
        out["mla"] = {
            "q_lora_rank": int(cfg.get("q_lora_rank") or 0),
            "kv_lora_rank": int(g("kv_lora_rank")),
            "qk_rope_head_dim": int(g("qk_rope_head_dim")),
            "v_head_dim": int(g("v_head_dim")),
        }
        out["head_dim"] = int(g("qk_nope_head_dim"))
        out["kv_heads"] = heads  # MLA decompresses K and V per head
    return out


def resolve(value: str, near: Path | None, where: tuple[str, int | None, str], seq_len: int | None) -> dict:
    """The LLM mapping of `llm: path/to/config.json` (relative to the problem file)."""
    file, line, field = where
    path = (near / value) if near is not None else Path(value)
    try:
        ok = path.is_file()
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise ProblemError(file, line, field, f"file not found: {value[:200]}")
    cfg = read(path, where)
    name = path.parent.name if path.name == "config.json" else path.stem
    try:
        return to_llm(cfg, name, seq_len)
    except KeyError as e:
        raise ProblemError(file, line, field, f"{path}: config lacks {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ProblemError(file, line, field, f"{path}: {e}") from None
