"""Memory per GPU: bytes per parameter (mixed precision, ZeRO stages) and Korthikanti 2022 activations."""

from __future__ import annotations

import pytest
from helpers import library_llm, library_system, problem_and_knobs

from optimizer.model.layer import block_cost
from optimizer.model.params import count
from optimizer.model.step import evaluate, layer_params_per_gpu, make_ctx
from optimizer.schema import LLM, Execution, Training

A100 = "a100-sxm-80gb"

# llama3.1-8b, tp = pp = 1 (see test_params for the arithmetic):
N_8B = 8_030_261_248  # count(llm).total
LAYER_8B = 218_112_000  # one layer's weights: 41,943,040 + 176,160,768 + 8,192
# The step model holds L*layer + embedding + head = 32*218,112,000 + 2*525,336,576 = 8,030,257,152 parameters,
# i.e. all but the final RMSNorm (h = 4096, 5e-7 of the total; see test_weights_hold_every_parameter), so
# bytes/parameter ratios are compared with a relative tolerance of 1e-6.
REL = 1e-6


def _state(ex: Execution, grad_precision: str, num_gpus: int = 8):
    llm = library_llm("llama3.1-8b")
    p, k = problem_and_knobs(
        llm,
        library_system(A100),
        num_gpus,
        Training(global_batch=64, precision="bf16", grad_precision=grad_precision),
        ex,
    )
    r = evaluate(p, k)
    return p, k, r


def _bpp(r) -> float:
    return float((r.weights + r.grads + r.optim_state)[0]) / N_8B


def test_total_parameter_constant():
    assert count(library_llm("llama3.1-8b")).total == N_8B


def test_16_bytes_per_param_bf16_grads_no_sharding():
    # bf16 weights 2 + bf16 grads 2 + fp32 master, m, v 12 = 16 B/param (ZeRO paper accounting)
    _, _, r = _state(Execution(zero=0), "bf16")
    assert _bpp(r) == pytest.approx(16.0, rel=REL)
    assert float(r.weights[0]) / N_8B == pytest.approx(2.0, rel=REL)
    assert float(r.grads[0]) / N_8B == pytest.approx(2.0, rel=REL)
    assert float(r.optim_state[0]) / N_8B == pytest.approx(12.0, rel=REL)


def test_18_bytes_per_param_fp32_grads():
    # Megatron main_grad in fp32: 2 + 4 + 12 = 18
    _, _, r = _state(Execution(zero=0), "fp32")
    assert _bpp(r) == pytest.approx(18.0, rel=REL)


def test_zero1_over_dp8():
    # optimizer state sharded over dp = 8: 2 + 4 + 12/8 = 7.5
    _, k, r = _state(Execution(zero=1), "fp32")
    assert int(k.dp[0]) == 8
    assert _bpp(r) == pytest.approx(2 + 4 + 12 / 8, rel=REL)


def test_zero2_over_dp8():
    # + gradients sharded: 2 + (4 + 12)/8 = 4
    _, _, r = _state(Execution(zero=2), "fp32")
    assert _bpp(r) == pytest.approx(2 + (4 + 12) / 8, rel=REL)


def test_zero3_over_dp8_with_gathered_two_layer_buffer():
    # + weights sharded: (2 + 4 + 12)/8 = 2.25 B/param, plus two gathered layers of bf16 weights:
    # 2 layers * 218,112,000 params * 2 B = 872,448,000 B -> 872,448,000 / 8,030,261,248 = 0.108645... B/param
    p, k, r = _state(Execution(zero=3), "fp32")
    assert float(layer_params_per_gpu(make_ctx(p), k)[0]) == LAYER_8B
    buffer = 872_448_000  # 2 layers x 218,112,000 params x 2 B
    assert _bpp(r) == pytest.approx((2 + 4 + 12) / 8 + buffer / N_8B, rel=REL)
    assert float(r.weights[0]) == pytest.approx(2 * N_8B / 8 + buffer, rel=REL)


