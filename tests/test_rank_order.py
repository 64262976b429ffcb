"""The rank order (`Execution.rank_order`): Megatron's default tp-cp-dp-pp against data parallelism outermost,
tp-cp-pp-dp (--use-tp-pp-dp-mapping): where each axis is placed, how a data-parallel ring spreads over the
racks, what the model, the solver, the stacks, the run mapping and the exporter make of it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import library_system, problem_and_knobs, run_record

from optimizer import api
from optimizer.io.runs import map_run, predict
from optimizer.model.hardware import Tiers
from optimizer.model.step import dp_stride, evaluate, make_ctx
from optimizer.report.export import megatron
from optimizer.rules.cross_field import execution_errors
from optimizer.rules.layout import domain_used, placement
from optimizer.schema import LLM, Execution, Problem, RankOrder, Training

GB200 = library_system("gb200-nvl72")
LLAMA = LLM(
    name="l",
    hidden=8192,
    ffn=28672,
    layers=32,
    heads=64,
    kv_heads=8,
    seq_len=8192,
    vocab=128256,
    mlp="swiglu",
)


def _tiers(dp_last: bool, tp=4, cp=2, pp=8, dp=8):
    sizes = [x.size for x in GB200.networks]
    return placement(sizes, tp, cp, dp, pp, used=domain_used(GB200), dp_last=dp_last)


def test_data_parallelism_outermost_keeps_the_pipeline_in_a_rack():
    """tp 4 x cp 2 x pp 8 = 64 GPUs = one rack's used GPUs: in Megatron's order the 8 replicas fill the rack
    and the pipeline crosses racks; with data parallelism outermost the pipeline stays inside the rack and
    the replicas cross."""
    default, last = _tiers(False), _tiers(True)
    assert (default["tp"], default["cp"], default["pp"], default["dp"]) == (0, 0, 1, 0)
    assert (last["tp"], last["cp"], last["pp"], last["dp"]) == (0, 0, 0, 1)


def test_a_replica_per_rack_rides_one_nic_per_member():
    """The gradient group (dp x cp ranks) has 64 / tp = 16 members per rack in Megatron's order (stride tp),
    cp x 1 = 2 with data parallelism outermost (an effective stride of 64 / 2)."""
    tiers = Tiers.of(GB200)
    assert dp_stride(tiers, 1, 4, 2, 8, dp_last=False) == 4
    assert float(dp_stride(tiers, 1, 4, 2, 8, dp_last=True)) == 32.0
    # a pipeline of 2 x 64 GPUs: one replica's cp ranks per rack, none of another replica
    assert float(dp_stride(tiers, 1, 4, 2, 16, dp_last=True)) == 32.0
    # half a rack per pipeline: two replicas per rack
    assert float(dp_stride(tiers, 1, 4, 2, 4, dp_last=True)) == 16.0


def _evaluate(order: RankOrder, dp: int = 16):
    ex = Execution(tp=4, pp=8, cp=2, dp=dp, vpp=1, micro_batch=1, sequence_parallel=True, rank_order=order)
    n = 4 * 8 * 2 * dp
    p, k = problem_and_knobs(LLAMA, GB200, n, Training(global_batch=8 * dp, precision="bf16"), ex)
    return evaluate(p, k, make_ctx(p)), k


def test_the_model_prices_the_gradient_ring_on_fewer_nics_and_the_pipeline_on_nvlink():
    r0, k0 = _evaluate(RankOrder.TP_CP_DP_PP)
    r1, k1 = _evaluate(RankOrder.TP_CP_PP_DP)
    assert int(k0.tier_pp[0]) == 1 and int(k1.tier_pp[0]) == 0
    assert float(r1.dp_link[0]) > 3 * float(r0.dp_link[0])  # 2 NICs per rack against 16 (NVLink-capped)
    assert float(r1.pp_link[0]) < float(r0.pp_link[0])  # stage exchanges on NVLink, not InfiniBand
    assert float(r1.fw[0]) == float(r0.fw[0])  # the compute is the same


def test_the_solver_agrees_with_the_model_under_either_order():
    """CP-SAT's tables come from the model with the problem's rank order; the solver verifies its plan."""
    for order in RankOrder:
        p = Problem(
            llm=LLAMA,
            system=GB200,
            num_gpus=128,
            training=Training(global_batch=64, precision="bf16"),
            execution=Execution(rank_order=order),
            search={"cp": 1, "vpp": 1},
        )
        r = api.solve(p, time_limit_s=60)
        assert r.status == "optimal"
        ev = r.plans[0].evaluation
        assert ev.execution.rank_order == order
        assert r.plans[0].objective_s == pytest.approx(float(ev.result["step_time"]), rel=1e-3)


def test_only_megatron_core_numbers_data_parallelism_outermost():
    for stack, bad in (("megatron-core", False), ("torchtitan", True), ("maxtext", True)):
        kw = dict(llm=LLAMA, system=GB200, num_gpus=64, training=Training(global_batch=64), stack=stack)
        if bad:
            with pytest.raises(ValueError, match="rank_order: tp-cp-pp-dp is not offered by stack"):
                Problem(**kw, execution=Execution(rank_order="tp-cp-pp-dp"))
        else:
            p = Problem(**kw, execution=Execution(tp=4, pp=8, rank_order="tp-cp-pp-dp"))
            assert execution_errors(p) == []


def test_a_run_states_its_rank_order_and_the_exporter_writes_it():
    rec = run_record(
        {"hidden": 8192, "ffn": 28672, "layers": 32, "heads": 64, "kv_heads": 8, "seq_len": 8192},
        {"gpu": "gb200-nvl72", "num_gpus": 512, "gpus_per_node": 4},
        {"tp": 4, "pp": 8, "dp": 8, "cp": 2, "micro_batch": 1, "global_batch": 64},
        {"framework": "nemo", "rank_order": "tp-cp-pp-dp"},
    )
    m = map_run(rec)
    assert m.problem.execution.rank_order == RankOrder.TP_CP_PP_DP
    assert any("software.rank_order" in a for a in m.assumptions)
    plain = copy.deepcopy(rec)
    plain["software"].pop("rank_order")
    assert map_run(plain).problem.execution.rank_order == RankOrder.TP_CP_DP_PP
    ex = predict(m).execution
    flags, _ = megatron.args(m.problem, ex)
    assert "--use-tp-pp-dp-mapping" in flags
    assert (
        "--use-tp-pp-dp-mapping"
        not in megatron.args(
            map_run(plain).problem, ex.model_copy(update={"rank_order": RankOrder.TP_CP_DP_PP})
        )[0]
    )
    assert np.isfinite(predict(m).result["step_time"])
