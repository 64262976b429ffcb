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
    MTP (deepseek): num_nextn_predict_layers -> mtp_layers
Biases: only GPT-NeoX has them on every linear layer (Qwen2's Q/K/V biases are too small to count).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError
from optimizer.schema.common import MAX_COUNT

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
    """The config's JSON object; `where` (file, line, field) of the `llm:` that names it, for errors. At most
    MAX_BYTES are read, and nesting beyond the parser's recursion is an error."""
    file, line, field = where
    try:
        with path.open("rb") as f:  # `resolve` has checked it is a regular file
            raw = f.read(MAX_BYTES + 1)
    except (OSError, ValueError) as e:
        raise ProblemError(
            file, line, field, f"cannot read {path}: {getattr(e, 'strerror', None) or e}"
        ) from None
    if len(raw) > MAX_BYTES:
        raise ProblemError(file, line, field, f"{path}: larger than a config.json (over 1 MiB)")
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProblemError(file, line, field, f"{path}: not a JSON config ({e})") from None
    except RecursionError:
        raise ProblemError(file, line, field, f"{path}: not a JSON config (nested too deeply)") from None
    if not isinstance(cfg, dict):
        raise ProblemError(file, line, field, f"{path}: a config.json is a JSON object")
    return cfg


def _kind(v: Any) -> str:
    """What a JSON value is, for messages (the value itself may be large)."""
    if v is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(v), repr(v)[:40])


def _int(cfg: dict, key: str, default: int | None = None) -> int:
    """cfg[key] as a count: a JSON integer (an integral number) in [0, MAX_COUNT]. With a `default`, a
    missing, null or 0 value gives it; without one a missing key is KeyError. Anything else is ValueError
    naming the key: null, a string, a fraction (4096.9 is not read as 4096), infinity (1e400), a magnitude
    no model has."""
    v = cfg.get(key)
    if default is not None and (v is None or v == 0):
        return default
    if key not in cfg:
        raise KeyError(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key}: must be an integer, not {_kind(v)}")
    if isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise ValueError(f"{key}: must be an integer, not {v!r}")
    if not 0 <= v <= MAX_COUNT:
        raise ValueError(f"{key}: must be in 0..{MAX_COUNT:,}, not {str(v)[:24]}")
    return int(v)


def _bool(cfg: dict, key: str) -> bool:
    """cfg[key] as a JSON boolean (missing or null: false); "false" is a string, not false."""
    v = cfg.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ValueError(f"{key}: must be true or false, not {_kind(v)}")
    return v


