"""Megatron-LM export: the emitted bash parses (bash -n) and its arguments parse with Megatron's names."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys

import pytest

from optimizer.drivers.evaluate import evaluate_execution
from optimizer.io.loader import load_problem
from optimizer.report.export import emit
from optimizer.schema import Execution, Training
from tests.helpers import library_llm, library_system, problem_and_knobs

# Flags as declared in Megatron-LM megatron/training/arguments.py (checked against the file of 2025-10-30,
# commit bb216765de: every name below is declared there; the MoE dispatcher, grouped GEMM, layer pattern and
# Megatron FSDP ones also against the commit of 2026-08-22, d98e8a64dd, which declares some of them through
# its config dataclasses), value-taking ones, then switches.
VALUED = [
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--context-parallel-size",
    "--micro-batch-size",
    "--global-batch-size",
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--seq-length",
    "--max-position-embeddings",
    "--kv-channels",
    "--num-query-groups",
    "--normalization",
    "--position-embedding-type",
    "--rotary-base",
    "--rope-scaling-factor",
    "--rotary-seq-len-interpolation-factor",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--moe-shared-expert-intermediate-size",
    "--kv-lora-rank",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--q-lora-rank",
    "--fp8-format",
    "--fp8-recipe",
    "--fp4-format",
    "--fp4-recipe",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--moe-token-dispatcher-type",
    "--moe-flex-dispatcher-backend",
    "--moe-layer-freq",
    "--data-parallel-sharding-strategy",
    "--ckpt-format",
    "--pipeline-model-parallel-layout",
    "--mtp-num-layers",
]
SWITCHES = [
    "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split",
    "--group-query-attention",
    "--swiglu",
    "--squared-relu",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--multi-latent-attention",
    "--bf16",
    "--fp16",
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--tp-comm-overlap",
    "--use-flash-attn",
    "--optimizer-cpu-offload",
    "--overlap-moe-expert-parallel-comm",
    "--cross-entropy-loss-fusion",
    "--no-overlap-p2p-communication",
    "--moe-grouped-gemm",
    "--use-megatron-fsdp",
    "--use-rope-scaling",
]
# taking one or more values (nargs="+" in Megatron-LM): the CP exchange (one for every layer, or one per
# layer) and the hierarchical CP sizes of a2a+p2p
MULTI = ["--cp-comm-type", "--hierarchical-context-parallel-sizes"]


def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for f in VALUED:
        p.add_argument(f)
    for f in SWITCHES:
        p.add_argument(f, action="store_true")
    for f in MULTI:
        p.add_argument(f, nargs="+")
    return p


def parse(text: str) -> argparse.Namespace:
    cmd = [ln for ln in text.splitlines() if not ln.startswith("#")]
    words = shlex.split(" ".join(ln.rstrip("\\") for ln in cmd))
    assert words[:4] == ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py"]
    return megatron_parser().parse_args(words[4:])  # exits (SystemExit) on an unknown flag


def _problem(llm, ex):
    return problem_and_knobs(
        library_llm(llm),
        library_system("h100-sxm-80gb"),
        512,
        Training(global_batch=512, precision="bf16"),
        ex,
    )[0]


def test_llama_dense_gqa_flags():
    ex = Execution(
        tp=8, pp=4, vpp=2, cp=2, sequence_parallel=True, recompute="selective", zero=2, pp_embedding_loss=True
    )
    text = emit("megatron", _problem("llama3.1-70b", ex), ex)
    a = parse(text)
    assert a.num_layers == "80" and a.hidden_size == "8192" and a.ffn_hidden_size == "28672"
    assert a.group_query_attention and a.num_query_groups == "8" and a.num_attention_heads == "64"
    assert a.swiglu and a.normalization == "RMSNorm" and a.position_embedding_type == "rope"
    # Llama 3.1's rotary base and its frequency rescaling (x8), from the model file
    assert a.rotary_base == "500000" and a.use_rope_scaling and a.rope_scaling_factor == "8"
    assert a.untie_embeddings_and_output_weights and a.disable_bias_linear
    assert a.num_virtual_stages_per_pipeline_rank == "2" and a.context_parallel_size == "2"
    assert a.account_for_embedding_in_pipeline_split and a.account_for_loss_in_pipeline_split
    # ZeRO-2 runs on Megatron FSDP; its note is a comment before the command, not inside the continued lines
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads"
    assert a.ckpt_format == "fsdp_dtensor" and a.use_distributed_optimizer
    assert text.startswith("# ZeRO-2")
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_rope_flags_follow_the_model(tmp_path):
    """Mixtral states only its base (no rescaling flags); a model without `rope` gets no rotary flags."""
    ex = Execution(tp=2, pp=4, ep=8, etp=1)
    a = parse(emit("megatron", _problem("mixtral-8x7b", ex), ex))
    assert a.rotary_base == "1000000" and not a.use_rope_scaling and a.rope_scaling_factor is None
    ex = Execution(tp=8, pp=8)
    a = parse(emit("megatron", _problem("gpt3-175b", ex), ex))
    assert a.rotary_base is None


def test_moe_flags():
    ex = Execution(tp=2, pp=4, ep=8, etp=1)
    a = parse(emit("megatron", _problem("mixtral-8x7b", ex), ex))
    assert a.num_experts == "8" and a.moe_router_topk == "2" and a.moe_ffn_hidden_size == "14336"
    assert a.expert_model_parallel_size == "8" and a.expert_tensor_parallel_size == "1"
    # the all-to-all dispatcher and grouped expert GEMMs that were priced (Megatron's defaults: allgather, a
    # GEMM per expert); every layer MoE: no layer pattern
    assert a.moe_token_dispatcher_type == "alltoall" and a.moe_grouped_gemm and a.moe_layer_freq is None
    assert not a.overlap_moe_expert_parallel_comm
    ex = Execution(tp=2, pp=4, ep=8, etp=1, moe_dispatcher="flex", ep_overlap=True)
    a = parse(emit("megatron", _problem("mixtral-8x7b", ex), ex))
    assert a.moe_token_dispatcher_type == "flex" and a.moe_flex_dispatcher_backend == "deepep"
    assert a.overlap_moe_expert_parallel_comm


def _moe_freq(pattern: str) -> list[int]:
    """Megatron's --moe-layer-freq pattern as its arguments.py evaluates it (digits, brackets, +, * only)."""
    assert set(pattern) <= set("0123456789[]()+*,")
    return eval(pattern)  # noqa: S307 - checked above, as Megatron's _eval_pattern does


