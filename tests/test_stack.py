"""Software stacks (`problem.stack`, `optimizer.schema.stack`): solve and check search only what the stack
offers, a `search` rule outside it is a located input error, evaluate warns, runs carry their stack."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import run_record

from optimizer.cli import main
from optimizer.drivers.check import check, fixed_knobs
from optimizer.drivers.evaluate import evaluate_execution
from optimizer.drivers.solve import solve
from optimizer.errors import ProblemError, ProblemErrors
from optimizer.io.loader import load_problem
from optimizer.io.runs import stack_of
from optimizer.schema import Execution, Recompute

BASE = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 16\ntraining: {global_batch: 64}\n"


def _load(tmp_path, extra: str):
    path = tmp_path / "p.yaml"
    path.write_text(BASE + extra)
    return load_problem(path)


def test_default_stack_is_megatron_core_and_changes_nothing(tmp_path):
    p = _load(tmp_path, "search: {tp: [2, 4]}\n")
    assert p.stack.value == "megatron-core" and p.search_rules() == p.user_search_rules() == {"tp": [2, 4]}


def test_fsdp_plans_are_data_parallel_with_its_sharding_and_checkpointing(tmp_path):
    r = solve(_load(tmp_path, "stack: fsdp\n"), top=5)
    assert len(r.plans) == 5
    for plan in r.plans:
        ex = plan.evaluation.execution
        assert (ex.tp, ex.pp, ex.cp, ex.vpp) == (1, 1, 1, 1)
        assert ex.zero in (0, 2, 3) and ex.recompute in (Recompute.NONE, Recompute.FULL)
        assert not ex.sequence_parallel and not ex.weight_offload


def test_torchtitan_zero_follows_the_pipeline_and_no_layer_slots(tmp_path):
    """torchtitan's FSDP2 is ZeRO-1 with a pipeline (parameters kept gathered, gradients synchronised at the
    last micro-batch) and ZeRO-0/2/3 without one; the embedding and loss take no layer slot."""
    p = _load(tmp_path, "stack: torchtitan\nsearch: {pp: [2, 4]}\n")
    r = solve(p, top=6)
    mc = solve(p.model_copy(update={"stack": "megatron-core"}))
    for plan in r.plans:
        ex = plan.evaluation.execution
        assert ex.zero in (0, 1) and not ex.pp_embedding_loss and not ex.pp_rs_ag and ex.pp in (2, 4)
    flat = solve(_load(tmp_path, "stack: torchtitan\nsearch: {pp: 1}\n"), top=6)
    assert {pl.evaluation.execution.zero for pl in flat.plans} <= {0, 2, 3}
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, "stack: torchtitan\nexecution: {tp: 8, pp: 1, zero: 1}\n")
    assert "zero" in str(e.value) and "pp=1" in str(e.value)
    # a narrower space is never faster
    assert r.plans[0].evaluation.result["step_time"] >= mc.plans[0].evaluation.result["step_time"] * (
        1 - 1e-9
    )


def test_user_search_is_intersected_with_the_stack(tmp_path):
    r = solve(_load(tmp_path, "stack: fsdp\nsearch: {zero: [1, 2]}\n"), top=3)
    assert {p.evaluation.execution.zero for p in r.plans} == {2}


def test_search_outside_the_stack_is_a_located_input_error(tmp_path, capsys):
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, "stack: fsdp\nsearch: {tp: 2}\n")
    assert "search.tp" in str(e.value) and "fsdp" in str(e.value)
    path = tmp_path / "q.yaml"
    path.write_text(BASE + "stack: deepspeed\nsearch: {recompute: selective}\n")
    assert main(["solve", str(path), "-q"]) == 2
    assert "not offered by stack deepspeed" in capsys.readouterr().err


def test_check_does_not_report_the_stack_as_fixed_knobs(tmp_path):
    p = _load(tmp_path, "stack: fsdp\n")
    assert fixed_knobs(p, None) == {}
    r = check(p, None)
    assert r.fits and r.plan.plans[0].evaluation.execution.tp == 1


def test_evaluate_warns_about_knobs_the_stack_lacks(tmp_path):
    p = _load(tmp_path, "stack: fsdp\n")
    ev = evaluate_execution(p, Execution(tp=2, dp=8, sequence_parallel=True, zero=1))
    text = " ".join(ev.warnings)
    assert "tp=2 is not offered by stack fsdp" in text and "zero=1" in text
    ev = evaluate_execution(p, Execution(dp=16, zero=3, recompute="full"))
    assert not any("not offered" in w for w in ev.warnings)


def test_runs_read_their_stack():
    assert stack_of({"software": {"framework": "torchtitan"}}) == "torchtitan"
    assert stack_of({"software": {"framework": "llm-foundry"}}) == "fsdp"
    assert (
        stack_of({"software": {"framework": "deepspeed"}, "notes": "trained with torchtitan"}) == "deepspeed"
    )
    assert stack_of({"software": {"framework": "nemo"}}) == "megatron-core"
    assert stack_of({"source": "pytorch/torchtitan benchmarks", "notes": "torchtitan"}) == "megatron-core"


RUNS = Path(__file__).resolve().parents[2] / "shared" / "calibration" / "public_runs.yaml"


@pytest.mark.skipif(not RUNS.is_file(), reason="calibration data not present")
def test_validate_reports_error_per_stack():
    from optimizer.drivers.validate import score_runs

    s = score_runs(str(RUNS)).as_dict()["summary"]
    by = s["by_stack"]
    assert "megatron-core" in by and sum(b["n"] for b in by.values()) == s["n_scored"]
    assert set(by) >= {"torchtitan", "fsdp"}


def test_emit_names_knobs_the_target_framework_lacks(tmp_path, capsys):
    """A Megatron-Core plan emitted for torchtitan says which knobs torchtitan lacks; a plan solved with
    stack: torchtitan emits without such warnings."""
    import json

    path = tmp_path / "p.yaml"
    path.write_text(BASE + "search: {zero: 1, pp: 1}\n")
    assert main(["solve", str(path), "-q", "--json", "--emit", "torchtitan"]) == 0
    warn = json.loads(capsys.readouterr().out)["emit"]["warnings"]
    assert any(w.startswith("zero=1 is not offered by stack torchtitan") for w in warn)
    path.write_text(BASE + "stack: torchtitan\n")
    assert main(["solve", str(path), "-q", "--emit", "torchtitan"]) == 0
    assert "# warning:" not in capsys.readouterr().out


def test_written_execution_outside_the_stack_is_an_input_error(tmp_path, capsys):
    """`check` fixes written knobs: one the stack lacks is refused with its field (no plan the stack cannot
    run is ever reported as fitting); in code, a single search value the stack lacks leaves no value."""
    from optimizer.schema.stack import restrict

    path = tmp_path / "p.yaml"
    path.write_text(BASE + "stack: fsdp\nexecution: {tp: 2, zero: 1}\n")
    assert main(["check", str(path), "-q"]) == 2
    err = capsys.readouterr().err
    assert "execution.tp: 2 is not offered by stack fsdp" in err and "execution.zero" in err
    assert restrict("fsdp", {"tp": 2})["tp"] == [] and restrict("fsdp", {"tp": 1})["tp"] == 1


def test_stack_limits_precisions(tmp_path, capsys):
    """torchtitan trains FP8 with torchao's tensorwise (current) scaling, not TE's delayed scaling: a search
    over precisions keeps only what it offers; a training precision it lacks is refused."""
    r = solve(_load(tmp_path, "stack: torchtitan\nsearch: {precision: [bf16, fp8, fp8_current]}\n"))
    assert r.plans[0].evaluation.problem.training.precision.value == "fp8_current"
    assert not any("precision fp8:" in n for n in r.notes)
    path = tmp_path / "q.yaml"
    path.write_text(
        BASE.replace("global_batch: 64}", "global_batch: 64, precision: fp8}") + "stack: torchtitan\n"
    )
    assert main(["solve", str(path), "-q"]) == 2
    assert "training.precision: fp8 is not offered by stack torchtitan" in capsys.readouterr().err


def test_unwritten_knobs_take_the_stack_value_and_stay_unwritten(tmp_path, capsys):
    """torchtitan sends whole activations between stages and always shards the norms' sequence with TP: a file
    that leaves pp_rs_ag and sequence_parallel unwritten gets torchtitan's values (no warning), and writing
    the other value is an input error naming the layout."""
    p = _load(tmp_path, "stack: torchtitan\nexecution: {tp: 2, pp: 2}\n")
    ex = p.execution
    assert ex.pp_rs_ag is False and ex.sequence_parallel is True
    assert not {"pp_rs_ag", "sequence_parallel"} & ex.model_fields_set
    path = tmp_path / "p.yaml"
    assert main(["evaluate", str(path)]) == 0
    assert "warning: pp_rs_ag" not in capsys.readouterr().out
    mc = _load(tmp_path, "execution: {tp: 2, pp: 2}\n").execution  # Megatron-Core keeps its defaults
    assert mc.pp_rs_ag is True and mc.sequence_parallel is False
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, "stack: torchtitan\nexecution: {tp: 2, sequence_parallel: false}\n")
    assert "sequence_parallel" in str(e.value) and "tp=2" in str(e.value)


def test_megatron_core_offers_no_tp_overlap_in_nvfp4(tmp_path, capsys):
    """Transformer Engine's Userbuffers (Megatron-Core's TP-communication overlap) communicate FP8 and MXFP8
    tensors, not NVFP4 ones, and Megatron-Bridge's NVFP4 presets turn the overlap off (`stack.BY_PRECISION`):
    an NVFP4 solve keeps TP collectives in line, the FP8 branch of the same precision search may overlap them,
    a written `tp_overlap: ring` in NVFP4 is a located input error, and evaluate warns about it."""
    from optimizer.schema import Precision, TpOverlap
    from optimizer.schema.stack import profile, restrict

    assert profile("megatron-core", Precision.NVFP4)["tp_overlap"] == [TpOverlap.NONE]
    assert "tp_overlap" not in profile("megatron-core", Precision.MXFP8)
    assert restrict("megatron-core", {}, Precision.NVFP4) == {"tp_overlap": [TpOverlap.NONE]}
    assert restrict("megatron-core", {}, Precision.MXFP8) == {}
    gb300 = (
        "llm: llama3.1-70b\nsystem: gb300-nvl72\nnum_gpus: 64\n"
        "training: {global_batch: 256, precision: bf16}\n"
    )
    path = tmp_path / "open.yaml"
    path.write_text(gb300 + "search: {precision: [fp8_current, nvfp4], tp: [2, 4], pp: [4]}\n")
    p = load_problem(path)
    r = solve(p)
    assert r.plans[0].evaluation.problem.training.precision == Precision.NVFP4
    assert r.plans[0].evaluation.execution.tp_overlap == TpOverlap.NONE

    def at(prec):
        return p.model_copy(
            update={
                "search": {"tp": [2, 4], "pp": [4]},
                "training": p.training.model_copy(update={"precision": prec}),
            }
        )

    assert solve(at(Precision.FP8_CURRENT)).plans[0].evaluation.execution.tp_overlap != TpOverlap.NONE
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        gb300.replace("precision: bf16", "precision: nvfp4") + "execution: {tp: 4, pp: 4, tp_overlap: ring}\n"
    )
    assert main(["evaluate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        "execution.tp_overlap: ring is not offered by stack megatron-core in nvfp4" in err
        and "Traceback" not in err
    )
    ev = evaluate_execution(
        at(Precision.NVFP4), Execution(tp=4, pp=4, dp=4, tp_overlap="ring", sequence_parallel=True)
    )
    assert any("tp_overlap=ring is not offered by stack megatron-core in nvfp4" in w for w in ev.warnings)


def test_megatron_deepspeed_runs_tp_and_pp_with_zero1_at_most(tmp_path):
    """megatron-deepspeed offers Megatron's TP and DeepSpeed's pipeline (1F1B, no virtual stages, no
    scatter-gather of the stage exchange; the embedding and the output layer as layer slots where chosen; the
    gradients reduced after the last micro-batch, not overlapped) with ZeRO-1 at most, and no sequence
    parallelism or CP; a ZeRO-3 or an overlapped pipelined execution is a located error; a narrower space is
    never faster than Megatron-Core's."""
    p = _load(tmp_path, "stack: megatron-deepspeed\nsearch: {pp: [1, 2], tp: [1, 2, 4]}\n")
    r = solve(p, top=6)
    assert len(r.plans) == 6
    for plan in r.plans:
        ex = plan.evaluation.execution
        assert ex.zero in (0, 1) and ex.vpp == 1 and ex.cp == 1 and not ex.sequence_parallel
        assert not ex.pp_rs_ag
        assert not (ex.pp > 1 and ex.dp_overlap)  # the pipeline engine reduces after the last micro-batch
    assert any(x.evaluation.execution.pp > 1 for x in r.plans)  # the rule above is not vacuous
    # the CP-SAT tables and the exhaustive enumeration apply that rule alike
    assert [x.objective_s for x in solve(p, top=6, method="enumerate").plans] == pytest.approx(
        [x.objective_s for x in r.plans], rel=1e-6
    )
    mc = solve(p.model_copy(update={"stack": "megatron-core"}))
    assert r.plans[0].objective_s >= mc.plans[0].objective_s * (1 - 1e-9)
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, "stack: megatron-deepspeed\nexecution: {tp: 2, pp: 2, zero: 3}\n")
    assert "zero" in str(e.value)
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, "stack: megatron-deepspeed\nexecution: {tp: 2, pp: 2, dp_overlap: true}\n")
    assert "dp_overlap" in str(e.value)
    _load(tmp_path, "stack: megatron-deepspeed\nexecution: {tp: 2, pp: 1, dp_overlap: true}\n")  # no pipeline


