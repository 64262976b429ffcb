"""Targets of calibration records (`optimizer.io.runs.run_target`), worked by hand."""

from __future__ import annotations

import pytest
from helpers import NO_MEASUREMENT, library_system

from optimizer.io.runs import map_run, run_target


def record(measured: dict) -> dict:
    return {
        "id": "r",
        "source": "Test 2021",
        "tier": "B",
        "notes": None,
        "software": {"year": 2021},
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
        "hardware": {"gpu": "a100-sxm-80gb", "num_gpus": 8, "gpus_per_node": 8},
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
            "precision": None,
        },
        "measured": NO_MEASUREMENT | measured,
    }


def test_tflops_target_uses_narayanan_eq3():
    r = record({"tflops_per_gpu": 100.0, "tflops_convention": "Eq.3 incl. recompute (HFU-like)"})
    m = map_run(r, {"a100-sxm-80gb": library_system("a100-sxm-80gb")})
    t, how = run_target(r, m.problem)
    # Eq.3: 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with B=64, s=2048, L=8, h=1024, V=51200
    flops = 96 * 64 * 2048 * 8 * 1024**2 * (1 + 2048 / 6144 + 51200 / (16 * 8 * 1024))
    assert t == pytest.approx(flops / (8 * 100e12), rel=1e-12)
    assert "TFLOP/s" in how


def test_mfu_target_uses_the_system_peak():
    r = record({"mfu": 0.5, "tflops_convention": "6N+attn (MFU)"})
    m = map_run(r, {"a100-sxm-80gb": library_system("a100-sxm-80gb")})
    t, how = run_target(r, m.problem)
    from optimizer.model.params import model_flops_per_token

    flops = model_flops_per_token(m.problem.llm, 2048) * 64 * 2048
    assert t == pytest.approx(flops / (8 * 312e12 * 0.5), rel=1e-12)  # A100 312 TF (fp16 assumed, 2021)
    assert "MFU 0.5" in how


def test_stated_step_time_wins():
    r = record({"step_time_s": 3.0, "mfu": 0.5})
    m = map_run(r, {"a100-sxm-80gb": library_system("a100-sxm-80gb")})
    assert run_target(r, m.problem) == (3.0, None)


def test_performance_summary_runs_reduce_gradients_in_bf16():
    """NeMo / Megatron-Bridge performance recipes set grad_reduce_in_fp32 = False (their records state
    software.grad_reduce_dtype bf16); unstated, bf16 training reduces in fp32."""
    systems = {"a100-sxm-80gb": library_system("a100-sxm-80gb")}
    r = record({"step_time_s": 1.0})
    r["parallel"]["precision"] = "bf16"
    plain = map_run(r, systems)
    perf = map_run(r | {"software": {"year": 2021, "grad_reduce_dtype": "bf16"}}, systems)
    assert plain.problem.training.grad_precision.value == "fp32"
    assert perf.problem.training.grad_precision.value == "bf16"
    assert any("software.grad_reduce_dtype" in a for a in perf.assumptions)


def test_custom_pipeline_layout_maps_onto_pp_uneven():
    r = record({"step_time_s": 1.0})
    r["model"]["layers"] = 7  # neither 7 nor 9 divides by pp 2 * vpp 2
    r["parallel"] |= {"tp": 1, "pp": 2, "dp": 4, "vpp": 2}
    m = map_run(r, {"a100-sxm-80gb": library_system("a100-sxm-80gb")})
    assert m.problem.execution.pp_uneven and any("custom pipeline layout" in a for a in m.assumptions)


def test_fp8_recipe_stated_is_the_precision_modelled():
    """A run recorded as `fp8` whose software.fp8_recipe is per-tensor current scaling (Megatron-Bridge
    FP8-CS, NeMo 25.04) is
    modelled as `fp8_current` (an amax pass before each cast); without it, `fp8` (delayed scaling)."""
    systems = {"h100-sxm-80gb": library_system("h100-sxm-80gb")}
    r = record({"step_time_s": 1.0})
    r["hardware"]["gpu"] = "h100-sxm-80gb"
    r["parallel"]["precision"] = "fp8"
    plain = map_run(r, systems)
    cs = map_run(r | {"software": {"year": 2021, "fp8_recipe": "current"}}, systems)
    assert plain.problem.training.precision.value == "fp8"
    assert cs.problem.training.precision.value == "fp8_current"
    assert any("current scaling" in a for a in cs.assumptions)


