"""`paraplan procure`: catalogs, limits that bind, goals, heterogeneous mixes, Pareto front, CLI."""

from __future__ import annotations

import json
import math

import pytest

from optimizer.cli import main
from optimizer.drivers.procure import procure
from optimizer.drivers.purchase import best_of_type, sub_problem
from optimizer.drivers.solve import solve
from optimizer.errors import Infeasible
from optimizer.io.loader import load_procure

TINY_LLM = "{name: tiny, hidden: 2048, ffn: 8192, layers: 16, heads: 16, seq_len: 2048, vocab: 32000}"

CATALOG = """
catalog:
  name: test
  node_types:
    - name: fast
      system: h100-sxm-80gb
      price_usd: 300000
      rent_usd_per_gpu_hour: 2.5
      power_kw: 10
      {fast_extra}
    - name: slow
      system: a100-sxm-80gb
      price_usd: 200000
      rent_usd_per_gpu_hour: 1.5
      power_kw: 6
      {slow_extra}
  {joining}
"""


def write(
    tmp_path,
    procure_yaml: str,
    fast_extra: str = "",
    slow_extra: str = "",
    joining: str = "",
    batch: int = 96,
    name: str = "p",
) -> object:
    text = (
        f"name: {name}\nllm: {TINY_LLM}\n"
        f"training: {{global_batch: {batch}, precision: bf16, tokens: 1.0e+10}}\n"
        f"procure: {procure_yaml}\n"
        + CATALOG.format(fast_extra=fast_extra, slow_extra=slow_extra, joining=joining)
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def step_on(pp, type_name: str, nodes: int) -> float | None:
    """Fastest step of exactly `nodes` nodes of a type (by solve, every GPU used)."""
    t = next(t for t in pp.catalog.node_types if t.name == type_name)
    q = sub_problem(pp, t, nodes)
    q = q.model_copy(update={"options": q.options.model_copy(update={"allow_idle_gpus": False})})
    try:
        return solve(q, "cpsat").plans[0].objective_s
    except Infeasible:
        return None


def test_budget_binds_and_the_best_purchase_is_worked_by_hand(tmp_path):
    """One type, $1.05M: at most 3 nodes of $300k. Worked by hand: the best purchase is the node count
    (1..3) whose fastest plan is fastest; more GPUs are faster here, so 3 nodes = $0.9M."""
    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 1.05e+6}", slow_extra="max_nodes: 1"))
    pp = pp.model_copy(
        update={"catalog": pp.catalog.model_copy(update={"node_types": pp.catalog.node_types[:1]})}
    )
    r = procure(pp)
    steps = {n: step_on(pp, "fast", n) for n in (1, 2, 3)}
    best_n = min((s, n) for n, s in steps.items() if s is not None)[1]
    assert r.rows[0].bound_by == "budget" and r.rows[0].max_nodes == 3
    assert r.best.nodes == best_n == 3
    assert r.best.cost_usd == pytest.approx(3 * 300000)
    assert r.best.step_time_s == pytest.approx(steps[3], rel=1e-3)


def test_power_cap_binds(tmp_path):
    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 1.0e+7, power_kw: 25}"))
    r = procure(pp)
    rows = {x.node_type.name: x for x in r.rows}
    assert rows["fast"].bound_by == "power" and rows["fast"].max_nodes == 2  # 25 kW / 10 kW
    assert rows["slow"].max_nodes == 4  # 25 / 6
    assert r.best.power_kw <= 25


def test_availability_binds(tmp_path):
    pp = load_procure(
        write(
            tmp_path,
            "{goal: throughput, budget_usd: 1.0e+7}",
            fast_extra="max_nodes: 1",
            slow_extra="max_nodes: 2",
        )
    )
    r = procure(pp)
    rows = {x.node_type.name: x for x in r.rows}
    assert rows["fast"].bound_by == "availability" and rows["fast"].purchase.nodes <= 1
    assert rows["slow"].bound_by == "availability" and rows["slow"].purchase.nodes <= 2


