"""Batch-size schedules (`training.phases`, `optimizer.drivers.phases`): the schema's rules, one proven plan
per phase, the sums of time and cost with re-layouts, and bad input at its line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from optimizer import api
from optimizer.drivers import phases as P

BASE = """name: ramp
llm: llama3.1-8b
system: h100-sxm-80gb
num_gpus: 64
training:
  global_batch: 128
  precision: bf16
{training}
search: {{tp: [1, 2], pp: [1, 2], cp: 1}}
{extra}
"""


def _write(tmp_path, training: str, extra: str = ""):
    p = tmp_path / "ramp.yaml"
    p.write_text(BASE.format(training=training, extra=extra))
    return p


TWO = """  phases:
    - {tokens: 1.0e+10, global_batch: 64, seq_len: 4096}
    - {tokens: 3.0e+10, global_batch: 256, seq_len: 8192}"""


def test_tokens_default_to_the_phases_sum(tmp_path):
    p = api.load(_write(tmp_path, TWO))
    assert p.training.tokens == pytest.approx(4.0e10)
    trs = p.training.phase_trainings()
    assert [(t.global_batch, t.seq_len, t.tokens) for t in trs] == [(64, 4096, 1.0e10), (256, 8192, 3.0e10)]
    assert all(t.phases is None for t in trs)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "optimizer.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "training, extra, says",
    [
        (TWO + "\n  tokens: 5.0e+10", "", "sum to 4e+10"),
        ("  phases: []", "", "give 1 to 16 phases"),
        (TWO, "objective: {max_days: 30}", "per batch"),
        (TWO, "objective: {goal: tokens_per_gpu}", "step_time or expected_time"),
        ("  phases:\n    - {tokens: -1.0, global_batch: 64}", "", "phases.0.tokens: must be > 0"),
    ],
)
def test_bad_phases_are_located(tmp_path, training, extra, says):
    """Each bad schedule: exit 2, one line naming the file and a line number, no traceback."""
    path = _write(tmp_path, training, extra)
    r = _cli("solve", str(path))
    assert r.returncode == 2, r.stderr
    assert f"{path}:" in r.stderr and says in r.stderr and "Traceback" not in r.stderr


def test_solve_plans_each_phase_and_sums(tmp_path):
    """A plan per phase, each the proven optimum of its own batch (the same as solving that phase alone);
    expected time = the phases' expected times + the re-layouts, which cost restart + write + reload when the
    plans differ; failure-free time, energy and cost sum."""
    problem = api.load(_write(tmp_path, TWO))
    r = api.solve(problem)
    assert len(r.plans) == 2 and r.phased is not None
    alone = [api.solve(q).plans[0].evaluation for q in P.phase_problems(problem)]
    for p, a in zip(r.plans, alone, strict=True):
        assert p.evaluation.result["step_time"] == pytest.approx(a.result["step_time"], rel=1e-9)
        assert p.evaluation.problem.training.global_batch == a.problem.training.global_batch
    gs = [p.evaluation.goodput for p in r.plans]
    t = r.phased
    move = P.relayout_s(problem, r.plans[0].evaluation, r.plans[1].evaluation)
    assert t.relayout_s == pytest.approx(move)
    assert t.relayouts == (1 if move > 0 else 0)
    assert t.expected_time_to_train_s == pytest.approx(sum(g.expected_time_to_train_s for g in gs) + move)
    assert t.failure_free_time_s == pytest.approx(sum(g.failure_free_time_s for g in gs))
    # the re-layout's energy: every node (8 of 64 GPUs) waits at its idle draw (0.25 x its rating) x PUE 1.1
    rated = problem.system.node_power_w  # the DGX H100 rating, 10.2 kW
    move_kwh = 8 * 0.25 * rated * move * 1.10 / 3.6e6
    assert t.energy_kwh == pytest.approx(sum(g.energy_kwh for g in gs) + move_kwh)
    assert t.expected_cost_usd == pytest.approx(sum(g.expected_cost_usd for g in gs) + move_kwh * 0.0835)
    assert t.p10_time_to_train_s <= t.expected_time_to_train_s <= t.p90_time_to_train_s


def test_the_same_plan_twice_needs_no_relayout(tmp_path):
    """Two phases of the same batch: the same plan, no re-layout; totals are twice one phase's."""
    same = """  phases:
    - {tokens: 1.0e+10, global_batch: 128}
    - {tokens: 1.0e+10, global_batch: 128}"""
    r = api.solve(api.load(_write(tmp_path, same)))
    a, b = (p.evaluation for p in r.plans)
    assert a.execution == b.execution
    assert r.phased.relayouts == 0 and r.phased.relayout_s == 0
    assert r.phased.expected_time_to_train_s == pytest.approx(2 * a.goodput.expected_time_to_train_s)


def test_relayout_costs_a_restart_a_write_and_a_reload(tmp_path):
    """Different plans: restart_s + the old layout's checkpoint write + the new layout's reload (from the
    goodput defaults)."""
    from optimizer.model import goodput as G
    from optimizer.prepare.objective import gpus_used

    problem = api.load(_write(tmp_path, TWO))
    r = api.solve(problem)
    a, b = (p.evaluation for p in r.plans)
    if a.execution == b.execution:
        pytest.skip("both phases chose one plan")
    inp, c = G.problem_inputs(problem), G.checkpoint_bytes(problem.llm, "bf16", True)
    write = G.checkpoint_cost(inp, c, gpus_used(a.execution), 8).write_s
    reload = G.checkpoint_cost(inp, c, gpus_used(b.execution), 8).reload_s
    want = G.default_reliability().restart_s + float(write) + float(reload)
    assert P.relayout_s(problem, a, b) == pytest.approx(want)


def test_json_names_the_phases(tmp_path):
    r = _cli("solve", str(_write(tmp_path, TWO)), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["plans"]) == 2
    ph = d["phases"]
    assert [x["global_batch"] for x in ph["per_phase"]] == [64, 256]
    assert ph["expected_time_to_train_s"] >= sum(p["goodput"]["expected_time_to_train_s"] for p in d["plans"])


@pytest.mark.parametrize("command", ["check", "whatif"])
def test_one_batch_commands_refuse_a_schedule_at_its_line(tmp_path, command):
    path = _write(tmp_path, TWO)
    r = _cli(command, str(path))
    assert r.returncode == 2 and f"{path}:8: training.phases:" in r.stderr, r.stderr


def test_procure_and_fleet_refuse_a_schedule(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(
        "llm: llama3.1-8b\ncatalog: gpus-2025\ntraining:\n  global_batch: 64\n  phases:\n"
        "    - {tokens: 1.0e+9, global_batch: 64}\nprocure: {budget_usd: 1.0e+7}\n"
    )
    r = _cli("procure", str(p))
    assert r.returncode == 2 and "procure plans one batch" in r.stderr, r.stderr
