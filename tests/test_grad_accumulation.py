"""Gradient accumulation outside the weight-gradient GEMM (`Execution.grad_accumulation`): its HBM traffic per
parameter and micro-batch, the step time it adds, and which software ran which scheme."""

from __future__ import annotations

import pytest
from helpers import library_system, problem_and_knobs

from optimizer.errors import ProblemErrors
from optimizer.io.runs import map_run
from optimizer.model.step import evaluate, grad_accumulation_bytes, layer_params_per_gpu, make_ctx
from optimizer.schema import LLM, Execution, GradAccumulation, Training

LLM_1B = LLM(name="gpt-1b", hidden=2048, ffn=8192, layers=16, heads=16, seq_len=2048, vocab=32000, mlp="gelu")


def test_bytes_per_parameter_follow_the_kernels():
    """fused: none; Megatron-LM's main_grad.add_: read the 16-bit gradient, read and write the buffer;
    DeepSpeed's BF16 optimizer: the FP32 cast written and read before the add."""
    assert grad_accumulation_bytes(0, 4.0) == 0.0
    assert grad_accumulation_bytes(1, 2.0) == 6.0  # fp16 gradient into an fp16 buffer
    assert grad_accumulation_bytes(1, 4.0) == 10.0  # ... into an fp32 buffer
    assert grad_accumulation_bytes(2, 4.0) == 18.0  # bf16 -> fp32 temporary -> fp32 buffer


@pytest.mark.parametrize("scheme", [GradAccumulation.ADD, GradAccumulation.CAST_ADD])
def test_step_grows_by_one_pass_over_the_stage_per_micro_batch(scheme):
    """Eight micro-batches on one stage without a pipeline: the step grows by eight passes over the GPU's
    parameters (layers, embedding and untied head) at the HBM table's rate, nothing else."""
    train = Training(global_batch=64, precision="bf16")
    base = dict(tp=2, pp=1, dp=4, micro_batch=1, dp_overlap=False)
    p0, k0 = problem_and_knobs(LLM_1B, library_system("h100-sxm-80gb"), 8, train, Execution(**base))
    p1, k1 = problem_and_knobs(
        LLM_1B, library_system("h100-sxm-80gb"), 8, train, Execution(**base, grad_accumulation=scheme)
    )
    ctx = make_ctx(p0)
    r0, r1 = evaluate(p0, k0, ctx), evaluate(p1, k1, make_ctx(p1))
    n_mb = 64 // 4
    layer = float(layer_params_per_gpu(ctx, k0)[0])
    emb = LLM_1B.vocab * LLM_1B.hidden / 2
    assert ctx.grad_bytes == 4  # bf16 training keeps FP32 main gradients
    # worked from the kernels: add reads the bf16 gradient (2) and reads and writes the FP32 buffer (8);
    # cast_add also writes and reads the FP32 temporary (8)
    b = {GradAccumulation.ADD: 10.0, GradAccumulation.CAST_ADD: 18.0}[scheme]
    per_layer = float(ctx.hw.mem_time(layer * b))
    per_emb = float(ctx.hw.mem_time(emb * b))
    expected = n_mb * (LLM_1B.layers * per_layer + 2 * per_emb)  # embedding and the untied head
    assert float(r1.step_time[0] - r0.step_time[0]) == pytest.approx(expected, rel=1e-6)
    assert expected > 0.01 * float(r0.step_time[0])  # large enough to matter: over 1% of the step


def _run(year, precision="fp16", framework=None, grad=None):
    sw = {"year": year} | ({"framework": framework} if framework else {})
    if grad:
        sw["grad_reduce_dtype"] = grad
    return {
        "id": "r",
        "source": "test",
        "model": {"hidden": 2048, "ffn": 8192, "layers": 24, "heads": 16, "seq_len": 2048, "vocab": 51200},
        "hardware": {"gpu": "a100-sxm-80gb", "num_gpus": 64, "gpus_per_node": 8},
        "parallel": {"tp": 4, "pp": 4, "dp": 4, "cp": 1, "ep": 1, "micro_batch": 1, "global_batch": 256}
        | {"precision": precision},
        "measured": {"step_time_s": 1.0},
        "software": sw,
        "tier": "A",
    }


@pytest.mark.parametrize(
    ("year", "precision", "grad", "expected"),
    [
        (2021, "fp16", None, GradAccumulation.ADD),  # before the fusion
        (2021, "bf16", None, GradAccumulation.ADD),
        (2022, "fp16", None, GradAccumulation.ADD),  # fused only with FP32 accumulation until 2022-09
        (2022, "bf16", None, GradAccumulation.FUSED),  # bf16 accumulates in FP32: fused
        (2023, "fp16", None, GradAccumulation.FUSED),
        (2022, "bf16", "bf16", GradAccumulation.FUSED),  # bf16 kept FP32 main grads whatever it reduced in
        (None, "bf16", "bf16", GradAccumulation.FUSED),  # current software
    ],
)
def test_megatron_runs_accumulate_as_their_release_did(year, precision, grad, expected):
    ex = map_run(_run(year, precision, grad=grad)).problem.execution
    assert ex.grad_accumulation == expected