def test_layer_params_per_gpu_tp_sharding():
    llm = library_llm("llama3.1-8b")
    sysm = library_system(A100)
    # tp = 8: a/tp = 4 q heads, g/tp = 1 kv head
    # attn = 4096*(4 + 2*1)*128 + 4*128*4096 = 3,145,728 + 2,097,152 = 5,242,880
    # mlp = 176,160,768/8 = 22,020,096; norms replicated 8,192 -> 27,271,168
    p, k = problem_and_knobs(llm, sysm, 8, Training(global_batch=8), Execution(tp=8))
    assert float(layer_params_per_gpu(make_ctx(p), k)[0]) == 27_271_168
    # tp = 16 > g = 8: K/V heads are replicated (1 per rank), 2 q heads per rank
    # attn = 4096*(2 + 2)*128 + 2*128*4096 = 2,097,152 + 1,048,576 = 3,145,728
    # mlp = 176,160,768/16 = 11,010,048; + 8,192 -> 14,163,968
    p, k = problem_and_knobs(llm, sysm, 16, Training(global_batch=16), Execution(tp=16))
    assert float(layer_params_per_gpu(make_ctx(p), k)[0]) == 14_163_968


def test_weights_hold_every_parameter():
    # tiny GPT: total 968 parameters (test_params.test_tiny_gelu_bias_tied_exact_count); tp = pp = 1, bf16:
    # weights = 2 B * 968 = 1936 B
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
    p, k = problem_and_knobs(llm, library_system(A100), 1, Training(global_batch=1), Execution())
    assert float(evaluate(p, k).weights[0]) == 2 * 968


# ----------------------------------------------------------------------------- activations (Korthikanti 2022)
# GPT-style block: gelu, dropout, biases, ffn = 4h, a*d = h, standard attention, bf16.
H, A, S, B = 1024, 16, 2048, 2
GPT = LLM(
    name="gpt-like",
    hidden=H,
    heads=A,
    head_dim=H // A,
    ffn=4 * H,
    layers=4,
    vocab=1024,
    seq_len=S,
    mlp="gelu",
    bias=True,
    dropout=True,
    tied_embeddings=True,
)
SBH = S * B * H  # 4,194,304
ATT = 5 * A * S * S * B  # 5 a s^2 b = 671,088,640


def _act(tp: int, **ex) -> float:
    e = Execution(tp=tp, micro_batch=B, attention="standard", **ex)
    p, k = problem_and_knobs(GPT, library_system(A100), tp, Training(global_batch=B, precision="bf16"), e)
    return float(block_cost(make_ctx(p), k).act_stored[0])


def test_activations_no_tp():
    # 34 sbh + 5 a s^2 b = 34*4,194,304 + 671,088,640 = 813,694,976 bytes
    assert _act(1) == pytest.approx(813_694_976, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tp(t):
    # sbh (10 + 24/t + 5 a s/(h t))
    expected = SBH * (10 + 24 / t + 5 * A * S / (H * t))
    assert _act(t) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activations_tp_sp(t):
    # sbh/t (34 + 5 a s/h)
    expected = SBH / t * (34 + 5 * A * S / H)
    assert _act(t, sequence_parallel=True, sp_ag_redo=True) == pytest.approx(expected, rel=1e-12)


def test_activations_tp_sp_without_ag_redo():
    # the all-gathered QKV and MLP inputs (2 sbh each) are kept whole instead of sharded:
    # sbh (4 + 30/t + 5 a s/(h t)); t = 4 -> sbh (4 + 7.5 + 40) = 51.5 sbh
    t = 4
    assert _act(t, sequence_parallel=True, sp_ag_redo=False) == pytest.approx(SBH * 51.5, rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_activations_selective_sp(t):
    # attention core (5 a s^2 b / t) recomputed: 34 sbh / t
    assert _act(t, sequence_parallel=True, recompute="selective") == pytest.approx(34 * SBH / t, rel=1e-12)


def test_activations_selective_no_sp():
    # sbh (10 + 24/t), t = 4 -> 16 sbh
    assert _act(4, recompute="selective") == pytest.approx(16 * SBH, rel=1e-12)


def test_activations_full_recompute():
    # only the layer input is kept: 2 sbh, and 2 sbh / t with SP
    assert _act(1, recompute="full") == pytest.approx(2 * SBH, rel=1e-12)
    assert _act(4, recompute="full") == pytest.approx(2 * SBH, rel=1e-12)
    assert _act(4, recompute="full", sequence_parallel=True) == pytest.approx(2 * SBH / 4, rel=1e-12)
