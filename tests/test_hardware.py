"""New hardware (Blackwell, NVL72 racks, AMD MI3xx), the runs mapping by the systems' `gpu:` field, the
MXFP8/NVFP4 datatypes and the calibration status of each system."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from optimizer.io.loader import find_in_library, read_yaml, validate_model
from optimizer.io.runs import gpu_systems, map_run
from optimizer.model.hardware import BYTES, QUANTIZED, Hardware
from optimizer.schema import Precision, System

NEW = [
    "b200-sxm-180gb",
    "b300-sxm-270gb",
    "gb200-nvl72",
    "gb300-nvl72",
    "h200-sxm-141gb",
    "mi300x",
    "mi325x",
    "mi355x",
]


def system(name: str) -> System:
    return validate_model(System, read_yaml(find_in_library("system", name)))


@pytest.mark.parametrize("name", NEW)
def test_new_systems_load_and_state_their_calibration(name):
    s = system(name)
    assert s.name == name and s.gpu == name
    assert s.calibration.status() in {"calibrated", "transferred", "prior"}
    assert s.calibration.summary()
    # datasheet sanity: FP8 peak is twice the BF16 peak on every one of these parts
    assert s.matrix_tflops[Precision.FP8] == pytest.approx(2 * s.matrix_tflops[Precision.BF16], rel=1e-3)


def test_nvl72_racks_have_a_72_gpu_nvlink_tier_over_4_gpu_trays():
    for name in ("gb200-nvl72", "gb300-nvl72"):
        s = system(name)
        assert s.gpus_per_node == 4
        assert s.networks[0].size == 72 and not s.networks[0].must_fill
        assert s.networks[0].used == 64  # the published runs use 64 of each rack's 72 GPUs
        assert s.networks[1].size > 72
    with pytest.raises(ValueError, match=r"gpus_used \(80\) exceeds the domain's size \(72\)"):
        s.networks[0].model_validate({**s.networks[0].model_dump(), "gpus_used": 80})


def test_h200_is_transferred_from_h100_and_its_hbm_prior_is_not_called_fitted():
    cal = system("h200-sxm-141gb").calibration
    assert cal.status() == "transferred" and cal.transferred_from == "h100-sxm-80gb"
    assert cal.runs == system("h100-sxm-80gb").calibration.runs
    assert "hbm_efficiency" not in cal.fitted  # H100's HBM table is a prior: nothing to transfer
    text = find_in_library("system", "h200-sxm-141gb").read_text()
    hbm_line = next(line for line in text.splitlines() if line.startswith("hbm_efficiency"))
    assert "prior" in hbm_line and "transferred" not in hbm_line


def test_runs_mapping_reads_gpu_field(tmp_path, monkeypatch):
    (tmp_path / "systems").mkdir()
    doc = find_in_library("system", "b200-sxm-180gb").read_text()
    # a system file whose name differs from its GPU: the mapping must go through `gpu:`
    doc = doc.replace("name: b200-sxm-180gb", "name: my-blackwell-node").replace(
        "gpu: b200-sxm-180gb", "gpu: test-gpu-x"
    )
    (tmp_path / "systems" / "my-blackwell-node.yaml").write_text(doc)
    monkeypatch.setenv("PARAPLAN_LIBRARY", str(tmp_path))
    known = gpu_systems()
    assert known["test-gpu-x"] == "my-blackwell-node"
    run = {
        "id": "r",
        "source": "Test 2025",
        "tier": "B",
        "notes": None,
        "model": {
            "hidden": 1024,
            "ffn": 4096,
            "layers": 8,
            "heads": 16,
            "kv_heads": 16,
            "head_dim": 64,
            "seq_len": 2048,
            "vocab": 51200,
            "mlp": "gelu",
            "moe": None,
        },
        "hardware": {"gpu": "test-gpu-x", "num_gpus": 8, "gpus_per_node": 8},
        "parallel": {
            "tp": 1,
            "pp": 1,
            "dp": 8,
            "cp": 1,
            "ep": 1,
            "vpp": 1,
            "sequence_parallel": False,
            "micro_batch": 1,
            "global_batch": 64,
            "recompute": "full",
            "optimizer_sharding": None,
            "precision": "bf16",
        },
        "measured": {"step_time_s": 1.0},
    }
    m = map_run(run)
    assert m.skip is None and m.problem.system.name == "my-blackwell-node"
    unknown = map_run({**run, "hardware": {**run["hardware"], "gpu": "no-such-gpu"}})
    assert unknown.skip.startswith("no system file for gpu 'no-such-gpu'")
    assert "test-gpu-x" in unknown.skip and "gb300-nvl72" in unknown.skip  # lists the known ones
    # the table is read once per state of the library's files: a changed file is read again
    f = tmp_path / "systems" / "my-blackwell-node.yaml"
    f.write_text(doc.replace("gpu: test-gpu-x", "gpu: test-gpu-y") + "\n# changed\n")
    known = gpu_systems()
    assert known.get("test-gpu-y") == "my-blackwell-node" and "test-gpu-x" not in known


def test_every_gpu_of_the_2025_runs_has_a_system():
    known = gpu_systems()
    for gpu in ("b200-sxm-180gb", "b300-sxm-270gb", "gb200-nvl72", "gb300-nvl72", "h100-sxm-80gb"):
        assert gpu in known


def test_microscaled_operand_bytes_hand_worked():
    # MXFP8: 32 elements take 32 bytes + 1 E8M0 scale byte = 33/32 bytes each
    assert BYTES[Precision.MXFP8] == pytest.approx(33 / 32)
    # NVFP4: 16 elements take 8 bytes + 1 E4M3 scale byte = 9/16 bytes each
    assert BYTES[Precision.NVFP4] == pytest.approx(9 / 16)
    assert {
        Precision.FP8,
        Precision.FP8_CURRENT,
        Precision.FP8_BLOCK,
        Precision.MXFP8,
        Precision.NVFP4,
    } == set(QUANTIZED)


def test_microscaled_peaks_and_16_bit_attention():
    gb300 = system("gb300-nvl72")
    hw = Hardware(gb300, Precision.NVFP4)
    assert hw.matrix_peak == pytest.approx(15000e12)  # 1,080 PF dense FP4 / 72 GPUs
    assert hw.attention_peak == pytest.approx(2500e12)  # flash attention stays BF16
    hw8 = Hardware(system("gb200-nvl72"), Precision.MXFP8)
    assert hw8.matrix_peak == pytest.approx(5000e12)  # 720 PF sparse FP8 / 72 / 2
    with pytest.raises(ValueError, match="no nvfp4"):
        Hardware(system("mi355x"), Precision.NVFP4)  # AMD has MXFP4, not NVFP4


@pytest.fixture
def calibrate(tmp_path, monkeypatch):
    """scripts/calibrate.py as a module, over a copy of the shipped systems (PARAPLAN_LIBRARY points at
    it)."""
    from tests.helpers import load_script

    lib = tmp_path / "lib"
    shutil.copytree(Path(find_in_library("system", "h100-sxm-80gb")).parent, lib / "systems")
    monkeypatch.setenv("PARAPLAN_LIBRARY", str(lib))
    return load_script("calibrate"), lib


def test_calibrate_transfer_takes_no_runs_files_and_a_fit_requires_them(calibrate, monkeypatch):
    """`calibrate.py --gpu SRC --transfer DST` copies SRC's fitted tables without reading any run; a fit
    without runs files is a usage error (exit 2), not a traceback."""
    import sys

    cal, lib = calibrate
    monkeypatch.setattr(sys, "argv", ["calibrate.py", "--gpu", "gb300-nvl72", "--transfer", "b300-sxm-270gb"])
    assert cal.main() == 0
    b300 = validate_model(System, read_yaml(lib / "systems" / "b300-sxm-270gb.yaml"))
    assert b300.calibration.transferred_from == "gb300-nvl72"
    monkeypatch.setattr(sys, "argv", ["calibrate.py", "--gpu", "b300-sxm-270gb", "--params", "clock_scale"])
    with pytest.raises(SystemExit) as exc:
        cal.main()
    assert exc.value.code == 2


def test_calibrate_transfer_writes_transferred_from(calibrate):
    cal, lib = calibrate
    target = lib / "systems" / "mi325x.yaml"  # any prior-only file shows the mechanics (not a same-die pair)
    before = validate_model(System, read_yaml(target))
    assert before.calibration.status() == "prior"
    assert cal.transfer("h100-sxm-80gb", ["mi325x"], lib) == 0
    after = validate_model(System, read_yaml(target))
    src = validate_model(System, read_yaml(lib / "systems" / "h100-sxm-80gb.yaml"))
    assert after.calibration.transferred_from == "h100-sxm-80gb"
    assert after.calibration.status() == "transferred"
    assert after.calibration.runs == src.calibration.runs
    # H100's FP8 factor is measured, not copied as fitted; its MaxText factor is fitted and goes along
    assert set(after.calibration.fitted) == {"matrix_efficiency", "stack_matrix_scale"}
    assert after.matrix_efficiency == src.matrix_efficiency
    assert after.stack_matrix_scale == src.stack_matrix_scale and src.stack_matrix_scale
    assert after.hbm_efficiency == before.hbm_efficiency  # H100's HBM table is a prior: not copied
    assert after.matrix_tflops == before.matrix_tflops  # datasheet peaks stay the target's
    text = target.read_text()
    assert "transferred from h100-sxm-80gb" in text
    assert "hbm_efficiency" in text and "not calibrated" in text.split("hbm_efficiency", 1)[1].splitlines()[0]


def _set_line(path: Path, key: str, text: str) -> None:
    """Rewrite the top-level `key: ...` line of a system file."""
    import re

    path.write_text(re.sub(rf"^{key}: .*$", f"{key}: {text}", path.read_text(), flags=re.M))


def test_transfer_of_a_prior_replaces_a_stale_value_and_keeps_a_reasoned_one(calibrate):
    """Where the source's value is a prior, a target value a transfer wrote (labelled 'transferred from' or
    'prior, not calibrated (not fitted on ...') takes the source's prior; a target's own prior, with its
    reason, stays."""
    cal, lib = calibrate
    src, dst = lib / "systems" / "gb300-nvl72.yaml", lib / "systems" / "b300-sxm-270gb.yaml"
    prior = "[[0.1, 0.35], [1, 0.6], [10, 0.8], [100, 0.88], [1000, 0.9]]"
    _set_line(src, "hbm_efficiency", f"{prior}  # prior, not calibrated")
    stale = "[[0.1, 0.3], [1, 0.5], [10, 0.7], [100, 0.8], [1000, 0.85]]"
    _set_line(dst, "hbm_efficiency", f"{stale}  # prior, not calibrated (not fitted on gb300-nvl72 either)")
    _set_line(dst, "attention_efficiency", "0.7  # prior: its own reason")
    assert cal.transfer("gb300-nvl72", ["b300-sxm-270gb"], lib) == 0
    after = validate_model(System, read_yaml(dst))
    assert after.hbm_efficiency == validate_model(System, read_yaml(src)).hbm_efficiency
    assert after.attention_efficiency == 0.7 and "its own reason" in dst.read_text()


def test_transfer_of_a_measured_value_says_so(calibrate):
    """A value measured at the source (its comment starts 'measured') reaches a same-die target labelled as
    measured there, not fitted, and not listed among the fields fitted."""
    cal, lib = calibrate
    src, dst = lib / "systems" / "gb300-nvl72.yaml", lib / "systems" / "b300-sxm-270gb.yaml"
    _set_line(src, "matrix_efficiency_scale", "{fp8: 0.9, nvfp4: 0.7}  # measured: a GEMM table")
    _set_line(dst, "matrix_efficiency_scale", "{fp8: 1.0}  # transferred from gb300-nvl72 (same GPU die)")
    assert cal.transfer("gb300-nvl72", ["b300-sxm-270gb"], lib) == 0
    after = validate_model(System, read_yaml(dst))
    assert after.matrix_efficiency_scale == validate_model(System, read_yaml(src)).matrix_efficiency_scale
    assert "# measured on the same die (gb300-nvl72), not fitted" in dst.read_text()
    assert "matrix_efficiency_scale" not in after.calibration.fitted
    # the same value under the other label is relabelled, both ways
    _set_line(
        dst, "matrix_efficiency_scale", "{fp8: 0.9, nvfp4: 0.7}  # prior, not calibrated (not fitted on x)"
    )
    assert cal.transfer("gb300-nvl72", ["b300-sxm-270gb"], lib) == 0
    assert "# measured on the same die (gb300-nvl72), not fitted" in dst.read_text()
    _set_line(src, "matrix_efficiency_scale", "{fp8: 0.9, nvfp4: 0.7}  # prior, not calibrated")
    assert cal.transfer("gb300-nvl72", ["b300-sxm-270gb"], lib) == 0
    assert "# prior, not calibrated (not fitted on gb300-nvl72 either)" in dst.read_text()


def test_calibrate_write_loo_sets_only_the_band_and_transfer_carries_it(calibrate):
    cal, lib = calibrate
    path = lib / "systems" / "h100-sxm-80gb.yaml"
    before = validate_model(System, read_yaml(path))
    cal.write_loo(path, 4.25, 8, "e1,e2,e3,fp8_scale")
    cal.write_loo(path, 4.5, 8, "e1,e2,e3,fp8_scale")  # a re-run replaces the line
    after = validate_model(System, read_yaml(path))
    assert after.calibration.loo_mape_pct == 4.5 and after.calibration.band_pct() == 4.5
    assert path.read_text().count("  loo_mape_pct:") == 1
    # a stack's own figure (here FSDP runs no fit used) is its own line; the overall one stays
    cal.write_loo(path, 8.6, 62, "", stack="fsdp")
    after = validate_model(System, read_yaml(path))
    assert after.calibration.loo_mape_pct_by_stack == {"fsdp": 8.6} and after.calibration.loo_mape_pct == 4.5
    assert after.calibration.band_pct("fsdp") == 8.6 and after.calibration.band_pct("megatron-core") == 4.5
    assert "held out whole" in path.read_text()
    assert after.model_dump(exclude={"calibration"}) == before.model_dump(exclude={"calibration"})
    assert after.calibration.runs == before.calibration.runs
    assert "leave-one-out step-time error 4.5%" in after.calibration.summary()
    assert cal.transfer("h100-sxm-80gb", ["h200-sxm-141gb"], lib) == 0
    h200 = validate_model(System, read_yaml(lib / "systems" / "h200-sxm-141gb.yaml"))
    assert h200.calibration.loo_mape_pct == 4.5 and h200.calibration.status() == "transferred"
    assert h200.calibration.loo_mape_pct_by_stack == {"fsdp": 8.6}
    assert h200.calibration.stacks == after.calibration.stacks == before.calibration.stacks  # stacks travel


RUNS_2025 = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "public_runs_2025.yaml"


@pytest.mark.skipif(not RUNS_2025.is_file(), reason="calibration data not present")
def test_model_orders_precisions_as_measured():
    """MXFP8/NVFP4 runs are scored and `paraplan validate` reports how the model orders each (model, GPU)'s
    precisions against the published throughputs: NVFP4 fastest, then FP8 (per-tensor), then MXFP8, on Llama 3
    70B and Llama 3.1 405B (GB200, GB300): 4 of 4 groups since MXFP8 GEMMs run at the block-scaled kernel
    factor measured on a B300 (`hardware.BLOCK_SCALED_KERNEL`, 0.951 of per-tensor FP8) and its
    output-gradient gathers carry both copies (2 of 4 before: the 405B FP8 runs, 6.7-7.4% faster than the
    MXFP8 ones on both racks, were put the other way while the fits' MXFP8 factor sat at its bound; 3 of 4
    before the block-scaled formats' sequence-parallel all-gathers were priced in their quantised bytes, 4 of
    4 before GB300's refit with the all-to-all dispatcher's sort, 2 of 4 while the LM head was priced at the
    FP8 peak)."""
    from optimizer.drivers.validate import score_runs

    po = score_runs(str(RUNS_2025)).as_dict()["summary"]["precision_order"]
    assert po["n_groups"] == 4  # llama3-70b and llama3.1-405b, each on GB200 and GB300, in fp8/mxfp8/nvfp4
    assert all(set(g["measured"]) == {"fp8", "mxfp8", "nvfp4"} for g in po["groups"])
    assert all(g["measured"] == ["nvfp4", "fp8", "mxfp8"] for g in po["groups"])
    assert po["n_ordered"] == 4 and all(g["ordered"] for g in po["groups"])


@pytest.mark.skipif(not RUNS_2025.is_file(), reason="calibration data not present")
def test_hgx_blackwell_is_its_rack_part_at_its_own_clock_leave_one_out():
    """B200 and B300 are GB200's and GB300's dies at a lower power limit: the GEMM curve, HBM table and
    precision factors are the rack part's as they are, and one factor, the sustained clock against their own
    datasheet peaks, is fitted. It lies between 1 and the power ratio tdp / rated (dynamic power grows at
    least as fast as the clock, `hardware.sustained_clock`). Leave-one-out over B200's 11 runs, the clock
    chosen on a 0.025 grid from the other 10: mean |held-out error| <= 12% (16.75% with B200's own
    four-parameter fit, two of them at their bounds)."""
    from optimizer.io.runs import load_runs

    for hgx, rack in (("b200-sxm-180gb", "gb200-nvl72"), ("b300-sxm-270gb", "gb300-nvl72")):
        a, b = system(hgx), system(rack)
        assert a.matrix_efficiency == b.matrix_efficiency and a.hbm_efficiency == b.hbm_efficiency
        assert a.matrix_efficiency_scale == b.matrix_efficiency_scale
        assert a.tdp_w / a.rated_power_w <= a.clock_scale < 1.0
    from tests.helpers import grid_leave_one_out

    base = system("b200-sxm-180gb")
    runs = [r for r in load_runs(str(RUNS_2025)).data if r["hardware"]["gpu"] == base.name]
    grid = [{"clock_scale": float(c)} for c in np.round(np.arange(0.80, 1.0001, 0.025), 3)]
    held = grid_leave_one_out(runs, base, grid)
    assert len(runs) == 11 and np.mean(np.abs(held)) <= 12.0


PROCURE = """name: p
llm: {name: tiny, hidden: 2048, ffn: 8192, layers: 16, heads: 16, seq_len: 2048, vocab: 32000}
training: {global_batch: 64, precision: bf16}
procure: {goal: throughput, budget_usd: 1.0e+6, max_nodes: 4, calibrated_only: CAL}
catalog:
  name: test
  node_types:
    - {name: h100, system: h100-sxm-80gb, price_usd: 500000}
    - {name: mi300x, system: mi300x, price_usd: 100000}