def test_megatron_deepspeed_pipelined_plans_never_overlap_dp_even_where_moot(tmp_path):
    """With pp > 1 and no data-parallel group (tp 4 x pp 4 on 16 GPUs) the overlap flag is moot; CP-SAT, the
    MILP and the enumeration all set it off there, as the stack states, and agree on every plan's time."""
    from optimizer.schema.stack import layout_unsupported

    p = _load(tmp_path, "stack: megatron-deepspeed\nsearch: {pp: [1, 4], tp: [4]}\n")
    runs = [solve(p, top=40, **kw).plans for kw in ({}, {"backend": "pyomo"}, {"method": "enumerate"})]
    assert any(x.evaluation.execution.pp == 4 and x.evaluation.execution.dp == 1 for x in runs[0])
    for plans in runs:
        assert [x.objective_s for x in plans] == pytest.approx([x.objective_s for x in runs[0]], rel=1e-6)
        for x in plans:
            ex = x.evaluation.execution
            assert not layout_unsupported("megatron-deepspeed", ex) and not (ex.pp > 1 and ex.dp_overlap)


def test_a_megatron_deepspeed_run_maps_to_its_stack_and_is_expressible():
    """A BLOOM-shaped run (Megatron-DeepSpeed, tp 4 x pp 12 x dp 8 on 384 A100 80GB, ZeRO-1) is expressed
    on the megatron-deepspeed stack and scored, not refused."""
    from optimizer.io.runs import map_run, predict

    run = run_record(
        {"hidden": 14336, "ffn": 57344, "layers": 70, "heads": 112, "kv_heads": 112, "seq_len": 2048},
        {"gpu": "a100-sxm-80gb", "num_gpus": 384},
        {"tp": 4, "pp": 12, "dp": 8, "micro_batch": 2, "global_batch": 2048, "optimizer_sharding": "zero1"},
        {"framework": "megatron-deepspeed", "year": 2022},
        step_time_s=100.0,
    )
    assert stack_of(run) == "megatron-deepspeed"
    m = map_run(run)
    assert m.skip is None and m.problem.stack.value == "megatron-deepspeed"
    pred = predict(m)
    assert pred.fits and pred.execution.tp == 4 and pred.execution.pp == 12 and pred.execution.zero == 1