def test_moe_layer_pattern_puts_the_dense_layers_first():
    """DeepSeek-V3's first 3 layers are dense (58 of 61 MoE): --moe-layer-freq says so, the dense layers
    first as the model places them, and --ffn-hidden-size is their width."""
    ex = Execution(tp=8, pp=8, dp=8, ep=8, etp=1, sequence_parallel=True, zero=1)
    a = parse(emit("megatron", _problem("deepseek-v3", ex), ex))
    assert _moe_freq(a.moe_layer_freq) == [0] * 3 + [1] * 58
    assert a.ffn_hidden_size == "18432" and a.moe_ffn_hidden_size == "2048"


@pytest.mark.parametrize(
    "zero,strategy", [(0, None), (1, None), (2, "optim_grads"), (3, "optim_grads_params")]
)
def test_zero_stages_run_on_megatron_fsdp(zero, strategy):
    """ZeRO-1 is the distributed optimizer; ZeRO-2/3 are Megatron FSDP with the stage's sharding strategy
    and the fsdp_dtensor checkpoint format it requires, not a comment."""
    ex = Execution(tp=8, pp=4, dp=16, zero=zero)
    text = emit("megatron", _problem("llama3.1-70b", ex), ex)
    a = parse(text)
    assert a.use_distributed_optimizer == (zero >= 1)
    assert a.use_megatron_fsdp == (zero >= 2) and a.data_parallel_sharding_strategy == strategy
    assert a.ckpt_format == ("fsdp_dtensor" if zero >= 2 else None)
    assert not any("no Megatron-LM flag" in ln for ln in text.splitlines())