def test_attention_sinks_stated_are_modelled():
    """GPT-OSS records state attention sinks (model.architecture.attention_sinks): the mapped
    LLM carries them, says so, and its predicted step is longer (the sinks' gradient in the attention
    backward); the library's gpt-oss-120b has them too."""
    from helpers import library_llm

    from optimizer.io.runs import predict

    systems = {"h100-sxm-80gb": library_system("h100-sxm-80gb")}
    r = record({"step_time_s": 1.0}) | {"software": {"year": 2025}}  # a year of flash attention
    r["hardware"]["gpu"] = "h100-sxm-80gb"
    plain = map_run(r, systems)
    sink = map_run(r | {"model": r["model"] | {"architecture": {"attention_sinks": True}}}, systems)
    assert not plain.problem.llm.attention_sinks and sink.problem.llm.attention_sinks
    assert any("attention sinks" in a for a in sink.assumptions)
    assert predict(sink).result["step_time"] > predict(plain).result["step_time"]
    assert library_llm("gpt-oss-120b").attention_sinks


def test_clamped_glu_and_fused_expert_mlp_stated_are_modelled():
    """GPT-OSS records state a clamped SwiGLU (model.architecture.activation_clamp 7.0); the 26.06 presets'
    fused
    grouped MLP (Transformer Engine's op fuser, software.moe_fused_mlp) runs the experts' clamp and biases
    inside fused ops: a mapped MoE run carries the clamp, and the fused expert MLP only where its record
    states it,
    and is slower eager than fused."""
    from optimizer.io.runs import predict

    systems = {"h100-sxm-80gb": library_system("h100-sxm-80gb")}
    r = record({"step_time_s": 1.0}) | {"software": {"year": 2025}}
    r["hardware"]["gpu"] = "h100-sxm-80gb"
    r["model"] = r["model"] | {"mlp": "swiglu", "moe": {"experts": 8, "top_k": 2, "expert_ffn": 4096}}
    r["parallel"] = r["parallel"] | {"ep": 8, "recompute": "none"}
    clamped = r | {"model": r["model"] | {"architecture": {"activation_clamp": 7.0}}}
    eager = map_run(clamped, systems)
    fused = map_run(clamped | {"software": {"year": 2025, "moe_fused_mlp": True}}, systems)
    assert eager.problem.llm.activation_clamp == fused.problem.llm.activation_clamp == 7.0
    assert map_run(r, systems).problem.llm.activation_clamp is None
    assert not eager.problem.execution.moe_fused_mlp and fused.problem.execution.moe_fused_mlp
    assert any("software.moe_fused_mlp" in a for a in fused.assumptions)
    assert predict(eager).result["step_time"] > predict(fused).result["step_time"]
    # the experts' biases come from the library model of the record's shape (gpt-oss-120b)
    assert not eager.problem.llm.moe.expert_bias
    from helpers import ROOT

    from optimizer.io.runs import load_runs

    oss = [
        x for x in load_runs(str(ROOT / "problems" / "runs" / "bridge-2606.yaml")).data if "gptoss" in x["id"]
    ]
    assert oss and all(map_run(x).problem.llm.moe.expert_bias for x in oss)


def test_a_broken_library_file_is_no_twin(tmp_path, monkeypatch):
    """The experts' biases come from a library model of the record's shape; an unreadable file in the library
    (here a binary one under $PARAPLAN_LIBRARY) is passed over, not raised from the mapping of every run."""
    from helpers import ROOT

    from optimizer.io.runs import load_runs

    (tmp_path / "llms").mkdir()
    (tmp_path / "llms" / "broken.yaml").write_bytes(b"\xff\x00\x01 not yaml")
    monkeypatch.setenv("PARAPLAN_LIBRARY", str(tmp_path))
    oss = [
        x for x in load_runs(str(ROOT / "problems" / "runs" / "bridge-2606.yaml")).data if "gptoss" in x["id"]
    ]
    assert map_run(oss[0]).problem.llm.moe.expert_bias


def test_held_out_moe_runs_carry_their_recipes_a2a_overlap_and_dispatcher():
    """The Qwen3 MoE runs on H100 (problems/runs/published-moe-fp8.yaml) were measured with Megatron-Bridge
    presets
    that set moe_a2a_overlap=True (and, for Qwen3-30B at 26.02, the DeepEP dispatcher); their software says so
    and the
    mapping follows: the all-to-all overlaps another micro-batch's compute, Qwen3-235B's TP collectives do not
    overlap their matmuls; GPT-OSS's H100 preset has no A2A overlap."""
    from helpers import ROOT

    from optimizer.io.runs import load_runs

    runs = {r["id"]: r for r in load_runs(str(ROOT / "problems" / "runs" / "published-moe-fp8.yaml")).data}
    qwen = [i for i in runs if "qwen3" in i]
    assert len(qwen) == 7
    for i in qwen:
        ex = map_run(runs[i]).problem.execution
        assert ex.ep_overlap, i
        assert (ex.moe_dispatcher.value == "flex") == (i == "mbridge-qwen3-30b-a3b-fp8-16gpu-h100-26.02"), i
        # Qwen3-235B's H100 config sets CommOverlapConfig(tp_comm_overlap=False) in each of those releases
        assert ("235b" not in i) or ex.tp_overlap.value == "none", i
    assert not map_run(runs["mbridge-gpt-oss-120b-bf16-64gpu-h100-26.02"]).problem.execution.ep_overlap