def test_cost_goal_is_the_cheapest_purchase_meeting_the_deadline(tmp_path):
    """Against a sweep over node counts of each type: the cheapest count whose fastest plan meets the
    deadline."""
    pp = load_procure(write(tmp_path, "{goal: cost, deadline_days: 2.0, max_nodes: 6}"))
    r = procure(pp)
    steps_to_train = 1.0e10 / (96 * 2048)
    best = None
    for t in pp.catalog.node_types:
        for n in range(1, 7):
            s = step_on(pp, t.name, n)
            if s is not None and s * steps_to_train / 86400 <= 2.0:
                cost = n * t.price_usd
                best = cost if best is None else min(best, cost)
                break
    assert best is not None and r.best.cost_usd == pytest.approx(best)
    assert r.best.days_to_train <= 2.0 + 1e-9


def test_throughput_per_dollar_against_a_sweep(tmp_path):
    pp = load_procure(write(tmp_path, "{goal: throughput_per_usd, budget_usd: 2.0e+6}"))
    r = procure(pp)
    best = 0.0
    for t in pp.catalog.node_types:
        for n in range(1, int(2.0e6 // t.price_usd) + 1):
            s = step_on(pp, t.name, n)
            if s is not None:
                best = max(best, 96 * 2048 / s / (n * t.price_usd))
    assert r.best.tokens_per_s / r.best.cost_usd == pytest.approx(best, rel=1e-3)


def test_rental_budget_caps_gpu_hours(tmp_path):
    """Rental: the whole run's bill (GPUs x hours x rate) stays within the budget; a tighter budget is
    slower."""
    loose = procure(
        load_procure(
            write(
                tmp_path,
                "{goal: time_to_train, pricing: rental, budget_usd: 1.0e+6, max_nodes: 8}",
                name="loose",
            )
        )
    )
    spent = loose.best.cost_usd
    tight = procure(
        load_procure(
            write(
                tmp_path,
                f"{{goal: time_to_train, pricing: rental, budget_usd: {spent * 0.85}, max_nodes: 8}}",
                name="tight",
            )
        )
    )
    assert tight.best is not None and tight.best.cost_usd <= spent * 0.85 * (1 + 1e-6)
    assert tight.best.step_time_s > loose.best.step_time_s


MIX = "{goal: throughput, budget_usd: 2.2e+6, max_types: 2, heterogeneous: data}"


@pytest.mark.slow  # two catalogs solved per type and as mixes: about 3 s
def test_heterogeneous_mix_beats_every_homogeneous_purchase(tmp_path):
    """The fast type is supply-limited to 2 nodes: 2 fast nodes plus slow nodes with the rest of the budget
    train faster than anything of one type."""
    pp = load_procure(write(tmp_path, MIX, fast_extra="max_nodes: 2"))
    r = procure(pp)
    homog = [x.purchase.step_time_s for x in r.rows if x.purchase]
    assert r.mixes_considered > 0
    assert len(r.best.groups) == 2 and {g.node_type.name for g in r.best.groups} == {"fast", "slow"}
    assert r.best.step_time_s < min(homog)
    assert r.best.cost_usd <= 2.2e6
    assert sum(g.global_batch for g in r.best.groups) == 96
    # the step time is the slowest group plus the cross-type synchronisation
    assert r.best.step_time_s == pytest.approx(max(g.step_time_s for g in r.best.groups) + r.best.sync_s)


@pytest.mark.slow
def test_heterogeneous_mix_every_batch_split_is_tried(tmp_path):
    """A group's step time is not monotone in its batch share (the share must divide over its data-parallel
    ranks), so the best split is found by trying every share: 2 fast + 8 slow nodes on 48/48 sequences (the
    2.2 M$ purchase) must not lose to the 2 fast + 6 slow nodes a 2.0 M$ budget buys; a bisection for where
    the groups' step times cross stopped at 36/60 there and did."""
    more = procure(load_procure(write(tmp_path, MIX, fast_extra="max_nodes: 2", name="more")))
    less = procure(
        load_procure(write(tmp_path, MIX.replace("2.2e+6", "2.0e+6"), fast_extra="max_nodes: 2", name="less"))
    )
    assert more.best.step_time_s <= less.best.step_time_s
    assert sum(g.global_batch for g in more.best.groups) == 96


@pytest.mark.slow  # about 3 s
def test_heterogeneous_mix_loses_over_a_slow_joining_network(tmp_path):
    """Same purchase, but the types are joined by a 0.05 GB/s link: the gradient exchange makes every mix
    slower than the best single type, which is then the answer."""
    joining = (
        "joining_network: {name: wan, size: 100000, bandwidth_gbps: 0.05, latency_us: 1000, efficiency: 0.9}"
    )
    pp = load_procure(write(tmp_path, MIX, fast_extra="max_nodes: 2", joining=joining))
    r = procure(pp)
    assert r.mixes_considered > 0
    assert len(r.best.groups) == 1
    assert r.best.step_time_s == pytest.approx(min(x.purchase.step_time_s for x in r.rows if x.purchase))


def test_pareto_front_is_monotone_and_each_point_is_its_budgets_optimum(tmp_path):
    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 2.0e+6}"))
    r = procure(pp, pareto=True)
    front = r.pareto
    assert len(front) >= 3
    costs = [p.cost_usd for p in front]
    days = [p.days_to_train for p in front]
    assert costs == sorted(costs) and all(a > b for a, b in zip(days, days[1:], strict=False))
    assert front[-1].step_time_s == pytest.approx(r.best.step_time_s, rel=1e-6)
    for p in front[:3]:  # nothing of any type within the point's cost is faster
        for t in pp.catalog.node_types:
            g, _, _ = best_of_type(pp, t, int(math.floor(p.cost_usd / t.price_usd + 1e-9)))
            assert g is None or g.step_time_s >= p.step_time_s * (1 - 1e-6)


def test_cli_json_plot_and_errors(tmp_path, capsys):
    path = write(tmp_path, "{goal: throughput, budget_usd: 1.0e+6}")
    png = tmp_path / "front.png"
    assert main(["procure", str(path), "--json", "--plot", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["best"]["cost_usd"] <= 1.0e6 and d["status"] == "optimal"
    assert d["pareto"] and png.stat().st_size > 1000
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("price_usd: 300000", "price_usd: -3"))
    assert main(["procure", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:" in err and "price_usd" in err
    poor = write(tmp_path, "{goal: throughput, budget_usd: 1000}", name="poor")
    assert main(["procure", str(poor)]) == 3
    assert "NOTHING FITS" in capsys.readouterr().out


def test_catalog_variants_expand(tmp_path):
    pp = load_procure(write(tmp_path, "{goal: throughput}"))
    assert [t.name for t in pp.catalog.node_types] == ["fast", "slow"]
    path = tmp_path / "v.yaml"
    path.write_text(f"llm: {TINY_LLM}\ntraining: {{global_batch: 96}}\ncatalog: study5-h100\n")
    cat = load_procure(path).catalog
    assert len(cat.node_types) == 16
    t = next(t for t in cat.node_types if t.name == "h100-20g-ddr512")
    assert t.system.hbm_gib == 20 and t.system.offload.capacity_gib == 512 and t.price_usd == 260000


def test_tables_of_a_larger_purchase_serve_a_smaller_one(tmp_path):
    """formulations.tables.restrict: the tables filled for 6 nodes, restricted to 2 and 4, give the same
    proven optimum and space size as solving those purchases from scratch."""
    from optimizer.drivers.purchase import TablesCache

    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 2.0e+6}"))
    cache = TablesCache()
    for t in pp.catalog.node_types:
        best_of_type(pp, t, 6, cache=cache)
        for n in (2, 4):
            g1, size1, st1 = best_of_type(pp, t, n, cache=cache)
            g0, size0, st0 = best_of_type(pp, t, n)
            assert st1 == st0 == "optimal" and size1 == size0
            assert g1.step_time_s == pytest.approx(g0.step_time_s, rel=1e-9) and g1.gpus_used == g0.gpus_used


def test_pareto_plot_has_a_legend_by_type_and_the_choice(tmp_path, monkeypatch):
    """The plot's legend names each node type on the front and the chosen purchase (matplotlib's own
    objects, not pixels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from optimizer.report.plots import plot_pareto

    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 2.0e+6}"))
    r = procure(pp, pareto=True)
    captured = {}
    monkeypatch.setattr(plt, "close", lambda fig: captured.setdefault("fig", fig))
    png = tmp_path / "front.png"
    plot_pareto(r, str(png))
    assert png.stat().st_size > 1000
    ax = captured["fig"].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    kinds = {g.node_type.name for p in r.pareto for g in p.groups}
    assert all(any(k in lab for lab in labels) for k in kinds)
    assert any(lab.startswith("chosen: ") for lab in labels)


def test_parallel_over_types_equals_serial(tmp_path, monkeypatch):
    """Per-type work runs on several processes (types sharing tables in one chunk); the answer and the Pareto
    front are those of the serial run."""
    variants = (
        "\n    - name: fast-hbm96\n      system: {base: h100-sxm-80gb, hbm_gib: 96}\n"
        "      price_usd: 320000\n"
        "      power_kw: 10"
    )
    path = write(tmp_path, "{goal: throughput, budget_usd: 2.0e+6}", slow_extra=variants)
    pp = load_procure(path)
    assert len(pp.catalog.node_types) == 3
    got = {}
    for w in ("1", "2"):
        monkeypatch.setenv("PARAPLAN_WORKERS", w)
        r = procure(pp, pareto=True)
        got[w] = (
            [
                (
                    x.node_type.name,
                    x.max_nodes,
                    None if x.purchase is None else round(x.purchase.step_time_s, 9),
                )
                for x in r.rows
            ],
            r.best.label(),
            [(p.label(), round(p.step_time_s, 9)) for p in r.pareto],
        )
    assert got["1"] == got["2"]


def test_report_shows_each_plan_on_the_gpus_bought_and_evaluate_names_idle_gpus(tmp_path):
    """A type's plan is solved on its whole pool of nodes (idle GPUs allowed); the report shows it on the
    nodes bought. `evaluate` on a problem with more GPUs than the plan uses says how many are used and
    idle."""
    import re
    from dataclasses import replace

    from optimizer.report.procure import render, result_dict
    from optimizer.report.text import render_evaluation

    pp = load_procure(write(tmp_path, "{goal: throughput, budget_usd: 1.05e+6}", slow_extra="max_nodes: 1"))
    r = procure(pp)
    text, js = render(r), result_dict(r)
    for g, gd in zip(r.best.groups, js["best"]["groups"], strict=True):
        bought = g.nodes * g.node_type.gpus_per_node
        assert re.search(rf"paraplan evaluate: .* on {bought} x {g.node_type.system.name}\n", text)
        assert gd["plan"]["num_gpus"] == bought  # text and JSON agree
        ev = g.plan.evaluation
        more = replace(ev, problem=ev.problem.model_copy(update={"num_gpus": g.gpus_used + 8}))
        assert (
            f"on {g.gpus_used + 8} x {g.node_type.system.name} ({g.gpus_used} used, 8 idle)"
            in render_evaluation(more)
        )
    # a pool of 5 nodes (40 GPUs) for a batch of 96 sequences, which no layout spreads over all 40: the plan
    # leaves GPUs idle, fewer nodes are bought, and the group's plan is on those, not on the pool
    t = pp.catalog.node_types[0]
    g, _, _ = best_of_type(pp, t, 5)
    assert g.solve.plans[0].evaluation.problem.num_gpus == 5 * t.gpus_per_node
    assert g.nodes < 5 and g.plan.evaluation.problem.num_gpus == g.nodes * t.gpus_per_node >= g.gpus_used


@pytest.mark.slow  # every share of every mix solved once without the bounds: about 10 s
def test_heterogeneous_mix_bounds_never_lose_the_best_mix(tmp_path):
    """The throughput bounds (per mix and per batch share) skip solves, never the best mix: the pruned
    search answers what solving every share answers."""
    from optimizer.drivers.hetero import best_mix

    pp = load_procure(write(tmp_path, MIX, fast_extra="max_nodes: 2"))
    rows = procure(pp).rows
    pruned, n_pruned = best_mix(pp, rows)
    full, n_full = best_mix(pp, rows, prune=False)
    assert full is not None and pruned is not None
    assert pruned.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert [(g.node_type.name, g.global_batch) for g in pruned.groups] == [
        (g.node_type.name, g.global_batch) for g in full.groups
    ]


@pytest.mark.slow  # a mix and its Pareto front: about 5 s
def test_pareto_front_holds_the_best_purchase_when_a_mix_wins(tmp_path):
    """A front of single-type purchases alone would end on a point the winning mix dominates: the best
    purchase is on the front (no point is both cheaper and faster than it)."""
    r = procure(load_procure(write(tmp_path, MIX, fast_extra="max_nodes: 2")), pareto=True)
    assert len(r.best.groups) == 2
    assert any(len(p.groups) == 2 for p in r.pareto)
    assert not any(
        p.cost_usd <= r.best.cost_usd and p.step_time_s < r.best.step_time_s * (1 - 1e-9) for p in r.pareto
    )
