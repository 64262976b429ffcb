"""Parameter and model-FLOP counts (optimizer.model.params), checked against hand arithmetic."""

from __future__ import annotations

import pytest
from helpers import library_llm

from optimizer.model.params import count, model_flops_per_token
from optimizer.schema import LLM


# ----------------------------------------------------------------------------------- library models
def test_gpt3_175b_total_is_175b():
    # h=12288, f=4h, L=96, V=51200, MHA with biases, tied embeddings:
    # per layer 12h^2 + 13h = 1,811,939,328 + 159,744 = 1,812,099,072
    # total = 96 * 1,812,099,072 + V*h (629,145,600) + final LayerNorm 2h (24,576) = 174,590,681,088
    pc = count(library_llm("gpt3-175b"))
    assert pc.total == pytest.approx(175e9, rel=5e-3)
    assert pc.total == 174_590_681_088
    assert pc.head == 0  # tied
    assert pc.per_layer == 12 * 12288**2 + 13 * 12288


def test_llama31_8b_total():
    # h=4096, a=32, g=8, d=128, f=14336 (swiglu), L=32, V=128256, untied, no bias
    # attn = 4096*(32+16)*128 + 32*128*4096 = 25,165,824 + 16,777,216 = 41,943,040
    # mlp = 3*4096*14336 = 176,160,768; norms = 2*4096 = 8,192; per layer 218,112,000
    # total = 32*218,112,000 + 2*128256*4096 + 4096 = 6,979,584,000 + 1,050,673,152 + 4,096 = 8,030,261,248
    pc = count(library_llm("llama3.1-8b"))
    assert pc.total == pytest.approx(8.03e9, rel=5e-3)
    assert (pc.attention, pc.mlp, pc.norms) == (41_943_040, 176_160_768, 8_192)
    assert pc.total == 8_030_261_248


def test_llama31_70b_total():
    # h=8192, a=64, g=8, d=128, f=28672, L=80, V=128256
    # attn = 8192*80*128 + 64*128*8192 = 83,886,080 + 67,108,864 = 150,994,944
    # mlp = 3*8192*28672 = 704,643,072; norms 16,384 -> per layer 855,654,400
    # total = 80*855,654,400 + 2*128256*8192 + 8192 = 68,452,352,000 + 2,101,346,304 + 8,192 = 70,553,706,496
    pc = count(library_llm("llama3.1-70b"))
    assert pc.total == pytest.approx(70.6e9, rel=5e-3)
    assert pc.total == 70_553_706_496


# ----------------------------------------------------------------------------------- tiny hand-made models
TINY = LLM(
    name="tiny",
    hidden=8,
    heads=2,
    kv_heads=1,
    ffn=16,
    layers=2,
    vocab=10,
    seq_len=4,
    mlp="swiglu",
    bias=False,
    tied_embeddings=False,
)
# d = h/a = 4
# attention: h*(a+2g)*d + a*d*h = 8*(2+2)*4 + 2*4*8 = 128 + 64 = 192
# mlp (gated, 3 matrices): 3*h*f = 3*8*16 = 384
# norms (no bias): 2h = 16             -> per layer 192 + 384 + 16 = 592
# embedding V*h = 80, untied head 80, final norm h = 8
# total = 2*592 + 80 + 80 + 8 = 1352
TINY_TOTAL = 1352


def test_tiny_swiglu_gqa_exact_count():
    pc = count(TINY)
    assert pc.attention == 192
    assert pc.mlp == 384
    assert pc.norms == 16
    assert pc.per_layer == 592
    assert pc.embedding == 80 and pc.head == 80
    assert pc.total == TINY_TOTAL
    assert pc.active == TINY_TOTAL  # dense
    assert pc.non_embedding == TINY_TOTAL - 80 - 80  # 1192


def test_tiny_gelu_bias_tied_exact_count():
    llm = LLM(
        name="tiny-gpt",
        hidden=8,
        heads=2,
        ffn=32,
        layers=1,
        vocab=10,
        seq_len=4,
        mlp="gelu",
        bias=True,
        tied_embeddings=True,
    )
    # d = 4, g = a = 2
    # attention weights 8*(2+4)*4 + 2*4*8 = 192 + 64 = 256; biases (a+2g)d + h = 24 + 8 = 32 -> 288
    # mlp weights 2*8*32 = 512; biases f + h = 32 + 8 = 40 -> 552
    # norms with beta: 4h = 32 -> per layer 288 + 552 + 32 = 872
    # embedding 80, head 0 (tied), final LayerNorm 2h = 16 -> total 872 + 80 + 16 = 968
    pc = count(llm)
    assert (pc.attention, pc.mlp, pc.norms, pc.per_layer) == (288, 552, 32, 872)
    assert pc.head == 0
    assert pc.total == 968


def test_moe_counts():
    from optimizer.schema import MoE

    llm = LLM(
        name="tiny-moe",
        hidden=8,
        heads=2,
        ffn=16,
        layers=2,
        vocab=10,
        seq_len=4,
        mlp="swiglu",
        moe=MoE(experts=4, top_k=1, expert_ffn=16, moe_layers=1),
    )
    # attn 8*6*4 + 2*4*8 = 256; norms 16; one expert 3*8*16 = 384; router h*E = 32
    # MoE layer MLP: 4*384 + 32 = 1568; dense layer MLP: 384
    # total = 2*(256+16) + 1568 + 384 + 80 + 80 + 8 = 544 + 1952 + 168 = 2664
    # active: MoE layer uses top_k=1 expert + router = 384 + 32 = 416 -> 544 + 416 + 384 + 168 = 1512
    pc = count(llm)
    assert pc.total == 2664
    assert pc.active == 1512


def test_attention_flops_term():
    # The attention term is 12*L*s*a*d, halved when only the causal half is counted:
    # full - causal = 6*L*s*a*d = 6*2*4*2*4 = 384
    full = model_flops_per_token(TINY, 4)
    causal = model_flops_per_token(TINY, 4, causal_attention=True)
    assert full - causal == pytest.approx(384.0)
    # and it grows linearly in s: doubling s adds 12*L*(8-4)*a*d = 12*2*4*2*4 = 768
    assert model_flops_per_token(TINY, 8) - full == pytest.approx(768.0)


def test_model_flops_untied_is_6n_plus_attention():
    # N = matmul parameters = everything but the embedding lookup (LM head included) = 1352 - 80 = 1272
    # 6N = 7632; attention 12*L*s*a*d = 12*2*4*2*4 = 768 -> 8400
    assert model_flops_per_token(TINY, 4) == pytest.approx(8400.0)


def test_model_flops_tied_is_6n_plus_attention():
    llm = LLM(**{**TINY.model_dump(), "tied_embeddings": True})
    # total 1352 - 80 (no separate head) = 1272; the LM head GEMM still runs: N = 1272 - 80 + 80 = 1272
    # 6N = 7632; + attention 768 -> 8400 (same as untied: tying shares storage, not FLOPs)
    assert model_flops_per_token(llm, 4) == pytest.approx(8400.0)
