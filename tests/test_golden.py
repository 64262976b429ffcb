"""Golden solved problems (tests/golden/solve.json, written by scripts/regen_golden.py): objective, bound
and size of the space, not the exact assignment (ties may resolve either way)."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT

from optimizer.drivers.solve import solve
from optimizer.io.loader import load_problem

GOLDEN = json.loads((ROOT / "tests" / "golden" / "solve.json").read_text())


@pytest.mark.parametrize("rel", sorted(GOLDEN))
def test_golden_solve(rel):
    g = GOLDEN[rel]
    r = solve(load_problem(ROOT / "problems" / rel), "cpsat")
    assert r.status == g["status"] == "optimal"
    assert r.candidates == g["candidates"]
    assert r.plans[0].objective_s == pytest.approx(g["objective_s"], rel=1e-6)
    assert r.bound_s == pytest.approx(g["bound_s"], rel=1e-6)