"""


def test_procure_flags_and_can_exclude_prior_only_types(tmp_path):
    """MI300X (prior efficiencies, a fifth of the price: twice the nodes) wins; the answer says it is
    prior-only, and procure.calibrated_only: true leaves only the calibrated H100."""
    from optimizer.drivers.procure import procure
    from optimizer.io.loader import load_procure
    from optimizer.report.procure import render, result_dict

    results = {}
    for cal in ("false", "true"):
        path = tmp_path / f"p-{cal}.yaml"
        path.write_text(PROCURE.replace("CAL", cal))
        results[cal] = procure(load_procure(path), time_limit_s=20)
    loose, strict = results["false"], results["true"]
    assert {t["node_type"]: t["calibration"] for t in result_dict(loose)["node_types"]} == {
        "h100": "calibrated",
        "mi300x": "prior",
    }
    text = render(loose)
    assert "[prior +-30%]" in text and "[calibrated" in text  # a prior-only type's stated uncertainty
    bands = {t["node_type"]: t["step_time_band_pct"] for t in result_dict(loose)["node_types"]}
    from optimizer.schema.system import PRIOR_BAND_PCT

    assert bands["mi300x"] == PRIOR_BAND_PCT
    assert [g.node_type.name for g in loose.best.groups] == ["mi300x"]  # 4 nodes against 2
    assert "WARNING: the best purchase uses prior-only node type(s) mi300x" in text
    assert all(g.node_type.name == "h100" for g in strict.best.groups)
    assert "excluded: prior-only system" in render(strict)


@pytest.mark.slow  # rack and node catalogs procured: about 3 s
def test_nvl72_racks_are_bought_whole_and_compared_with_nodes():
    """catalogs/racks-2025.yaml: NVL72 types are sold in whole racks (unit_nodes 18 trays of 4 GPUs); every
    purchase of them is a multiple of 18 trays, the limit is whole racks within the budget, and the racks are
    ranked against 8-GPU nodes in one answer."""
    from optimizer.drivers.procure import procure
    from optimizer.io.loader import load_procure
    from optimizer.report.procure import render

    root = Path(__file__).resolve().parents[1]
    pp = load_procure(root / "problems/studies/procure/gpt3-175b-racks-vs-nodes.yaml")
    r = procure(pp, time_limit_s=30)
    rows = {x.node_type.name: x for x in r.rows}
    for name in ("gb200-nvl72", "gb300-nvl72"):
        t = rows[name].node_type
        assert t.unit_nodes == 18 and t.gpus_per_node == 4
        rack = 18 * (t.price_usd + t.extra_usd)
        assert rows[name].max_nodes == 18 * int(pp.procure.budget_usd // rack)
        p = rows[name].purchase
        assert p is not None and p.nodes % 18 == 0 and p.cost_usd == p.nodes * t.node_usd
        assert p.groups[0].gpus_used <= p.nodes * 4
        assert f"({p.nodes // 18} units of 18)" in p.label()
    assert rows["h100-80g"].node_type.unit_nodes == 1 and rows["h100-80g"].purchase is not None
    assert r.best.label() in render(r)


def test_fp8_scaling_recipes():
    """FP8 recipes run at the FP8 peak; block scaling stores one FP32 scale per 128 elements; current scaling
    reads each cast tensor twice (amax, then cast), so it is the slowest of the three at equal GEMMs and equal
    communication (tp 1 here: with sequence parallelism the per-tensor recipes also gather in 1 byte, see
    `test_sequence_parallel_gathers_travel_quantised_in_per_tensor_fp8`); each is emitted as its framework's
    recipe."""
    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.io.loader import load_named
    from optimizer.report.export import emit
    from optimizer.schema import LLM, Execution, Problem, Training

    h100 = system("h100-sxm-80gb")
    assert Hardware(h100, Precision.FP8_BLOCK).matrix_peak == Hardware(h100, Precision.FP8).matrix_peak
    assert BYTES[Precision.FP8_BLOCK] == pytest.approx(1 + 4 / 128) and BYTES[Precision.FP8_CURRENT] == 1.0
    llm = load_named("llm", "llama3.1-8b", LLM)
    ex = Execution(tp=1, dp=8, micro_batch=1, zero=1)
    t = {}
    for p in ("fp8", "fp8_current", "fp8_block"):
        prob = Problem(llm=llm, system=h100, num_gpus=8, training=Training(global_batch=32, precision=p))
        t[p] = evaluate_execution(prob, ex).result["step_time"]
        text = emit("megatron", prob, ex)
        if p == "fp8_current":
            assert "--fp8-recipe tensorwise" in text
        if p == "fp8_block":
            assert "--fp8-recipe blockwise" in text
    assert t["fp8"] < t["fp8_block"] < t["fp8_current"]


def test_flash_attention_efficiency_is_size_aware():
    """Flash attention runs at attention_efficiency x the wave quantization of its 128-row query tiles over
    the SMs x keys / (keys + attention_overhead_keys): short sequences and few heads per GPU run far below the
    flat efficiency (GPT-3 at tp 8: 12 heads of 2048 tokens), long ones approach it."""
    from optimizer.model.hardware import Hardware

    h100 = system("h100-sxm-80gb")
    hw = Hardware(h100, Precision.BF16)

    def eff(s, heads):
        fl = 4.0 * heads * s * s * 128 * 0.5
        return fl / (float(hw.attention_kernel(fl, 0.0, rows=s, keys=s, heads=heads)) * hw.attention_peak)

    flat = h100.attention_efficiency
    assert eff(2048, 12) < eff(2048, 96) < eff(32768, 96) < flat
    tiles = 12 * 2048 / 128  # 192 tiles on 132 SMs: 2 waves, the second 45% full
    k0 = float(hw.attention_overhead_keys())  # H100 is the reference: 3155 keys
    assert k0 == pytest.approx(3155.0, rel=1e-4)
    assert eff(2048, 12) == pytest.approx(flat * (tiles / 264) * 2048 / (2048 + k0))
    fl = 1e12
    assert float(hw.attention_kernel(fl, 0.0)) == pytest.approx(fl / (hw.attention_peak * flat))


def _overhead_ratio(hw, k, **kind):
    """Short over long sequence, same FLOPs and tiles: the per-tile overhead factor k / (k + k0) alone."""
    fl = 1e13
    return float(hw.attention_kernel(fl, 0.0, rows=8192, keys=1e9, heads=64, **kind)) / float(
        hw.attention_kernel(fl, 0.0, rows=8192, keys=k, heads=64, **kind)
    )


def test_the_per_tile_overhead_is_memory_traffic_so_it_follows_the_kernels_intensity():
    """Where a system states no attention_overhead_keys, a query tile's fixed work (its Q, O and statistics
    through HBM) is the reference's 3155 keys (an H100 SXM's cuDNN kernel: 989.4 TFLOP/s x 0.65 over
    3,350 GB/s, 192 FLOP per byte) scaled by the GPU's attention FLOP/s over its HBM bytes/s: a GPU whose
    loop runs faster against its memory covers more keys in that fixed traffic. By hand: an A100 80GB (312
    TFLOP/s BF16, 2,039 GB/s) at its attention efficiency e: 3155 x (312e12 e / 2039e9) / 192; H100's
    FlashAttention-2 class kernels (and the Triton kernel, the same tile algorithm) at 0.34: 3155 x 0.34 /
    0.65 = 1650 keys."""
    from optimizer.model.fitted import FITTED

    assert FITTED.attention_reference_flop_per_byte == pytest.approx(989.4e12 * 0.65 / 3350e9, rel=1e-4)
    k = 1024.0
    h100 = system("h100-sxm-80gb")
    assert h100.attention_overhead_keys is None and h100.attention_overhead_keys_triton is None
    hw = Hardware(h100, Precision.BF16)
    k_fa2 = 3155.0 * 0.34 / 0.65
    assert _overhead_ratio(hw, k) == pytest.approx(k / (k + 3155.0), rel=1e-3)
    assert _overhead_ratio(hw, k, fa2=True) == pytest.approx(k / (k + k_fa2), rel=1e-3)
    assert _overhead_ratio(hw, k, triton=True) == pytest.approx(k / (k + k_fa2), rel=1e-3)
    a100 = system("a100-sxm-80gb")
    e = a100.attention_efficiency
    k_a100 = 3155.0 * (312e12 * e / 2039e9) / (989.4e12 * 0.65 / 3350e9)
    hw = Hardware(a100, Precision.BF16)
    assert _overhead_ratio(hw, k, triton=True) == pytest.approx(k / (k + k_a100), rel=1e-3)
    # a value the file states wins, for every kernel; the Triton kernel's own where stated
    stated = Hardware(h100.model_copy(update={"attention_overhead_keys": 500.0}), Precision.BF16)
    assert _overhead_ratio(stated, k, fa2=True) == pytest.approx(k / (k + 500.0), rel=1e-5)
    tri = Hardware(h100.model_copy(update={"attention_overhead_keys_triton": 900.0}), Precision.BF16)
    assert _overhead_ratio(tri, k, triton=True) == pytest.approx(k / (k + 900.0), rel=1e-5)
    assert _overhead_ratio(tri, k) == pytest.approx(k / (k + 3155.0), rel=1e-3)


def test_a_power_capped_part_runs_at_a_lower_clock_unless_fitted():
    """A part whose tdp_w is below the die's rated_power_w and whose clock_scale is not fitted runs at
    (tdp / rated) ** clock_power_exponent of the datasheet clock on every compute peak; a fitted clock_scale
    wins; no cap stated (or a cap at the rating): the datasheet clock."""
    from optimizer.model.fitted import FITTED
    from optimizer.model.hardware import sustained_clock

    h96 = system("h100-sxm-96gb").model_copy(update={"clock_scale": None})
    assert (h96.tdp_w, h96.rated_power_w) == (500.0, 700.0)
    c = (500.0 / 700.0) ** FITTED.clock_power_exponent
    assert sustained_clock(h96) == pytest.approx(c) and 0.7 < c < 1.0
    hw = Hardware(h96, Precision.BF16)
    assert hw.matrix_peak == pytest.approx(h96.matrix_tflops[Precision.BF16] * 1e12 * c)
    assert sustained_clock(h96.model_copy(update={"clock_scale": 0.9})) == 0.9
    assert sustained_clock(system("h100-sxm-80gb")) == 1.0
    assert sustained_clock(h96.model_copy(update={"tdp_w": 700.0})) == 1.0


def test_attention_throughput_follows_the_head_size_as_measured():
    """Fused attention at head size 64 runs at 413/595 of its head-128 throughput (cuDNN, Transformer Engine's
    kernels) and FlashAttention-2 at 324/370 (FlashAttention-3 paper, Fig. 5, H100 SXM5): a compute-bound
    kernel of the same FLOPs takes that much longer; 256 is near 128, and sizes between interpolate in
    log2."""
    hw = Hardware(system("h100-sxm-80gb"), Precision.BF16)
    flops, nbytes = 1e13, 1e6  # compute-bound
    t = {d: float(hw.attention_kernel(flops, nbytes, head_dim=d)) for d in (64, 128, 256)}
    assert t[64] / t[128] == pytest.approx(595 / 413, rel=1e-9)
    assert t[256] / t[128] == pytest.approx(595 / 581, rel=1e-9)
    t2 = {d: float(hw.attention_kernel(flops, nbytes, head_dim=d, fa2=True)) for d in (64, 128)}
    assert t2[64] / t2[128] == pytest.approx(370 / 324, rel=1e-9)
    assert t[128] < float(hw.attention_kernel(flops, nbytes, head_dim=96)) < t[64]


def test_sliding_window_attention_costs_its_band():
    """A window of W keys: each query attends to W - W^2/(2s) keys on average (FLOPs), and its kernel loops
    over that band only, so a short window runs far below peak (`attention_overhead_keys`) on few FLOPs; a
    layer share (`sliding_window.layers`) mixes windowed and full attention; a window at least as long as the
    sequence is full causal attention."""
    from optimizer.model.layer import block_cost, flash_attention
    from optimizer.model.step import make_ctx
    from optimizer.schema import LLM, Execution, Training
    from tests.helpers import problem_and_knobs

    hw = Hardware(system("h100-sxm-80gb"), Precision.BF16)
    s, w = 4096.0, 128.0
    full = flash_attention(hw, 1, 64, 8, 64, s, s, 2)
    win = flash_attention(hw, 1, 64, 8, 64, s, s, 2, window=w)
    assert win[2] / full[2] == pytest.approx((w - w * w / (2 * s)) / (s / 2), rel=1e-12)  # FLOPs
    assert 0.3 < float(win[0] / full[0]) < 0.6  # time: far less than full, far more than the FLOP ratio (6%)
    assert float(flash_attention(hw, 1, 64, 8, 64, s, s, 2, window=2 * s)[0]) == float(full[0])
    base = dict(
        name="w",
        hidden=2880,
        heads=64,
        kv_heads=8,
        head_dim=64,
        ffn=2880,
        layers=4,
        vocab=1000,
        seq_len=4096,
        mlp="swiglu",
    )
    cost = {}
    for n in (0, 2, 4):
        llm = LLM(**base, sliding_window={"tokens": 128, "layers": n} if n else None)
        p, k = problem_and_knobs(llm, system("h100-sxm-80gb"), 1, Training(global_batch=1), Execution())
        cost[n] = float(block_cost(make_ctx(p), k).attn_fw[0])
    assert cost[2] == pytest.approx((cost[0] + cost[4]) / 2, rel=1e-12) and cost[4] < cost[0]


def test_a_fit_on_top_of_a_transfer_states_its_own_runs_on_the_source_tables(calibrate):
    """B200 is GB200's die at a lower power limit: `--transfer` copies GB200's tables, then a clock-only fit
    on B200's runs writes B200's own runs and fitted field, and names GB200 as the source of its tables
    (`calibration.shape_from`); GB200's runs are not claimed as B200's."""
    cal, lib = calibrate
    assert cal.transfer("gb200-nvl72", ["b200-sxm-180gb"], lib) == 0
    path = lib / "systems" / "b200-sxm-180gb.yaml"
    gb200 = validate_model(System, read_yaml(lib / "systems" / "gb200-nvl72.yaml"))
    cal.SHAPE.update(of="gb200-nvl72", curve=[list(map(float, pt)) for pt in gb200.matrix_efficiency])
    cal.write(
        path,
        {"clock_scale": 0.9},
        ["r1", "r2"],
        "runs.yaml",
        5.0,
        {"r1": "megatron-core", "r2": "megatron-core"},
    )
    b200 = validate_model(System, read_yaml(path))
    c = b200.calibration
    assert c.transferred_from is None and c.shape_from == "gb200-nvl72" and c.status() == "calibrated"
    assert c.runs == ["r1", "r2"] and c.fitted == ["clock_scale"] and c.stacks == {"megatron-core": 2}
    assert c.loo_mape_pct == 5.0 and "on gb200-nvl72's tables" in c.summary()
    assert b200.matrix_efficiency == gb200.matrix_efficiency and b200.clock_scale == 0.9


def test_calibrate_write_records_the_stacks_of_every_run(calibrate):
    """`calibration.stacks` counts the stacks of the fit's runs; a partial fit (one factor) that adds a run
    recounts them when every run's stack is known, adds the new runs' stacks to the file's counts when only
    theirs are, and keeps the file's otherwise."""
    cal, lib = calibrate
    path = lib / "systems" / "h100-sxm-80gb.yaml"
    before = validate_model(System, read_yaml(path)).calibration
    by_id = {r: "fsdp" if r.startswith("llmfoundry") else "megatron-core" for r in before.runs}
    assert sum(before.stacks.values()) == len(before.runs)
    cal.write(path, {"fp8_scale": 0.9}, ["tt-new"], "runs.yaml", None, by_id | {"tt-new": "torchtitan"})
    after = validate_model(System, read_yaml(path)).calibration
    assert after.runs == before.runs + ["tt-new"]
    recount = {s: list(by_id.values()).count(s) for s in set(by_id.values())} | {"torchtitan": 1}
    assert after.stacks == recount
    # the file's runs unknown to this fit (another runs file), the new run known: the file's counts plus its
    # stack
    cal.write(path, {"fp8_scale": 0.9}, ["ds-new"], "runs.yaml", None, {"ds-new": "deepspeed"})
    assert validate_model(System, read_yaml(path)).calibration.stacks == recount | {"deepspeed": 1}
    cal.write(path, {"fp8_scale": 0.9}, ["other"], "runs.yaml", None, {})  # stacks unknown: kept
    assert validate_model(System, read_yaml(path)).calibration.stacks == recount | {"deepspeed": 1}


