"""Shared helpers of the test suite (library loading is cached: it parses YAML)."""

from __future__ import annotations

import functools
from pathlib import Path

from optimizer.io.loader import load_named
from optimizer.schema import LLM, Execution, Problem, System, Training

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT.parent / "shared" / "calibration" / "public_runs.yaml"


@functools.cache
def library_llm(name: str) -> LLM:
    return load_named("llm", name, LLM)


@functools.cache
def library_system(name: str) -> System:
    return load_named("system", name, System)


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are not a package; their own helper modules, such as
    torch_timing, import as they do when run: from scripts/ on the path)."""
    import importlib.util
    import sys

    if str(ROOT / "scripts") not in sys.path:
        sys.path.append(str(ROOT / "scripts"))

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def run_script_without_torch(script: str, *args: str, timeout: float = 120):
    """scripts/SCRIPT run in a subprocess as a user without PyTorch would (torch made unimportable, whether
    or not it is installed), from the repository root: the CompletedProcess (text output)."""
    import subprocess
    import sys

    argv = [str(ROOT / "scripts" / script), *args]
    code = (
        "import runpy, sys; sys.modules['torch'] = None; sys.path.insert(0, sys.argv[1]); "
        f"sys.argv = {argv!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def grid_leave_one_out(runs: list[dict], base: System, grid: list[dict]) -> list[float]:
    """Leave-one-out on a grid: each run predicted on `base` with the grid point (scripts/calibrate.py's
    `with_params` parameters) that fits all the other runs best (mean |error|). Returns each run's held-out
    step-time error, %."""
    import numpy as np

    from optimizer.io.runs import map_run, predict, run_target

    cal = load_script("calibrate")
    mapped = [map_run(r, {base.name: base}) for r in runs]
    target = [run_target(r, m.problem)[0] for r, m in zip(runs, mapped, strict=True)]
    err = np.zeros((len(grid), len(runs)))
    for i, x in enumerate(grid):
        sysm = cal.with_params(base, x)
        for j, (m, t) in enumerate(zip(mapped, target, strict=True)):
            m2 = type(m)(run=m.run, problem=m.problem.model_copy(update={"system": sysm}), free=m.free)
            err[i, j] = 100 * (predict(m2).result["step_time"] - t) / t
    return [float(x) for x in load_script("grid_fit").held_out(err)]


def concat_knobs(knobs_list):
    """One Knobs of N candidates from N single-candidate Knobs."""
    from optimizer.model.knobs import Knobs

    return Knobs.concat(knobs_list)


def problem_and_knobs(llm: LLM, system: System, num_gpus: int, training: Training, ex: Execution):
    """A Problem built in code and the knobs of its execution."""
    from optimizer.model.knobs import from_execution

    p = Problem(llm=llm, system=system, num_gpus=num_gpus, training=training, execution=ex)
    return p, from_execution(ex, system, num_gpus)


def run_cli(tmp_path, capsys, body: str, *args, command: str = "solve", name: str = "p.yaml"):
    """`body` written to tmp_path/name and run through `paraplan COMMAND FILE ARGS` in-process: (exit code,
    stdout, stderr, the file's path); never a traceback on stderr."""
    from optimizer.cli import main

    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    try:
        rc = main([command, str(path), *args])
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err, str(path)


NO_MEASUREMENT = {  # a run record's `measured` block with nothing stated
    "step_time_s": None,
    "derived_step_time_s": None,
    "mfu": None,
    "tflops_per_gpu": None,
    "tflops_convention": None,
    "tokens_per_s_per_gpu": None,
    "peak_memory_gib": None,
}


def run_record(model: dict, hardware: dict, parallel: dict, software: dict, step_time_s: float = 1.0) -> dict:
    """A calibration-schema run record (../shared/calibration/README.md) for tests: the given model,
    hardware, parallel and software blocks over schema defaults (one rank, no MoE, full recompute,
    measured step time `step_time_s`)."""
    return {
        "id": "test-run",
        "source": "test",
        "model": {"kv_heads": None, "head_dim": None, "vocab": None, "mlp": None, "moe": None, **model},
        "hardware": {"gpus_per_node": 8, **hardware},
        "parallel": {
            "cp": 1,
            "ep": 1,
            "vpp": 1,
            "sequence_parallel": False,
            "micro_batch": 1,
            "recompute": "full",
            "optimizer_sharding": None,
            "precision": "bf16",
            **parallel,
        },
        "measured": {**NO_MEASUREMENT, "step_time_s": step_time_s},
        "software": software,
        "tier": "A",
        "notes": None,
    }
