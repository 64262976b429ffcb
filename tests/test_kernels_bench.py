"""The model's kernels against the H100 microbenchmarks (`scripts/bench_kernels.py`): whole transformer
blocks, forward + backward, stay within 7% (median) of the measured ones, GEMMs and causal flash attention
(size-aware: wave quantization of its query tiles, per-tile fixed work against the keys) within 15%; every
class is scored."""

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
    from optimizer.io.loader import load_named
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
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "microbench.py"),
            str(out),
            "--device",
            "cpu",
            "--quick",
            "--warmup",
            "1",
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["gemm"] and data["attn"] and data["elem"]
    assert all(g["s"] > 0 and g["m"] * g["n"] * g["k"] > 0 for g in data["gemm"])
    assert {"fw_s", "fwbw_s"} <= set(data["attn"][0]) and "layernorm" in data["elem"][0]["ops"]
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), "--measurements", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert data["layer"] and all(b["per_layer_s"] > 0 and not b["compiled"] for b in data["layer"])
    assert s["gemm"]["n"] == len(data["gemm"]) and s["attention"]["n"] == len(data["attn"])
    assert s["block"]["n"] == len(data["layer"])
    # --queue N times N calls back to back; --only measures the named tables and leaves the others empty
    out2 = tmp_path / "queued.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "microbench.py"),
            str(out2),
            "--device",
            "cpu",
            "--quick",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "--queue",
            "3",
            "--only",
            "attn,layer",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    q = json.loads(out2.read_text())
    assert q["queue"] == 3 and q["gemm"] == [] and q["elem"] == [] and q["attn"] and q["layer"]


H200 = ROOT / "problems" / "measurements" / "h200-sxm-141gb-microbench.json"


def test_h200_blocks_within_seven_percent_of_the_project_s_own_measurements():
    """The H200 microbenchmarks this project measured (problems/measurements, scripts/microbench.py
    --compile): whole blocks, eager and compiled, within 7% (median) with the H200's system file (tables
    transferred from the H100, the H200's HBM); every class is scored to finite, sane ratios."""
    bk = load_script("bench_kernels")
    from optimizer.io.loader import load_named
    from optimizer.schema import System

    data = json.loads(H200.read_text())
    h200 = load_named("system", "h200-sxm-141gb", System)
    blocks = bk.summary(bk.block_errors(data, h200))
    assert blocks["n"] == len(data["layer"]) == 10 and blocks["median_abs_error_pct"] <= 7.0
    for fn, key in ((bk.gemm_errors, "gemm"), (bk.attention_errors, "attn"), (bk.elementwise_errors, "elem")):
        rows = fn(data, h200)
        assert len(rows) >= len(data[key]) and all(abs(e) < 10 for _, e in rows)


def test_head_size_scale_matches_the_h200_attention_kernels():
    """`HEAD_DIM_SCALE` (FLOP rate at head size 64 against 128; FlashAttention-3 paper's H100 forward figures)
    against the H200's measured forward+backward of the same heads and sequence (64 q / 8 K/V heads, 4096
    tokens), per backend: cuDNN (the `flash` class) and FlashAttention-2 (`fa2`), within 10%. And the H200
    system's two efficiencies (cuDNN class against FlashAttention-2: 0.65 / 0.34, a prior) put
    FlashAttention-2's time within 25% of the measured median ratio (1.66x; the prior's 1.91x is 13%
    pessimistic, kept for the torchtitan runs)."""
    import numpy as np

    from optimizer.model.hardware import HEAD_DIM_SCALE

    data = json.loads(H200.read_text())
    by = {(a["s"], a["heads"], a["kv_heads"], a["head_dim"]): a for a in data["attn"]}
    d64, d128 = by[(4096, 64, 8, 64)], by[(4096, 64, 8, 128)]
    for backend, cls in (("cudnn", "flash"), ("flash2", "fa2")):
        rate = (d128[backend]["fwbw_s"] / 2.0) / d64[backend]["fwbw_s"]  # half the FLOPs at head size 64
        modelled = float(np.interp(6.0, *HEAD_DIM_SCALE[cls]))
        assert abs(rate / modelled - 1.0) <= 0.10, (backend, rate, modelled)
    from optimizer.io.loader import load_named
    from optimizer.schema import System

    h200 = load_named("system", "h200-sxm-141gb", System)
    modelled_ratio = h200.attention_efficiency / h200.attention_efficiency_fa2
    measured_ratio = float(np.median([a["flash2"]["fwbw_s"] / a["cudnn"]["fwbw_s"] for a in data["attn"]]))
    assert abs(modelled_ratio / measured_ratio - 1.0) <= 0.25, (modelled_ratio, measured_ratio)


