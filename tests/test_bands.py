"""The stated step-time band: from the grouped (leave-one-source-out) errors, covering 80% of them."""

from __future__ import annotations

import json

import numpy as np
from helpers import library_system, run_cli

from optimizer.model import bands

DOC = {
    "coverage": 0.8,
    "min_runs": 5,
    "errors": {
        "gpu-a": {"s1": {"dense": [1.0, -2.0, 3.0, -4.0, 10.0], "moe": [20.0]}, "s2": {"dense": [1.0]}},
        "gpu-b": {"s2": {"dense": [5.0, 5.0, 5.0, 5.0, 5.0, 5.0], "moe": [30.0, -30.0, 30.0, 30.0, 30.0]}},
    },
}


def test_band_of_covers_the_share_it_states():
    assert bands.band_of([1.0, -2.0, 3.0, -4.0, 10.0], 0.8) == 4.0  # 4 of 5 within 4%
    assert bands.band_of([0.04, 0.05], 1.0) == 0.1  # rounded up to 0.1


def test_fallbacks_by_scope():
    """(GPU, stack, kind) with enough runs: its own; too few: the wider of the GPU type's and the stack's; a
    GPU the file does not list: none (the caller then uses the system file's own calibration)."""
    b = bands.grouped_band("gpu-a", "s1", "dense", DOC)
    assert (b.pct, b.n, b.scope) == (4.0, 5, "gpu-a / s1 dense")
    b = bands.grouped_band("gpu-a", "s1", None, DOC)  # either kind: six errors of the pair
    assert b.n == 6 and b.pct == 10.0
    b = bands.grouped_band("gpu-a", "s2", "dense", DOC)  # one run: gpu-a (6 dense) vs s2 (7 dense)
    assert b.pct == max(bands.band_of([1, -2, 3, -4, 10, 1], 0.8), bands.band_of([1, 5, 5, 5, 5, 5, 5], 0.8))
    b = bands.grouped_band("gpu-a", "s1", "moe", DOC)  # one MoE run of gpu-a; no s1 MoE elsewhere
    assert b.scope == "every moe run" and b.n == 6 and b.pct == 30.0
    assert bands.grouped_band("gpu-z", "s1", "dense", DOC) is None


def test_shipped_bands_cover_80_percent_of_grouped_errors_per_stack_and_gpu():
    """Every (GPU type, stack) of the public runs with at least 5 grouped errors: the band a plan of each
    kind is given there covers at least 80% of that kind's errors of the pair (where it has 5)."""
    doc = bands.load()
    assert doc and doc["coverage"] >= 0.8
    checked = 0
    for gpu, by_stack in doc["errors"].items():
        for stack, by_kind in by_stack.items():
            for kind, errs in by_kind.items():
                if len(errs) < doc["min_runs"]:
                    continue
                b = bands.grouped_band(gpu, stack, kind)
                assert np.mean(np.abs(errs) <= b.pct) >= 0.8, (gpu, stack, kind, b)
                checked += 1
    assert checked >= 6


def test_check_prints_the_grouped_band_of_its_gpu_stack_and_kind(tmp_path, capsys):
    """`check --json` states the band `bands` gives for the problem's system, stack and kind (here a dense
    model on H100 with Megatron-Core, the default stack), and names where it comes from."""
    body = (
        "llm: gpt3-175b\nsystem: h100-sxm-80gb\nnum_gpus: 1024\ntraining: {global_batch: 1024}\n"
        "execution: {tp: 8, pp: 8, micro_batch: 1, recompute: selective, sequence_parallel: true, zero: 1}\n"
    )
    rc, out, _, _ = run_cli(tmp_path, capsys, body, "--json", command="check")
    assert rc == 0
    doc = json.loads(out)
    want = bands.band_pct(library_system("h100-sxm-80gb"), "megatron-core", "dense")
    assert want is not None and doc["step_time_band_pct"] == want
    assert "held-out-source error band" in doc["calibration_detail"]


def test_a_gpu_with_few_runs_is_bounded_by_its_own_worst_error():
    """A GPU type with fewer than `min_runs` grouped errors (one source, held out on priors) gets at least
    its own largest error, not only the fleet's band."""
    doc = {**DOC, "errors": {**DOC["errors"], "gpu-c": {"s1": {"dense": [-31.0, -29.0]}}}}
    b = bands.grouped_band("gpu-c", "s1", "dense", doc)
    assert b.pct == 31.0 and b.scope == "gpu-c's 2 runs"
    assert bands.grouped_band("gpu-a", "s1", "dense", doc).pct == 4.0  # enough runs of its own: unchanged


def test_a_stack_with_few_runs_is_bounded_by_its_own_worst_error():
    """A stack with fewer than `min_runs` grouped errors (one source) bounds the band of its plans on any GPU
    type from below, as a GPU type with few runs does; a pair with enough runs of its own is unchanged."""
    doc = {**DOC, "errors": {**DOC["errors"], "gpu-c": {"s9": {"dense": [-20.3, -13.4]}}}}
    b = bands.grouped_band("gpu-a", "s9", "dense", doc)  # gpu-a never ran s9
    assert b.pct == 20.3 and b.scope == "s9's 2 runs"
    assert bands.grouped_band("gpu-a", "s1", "dense", doc).pct == 4.0
