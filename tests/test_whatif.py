"""`paraplan whatif`: more of any resource never slows the optimum (each changed problem's space holds the
base plans and each plan is no slower), the tornado chart draws, and the robust choice's worst case is no
worse than the optimum's."""

from __future__ import annotations

import json

from optimizer.cli import main
from optimizer.drivers.whatif import whatif
from optimizer.io.loader import load_problem

BASE = (
    "llm: llama3.1-8b\nsystem: {base: h100-sxm-80gb, offload: {capacity_gib: 256, bandwidth_gbps: 64}}\n"
    "num_gpus: 16\ntraining: {global_batch: 32}\n"
)


def test_every_lever_helps_or_is_neutral(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    r = whatif(load_problem(path), pct=20, top=5, band=0.1)
    names = {x.name.split(" +")[0] for x in r.levers}
    assert {
        "HBM capacity",
        "HBM bandwidth",
        "matrix FLOP/s",
        "offload capacity",
        "offload bandwidth",
    } <= names
    assert any(n.startswith("GPUs") for n in names)
    for x in r.levers:
        assert x.step_s is not None and x.saved_s >= -1e-9 * r.base_step_s, x
    flops = next(x for x in r.levers if x.name.startswith("matrix FLOP/s"))
    assert flops.saved_pct > 0
    rb = r.robust
    assert rb.robust_worst_s <= rb.nominal_worst_s + 1e-12 and rb.regret_s >= 0


def test_cli_json_and_tornado(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    png = tmp_path / "t.png"
    assert main(["whatif", str(path), "--json", "--plot", str(png), "--top", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["levers"] and png.stat().st_size > 1000


def test_robust_plan_is_best_worst_case_over_the_space(tmp_path):
    """The robust plan is a solve at the all-low corner: its worst case is no worse than any of the K best
    nominal plans' worst cases (each evaluated at all 8 corners), and the all-low corner is each plan's
    worst."""
    import itertools

    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.drivers.solve import solve
    from optimizer.drivers.whatif import _corner, robust

    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    problem = load_problem(path)
    base = solve(problem, top=6)
    rb = robust(problem, base, band=0.3)
    assert rb.worst_corner_is_low and rb.status == "optimal"
    corners = [_corner(problem, *c) for c in itertools.product((0.7, 1.3), repeat=3)]
    for p in base.plans:
        worst = max(evaluate_execution(c, p.evaluation.execution).result["step_time"] for c in corners)
        assert rb.robust_worst_s <= worst * (1 + 1e-9)
    assert abs(rb.regret_s - (rb.nominal_worst_s - rb.robust_worst_s)) < 1e-12


def test_the_time_limit_bounds_the_whole_command(tmp_path, monkeypatch):
    """Once the command's time limit has passed (a clock that jumps 1000 s after the base solve), no lever
    and no robust plan is solved: each says so (status time_limit, "not evaluated"), none claims "nothing
    fits"."""
    import itertools

    import optimizer.drivers.whatif as wi
    from optimizer.report.whatif import render

    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    p = load_problem(path)
    real = wi.time.perf_counter
    start = real()
    ticks = itertools.count()

    class Clock:
        @staticmethod
        def perf_counter():
            return start if next(ticks) == 0 else real() + 1000.0

    monkeypatch.setattr(wi, "time", Clock)
    r = whatif(p, time_limit_s=60.0)
    assert r.levers and all(x.status == "time_limit" and x.step_s is None for x in r.levers)
    assert r.robust.status == "time_limit" and r.robust.robust_plan is None
    text = render(p, r)
    assert "nothing fits" not in text and text.count("not evaluated: the time limit passed") == len(r.levers)