def test_torchtitan_fp8_as_runs_write_it_is_its_tensorwise_recipe():
    """A torchtitan run written `precision: fp8` with no recipe is torchao's default float8 (tensorwise,
    dynamic: per-tensor current scaling), which the torchtitan stack offers; it is scored, not refused. A
    Megatron run written the same keeps Transformer Engine's delayed scaling."""
    from optimizer.io.runs import map_run, predict

    def run(framework):
        return run_record(
            {"hidden": 4096, "ffn": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "seq_len": 8192},
            {"gpu": "h100-sxm-80gb", "num_gpus": 8},
            {"tp": 1, "pp": 1, "dp": 8, "global_batch": 8, "optimizer_sharding": "zero3", "precision": "fp8"},
            {"framework": framework, "year": 2025},
        )

    m = map_run(run("torchtitan"))
    assert m.skip is None and m.problem.training.precision.value == "fp8_current"
    assert any("torchtitan's default recipe" in a for a in m.assumptions)
    assert predict(m).fits
    assert map_run(run("megatron-core")).problem.training.precision.value == "fp8"


def test_torchtitan_full_shard_under_a_pipeline_is_its_zero1():
    """A torchtitan run naming FSDP full shard (zero3) with pp > 1 (Llama 3.1 405B's FSDP x TP x PP) is
    what torchtitan runs under a pipeline: parameters kept gathered, gradients reduced once per step, i.e.
    ZeRO-1; it is expressed and scored, not refused as a sharding the stack forbids with a pipeline."""
    from optimizer.io.runs import map_run, predict

    run = run_record(
        {"hidden": 16384, "ffn": 53248, "layers": 126, "heads": 128, "kv_heads": 8, "seq_len": 8192},
        {"gpu": "h100-sxm-80gb", "num_gpus": 512},
        {
            "tp": 8,
            "pp": 8,
            "dp": 8,
            "sequence_parallel": True,
            "global_batch": 64,
            "optimizer_sharding": "zero3",
        },
        {"framework": "torchtitan", "year": 2025},
        step_time_s=10.0,
    )
    m = map_run(run)
    assert m.skip is None and m.problem.execution.zero == 1
    assert any("FSDP2 under a pipeline" in a for a in m.assumptions)
    assert predict(m).execution.pp == 8
    run["parallel"]["pp"], run["parallel"]["dp"] = 1, 64  # without a pipeline: full shard stays zero3
    assert map_run(run).problem.execution.zero == 3