def test_moe_layer_probe_smoke(tmp_path):
    """scripts/microbench_moe_layer.py --small (PyTorch, optional) times the GPT-OSS block's pieces on any
    device: every table filled, every time positive, no error recorded (no timing comparisons: a shared CPU is
    noisy)."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = tmp_path / "block.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "microbench_moe_layer.py"), str(out), "--small"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    lay = d["layer"]
    assert d["errors"] == [] and d["gemm"] and d["grouped"] and d["layer"]
    assert all(
        lay[k] > 0 for k in ("layer_fw_s", "layer_fwbw_s", "layer_sync_fwbw_s", "stack9_nosync_wall_s")
    )


def test_ring_attention_compute_matches_the_h200_measurement():
    """Context parallelism's attention compute on one rank (the causal step, cp-1 half-chunk steps, fp32
    merges; scripts/microbench_ring_attention.py on the H200, problems/measurements/h200-ring-attention.json),
    scored by bench_kernels.py's `ring` class: the model's `flash_attention(..., cp=cp)` is within 10% of the
    measured forward+backward with FlashAttention-2 (the torchtitan runs' kernel) at every cp (1-8, 32K-256K
    tokens) and within 15% with cuDNN."""
    bk = load_script("bench_kernels")
    from optimizer.io.loader import load_named
    from optimizer.schema import System

    data = json.loads((ROOT / "problems" / "measurements" / "h200-ring-attention.json").read_text())
    rows = bk.ring_errors(data, load_named("system", "h200-sxm-141gb", System))
    assert len(rows) == 8 and {name.split()[0] for name, _ in rows} == {"flash2", "cudnn"}
    for name, err in rows:
        assert abs(err) <= (0.10 if name.startswith("flash2") else 0.15), (name, err)
    assert bk.summary(rows)["median_abs_error_pct"] <= 10.0


def test_attention_sinks_backward_matches_the_h200_measurement():
    """Learned attention sinks on cuDNN's fused attention (scripts/microbench_cudnn_attention.py on the H200,
    problems/measurements/h200-cudnn-attention-sinks.json: 10 shapes, causal and 128-token window), scored by
    bench_kernels.py's `sinks` class: the backward time the model's sinks add (`Hardware.sink_backward`) is
    within 10% of the measured difference at the median and within 35% everywhere; the forward is left as it
    is."""
    bk = load_script("bench_kernels")
    from optimizer.io.loader import load_named
    from optimizer.model.layer import flash_attention
    from optimizer.schema import System

    data = json.loads((ROOT / "problems" / "measurements" / "h200-cudnn-attention-sinks.json").read_text())
    system = load_named("system", "h200-sxm-141gb", System)
    rows = bk.sink_errors(data, system)
    assert len(rows) == 2 * len(data["rows"]) == 20
    assert all(abs(err) <= 0.35 for _, err in rows), rows
    assert bk.summary(rows)["median_abs_error_pct"] <= 10.0
    assert len(bk.cudnn_attention_errors(data, system)) == 40 and bk.ring_errors(data, system) == []
    hw = bk.Hardware(system, bk.Precision.BF16)
    plain, sink = (flash_attention(hw, 4, 64, 8, 64, 4096.0, 4096.0, 2.0, sinks=x) for x in (False, True))
    assert float(sink[0]) == float(plain[0]) and float(sink[2]) == float(plain[2])
    assert float(sink[1] - plain[1]) == pytest.approx(float(hw.sink_backward(4 * 64 * 4096)), rel=1e-12)


def test_cudnn_attention_probe_exits_cleanly_without_a_gpu(tmp_path):
    """scripts/microbench_cudnn_attention.py needs a CUDA GPU (and the cuDNN frontend): without one it exits 2
    with a message, no traceback and no file (without PyTorch likewise, naming what to install)."""
    import subprocess
    import sys

    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the probe would run")
    except ImportError:
        pass
    out = tmp_path / "sinks.json"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "microbench_cudnn_attention.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr and not out.exists(), r.stderr
    assert "PyTorch" in r.stderr or "no CUDA device" in r.stderr


def test_eager_expert_passes_match_the_h200_measurement():
    """Megatron-Core's eager expert-MLP passes for GPT-OSS (scripts/microbench_expert_eager.py on the H200,
    problems/measurements/h200-expert-eager.json), scored by bench_kernels.py's `expert_eager` class: the
    model's rates `layer.EAGER_EXPERT_MEASURED` are what the file gives at its largest row count
    (`expert_eager_rates`, the counted passes' time on the H200's tables against the measured one); the clamps
    at 16384 rows, which the rates are not taken from, are within 10%; the biases of 16 experts of 1024 rows
    each (64 small kernels) take longer than the model's passes (host-bound, the eager MoE host floor's part),
    as documented."""
    bk = load_script("bench_kernels")
    import optimizer.model.layer as layer
    from optimizer.io.loader import load_named
    from optimizer.schema import System

    data = json.loads((ROOT / "problems" / "measurements" / "h200-expert-eager.json").read_text())
    system = load_named("system", "h200-sxm-141gb", System)
    assert bk.expert_eager_rates(data, system) == layer.EAGER_EXPERT_MEASURED
    rows = dict(bk.expert_eager_errors(data, system))
    assert len(rows) == 6
    assert abs(rows["clamp 16384 rows / 16 experts"]) <= 0.10
    assert rows["bias 16384 rows / 16 experts"] < -0.3


def test_precisions_against_transformer_engine_b300_gemms():
    """Transformer Engine's GEMM profiling tutorial on a B300
    (problems/measurements/b300-te-gemm-precisions.json, a 5B model's layer, inputs pre-quantised), scored by
    bench_kernels.py's `precisions` class: the MXFP8 kernel factor `hardware.BLOCK_SCALED_KERNEL` is what the
    file gives (`block_scaled_kernel`); forward and backward (`Hardware.linear`'s passes), the model's FP8 and
    MXFP8 layer GEMM time relative to BF16 is within 8% of the measured ratio, NVFP4's (whose factor the GB300
    runs fit, not this file) within 20%, the model NVFP4 too fast (-11 to -14.5%)."""
    bk = load_script("bench_kernels")
    from optimizer.io.loader import load_named
    from optimizer.model.hardware import BLOCK_SCALED_KERNEL
    from optimizer.schema import Precision, System

    data = json.loads((ROOT / "problems" / "measurements" / "b300-te-gemm-precisions.json").read_text())
    assert bk.block_scaled_kernel(data) == BLOCK_SCALED_KERNEL[Precision.MXFP8]
    rows = dict(bk.precision_errors(data, load_named("system", "b300-sxm-270gb", System)))
    assert len(rows) == 6
    for name, err in rows.items():
        assert abs(err) <= (0.20 if name.startswith("nvfp4") else 0.08), (name, err)
    assert all(err < 0 for name, err in rows.items() if name.startswith("nvfp4"))


def test_eager_expert_probe_smoke(tmp_path):
    """scripts/microbench_expert_eager.py --small (PyTorch, optional) runs its passes on any device."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = tmp_path / "eager.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "microbench_expert_eager.py"),
            str(out),
            "--small",
            "--repeats",
            "2",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert len(d["rows"]) == 2 and all(
        r[k][t] > 0 for r in d["rows"] for k in ("clamp", "bias") for t in ("fw_s", "fwbw_s")
    )


