"""Mixtures of experts, MLA, expert parallelism. Parameter counts against the published totals,
FLOPs and memory per GPU worked by hand for several tp/ep/etp splits, all-to-all placement."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import library_llm, library_system, problem_and_knobs

from optimizer.errors import ProblemErrors
from optimizer.model.hardware import Tiers, a2a_time, collective_time
from optimizer.model.layer import _elementwise, block_cost
from optimizer.model.params import count
from optimizer.model.step import evaluate, make_ctx
from optimizer.schema import Execution, Training

# ----------------------------------------------------------------------------- published parameter totals
# (file, published total, published active per token, relative tolerance). Sources in each YAML file.
PUBLISHED = [
    ("mixtral-8x7b", 46.7e9, 12.9e9, 0.005),  # Mixtral paper: 46.7B total, 12.9B active
    ("mixtral-8x22b", 141e9, 39e9, 0.005),  # Mistral AI: 141B, 39B active
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01),  # Qwen3 report Table 2: 235B total, 22B activated
    ("deepseek-v3", 671e9, 37e9, 0.015),  # DeepSeek-V3 report: 671B total, 37B activated
    # gpt-oss model card: 116.83B total, 5.13B active without the 0.58B embedding (the count's active holds
    # it)
    ("gpt-oss-120b", 116.83e9, 5.13e9 + 201088 * 2880, 0.005),
]


@pytest.mark.parametrize("name,total,active,rel", PUBLISHED)
def test_moe_parameter_counts_match_published(name, total, active, rel):
    c = count(library_llm(name))
    assert c.total == pytest.approx(total, rel=rel)
    assert c.active == pytest.approx(active, rel=rel)


def test_grok1_total():
    # xAI: 314B parameters; 8 experts of 3 x 6144 x 32768, 48/8 heads of 128, tied 131072 x 6144 embedding
    assert count(library_llm("grok-1")).total == pytest.approx(314e9, rel=0.01)


def test_mixtral_counts_exactly():
    # per layer: attention 4096*(32+2*8)*128 + 32*128*4096 = 41,943,040; 8 experts of 3*4096*14336 =
    # 176,160,768; router 4096*8; two RMSNorms 2*4096. Embedding and untied head 32000*4096 each; final norm.
    layer = 41_943_040 + 8 * 176_160_768 + 32_768 + 8_192
    assert count(library_llm("mixtral-8x7b")).total == 32 * layer + 2 * 131_072_000 + 4_096
    active_layer = 41_943_040 + 2 * 176_160_768 + 32_768 + 8_192
    assert count(library_llm("mixtral-8x7b")).active == 32 * active_layer + 2 * 131_072_000 + 4_096


def test_deepseek_v3_mla_attention_parameters():
    # MLA per layer: q_a 7168*1536 + q_norm 1536 + q_b 1536*128*192 + kv_a 7168*(512+64) + kv_norm 512
    # + kv_b 512*128*(128+128) + o 128*128*7168 = 187,107,328
    c = count(library_llm("deepseek-v3"))
    mla = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert c.attention == mla == 187_107_328


def test_llama405b_128k_is_the_405b_shape():
    a, b = library_llm("llama3.1-405b"), library_llm("llama3.1-405b-128k")
    assert count(a).total == count(b).total
    assert b.seq_len == 131072


# ----------------------------------------------------------------------------- FLOPs per token
MIXTRAL = "mixtral-8x7b"
H100 = "h100-sxm-80gb"


def _mixtral(ex: Execution, num_gpus: int = 64, **train):
    t = dict(global_batch=256, seq_len=4096, precision="bf16")
    t.update(train)
    return problem_and_knobs(library_llm(MIXTRAL), library_system(H100), num_gpus, Training(**t), ex)


@pytest.mark.parametrize("tp,ep,etp", [(1, 1, 1), (1, 8, 1), (2, 4, 1), (2, 4, 2), (4, 2, 4), (8, 8, 1)])
def test_moe_layer_forward_flops_per_token(tp, ep, etp):
    """A Mixtral MoE layer runs, per token, 2 x (attention projections 41,943,040 + top-2 experts
    2 x 176,160,768 + router 32,768) GEMM FLOPs forward, plus the causal flash core 2*a*s*d =
    33,554,432 at s = 4096: 822,149,120 whatever the split (each GPU does 1/tp of a sequence's)."""
    p, k = _mixtral(Execution(tp=tp, pp=1, ep=ep, etp=etp, sequence_parallel=tp > 1, micro_batch=1))
    b = block_cost(make_ctx(p), k, moe=True)
    per_token = float(b.hw_flops_fw[0]) * tp / 4096
    assert per_token == pytest.approx(2 * (41_943_040 + 2 * 176_160_768 + 32_768) + 33_554_432, rel=1e-12)


def test_capacity_factor_scales_expert_work():
    from optimizer.schema import LLM

    base = library_llm(MIXTRAL)
    padded = LLM.model_validate(
        {**base.model_dump(), "moe": {**base.moe.model_dump(), "capacity_factor": 1.25}}
    )
    ex = Execution(tp=1, ep=8, micro_batch=1)
    t = Training(global_batch=256, seq_len=4096, precision="bf16")
    p0, k0 = problem_and_knobs(base, library_system(H100), 64, t, ex)
    p1, k1 = problem_and_knobs(padded, library_system(H100), 64, t, ex)
    f0 = float(block_cost(make_ctx(p0), k0, moe=True).hw_flops_fw[0])
    f1 = float(block_cost(make_ctx(p1), k1, moe=True).hw_flops_fw[0])
    assert f1 - f0 == pytest.approx(0.25 * 2 * 4096 * 2 * 176_160_768, rel=1e-12)


# ----------------------------------------------------------------------------- memory per GPU, by hand
# Mixtral 8x7B on 64 GPUs, pp = 4 (8 layers a stage); the worst stage is the last (LM head + final norm).
# attention per rank: (32/tp + 2*max(8/tp, 1))*128*4096 + (32/tp)*128*4096; router 32,768 and norms
# 8,192 replicated; routed experts 8/ep experts of 176,160,768/etp (never divided by tp); head 131,072,000/tp.
HAND = {  # (tp, ep, etp): parameters held by one GPU of the last stage
    (1, 8, 1): 8 * (41_943_040 + 8_192 + 32_768 + 176_160_768) + 131_072_000 + 4_096,  # 1,876,234,240
    (2, 4, 1): 8 * (20_971_520 + 8_192 + 32_768 + 2 * 176_160_768) + 65_536_000 + 4_096,  # 3,052,212,224
    (2, 4, 2): 8 * (20_971_520 + 8_192 + 32_768 + 176_160_768) + 65_536_000 + 4_096,  # 1,642,926,080
    (4, 2, 4): 8 * (10_485_760 + 8_192 + 32_768 + 176_160_768) + 32_768_000 + 4_096,  # 1,526,272,000
}


@pytest.mark.parametrize("split", list(HAND))
def test_moe_weights_per_gpu_by_hand(split):
    tp, ep, etp = split
    p, k = _mixtral(Execution(tp=tp, pp=4, ep=ep, etp=etp, sequence_parallel=tp > 1, zero=0))
    r = evaluate(p, k)
    assert float(r.weights[0]) == pytest.approx(2.0 * HAND[split], rel=1e-12)  # bf16 weights
    assert float(r.grads[0]) == pytest.approx(4.0 * HAND[split], rel=1e-12)  # fp32 main grads
    assert float(r.optim_state[0]) == pytest.approx(12.0 * HAND[split], rel=1e-12)  # fp32 master, m, v


def test_routed_experts_shard_by_ep_times_etp_not_by_tp():
    # the known bug of other estimators: dividing routed experts by tp. Here tp = 2 in both, and only
    # etp changes what a GPU holds; the difference is 8 layers x 2 experts x 176,160,768 / 2.
    pa, ka = _mixtral(Execution(tp=2, pp=4, ep=4, etp=1, sequence_parallel=True))
    pb, kb = _mixtral(Execution(tp=2, pp=4, ep=4, etp=2, sequence_parallel=True))
    wa, wb = float(evaluate(pa, ka).weights[0]), float(evaluate(pb, kb).weights[0])
    assert wa - wb == pytest.approx(2.0 * 8 * 176_160_768, rel=1e-12)


def test_zero_shards_experts_over_the_expert_data_parallel_group():
    """tp 2, pp 4, dp 8, ep 4, etp 1: dense parameters are sharded over dp*cp = 8, routed experts over
    edp = tp*cp*dp/(ep*etp) = 4. Last stage: experts 8 x 2 x 176,160,768 = 2,818,572,288; the rest
    3,052,212,224 - 2,818,572,288 = 233,639,936."""
    ex_, ne = 2_818_572_288, 233_639_936
    p, k = _mixtral(Execution(tp=2, pp=4, ep=4, etp=1, sequence_parallel=True, zero=1))
    r = evaluate(p, k)
    assert float(r.optim_state[0]) == pytest.approx(12.0 * (ne / 8 + ex_ / 4), rel=1e-12)
    assert float(r.grads[0]) == pytest.approx(4.0 * (ne + ex_), rel=1e-12)
    p, k = _mixtral(Execution(tp=2, pp=4, ep=4, etp=1, sequence_parallel=True, zero=2))
    r = evaluate(p, k)
    assert float(r.grads[0]) == pytest.approx(4.0 * (ne / 8 + ex_ / 4), rel=1e-12)


def test_dense_layers_of_a_partly_moe_model():
    # DeepSeek-V3: 3 dense layers (18432-wide SwiGLU) and 58 MoE layers. At pp = 1 one GPU holds all 61.
    llm = library_llm("deepseek-v3")
    p, k = problem_and_knobs(
        llm,
        library_system("h800-sxm-80gb"),
        2048,
        Training(global_batch=2048, precision="bf16"),
        Execution(tp=1, pp=1, ep=64, zero=0),
    )
    r = evaluate(p, k)
    mla, norms = 187_107_328, 2 * 7168
    dense_mlp = 3 * 7168 * 18432
    expert = 3 * 7168 * 2048
    moe_local = 7168 * 256 + expert + 256 // 64 * expert  # router + shared + 4 routed experts
    mtp = mla + norms + moe_local + 2 * 7168 * 7168 + 2 * 7168  # the MTP block, projection, two norms
    held = 61 * (mla + norms) + 3 * dense_mlp + 58 * moe_local + 2 * 129280 * 7168 + 7168 + mtp
    assert float(r.weights[0]) == pytest.approx(2.0 * held, rel=1e-12)


# ----------------------------------------------------------------------------- all-to-all and its tier
def test_all_to_all_within_a_node_is_the_ring_formula():
    tiers = Tiers.of(library_system(H100))
    s = 1e9
    assert float(a2a_time(s, 8, 0, tiers)) == pytest.approx(float(collective_time("a2a", s, 8, 0, tiers)))


def test_all_to_all_across_two_nodes_splits_nvlink_and_infiniband():
    """16 ranks on two 8-GPU nodes: 8/16 of the bytes cross InfiniBand (50 GB/s x 0.85), 7/16 stay on
    NVLink (450 GB/s x 0.75), both at once; plus 15 steps of the InfiniBand latency (8 us)."""
    tiers = Tiers.of(library_system(H100))
    s = 1e9
    want = max(0.5 * s / (50e9 * 0.85), 7 / 16 * s / (450e9 * 0.75)) + 15 * 8e-6
    assert float(a2a_time(s, 16, 1, tiers)) == pytest.approx(want, rel=1e-12)
    # with an expert-TP stride of 2, only 4 EP peers share a node: 12/16 cross
    want2 = 12 / 16 * s / (50e9 * 0.85) + 15 * 8e-6
    assert float(a2a_time(s, 16, 1, tiers, stride=2)) == pytest.approx(want2, rel=1e-12)


def test_ep_group_spilling_over_the_node_costs_more():
    # etp*ep = 8 stays on NVLink; etp*ep = 16 crosses InfiniBand
    p, k = _mixtral(Execution(tp=2, pp=1, ep=4, etp=2, sequence_parallel=True, micro_batch=1))
    q, m = _mixtral(Execution(tp=2, pp=1, ep=8, etp=2, sequence_parallel=True, micro_batch=1))
    assert int(k.tier_ep[0]) == 0 and int(m.tier_ep[0]) == 1
    assert float(evaluate(q, m).ep_exposed[0]) > 2 * float(evaluate(p, k).ep_exposed[0])


def test_dense_model_has_no_ep_traffic():
    p, k = problem_and_knobs(
        library_llm("llama3.1-8b"),
        library_system(H100),
        8,
        Training(global_batch=64, precision="bf16"),
        Execution(tp=2),
    )
    assert float(evaluate(p, k).ep_exposed[0]) == 0.0


# ----------------------------------------------------------------------------- FP8
def test_fp8_halves_gemm_time_of_large_layers_and_keeps_master_copies():
    pb, kb = _mixtral(Execution(tp=1, pp=4, ep=8, zero=1), precision="bf16")
    pf, kf = _mixtral(Execution(tp=1, pp=4, ep=8, zero=1), precision="fp8")
    rb, rf = evaluate(pb, kb), evaluate(pf, kf)
    # same state bytes (bf16 weights, fp32 grads, fp32 master + moments): FP8 copies are transient
    assert float(rf.weights[0] + rf.grads[0] + rf.optim_state[0]) == pytest.approx(
        float(rb.weights[0] + rb.grads[0] + rb.optim_state[0]), rel=1e-12
    )
    # GEMM inputs kept for the weight gradients are 1 byte: fewer stored activations
    assert float(rf.activations[0]) < float(rb.activations[0])
    # faster, but less than 2x: attention, element-wise ops and communication stay 16-bit
    assert 1.0 < float(rb.step_time[0] / rf.step_time[0]) < 2.0
    assert np.all(np.isfinite(rf.step_time))


# ----------------------------------------------------------------------------- uneven pipeline split
def test_embedding_and_loss_as_layer_slots_by_hand():
    """Llama 3.1 405B (126 layers), pp = 16 with the embedding and loss as layer slots: 128/16 = 8 slots a
    stage; a middle stage holds 8 layers, the first 7 + the embedding (128256 x 16384 / tp), the last
    7 + the LM head + final norm. Layer at tp = 8: (16 + 2*1)*128*16384 + 16*128*16384 + 3*16384*53248/8
    + 2*16384."""
    llm = library_llm("llama3.1-405b")
    ex = Execution(tp=8, pp=16, pp_embedding_loss=True, sequence_parallel=True, zero=0)
    p, k = problem_and_knobs(
        llm, library_system(H100), 1024, Training(global_batch=512, precision="bf16"), ex
    )
    layer = (16 + 2) * 128 * 16384 + 16 * 128 * 16384 + 3 * 16384 * 53248 // 8 + 2 * 16384
    emb = 128256 * 16384 // 8
    held = max(8 * layer, 7 * layer + emb + 16384)
    assert float(evaluate(p, k).weights[0]) == pytest.approx(2.0 * held, rel=1e-12)


def test_embedding_loss_split_needs_a_pipeline():
    from optimizer.rules.cross_field import execution_errors

    llm = library_llm("llama3.1-8b")
    p, _ = problem_and_knobs(
        llm, library_system(H100), 8, Training(global_batch=64), Execution(tp=8, pp_embedding_loss=False)
    )
    bad = Execution(tp=8, pp=1, pp_embedding_loss=True)
    assert any(f == "execution.pp_embedding_loss" for f, _ in execution_errors(p, bad))
    odd = Execution(tp=1, pp=8, vpp=1, pp_embedding_loss=False)  # 32 layers: fine without slots
    assert not execution_errors(p, odd)
    odd_el = Execution(tp=1, pp=8, pp_embedding_loss=True)  # 34 slots do not divide by 8
    assert any("layers + 2" in m for _, m in execution_errors(p, odd_el))


# ----------------------------------------------------------------------------- host launch floor (eager MoE)
def _gpt_oss(ex: Execution):
    t = Training(global_batch=512, seq_len=4096, precision="bf16")
    return problem_and_knobs(library_llm("gpt-oss-120b"), library_system(H100), 64, t, ex)


def _fw_gpu(b):
    """A layer's forward on the critical path: GPU compute, exposed TP and EP traffic, and the host's wait."""
    return float(b.fw_total[0])


def test_eager_dropless_moe_forward_takes_at_least_the_host_time(monkeypatch):
    """A dropless MoE layer reads its token counts on the host once per forward, so under eager launch its
    forward takes at least MOE_HOST_FW_S (the host's time to issue it); partial CUDA graphs (attention,
    router, dispatcher preprocessing) leave half of it, full-iteration graphs none. GPT-OSS at micro-batch 1,
    ep 8 on H100 is such a layer (3.4 ms of GPU forward): with a 5 ms host its eager forward takes 5 ms, with
    partial graphs (2.5 ms left to the host) and full ones its GPU time."""
    import optimizer.model.layer as layer

    eager, full = (_gpt_oss(Execution(tp=1, ep=8, micro_batch=1, cuda_graphs=g)) for g in ("none", "full"))
    partial = _gpt_oss(Execution(tp=1, ep=8, micro_batch=1, cuda_graphs="partial"))
    monkeypatch.setattr(layer, "MOE_HOST_FW_S", 0.0)
    b_0 = block_cost(make_ctx(eager[0]), eager[1], moe=True)
    gpu = _fw_gpu(b_0)
    h = 5.0e-3
    monkeypatch.setattr(layer, "MOE_HOST_FW_S", h)
    b_e, b_p, b_f = (block_cost(make_ctx(p), k, moe=True) for p, k in (eager, partial, full))
    assert 0.5 * h < gpu < h  # the floor binds for this layer when eager, not with partial graphs
    assert _fw_gpu(b_e) == pytest.approx(h, rel=1e-9)
    assert _fw_gpu(b_p) == pytest.approx(gpu, rel=1e-12)
    assert _fw_gpu(b_f) == pytest.approx(gpu, rel=1e-12)
    assert float(b_e.fw[0]) == float(b_0.fw[0]) and float(b_e.host_fw[0]) == pytest.approx(h - gpu, rel=1e-9)
    assert float(b_e.bw_total[0]) == pytest.approx(float(b_0.bw_total[0]), rel=1e-12)  # no sync in backward
    # the dense layers of the same model (and a micro-batch whose forward outlasts the host) are untouched
    d_e = block_cost(make_ctx(eager[0]), eager[1])
    d_f = block_cost(make_ctx(full[0]), full[1])
    assert float(d_e.fw[0]) == float(d_f.fw[0])
    big = _gpt_oss(Execution(tp=1, ep=8, micro_batch=8, cuda_graphs="none"))
    big_f = _gpt_oss(Execution(tp=1, ep=8, micro_batch=8, cuda_graphs="full"))
    assert float(block_cost(make_ctx(big[0]), big[1], moe=True).fw[0]) == float(
        block_cost(make_ctx(big_f[0]), big_f[1], moe=True).fw[0]
    )


def test_host_floor_under_all_to_all_overlap_covers_the_merged_forward_and_backward():
    """With the EP all-to-all overlap Megatron-Core runs a micro-batch's forward merged with another's
    backward, both issued by the same host thread with the forward's routing sync between them: the merged
    chunk takes at least the host time of the forward and of the backward (BW_HOST_RATIO times it) against
    the GPU time of both. Without the overlap the backward is issued while the GPU runs and the floor is the
    forward's alone; CUDA graphs remove both."""
    import optimizer.model.layer as layer

    ex = {"tp": 1, "ep": 8, "micro_batch": 1}
    p, k = _gpt_oss(Execution(**ex, ep_overlap=True, cuda_graphs="none"))
    pn, kn = _gpt_oss(Execution(**ex, ep_overlap=False, cuda_graphs="none"))
    pf, kf = _gpt_oss(Execution(**ex, ep_overlap=True, cuda_graphs="full"))
    saved = layer.MOE_HOST_FW_S
    try:
        b0 = block_cost(make_ctx(p), k, moe=True)
        gpu = float(b0.fw_total[0] - b0.host_fw[0] + b0.bw_total[0])  # the merged chunk's GPU time
        layer.MOE_HOST_FW_S = gpu  # one host forward as long as the merged GPU work: the floor binds
        b = block_cost(make_ctx(p), k, moe=True)
        b_n = block_cost(make_ctx(pn), kn, moe=True)
        b_f = block_cost(make_ctx(pf), kf, moe=True)
    finally:
        layer.MOE_HOST_FW_S = saved
    host = (1.0 + layer.BW_HOST_RATIO) * gpu
    assert float(b.host_fw[0]) == pytest.approx(host - gpu, rel=1e-9)
    assert float(b.fw_total[0] + b.bw_total[0]) == pytest.approx(host, rel=1e-9)  # the host's time, exactly
    fw_n = float(b_n.fw_total[0] - b_n.host_fw[0])
    assert float(b_n.host_fw[0]) == pytest.approx(gpu - fw_n, rel=1e-9)  # the forward's floor alone
    assert float(b_f.host_fw[0]) == 0.0


def _qwen_like_run() -> dict:
    """A small Qwen3-MoE-shaped run record (calibration schema) on 8 H100."""
    return {
        "id": "x",
        "source": "Test",
        "tier": "A",
        "model": {
            "hidden": 2048,
            "ffn": 768,
            "layers": 4,
            "heads": 32,
            "kv_heads": 4,
            "head_dim": 128,
            "seq_len": 4096,
            "vocab": 151936,
            "mlp": "swiglu",
            "moe": {"experts": 128, "top_k": 8, "expert_ffn": 768, "shared_experts": 0, "moe_layers": None},
        },
        "hardware": {"gpu": H100, "num_gpus": 8, "gpus_per_node": 8},
        "parallel": {
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "cp": 1,
            "ep": 8,
            "vpp": 1,
            "sequence_parallel": False,
            "micro_batch": 1,
            "global_batch": 64,
            "recompute": "none",
            "optimizer_sharding": "zero1",
            "precision": "bf16",
        },
        "measured": {"step_time_s": 1.0},
    }


def test_runs_read_their_cuda_graphs_from_their_software():
    """The Megatron-Bridge presets' CUDA graphs as the runs' software.cuda_graphs states them: full-iteration
    graphs, Transformer Engine graphs of attention/router/preprocess, or none (eager, also when not
    stated)."""
    from optimizer.io.runs import map_run

    base = _qwen_like_run()
    cases = {"full": "full", "partial": "partial", "none": "none", None: "none"}
    for graphs, want in cases.items():
        run = base | {"software": {"year": 2026, "cuda_graphs": graphs}}
        assert map_run(run).problem.execution.cuda_graphs.value == want, graphs


def test_host_wait_is_its_own_part_of_the_step():
    """`evaluate` reports the host's launch wait as its own part (`host_wait`): the forward stays the GPU's
    time, and the parts still add up to the step time; with full CUDA graphs the wait is zero and the step
    shorter."""
    from optimizer.report.text import TIME_PARTS

    eager = _gpt_oss(Execution(tp=1, ep=8, micro_batch=1, cuda_graphs="none"))
    full = _gpt_oss(Execution(tp=1, ep=8, micro_batch=1, cuda_graphs="full"))
    r_e, r_f = (evaluate(p, k) for p, k in (eager, full))
    assert float(r_e.host_wait[0]) > 0 and float(r_f.host_wait[0]) == 0
    assert float(r_e.fw[0]) == pytest.approx(float(r_f.fw[0]), rel=1e-12)
    for r in (r_e, r_f):
        assert sum(float(getattr(r, key)[0]) for _, key in TIME_PARTS) == pytest.approx(
            float(r.step_time[0]), rel=1e-9
        )
    assert float(r_e.step_time[0]) - float(r_f.step_time[0]) == pytest.approx(
        float(r_e.host_wait[0]), rel=1e-6
    )


def test_calibrate_host_fits_the_floor_on_eager_runs_only():
    """scripts/calibrate_host.py scans MOE_HOST_FW_S over its grid: a run replayed as full-iteration CUDA
    graphs (Qwen3-30B-A3B on 8 GB300 in the 26.06 table) has the same error at every value, an eager one at
    micro-batch 1 (the same model on 16 H100: -28% without the floor) is predicted slower as the value grows,
    and a fit on that one run alone lands at 5.25 ms, near the fit on every public file's 39 MoE runs
    (5.00 ms). A file that cannot be read is refused with exit 2."""
    from helpers import ROOT, load_script

    cal = load_script("calibrate_host")
    runs = dict(cal.moe_runs([str(ROOT / "problems" / "runs" / "bridge-2606.yaml")]))
    pick = [
        (i, runs[i])
        for i in ("bridge2606-qwen3-30b-a3b-gb300-mxfp8-8gpu", "bridge2606-qwen3-30b-a3b-h100-fp8-16gpu")
    ]
    ids, err = cal.error_table(pick)
    assert ids == [i for i, _ in pick] and err.shape == (len(cal.GRID_MS), 2)
    assert np.ptp(err[:, 0]) < 1e-9  # full graphs: no host wait
    assert np.all(np.diff(err[:, 1]) >= -1e-9) and err[0, 1] < -25.0
    b = load_script("grid_fit").best_row(err[:, 1:])
    assert abs(err[b, 1]) <= 1.0 and 4.0 <= cal.GRID_MS[b] <= 6.5
    assert cal.main([str(ROOT / "no-such-runs.yaml")]) == 2


def test_eager_expert_mlp_pays_for_the_clamped_glu_and_the_expert_biases(monkeypatch):
    """Megatron-Core's eager expert MLP (no Transformer Engine op fuser) clamps a clamped GLU's halves and
    adds the down-projection's probability-scaled biases in passes of their own: GPT-OSS's MoE layer on H100
    costs exactly those passes more (`layer.clamp_passes` over the R x 2f rows of its rank,
    `layer.expert_bias_passes` over the R x h rows, R the micro-batch's tokens x top-k at ep 8) than the same
    model without the clamp and the biases, a tenth of the layer's forward and more; with the fused expert MLP
    (`moe_fused_mlp`) neither costs anything, and nothing else moves. (The passes against measured kernels:
    tests/test_kernels_bench.py.)"""
    import optimizer.model.layer as layer
    from optimizer.model.hardware import Hardware

    monkeypatch.setattr(layer, "MOE_HOST_FW_S", 0.0)  # the host floor would hide forward differences
    gpt = library_llm("gpt-oss-120b")
    assert gpt.activation_clamp == 7.0 and gpt.moe.expert_bias
    plain = gpt.model_copy(
        update={"activation_clamp": None, "moe": gpt.moe.model_copy(update={"expert_bias": False})}
    )
    t = Training(global_batch=512, seq_len=4096, precision="bf16")
    cost = {}
    for name, llm in (("gpt", gpt), ("plain", plain)):
        for fused in (False, True):
            p, k = problem_and_knobs(
                llm, library_system(H100), 64, t, Execution(tp=1, ep=8, micro_batch=1, moe_fused_mlp=fused)
            )
            b = block_cost(make_ctx(p), k, moe=True)
            cost[name, fused] = (float(b.fw[0]), float(b.bw[0]))
    assert cost["gpt", True] == cost["plain", True] == cost["plain", False]
    hw = Hardware(library_system(H100), t.precision)
    R, up, h = (
        4096.0 * 4,
        2.0 * 2880,
        2880.0,
    )  # rows of one rank at ep 8, tp 1: the micro-batch's tokens x top-k
    (c_fw, c_bw), (b_fw, b_bw) = layer.clamp_passes(hw, R * up, 2.0), layer.expert_bias_passes(hw, R * h, 2.0)
    extra_fw, extra_bw = float(c_fw + b_fw), float(c_bw + b_bw)
    assert cost["gpt", False][0] - cost["plain", False][0] == pytest.approx(extra_fw, rel=1e-9)
    assert cost["gpt", False][1] - cost["plain", False][1] == pytest.approx(extra_bw, rel=1e-9)
    assert (
        extra_fw > 0.1 * (cost["plain", False][0])
    )  # not a rounding: a tenth of the layer's forward and more


def test_routing_skew_by_hand():
    """The busiest of ep ranks with n experts each: 1 + cv sqrt(2 ln ep / n); one rank, or balanced routing,
    carries the mean."""
    from optimizer.model.layer import rank_load

    assert float(rank_load(0.5, 8, 8)) == pytest.approx(1 + 0.5 * np.sqrt(2 * np.log(8) / 8))
    assert float(rank_load(0.5, 1, 64)) == 1.0 and float(rank_load(0.0, 64, 4)) == 1.0
    # more ranks over the same experts: fewer to average over and more to take the maximum of
    assert float(rank_load(0.5, 64, 4)) > float(rank_load(0.5, 8, 32))


def test_routing_skew_scales_the_busiest_ranks_rows_and_traffic():
    from optimizer.model.layer import block_shape, moe_dispatch_combine_s, moe_shape

    llm = library_llm("mixtral-8x7b")
    skewed = llm.model_copy(update={"moe": llm.moe.model_copy(update={"routing_cv": 0.5})})
    out = {}
    for name, m in (("balanced", llm), ("skewed", skewed)):
        tr = Training(global_batch=256, seq_len=4096)
        p, k = problem_and_knobs(
            m, library_system("h100-sxm-80gb"), 64, tr, Execution(tp=1, ep=8, micro_batch=1)
        )
        ctx = make_ctx(p)
        sh = block_shape(ctx, k, True)
        ms = moe_shape(k, sh)
        out[name] = (float(ms.R[0]), float(moe_dispatch_combine_s(ctx, k, sh, ms)[0][0]), float(ms.load[0]))
    load = 1 + 0.5 * np.sqrt(2 * np.log(8) / 1)  # 8 experts over 8 ranks: one each
    assert out["skewed"][2] == pytest.approx(load)
    assert out["skewed"][0] == pytest.approx(load * out["balanced"][0])
    assert out["skewed"][1] > out["balanced"][1]


@pytest.mark.parametrize(("cv", "ep"), [(0.0, 8), (0.5, 1)])
def test_routing_skew_moves_the_experts_off_expert_parallelism(tmp_path, cv, ep):
    """Mixtral 8x7B on 64 H100: balanced routing takes ep 8 (one expert per rank); with a skew of 0.5 the
    busiest rank's 2.0x load outweighs the all-to-all saved, and the experts go to expert-TP (ep 1)."""
    from optimizer import api

    f = tmp_path / "mx.yaml"
    f.write_text(
        "llm: {base: mixtral-8x7b, moe: {experts: 8, top_k: 2, expert_ffn: 14336, routing_cv: "
        f"{cv}}}}}\nsystem: h100-sxm-80gb\nnum_gpus: 64\n"
        "training: {global_batch: 256, seq_len: 4096, precision: bf16}\n"
    )
    assert api.solve(api.load(f)).plans[0].evaluation.execution.ep == ep


def test_allgather_dispatcher_moves_every_token_whatever_top_k():
    """Megatron-Core's all-gather dispatcher gathers the Ts tokens of every rank of the etp x ep group and
    reduce-scatters the combined rows back (and the reverse in backward): per layer and micro-batch, at ep 8
    on one node, 2 x (all-gather + reduce-scatter) of 8 x Ts x h 16-bit rows, whatever top_k. Mixtral's top-2
    moves less by all-to-all (2 of 8 experts a token); with top-8 over 2 ranks the gather moves less."""
    ex = dict(tp=1, micro_batch=1)
    p, k = _mixtral(Execution(**ex, ep=8, moe_dispatcher="allgather"))
    b = block_cost(make_ctx(p), k, moe=True)
    ctx = make_ctx(p)
    rows = 8 * 4096 * 4096 * 2.0  # 8 ranks x Ts 4096 tokens x h 4096 x 2 bytes
    one = collective_time("ag", rows, 8, 0, ctx.tiers) + collective_time("rs", rows, 8, 0, ctx.tiers)
    assert float(b.ep_link[0]) == pytest.approx(2 * float(one), rel=1e-9)
    pa, ka = _mixtral(Execution(**ex, ep=8, moe_dispatcher="alltoall"))
    assert float(block_cost(make_ctx(pa), ka, moe=True).ep_link[0]) < float(b.ep_link[0])
    top8 = library_llm(MIXTRAL).model_copy(
        update={"moe": library_llm(MIXTRAL).moe.model_copy(update={"top_k": 8})}
    )
    t = Training(global_batch=256, seq_len=4096, precision="bf16")
    links = {}
    for d in ("alltoall", "allgather"):
        pd, kd = problem_and_knobs(top8, library_system(H100), 64, t, Execution(**ex, ep=2, moe_dispatcher=d))
        links[d] = float(block_cost(make_ctx(pd), kd, moe=True).ep_link[0])
    assert links["allgather"] < links["alltoall"]


def test_solve_chooses_the_dispatcher_by_top_k_and_solvers_agree(tmp_path):
    """search.moe_dispatcher [alltoall, allgather] at ep 4 (16 H100): Mixtral's top-2 picks the all-to-all
    (half the gather's rows), the same model routing top-8 the all-gather (half the all-to-all's rows, and no
    re-sort by local expert); CP-SAT and the enumerator agree. (At ep 8 with one expert per rank and top-8
    the two move the same rows: a tie.)"""
    from optimizer import api

    base = """name: disp
llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, seq_len: 4096, precision: bf16}
execution: {tp: 1, pp: 2, ep: 4, micro_batch: 1, zero: 1, recompute: full}
search: {moe_dispatcher: [alltoall, allgather], ep: 4}
"""
    chosen = {}
    for top_k in (2, 8):
        path = tmp_path / f"d{top_k}.yaml"
        path.write_text(base)
        p = api.load(path)
        if top_k == 8:
            p = p.model_copy(
                update={"llm": p.llm.model_copy(update={"moe": p.llm.moe.model_copy(update={"top_k": 8})})}
            )
        plans = [api.solve(p).plans[0], api.solve(p, method="enumerate").plans[0]]
        t = [x.evaluation.result["step_time"] for x in plans]
        assert np.allclose(t, t[0], rtol=1e-6)
        chosen[top_k] = {x.evaluation.execution.moe_dispatcher.value for x in plans}
    assert chosen == {2: {"alltoall"}, 8: {"allgather"}}
    assert "--moe-token-dispatcher-type allgather" in api.emit("megatron", p, plans[0].evaluation.execution)


def test_all_to_all_overlap_runs_only_where_megatron_core_runs_it(tmp_path):
    """Megatron-Core runs overlap_moe_expert_parallel_comm only with the alltoall or flex dispatcher and
    without full recompute: a written plan asking for it with the all-gather dispatcher is refused at its
    field, and a solve that may choose dispatcher, overlap and recompute never writes such a plan."""
    import subprocess
    import sys

    from optimizer import api

    text = """name: ov
llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, seq_len: 4096, precision: bf16}
execution: {tp: 1, pp: 2, ep: 8, micro_batch: 1, zero: 1, recompute: full, moe_dispatcher: allgather,
  ep_overlap: true}
"""
    path = tmp_path / "ov.yaml"
    path.write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", "evaluate", str(path)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "execution.ep_overlap" in r.stderr, r.stderr
    path.write_text(
        text.replace(", moe_dispatcher: allgather,\n  ep_overlap: true}", "}")
        + "search: {moe_dispatcher: [alltoall, allgather], ep_overlap: [false, true],\n"
        + "  recompute: [selective, full]}\n"
    )
    p = api.load(path)
    p = p.model_copy(
        update={"llm": p.llm.model_copy(update={"moe": p.llm.moe.model_copy(update={"top_k": 8})})}
    )
    for plan in api.solve(p, top=6, distinct=False).plans:
        ex = plan.evaluation.execution
        assert not (
            ex.ep_overlap and (ex.moe_dispatcher.value == "allgather" or ex.recompute.value == "full")
        )
    # the model itself: the overlap changes nothing where it cannot run, and hides traffic where it can
    step = {}
    for d, rec, ov in [
        (d, r, o) for d in ("alltoall", "allgather") for r in ("selective", "full") for o in (0, 1)
    ]:
        ex = Execution(
            tp=1, pp=2, ep=8, micro_batch=1, zero=1, recompute=rec, moe_dispatcher=d, ep_overlap=bool(ov)
        )
        pk, kk = _mixtral(ex, num_gpus=16, global_batch=64)
        step[d, rec, ov] = float(evaluate(pk, kk).step_time[0])
    assert step["alltoall", "selective", 1] < step["alltoall", "selective", 0]
    for d, rec in (("alltoall", "full"), ("allgather", "selective"), ("allgather", "full")):
        assert step[d, rec, 1] == step[d, rec, 0]


# ------------------------------------------------------------------- where the router's probabilities apply
def test_probabilities_in_the_activation_keep_no_expert_outputs():
    """Megatron-Core (0.13 on) multiplies the probabilities into the experts' activation and un-permutes with
    a plain sum; weighting in the combine instead (older Megatron-Core, torchtitan) keeps each routed row's
    16-bit expert output: Mixtral 8x7B at 4K tokens per micro-batch, top-2, holds 4096 x 2 x cf x 4096 x 2
    bytes more per layer, and its forward runs the weighting as a pass of its own over those rows (read the
    rows and write them, 16-bit: the same time as any element-wise pass of that size)."""
    llm = library_llm("mixtral-8x7b")
    t = Training(global_batch=64, seq_len=4096, precision="bf16")
    ex = dict(tp=1, pp=1, ep=8, micro_batch=1)
    cost = {}
    for inside in (True, False):
        p, k = problem_and_knobs(llm, library_system(H100), 64, t, Execution(**ex, moe_probs_in_act=inside))
        cost[inside] = block_cost(make_ctx(p), k, moe=True)
    rows_bytes = 4096 * 2 * llm.moe.capacity_factor * 4096 * 2
    assert float(cost[False].act_stored[0] - cost[True].act_stored[0]) == pytest.approx(rows_bytes, rel=1e-9)
    weighting = float(_elementwise(make_ctx(p).hw, 4096 * 2 * llm.moe.capacity_factor * 4096, 2.0, 4.0, 1.0))
    assert weighting > 0
    assert float(cost[False].fw[0] - cost[True].fw[0]) == pytest.approx(weighting, rel=1e-9)
    # unfused, the product is an op of its own: it keeps the activation's output (rows x expert ffn)
    p, k = problem_and_knobs(llm, library_system(H100), 64, t, Execution(**ex, fused_layers=False))
    unfused = float(block_cost(make_ctx(p), k, moe=True).act_stored[0])
    p, k = problem_and_knobs(
        llm, library_system(H100), 64, t, Execution(**ex, fused_layers=False, moe_probs_in_act=False)
    )
    weighted = float(block_cost(make_ctx(p), k, moe=True).act_stored[0])
    act_bytes = 4096 * 2 * llm.moe.capacity_factor * 14336 * 2
    assert unfused - weighted == pytest.approx(act_bytes - rows_bytes, rel=1e-9)


def test_the_stack_fixes_where_the_probabilities_apply(tmp_path):
    """An MoE problem on torchtitan weights the experts' outputs (its combine multiplies them by the scores);
    on Megatron-Core (the default) the probabilities are in the activation; `solve` plans with the stack's
    value and a plan says so."""
    from optimizer import api

    body = """llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, seq_len: 4096, precision: bf16}
search: {ep: 8, tp: 1, pp: 1, cp: 1}
"""
    seen = {}
    for stack in ("megatron-core", "torchtitan"):
        path = tmp_path / f"{stack}.yaml"
        path.write_text(body + f"stack: {stack}\n")
        p = api.load(path)
        plan = api.solve(p).plans[0].evaluation.execution
        seen[stack] = (p.execution.moe_probs_in_act, plan.moe_probs_in_act)
    assert seen == {"megatron-core": (True, True), "torchtitan": (False, False)}
    path = tmp_path / "written.yaml"
    path.write_text(body + "stack: torchtitan\nexecution: {moe_probs_in_act: true}\n")
    with pytest.raises(ProblemErrors, match="moe_probs_in_act"):
        api.load(path)


def test_an_older_megatron_core_run_weights_its_combine():
    """A Megatron-Core MoE run from before 0.13 (2025) keeps the expert outputs for the combine; one from
    2025 on does not."""
    from optimizer.io.runs import map_run

    run = _qwen_like_run()
    for year, inside in ((2024, False), (2025, True)):
        m = map_run(run | {"software": {"framework": "megatron-core", "year": year}})
        assert m.skip is None, m.skip
        assert m.problem.execution.moe_probs_in_act is inside


def test_solve_plans_with_the_given_knobs_also_from_shared_tables(tmp_path):
    """CUDA graphs are not searched: `solve` plans with the execution's (full graphs take the eager MoE
    layer's host wait off), and tables filled for another value are neither shared by key nor restricted."""
    from formulations.tables import build_all, same_given
    from optimizer import api
    from optimizer.drivers.purchase import tables_key
    from optimizer.prepare.space import compact_space

    body = """llm: mixtral-8x7b
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, seq_len: 4096, precision: bf16}
search: {tp: [1, 2], pp: [1, 2], cp: 1}
execution: {cuda_graphs: GRAPHS}
"""
    p = {}
    for g in ("none", "full"):
        (tmp_path / f"{g}.yaml").write_text(body.replace("GRAPHS", g))
        p[g] = api.load(tmp_path / f"{g}.yaml")
    fresh = {g: api.solve(p[g]).plans[0].evaluation for g in p}
    assert fresh["full"].execution.cuda_graphs.value == "full"
    assert fresh["full"].result["step_time"] < fresh["none"].result["step_time"]
    assert tables_key(p["none"]) != tables_key(p["full"])
    tables_none = build_all(p["none"], compact_space(p["none"]))
    assert same_given(tables_none, p["none"]) and not same_given(tables_none, p["full"])
    reused = api.solve(p["full"], tables=tables_none).plans[0].evaluation
    assert reused.result["step_time"] == pytest.approx(fresh["full"].result["step_time"], rel=1e-9)