@pytest.mark.parametrize("zero,dp_overlap", [(0, True), (1, True), (1, False)])
def test_dp_overlap_flags(zero, dp_overlap):
    """Gradient reduction overlaps with --overlap-grad-reduce; the distributed optimizer's parameter
    all-gather too (--overlap-param-gather) when it shards (ZeRO-1), whatever the MoE knobs."""
    ex = Execution(tp=8, pp=4, zero=zero, dp_overlap=dp_overlap)
    a = parse(emit("megatron", _problem("llama3.1-70b", ex), ex))
    assert a.overlap_grad_reduce == dp_overlap
    assert a.overlap_param_gather == (dp_overlap and zero >= 1)


def test_loss_fusion_and_interleaved_p2p_overlap_flags():
    """The fused loss is Megatron's --cross-entropy-loss-fusion; interleaved exchanges overlap by default in
    Megatron-LM, so only a plan without the overlap says --no-overlap-p2p-communication."""
    ex = Execution(tp=8, pp=4, vpp=2)
    a = parse(emit("megatron", _problem("llama3.1-70b", ex), ex))
    assert a.cross_entropy_loss_fusion and not a.no_overlap_p2p_communication
    ex = Execution(tp=8, pp=4, vpp=2, pp_overlap=False, fused_loss=False)
    a = parse(emit("megatron", _problem("llama3.1-70b", ex), ex))
    assert a.no_overlap_p2p_communication and not a.cross_entropy_loss_fusion
    ex = Execution(tp=8, pp=4, pp_overlap=False)  # no interleaving: nothing to say
    assert not parse(emit("megatron", _problem("llama3.1-70b", ex), ex)).no_overlap_p2p_communication


def test_unknown_target():
    with pytest.raises(ValueError):
        emit("nope", None, None)


def _plan(tmp_path, text):
    from optimizer.drivers.solve import solve
    from optimizer.io.loader import load_problem

    path = tmp_path / "p.yaml"
    path.write_text(text)
    p = load_problem(path)
    return p, solve(p).plans[0].evaluation.execution


MIXTRAL = (
    "llm: mixtral-8x7b\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {global_batch: 256}\n"
    "search: {tp: 2, pp: 2, vpp: 2, ep: 8, recompute: full, zero: 1}\n"
)


class Recipe:
    """Stands in for a NeMo 2 recipe: attribute paths spring into being (empty, falsy, until assigned) and
    record the assignments; an assigned value reads back."""

    def __init__(self, path=""):
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_set", {})

    def __getattr__(self, name):
        child = Recipe(f"{self._path}.{name}".lstrip("."))
        object.__setattr__(child, "_set", self._set)
        object.__setattr__(self, name, child)
        return child

    def __setattr__(self, name, value):
        self._set[f"{self._path}.{name}".lstrip(".")] = value
        object.__setattr__(self, name, value)

    def __bool__(self):
        return False


class Config:
    """Stands in for nemo_run.Config: the class configured and its arguments."""

    def __init__(self, cls, **kw):
        self.cls, self.kw = cls, kw


