"""The rank order (`Execution.rank_order`): Megatron's default tp-cp-dp-pp against data parallelism outermost,
tp-cp-pp-dp (--use-tp-pp-dp-mapping): where each axis is placed, how a data-parallel ring spreads over the
racks, what the model, the solver, the stacks, the run mapping and the exporter make of it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import library_llm, library_system, problem_and_knobs, run_record

from optimizer import api
from optimizer.io.runs import map_run, predict
from optimizer.model.hardware import Tiers
from optimizer.model.step import dp_stride, evaluate, make_ctx
from optimizer.report.export import megatron
from optimizer.rules.cross_field import execution_errors
from optimizer.rules.layout import domain_used, placement
from optimizer.schema import Execution, Problem, RankOrder, Training

GB200 = library_system("gb200-nvl72")
LLAMA = library_llm("llama3.1-70b").model_copy(update={"layers": 32})  # 32 layers: 4 per stage at pp 8


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
    cp x 1 = 2 with data parallelism outermost, as `collective_time` counts them (`members_per_domain`)."""
    from optimizer.model.hardware import members_per_domain

    tiers = Tiers.of(GB200)

    def members(tp, cp, pp, dp_last, n=160):
        return float(members_per_domain(tiers, 1, n, dp_stride(tiers, 1, tp, cp, pp, dp_last))[0])

    assert dp_stride(tiers, 1, 4, 2, 8, dp_last=False) == 4 and members(4, 2, 8, False) == 16
    assert members(4, 2, 8, True) == 2
    assert members(4, 2, 16, True) == 2  # a pipeline of 2 x 64 GPUs: one replica's cp ranks per rack
    assert members(4, 2, 4, True) == 4  # half a rack per pipeline: two replicas per rack
    assert members(2, 1, 5, True) == 6  # 64 // 10 = 6 pipelines per rack, one rank each


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


def test_the_expert_data_parallel_group_follows_the_order():
    """MoE with the pipeline inside: the expert-data-parallel ranks are ep*etp*pp apart and span the job, so
    their reduction leaves each rack through fewer NICs than in Megatron's order."""
    from optimizer.schema import MoE

    moe = LLAMA.model_copy(update={"moe": MoE(experts=8, top_k=2, expert_ffn=14336)})
    link = {}
    for order in RankOrder:
        ex = Execution(
            tp=2, pp=8, dp=32, ep=2, etp=1, micro_batch=1, sequence_parallel=True, rank_order=order
        )
        p, k = problem_and_knobs(moe, GB200, 512, Training(global_batch=64, precision="bf16"), ex)
        link[order] = float(evaluate(p, k, make_ctx(p)).dp_link[0])
    assert link[RankOrder.TP_CP_PP_DP] > 1.5 * link[RankOrder.TP_CP_DP_PP]


def test_the_solver_plans_under_the_problems_order():
    """A pipeline across racks or inside one: the optimum under each order is the model's time of that plan
    under that order (the solver verifies it), the two differ, and the plan carries its order."""
    objective = {}
    for order in RankOrder:
        p = Problem(
            llm=LLAMA,
            system=GB200,
            num_gpus=512,
            training=Training(global_batch=256, precision="bf16"),
            execution=Execution(rank_order=order),
            search={"tp": 4, "pp": 8, "cp": 2, "vpp": 1},
        )
        r = api.solve(p, time_limit_s=60)
        assert r.status == "optimal"
        plan = r.plans[0].evaluation
        assert plan.execution.rank_order == order
        assert plan.execution.placement["pp"] == (
            "nvlink" if order == RankOrder.TP_CP_PP_DP else "infiniband"
        )
        again = api.evaluate(p, plan.execution)
        assert r.plans[0].objective_s == pytest.approx(float(again.result["step_time"]), rel=1e-3)
        objective[order] = r.plans[0].objective_s
    assert objective[RankOrder.TP_CP_DP_PP] != pytest.approx(objective[RankOrder.TP_CP_PP_DP], rel=1e-3)


