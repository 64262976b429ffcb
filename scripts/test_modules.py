"""Modules of tests/ (fuzzing.py, oracle_cases.py) that scripts share with the test suite, loaded from their
file: tests/ is not a package, and the scripts run from anywhere."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent.parent / "tests"


def load(name: str) -> ModuleType:
    """tests/NAME.py as the module NAME (registered in sys.modules before it runs, as its dataclasses
    need)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