def test_maxtext_runs_fsdp_or_replicas_and_a_gpipe_pipeline(tmp_path):
    """maxtext offers ZeRO-3 (its fsdp axis) or replication (its data axis), TP with or without its norms'
    sequence sharded and XLA's collective matmul (`ring`), a GPipe pipeline without virtual stages, and no
    offload; a ZeRO-1 or an interleaved execution is a located error; the narrower space is never faster than
    Megatron-Core's."""
    p = _load(tmp_path, "stack: maxtext\nsearch: {pp: [1, 2], tp: [1, 2]}\n")
    r = solve(p, top=6)
    assert len(r.plans) == 6
    for plan in r.plans:
        ex = plan.evaluation.execution
        assert ex.zero in (0, 3) and ex.vpp == 1 and ex.tp_overlap.value in ("none", "ring")
        assert ex.pp == 1 or ex.schedule.value == "gpipe"
    # the narrower space alone (H100's maxtext GEMM factor cleared) is never faster than Megatron-Core's
    plain = p.model_copy(update={"system": p.system.model_copy(update={"stack_matrix_scale": {}})})
    mx = solve(plain)
    mc = solve(plain.model_copy(update={"stack": "megatron-core"}))
    assert mx.plans[0].objective_s >= mc.plans[0].objective_s * (1 - 1e-9)
    for bad, field in (
        ("{tp: 1, zero: 1}", "zero"),
        ("{tp: 1, pp: 2, vpp: 2}", "vpp"),
    ):
        with pytest.raises((ProblemError, ProblemErrors)) as e:
            _load(tmp_path, f"stack: maxtext\nexecution: {bad}\n")
        assert field in str(e.value)


