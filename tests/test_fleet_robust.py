"""`paraplan fleet` on awkward inputs: node type and job names that Pyomo quotes, jobs that fit nowhere, an
unvalidated `search`, a time limit before any incumbent, and long horizons. Throughput tables are given by
hand (`formulations.fleet.Rate`) so that each check stays cheap and independent of the planner."""

from __future__ import annotations

import pytest

from formulations.fleet import Rate
from optimizer.drivers.fleet import fleet, sub_problem
from optimizer.errors import ProblemError, ProblemErrors, TimeLimit
from optimizer.io.loader import load_fleet

NAMES = """
name: fleet-names
catalog:
  name: c
  node_types:
    - {name: "TYPE", system: h100-sxm-80gb, price_usd: 280000, extra_usd: 35000, power_kw: 10.2}
jobs:
  - name: "JOB"
    llm: llama3.1-8b
    training: {global_batch: 64, precision: bf16, tokens: 1.0e+11}
fleet:
  goal: GOAL
  periods: 2
  period_days: 30
  budget_usd: 1.0e+6
  sizes_nodes: [1, 2]
"""


def write(tmp_path, text: str, name: str = "fleet.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return load_fleet(p)


@pytest.mark.parametrize("type_name", ["h100,80g", "h100's", "h100 80g", "h100-80g"])
@pytest.mark.parametrize("goal", ["cost", "tokens"])
def test_results_are_read_by_variable_not_by_name(tmp_path, type_name, goal):
    job = f"small,{type_name}"
    fp = write(
        tmp_path,
        NAMES.replace("TYPE", type_name).replace("JOB", job).replace("GOAL", goal),
    )
    rates = [Rate(job, type_name, 1, 8, 6.0, 1e5, 2.2e11, "optimal")]
    r = fleet(fp, rates=rates)
    assert r.status == "optimal"
    assert list(r.buy) == [type_name] and r.buy[type_name][0] == 1  # tokens: a spare node may come
    if goal == "cost":
        assert r.buy[type_name] == [1, 0] and r.cost_usd == 315000
    assert r.schedule and {(s["job"], s["node_type"]) for s in r.schedule} == {(job, type_name)}
    assert r.trained[job] >= 1e11


NOFIT = """
name: fleet-nofit
catalog:
  name: c
  node_types:
    - {name: a100-40g, system: a100-sxm-40gb, price_usd: 150000, power_kw: 6.5, max_nodes: 1}
TYPES
jobs:
  - name: big
    llm: llama3.1-8b
    training: {global_batch: 64, precision: bf16, tokens: 1.0e+11}
SEARCH
  - name: other
    llm: llama3.1-8b
    training: {global_batch: 64, precision: bf16, tokens: 1.0e+11}
fleet:
  goal: GOAL
  periods: 2
  period_days: 30
  budget_usd: 1.0e+6
  sizes_nodes: [1]
"""


def nofit(tmp_path, goal="cost", types="", search=""):
    return write(tmp_path, NOFIT.replace("TYPES", types).replace("SEARCH", search).replace("GOAL", goal))


def test_job_that_fits_nowhere_is_infeasible_not_a_crash(tmp_path):
    fp = nofit(tmp_path)
    rates = [Rate("other", "a100-40g", 1, 8, 6.0, 1e5, 2.2e11, "optimal")]  # no row for job big
    r = fleet(fp, rates=rates)
    assert r.status == "infeasible"
    assert r.explanation == [
        "job big fits on no node type (a100-40g) at any size of sizes_nodes [1]: it cannot train any tokens"
    ]
    r = fleet(fp, rates=[])  # no job fits: both named
    assert r.status == "infeasible" and len(r.explanation) == 2


def test_job_that_fits_nowhere_trains_nothing_under_goal_tokens(tmp_path):
    fp = nofit(tmp_path, goal="tokens")
    r = fleet(fp, rates=[Rate("other", "a100-40g", 1, 8, 6.0, 1e5, 2.2e11, "optimal")])
    assert r.status == "optimal" and r.trained["big"] == 0.0 and r.trained["other"] >= 1e11


def test_empty_types_is_bad_input(tmp_path):
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        nofit(tmp_path, types="types: []")
    assert "fleet.yaml:7" in str(e.value) and "types" in str(e.value)


@pytest.mark.parametrize(
    "search, field",
    [("{tp: x}", "jobs.0.search.tp"), ("{nonsense: 1}", "jobs.0.search.nonsense")],
)
def test_job_search_is_validated_at_load(tmp_path, search, field):
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        nofit(tmp_path, search=f"    search: {search}")
    assert "fleet.yaml:12" in str(e.value) and field in str(e.value)


def test_job_search_reaches_the_planner(tmp_path):
    fp = nofit(tmp_path, search="    search: {tp: [2, 4], pp: 1}")
    assert fp.jobs[0].search.tp == [2, 4]
    p = sub_problem(fp, fp.jobs[0], fp.node_types[0], 1)
    assert p.user_search_rules()["tp"] == [2, 4]


def terms(fp, rates) -> int:
    """The variable occurrences over all rows of the portfolio MILP (its nonzeros, up to repeats)."""
    import pyomo.environ as pyo
    from pyomo.core.expr.visitor import identify_variables

    from formulations.fleet import build_portfolio

    m, _, _ = build_portfolio(fp, rates)
    rows = m.component_data_objects(pyo.Constraint, active=True)
    return sum(len(list(identify_variables(c.body, include_fixed=False))) for c in rows)


def test_model_grows_linearly_with_the_periods(tmp_path):
    rates = [Rate("j", "t", s, 8 * s, 6.0 / s, 1e5 * s, 2.2e11 * s, "optimal") for s in (1, 2)]
    sizes = {}
    for P in (100, 400):
        fp = write(
            tmp_path,
            NAMES.replace("TYPE", "t")
            .replace("JOB", "j")
            .replace("GOAL", "cost")
            .replace("periods: 2", f"periods: {P}"),
        )
        sizes[P] = terms(fp, rates)
    assert sizes[400] < 4.5 * sizes[100]  # a sum over earlier periods per period would grow 16-fold


def test_long_horizon_buys_once(tmp_path):
    text = (
        NAMES.replace("TYPE", "t")
        .replace("JOB", "j")
        .replace("GOAL", "cost")
        .replace("periods: 2", "periods: 60")
    )
    fp = write(tmp_path, text.replace("  budget_usd: 1.0e+6\n", "  power_kw: 25\n"))
    rates = [Rate("j", "t", s, 8 * s, 6.0 / s, 1e5 * s, 6e10 * s, "optimal") for s in (1, 2)]
    r = fleet(fp, rates=rates)
    assert r.status == "optimal" and r.cost_usd == 315000 and sum(r.buy["t"]) == 1
    assert r.trained["j"] >= 1e11 and len(r.schedule) == 2  # two periods on one node: fewest node-periods


def stopped(monkeypatch, status: str, on_call: int = 0):
    """HiGHS runs of the portfolio from call `on_call` on (0-based) stop with `status`, no incumbent."""
    import formulations.pyomo_model as pm

    real, calls = pm.run_highs, []

    def run(m, time_limit_s):
        calls.append(time_limit_s)
        if len(calls) > on_call:
            return {
                "status": status,
                "objective": None,
                "bound": None,
                "values": {},
                "by_name": {},
                "by_var": {},
            }
        return real(m, time_limit_s)

    monkeypatch.setattr(pm, "run_highs", run)
    return calls


def test_time_limit_without_incumbent_is_not_infeasible(tmp_path, monkeypatch):
    fp = nofit(tmp_path)
    rates = [Rate(j, "a100-40g", 1, 8, 6.0, 1e5, 2.2e11, "optimal") for j in ("big", "other")]
    stopped(monkeypatch, "Time limit reached")
    with pytest.raises(TimeLimit) as e:
        fleet(fp, time_limit_s=0.05, rates=rates)
    assert e.value.exit_code == 4
    assert (
        "within 0.05 s" in str(e.value)
        and "not a proof" in str(e.value)
        and "2 (job, type, size)" in str(e.value)
    )


def test_explanation_does_not_claim_what_a_time_limit_left_open(tmp_path, monkeypatch):
    fp = nofit(tmp_path)  # two jobs of two periods each on one node (max_nodes 1) in two: proven infeasible
    rates = [Rate(j, "a100-40g", 1, 8, 6.0, 1e5, 6e10, "optimal") for j in ("big", "other")]
    calls = stopped(monkeypatch, "Time limit reached", on_call=1)  # the explanation's solves stop
    r = fleet(fp, rates=rates)
    assert r.status == "infeasible" and len(calls) == 2
    assert r.explanation and "passed the time limit" in r.explanation[0]
    assert not any("no allocation" in e for e in r.explanation)


DEADLINE = """
name: deadline
catalog:
  name: c
  node_types:
    - {name: h100-80g, system: h100-sxm-80gb, price_usd: 280000, extra_usd: 35000, power_kw: 10.2}
jobs:
  - name: j
    llm: llama3.1-8b
    training: {global_batch: 64, precision: bf16, tokens: 1.0e+12}
    deadline_period: 1
fleet: {goal: cost, periods: 1, period_days: 30, sizes_nodes: [1]}
"""


@pytest.mark.parametrize("status", ["optimal", "feasible"])
def test_infeasible_on_rates_the_time_limit_cut_short_is_not_a_proof(tmp_path, status):
    """A portfolio infeasible on a throughput the solve proved fastest is proven infeasible (exit 3); on one
    a time limit left short of its optimum (CP-SAT status feasible) it is TimeLimit (exit 4) naming the
    plan, since the fastest plan might meet the deadline (found by the fuzzer: 'fleet --time-limit 0.4' on a
    405B job exited 3, and 0.7 s gave a plan)."""
    fp = write(tmp_path, DEADLINE)
    rates = [Rate("j", "h100-80g", 1, 8, 6.0, 1e5, 2.6e11, status)]  # 2.6e11 of the 1e12 tokens per period
    if status == "optimal":
        assert fleet(fp, rates=rates).status == "infeasible"
    else:
        with pytest.raises(TimeLimit, match=r"1 of the 1 \(job, type, size\) plans were not proven"):
            fleet(fp, rates=rates)


def test_the_time_limit_bounds_the_whole_throughput_table(tmp_path, monkeypatch):
    """Each (job, type, size) solve gets what is left of the fleet's time limit, not the whole limit again:
    once it is spent the table stops with TimeLimit (exit 4) saying how far it got."""
    import time

    import optimizer.drivers.solve as drivers_solve
    from optimizer.drivers.fleet import throughput_table

    fp = write(tmp_path, DEADLINE)
    limits = []
    real = drivers_solve.solve

    def spy(problem, method, time_limit_s, **kw):
        limits.append(time_limit_s)
        return real(problem, method, time_limit_s=time_limit_s, **kw)

    monkeypatch.setattr(drivers_solve, "solve", spy)
    t0 = time.perf_counter() - 20.0  # 20 s of a 60 s limit already spent
    assert len(throughput_table(fp, 60.0, t0)) == 1 and 0 < limits[0] <= 40.0
    with pytest.raises(TimeLimit, match=r"passed while the throughput table was filled \(0 \(job"):
        throughput_table(fp, 10.0, t0)


def test_periods_beyond_the_bound_are_bad_input(tmp_path, capsys):
    """More than 1,000 periods (the schema's maximum was 16,777,216, which ran out of memory building the
    MILP) is a located input error, before any work."""
    from optimizer.cli import main

    path = tmp_path / "f.yaml"
    body = NAMES.replace("TYPE", "h100").replace("JOB", "j").replace("GOAL", "cost")
    path.write_text(body.replace("periods: 2", "periods: 1001"))
    assert main(["fleet", str(path)]) == 2
    err = capsys.readouterr().err
    assert "f.yaml:13: fleet.periods: must be <= 1000" in err


def test_a_sub_solve_stopped_by_the_limit_reports_the_users_limit(tmp_path, monkeypatch):
    """A (job, type, size) solve that the time limit stops before any plan ends the table with the user's
    limit and where it stopped, not the sub-solve's leftover seconds."""
    import optimizer.drivers.fleet as drv
    import optimizer.drivers.solve as solve_mod

    def stopped(*a, **k):
        raise TimeLimit("no plan found within 0.00602247 s (0.0 s): ...")

    monkeypatch.setattr(solve_mod, "solve", stopped)
    path = tmp_path / "f.yaml"
    path.write_text(NAMES.replace("TYPE", "h100").replace("JOB", "j").replace("GOAL", "cost"))
    with pytest.raises(TimeLimit) as e:
        drv.throughput_table(load_fleet(path), time_limit_s=2.0)
    assert "the time limit (2 s)" in str(e.value) and "stopped at j on 1 x h100" in str(e.value)
    assert "0.006" not in str(e.value)


def test_a_size_of_more_gpus_than_a_problem_may_have_is_bad_input(tmp_path, capsys):
    """A size of 6,400,000 nodes (the fuzzer, seed 3: a Problem of 51.2M GPUs raised a pydantic traceback
    in the throughput table) is refused at load, naming the field and the count."""
    from optimizer.cli import main

    path = tmp_path / "f.yaml"
    body = NAMES.replace("TYPE", "h100").replace("JOB", "j").replace("GOAL", "cost")
    path.write_text(body.replace("sizes_nodes: [1, 2]", "sizes_nodes: [1, 6400000]"))
    assert main(["fleet", str(path)]) == 2
    err = capsys.readouterr().err
    assert "f.yaml:" in err and "fleet.sizes_nodes: 6,400,000 nodes of h100" in err and "Traceback" not in err
