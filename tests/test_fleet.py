"""`paraplan fleet`: the portfolio MILP against brute force on tiny instances (throughput tables
given by hand, so the check is independent of the planner), the infeasibility explanation, input errors with
file:line:field, and the shipped example solved to proven optimality."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from formulations.fleet import Rate
from optimizer.drivers.fleet import fleet
from optimizer.errors import ProblemError, ProblemErrors
from optimizer.io.loader import load_fleet

ROOT = Path(__file__).resolve().parent.parent

TINY = """
name: tiny-fleet
catalog:
  name: c
  node_types:
    - {name: a, system: a100-sxm-80gb, price_usd: 100, extra_usd: 0, power_kw: 5, max_nodes: 3}
    - {name: b, system: h100-sxm-80gb, price_usd: 170, extra_usd: 0, power_kw: 8}
jobs:
  - {name: j1, llm: llama3.1-8b, training: {global_batch: 8, tokens: 10}, deadline_period: 2, weight: 2}
  - {name: j2, llm: llama3.1-8b, training: {global_batch: 8, tokens: 12}, weight: 1}
fleet: {goal: GOAL, periods: 3, period_days: 1, budget_usd: BUDGET, power_kw: 30, sizes_nodes: [1, 2]}
"""

# tokens per period, by hand: (job, type, nodes) -> tokens
TOK = {
    ("j1", "a", 1): 3,
    ("j1", "a", 2): 5,
    ("j1", "b", 1): 6,
    ("j1", "b", 2): 10,
    ("j2", "a", 1): 4,
    ("j2", "a", 2): 7,
    ("j2", "b", 1): 5,
    ("j2", "b", 2): 9,
}
PRICE, POWER, AVAIL = {"a": 100, "b": 170}, {"a": 5, "b": 8}, {"a": 3, "b": None}


def rates():
    return [Rate(j, t, s, 8 * s, 1.0, tok, tok, "optimal") for (j, t, s), tok in TOK.items()]


def load(tmp_path, goal="cost", budget="null"):
    p = tmp_path / "tiny-fleet.yaml"
    p.write_text(TINY.replace("GOAL", goal).replace("BUDGET", str(budget)))
    return load_fleet(p)


def brute(goal: str, budget: float | None, deadline=None):
    """Every schedule (per job and period: idle or one (type, size)); the cheapest purchase of a schedule
    owns, per type, the running maximum of the nodes in use (nodes are kept once bought)."""
    deadline = deadline or {"j1": 2, "j2": 3}
    opts = [None] + [(t, s) for t in "ab" for s in (1, 2)]
    best = None
    for sched in itertools.product(opts, repeat=6):  # (j1 p1..p3, j2 p1..p3)
        use = {(t, q): 0 for t in "ab" for q in range(3)}
        done = {"j1": 0, "j2": 0}
        for k, o in enumerate(sched):
            if o is None:
                continue
            j, q = ("j1", "j2")[k // 3], k % 3
            use[o[0], q] += o[1]
            if q + 1 <= deadline[j]:
                done[j] += TOK[j, o[0], o[1]]
        owned = {(t, q): max(use[t, k] for k in range(q + 1)) for t in "ab" for q in range(3)}
        if any(AVAIL[t] is not None and owned[t, q] > AVAIL[t] for t in "ab" for q in range(3)):
            continue
        if any(sum(POWER[t] * owned[t, q] for t in "ab") > 30 for q in range(3)):
            continue
        cost = sum(PRICE[t] * owned[t, 2] for t in "ab")
        if budget is not None and cost > budget:
            continue
        if goal == "cost":
            if done["j1"] >= 10 and done["j2"] >= 12:
                best = cost if best is None else min(best, cost)
        else:
            val = 2 * min(done["j1"], 10) + min(done["j2"], 12)
            best = val if best is None else max(best, val)
    return best


def test_cost_goal_matches_brute_force(tmp_path):
    fp = load(tmp_path)
    r = fleet(fp, rates=rates())
    assert r.status == "optimal"
    assert r.cost_usd == pytest.approx(brute("cost", None))
    assert r.trained["j1"] >= 10 and r.trained["j2"] >= 12
    # the reported schedule is realisable with the reported purchase
    for t in "ab":
        for q in range(1, 4):
            used = sum(s["nodes"] for s in r.schedule if s["node_type"] == t and s["period"] == q)
            assert used <= sum(r.buy[t][:q])


@pytest.mark.parametrize("budget", [170, 270, 400])
def test_tokens_goal_matches_brute_force(tmp_path, budget):
    fp = load(tmp_path, "tokens", budget)
    r = fleet(fp, rates=rates())
    assert r.status == "optimal" and r.cost_usd <= budget
    got = 2 * min(r.trained["j1"], 10) + min(r.trained["j2"], 12)
    assert got == pytest.approx(brute("tokens", budget))


def test_infeasible_budget_says_how_much_more(tmp_path):
    need = brute("cost", None)
    fp = load(tmp_path, "cost", need - 1)
    r = fleet(fp, rates=rates())
    assert r.status == "infeasible"
    assert f"${need:,.0f}" in r.explanation[0] and "$1 more" in r.explanation[0]


def test_infeasible_deadline_names_the_job(tmp_path):
    fp = load(tmp_path)
    rs = [x for x in rates() if x.job == "j2" or x.nodes == 1]  # j1 only at 1 node: 6 per period at best
    fp2 = fp.model_copy(
        update={
            "jobs": [
                fp.jobs[0].model_copy(
                    update={"training": fp.jobs[0].training.model_copy(update={"tokens": 16.0})}
                ),
                fp.jobs[1],
            ]
        }
    )
    r = fleet(fp2, rates=rs)
    assert r.status == "infeasible"
    msg = " ".join(r.explanation)
    assert "deadline of j1 (period 2) binds" in msg and "j2" not in msg  # j2 meets its deadline
    assert "period 3 would do" in msg  # 3 x 6 >= 16


def test_bad_fleet_file_names_file_line_field(tmp_path):
    p = tmp_path / "bad-fleet.yaml"
    p.write_text(TINY.replace("GOAL", "cost").replace("BUDGET", "null").replace("periods: 3", "periods: 0"))
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        load_fleet(p)
    s = str(e.value)
    assert "bad-fleet.yaml:11" in s and "fleet.periods" in s
    out = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", "fleet", str(p)], capture_output=True, text=True
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr and "fleet.periods" in out.stderr
    p.write_text(
        TINY.replace("GOAL", "cost").replace("BUDGET", "null").replace("weight: 1}", "weight: 1, wieght: 2}")
    )
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        load_fleet(p)
    assert "jobs.1.wieght" in str(e.value) and ":10" in str(e.value)


@pytest.mark.slow
def test_shipped_example_is_optimal():
    f = ROOT / "problems" / "fleet" / "three-jobs-fleet.yaml"
    out = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", "fleet", str(f), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    d = json.loads(out.stdout)
    assert d["status"] == "optimal"
    fp = load_fleet(f)
    for j in fp.jobs:
        assert d["trained_tokens"][j.name] >= j.training.tokens