def test_evaluate_takes_the_executions_order():
    """`evaluate(problem, ex)`: the execution's order prices the plan, whatever the problem's says."""
    ex = Execution(tp=4, pp=8, cp=2, dp=8, micro_batch=1, sequence_parallel=True)
    last = ex.model_copy(update={"rank_order": RankOrder.TP_CP_PP_DP})
    kw = dict(llm=LLAMA, system=GB200, num_gpus=512, training=Training(global_batch=64, precision="bf16"))
    p_default, p_last = Problem(**kw, execution=ex), Problem(**kw, execution=last)
    mixed = api.evaluate(p_default, last)
    assert mixed.execution.rank_order == RankOrder.TP_CP_PP_DP
    assert mixed.result["step_time"] == pytest.approx(
        api.evaluate(p_last, last).result["step_time"], rel=1e-12
    )
    assert mixed.result["step_time"] != pytest.approx(
        api.evaluate(p_default, ex).result["step_time"], rel=1e-3
    )


def test_a_problem_file_may_state_only_the_order(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "llm: {name: l, hidden: 4096, ffn: 14336, layers: 32, heads: 32, kv_heads: 8, seq_len: 8192,"
        " vocab: 128256, mlp: swiglu}\nsystem: gb200-nvl72\nnum_gpus: 512\ntraining: {global_batch: 256}\n"
        "execution: {rank_order: tp-cp-pp-dp}\nsearch: {cp: 1, vpp: 1}\n"
    )
    from optimizer.io.loader import load_problem

    p = load_problem(path)
    assert p.execution.rank_order == RankOrder.TP_CP_PP_DP
    assert api.solve(p, time_limit_s=60).plans[0].evaluation.execution.rank_order == RankOrder.TP_CP_PP_DP


def test_moe_with_the_pipeline_inside_needs_equal_expert_and_dense_data_parallelism():
    """Megatron-Core asserts it (parallel_state: "When not using pp-last rank ordering ..."): with data
    parallelism outermost and pp > 1, ep*etp = tp*cp; the rule and the solver's masks agree."""
    from optimizer.rules.layout import Group, rule_masks
    from optimizer.schema import MoE

    moe = LLAMA.model_copy(update={"moe": MoE(experts=8, top_k=2, expert_ffn=14336)})
    kw = dict(
        llm=moe, system=library_system("h100-sxm-80gb"), num_gpus=64, training=Training(global_batch=64)
    )
    for order, ok in ((RankOrder.TP_CP_DP_PP, True), (RankOrder.TP_CP_PP_DP, False)):
        ex = Execution(tp=1, pp=4, dp=16, ep=8, micro_batch=1, rank_order=order)
        p = Problem(**kw, execution=ex)
        errs = execution_errors(p)
        assert (errs == []) == ok, errs
        assert bool(rule_masks(p, 1, 4, 16, 1, 1, 1, 8, 1, 0, 0)[Group.EXPERTS]) == ok
    # ep*etp = tp*cp, or one stage: allowed
    for ex in (
        Execution(tp=8, pp=4, dp=2, ep=8, etp=1, micro_batch=1, rank_order="tp-cp-pp-dp"),
        Execution(tp=1, pp=1, dp=64, ep=8, micro_batch=1, rank_order="tp-cp-pp-dp"),
    ):
        assert execution_errors(Problem(**kw, execution=ex)) == []


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
    from optimizer.report.export import nemo

    assert ("trainer.strategy.use_tp_pp_dp_mapping", True) in nemo.overrides(m.problem, ex)
    from optimizer.rules.cross_field import execution_warnings

    assert any(w.startswith("rank_order=") for w in execution_warnings("torchtitan", ex))
    assert not any(w.startswith("rank_order=") for w in execution_warnings("megatron-core", ex))