def test_other_stacks_of_the_era_keep_their_own_accumulation():
    """The era rule is Megatron-LM's: a 2021 FSDP run is not given Megatron's add kernel."""
    ex = map_run(
        _run(2021, "bf16", framework="fsdp")
        | {"parallel": _run(2021)["parallel"] | {"tp": 1, "pp": 1, "dp": 64, "precision": "bf16"}}
    ).problem.execution
    assert ex.grad_accumulation == GradAccumulation.FUSED


def test_megatron_deepspeed_accumulates_by_precision_and_refuses_another_scheme(tmp_path):
    """The stack's scheme follows its optimizer: in bf16 DeepSpeed's BF16 optimizer casts and adds, in fp16
    autograd adds into the 16-bit gradient, whatever the year; a problem that writes another scheme for the
    stack is refused, naming the field."""
    mapped = map_run(_run(2022, "bf16", framework="megatron-deepspeed"))
    assert mapped.problem.stack == "megatron-deepspeed"
    assert mapped.problem.execution.grad_accumulation == GradAccumulation.CAST_ADD
    fp16 = map_run(_run(2023, "fp16", framework="megatron-deepspeed")).problem.execution
    assert fp16.grad_accumulation == GradAccumulation.ADD
    from optimizer.io.loader import load_problem

    path = tmp_path / "p.yaml"
    path.write_text(
        "llm: gpt3-175b\nsystem: a100-sxm-80gb\nnum_gpus: 64\nstack: megatron-deepspeed\n"
        "training: {global_batch: 256, precision: bf16}\n"
        "execution: {tp: 4, pp: 4, grad_accumulation: fused}\n"
    )
    with pytest.raises(ProblemErrors, match="grad_accumulation"):
        load_problem(path)


@pytest.mark.parametrize(("tied", "pp", "head_pass"), [(True, 1, False), (True, 2, True), (False, 1, True)])
def test_the_head_accumulates_where_a_copy_of_its_weights_lives(tied, pp, head_pass):
    """The first stage adds the embedding's gradients; the last stage adds the head's: an untied head, or
    the copy of tied embeddings a pipeline keeps there (one copy, on the first stage, without one)."""
    from optimizer.model.step import _edge_work, _shape, grad_accumulation_s

    llm = LLM_1B.model_copy(update={"tied_embeddings": tied})
    train = Training(global_batch=64, precision="bf16")
    ex = dict(tp=2, pp=pp, dp=4 // pp, micro_batch=1)
    extras = {}
    for scheme in (GradAccumulation.FUSED, GradAccumulation.ADD):
        p, k = problem_and_knobs(
            llm, library_system("h100-sxm-80gb"), 8, train, Execution(**ex, grad_accumulation=scheme)
        )
        ctx = make_ctx(p)
        extras[scheme] = _edge_work(ctx, k, _shape(ctx, k))[:2]
    emb = float(grad_accumulation_s(ctx, k, llm.vocab * llm.hidden / 2)[0])
    (last0, first0), (last1, first1) = extras[GradAccumulation.FUSED], extras[GradAccumulation.ADD]
    assert float(first1[0] - first0[0]) == pytest.approx(emb, rel=1e-9)
    assert float(last1[0] - last0[0]) == pytest.approx(emb if head_pass else 0.0, abs=1e-12)
    assert emb > 0


def test_an_moe_layer_accumulates_its_share_of_the_experts():
    """An MoE layer's pass covers its attention and norms and the routed experts this rank holds (E/ep)."""
    from optimizer.model.step import _layer, grad_accumulation_s, moe_layer_params_per_gpu

    moe = LLM.model_validate(LLM_1B.model_dump() | {"moe": {"experts": 8, "top_k": 2, "expert_ffn": 4096}})
    train = Training(global_batch=64, precision="bf16")
    bw = {}
    for scheme in (GradAccumulation.FUSED, GradAccumulation.ADD):
        ex = Execution(tp=1, pp=1, dp=8, ep=4, micro_batch=1, grad_accumulation=scheme)
        p, k = problem_and_knobs(moe, library_system("h100-sxm-80gb"), 8, train, ex)
        ctx = make_ctx(p)
        bw[scheme] = float(_layer(ctx, k, k.pp.astype(float))[0].bw[0])
    ne, ex_params = moe_layer_params_per_gpu(ctx, k)
    assert float(ex_params[0]) == pytest.approx(8 / 4 * 2 * 2048 * 4096)  # E/ep experts of two GeLU matrices
    expected = float(grad_accumulation_s(ctx, k, ne + ex_params)[0])
    assert bw[GradAccumulation.ADD] - bw[GradAccumulation.FUSED] == pytest.approx(expected, rel=1e-9)
    assert float(ex_params[0]) > float(ne[0])  # the experts dominate what is accumulated
