"""Execution knobs of today's recipes that `evaluate` and published runs take: partial activation offload,
recompute modules, the MoE dispatcher and the MoE all-to-all overlap (`optimizer.model.layer`, `step`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import library_llm, library_system

from optimizer.drivers.evaluate import evaluate_execution
from optimizer.schema import Execution, Problem, Training

GIB = 1024**3


def run(llm: str, system: str, n: int, batch: int, stack: str = "megatron-core", **ex):
    p = Problem(
        llm=library_llm(llm),
        system=library_system(system),
        num_gpus=n,
        training=Training(global_batch=batch, precision="bf16"),
        execution=Execution(**ex),
        stack=stack,
    )
    return evaluate_execution(p).result


def test_partial_activation_offload_moves_that_share_of_the_stored_layers():
    """cpu_offloading_num_layers: N of a stage's layers go to the Grace memory, the rest stay; all of them
    with no count (two kept in use); what leaves HBM arrives in offload memory."""
    base = dict(tp=1, pp=1, dp=64, micro_batch=2, zero=3)
    none = run("llama3.1-70b", "gb200-nvl72", 64, 256, **base)
    part = run(
        "llama3.1-70b", "gb200-nvl72", 64, 256, **base, activation_offload=True, activation_offload_layers=40
    )
    full = run("llama3.1-70b", "gb200-nvl72", 64, 256, **base, activation_offload=True)
    assert full["activations"] < part["activations"] < none["activations"]
    moved = none["activations"] - part["activations"]
    assert part["offload_mem"] == pytest.approx(moved, rel=1e-9)
    # 40 of the 80 layers in flight leave HBM; offloading all keeps 2: 78 leave
    assert moved / (none["activations"] - full["activations"]) == pytest.approx(40 / 78, rel=1e-9)
    with pytest.raises(ValueError, match="activation_offload_layers needs activation_offload"):
        Execution(tp=1, activation_offload_layers=4)


def test_recompute_modules_trade_memory_for_time():
    """Selective recompute of more modules keeps less and recomputes more; no modules named is the attention
    core (Megatron-Core's default); MLA's up-projections are a large share of a DeepSeek layer."""
    base = dict(tp=1, pp=8, dp=4, ep=4, micro_batch=1, recompute="selective", zero=1)
    core = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **base)
    named = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **base, recompute_modules=["core_attn"])
    assert named["activations"] == core["activations"] and named["recompute"] == core["recompute"]
    more = run(
        "deepseek-v3",
        "h100-sxm-80gb",
        256,
        1024,
        **base,
        recompute_modules=["core_attn", "mla_up_proj", "moe_act", "layernorm"],
    )
    assert more["activations"] < core["activations"] and more["recompute"] > core["recompute"]
    up = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **base, recompute_modules=["mla_up_proj"])
    assert up["activations"] < core["activations"]
    # the context-parallel K/V ring runs again only when the attention core does
    cp = dict(tp=1, pp=1, cp=4, dp=2, micro_batch=1, recompute="selective")
    ring = {
        tuple(m): run("llama3.1-8b", "h100-sxm-80gb", 8, 16, **cp, recompute_modules=m)["cp_link"]
        for m in (["core_attn"], ["layernorm"])
    }
    plain = run("llama3.1-8b", "h100-sxm-80gb", 8, 16, tp=1, pp=1, cp=4, dp=2, micro_batch=1)["cp_link"]
    assert ring[("layernorm",)] == pytest.approx(plain) and ring[("core_attn",)] == pytest.approx(
        plain * 4 / 3
    )
    with pytest.raises(ValueError, match="recompute_modules needs recompute: selective"):
        Execution(tp=1, recompute="full", recompute_modules=["layernorm"])


def test_jax_remat_modules_run_again_only_what_backward_needs():
    """The MLP's input projections (`mlp_up`) are part of the whole MLP (`mlp`): less time run again, the same
    tensors dropped; named together they count once. The output projection (`attn_proj`) adds its GEMM and
    drops the second norm's input. A tensor two modules drop (the MLP input: the norm's and the MLP's) is
    counted once."""
    base = dict(tp=1, pp=1, dp=8, micro_batch=1, recompute="selective")

    def sel(*modules):
        return run("llama3.1-8b", "h100-sxm-80gb", 8, 16, "maxtext", **base, recompute_modules=list(modules))

    mlp, up, both = sel("mlp"), sel("mlp_up"), sel("mlp", "mlp_up")
    assert up["recompute"] < mlp["recompute"] and up["activations"] == pytest.approx(mlp["activations"])
    assert both["recompute"] == pytest.approx(mlp["recompute"]) and both["activations"] == mlp["activations"]
    norm, norm_mlp = sel("layernorm"), sel("layernorm", "mlp")
    # the MLP's own activation tensors come off once, the input it shares with the norm is not dropped twice
    only_act = sel("core_attn")["activations"] - sel("core_attn", "mlp")["activations"]
    assert norm["activations"] - norm_mlp["activations"] < only_act
    proj, attn = sel("core_attn", "attn_proj"), sel("core_attn")
    assert proj["recompute"] > attn["recompute"] and proj["activations"] < attn["activations"]


def test_moe_dispatcher_and_overlap():
    """Across nodes the flex dispatcher sends each token once per remote node (less EP time); inside one node
    it changes nothing. Overlap hides all-to-all under another micro-batch's compute: never more exposed,
    never less than what exceeds the compute, and nothing without expert parallelism."""
    cross = dict(tp=1, pp=8, dp=32, ep=32, micro_batch=1, zero=1)
    plain = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **cross)
    flex = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **cross, moe_dispatcher="flex")
    assert flex["ep_link"] < 0.7 * plain["ep_link"]
    inside = dict(tp=1, pp=8, dp=32, ep=8, micro_batch=1, zero=1)
    assert run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **inside, moe_dispatcher="flex")[
        "ep_link"
    ] == pytest.approx(run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **inside)["ep_link"], rel=1e-12)
    ov = run("deepseek-v3", "h100-sxm-80gb", 256, 1024, **cross, moe_dispatcher="flex", ep_overlap=True)
    assert ov["ep_link"] == pytest.approx(flex["ep_link"], rel=1e-12)
    assert ov["ep_exposed"] < flex["ep_exposed"]
    assert ov["ep_exposed"] >= max(flex["ep_exposed"] - (flex["fw"] + flex["bw"] + flex["recompute"]), 0.0)
    assert ov["step_time"] < flex["step_time"]
    dense = dict(tp=8, pp=1, dp=8, micro_batch=1)
    assert (
        run("llama3.1-70b", "h100-sxm-80gb", 64, 64, **dense, ep_overlap=True)["step_time"]
        == run("llama3.1-70b", "h100-sxm-80gb", 64, 64, **dense)["step_time"]
    )


def test_alltoall_dispatcher_sorts_rows_by_local_expert_and_back():
    """Megatron-Core's plain all-to-all delivers rows grouped by source rank; with several local experts it
    sorts them into expert order after the dispatch and back before the combine (sort_chunks_by_idxs): two
    fused gather passes over the routed rows in forward and their two reverse gathers in backward, which the
    flex dispatchers (DeepEP, HybridEP) and a single local expert do not make; with expert TP the rows are
    sorted after the expert-TP all-gather, etp times as many."""
    from optimizer.model.hardware import Hardware
    from optimizer.model.layer import _elementwise

    base = dict(tp=1, pp=1, dp=64, micro_batch=4, zero=1, recompute="none")
    llm, sysm = library_llm("gpt-oss-120b"), library_system("b200-sxm-180gb")
    t = {
        (ep, d): run("gpt-oss-120b", "b200-sxm-180gb", 64, 1280, **base, ep=ep, moe_dispatcher=d)
        for ep in (8, 64)
        for d in ("alltoall", "flex")
    }
    mo = llm.moe
    T = base["micro_batch"] * llm.seq_len
    n_rows = T * mo.top_k * mo.capacity_factor * llm.hidden
    hw = Hardware(sysm, Training(global_batch=1280, precision="bf16").precision)
    two = float(_elementwise(hw, n_rows, 1.0, 4.0, 2.0))  # two passes reading and writing 16-bit rows
    n_mb = 1280 / 64 / base["micro_batch"]
    for ep in (8, 64):  # 16 and 2 local experts
        assert t[ep, "alltoall"]["fw"] - t[ep, "flex"]["fw"] == pytest.approx(
            n_mb * llm.moe_layer_count * two, rel=1e-6
        )
        assert t[ep, "alltoall"]["bw"] - t[ep, "flex"]["bw"] == pytest.approx(
            n_mb * llm.moe_layer_count * two, rel=1e-6
        )
    # expert TP 2 on 8 expert-parallel ranks: each rank sorts the rows of both expert-TP ranks
    etp = {
        d: run("gpt-oss-120b", "b200-sxm-180gb", 64, 1280, **base, ep=8, etp=2, moe_dispatcher=d)
        for d in ("alltoall", "flex")
    }
    two2 = float(_elementwise(hw, 2 * n_rows, 1.0, 4.0, 2.0))
    assert etp["alltoall"]["fw"] - etp["flex"]["fw"] == pytest.approx(
        n_mb * llm.moe_layer_count * two2, rel=1e-6
    )
    # one expert per rank: nothing to sort
    one = library_llm("mixtral-8x7b")
    r8 = {
        d: run(
            "mixtral-8x7b",
            "h100-sxm-80gb",
            64,
            256,
            tp=1,
            pp=1,
            dp=64,
            ep=8,
            micro_batch=1,
            zero=1,
            moe_dispatcher=d,
        )
        for d in ("alltoall", "flex")
    }
    assert one.moe.experts == 8
    for part in ("fw", "bw"):
        assert r8["alltoall"][part] == pytest.approx(r8["flex"][part], rel=1e-12)


RUNS_2025 = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "public_runs_2025.yaml"


@pytest.mark.skipif(not RUNS_2025.is_file(), reason="calibration data not present")
def test_runs_read_recipe_knobs_from_notes():
    """DeepSeek-V3 records state MLA, the dense layers' ffn, the dispatcher, overlap and recompute modules in
    their notes; Llama 3 70B on GB200 offloads 40 layers' activations: every published run then fits."""
    from optimizer.drivers.validate import score_runs
    from optimizer.io.runs import load_runs, map_run

    runs = {r["id"]: r for r in load_runs(str(RUNS_2025)).data}
    ds = map_run(runs["bridge2604-deepseekv3-b200-mxfp8-256gpu"]).problem
    assert ds.llm.mla is not None and ds.llm.mla.kv_lora_rank == 512 and ds.llm.ffn == 18432
    ex = ds.execution
    assert ex.moe_dispatcher.value == "flex" and ex.ep_overlap
    assert [m.value for m in ex.recompute_modules] == ["mla_up_proj", "mlp"]
    ll = map_run(runs["bridge2604-llama3-70b-gb200-fp8-64gpu"]).problem.execution
    assert ll.activation_offload and ll.activation_offload_layers == 40
    assert score_runs(str(RUNS_2025)).as_dict()["summary"]["n_not_fitting"] == 0


def test_solve_decides_the_moe_dispatcher_and_overlap_when_search_names_them(tmp_path):
    """Fixed alltoall without overlap unless `search` names them; opened, the proven optimum is no slower, and
    when its experts span nodes it uses the node-deduplicated dispatcher (the oracle case
    qwen3-235b-ep-dispatch-overlap-128xh100 checks CP-SAT against enumeration). A stack without them
    refuses."""
    from optimizer.drivers.solve import solve
    from optimizer.errors import ProblemErrors
    from optimizer.io.loader import load_problem

    base = (
        "name: q\nllm: qwen3-235b-a22b\nsystem: h100-sxm-80gb\nnum_gpus: 128\n"
        "training: {global_batch: 512, seq_len: 4096, precision: bf16}\n"
    )
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(base + "search: {vpp: 1, micro_batch: {max: 2}}\n")
    opened = tmp_path / "open.yaml"
    opened.write_text(
        base + "search: {vpp: 1, micro_batch: {max: 2}, moe_dispatcher: [alltoall, flex], "
        "ep_overlap: [false, true]}\n"
    )
    a, b = solve(load_problem(fixed), "cpsat"), solve(load_problem(opened), "cpsat")
    assert a.status == b.status == "optimal"
    ea, eb = a.plans[0].evaluation.execution, b.plans[0].evaluation.execution
    assert ea.moe_dispatcher.value == "alltoall" and not ea.ep_overlap
    # opened, the optimum is strictly faster, so it uses what was opened; across nodes, the flex dispatcher
    assert b.plans[0].objective_s < a.plans[0].objective_s
    assert eb.moe_dispatcher.value == "flex" or eb.ep_overlap
    if eb.ep > 8:  # experts over several 8-GPU nodes
        assert eb.moe_dispatcher.value == "flex"
    tt = tmp_path / "tt.yaml"
    tt.write_text(base + "stack: torchtitan\nsearch: {moe_dispatcher: flex}\n")
    with pytest.raises(ProblemErrors, match="moe_dispatcher"):
        load_problem(tt)
