"""Fuzz: mutated shipped problems and hostile files through the CLI (in-process). The slow set runs
`PARAPLAN_FUZZ_EXAMPLES` cases (80 by default: CI's budget; set it higher for a large run on demand); the fast
set draws a small sample of the same cases.

Asserts, for every case: no traceback (exit 0, 2, 3 or 4), no hang (an alarm of 30 s), and every input
error naming file:line. `scripts/fuzz_problems.py N` runs the same cases in bulk and counts them.
"""

from __future__ import annotations

import os
import random
import sys

import pytest
from fuzzing import mutate, run_case, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGALRM")

SEEDS = seeds()
FAST_EXAMPLES = 12  # the fast set's sample
SLOW_EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "80"))


def check_case(tmp_path, seed: int, which: int, cmd: int) -> None:
    path, command = SEEDS[which % len(SEEDS)]
    if command == "solve":
        command = ("solve", "check", "evaluate", "solve")[cmd]
    case = mutate(random.Random(seed), path, command)
    out = run_case(case, tmp_path, limit_s=30)
    assert out.kind == "ok", f"{out.kind} on {command} {case.source} [{case.what}]: {out.detail}"


CASE = {"seed": st.integers(0, 2**32 - 1), "which": st.integers(0, 10**6), "cmd": st.integers(0, 3)}
SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **SETTINGS)
@given(**CASE)
def test_no_traceback_no_hang_every_error_located(tmp_path, seed, which, cmd):
    check_case(tmp_path, seed, which, cmd)


@settings(max_examples=FAST_EXAMPLES, **SETTINGS)
@given(**CASE)
def test_sample_no_traceback_no_hang_every_error_located(tmp_path, seed, which, cmd):
    """The same property on a small derandomized sample of the cases."""
    check_case(tmp_path, seed, which, cmd)


def test_seeds_cover_every_command():
    assert {c for _, c in SEEDS} >= {"solve", "procure", "validate"}