def test_lm_head_and_router_stay_16_bit_in_quantised_recipes():
    """Megatron-Core's output layer (its own ColumnParallelLinear) and MoE router, and torchtitan's `output`
    linear, run outside the FP8 recipe: the LM head costs the same in FP8 as in BF16 and is priced at the BF16
    peak (GEMM for GEMM, `Hardware.gemm(wide=True)`), while the layers' GEMMs get faster."""
    from optimizer.model.step import evaluate, make_ctx
    from optimizer.schema import LLM, Execution, Training
    from tests.helpers import problem_and_knobs

    b200 = system("b200-sxm-180gb")
    hw8, hw16 = Hardware(b200, Precision.FP8), Hardware(b200, Precision.BF16)
    assert hw8.matrix_peak == pytest.approx(2 * hw16.matrix_peak)
    m, n, k = 8192.0, 128256.0, 4096.0
    assert float(hw8.gemm(m, n, k, wide=True)) == pytest.approx(float(hw16.gemm(m, n, k)), rel=1e-12)
    assert float(hw8.gemm(m, n, k)) < 0.75 * float(hw16.gemm(m, n, k))
    llm = LLM(
        name="h",
        hidden=4096,
        heads=32,
        kv_heads=8,
        ffn=14336,
        layers=2,
        vocab=128256,
        seq_len=8192,
        mlp="swiglu",
        moe={"experts": 8, "top_k": 2, "expert_ffn": 14336},
    )
    res = {}
    for prec in (Precision.BF16, Precision.FP8):
        p, kn = problem_and_knobs(llm, b200, 8, Training(global_batch=8, precision=prec), Execution(ep=8))
        res[prec] = evaluate(p, kn, make_ctx(p))
    assert float(res[Precision.FP8].head[0]) == pytest.approx(float(res[Precision.BF16].head[0]), rel=1e-12)
    assert float(res[Precision.FP8].fw[0]) < 0.8 * float(res[Precision.BF16].fw[0])


