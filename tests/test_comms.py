"""Alpha-beta collectives (optimizer.model.hardware.collective_time) with NCCL's latency model on hand-built
tiers."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import library_system

from optimizer.model.hardware import Tiers, collective_time

# tier 0: 100 GB/s at 80% efficiency, 5 us per step; tier 1: 25 GB/s at 50%, 10 us per step
BW = np.array([100e9, 25e9])
EFF = np.array([0.8, 0.5])
LAT = np.array([5e-6, 10e-6])
TIERS = Tiers(
    bandwidth=BW * EFF, latency=LAT, processor_usage=np.array([0.1, 0.05]), size=np.array([8, 1024])
)
S = 1e9  # bytes


def test_allreduce_ring_formula():
    # n = 8 on tier 0: 2*(7/8)*1e9 / (100e9*0.8) + 2*7*5e-6 = 1.75e9/80e9 + 70e-6 = 0.021875 + 0.00007
    t = collective_time("ar", S, 8, 0, TIERS)
    assert float(t) == pytest.approx(0.021945, rel=1e-12)


def test_allreduce_other_tier():
    # n = 4 on tier 1, one member per node (stride 8): 2*(3/4)*1e9 / (25e9*0.5) = 0.12, and the cheaper of a
    # ring's 2*3 outer steps (60 us) and a tree's 2*log2(4) = 4 outer steps (40 us)
    assert float(collective_time("ar", S, 4, 1, TIERS, stride=8)) == pytest.approx(0.12004, rel=1e-12)


def test_ring_across_nodes_uses_every_member_nic():
    """NCCL rings leave a node once per channel, one channel per NIC: a group with `local` members per node
    moves at min(local x NIC, NVLink) bandwidth."""
    # 16 consecutive ranks, 8 per node: min(8 * 12.5, 80) = 80 GB/s
    t = float(collective_time("ar", S, 16, 1, TIERS, stride=1))
    # latency: a tree's 2*(7 inner + 1 outer) steps (90 us) beats a ring's 28 inner + 2 outer (160 us)
    assert t == pytest.approx(2 * 15 / 16 * S / 80e9 + 2 * (7 * 5e-6 + 10e-6), rel=1e-12)
    # ranks 4 apart: 2 per node -> 2 * 12.5 = 25 GB/s; a ring of 8 inner and 7 outer steps
    t4 = float(collective_time("rs", S, 16, 1, TIERS, stride=4))
    assert t4 == pytest.approx(15 / 16 * S / 25e9 + 8 * 5e-6 + 7 * 10e-6, rel=1e-12)
    # one per node: the NIC alone, as before; never faster with fewer members per node
    t8 = float(collective_time("rs", S, 16, 1, TIERS, stride=8))
    assert t8 == pytest.approx(15 / 16 * S / 12.5e9 + 15 * 10e-6, rel=1e-12)
    assert t8 > t4 > float(collective_time("rs", S, 16, 1, TIERS, stride=1))
    # no stride (TP/CP collectives): each member's own link, as before
    assert float(collective_time("rs", S, 16, 1, TIERS)) == t8


def test_moe_dispatch_crosses_the_outer_tier_once_per_remote_node():
    """Top-k dispatch over 4 nodes of 8: a token reaches 3*(1-(3/4)^8) remote nodes on average, not 8*3/4
    rows; with top-1 nothing is deduplicated."""
    from optimizer.model.hardware import a2a_time

    k = 8
    plain = float(a2a_time(S, 32, 1, TIERS))
    dedup = float(a2a_time(S, 32, 1, TIERS, copies=k))
    lat = 31 * 10e-6
    assert plain == pytest.approx(24 / 32 * S / 12.5e9 + lat, rel=1e-12)
    assert dedup == pytest.approx(3 * (1 - 0.75**k) / k * S / 12.5e9 + lat, rel=1e-12)
    assert float(a2a_time(S, 32, 1, TIERS, copies=1)) == plain
    assert float(a2a_time(S, 8, 0, TIERS, copies=k)) == float(a2a_time(S, 8, 0, TIERS))  # one node: no change


def test_reduce_scatter_and_all_gather():
    # each: (7/8)*1e9/80e9 + 7*5e-6 = 0.0109375 + 0.000035 = 0.0109725
    rs = float(collective_time("rs", S, 8, 0, TIERS))
    ag = float(collective_time("ag", S, 8, 0, TIERS))
    assert rs == pytest.approx(0.0109725, rel=1e-12)
    assert ag == pytest.approx(0.0109725, rel=1e-12)
    # reduce-scatter + all-gather = all-reduce (same volume, same number of steps)
    assert rs + ag == pytest.approx(float(collective_time("ar", S, 8, 0, TIERS)), rel=1e-12)


def test_p2p_and_all_to_all():
    # p2p: S/bw + one latency = 1e9/80e9 + 5e-6 = 0.012505
    assert float(collective_time("p2p", S, 2, 0, TIERS)) == pytest.approx(0.012505, rel=1e-12)
    # all-to-all: (n-1)/n S in n-1 steps = 0.0109725 on tier 0 with n = 8
    assert float(collective_time("a2a", S, 8, 0, TIERS)) == pytest.approx(0.0109725, rel=1e-12)


@pytest.mark.parametrize("kind", ["ar", "rs", "ag", "a2a", "p2p"])
def test_group_of_one_costs_nothing(kind):
    assert float(collective_time(kind, S, 1, 0, TIERS)) == 0.0
    assert float(collective_time(kind, S, 1, 1, TIERS)) == 0.0


def test_arrays_broadcast():
    nbytes = np.array([1e6, 1e9, 4e9])  # shape (3,)
    group = np.array([[1], [2], [8]])  # shape (3, 1)
    tier = np.array([[0], [1], [0]])
    t = collective_time("ar", nbytes, group, tier, TIERS, stride=8)
    assert t.shape == (3, 3)
    assert np.all(t[0] == 0.0)  # group of 1
    # n = 2 on tier 1: 2*(1/2)*S/12.5e9 + 2*1*10e-6 = S/12.5e9 + 2e-5
    np.testing.assert_allclose(t[1], nbytes / 12.5e9 + 2e-5, rtol=1e-12)
    # n = 8 on tier 0: 1.75*S/80e9 + 7e-5
    np.testing.assert_allclose(t[2], 1.75 * nbytes / 80e9 + 7e-5, rtol=1e-12)
    for i in range(3):
        for j in range(3):
            assert t[i, j] == pytest.approx(
                float(collective_time("ar", nbytes[j], group[i, 0], tier[i, 0], TIERS, stride=8)), rel=1e-15
            )


def test_tiers_of_system_applies_efficiency():
    # Tiers.of stores bandwidth after efficiency, in byte/s, and latency in s (no calibrated value asserted)
    sysm = library_system("a100-sxm-80gb")
    tiers = Tiers.of(sysm)
    for i, net in enumerate(sysm.networks):
        assert tiers.bandwidth[i] == pytest.approx(net.bandwidth_gbps * 1e9 * net.efficiency, rel=1e-15)
        assert tiers.latency[i] == pytest.approx(net.latency_us * 1e-6, rel=1e-15)
        assert tiers.size[i] == net.size


def test_latency_follows_nccl_steps_inside_and_between_domains():
    """NCCL's tuning model: a ring's steps inside a domain cost the inner tier's latency, the m-1 between the
    m domains the outer tier's (twice for all-reduce); an all-reduce across domains takes the cheaper of a
    ring and a tree (2((n/m - 1) inner + floor(log2 m) outer) steps); on one domain nothing changes."""
    from optimizer.model.hardware import collective_latency

    # 2048 ranks, 8 per domain (256 domains)
    ag = float(collective_latency("ag", 2048, 1, TIERS, local=8))
    assert ag == pytest.approx((2047 - 255) * 5e-6 + 255 * 10e-6, rel=1e-12)
    ar = float(collective_latency("ar", 2048, 1, TIERS, local=8))
    assert ar == pytest.approx(2 * (7 * 5e-6 + 8 * 10e-6), rel=1e-12)
    assert ar < 2 * ag  # the tree's log2 beats the ring's linear steps at scale
    # two ranks in two domains: ring and tree both 2 outer steps
    assert float(collective_latency("ar", 2, 1, TIERS, local=1)) == pytest.approx(2 * 10e-6, rel=1e-12)
    # within one domain: n-1 (2(n-1)) steps of its own latency
    assert float(collective_latency("ar", 8, 0, TIERS)) == pytest.approx(14 * 5e-6, rel=1e-12)
    assert float(collective_latency("rs", 8, 0, TIERS)) == pytest.approx(7 * 5e-6, rel=1e-12)
    # the ring's latency grows with the ranks, the tree's with log2 of the domains
    rings = [float(collective_latency("rs", n, 1, TIERS, local=8)) for n in (64, 512, 4096)]
    trees = [float(collective_latency("ar", n, 1, TIERS, local=8)) for n in (64, 512, 4096)]
    assert rings[2] / rings[0] > 50 and trees[2] - trees[0] == pytest.approx(2 * 6 * 10e-6, rel=1e-9)


def test_each_call_pays_the_latency_once():
    """A buffer sent in `calls` collectives (per-layer buckets, FSDP units): the same bandwidth term, the
    latency `calls` times."""
    one = float(collective_time("ag", S, 64, 1, TIERS, stride=1))
    eighty = float(collective_time("ag", S, 64, 1, TIERS, stride=1, calls=80))
    lat = 56 * 5e-6 + 7 * 10e-6
    assert eighty - one == pytest.approx(79 * lat, rel=1e-9)
    assert float(collective_time("ag", S, 1, 1, TIERS, stride=1, calls=80)) == 0.0


def test_data_parallel_calls_follow_each_stacks_buckets():
    """Megatron-Core buckets ZeRO-0/1/2 gradients by max(40M, 1M x dp) parameters (on the first pipeline
    stage only), DeepSpeed by 5e8 elements, the FSDP-style stacks per layer; ZeRO-3 goes per layer on every
    stack."""
    from optimizer.model.step import dp_calls
    from optimizer.schema.stack import Stack

    P, L = 8.75e9, 80.0
    assert float(dp_calls(Stack.MEGATRON_CORE, 1, P, 8, L)) == np.ceil(P / 40e6)  # 219 buckets
    assert float(dp_calls(Stack.MEGATRON_CORE, 1, P, 1024, L)) == np.ceil(P / 1024e6)  # 9: grown with dp
    assert float(dp_calls(Stack.MEGATRON_CORE, 3, P, 1024, L)) == L
    # a later pipeline stage (the one timed): Megatron-Core buckets only the first stage
    assert float(dp_calls(Stack.MEGATRON_CORE, 1, P, 8, L, pp=4)) == 1.0
    assert float(dp_calls(Stack.DEEPSPEED, 1, P, 8, L, pp=4)) == np.ceil(P / 5e8)
    assert float(dp_calls(Stack.DEEPSPEED, 2, P, 64, L)) == np.ceil(P / 5e8)
    for s in (Stack.TORCHTITAN, Stack.FSDP, Stack.MAXTEXT):
        assert float(dp_calls(s, 1, P, 64, L)) == L
    assert float(dp_calls(Stack.MEGATRON_CORE, 1, 1e6, 8, L)) == 1.0  # at least one call
    z = np.array([1, 3])
    assert dp_calls(Stack.MEGATRON_CORE, z, P, 8, L).tolist() == [np.ceil(P / 40e6), L]


def test_zero3_gathers_turn_latency_bound_at_thousands_of_ranks():
    """A 1.3B model under ZeRO-3 with one 2K-token sequence per GPU: each layer's gathers and reduction cost a
    ring's latency over every rank, so the exposed data-parallel time grows with the ranks (weak scaling: the
    same work per GPU) once the calls outlast a layer's compute."""
    from helpers import problem_and_knobs

    from optimizer.model.step import evaluate, make_ctx
    from optimizer.schema import LLM, Execution, Training

    llm = LLM(name="z", hidden=2048, ffn=8192, layers=24, heads=16, seq_len=2048, vocab=50000)
    exposed = {}
    for n in (64, 2048):
        ex = Execution(tp=1, pp=1, dp=n, micro_batch=1, zero=3)
        p, k = problem_and_knobs(llm, library_system("a100-sxm-80gb"), n, Training(global_batch=n), ex)
        exposed[n] = float(evaluate(p, k, make_ctx(p)).dp_exposed[0])
    assert exposed[2048] > 5 * exposed[64] > 0


def test_a_later_pipeline_stage_reduces_without_buckets(monkeypatch):
    """The model times the last stage: at pp > 1 Megatron-Core reduces it in one call whatever the bucket
    size; at pp = 1 the bucket size sets the calls."""
    from helpers import problem_and_knobs

    import optimizer.model.step as step
    from optimizer.schema import LLM, Execution, Training

    llm = LLM(name="b", hidden=4096, ffn=14336, layers=32, heads=32, kv_heads=8, seq_len=4096, vocab=32000)
    sysm = library_system("h100-sxm-80gb")

    def link(pp):
        ex = Execution(tp=8, pp=pp, dp=16, micro_batch=1, zero=1, dp_overlap=False)
        p, k = problem_and_knobs(llm, sysm, 8 * pp * 16, Training(global_batch=64), ex)
        return float(step.evaluate(p, k, step.make_ctx(p)).dp_link[0])

    before = {pp: link(pp) for pp in (1, 4)}
    monkeypatch.setattr(step, "dp_bucket_params", lambda stack, dp: 1e6 + 0.0 * np.asarray(dp, dtype=float))
    assert link(4) == before[4]
    assert link(1) > before[1]