def test_bench_kernels_refuses_files_it_cannot_score(tmp_path):
    """bench_kernels.py exits 2 with a message (no traceback) on a file that is not JSON, on JSON without a
    table it scores, and on records in another layout (the GPT-OSS block probe's)."""
    import subprocess
    import sys

    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\x00not json")
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    for path in (bad, empty, ROOT / "problems" / "measurements" / "h200-gpt-oss-block.json"):
        r = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), "--measurements", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr and path.name in r.stderr, (path, r.stderr)


def test_ring_attention_probe_smoke(tmp_path):
    """scripts/microbench_ring_attention.py --small (PyTorch, optional) runs the ring's computation on any
    device."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out = tmp_path / "ring.json"
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "microbench_ring_attention.py"),
            str(out),
            "--small",
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["errors"] == [] and [x["cp"] for x in d["rows"]] == [1, 2, 4, 8]
    assert all(x["fwbw_s"] > 0 and x["fw_s"] > 0 and x["kernels_fw_s"] > 0 for x in d["rows"])


def test_ring_attention_probe_computes_exact_causal_attention():
    """What the ring probe times is the real computation: with the K/V chunk pair of rank (r - i) mod cp at
    step i, its steps (causal on the local pair, then all queries against a first half or the second half of
    the queries against all of it) and fp32 log-sum-exp merges give exactly the causal attention of the whole
    sequence on the rank's load-balanced chunks (r and 2cp-1-r), for every rank at cp 1, 2 and 4."""
    torch = pytest.importorskip("torch")
    ring = load_script("microbench_ring_attention")
    torch.manual_seed(0)
    for cp in (1, 2, 4):
        s = 32 * 2 * cp
        q, k, v = (torch.randn(1, 2, s, 16) for _ in range(3))
        full, _ = ring.attn_lse(q, k, v, True, "math")
        for rank in range(cp):
            got = ring.ring_exact(q, k, v, cp, rank)
            assert torch.allclose(got, ring.local_chunks(full, cp, rank), atol=1e-5), (cp, rank)
    # and a wrong schedule is caught: the chunk pairs in the wrong ring direction give another answer
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    ks = [ring.local_chunks(k, 2, (1 + i) % 2) for i in range(2)]
    vs = [ring.local_chunks(v, 2, (1 + i) % 2) for i in range(2)]
    wrong = ring.ring_rank(ring.local_chunks(q, 2, 0), ks, vs, 2, 0, "math")
    full, _ = ring.attn_lse(q, k, v, True, "math")
    assert not torch.allclose(wrong, ring.local_chunks(full, 2, 0), atol=1e-3)


