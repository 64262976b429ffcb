"""The PyTorch FSDP stack (MosaicML Composer / llm-foundry) on its published runs: the importer of
llm-foundry's throughput tables (scripts/import_llmfoundry.py -> problems/runs/llmfoundry-mpt.yaml),
FlashAttention's Triton kernel, and the runs themselves (every one scored and fitting, held-out accuracy)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT, library_system, load_script

from optimizer.io.runs import load_runs, map_run
from optimizer.model.hardware import TRITON_FA2_SLOWDOWN, Hardware
from optimizer.schema import Precision

RUNS = ROOT / "problems" / "runs" / "llmfoundry-mpt.yaml"
HEADER = (
    "|  Model | SeqLen (T) | # GPUs | GPU | MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
    "GlobalBatchSize | Throughput (S/s) | Throughput (T/s) | Throughput (T/s/GPU) | GlobalBatchSize (T) | "
    "Precision | MP Mode | Sharding Strategy | Activation Checkpointing | Activation CPUOffload | NumParams |"
)


def _row(*cells) -> str:
    return "|  " + " | ".join(str(c) for c in cells) + " |"


def test_mpt_shapes_give_the_tables_parameter_counts():
    """vocab x d + max_seq_len x d (learned positions) + L (12 d^2 + 13 d) + 2 d, by hand for MPT-7B at 2048
    tokens: 50368*4096 + 2048*4096 + 32*(12*4096^2 + 13*4096) + 2*4096 = 6,658,859,008 (the table's
    NumParams); at 1024 tokens 1024*4096 fewer."""
    imp = load_script("import_llmfoundry")
    assert imp.n_params("7b", 2048) == 206307328 + 8388608 + 32 * (201326592 + 53248) + 8192 == 6658859008
    assert imp.n_params("7b", 2048) - imp.n_params("7b", 1024) == 1024 * 4096


def test_importer_turns_a_table_row_into_a_run(tmp_path):
    """One BF16 row and one PURE-bf16 row: shapes from the yaml table, FSDP full shard over all GPUs, the
    micro-batch and global batch of the row, and the step time from the throughput (global batch x seq_len /
    tokens per second); a row whose NumParams contradicts the shape stops the script."""
    imp = load_script("import_llmfoundry")
    readme = tmp_path / "README.md"
    readme.write_text(
        "\n".join(
            [
                "## H100 80GB BF16",
                HEADER,
                "|  --- " * 20 + "|",
                _row(
                    "1b",
                    2048,
                    16,
                    "h100_80gb",
                    42.36,
                    42.36,
                    "4.191080E+14",
                    20,
                    1,
                    320,
                    359,
                    736596,
                    46037,
                    655360,
                    "amp_bf16",
                    "DEFAULT",
                    "FULL_SHARD",
                    "False",
                    "False",
                    1315950592,
                ),
                "## A100 40GB with 1600 Gbps node-node interconnect (RoCE)",
                HEADER,
                "|  --- " * 20 + "|",
                _row(
                    "13b",
                    8192,
                    8,
                    "a100_40gb",
                    43.95,
                    58.6,
                    "1.371240E+16",
                    1,
                    16,
                    128,
                    1,
                    11258,
                    1407,
                    1048576,
                    "bf16",
                    "PURE",
                    "FULL_SHARD",
                    "True",
                    "False",
                    12885411840,
                ),
            ]
        )
    )
    out = tmp_path / "runs.yaml"
    assert imp.main([str(readme), "--out", str(out)]) == 0
    runs = {r["id"]: r for r in load_runs(str(out)).data}
    a = runs["llmfoundry-mpt1b-h10080gb-16gpu-seq2048"]
    assert a["model"]["hidden"] == 2048 and a["model"]["heads"] == 16 and a["model"]["ffn"] == 8192
    assert a["parallel"]["dp"] == 16 and a["parallel"]["optimizer_sharding"] == "zero3"
    assert a["parallel"]["recompute"] == "none" and a["parallel"]["micro_batch"] == 20
    assert a["measured"]["derived_step_time_s"] == pytest.approx(320 * 2048 / 736596, abs=1e-4)
    b = runs["llmfoundry-mpt13b-a10040gb-8gpu-seq8192"]
    assert b["parallel"]["recompute"] == "full" and b["hardware"]["gpu"] == "a100-sxm-40gb"
    mb = map_run(b)
    assert mb.problem.stack.value == "fsdp" and mb.problem.execution.attention.value == "flash-triton"
    assert mb.problem.training.grad_precision.value == "bf16"  # FSDP mixed_precision PURE: bf16 reduction
    assert map_run(a).problem.training.grad_precision.value == "fp32"  # DEFAULT: fp32 reduction
    readme.write_text(readme.read_text().replace("1315950592", "1315950593"))
    with pytest.raises(SystemExit):
        imp.main([str(readme), "--out", str(out)])


def test_triton_flash_attention_runs_at_the_fa2_class_efficiency_divided_by_the_published_ratio():
    """FlashAttention-2 is 1.3-2.5x faster than FlashAttention in Triton (Dao 2023, Sec. 4.1): a compute-bound
    Triton kernel takes sqrt(1.3 x 2.5) = 1.80x the FlashAttention-2 class kernel's time, on H100 (whose
    FlashAttention-2 class has its own efficiency) and on A100 (where it is the GPU's best kernel)."""
    assert TRITON_FA2_SLOWDOWN == pytest.approx(1.8028, abs=1e-4)
    for name in ("h100-sxm-80gb", "a100-sxm-80gb"):
        hw = Hardware(library_system(name), Precision.BF16)
        flops, nbytes = 1e13, 1e6
        fa2 = float(
            hw.attention_kernel(flops, nbytes, fa2=True)
        )  # long-sequence efficiency: no per-tile term,
        tri = float(hw.attention_kernel(flops, nbytes, triton=True))  # which each kernel has its own of
        assert tri / fa2 == pytest.approx(TRITON_FA2_SLOWDOWN, rel=1e-9)


@pytest.fixture(scope="module")
def scored():
    from optimizer.drivers.validate import score_runs

    return score_runs(str(RUNS)).as_dict()


def test_every_llmfoundry_run_is_scored_and_fits(scored):
    """200 runs (MPT 125M-70B, 512-65536 tokens, 8-128 GPUs): every one scored, none judged "does not fit"
    (with llm-foundry's fused cross-entropy the logits stay bf16; an fp32 loss would put 68 of them over their
    HBM)."""
    s = scored["summary"]
    assert s["n_scored"] == 200 and s["n_not_fitting"] == 0
    assert all(r["stack"] == "fsdp" for r in scored["runs"])


def test_held_out_gpus(scored):
    """No value is fitted on this file's A100 40GB runs nor on its H100 runs: the 40GB part takes the 80GB
    part's tables as they are (same die at the same 400 W; its slower HBM is in the model, in memory-bound
    kernels and in the attention tiles' fixed traffic), the H100 runs take H100's Megatron-Core fit and the
    derived Triton-kernel overhead. Both are predictions of runs no fit saw: A100 40GB <= 8% (measured
    5.7%, +1.6% signed), H100 <= 6% (measured 3.7%, -1.8%), signed means within 5%."""
    err = {}
    for r in scored["runs"]:
        gpu = r["id"].split("-")[2]
        err.setdefault(gpu, []).append(r["error_pct"])
    assert len(err["a10040gb"]) == 78 and np.mean(np.abs(err["a10040gb"])) <= 8.0
    assert len(err["h10080gb"]) == 62 and np.mean(np.abs(err["h10080gb"])) <= 6.0
    assert abs(np.mean(err["a10040gb"])) <= 5.0 and abs(np.mean(err["h10080gb"])) <= 5.0


def _grid_leave_one_out(gpu: str, grid: list[dict]) -> list[float]:
    """The held-out errors of the file's runs on `gpu` (`helpers.grid_leave_one_out`)."""
    from tests.helpers import grid_leave_one_out

    return grid_leave_one_out(
        [r for r in load_runs(str(RUNS)).data if r["hardware"]["gpu"] == gpu], library_system(gpu), grid
    )


def test_triton_overhead_is_derived_not_fitted_on_the_h100_runs(scored):
    """No value of H100's is fitted on these runs: the Triton kernel's per-tile overhead is derived from the
    reference's fixed time per tile at H100's FlashAttention-2-class rate (3155 keys x 0.34 / 0.65 = 1650),
    so the 62 H100 runs are predicted by a model that never saw them: mean |error| <= 6%, signed within
    3% (measured 3.7% and -1.8%). Stating cuDNN's reference 3155 keys for the Triton kernel instead (the
    overhead of another kernel family's rate) leaves them >= 2 points worse."""
    h100 = [r["error_pct"] for r in scored["runs"] if "-h10080gb-" in r["id"]]
    assert len(h100) == 62 and np.mean(np.abs(h100)) <= 6.0 and abs(np.mean(h100)) <= 3.0
    as_cudnn = _grid_leave_one_out("h100-sxm-80gb", [{"attention_overhead_keys_triton": 3155.0}])
    assert np.mean(np.abs(as_cudnn)) >= np.mean(np.abs(h100)) + 2.0


@pytest.mark.slow
def test_a_fitted_clock_buys_nothing_on_the_a100_40gb_runs():
    """The 40GB part once fitted a sustained clock on its own 78 runs (0.96) to make up for what the model
    did not know about its slower HBM. With the attention tiles' fixed traffic at its own bandwidth, a clock
    chosen on a grid for all runs but one, that one predicted with it, is no better than the rated clock
    (measured 5.67% against 5.67%: the grid picks 1.0 for every run), so none is fitted."""
    grid = [{"clock_scale": c} for c in (0.92, 0.94, 0.96, 0.98, 1.0)]
    held = _grid_leave_one_out("a100-sxm-40gb", grid)
    as_is = _grid_leave_one_out("a100-sxm-40gb", [{"clock_scale": 1.0}])
    assert len(held) == 78 and np.mean(np.abs(held)) >= np.mean(np.abs(as_is)) - 0.5


@pytest.mark.slow
def test_attention_fit_leave_one_out_on_the_a100_80gb_runs():
    """Leave-one-out, not in-sample: A100's fused-attention efficiency, the one value scripts/calibrate.py
    --stack fsdp fits on these runs (the per-tile overhead follows from it), chosen on a grid for all runs
    but one, that one predicted with it. Mean |held-out error| <= 7% over the 60 A100 80GB runs of the
    file (measured 6.3%)."""
    grid = [{"attention_efficiency": e} for e in (0.52, 0.57, 0.62, 0.67, 0.72)]
    held = _grid_leave_one_out("a100-sxm-80gb", grid)
    assert len(held) == 60 and np.mean(np.abs(held)) <= 7.0


def test_stated_uncertainty_of_a_stack_is_its_own_leave_one_out_where_measured():
    """A system whose runs of a stack were held out one at a time states that stack's error for its plans;
    other stacks keep the overall figure (or the widened one when no run of theirs was fitted)."""
    from optimizer.schema.system import Calibration

    c = Calibration(
        runs=["a", "b"],
        fitted=["matrix_efficiency"],
        stacks={"megatron-core": 1, "fsdp": 1},
        loo_mape_pct=3.3,
        loo_mape_pct_by_stack={"fsdp": 5.1},
    )
    assert c.band_pct("fsdp") == 5.1 and c.band_pct("megatron-core") == 3.3 and c.band_pct() == 3.3
    assert "fsdp 5.1%" in c.summary()