def test_sequence_parallel_gathers_travel_quantised():
    """Quantised recipes cast before the sequence-parallel all-gather, which carries the GEMM's rowwise copy
    with its scales (Transformer Engine's _all_gather_fp8 / _all_gather_mxfp8 / _all_gather_nvfp4): 1 byte per
    element in per-tensor FP8, 1 + 1/32 in MXFP8, 0.5 + 1/16 in NVFP4; reduce-scatters carry GEMM outputs in
    16 bit. Hand-worked: the forward's TP link time is 2 x (all-gather + reduce-scatter) of one T x h
    activation. Backward, the all-gather of a row-parallel GEMM's output gradient feeds the data gradient
    (rowwise) and the weight gradient (columnwise); a block-scaled copy scaled along rows cannot serve as one
    scaled along columns, so Transformer Engine gathers both (linear.py backward's second, columnwise
    all-gather under Userbuffers; _all_gather_mxfp8 / _all_gather_nvfp4 with both usages), while per-tensor
    FP8 and BF16 gather one: the backward's TP link time is 2 x (output-gradient all-gather + reduce-scatter)
    + 2 x the input all-gather the weight gradient redoes (sp_ag_redo)."""
    from optimizer.model.hardware import Tiers, collective_time, tier_of
    from optimizer.model.layer import block_cost
    from optimizer.model.step import make_ctx
    from optimizer.schema import LLM, Execution, Training
    from tests.helpers import problem_and_knobs

    b200 = system("b200-sxm-180gb")
    llm = LLM(
        name="t",
        hidden=8192,
        heads=64,
        kv_heads=8,
        ffn=28672,
        layers=2,
        vocab=1000,
        seq_len=4096,
        mlp="swiglu",
    )
    tiers = Tiers.of(b200)
    T, h, tp = 4096.0, 8192.0, 4
    tier = tier_of(tiers, tp, tp)
    tp_fw = {}
    rs = float(collective_time("rs", T * h * 2, tp, tier, tiers))
    for prec, ag_bytes, copies in (
        (Precision.BF16, 2, 1),
        (Precision.FP8, 1, 1),
        (Precision.FP8_CURRENT, 1, 1),
        (Precision.MXFP8, 1 + 1 / 32, 2),
        (Precision.NVFP4, 0.5 + 1 / 16, 2),
    ):
        p, k = problem_and_knobs(
            llm,
            b200,
            4,
            Training(global_batch=1, precision=prec),
            Execution(tp=tp, sequence_parallel=True, sp_ag_redo=True),
        )
        cost = block_cost(make_ctx(p), k)
        tp_fw[prec] = float(cost.tp_fw[0])
        ag = float(collective_time("ag", T * h * ag_bytes, tp, tier, tiers))
        ag_go = float(collective_time("ag", T * h * ag_bytes * copies, tp, tier, tiers))
        assert tp_fw[prec] == pytest.approx(2 * (ag + rs), rel=1e-9), prec
        assert float(cost.tp_bw[0]) == pytest.approx(2 * (ag_go + rs) + 2 * ag, rel=1e-9), prec
    assert tp_fw[Precision.NVFP4] < tp_fw[Precision.FP8] < tp_fw[Precision.MXFP8] < tp_fw[Precision.BF16]