def test_hopper_fp8_factor_is_the_measured_one():
    """The FP8 GEMM factor of the GH100 parts (`matrix_efficiency_scale.fp8`) is measured, not fitted: an FP8
    GEMM's fraction of its peak over a BF16 one's at the same layer shape, the geometric mean over the shipped
    H200 microbenchmarks (`fp8_gemm_scale`, 96 shapes); an H100 80GB's own measurements (beside the project)
    give the same within 0.015. The calibration sequence fits H100's level only."""
    bk = load_script("bench_kernels")
    from optimizer.io.loader import load_named
    from optimizer.schema import Precision, System

    data = json.loads((ROOT / "problems" / "measurements" / "h200-sxm-141gb-microbench.json").read_text())
    h200 = load_named("system", "h200-sxm-141gb", System)
    measured = bk.fp8_gemm_scale(data, h200)
    assert 0.8 < measured < 0.95
    for name in ("h100-sxm-80gb", "h200-sxm-141gb", "h800-sxm-80gb"):
        s = load_named("system", name, System)
        assert s.matrix_efficiency_scale[Precision.FP8] == measured, name
        assert "matrix_efficiency_scale" not in s.calibration.fitted, name
    if MEAS.is_file():
        h100 = load_named("system", "h100-sxm-80gb", System)
        assert abs(bk.fp8_gemm_scale(json.loads(MEAS.read_text()), h100) - measured) <= 0.015
    assert bk.fp8_gemm_scale({"gemm": []}, h200) is None


SUSTAINED = ROOT / "problems" / "measurements"


def test_h200_clock_is_the_measured_sustained_one():
    """The H200's `clock_scale` is measured, not fitted: the steady rate of a layer-sized GEMM, each followed
    by an HBM-bound add, on an H200 against an H100 80GB, both at 700 W (scripts/microbench_sustained.py),
    the geometric mean over BF16 and FP8 and two add sizes. The same GEMMs alone run within machine-to-machine
    spread on both (same die); with the adds the H200 is slower, the more so the more memory traffic: the
    lower clock is the memory's share of the power budget, not the tensor cores."""
    ms = load_script("microbench_sustained")
    from optimizer.io.loader import load_named
    from optimizer.schema import System

    pairs = []
    for tag in ("sustained", "sustained-light"):
        h200 = json.loads((SUSTAINED / f"h200-sxm-141gb-{tag}.json").read_text())
        h100 = json.loads((SUSTAINED / f"h100-sxm-80gb-{tag}.json").read_text())
        assert h200["nvml"]["power_limit_w"] == h100["nvml"]["power_limit_w"] == 700.0
        pairs.append((h200, h100))
    heavy, light = (ms.compare(*p) for p in pairs)
    for dt in ("bf16", "fp8"):
        assert 0.95 < heavy[(dt, "gemm")] < 1.02 and 0.95 < light[(dt, "gemm")] < 1.02
        assert heavy[(dt, "mix")] < light[(dt, "mix")] < 1.0
    measured = ms.clock_scale(pairs)
    system = load_named("system", "h200-sxm-141gb", System)
    assert system.clock_scale == round(measured, 3)
    assert "clock_scale" not in system.calibration.fitted


