"""Megatron-LM export: the emitted bash parses (bash -n) and its arguments parse with Megatron's names."""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess

import pytest

from optimizer.export import emit
from optimizer.schema import Execution, Training
from tests.helpers import library_llm, library_system, problem_and_knobs

# Flags as declared in Megatron-LM megatron/training/arguments.py (value-taking ones, then switches).
VALUED = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--virtual-pipeline-model-parallel-size",
          "--context-parallel-size", "--micro-batch-size", "--global-batch-size", "--num-layers", "--hidden-size",
          "--ffn-hidden-size", "--num-attention-heads", "--seq-length", "--max-position-embeddings",
          "--kv-channels", "--num-query-groups", "--normalization", "--position-embedding-type", "--num-experts",
          "--moe-router-topk", "--moe-ffn-hidden-size", "--expert-model-parallel-size",
          "--expert-tensor-parallel-size", "--moe-shared-expert-intermediate-size", "--kv-lora-rank",
          "--qk-pos-emb-head-dim", "--v-head-dim", "--q-lora-rank", "--fp8-format", "--recompute-granularity",
          "--recompute-method", "--recompute-num-layers"]
SWITCHES = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
            "--group-query-attention", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
            "--disable-bias-linear", "--multi-latent-attention", "--bf16", "--fp16", "--sequence-parallel",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
            "--use-flash-attn", "--optimizer-cpu-offload"]


def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False)
    for f in VALUED:
        p.add_argument(f)
    for f in SWITCHES:
        p.add_argument(f, action="store_true")
    return p


def parse(text: str) -> argparse.Namespace:
    cmd = [ln for ln in text.splitlines() if not ln.startswith("#")]
    words = shlex.split(" ".join(ln.rstrip("\\") for ln in cmd))
    assert words[:4] == ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py"]
    return megatron_parser().parse_args(words[4:])  # exits (SystemExit) on an unknown flag


def _problem(llm, ex):
    return problem_and_knobs(library_llm(llm), library_system("h100-sxm-80gb"), 512,
                             Training(global_batch=512, precision="bf16"), ex)[0]


def test_llama_dense_gqa_flags():
    ex = Execution(tp=8, pp=4, vpp=2, cp=2, sequence_parallel=True, recompute="selective", zero=2,
                   pp_embedding_loss=True)
    text = emit("megatron", _problem("llama3.1-70b", ex), ex)
    a = parse(text)
    assert a.num_layers == "80" and a.hidden_size == "8192" and a.ffn_hidden_size == "28672"
    assert a.group_query_attention and a.num_query_groups == "8" and a.num_attention_heads == "64"
    assert a.swiglu and a.normalization == "RMSNorm" and a.position_embedding_type == "rope"
    assert a.untie_embeddings_and_output_weights and a.disable_bias_linear
    assert a.virtual_pipeline_model_parallel_size == "2" and a.context_parallel_size == "2"
    assert a.account_for_embedding_in_pipeline_split and a.account_for_loss_in_pipeline_split
    # ZeRO-2 note is a comment before the command, not inside the continued lines
    assert text.startswith("# ZeRO-2")
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_moe_flags():
    ex = Execution(tp=2, pp=4, ep=8, etp=1)
    a = parse(emit("megatron", _problem("mixtral-8x7b", ex), ex))
    assert a.num_experts == "8" and a.moe_router_topk == "2" and a.moe_ffn_hidden_size == "14336"
    assert a.expert_model_parallel_size == "8" and a.expert_tensor_parallel_size == "1"


def test_unknown_target():
    with pytest.raises(ValueError):
        emit("nope", None, None)
