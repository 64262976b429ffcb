"""The model's kernels against the H100 microbenchmarks (`scripts/bench_kernels.py`): whole transformer blocks,
forward + backward, stay within 7% (median) of the measured ones; every class of op is scored."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEAS = ROOT.parent / "shared" / "measurements" / "h100-sxm-80gb-microbench.json"


@pytest.mark.skipif(not MEAS.is_file(), reason="measurements not present")
def test_blocks_within_seven_percent_and_every_class_scored():
    spec = importlib.util.spec_from_file_location("bench_kernels", ROOT / "scripts" / "bench_kernels.py")
    bk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bk)
    from optimizer.loader import load_named
    from optimizer.schema import System

    data = json.loads(MEAS.read_text())
    h100 = load_named("system", "h100-sxm-80gb", System)
    blocks = bk.summary(bk.block_errors(data, h100))
    assert blocks["n"] == len(data["layer"]) and blocks["median_abs_error_pct"] <= 7.0
    for fn, key in ((bk.gemm_errors, "gemm"), (bk.attention_errors, "attn"), (bk.elementwise_errors, "elem")):
        rows = fn(data, h100)
        assert len(rows) >= len(data[key]) and all(abs(e) < 10 for _, e in rows)  # finite, sane ratios
