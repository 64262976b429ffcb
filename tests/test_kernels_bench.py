"""The model's kernels against the H100 microbenchmarks (`scripts/bench_kernels.py`): whole transformer blocks,
forward + backward, stay within 7% (median) of the measured ones, GEMMs and causal flash attention (size-aware:
wave quantization of its query tiles, per-tile fixed work against the keys) within 15%; every class is scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
MEAS = ROOT.parent / "shared" / "measurements" / "h100-sxm-80gb-microbench.json"


@pytest.mark.skipif(not MEAS.is_file(), reason="measurements not present")
def test_blocks_within_seven_percent_and_every_class_scored():
    bk = load_script("bench_kernels")
    from optimizer.loader import load_named
    from optimizer.schema import System

    data = json.loads(MEAS.read_text())
    h100 = load_named("system", "h100-sxm-80gb", System)
    blocks = bk.summary(bk.block_errors(data, h100))
    assert blocks["n"] == len(data["layer"]) and blocks["median_abs_error_pct"] <= 7.0
    assert bk.summary(bk.gemm_errors(data, h100))["median_abs_error_pct"] <= 15.0
    attn = bk.summary(bk.attention_errors(data, h100))
    assert attn["n"] == len(data["attn"]) and attn["median_abs_error_pct"] <= 15.0
    for fn, key in ((bk.gemm_errors, "gemm"), (bk.attention_errors, "attn"), (bk.elementwise_errors, "elem")):
        rows = fn(data, h100)
        assert len(rows) >= len(data[key]) and all(abs(e) < 10 for _, e in rows)  # finite, sane ratios


def test_microbench_writes_a_table_bench_kernels_reads(tmp_path):
    """scripts/microbench.py (PyTorch, optional) writes the measurements layout; --device cpu --quick is its
    smoke test, and bench_kernels.py scores the model against the file it wrote."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = tmp_path / "mine.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "microbench.py"), str(out), "--device", "cpu", "--quick",
                        "--warmup", "1", "--repeats", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["gemm"] and data["attn"] and data["elem"]
    assert all(g["s"] > 0 and g["m"] * g["n"] * g["k"] > 0 for g in data["gemm"])
    assert {"fw_s", "fwbw_s"} <= set(data["attn"][0]) and "layernorm" in data["elem"][0]["ops"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), "--measurements", str(out),
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["gemm"]["n"] == len(data["gemm"]) and s["attention"]["n"] == len(data["attn"]) and s["block"]["n"] == 0
