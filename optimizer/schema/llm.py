"""Schema of an LLM: the shape of a decoder-only transformer."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from optimizer.schema.common import Float, Frozen, Int, MlpKind, PositiveFloat, PositiveInt


class MoE(Frozen):
    """Mixture of experts in the MLP of (some) layers."""

    experts: PositiveInt = Field(le=65536, description="Routed experts per MoE layer (at most 65,536).")
    top_k: PositiveInt = Field(description="Routed experts each token is sent to.")
    expert_ffn: PositiveInt = Field(
        description="Intermediate size of one routed expert (gated size for gated MLPs)."
    )
    shared_experts: Int = Field(0, ge=0, description="Always-active shared experts, each of size expert_ffn.")
    moe_layers: PositiveInt | None = Field(
        None, description="Number of layers whose MLP is MoE (the rest are dense with `ffn`); null = all."
    )
    capacity_factor: Float = Field(
        1.0,
        gt=0,
        le=64,
        description="Tokens an expert receives relative to a perfectly balanced router "
        "(load imbalance of the busiest expert); scales expert compute and dispatch volume.",
    )
    routing_cv: Float = Field(
        0.0,
        ge=0,
        le=10,
        description="Routing skew: the coefficient of variation (std / mean) of the tokens each expert "
        "receives in a micro-batch; 0 = balanced (vendor benchmarks' force-balanced routing). The busiest of "
        "ep ranks then computes and receives 1 + cv sqrt(2 ln(ep) / (E / ep)) times the mean: more "
        "expert parallelism, fewer experts per rank to average over, a larger overload. Dropless routing; "
        "the two factors multiply, so with token dropping give capacity_factor alone.",
    )
    expert_bias: bool = Field(
        False,
        description="The routed experts' linears carry biases (GPT-OSS). Megatron-Core's "
        "eager expert MLP adds the down-projection's, scaled by each row's routing probability, "
        "in passes of its own after the grouped GEMM.",
    )

    @model_validator(mode="after")
    def _check(self) -> MoE:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        return self


class MLA(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3; DeepSeek-AI 2024, Sec. 2.1.1). Queries and keys/values
    are projected down to low-rank latents (replicated over TP ranks, as in Megatron-Core) and back up to
    `heads` heads; `head_dim` is the non-rotary query/key part of a head. Modelled exactly in parameter
    counts and projection FLOPs; the attention core runs on heads with query/key size
    head_dim + qk_rope_head_dim and value size v_head_dim (FLOPs at their mean per head)."""

    q_lora_rank: Int = Field(0, ge=0, description="Rank of the query latent (0 = queries not compressed).")
    kv_lora_rank: PositiveInt = Field(description="Rank of the joint key/value latent.")
    qk_rope_head_dim: PositiveInt = Field(description="Rotary (decoupled) part of each query/key head.")
    v_head_dim: PositiveInt = Field(description="Size of one value head.")


class RopeScaling(StrEnum):
    """How rotary frequencies are rescaled for a longer context."""

    LLAMA3 = (
        "llama3"  # Llama 3.1: low frequencies divided by the factor, high ones kept, a smooth band between
    )
    YARN = "yarn"  # YaRN (Peng et al. 2023, arXiv:2309.00071)
    LINEAR = "linear"  # position interpolation (Chen et al. 2023, arXiv:2306.15595)


class Rope(Frozen):
    """Rotary position embedding (RoPE; Su et al. 2021, arXiv:2104.09864): its base and long-context
    rescaling. Not a cost: rotary is priced as an elementwise kernel on q and k whatever its base; the
    exports write it so that the framework trains the model described."""

    theta: PositiveFloat = Field(
        le=1e12, description="Rotary base (Llama 3: 500,000; the frameworks' default 10,000)."
    )
    scaling: RopeScaling | None = Field(
        None, description="Frequency rescaling for long context: llama3, yarn or linear; null = none."
    )
    factor: PositiveFloat | None = Field(
        None, le=1e6, description="Context-extension factor of the scaling (Llama 3.1: 8); with `scaling`."
    )

    @model_validator(mode="after")
    def _factor_with_scaling(self) -> Rope:
        if (self.scaling is None) != (self.factor is None):
            raise ValueError("rope.scaling and rope.factor go together (both set, or neither)")
        return self


class SlidingWindow(Frozen):
    """Local (sliding-window) causal attention in some layers: each query attends to the `tokens` keys before
    it (Mistral 7B: every layer, 4096; GPT-OSS: every other layer, 128; Gemma 2/3: alternating or 5 of 6)."""

    tokens: PositiveInt = Field(description="Keys each query attends to (the window, the query included).")
    layers: PositiveInt | None = Field(
        None,
        description="Number of layers with the window (the rest attend to the whole sequence); null = all.",
    )


