"""Every shipped script runs: each scripts/bench_*.py with --quick (the same code paths on one small input, in
a fresh process as a user runs it, from the repository root), the cheap pure-Python scripts on tiny inputs,
and the GPU measurement scripts (scripts/microbench*.py) exit 2 with what to install where PyTorch is
absent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_script, run_script_without_torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
MEASUREMENTS = ROOT / "problems" / "measurements"


def run(script: str, *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# script: (arguments, lines the report holds)
QUICK = {
    "bench_backends.py": ([], ["CP-SAT s", "llama3.1-8b-8xh100", "yes ("]),
    "bench_check.py": ([], ["problems/default.yaml", " fits"]),
    "bench_kernels.py": (
        [],
        ["model (h200-sxm-141gb) against h200-sxm-141gb-microbench.json", "  gemm", "  block"],
    ),
    "bench_model.py": ([], ["2000 candidates", "candidates/s", "faster"]),
    "bench_procure.py": ([], ["llama8b-2types-pareto", "optimal"]),
    "bench_solve.py": ([], ["llama3.1-8b-8xh100", "True", "checks: passed"]),
    "bench_study.py": ([], ["2 points in", "resumed run identical: True"]),
}
# the slow set (run by CI with the rest): a process pool and a killed, resumed CLI run (bench_study, about 9 s
# on 2 cores), and the benchmarks that start solver processes (3-8 s of CPU each)
SLOW = {"bench_study.py", "bench_backends.py", "bench_check.py", "bench_procure.py", "bench_solve.py"}


def test_every_bench_script_has_a_quick_case():
    assert {p.name for p in SCRIPTS.glob("bench_*.py")} == set(QUICK)


@pytest.mark.parametrize(
    "script", [pytest.param(s, marks=pytest.mark.slow) if s in SLOW else s for s in QUICK]
)
def test_bench_quick(script):
    args, lines = QUICK[script]
    r = run(script, "--quick", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    for line in lines:
        assert line in r.stdout, (line, r.stdout)


def test_bench_main_takes_argv(capsys):
    """main(argv) runs in this process: bench_kernels --quick --json prints the scored classes."""
    bk = load_script("bench_kernels")
    assert bk.main(["--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["system"] == "h200-sxm-141gb" and out["gemm"]["n"] > 0 and out["block"]["n"] > 0


@pytest.mark.parametrize("path", sorted(MEASUREMENTS.glob("*.json")), ids=lambda p: p.stem)
def test_bench_kernels_scores_or_refuses_each_shipped_file(path):
    """Each shipped measurements file is scored (exit 0) or refused with a one-line reason (exit 2) when it
    holds no table in a layout the script reads; never a traceback."""
    system = "b300-sxm-270gb" if path.name.startswith("b300") else "h200-sxm-141gb"
    r = run("bench_kernels.py", "--measurements", str(path), "--system", system, "--json")
    assert "Traceback" not in r.stderr
    assert r.returncode in (0, 2), r.stderr
    if r.returncode == 0:
        assert sum(v["n"] for v in json.loads(r.stdout).values() if isinstance(v, dict) and "n" in v) > 0
    else:
        assert r.stderr.strip() and path.name in r.stderr


def test_bench_checks_fail_the_run():
    """The machine-independent checks: disagreeing optima and a missed ratio target (bench_solve), a purchase
    of the wrong kind or none (bench_procure), a missed kernel target (bench_kernels)."""
    bs = load_script("bench_solve")
    row = {"name": "x", "candidates": 2 * 10**7, "ratio": 25.0, "same_optimum": True}
    assert bs.failures([row]) == []
    assert (
        len(bs.failures([{**row, "ratio": 3.0}])) == 1
        and len(bs.failures([{**row, "same_optimum": False}])) == 1
    )
    assert bs.failures([{**row, "candidates": 1000, "ratio": 1.0}]) == []  # small spaces: no ratio target
    bp = load_script("bench_procure")
    expect = {"w": "mix", "l": "single"}
    ok = [
        {"name": "w", "best": "1 x a + 1 x b", "status": "optimal"},
        {"name": "l", "best": "4 x a", "status": "optimal"},
    ]
    assert bp.failures(ok, expect) == []
    assert len(bp.failures([{**ok[0], "best": "2 x a"}, {**ok[1], "best": None}], expect)) == 2
    bk = load_script("bench_kernels")
    s = {"n": 3, "median_abs_error_pct": 5.0}
    assert bk.missed_targets({"gemm": s, "attention": s, "block": s}) == []
    assert (
        len(bk.missed_targets({"gemm": s, "attention": s, "block": {**s, "median_abs_error_pct": 7.5}})) == 1
    )


@pytest.mark.slow
def test_fuzz_problems_tiny():
    r = run("fuzz_problems.py", "2", "--seed", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 cases in" in r.stdout and "tracebacks 0" in r.stdout


@pytest.mark.slow
def test_study5_one_model():
    r = run("study5.py", "--models", "175b", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)


# each GPU measurement script and the arguments of its smallest run
MICROBENCH = {
    "microbench.py": ["OUT", "--device", "cpu", "--quick"],
    "microbench_cudnn_attention.py": ["OUT"],
    "microbench_expert_eager.py": ["OUT", "--small"],
    "microbench_moe_layer.py": ["OUT", "--small"],
    "microbench_ring_attention.py": ["OUT", "--small"],
    "microbench_sustained.py": ["OUT", "--small"],
}


def test_every_microbench_script_listed():
    assert {p.name for p in SCRIPTS.glob("microbench*.py")} == set(MICROBENCH)


@pytest.mark.parametrize("script", sorted(MICROBENCH))
def test_microbench_without_torch_exits_2(script, tmp_path):
    """Run as a user without PyTorch would (torch made unimportable, whether or not it is installed): exit 2
    with what to install, no traceback, no file written."""
    out = tmp_path / "out.json"
    r = run_script_without_torch(script, *(str(out) if a == "OUT" else a for a in MICROBENCH[script]))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs PyTorch" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
