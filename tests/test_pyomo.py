"""`--backend pyomo`: the MILP over the kept pairs reaches CP-SAT's proven optimum on every oracle
problem (CP-SAT equals the enumerator there: tests/test_solve_cpsat.py), and the enumerator's on the small
ones directly, with the same top-K list and an LP/MPS file any solver can read. The fast set keeps one small
case (FAST) of each comparison; the rest are marked slow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from oracle_cases import ORACLE, SMALL

from optimizer.drivers.solve import solve
from optimizer.io.loader import load_problem


def load_text(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_problem(path)


FAST = {"dense-8gpu"}  # the representative of the fast set


def twin(name: str):
    """A pytest parameter of `name`, marked slow unless it is a fast-set representative."""
    return pytest.param(name, marks=() if name in FAST else pytest.mark.slow)


@pytest.mark.parametrize("name", [twin(n) for n in list(ORACLE) + list(SMALL)])
def test_pyomo_matches_cpsat(tmp_path, name):
    p = load_text(tmp_path, name, {**ORACLE, **SMALL}[name])
    c = solve(p, "cpsat", time_limit_s=120)
    h = solve(p, "cpsat", time_limit_s=120, backend="pyomo")
    assert h.method == "pyomo" and h.status == "optimal" and c.status == "optimal"
    assert h.plans[0].objective_s == pytest.approx(c.plans[0].objective_s, rel=1e-9)
    assert h.gap == pytest.approx(0.0, abs=1e-9)
    assert h.candidates == c.candidates


@pytest.mark.parametrize("name", [twin(n) for n in ("dense-8gpu", "fixed-knobs", "offload-13b-8gpu-24gib")])
def test_pyomo_matches_enumeration_top5(tmp_path, name):
    p = load_text(tmp_path, name, SMALL[name])
    e = solve(p, "enumerate", top=5)
    h = solve(p, backend="pyomo", top=5)
    assert [pl.objective_s for pl in h.plans] == pytest.approx([pl.objective_s for pl in e.plans], rel=1e-3)


def test_cli_json_and_write_lp_mps(tmp_path):
    prob = tmp_path / "d.yaml"
    prob.write_text(SMALL["dense-8gpu"])
    lp, mps = tmp_path / "m.lp", tmp_path / "m.mps"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "optimizer.cli",
            "solve",
            str(prob),
            "--backend",
            "pyomo",
            "--json",
            "--write-lp",
            str(lp),
            "--write-mps",
            str(mps),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    d = json.loads(out.stdout)
    c = solve(load_problem(prob))
    assert d["method"] == "pyomo" and d["status"] == "optimal"
    assert d["plans"][0]["objective_step_time_s"] == pytest.approx(c.plans[0].objective_s, rel=1e-9)
    assert "memory_hbm" in lp.read_text() and "min" in lp.read_text()
    assert "ROWS" in mps.read_text() and "memory_hbm" in mps.read_text()
    # HiGHS re-reads the written file (in a process of its own: formulations/highs_worker.py) and finds the
    # same optimum (score = step time in TIME_UNIT here)
    from formulations.tables import TIME_UNIT

    for f in (lp, mps):
        w = subprocess.run(
            [sys.executable, "-m", "formulations.highs_worker", str(f), "30"],
            capture_output=True,
            text=True,
            check=True,
        )
        from formulations.highs_worker import MARKER

        r = json.loads(next(x for x in w.stdout.splitlines() if x.startswith(MARKER))[len(MARKER) :])
        assert r["status"] == "Optimal"
        assert r["objective"] / TIME_UNIT == pytest.approx(c.plans[0].objective_s, rel=1e-9)


def test_unknown_solver_is_an_input_error(tmp_path):
    prob = tmp_path / "d.yaml"
    prob.write_text(SMALL["dense-8gpu"])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "optimizer.cli",
            "solve",
            str(prob),
            "--backend",
            "pyomo",
            "--solver",
            "nosuch",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