def test_a_maxtext_run_maps_to_its_stack_with_its_remat_policy():
    """A MaxText run (Llama-2-70B-shaped, ZeRO-3 over 64 H100) is expressed on the maxtext stack; its remat
    policy is the selective recompute of what the policy does not save, and a policy saving less runs more
    again and keeps less."""
    from optimizer.io.runs import map_run, predict
    from optimizer.schema.stack import REMAT_POLICY

    def mapped(policy):
        run = run_record(
            {"hidden": 8192, "ffn": 28672, "layers": 80, "heads": 64, "kv_heads": 8, "seq_len": 4096},
            {"gpu": "h100-sxm-80gb", "num_gpus": 64},
            {
                "tp": 1,
                "pp": 1,
                "dp": 64,
                "micro_batch": 2,
                "global_batch": 128,
                "optimizer_sharding": "zero3",
            },
            {"framework": "maxtext", "remat_policy": policy},
        )
        return map_run(run)

    m = mapped("save_qkv_proj")
    assert m.skip is None and m.problem.stack.value == "maxtext"
    ex = m.problem.execution
    assert (
        ex.recompute.value == "selective"
        and [x.value for x in ex.recompute_modules] == REMAT_POLICY["save_qkv_proj"]
    )
    assert mapped("full").problem.execution.recompute.value == "full"
    preds = {
        p: predict(mapped(p)).result
        for p in ("minimal_flash", "minimal", "save_dot_except_mlp", "save_qkv_proj", "full")
    }
    order = list(preds.values())
    assert all(a["recompute"] < b["recompute"] for a, b in zip(order, order[1:], strict=False))
    assert all(a["activations"] > b["activations"] for a, b in zip(order, order[1:], strict=False))


