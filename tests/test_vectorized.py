"""The model on arrays of candidates equals the model on each candidate; physical monotonicity."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from helpers import concat_knobs, library_llm, library_system

from optimizer.model.knobs import from_execution
from optimizer.model.layer import block_cost
from optimizer.model.step import StepResult, evaluate, make_ctx
from optimizer.schema import LLM, Execution, Problem, Training

NUM_GPUS = 64
EXECUTIONS = [
    Execution(),
    Execution(tp=8, sequence_parallel=True, recompute="selective"),
    Execution(tp=8, sequence_parallel=True, tp_overlap="ring", zero=1),
    Execution(tp=8, tp_overlap="pipe", recompute="full"),
    Execution(tp=4, pp=2, vpp=2, zero=1, sequence_parallel=True),
    Execution(tp=2, pp=4, vpp=4, recompute="full", micro_batch=2),
    Execution(tp=2, pp=4, vpp=2, schedule="1f1b", tp_overlap="ring", sequence_parallel=True, zero=1),
    Execution(pp=8, schedule="gpipe", micro_batch=2),
    Execution(pp=4, pp_rs_ag=False, tp=2),
    Execution(zero=2, micro_batch=2),
    Execution(zero=3, dp_overlap=False),
    Execution(zero=3, recompute="full"),
    Execution(tp=4, cp=2, sequence_parallel=True, recompute="selective"),
    Execution(tp=2, cp=4, pp=2, vpp=2),
    Execution(tp=8, tp_comm="rs_ag"),
    Execution(tp=8, sequence_parallel=True, sp_ag_redo=False),
    Execution(attention="standard", fused_layers=False, tp=4, recompute="selective"),
    Execution(tp=2, placement={"tp": "infiniband"}, dp_overlap=False),
    Execution(weight_offload=True, activation_offload=True, zero=1),
    Execution(optimizer_offload=True, tp=4),
    Execution(tp=16, pp=4, sequence_parallel=True),  # tp over two nodes, K/V replicated (g = 8 < 16)
]


def _with(ex: Execution, **kw) -> Execution:
    """A validated copy of `ex` with some knobs changed."""
    return Execution.model_validate({**ex.model_dump(exclude_unset=True), **kw})


def _problem(system_name="h100-sxm-80gb", llm_name="llama3.1-8b", system=None) -> Problem:
    sysm = system or library_system(system_name)
    return Problem(
        llm=library_llm(llm_name),
        system=sysm,
        num_gpus=NUM_GPUS,
        training=Training(global_batch=128),
        execution=Execution(),
    )


def _knobs(problem, executions=EXECUTIONS):
    return concat_knobs([from_execution(ex, problem.system, problem.num_gpus) for ex in executions])


@pytest.mark.parametrize("system_name", ["h100-sxm-80gb", "a100-sxm-80gb"])
def test_vector_equals_scalar(system_name):
    p = _problem(system_name)
    K = _knobs(p)
    assert K.size == len(EXECUTIONS)
    together = evaluate(p, K)
    names = [f.name for f in fields(StepResult) if f.name != "terms"]
    for i, ex in enumerate(EXECUTIONS):
        alone = evaluate(p, from_execution(ex, p.system, p.num_gpus)).row()
        row = together.row(i)
        for n in names:
            assert row[n] == pytest.approx(alone[n], rel=1e-12, abs=0.0), (i, n)
        assert np.isfinite(row["step_time"]) and row["step_time"] > 0


def test_take_selects_candidates():
    p = _problem()
    K = _knobs(p)
    idx = np.array([3, 0, 7])
    sub = evaluate(p, K.take(idx))
    full = evaluate(p, K)
    np.testing.assert_allclose(sub.step_time, full.step_time[idx], rtol=1e-12)
    np.testing.assert_allclose(sub.hbm, full.hbm[idx], rtol=1e-12)


def test_scalar_knobs_broadcast_against_arrays():
    # a knob given as one value applies to every candidate
    p = _problem()
    K = _knobs(p, [Execution(tp=8, recompute=r) for r in ("none", "selective", "full")])
    K1 = K.replace(zero=1)  # scalar
    K2 = K.replace(zero=np.array([1, 1, 1]))
    np.testing.assert_allclose(evaluate(p, K1).step_time, evaluate(p, K2).step_time, rtol=1e-12)


# ------------------------------------------------------------------------------ monotonicity
def test_more_hbm_bandwidth_never_slows_a_step():
    base = library_system("h100-sxm-80gb")
    p0 = _problem(system=base)
    K = _knobs(p0)
    prev = evaluate(p0, K).step_time
    for factor in (1.25, 1.5, 2.0, 4.0):
        faster = base.model_copy(update={"hbm_bandwidth_gbps": base.hbm_bandwidth_gbps * factor})
        t = evaluate(_problem(system=faster), K).step_time
        assert np.all(t <= prev * (1 + 1e-12)), np.nonzero(t > prev)[0]
        prev = t


def test_more_hbm_bandwidth_never_slows_a_step_gpt():
    base = library_system("a100-sxm-80gb")
    p0 = Problem(
        llm=library_llm("gpt3-175b"), system=base, num_gpus=NUM_GPUS, training=Training(global_batch=128)
    )
    K = _knobs(p0)
    t0 = evaluate(p0, K).step_time
    faster = base.model_copy(update={"hbm_bandwidth_gbps": base.hbm_bandwidth_gbps * 2})
    t1 = evaluate(Problem(llm=p0.llm, system=faster, num_gpus=NUM_GPUS, training=p0.training), K).step_time
    assert np.all(t1 <= t0 * (1 + 1e-12))


def _overlap_pairs(problem, executions):
    """tp_exposed without and with tp_overlap=ring for every execution."""
    none = [_with(ex, tp_overlap="none") for ex in executions]
    ring = [_with(ex, tp_overlap="ring") for ex in executions]
    a = evaluate(problem, _knobs(problem, none)).tp_exposed
    b = evaluate(problem, _knobs(problem, ring)).tp_exposed
    return a, b


@pytest.mark.parametrize("llm_name", ["llama3.1-8b", "llama3.1-70b", "gpt3-175b"])
@pytest.mark.parametrize("system_name", ["h100-sxm-80gb", "a100-sxm-80gb"])
def test_ring_overlap_never_increases_exposed_tp_time(llm_name, system_name):
    p = _problem(system_name, llm_name)
    execs = [
        Execution(tp=tp, pp=pp, sequence_parallel=sp, recompute=rc, micro_batch=mb)
        for tp in (2, 4, 8)
        for pp in (1, 2)
        for sp in (False, True)
        for rc in ("none", "selective", "full")
        for mb in (1, 2)
    ]
    a, b = _overlap_pairs(p, execs)
    assert np.all(a > 0)
    assert np.all(b <= a * (1 + 1e-12)), [execs[i] for i in np.nonzero(b > a)[0]]


def test_ring_overlap_never_increases_exposed_tp_time_small_model():
    # h = 64, s = 32: the GEMMs are tiny, the TP collectives are latency-bound
    llm = LLM(name="small", hidden=64, heads=4, ffn=256, layers=2, vocab=128, seq_len=32)
    sysm = library_system("a100-sxm-80gb")
    p = Problem(llm=llm, system=sysm, num_gpus=8, training=Training(global_batch=8))
    a, b = _overlap_pairs(p, [Execution(tp=8), Execution(tp=2, placement={"tp": "infiniband"})])
    assert np.all(b <= a)


def test_recompute_stores_fewer_activation_bytes():
    llm = library_llm("llama3.1-8b")
    sysm = library_system("h100-sxm-80gb")
    p = Problem(llm=llm, system=sysm, num_gpus=NUM_GPUS, training=Training(global_batch=128))
    ctx = make_ctx(p)
    for tp in (1, 2, 8):
        for sp in (False, True) if tp > 1 else (False,):
            for att in ("flash", "standard"):
                for mb in (1, 4):
                    execs = [
                        Execution(tp=tp, sequence_parallel=sp, attention=att, micro_batch=mb, recompute=r)
                        for r in ("none", "selective", "full")
                    ]
                    none, sel, full = block_cost(ctx, _knobs(p, execs)).act_stored
                    assert full < sel < none, (tp, sp, att, mb)


def test_recompute_lowers_step_activation_memory_for_deep_stages():
    # with many layers per stage the stored activations dominate; recomputation must lower the peak
    p = _problem("h100-sxm-80gb", "gpt3-175b")
    for ex in (
        Execution(tp=8, pp=1),
        Execution(tp=8, pp=4),
        Execution(tp=4, pp=8, vpp=2, sequence_parallel=True),
    ):
        execs = [_with(ex, recompute=r) for r in ("none", "selective", "full")]
        none, sel, full = evaluate(p, _knobs(p, execs)).activations
        assert full < sel < none


def test_selective_recompute_never_needs_more_memory_than_none():
    # 4 layers, flash attention: selective only drops the attention output (2 T h B per layer), but the
    # model adds a full layer (~34 T h B) of working memory back
    llm = LLM(name="shallow", hidden=1024, heads=8, ffn=4096, layers=4, vocab=1024, seq_len=2048)
    sysm = library_system("h100-sxm-80gb")
    p = Problem(llm=llm, system=sysm, num_gpus=1, training=Training(global_batch=1))
    execs = [Execution(recompute=r) for r in ("none", "selective")]
    none, sel = evaluate(p, _knobs(p, execs)).activations
    assert sel <= none


def test_pipe_overlap_hides_tp_traffic_at_tp2():
    # llama3.1-70b, tp=2 over NVLink, 8192-token sequences: the GEMMs take far longer than the collectives,
    # so pipelining the collective in chunks with the GEMM must hide part of it
    p = _problem("h100-sxm-80gb", "llama3.1-70b")
    execs = [Execution(tp=2, tp_overlap=o) for o in ("none", "pipe")]
    none, pipe = evaluate(p, _knobs(p, execs)).tp_exposed
    assert pipe < none


def test_edge_stage_hides_one_p2p_exchange_per_micro_batch():
    # 1F1B steady state: a middle stage exchanges with two neighbours per chunk (2*vpp waits per
    # micro-batch), the last stage with one for its last chunk, so its extra work (LM head, loss) hides
    # one exchange: p2p = 2*(n_mb*vpp + pp-1)*t_p2p - n_mb*min(t_p2p, head)
    p = _problem("h100-sxm-80gb", "llama3.1-8b")  # 64 GPUs: tp 2 x pp 4 x dp 8 -> 16 micro-batches
    execs = [Execution(tp=2, pp=4, vpp=v, pp_overlap=False) for v in (1, 2)]  # exchanges on the critical path
    r = evaluate(p, _knobs(p, execs))
    n_mb, pp = 128 / 8, 4
    t_p2p = float(r.pp_exposed[1] - r.pp_exposed[0]) / (2 * n_mb)  # the second chunk adds 2 exchanges per mb
    head = float(r.head[0]) / n_mb
    assert 0 < t_p2p < head  # an 8B model's LM head (128K vocab) outlasts an NVLink/IB activation send
    assert float(r.pp_exposed[0]) == pytest.approx(2 * (n_mb + pp - 1) * t_p2p - n_mb * t_p2p, rel=1e-9)


def test_interleaved_exchanges_overlap_a_chunk_forward():
    """With overlap_p2p_comm (vpp > 1) a steady-state exchange costs only what exceeds the forward of a chunk
    (Lc layers): on NVLink/IB nothing of it, so only fill and drain remain (2(pp-1) exchanges); on a link so
    slow that a send outlasts the chunk the remainder stays, 2*vpp per micro-batch."""
    p = _problem("h100-sxm-80gb", "llama3.1-8b")  # tp 2 x pp 4 x dp 8, 16 micro-batches
    on, off = (evaluate(p, _knobs(p, [Execution(tp=2, pp=4, vpp=2, pp_overlap=o)])) for o in (True, False))
    n_mb, pp, vpp = 16, 4, 2
    t_p2p = float(on.terms.p2p_s[0])
    assert float(on.pp_exposed[0]) == pytest.approx(2 * (pp - 1) * t_p2p, rel=1e-9)
    assert float(off.pp_exposed[0]) == pytest.approx(
        2 * (n_mb * vpp + pp - 1) * t_p2p - n_mb * t_p2p, rel=1e-9
    )
    assert float(on.step_time[0]) < float(off.step_time[0])
    one = evaluate(p, _knobs(p, [Execution(tp=2, pp=4, vpp=1, pp_overlap=True)]))  # 1F1B: no overlap
    assert float(one.pp_exposed[0]) == pytest.approx(2 * (n_mb + pp - 1) * t_p2p - n_mb * t_p2p, rel=1e-9)
    base = library_system("h100-sxm-80gb")
    nets = [
        n.model_copy(update={"bandwidth_gbps": 0.05}) if i == 1 else n for i, n in enumerate(base.networks)
    ]
    slow = p.model_copy(update={"system": base.model_copy(update={"networks": nets})})
    r = evaluate(slow, _knobs(slow, [Execution(tp=2, pp=4, vpp=2)]))
    t = float(r.terms.p2p_s[0])
    window = 32 / (pp * vpp) * float(r.terms.layer_fw_s[0])  # Lc = 32/(pp*vpp) = 4
    assert t > window
    assert float(r.pp_exposed[0]) == pytest.approx(
        2 * n_mb * vpp * (t - window) + 2 * (pp - 1) * t - n_mb * min(t - window, float(r.head[0]) / n_mb),
        rel=1e-9,
    )


def test_edge_work_shorter_than_the_exchange_is_fully_hidden():
    # on a very slow PP link the middle stages' waits set the period: the LM head then costs nothing in the
    # steady state: edge work + exposed p2p is the exchanges alone, whatever the vocabulary
    base = library_system("h100-sxm-80gb")
    nets = [
        n.model_copy(update={"bandwidth_gbps": 0.05}) if i == 1 else n for i, n in enumerate(base.networks)
    ]
    slow = base.model_copy(update={"networks": nets})
    llm = library_llm("llama3.1-8b")
    times = []
    for vocab in (32_000, 128_256):
        p = Problem(
            llm=llm.model_copy(update={"vocab": vocab}),
            system=slow,
            num_gpus=NUM_GPUS,
            training=Training(global_batch=128),
            execution=Execution(),
        )
        r = evaluate(
            p, _knobs(p, [Execution(tp=8, pp=8)])
        )  # pp stages on separate nodes: PP over the slow link
        times.append(float(r.head[0] + r.pp_exposed[0]))
        assert float(r.head[0]) > 0
    assert times[0] == pytest.approx(times[1], rel=1e-9)