def run_nemo(code: str, monkeypatch) -> dict:
    """The assignments of NeMo overrides `code` run on a `Recipe`, with nemo_run and NeMo's comm-overlap
    callback module stood in for."""
    import types

    callbacks = types.ModuleType("megatron_comm_overlap")
    callbacks.MegatronCommOverlapCallback = type("MegatronCommOverlapCallback", (), {})
    monkeypatch.setitem(sys.modules, "nemo_run", types.SimpleNamespace(Config=Config))
    monkeypatch.setitem(sys.modules, "nemo.lightning.pytorch.callbacks.megatron_comm_overlap", callbacks)
    for name in ("nemo", "nemo.lightning", "nemo.lightning.pytorch", "nemo.lightning.pytorch.callbacks"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    recipe = Recipe()
    exec(compile(code, "nemo_overrides", "exec"), {"recipe": recipe})
    return recipe._set


def test_nemo_overrides_are_python_assigning_the_plan(tmp_path, monkeypatch):
    p, ex = _plan(tmp_path, MIXTRAL)
    got = run_nemo(emit("nemo", p, ex), monkeypatch)
    assert got["trainer.strategy.tensor_model_parallel_size"] == ex.tp == 2
    assert got["trainer.strategy.pipeline_model_parallel_size"] == ex.pp == 2
    assert got["trainer.strategy.virtual_pipeline_model_parallel_size"] == 2
    assert got["trainer.strategy.expert_model_parallel_size"] == 8
    assert got["data.global_batch_size"] == 256 and got["data.micro_batch_size"] == ex.micro_batch
    assert (
        got["model.config.recompute_granularity"] == "full" and got["optim.config.use_distributed_optimizer"]
    )
    assert got["trainer.num_nodes"] * got["trainer.devices"] == 64


def test_torchtitan_toml_degrees_cover_the_gpus(tmp_path):
    import tomllib

    p, ex = _plan(tmp_path, MIXTRAL)
    t = tomllib.loads(emit("torchtitan", p, ex))
    par, tr = t["parallelism"], t["training"]
    gpus = (
        par["data_parallel_replicate_degree"]
        * par["data_parallel_shard_degree"]
        * par["tensor_parallel_degree"]
        * par["context_parallel_degree"]
        * par["pipeline_parallel_degree"]
    )
    assert gpus == 64
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and par["expert_parallel_degree"] == 8
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert tr["local_batch_size"] * dp == tr["global_batch_size"] == 256
    assert t["activation_checkpoint"]["mode"] == "full"


def test_deepspeed_json_batch_identity(tmp_path):
    import json

    p, ex = _plan(tmp_path, MIXTRAL)
    d = json.loads(emit("deepspeed", p, ex))
    assert (
        d["train_batch_size"]
        == d["train_micro_batch_size_per_gpu"] * d["gradient_accumulation_steps"] * ex.dp
    )
    assert d["zero_optimization"]["stage"] == ex.zero == 1 and d["bf16"]["enabled"]
    assert "activation_checkpointing" in d


def _maxtext(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_maxtext_mesh_covers_the_gpus_and_the_batch_adds_up(tmp_path):
    """MaxText's overrides: the ici axes fill a node and the dcn axes the nodes (tensor innermost), the fsdp
    axis carries ZeRO-3 and the data axis replicas, and per-device batch x devices x accumulation is the
    global batch; a plan's recompute comes back as the remat policy that runs it."""
    from math import prod

    text = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {global_batch: 256}\n"
    text += "stack: maxtext\n"
    for execution, data in (
        ("{tp: 2, pp: 1, micro_batch: 1, zero: 3, recompute: full}", "fsdp"),
        ("{tp: 4, pp: 1, micro_batch: 2, zero: 0, recompute: selective}", "data"),
    ):
        path = tmp_path / "p.yaml"
        path.write_text(text + f"execution: {execution}\n")
        p = load_problem(path)
        ex = evaluate_execution(p).execution
        o = _maxtext(emit("maxtext", p, ex))
        axes = ("tensor", "context", "expert", data, "pipeline")
        assert prod(int(o[f"ici_{a}_parallelism"]) for a in axes) == 8
        assert prod(int(o[f"dcn_{a}_parallelism"]) for a in axes) == 8
        assert int(o["ici_tensor_parallelism"]) == ex.tp and int(o[f"ici_{data}_parallelism"]) == 8 // ex.tp
        batch = float(o["per_device_batch_size"]) * 64 * int(o["gradient_accumulation_steps"])
        assert batch == 256 and int(o["base_num_decoder_layers"]) == p.llm.layers
        assert o["remat_policy"] == ("full" if ex.recompute.value == "full" else "minimal")
    # a selective recompute a policy runs exactly is that policy
    from optimizer.report.export.maxtext import remat_policy

    ex = Execution(
        tp=1, recompute="selective", recompute_modules=["core_attn", "attn_proj", "mlp_up", "layernorm"]
    )
    assert remat_policy(ex) == ("save_qkv_proj", None)


def test_maxtext_pipeline_sequence_parallel_and_fp32_overrides(tmp_path):
    """With a pipeline the whole batch is split into num_pipeline_microbatches, each stage holding its layers
    once (one repeat, not a circular pipeline); TP with sequence parallelism is the tensor_sequence axis; fp32
    training is dtype float32; a fraction of a sequence per device is written exactly."""
    text = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 24\nstack: maxtext\n"
    text += "training: {global_batch: 48, precision: fp32}\n"
    text += "execution: {tp: 2, pp: 4, micro_batch: 1, sequence_parallel: true, zero: 0}\n"
    path = tmp_path / "p.yaml"
    path.write_text(text)
    p = load_problem(path)
    ex = evaluate_execution(p).execution
    o = _maxtext(emit("maxtext", p, ex))
    assert int(o["ici_tensor_sequence_parallelism"]) == 2 and "ici_tensor_parallelism" not in o
    assert int(o["num_pipeline_microbatches"]) == 48 // ex.dp and int(o["num_layers_per_pipeline_stage"]) == 8
    assert int(float(o["per_device_batch_size"]) * 24) == 48 and o["dtype"] == "float32"


@pytest.mark.parametrize("command", ["solve", "evaluate", "check"])
@pytest.mark.parametrize("target", ["megatron", "nemo", "torchtitan", "deepspeed", "maxtext"])
def test_emit_on_every_command(tmp_path, capsys, command, target):
    import json

    from optimizer.cli import main

    path = tmp_path / "p.yaml"
    body = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n"
    if command == "evaluate":
        body += "execution: {tp: 2, pp: 1}\n"
    path.write_text(body)
    assert main([command, str(path), "--emit", target]) == 0
    title = {
        "megatron": "Megatron-LM command:",
        "nemo": "NeMo 2 recipe overrides:",
        "torchtitan": "torchtitan config:",
        "deepspeed": "DeepSpeed config:",
        "maxtext": "MaxText config overrides:",
    }[target]
    assert title in capsys.readouterr().out
    assert main([command, str(path), "--emit", target, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["emit"]["target"] == target and d["emit"]["text"]


def test_triton_attention_plan_exports_flash_with_a_note():
    """A plan with FlashAttention's Triton kernel (llm-foundry's) has no Megatron-LM kernel of its own: the
    export turns flash attention on and says, in a comment before the command, that Megatron's kernel is
    faster."""
    ex = Execution(tp=1, pp=1, attention="flash-triton")
    text = emit("megatron", _problem("llama3.1-8b", ex), ex)
    assert parse(text).use_flash_attn
    assert any(ln.startswith("#") and "flash-triton" in ln for ln in text.splitlines())


def test_nemo_tp_comm_overlap_is_the_comm_overlap_callback(monkeypatch):
    """The plan's TP communication overlap is NeMo's MegatronCommOverlapCallback(tp_comm_overlap=True),
    appended to the trainer's callbacks, with the plan's data-parallel and interleaved-pipeline overlaps
    (the callback's own defaults would override them); a plan without it adds no callback."""
    ex = Execution(
        tp=4, pp=2, vpp=2, dp=8, sequence_parallel=True, tp_overlap="ring", zero=1, dp_overlap=False
    )
    got = run_nemo(emit("nemo", _problem("llama3.1-70b", ex), ex), monkeypatch)
    (cb,) = got["trainer.callbacks"]
    assert cb.cls.__name__ == "MegatronCommOverlapCallback"
    assert cb.kw == {
        "tp_comm_overlap": True,
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "overlap_p2p_comm": True,
    }
    ex = Execution(tp=4, pp=2, dp=8, sequence_parallel=True)
    assert "trainer.callbacks" not in run_nemo(emit("nemo", _problem("llama3.1-70b", ex), ex), monkeypatch)


def _titan(ex, llm="llama3.1-8b"):
    import tomllib

    return tomllib.loads(emit("torchtitan", _problem(llm, ex), ex))


def test_torchtitan_builds_pp_times_vpp_stages():
    """Interleaving: torchtitan builds ceil((layers + first + last stage's embedding/output weights) /
    layers_per_stage) stages (`pipeline_parallel.py`); the export sets them so that it builds pp*vpp stages
    of layers / (pp*vpp) layers, the embedding and output taking no slot (as modelled without
    pp_embedding_loss)."""
    for pp, vpp in [(2, 2), (4, 4), (2, 1)]:
        par = _titan(Execution(tp=1, pp=pp, vpp=vpp, dp=64 // pp))["parallelism"]
        assert par["pipeline_parallel_layers_per_stage"] == 32 // (pp * vpp)
        weights = (
            par["pipeline_parallel_first_stage_less_layers"] + par["pipeline_parallel_last_stage_less_layers"]
        )
        assert weights == 0
        assert -(-(32 + weights) // par["pipeline_parallel_layers_per_stage"]) == pp * vpp
        assert par["pipeline_parallel_schedule"] == ("Interleaved1F1B" if vpp > 1 else "1F1B")
    # with the embedding and loss as slots (Megatron's split): 126 layers + 2 over 8*2 stages of 8 slots
    par = _titan(Execution(tp=8, pp=8, vpp=2, dp=2, pp_embedding_loss=True), "llama3.1-405b")["parallelism"]
    assert (
        par["pipeline_parallel_first_stage_less_layers"]
        == par["pipeline_parallel_last_stage_less_layers"]
        == 1
    )
    assert par["pipeline_parallel_layers_per_stage"] == 8


def _titan_split(stages: int, layers: int, first: int, last: int) -> list[int]:
    """torchtitan's generate_llm_fqn_per_model_part: the transformer layers of each stage, the embedding and
    the output weighing `first` and `last` layers (extras on the first stages)."""
    eff = layers + first + last
    per, extra = divmod(eff, stages)
    counts = [per + (i < extra) for i in range(stages)]
    counts[0] -= first
    counts[-1] -= last
    return counts


def test_torchtitan_writes_the_modelled_custom_layout():
    """An uneven split (Llama 3.1 405B's 126 layers at pp 8): the model gives each stage ceil(126 / 8) = 16
    layers and the last the padding's 2 fewer; the export makes torchtitan build exactly that split."""
    for vpp in (1, 2):
        ex = Execution(tp=8, pp=8, vpp=vpp, dp=2, pp_uneven=True)
        par = _titan(ex, "llama3.1-405b")["parallelism"]
        per, last = par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_last_stage_less_layers"]
        n = -(-(126 + par["pipeline_parallel_first_stage_less_layers"] + last) // per)
        assert n == 8 * vpp
        counts = _titan_split(n, 126, par["pipeline_parallel_first_stage_less_layers"], last)
        stage = [sum(counts[r::8]) for r in range(8)]
        assert stage == [16] * 7 + [14]


def test_torchtitan_selective_recompute_is_per_op():
    """Selective recomputation is torchtitan's per-op SAC (option "op"), not its default of every 2nd
    layer; full recomputation needs no option."""
    ac = _titan(Execution(tp=2, dp=32, sequence_parallel=True, recompute="selective"))[
        "activation_checkpoint"
    ]
    assert ac == {"mode": "selective", "selective_ac_option": "op"}
    ac = _titan(Execution(tp=2, dp=32, sequence_parallel=True, recompute="full"))["activation_checkpoint"]
    assert ac == {"mode": "full"}


def test_torchtitan_async_tp_comes_with_a_compiled_model():
    """Async TP has no effect in torchtitan unless the model is compiled: with it the export compiles the
    model, even where the plan priced element-wise ops unfused (which a comment then says)."""
    ex = Execution(tp=4, dp=16, sequence_parallel=True, tp_overlap="ring")
    t = _titan(ex)
    assert t["parallelism"]["enable_async_tensor_parallel"]
    assert t["compile"]["enable"] and "model" in t["compile"]["components"]
    ex = Execution(
        tp=4, dp=16, sequence_parallel=True, tp_overlap="ring", fused_layers=False, fused_loss=False
    )
    text = emit("torchtitan", _problem("llama3.1-8b", ex), ex)
    assert any(ln.startswith("# async TP needs the model compiled") for ln in text.splitlines())
    assert _titan(ex)["compile"] == {"enable": True, "components": ["model"]}
    ex = Execution(tp=4, dp=16, sequence_parallel=True, fused_layers=False, fused_loss=False)
    assert _titan(ex)["compile"] == {"enable": False}


def _unroll_layout(layout: str) -> list[str]:
    """Megatron-Core's PipelineParallelLayerLayout.parse_str_to_list: commas dropped, (..)*n and x*n
    unrolled, chunks split at "|"."""
    import re

    s = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        s = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), s)
    return s.split("|")


@pytest.mark.parametrize("pp,vpp,el", [(16, 1, False), (16, 1, True), (8, 4, True), (8, 2, False)])
def test_an_uneven_split_exports_as_a_pipeline_layout(pp, vpp, el):
    """DeepSeek-V3's 61 layers and MTP module over pp x vpp chunks: --pipeline-model-parallel-layout has
    pp*vpp chunks, the 61 layers, the embedding first, the MTP module and the loss last; each stage holds at
    most the modelled busiest one's ceil(slots / pp) slots (layers, the MTP block, with el the embedding and
    loss) and the last stage the padding fewer (Bridge's 'tmL' at pp 16); the virtual-stage count and slot
    flags are left to the layout."""
    ex = Execution(tp=1, pp=pp, vpp=vpp, dp=512 // pp, ep=8, pp_uneven=True, pp_embedding_loss=el)
    a = parse(emit("megatron", _problem("deepseek-v3", ex), ex))
    chunks = _unroll_layout(a.pipeline_model_parallel_layout)
    assert len(chunks) == pp * vpp and sum(c.count("t") for c in chunks) == 61
    assert chunks[0].startswith("E") and chunks[-1].endswith("mL") and all(c for c in chunks)
    joined = "".join(chunks)
    assert joined.count("E") == 1 and joined.count("L") == 1 and joined.count("m") == 1
    units = [c.count("t") + c.count("m") + (c.count("E") + c.count("L") if el else 0) for c in chunks]
    stage = [sum(units[r::pp]) for r in range(pp)]
    total = 62 + 2 * el
    busiest = -(-total // pp)
    assert max(stage) == busiest and stage[-1] == busiest - min(pp * busiest - total, busiest)
    assert a.mtp_num_layers == "1"
    assert a.num_virtual_stages_per_pipeline_rank is None and not a.account_for_embedding_in_pipeline_split
    if (pp, vpp, el) == (16, 1, False):
        assert chunks[-1] == "tmL" and chunks[0] == "Etttt"


def test_an_even_split_writes_no_layout():
    """pp_uneven on a split that divides (64 slots over 16 chunks) is the even split: no layout."""
    ex = Execution(tp=1, pp=8, vpp=2, dp=64, pp_uneven=True)
    a = parse(emit("megatron", _problem("llama3.1-70b", ex), ex))
    assert a.pipeline_model_parallel_layout is None and a.num_virtual_stages_per_pipeline_rank == "2"


def test_nemo_writes_an_uneven_split_on_the_strategy_and_keeps_vpp(monkeypatch):
    """NeMo's MegatronStrategy copies its own pipeline_model_parallel_layout (None unless set) onto the model
    config and builds vpp model chunks: the layout goes on the strategy, and vpp stays."""
    ex = Execution(tp=1, pp=8, vpp=4, dp=64, ep=8, pp_uneven=True, pp_embedding_loss=True)
    got = run_nemo(emit("nemo", _problem("deepseek-v3", ex), ex), monkeypatch)
    chunks = _unroll_layout(got["trainer.strategy.pipeline_model_parallel_layout"])
    assert len(chunks) == 32 and sum(c.count("t") for c in chunks) == 61
    assert got["trainer.strategy.virtual_pipeline_model_parallel_size"] == 4
    assert "model.config.pipeline_model_parallel_layout" not in got
    assert not got.get("trainer.strategy.account_for_embedding_in_pipeline_split")