def test_without_a_pipeline_maxtext_keeps_one_micro_batch_in_flight(tmp_path):
    """MaxText's pipeline is GPipe, but without one (pp 1) gradient accumulation runs each micro-batch's
    forward and backward in turn: the activations of one micro-batch, as on Megatron-Core."""
    ex = "execution: {tp: 1, pp: 1, micro_batch: 1, zero: 3, recompute: full}\n"
    mx = evaluate_execution(_load(tmp_path, "stack: maxtext\n" + ex)).result
    mc = evaluate_execution(_load(tmp_path, ex)).result
    assert mx["n_mb"] == 4 and mx["activations"] == pytest.approx(mc["activations"])


def test_jax_remat_modules_are_maxtexts_only(tmp_path):
    """`mlp_up` and `attn_proj` are what JAX's rematerialisation runs again; written for another stack they
    are a located error, and a run's remat_policy needs the maxtext framework."""
    from optimizer.schema.run import Run, RunSoftware

    ex = "execution: {tp: 1, recompute: selective, recompute_modules: [core_attn, mlp_up]}\n"
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        _load(tmp_path, ex)
    assert "recompute_modules" in str(e.value) and "mlp_up" in str(e.value)
    _load(tmp_path, "stack: maxtext\n" + ex)
    rec = run_record(
        {"hidden": 4096, "ffn": 14336, "layers": 32, "heads": 32, "kv_heads": 8, "seq_len": 4096},
        {"gpu": "h100-sxm-80gb", "num_gpus": 8},
        {"tp": 1, "pp": 1, "dp": 8, "global_batch": 8},
        {"framework": "torchtitan", "remat_policy": "minimal"},
    )
    with pytest.raises(ValueError, match="needs software.framework: maxtext"):
        Run.model_validate(rec)
    Run.model_validate(rec | {"software": {"framework": "maxtext", "remat_policy": "minimal"}})
    RunSoftware(remat_policy="minimal")  # a facts sidecar states no framework: its record does


def test_maxtext_pipelines_run_whole_rounds_of_micro_batches(tmp_path):
    """MaxText's pipeline needs its micro-batches in whole rounds of the stages (its config check), in the
    search (CP-SAT and the enumeration alike) and for a written execution, which is a located error."""

    def load(extra):
        path = tmp_path / "q.yaml"
        path.write_text("llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 16\nstack: maxtext\n" + extra)
        return load_problem(path)

    p = load("training: {global_batch: 32}\nsearch: {pp: 4, tp: 1, cp: 1, micro_batch: [1, 2, 4, 8]}\n")
    plans = [solve(p, top=20, **kw).plans for kw in ({}, {"method": "enumerate"})]
    assert [x.objective_s for x in plans[0]] == pytest.approx([x.objective_s for x in plans[1]], rel=1e-6)
    # dp 4: micro-batches 1 and 2 give 8 and 4 rounds' worth; 4 and 8 give 2 and 1, which MaxText refuses
    assert plans[0] and {x.evaluation.execution.micro_batch for x in plans[0]} <= {1, 2}
    with pytest.raises((ProblemError, ProblemErrors)) as e:
        load("training: {global_batch: 32}\nexecution: {tp: 1, pp: 4, micro_batch: 4}\n")
    assert "execution.pp" in str(e.value) and "divisible by pp" in str(e.value)