def test_mxfp8_kernels_run_at_the_measured_fraction_of_per_tensor_fp8():
    """An MXFP8 GEMM runs at the system's per-tensor FP8 efficiency times the block-scaled kernel factor
    measured on a B300 (`BLOCK_SCALED_KERNEL`, derived from problems/measurements/b300-te-gemm-precisions.json
    by bench_kernels.block_scaled_kernel: 6.812 / 7.161 ms per layer); MXFP8 takes FP8's calibrated scale
    where a system states no MXFP8 one (`common.EFFICIENCY_OF`). Compute-bound GEMMs at the same peak: time
    ratio 1 / the factor."""
    from optimizer.model.hardware import BLOCK_SCALED_KERNEL

    for name in ("gb200-nvl72", "gb300-nvl72", "h100-sxm-80gb"):
        s = system(name)
        assert s.efficiency_scale(Precision.MXFP8) == s.efficiency_scale(Precision.FP8)
    gb200 = system("gb200-nvl72")
    scaled = gb200.model_copy(update={"matrix_efficiency_scale": {Precision.FP8: 0.9}})
    assert scaled.efficiency_scale(Precision.MXFP8) == 0.9
    own = gb200.model_copy(update={"matrix_efficiency_scale": {Precision.FP8: 0.9, Precision.MXFP8: 0.8}})
    assert own.efficiency_scale(Precision.MXFP8) == 0.8  # a system's own MXFP8 factor wins
    for s in (gb200, scaled):
        f8, mx = Hardware(s, Precision.FP8), Hardware(s, Precision.MXFP8)
        t8, tmx = (
            float(f8.gemm(16384, 16384, 16384, in_bytes=1)),
            float(mx.gemm(16384, 16384, 16384, in_bytes=1)),
        )
        assert tmx / t8 == pytest.approx(1 / BLOCK_SCALED_KERNEL[Precision.MXFP8], rel=1e-9)


