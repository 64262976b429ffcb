"""Heterogeneous pipelines (`optimizer.model.pipeline_mix`, `optimizer.drivers.pipeline_mix`): one type split
in two groups is the homogeneous model; CP-SAT equals the exhaustive oracle on small instances; the shipped
examples win and lose with their reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.drivers.evaluate import evaluate_execution
from optimizer.drivers.pipeline_mix import TypeOffer, enumerate_pipeline_mix, solve_pipeline_mix
from optimizer.drivers.procure import procure
from optimizer.io.loader import load_problem, load_procure
from optimizer.model.pipeline_mix import MixPlan, StageGroup, evaluate_mix
from optimizer.report.procure import render
from optimizer.schema import Execution, Recompute

ROOT = Path(__file__).resolve().parents[1]


def _problem(tmp_path, system: str, llm: str, B: int, gpus: int, name: str = "q"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"llm: {llm}\nsystem: {system}\nnum_gpus: {gpus}\ntraining: {{global_batch: {B}}}\n"
        "options: {memory_headroom_gib: 0, allow_idle_gpus: true}\n"
    )
    return load_problem(path)


@pytest.mark.parametrize(
    "tp,d,mb,s0,s1,rec,mtp",
    [
        (8, 4, 1, 4, 4, "selective", 0),
        (4, 2, 2, 2, 6, "full", 0),
        (8, 1, 1, 6, 2, "none", 0),
        (2, 8, 1, 3, 1, "none", 0),
        (8, 4, 1, 4, 4, "selective", 1),  # an MTP module on the last stage
    ],
)
def test_one_type_in_two_groups_is_the_homogeneous_model(tmp_path, tp, d, mb, s0, s1, rec, mtp):
    llm = "{base: gpt3-175b, mtp_layers: 1}" if mtp else "gpt3-175b"
    p = _problem(tmp_path, "h100-sxm-80gb", llm, 256, 256)
    L = 96 // (s0 + s1)
    plan = MixPlan(
        (StageGroup("a", tp, s0, L, Recompute(rec)), StageGroup("b", tp, s1, L, Recompute(rec))), d, mb
    )
    r = evaluate_mix({"a": p, "b": p}, plan)
    ex = Execution(
        tp=tp,
        pp=s0 + s1,
        dp=d,
        micro_batch=mb,
        recompute=Recompute(rec),
        sequence_parallel=tp > 1,
        pp_rs_ag=False,
        zero=1,
        dp_overlap=True,
        pp_embedding_loss=False,
    )
    h = evaluate_execution(p.model_copy(update={"num_gpus": tp * (s0 + s1) * d}), ex).result
    assert r.step_time_s == pytest.approx(h["step_time"], rel=1e-12)
    # per stage memory: at most the homogeneous model's max-of-parts, and within 0.1% of it (with MTP the
    # max-of-parts charges the last stage's MTP weights beside the first stage's activations)
    assert max(r.hbm_bytes) <= h["hbm"] * (1 + 1e-12)
    assert mtp or max(r.hbm_bytes) >= h["hbm"] * 0.999


def test_uneven_split_moves_layers_to_the_faster_type(tmp_path):
    """More layers on a faster type shorten its stage: the step time follows the slowest stage."""
    a = _problem(tmp_path, "a100-sxm-80gb", "gpt3-175b", 64, 64, "a")
    h = _problem(tmp_path, "h100-sxm-80gb", "gpt3-175b", 64, 64, "h")
    probs = {"a100": a, "h100": h}
    even = evaluate_mix(probs, MixPlan((StageGroup("a100", 8, 4, 12), StageGroup("h100", 8, 4, 12)), 1, 1))
    skew = evaluate_mix(probs, MixPlan((StageGroup("a100", 8, 4, 8), StageGroup("h100", 8, 4, 16)), 1, 1))
    assert even.stage_time_s[0] > even.stage_time_s[1]  # A100 stages are the slow ones
    assert skew.step_time_s < even.step_time_s


def _offers(tmp_path, specs, layers=8, B=16, llm="narayanan2021-1.7b"):
    out = []
    for i, (name, system, nodes, usd, kw) in enumerate(specs):
        p = _problem(tmp_path, system, f"{{base: {llm}, layers: {layers}}}", B, nodes * 4, f"o{i}")
        out.append(TypeOffer(name, p, nodes, usd, kw))
    return out


SMALL = {
    "memory-bound": (
        [
            ("a100", "{base: a100-sxm-40gb, gpus_per_node: 4, hbm_gib: 4}", 1, 1e4, 3.0),
            ("h100", "{base: h100-sxm-80gb, gpus_per_node: 4, hbm_gib: 6}", 1, 2.5e4, 5.0),
        ],
        {},
        8,
        2,
    ),
    "budget-binds": (
        [
            ("a100", "{base: a100-sxm-40gb, gpus_per_node: 4}", 2, 1e4, 3.0),
            ("h100", "{base: h100-sxm-80gb, gpus_per_node: 4}", 2, 2.5e4, 5.0),
        ],
        {"budget_usd": 4.0e4},
        8,
        2,
    ),
    "power-binds": (
        [
            ("a100", "{base: a100-sxm-40gb, gpus_per_node: 4, hbm_gib: 8}", 2, 1e4, 3.0),
            ("h100", "{base: h100-sxm-80gb, gpus_per_node: 4, hbm_gib: 8}", 2, 2.5e4, 5.0),
        ],
        {"power_kw": 9.0},
        8,
        2,
    ),
    "three-types-two-groups": (
        [
            ("h200", "{base: h200-sxm-141gb, gpus_per_node: 4, hbm_gib: 5}", 1, 5e3, 2.0),
            ("a100", "{base: a100-sxm-40gb, gpus_per_node: 4, hbm_gib: 5}", 1, 1e4, 3.0),
            ("h100", "{base: h100-sxm-80gb, gpus_per_node: 4, hbm_gib: 5}", 1, 2.5e4, 5.0),
        ],
        {},
        8,
        2,
    ),
    "three-groups": (
        [
            ("h200", "{base: h200-sxm-141gb, gpus_per_node: 2, hbm_gib: 5}", 1, 5e3, 2.0),
            ("a100", "{base: a100-sxm-40gb, gpus_per_node: 2, hbm_gib: 5}", 1, 1e4, 3.0),
            ("h100", "{base: h100-sxm-80gb, gpus_per_node: 2, hbm_gib: 5}", 1, 2.5e4, 5.0),
        ],
        {},
        6,
        3,
    ),
}


@pytest.mark.parametrize("case", sorted(SMALL))
def test_cpsat_equals_exhaustive_enumeration(tmp_path, case):
    specs, limits, layers, G = SMALL[case]
    offers = _offers(tmp_path, specs, layers=layers)
    sol = solve_pipeline_mix(offers, G, **limits)
    ref = enumerate_pipeline_mix(offers, G, **limits)
    assert (sol is None) == (ref is None)
    assert ref is not None, case  # every instance has a feasible mix
    assert sol.status == "optimal"
    assert sol.result.step_time_s == pytest.approx(ref.result.step_time_s, rel=1e-6), (sol.plan, ref.plan)
    assert sol.result.fits and len(sol.plan.groups) == G
    assert sum(g.stages * g.layers for g in sol.plan.groups) == layers
    if "budget_usd" in limits:
        assert sol.cost_usd <= limits["budget_usd"]
    if "power_kw" in limits:
        assert sol.power_kw <= limits["power_kw"]
    assert len({g.node_type for g in sol.plan.groups}) == G


def test_memory_bound_mix_beats_each_type_alone(tmp_path):
    """In the memory-bound instance the A100 node alone holds nothing and the H100 node alone is slower than
    the pipeline over both (the homogeneous solves of each type on its own nodes)."""
    from optimizer.drivers.solve import solve
    from optimizer.errors import Infeasible

    specs, _, layers, _ = SMALL["memory-bound"]
    offers = _offers(tmp_path, specs, layers=layers)
    mix = solve_pipeline_mix(offers)
    alone = []
    for o in offers:
        try:
            alone.append(solve(o.problem).plans[0].evaluation.result["step_time"])
        except Infeasible:
            alone.append(None)
    assert alone[0] is None and alone[1] > mix.result.step_time_s


@pytest.mark.slow
def test_shipped_example_wins_with_reason():
    r = procure(load_procure(ROOT / "problems/studies/procure/llama70b-pipeline-mix-wins.yaml"))
    assert all(x.purchase is None for x in r.rows)  # no single type fits
    assert r.pipeline is not None and r.best is r.pipeline.purchase and r.status == "optimal"
    assert r.pipeline.solution.result.fits and len(r.pipeline.solution.plan.groups) == 2
    text = render(r)
    assert "no single node type trains the model" in text and "memory:" in text
    from optimizer.report.procure import result_dict

    d = result_dict(r)["pipeline"]
    assert d["status"] == "optimal" and len(d["groups"]) == 2
    assert sum(g["stages"] * g["layers_per_stage"] for g in d["groups"]) == 80
    assert all(g["hbm_gib"] <= g["capacity_gib"] and g["reason"] for g in d["groups"])


@pytest.mark.slow
def test_shipped_example_loses_with_reason():
    r = procure(load_procure(ROOT / "problems/studies/procure/llama70b-pipeline-mix-loses.yaml"))
    assert r.pipeline is not None and r.best is not r.pipeline.purchase
    assert r.best.step_time_s < r.pipeline.purchase.step_time_s
    assert r.pipeline.purchase.cost_usd <= 1.2e6
    assert r.pipeline.verdict.startswith("loses to the best single-type purchase")


def test_units_are_bought_whole_in_a_pipelined_mix(tmp_path):
    """A type sold in units (racks) of 2 nodes: the mix buys whole units, and the CP-SAT answer still equals
    the exhaustive oracle's."""
    from dataclasses import replace

    specs, limits, layers, G = SMALL["budget-binds"]
    offers = [
        replace(o, unit_nodes=2) if o.name == "h100" else o for o in _offers(tmp_path, specs, layers=layers)
    ]
    sol = solve_pipeline_mix(offers, G, budget_usd=6.0e4)
    ref = enumerate_pipeline_mix(offers, G, budget_usd=6.0e4)
    assert sol is not None and ref is not None
    assert sol.result.step_time_s == pytest.approx(ref.result.step_time_s, rel=1e-6)
    assert sol.nodes.get("h100", 0) % 2 == 0
    assert sol.cost_usd == sum(n * {"a100": 1e4, "h100": 2.5e4}[t] for t, n in sol.nodes.items()) <= 6.0e4