class LLM(Frozen):
    """A decoder-only transformer. Shapes as in the model's paper or config file."""

    name: str = Field(description="Identifier, e.g. gpt3-175b.")
    source: str | None = Field(None, description="Where the shape comes from (paper, config file).")
    hidden: PositiveInt = Field(description="Model width h.")
    ffn: PositiveInt = Field(description="MLP intermediate size (for gated MLPs the gated size, e.g. 14336).")
    layers: PositiveInt = Field(le=100_000, description="Transformer blocks L (at most 100,000).")
    heads: PositiveInt = Field(le=65536, description="Query attention heads a (at most 65,536).")
    kv_heads: PositiveInt | None = Field(
        None, description="K/V heads g (GQA when < heads, MQA when 1); null = heads."
    )
    head_dim: PositiveInt | None = Field(None, description="Size of one head; null = hidden / heads.")
    seq_len: PositiveInt = Field(description="Training sequence length s (tokens).")
    vocab: PositiveInt = Field(description="Vocabulary size V (embedding rows, LM-head columns).")
    mlp: MlpKind = Field(MlpKind.GELU, description="MLP kind: gelu, relu, squared_relu, swiglu, geglu.")
    tied_embeddings: bool = Field(False, description="LM head shares the input embedding matrix.")
    bias: bool = Field(False, description="Linear layers carry biases (GPT-2/3 style).")
    dropout: bool = Field(
        False, description="Dropout after attention scores, attention and MLP (GPT-3/Megatron recipe)."
    )
    moe: MoE | None = Field(None, description="Mixture-of-experts settings; null for a dense model.")
    rope: Rope | None = Field(
        None,
        description="Rotary positions: base and long-context scaling; null = not stated (exports leave "
        "the framework's default).",
    )
    mla: MLA | None = Field(None, description="Multi-head latent attention (DeepSeek); null = MHA/GQA/MQA.")
    sliding_window: SlidingWindow | None = Field(
        None,
        description="Local attention in some or all layers; null = "
        "every layer attends to the whole (causal) sequence.",
    )
    activation_clamp: PositiveFloat | None = Field(
        None,
        description="The GLU's halves clamped before the activation "
        "(GPT-OSS: swiglu_limit 7.0; null = none). Megatron-Core's eager "
        "expert MLP clamps outside its fused activation kernel.",
    )
    mtp_layers: Int = Field(
        0,
        ge=0,
        le=16,
        description="Multi-token prediction modules trained with the model (DeepSeek-V3: 1; "
        "DeepSeek-AI 2024, Sec. 2.2; HF num_nextn_predict_layers, Megatron-Core mtp_num_layers): each "
        "the embedding of the next token, a 2h -> h projection, one transformer block like the model's "
        "last and the shared LM head and loss, on the last pipeline stage. Stacks without MTP (all but "
        "megatron-core) train without them.",
    )
    attention_sinks: bool = Field(
        False,
        description="Learned attention sinks (GPT-OSS): one logit per head added "
        "to every softmax denominator. Costs nothing forward; its gradient adds a pass "
        "per query row to the fused attention backward (measured, `SINK_BW_SM_S`).",
    )

    @property
    def window_share(self) -> float:
        """Fraction of the layers with sliding-window attention (0 without one)."""
        w = self.sliding_window
        if w is None:
            return 0.0
        return (w.layers if w.layers is not None else self.layers) / self.layers

    @property
    def kv(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def dhead(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def moe_layer_count(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        if self.moe is None:
            return 0
        return self.moe.moe_layers if self.moe.moe_layers is not None else self.layers

    @property
    def core_dim(self) -> float:
        """Per-head size the attention core works on: head_dim, or for MLA the mean of the query/key
        (head_dim + rope) and value sizes (QK^T and PV FLOPs are proportional to each)."""
        if self.mla is None:
            return float(self.dhead)
        return (self.dhead + self.mla.qk_rope_head_dim + self.mla.v_head_dim) / 2.0

    @model_validator(mode="after")
    def _check(self) -> LLM:
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden ({self.hidden}) is not a multiple of heads ({self.heads}); set head_dim"
            )
        w = self.sliding_window
        if w is not None and w.layers is not None and w.layers > self.layers:
            raise ValueError(f"sliding_window.layers ({w.layers}) cannot exceed layers ({self.layers})")
        return self