def _sparse_layers(cfg: dict, layers: int) -> int:
    """MoE layers among `layers`: from index first_k_dense_replace on, every decoder_sparse_step-th, less the
    indices in mlp_only_layers; counted, not listed, so the count costs nothing at any layer count."""
    dense = _int(cfg, "first_k_dense_replace", 0)
    step = max(1, _int(cfg, "decoder_sparse_step", 1))
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in only):
        raise ValueError(f"mlp_only_layers: must be a list of layer indices, not {_kind(only)}")
    # i in [dense, layers) with (i + 1) % step == 0: the multiples of step in [dense + 1, layers]
    n = max(0, layers // step - min(dense, layers) // step)
    return n - len({i for i in only if dense <= i < layers and (i + 1) % step == 0})


def _positive(v: Any, key: str) -> float:
    """A finite positive JSON number (not a boolean) naming `key` when it is not."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{key}: must be a positive number, not {str(v)[:24]}")
    return float(v)


ROPE_TYPES = {
    "llama3": "llama3",
    "yarn": "yarn",
    "linear": "linear",
}  # rope_scaling.rope_type -> Rope.scaling


def _rope(cfg: dict) -> dict[str, Any] | None:
    """`rope_theta` and `rope_scaling` (rope_type or the older type: llama3, yarn, linear, with its factor)
    as `Rope`; a scaling kind paraplan does not name (dynamic, longrope) keeps the base only."""
    if cfg.get("rope_theta") is None:
        return None
    out: dict[str, Any] = {"theta": _positive(cfg["rope_theta"], "rope_theta")}
    sc = cfg.get("rope_scaling")
    if isinstance(sc, dict):
        kind = ROPE_TYPES.get(str(sc.get("rope_type", sc.get("type", ""))).lower())
        if kind is not None and sc.get("factor") is not None:
            out |= {"scaling": kind, "factor": _positive(sc["factor"], "rope_scaling.factor")}
    return out


def _moe(cfg: dict, mt: str, layers: int) -> dict[str, Any] | None:
    """The `moe:` mapping of a mixture-of-experts config; None for a dense one."""
    key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k)), None)
    if key is None:
        return None
    moe = {
        "experts": _int(cfg, key),
        "top_k": _int(cfg, "num_experts_per_tok"),
        "expert_ffn": _int(cfg, "moe_intermediate_size", 0) or _int(cfg, "intermediate_size"),
        "shared_experts": _int(cfg, "n_shared_experts", 0),
    }
    sparse = _sparse_layers(cfg, layers)
    if mt in ("qwen2_moe",) and cfg.get("shared_expert_intermediate_size"):
        shared = _int(cfg, "shared_expert_intermediate_size")
        moe["shared_experts"] = max(1, shared // max(1, moe["expert_ffn"]))
    if sparse != layers:
        moe["moe_layers"] = sparse
    return moe


def to_llm(cfg: dict, name: str, seq_len: int | None = None) -> dict[str, Any]:
    """The LLM mapping (as a problem file would write it) of a Hugging Face config; KeyError names a missing
    field, ValueError an unsupported architecture or a field that is not a count (`_int`) or boolean."""
    mt = str(cfg.get("model_type", "")).lower()
    if mt not in SUPPORTED:
        raise ValueError(
            f"model_type {mt or '(none)'!r} is not supported (supported: {', '.join(SUPPORTED)})"
        )
    heads = _int(cfg, "num_attention_heads")
    out: dict[str, Any] = {
        "name": name,
        "source": f"Hugging Face config.json (model_type {mt})",
        "hidden": _int(cfg, "hidden_size"),
        "ffn": _int(cfg, "intermediate_size"),
        "layers": _int(cfg, "num_hidden_layers"),
        "heads": heads,
        "kv_heads": _int(cfg, "num_key_value_heads", heads),
        "seq_len": int(seq_len or _int(cfg, "max_position_embeddings")),
        "vocab": _int(cfg, "vocab_size"),
        "tied_embeddings": _bool(cfg, "tie_word_embeddings"),
        "dropout": False,
    }
    if cfg.get("head_dim"):
        out["head_dim"] = _int(cfg, "head_dim")
    act = str(cfg.get("hidden_act", "silu")).lower()
    out["mlp"] = "gelu" if "gelu" in act else "relu" if act == "relu" else "swiglu"  # silu/swish: gated
    out["bias"] = mt == "gpt_neox"
    rope = _rope(cfg)
    if rope is not None:
        out["rope"] = rope
    moe = _moe(cfg, mt, out["layers"])
    if moe is not None:
        out["moe"] = moe
    if mt.startswith("deepseek") and cfg.get("kv_lora_rank"):
        out["mla"] = {
            "q_lora_rank": _int(cfg, "q_lora_rank", 0),
            "kv_lora_rank": _int(cfg, "kv_lora_rank"),
            "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
            "v_head_dim": _int(cfg, "v_head_dim"),
        }
        out["head_dim"] = _int(cfg, "qk_nope_head_dim")
        out["kv_heads"] = heads  # MLA decompresses K and V per head
    if mt.startswith("deepseek") and cfg.get("num_nextn_predict_layers"):
        out["mtp_layers"] = _int(cfg, "num_nextn_predict_layers")
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
    except (TypeError, ValueError, OverflowError) as e:
        raise ProblemError(file, line, field, f"{path}: {e}") from None