def test_power_cap_clock_scales_every_compute_peak_but_not_mfu():
    """`clock_scale` (a power-capped part's sustained clock): GEMMs, attention and element-wise kernels that
    are compute-bound all take 1/clock_scale as long, memory-bound ones do not change, and MFU stays against
    the datasheet peak (so a slower step shows as a lower MFU)."""
    base = system("h100-sxm-80gb")
    capped = base.model_copy(update={"clock_scale": 0.8})
    hw, hc = Hardware(base, Precision.BF16), Hardware(capped, Precision.BF16)
    assert float(hc.matmul(1e13, 1e6) / hw.matmul(1e13, 1e6)) == pytest.approx(1 / 0.8, rel=1e-12)
    assert float(hc.attention_kernel(1e13, 1e6) / hw.attention_kernel(1e13, 1e6)) == pytest.approx(
        1 / 0.8, rel=1e-12
    )
    assert float(hc.vector(1e12, 1e3) / hw.vector(1e12, 1e3)) == pytest.approx(1 / 0.8, rel=1e-12)
    assert float(hc.mem_time(1e9)) == float(hw.mem_time(1e9))
    from optimizer.io.loader import load_named
    from optimizer.model.knobs import from_execution
    from optimizer.model.step import evaluate
    from optimizer.schema import LLM, Execution, Problem, Training

    llm = load_named("llm", "llama3.1-8b", LLM)
    r = {}
    for name, sysm in (("base", base), ("capped", capped)):
        p = Problem(llm=llm, system=sysm, num_gpus=8, training=Training(global_batch=8))
        r[name] = evaluate(p, from_execution(Execution(tp=1, micro_batch=1), sysm, 8))
    ratio = float(r["capped"].step_time[0] / r["base"].step_time[0])
    assert 1.0 < ratio <= 1 / 0.8 + 1e-9
    assert float(r["capped"].mfu[0]) == pytest.approx(float(r["base"].mfu[0]) / ratio, rel=1e-9)


