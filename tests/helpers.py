"""Shared helpers of the test suite (library loading is cached: it parses YAML)."""

from __future__ import annotations

import functools
from pathlib import Path


from optimizer.loader import load_named
from optimizer.schema import LLM, Execution, Problem, System, Training

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT.parent / "shared" / "calibration" / "public_runs.yaml"


@functools.lru_cache(maxsize=None)
def library_llm(name: str) -> LLM:
    return load_named("llm", name, LLM)


@functools.lru_cache(maxsize=None)
def library_system(name: str) -> System:
    return load_named("system", name, System)


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def concat_knobs(knobs_list):
    """One Knobs of N candidates from N single-candidate Knobs."""
    from optimizer.model.knobs import Knobs

    return Knobs.concat(knobs_list)


def problem_and_knobs(llm: LLM, system: System, num_gpus: int, training: Training, ex: Execution):
    """A Problem built in code and the knobs of its execution."""
    from optimizer.model.knobs import from_execution

    p = Problem(llm=llm, system=system, num_gpus=num_gpus, training=training, execution=ex)
    return p, from_execution(ex, system, num_gpus)
