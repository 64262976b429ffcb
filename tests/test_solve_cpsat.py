"""CP-SAT (`--method cpsat`) against the exhaustive oracle on small problems: same optimum within 0.1%."""

from __future__ import annotations

import pytest

from optimizer.loader import load_problem
from optimizer.solve import solve

CASES = {
    "dense-8gpu": """
llm: {name: tiny, hidden: 1024, ffn: 4096, layers: 8, heads: 16, seq_len: 1024, vocab: 32000}
system: a100-sxm-80gb
num_gpus: 8
training: {global_batch: 16}
""",
    "gqa-swiglu-16gpu-tight-memory": """
llm: {name: g, hidden: 2048, ffn: 5632, layers: 16, heads: 16, kv_heads: 4, seq_len: 2048, vocab: 32000,
      mlp: swiglu}
system: {base: h100-sxm-80gb, hbm_gib: 6}
num_gpus: 16
training: {global_batch: 32}
search: {cp: 1}
""",
    "fixed-knobs": """
llm: {name: f, hidden: 1024, ffn: 4096, layers: 12, heads: 16, seq_len: 2048, vocab: 50000}
system: a100-sxm-40gb
num_gpus: 16
training: {global_batch: 64}
search: {tp: [2, 4], recompute: [none, selective], vpp: {max: 2}, cp: 1}
""",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpsat_matches_enumeration(tmp_path, name):
    path = tmp_path / f"{name}.yaml"
    path.write_text(CASES[name])
    p = load_problem(path)
    e = solve(p, "enumerate")
    c = solve(p, "cpsat", time_limit_s=60)
    assert c.status == "optimal"
    assert c.plans[0].objective_s == pytest.approx(e.plans[0].objective_s, rel=1e-3)
    assert c.bound_s == pytest.approx(c.plans[0].objective_s, rel=1e-3)
    assert c.candidates == e.candidates  # the same space