def test_a_stack_factor_scales_only_that_stacks_gemms(calibrate):
    """`stack_matrix_scale.<stack>` multiplies the GEMM efficiency (16-bit and quantised alike) of that
    stack's plans only; calibrate.py's `stack_scale` writes it under the stack it was fitted on (`--stack`),
    beside the factors of other stacks already in the file."""
    h100 = validate_model(System, read_yaml(find_in_library("system", "h100-sxm-80gb")))
    sys_ = h100.model_copy(update={"stack_matrix_scale": {"maxtext": 0.5}})
    for prec in (Precision.BF16, Precision.FP8):
        ref, mx, mc = (
            Hardware(sys_, prec),
            Hardware(sys_, prec, "maxtext"),
            Hardware(sys_, prec, "megatron-core"),
        )
        t = ref.gemm(8192, 8192, 8192)
        assert mc.gemm(8192, 8192, 8192) == t and mx.gemm(8192, 8192, 8192) == pytest.approx(2 * t)
        assert mx.gemm(8192, 8192, 8192, wide=True) == pytest.approx(
            2 * ref.gemm(8192, 8192, 8192, wide=True)
        )
    cal, lib = calibrate
    path = lib / "systems" / "h100-sxm-80gb.yaml"
    cal.FIT_STACK.update(stack="torchtitan")
    cal.write(path, {"stack_scale": 0.95}, ["tt-run"], "runs.yaml")
    cal.FIT_STACK.update(stack="maxtext")
    cal.write(path, {"stack_scale": 0.9}, ["mx-run"], "runs.yaml")
    cal.FIT_STACK.clear()
    after = validate_model(System, read_yaml(path))
    assert after.stack_matrix_scale == {"torchtitan": 0.95, "maxtext": 0.9}
    assert (
        after.stack_scale("maxtext") == 0.9
        and after.stack_scale("fsdp") == 1.0
        and after.stack_scale(None) == 1
    )
    assert "stack_matrix_scale" in after.calibration.fitted
    # a refit of the tables leaves the factors stale: they go (the sequence refits them after the tables)
    cal.write(path, {"e1": 0.5, "e2": 0.7, "e3": 0.85}, ["r1"], "runs.yaml")
    assert validate_model(System, read_yaml(path)).stack_matrix_scale == {}
