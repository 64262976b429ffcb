"""Fuzz: mutated shipped inputs and hostile files through every command of the CLI (in-process). The slow
set runs `PARAPLAN_FUZZ_EXAMPLES` cases (80 by default: CI's budget; set it higher for a large run on demand)
drawn over every command and reader alike; the fast set runs one case of each (`tests/fuzzing.py`).

Asserts, for every case: no traceback (exit 0, 2, 3 or 4), no hang (an alarm of 30 s; 90 s for a timed
command left at its default 60 s budget), every input error
naming file:line, and no exit 3 (proven: nothing fits) from a run that passed its --time-limit where the
same case without the limit finds a plan. `scripts/fuzz_problems.py N` runs the same cases in bulk and
counts them.
"""

from __future__ import annotations

import os
import random
import sys
import zlib

import pytest
from fuzzing import LIBRARY, TIMED, by_label, draw, mutate, run_case, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGALRM")

SEEDS = seeds()
GROUPS = by_label(SEEDS)  # command (and reader) -> its seeds: 12 with ../shared, so 12 fast cases
SLOW_EXAMPLES = int(os.environ.get("PARAPLAN_FUZZ_EXAMPLES", "80"))


def check_case(tmp_path, seed: int, label: str | None = None) -> None:
    rng = random.Random(seed)
    path, command = rng.choice(GROUPS[label]) if label else draw(rng, SEEDS)
    case = mutate(rng, path, command)
    # a case without --time-limit runs under the command's default budget (60 s): a hang is what outlasts it
    out = run_case(
        case, tmp_path, limit_s=30 if case.time_limit is not None or case.command not in TIMED else 90
    )
    assert out.kind == "ok", (
        f"{out.kind} on {case.label} {case.source} --time-limit {case.time_limit} [{case.what}]: {out.detail}"
    )


SETTINGS = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **SETTINGS)
@given(seed=st.integers(0, 2**32 - 1))
def test_no_traceback_no_hang_every_error_located(tmp_path, seed):
    check_case(tmp_path, seed)


@pytest.mark.parametrize("label", sorted(GROUPS))
def test_sample_no_traceback_no_hang_every_error_located(tmp_path, label):
    """The same property on one fixed case of each command and reader."""
    check_case(tmp_path, zlib.crc32(label.encode()), label)


def test_seeds_cover_every_command_and_reader():
    from optimizer.cli import SHARED

    assert {c for _, c in SEEDS} == set(SHARED) - {"schema"}  # schema reads no file
    assert {"solve:hf", *(f"solve:{r}" for r in LIBRARY.values())} <= set(GROUPS)
