"""scripts/crossval.py: the source groups of the public runs and one held-out group end to end (skipped when
../shared/calibration is absent)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from helpers import CALIBRATION, ROOT, load_script

calibration_sequence = load_script("calibration_sequence")
crossval = load_script("crossval")

pytestmark = pytest.mark.skipif(
    not CALIBRATION.is_file(), reason=f"calibration data not present at {CALIBRATION}"
)


def test_every_public_run_has_a_named_group():
    runs = crossval.public_runs()
    assert len(runs) > 300
    named = {g for _, g, _, _ in crossval.GROUPS}
    assert len(named) == len(crossval.GROUPS)  # one entry per group
    groups = {r["id"]: crossval.group_of(r["source"]) for _, r in runs}
    assert set(groups.values()) <= named
    assert all(crossval.DATES[g] for g in groups.values())


@pytest.mark.parametrize(
    "source, group",
    [
        ("Narayanan et al. 2021 (SC21, Megatron-LM PTD-P), Table 1", "narayanan-2021"),
        ("Korthikanti et al. 2022, Sec. 6.3 text after Table 5", "korthikanti-2022"),
        (
            (
                "MosaicML llm-foundry scripts/train/benchmarking/README.md @061f2c7 (2023-10-17), "
                "section 'H100 80GB FP8', row 1"
            ),
            "llm-foundry-061f2c7",
        ),
        (
            (
                "NVIDIA NeMo Framework user guide, performance summary (docs.nvidia.com/...), "
                "'Pre-training', Container NeMo 25.04, System DGX-GB200 table"
            ),
            "nemo-25.04",
        ),
        (
            (
                "NVIDIA Megatron-Bridge performance summary archive "
                "(docs/performance-summary-archive.md @067f987), "
                "'26.04.01 NeMo Container' pre-training table, model DeepSeekV3"
            ),
            "megatron-bridge-26.04.01",
        ),
        (
            (
                "NVIDIA Megatron-Bridge performance summary, 25.11 NeMo Container, Pre-Training, "
                "System DGX-H100, row LLAMA3_70B (FP8-CS)"
            ),
            "megatron-bridge-25.11",
        ),
        (
            "NVIDIA dgxc-benchmarking llama3.1/README_8b.md @143b90d, FP8 performance table",
            "dgxc-benchmarking-24.11",
        ),
    ],
)
def test_known_sources(source, group):
    assert crossval.group_of(source) == group


def test_unknown_source_is_an_error():
    with pytest.raises(ValueError, match="no group"):
        crossval.group_of("a blog post")


def test_sequence_names_existing_systems_and_files():
    systems = {p.stem for p in (ROOT / "problems" / "systems").glob("*.yaml")}
    for step in calibration_sequence.SEQUENCE:
        assert {step.gpu, *step.writes, *step.reads} <= systems
        assert set(step.runs) <= set(calibration_sequence.RUN_FILES)


def test_sequence_commands():
    h100 = calibration_sequence.SEQUENCE[3]
    files = {k: calibration_sequence.Path(k) for k in calibration_sequence.RUN_FILES}
    assert calibration_sequence.argv(h100, files) == [
        "public",
        "public_2025",
        "--gpu",
        "h100-sxm-80gb",
        "--params",
        "level",
        "--shape",
        "h100-sxm-80gb",
        "--write",
    ]
    assert calibration_sequence.argv(calibration_sequence.SEQUENCE[2]) == [
        "--gpu",
        "a100-sxm-80gb",
        "--transfer",
        "a100-sxm-40gb",
        "a100-sxm-80gb-opa",
    ]


def test_priors():
    assert crossval.prior_value("clock_scale") is None  # derived from the power cap where none is fitted
    assert crossval.prior_value("level") == 0.6  # calibrate.py's fixed start
    assert crossval.prior_value("attention_overhead_keys_triton") is None  # derived from the tile time
    assert crossval.prior_value("attention_efficiency") == 0.6  # the schema's


@pytest.mark.slow
def test_quick_returns_the_json_shape():
    systems = {p.name: p.read_bytes() for p in (ROOT / "problems" / "systems").glob("*.yaml")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "crossval.py"), "--quick", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    d = json.loads(out.stdout)
    for key in ("mape_pct", "max_abs_error_pct", "mean_signed_error_pct"):
        assert math.isfinite(d[key])
    assert d["n_runs"] > 0
    for table in ("groups", "by_stack", "by_gpu"):
        assert d[table]
        for st in d[table].values():
            assert (
                st["n"] > 0 and math.isfinite(st["mape_pct"]) and math.isfinite(st["mean_signed_error_pct"])
            )
    assert list(d["groups"]) == [crossval.QUICK_GROUP]
    assert all(r["calibration"] in ("fitted", "prior") for r in d["runs"])
    assert systems == {p.name: p.read_bytes() for p in (ROOT / "problems" / "systems").glob("*.yaml")}


def test_host_floor_refitted_without_the_held_out_runs():
    """Each fold's MoE host floor is the grid value that fits the runs it keeps best: a held-out run that
    alone pulls the fit elsewhere does not set it, and the value is set only while the fold runs."""
    import numpy as np

    import optimizer.model.layer as layer

    fit = crossval.HostFit.__new__(crossval.HostFit)  # the grid without computing it
    fit.ids = ["a", "b", "c"]
    fit.grid_s = np.array([0.004, 0.005, 0.006])
    # rows: grid values; columns: runs' signed errors. a and b are right at 5 ms, c only at 6 ms
    fit.err = np.array([[-10.0, -8.0, -30.0], [0.0, 1.0, -20.0], [9.0, 11.0, 0.0]])
    assert fit.without([]) == 0.006  # mean |error| 16.0, 7.0 and 6.7: c pulls the fit of all three to 6 ms
    assert fit.without([{"id": "c"}]) == 0.005  # held out, it does not set its own fold's value
    assert fit.without([{"id": "a"}, {"id": "b"}]) == 0.006
    saved = layer.MOE_HOST_FW_S
    with crossval.host_floor(0.006):
        assert layer.MOE_HOST_FW_S == 0.006
    assert layer.MOE_HOST_FW_S == saved
    with crossval.host_floor(None):
        assert layer.MOE_HOST_FW_S == saved


def test_each_fold_refits_and_predicts_with_its_own_host_floor(monkeypatch):
    """evaluate_fold sets the floor its kept runs fit (HostFit.without its held-out runs) for both the
    sequence's replay and the prediction of the held-out runs, and restores it after."""
    import numpy as np

    import optimizer.model.layer as layer

    fit = crossval.HostFit.__new__(crossval.HostFit)
    fit.ids, fit.grid_s = ["a", "b"], np.array([0.004, 0.006])
    fit.err = np.array([[0.0, -20.0], [15.0, 0.0]])  # a fits 4 ms, b 6 ms
    seen = {}

    def refit(held, library, tmp, maxiter):
        seen["refit"] = layer.MOE_HOST_FW_S
        return [], set()

    def predict_held(held, tmp, prior):
        seen["predict"] = layer.MOE_HOST_FW_S
        return [{"id": r["id"], "status": "ok", "error_pct": 1.0} for r in held]

    monkeypatch.setattr(crossval, "refit", refit)
    monkeypatch.setattr(crossval, "predict_held", predict_held)
    saved = layer.MOE_HOST_FW_S
    for held, kept_fit in (("a", 0.006), ("b", 0.004)):
        crossval.evaluate_fold([{"id": held}], held, crossval.SHIPPED, host=fit)
        assert seen == {"refit": kept_fit, "predict": kept_fit}
        assert layer.MOE_HOST_FW_S == saved
