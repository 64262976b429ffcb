"""DeepSeek-V3 pre-training as published (arXiv:2412.19437, the problem
`problems/studies/solve/deepseek-v3-2048xh800.yaml`): its own layout fits the 80 GB H800 and trains in the
published time; `solve` finds a plan no slower."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import api

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "problems" / "studies" / "solve" / "deepseek-v3-2048xh800.yaml"
PUBLISHED_DAYS = 2.664e6 / 2048 / 24  # Table 1: 2.664M H800 GPU-hours of pre-training, on 2048 GPUs


def test_the_published_layout_fits_and_trains_in_the_published_time():
    """PP 16, EP 64, ZeRO-1, no TP, the node-deduplicated dispatch overlapped with compute: it fits in 80 GB
    (the probabilities in the experts' activation keep no expert outputs for the combine) and its time to
    train 14.8T tokens, failure-free, is within 10% of 54.2 days."""
    ev = api.evaluate(api.load(PROBLEM))
    d = api.as_dict(ev)
    assert d["fits"]
    days = d["time_to_train_s"] / 86400
    assert abs(days / PUBLISHED_DAYS - 1) <= 0.10, days


@pytest.mark.slow
def test_solve_finds_a_plan_no_slower_and_names_its_moe_and_pipeline_choices():
    """With the dispatcher, the overlap and uneven splits open, the proven-fastest plan is no slower than the
    published layout. It pipelines (on 2048 GPUs only an uneven split pipelines 61 layers), dispatches once
    per node and overlaps the all-to-all, as the published run does; the JSON names those choices."""
    p = api.load(PROBLEM)
    published = api.evaluate(p).result["step_time"]
    # a proof, not a timing (bench_solve.py times this space: 1.8 s): the 60 s default ran out filling the
    # tables on a 2-core machine under four concurrent jobs
    sol = api.solve(p, time_limit_s=600.0)
    assert sol.status == "optimal"
    assert sol.plans[0].evaluation.result["step_time"] <= published
    plan = api.as_dict(sol, p)["plans"][0]
    ex = plan.get("execution", plan)
    assert ex["pp"] > 1 and ex["pp_uneven"]
    assert (ex["moe_dispatcher"], ex["ep_overlap"], ex["cp_comm"], ex["schedule"]) == (
        "flex",
        True,
        "p2p",
        "1f1b",
    )