def test_tp_comm_overlap_stated_off_is_not_chosen():
    """A run whose recipe disabled TP communication overlap (software.tp_comm_overlap false; Megatron-Bridge's
    NVFP4 presets: their FP4 parameter gather cannot run beside it) has its TP collectives exposed; unstated,
    a
    recent run leaves the choice to the model. The four NVFP4 runs of the 2025 file state it."""
    from helpers import CALIBRATION

    from optimizer.io.runs import load_runs

    r = record({"step_time_s": 1.0})
    r["software"] = {"year": 2026}
    r["parallel"] |= {"tp": 2, "dp": 4}
    free = map_run(r)
    off = map_run(r | {"software": {"year": 2026, "tp_comm_overlap": False}})
    assert "tp_overlap" in free.free and "tp_overlap" not in off.free
    assert off.problem.execution.tp_overlap.value == "none"
    assert any("not overlapped" in a for a in off.assumptions)
    path = CALIBRATION.parent / "public_runs_2025.yaml"
    if not path.exists():
        pytest.skip("shared/calibration is not beside the project")
    nvfp4 = [x for x in load_runs(str(path)).data if x["parallel"]["precision"] == "nvfp4"]
    assert len(nvfp4) == 4
    assert all(
        map_run(x).problem.execution.tp_overlap.value == "none" for x in nvfp4 if x["parallel"]["tp"] > 1
    )


def test_the_next_release_is_predicted_held_out():
    """problems/runs/bridge-2606.yaml: Megatron-Bridge's 26.06 pre-training table (20 runs; no fit uses them),
    the release after the 26.04.01 table the Blackwell systems are calibrated on. Every run is scored and
    fits; held-out MAPE <= 8% (5.5% at the time of writing, 8.7% before GPT-OSS's attention sinks and eager
    expert passes: Llama 3.1 405B, DeepSeek-V3, Qwen3-30B-A3B and Qwen3-235B within 10% on Blackwell, GPT-OSS
    -12% to -17%). Qwen3-235B ran 1.30x faster than in 26.04.01 on both racks with the same layout; of what
    its new preset turned on (EP all-to-all overlap, full-iteration CUDA graphs, a fused grouped GEMM + GLU,
    FP8 attention) the model has the overlap, and that alone predicts the gain within 5% (1.31x and 1.27x)."""
    from helpers import CALIBRATION, ROOT

    from optimizer.drivers.validate import score_runs
    from optimizer.io.runs import load_runs, predict

    path = ROOT / "problems" / "runs" / "bridge-2606.yaml"
    out = score_runs(str(path)).as_dict()
    s = out["summary"]
    assert s["n_runs"] == 20 and s["n_scored"] == 20 and s["n_not_fitting"] == 0
    assert s["mape_pct"] <= 8.0
    err = {r["id"]: r["error_pct"] for r in out["runs"]}
    dense = [e for i, e in err.items() if "405b" in i]
    assert len(dense) == 7 and max(abs(e) for e in dense) <= 11.0
    old_path = CALIBRATION.parent / "public_runs_2025.yaml"
    if not old_path.exists():
        pytest.skip("shared/calibration is not beside the project")
    new = {r["id"]: r for r in load_runs(str(path)).data}
    old = {r["id"]: r for r in load_runs(str(old_path)).data}
    for rack in ("gb300", "gb200"):
        a, b = (
            old[f"bridge2604-qwen3-235b-{rack}-mxfp8-256gpu"],
            new[f"bridge2606-qwen3-235b-{rack}-mxfp8-256gpu"],
        )
        assert a["parallel"] == b["parallel"]  # the same layout: what differs is the preset
        ma, mb = map_run(a), map_run(b)
        assert not ma.problem.execution.ep_overlap and mb.problem.execution.ep_overlap
        measured = run_target(a, ma.problem)[0] / run_target(b, mb.problem)[0]
        predicted = predict(ma).result["step_time"] / predict(mb).result["step_time"]
        assert predicted == pytest.approx(measured, rel=0.05), rack