def test_sustained_compare_needs_like_runs():
    """`compare` divides only runs measured alike (dtype, kind, adds per GEMM) and refuses two GEMM shapes or
    no common `mix` run."""
    ms = load_script("microbench_sustained")

    def doc(rate, adds=1, mnk=(8, 8, 8)):
        runs = [{"dtype": "bf16", "kind": "gemm", "adds_per_gemm": 0, "steady_tflops": 2 * rate}]
        runs.append({"dtype": "bf16", "kind": "mix", "adds_per_gemm": adds, "steady_tflops": rate})
        return {"gemm_mnk": list(mnk), "add_bytes": 3 << 30, "runs": runs}

    r = ms.compare(doc(90.0), doc(100.0))
    assert r == {("bf16", "gemm"): pytest.approx(0.9), ("bf16", "mix"): pytest.approx(0.9)}
    second = (doc(80.0, mnk=(8, 8, 16)), doc(100.0, mnk=(8, 8, 16)))  # a second pair, at its own shape
    assert ms.clock_scale([(doc(90.0), doc(100.0)), second]) == pytest.approx((0.9 * 0.8) ** 0.5)
    with pytest.raises(ValueError, match="shapes"):
        ms.compare(doc(90.0), doc(100.0, mnk=(8, 8, 16)))
    with pytest.raises(ValueError, match="add sizes"):
        ms.compare(doc(90.0), {**doc(100.0), "add_bytes": 3 << 28})
    with pytest.raises(ValueError, match="mix"):
        ms.compare(doc(90.0, adds=2), doc(100.0))


def test_calibrated_gemm_rate_stays_below_the_measured_sustained_one():
    """What a fit may absorb has a physical ceiling: at the layer GEMM of the sustained measurements, the
    H100's fitted tables (and the H200's, which take them) price a rate below every steady rate a real GPU
    holds at its power limit, alone or between memory-bound kernels, BF16 and FP8; and within 25% of the
    rate of the GEMM alone, the part a training step's launch gaps and communication kernels take. (The
    H200's clock itself is `test_h200_clock_is_the_measured_sustained_one`'s.)"""
    from optimizer.io.loader import load_named
    from optimizer.model.hardware import Hardware
    from optimizer.schema import Precision, System

    for name in ("h100-sxm-80gb", "h200-sxm-141gb"):
        system = load_named("system", name, System)
        for tag in ("sustained", "sustained-light"):
            data = json.loads((SUSTAINED / f"{name}-{tag}.json").read_text())
            m, n, k = data["gemm_mnk"]
            for run in data["runs"]:
                fp8 = run["dtype"] == "fp8"
                hw = Hardware(system, Precision.FP8 if fp8 else Precision.BF16)
                t = float(hw.gemm(m, n, k, in_bytes=1 if fp8 else 2, out_bytes=2))
                ratio = 2.0 * m * n * k / t / 1e12 / run["steady_tflops"]
                assert ratio < 1.0, (name, tag, run["dtype"], run["kind"], ratio)
                if run["kind"] == "gemm":
                    assert ratio > 0.75, (name, tag, run["dtype"], ratio)


def test_sustained_compare_cli_answers_or_exits_2(tmp_path):
    """`microbench_sustained.py --compare` needs no GPU or PyTorch: it prints the shipped pairs' clock, and
    exits 2 naming the problem, without a traceback, for a wrong argument count, a missing or non-JSON file,
    another script's output, or two files measured unlike."""
    from helpers import run_script_without_torch

    from optimizer.io.loader import load_named
    from optimizer.schema import System

    def run(*args):
        return run_script_without_torch("microbench_sustained.py", "--compare", *args, timeout=60)

    pairs = [
        str(SUSTAINED / f"{part}-{tag}.json")
        for tag in ("sustained", "sustained-light")
        for part in ("h200-sxm-141gb", "h100-sxm-80gb")
    ]
    ok = run(*pairs)
    assert ok.returncode == 0, ok.stderr
    stated = load_named("system", "h200-sxm-141gb", System).clock_scale  # = the files' (the test above)
    assert f"clock_scale (geometric mean of the mix ratios): {stated:.3f}" in ok.stdout
    not_json = tmp_path / "notes.json"
    not_json.write_text("not json")
    other = ROOT / "problems" / "measurements" / "h200-ring-attention.json"
    for args in ([pairs[0]], ["missing.json", pairs[1]], [str(not_json), pairs[1]], [str(other), pairs[1]]):
        r = run(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip(), (args, r.stderr)
    unlike = run(pairs[0], pairs[3])  # 1 GiB adds against 256 MiB adds
    assert unlike.returncode == 2 and "different add sizes" in unlike.stderr
