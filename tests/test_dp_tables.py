"""CP-SAT's data-parallel columns against the model, per ZeRO stage and overlap setting: the traffic goes out
in each stack's own calls (`step.dp_calls`: per bucket at ZeRO 0-2, per layer at ZeRO-3), so the tables must
take every stage's link time and exposure from the model with the calls of that stage."""

from __future__ import annotations

import numpy as np
import pytest

from formulations.bounds import knobs_of_pairs, presolve
from formulations.tables import TIME_UNIT, build_all
from optimizer.io.loader import load_problem
from optimizer.model.step import evaluate
from optimizer.prepare.space import compact_space
from optimizer.rules.layout import zero_allowed

BASE = """
llm: {{name: d, hidden: 2048, ffn: 5632, layers: 16, heads: 16, kv_heads: 4, seq_len: 2048, vocab: 32000,
      mlp: swiglu}}
system: {system}
num_gpus: {n}
stack: {stack}
training: {{global_batch: 64}}
search: {{cp: {cp}, vpp: {{max: 2}}, zero: {zero}}}
execution: {{rank_order: {order}}}
"""
CASES = [  # stack, system, GPUs, ZeRO stages searched, CP degrees, rank order
    ("megatron-core", "h100-sxm-80gb", 32, "[0, 1, 2, 3]", 1, "tp-cp-dp-pp"),  # buckets, or a call per stage
    ("megatron-core", "gb200-nvl72", 256, "[1, 3]", "[1, 2]", "tp-cp-pp-dp"),  # data parallelism outermost
    ("megatron-core", "a100-sxm-80gb", 64, "[3]", 1, "tp-cp-dp-pp"),  # ZeRO-3 only
    ("deepspeed", "a100-sxm-80gb", 32, "[0, 1, 2, 3]", 1, "tp-cp-dp-pp"),
    ("torchtitan", "h100-sxm-80gb", 32, "[0, 1, 2, 3]", 1, "tp-cp-dp-pp"),
    ("fsdp", "a100-sxm-40gb", 16, "[0, 2, 3]", 1, "tp-cp-dp-pp"),
]


@pytest.mark.parametrize(("stack", "system", "n", "zero", "cp", "order"), CASES)
def test_dp_columns_match_the_model_at_every_zero_stage(tmp_path, stack, system, n, zero, cp, order):
    path = tmp_path / "dp.yaml"
    path.write_text(BASE.format(stack=stack, system=system, n=n, zero=zero, cp=cp, order=order))
    p = load_problem(path)
    Ts = build_all(p, compact_space(p))
    pre = presolve(Ts, top=10**9)
    P, cols = pre.pairs, pre.cols
    checked = 0
    for zi, z in enumerate(Ts[0].z_vals):
        legal = zero_allowed(z, cols["dpg1"]).astype(bool) & (cols["dpg1"] == 0)
        for di, overlap in enumerate(Ts[0].dpo_vals):
            if not legal.any():
                continue
            k = knobs_of_pairs(Ts, P, np.full(len(P), zi), np.full(len(P), di))
            r = evaluate(p, k)
            link = cols[f"link{z}"][legal]
            model_link = r.dp_link[legal] * TIME_UNIT
            assert np.allclose(link, model_link, rtol=1e-4, atol=2), (z, overlap)
            table = cols[f"exp{z}"][legal] if overlap else link
            assert np.allclose(table, r.dp_exposed[legal] * TIME_UNIT, rtol=1e-4, atol=1000), (z, overlap)
            checked += int(legal.sum())
    assert checked > 0
