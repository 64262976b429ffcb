"""Context parallelism by K/V exchange (`execution.cp_comm`): p2p ring, all-gather, all-to-all (Ulysses) and
hierarchical a2a + p2p. Hand-worked exchange times, the kernel each leaves the rank, the head rules, the
solver's choice on each side of the crossings the physics sets, CP-SAT against the enumerator, exports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import run_cli

from optimizer import api
from optimizer.errors import ProblemErrors
from optimizer.model.hardware import Tiers
from optimizer.model.knobs import from_execution
from optimizer.model.layer import attention_core, block_shape, cp_exchange_s, cp_view
from optimizer.model.step import make_ctx
from optimizer.rules.layout import cp_a2a_degree, cp_comm_codes
from optimizer.schema import Execution

PROBLEM = """name: cp
llm: {llm}
system: h100-sxm-80gb
num_gpus: {n}
training: {{global_batch: {gb}, seq_len: {seq}, precision: bf16}}
execution: {{tp: {tp}, pp: 1, cp: {cp}, micro_batch: 1, recompute: none, zero: 3, cp_comm: {cpc}}}
"""


def _load(tmp_path, llm="llama3.1-8b", tp=1, cp=8, seq=32768, cpc="p2p", n=None, gb=2):
    p = tmp_path / f"{llm}-{tp}-{cp}-{seq}-{cpc}.yaml"
    n = n or tp * cp * 2
    p.write_text(PROBLEM.format(llm=llm, tp=tp, cp=cp, seq=seq, cpc=cpc, n=n, gb=gb))
    return api.load(p, require_execution=True)


def _block(problem):
    ex = problem.execution
    k = from_execution(ex, problem.system, problem.num_gpus)
    ctx = make_ctx(problem)
    sh = block_shape(ctx, k, False)
    return ctx, k, sh, attention_core(ctx, k, sh)


def test_a2a_by_hand(tmp_path):
    """Ulysses inside one NVLink domain: Q, K, V in and O out, then dO in and dQ, dK, dV out, each an
    all-to-all of T (2 a_h + 2 g) d e bytes per rank, all exposed."""
    p = _load(tmp_path, cpc="a2a")
    ctx, k, sh, att = _block(p)
    T = 1 * 32768 / 8  # tokens of the rank
    per_dir = T * (2 * 32 + 2 * 8) * 128 * 2
    t = Tiers.of(p.system)
    one = 7 / 8 * per_dir / t.bandwidth[0] + 7 * t.latency[0]
    link, exp = cp_exchange_s(ctx, k, sh, att, np.array([False]))
    assert float(exp[0]) == pytest.approx(2 * one, rel=1e-9)
    assert float(link[0]) == pytest.approx(2 * one, rel=1e-9)


def test_all_gather_by_hand(tmp_path):
    """K and V gathered before the attention, gathered again and dK, dV reduce-scattered in backward: three
    collectives of the whole sequence's K/V (2 b s g d e bytes), none overlapped."""
    p = _load(tmp_path, cpc="all_gather")
    ctx, k, sh, att = _block(p)
    full = 2 * 1 * 32768 * 8 * 128 * 2
    t = Tiers.of(p.system)
    one = 7 / 8 * full / t.bandwidth[0] + 7 * t.latency[0]
    _, exp = cp_exchange_s(ctx, k, sh, att, np.array([False]))
    assert float(exp[0]) == pytest.approx(3 * one, rel=1e-9)
    _, exp_re = cp_exchange_s(ctx, k, sh, att, np.array([True]))  # recompute gathers once more
    assert float(exp_re[0]) == pytest.approx(4 * one, rel=1e-9)


def test_the_kernel_each_exchange_leaves(tmp_path):
    """The same attention FLOPs every way; a2a turns the sequence split into a head split, all_gather and
    a2a run without the ring's steps and merges, a2a_p2p keeps a ring over the NVLink domains."""
    views, flops = {}, {}
    for cpc in ("p2p", "all_gather", "a2a", "a2a_p2p"):  # GPT-3 175B: 96 heads, no GQA
        p = _load(tmp_path, llm="gpt3-175b", cp=16, cpc=cpc, seq=65536)
        ctx, k, sh, att = _block(p)
        views[cpc] = cp_view(ctx, k, sh)
        flops[cpc] = float(att.flops_fw[0])
    assert len({round(f) for f in flops.values()}) == 1
    v = {c: (float(x.a[0]), float(x.ring[0]), float(x.ah[0]), float(x.sq[0])) for c, x in views.items()}
    assert v["p2p"] == (1, 16, 96, 4096)
    assert v["all_gather"] == (1, 1, 96, 4096)
    assert v["a2a"] == (16, 1, 6, 65536)
    assert v["a2a_p2p"] == (8, 2, 12, 32768)  # 8 cp ranks per 8-GPU node, a ring over 2 nodes
    assert float(views["a2a"].kva[0]) == 6 and float(views["p2p"].kva[0]) == 96


def test_head_rules():
    # Llama 3.1 8B: 32 heads, 8 K/V heads, H100 nodes of 8 GPUs
    assert cp_comm_codes(32, 8, 1, 1, 8) == [0]  # no context parallelism: the knob is moot
    assert cp_comm_codes(32, 8, 1, 8, 8) == [0, 1, 2]  # a2a over 8 ranks: 8 | 8; a2a_p2p degenerate
    assert cp_comm_codes(32, 8, 1, 16, 8) == [0, 1, 3]  # 16 does not divide 8 K/V heads; 8 x 2 does
    assert cp_comm_codes(32, 8, 8, 2, 8) == [0, 1]  # tp 8 leaves one K/V head per rank
    assert int(cp_a2a_degree(2, 16, 8)) == 4
    assert int(cp_a2a_degree(1, 6, 72)) == 6  # an NVL72 domain holds all 6


def test_a2a_the_heads_forbid_is_a_file_error(tmp_path, capsys):
    body = PROBLEM.format(llm="llama3.1-70b", tp=8, cp=2, seq=32768, cpc="a2a", n=32, gb=2)
    rc, _, err, path = run_cli(tmp_path, capsys, body, command="evaluate")
    assert rc == 2 and "execution.cp_comm" in err and "kv_heads 8" in err and str(path) in err
    with pytest.raises(ProblemErrors):
        _load(tmp_path, llm="llama3.1-8b", tp=1, cp=16, cpc="a2a")  # 16 ranks, 8 K/V heads
    # a2a_p2p whose NVLink share of cp is 1 (tp 8 fills the node) is the ring itself: legal
    assert _load(tmp_path, llm="llama3.1-70b", tp=8, cp=2, cpc="a2a_p2p", n=32).execution.cp == 2


def test_torchtitan_offers_its_ring_only(tmp_path, capsys):
    body = PROBLEM.format(llm="llama3.1-8b", tp=1, cp=8, seq=32768, cpc="a2a", n=16, gb=2)
    rc, _, err, _ = run_cli(tmp_path, capsys, body + "stack: torchtitan\n", command="evaluate")
    assert rc == 2 and "cp_comm" in err and "torchtitan" in err


SOLVE = """name: cp-choice
llm: {llm}
system: h100-sxm-80gb
num_gpus: {n}
training: {{global_batch: 2, seq_len: {seq}, precision: bf16}}
search: {{tp: {tp}, cp: {cp}, pp: 1, micro_batch: 1, recompute: full, zero: 3,
         cp_comm: [p2p, all_gather, a2a, a2a_p2p]}}
"""


def _choice(tmp_path, llm, tp, cp, seq):
    p = tmp_path / f"s-{llm}-{tp}-{cp}-{seq}.yaml"
    p.write_text(SOLVE.format(llm=llm, tp=tp, cp=cp, seq=seq, n=2 * tp * cp))
    r = api.solve(api.load(p))
    assert r.status == "optimal"
    return r.plans[0].evaluation.execution.cp_comm.value


def test_crossing_all_gather_to_ring_as_cp_grows(tmp_path):
    """Llama 3.1 70B at tp 8 keeps one K/V head per rank, so no all-to-all: with 2 CP ranks the one
    all-gather costs less than the ring's step and merge; with 16, over InfiniBand, the gather's (cp-1)/cp
    of the sequence's K/V is exposed while the ring hides behind the attention."""
    assert _choice(tmp_path, "llama3.1-70b", 8, 2, 131072) == "all_gather"
    assert _choice(tmp_path, "llama3.1-70b", 8, 16, 131072) == "p2p"


def test_crossing_a2a_to_hierarchical_past_the_node(tmp_path):
    """Llama 3.1 8B at tp 1: 8 CP ranks in one node take the all-to-all (whole keys per kernel, no merges);
    16 ranks span two nodes and 16 does not divide its 8 K/V heads, so a2a inside each node and a ring of
    two across."""
    assert _choice(tmp_path, "llama3.1-8b", 1, 8, 131072) == "a2a"
    assert _choice(tmp_path, "llama3.1-8b", 1, 16, 131072) == "a2a_p2p"


def test_unnamed_stays_p2p(tmp_path):
    p = tmp_path / "u.yaml"
    p.write_text(
        SOLVE.format(llm="llama3.1-8b", tp=1, cp=8, seq=131072, n=16).replace(
            ",\n         cp_comm: [p2p, all_gather, a2a, a2a_p2p]", ""
        )
    )
    r = api.solve(api.load(p))
    assert r.plans[0].evaluation.execution.cp_comm.value == "p2p"


def test_exports_name_the_exchange(tmp_path):
    p = _load(tmp_path, cp=16, cpc="a2a_p2p", seq=65536)
    meg = api.emit("megatron", p, p.execution)
    assert "--cp-comm-type a2a+p2p" in meg and "--hierarchical-context-parallel-sizes 8 2" in meg
    nemo = api.emit("nemo", p, p.execution)
    assert "cp_comm_type" in nemo and "a2a+p2p" in nemo and "does not pass hierarchical" in nemo
    ex = Execution(tp=1, cp=1, micro_batch=1)
    assert "--cp-comm-type" not in api.emit("megatron", p, ex)


OSS = (
    "llm: gpt-oss-120b\nsystem: h100-sxm-80gb\nnum_gpus: 64\n"
    "training: {global_batch: 16, seq_len: 65536, precision: bf16}\n"
)
SWA = (
    "llm: {name: w, hidden: 4096, ffn: 14336, layers: 8, heads: 32, kv_heads: 8, seq_len: 65536,"
    " vocab: 32000,"
    " mlp: swiglu, sliding_window: {tokens: 4096}}\nsystem: h100-sxm-80gb\nnum_gpus: 16\n"
    "training: {global_batch: 2, precision: bf16}\n"
)


def test_sinks_take_a2a_only(tmp_path, capsys):
    """Learned softmax sinks run only with a2a context parallelism in Transformer Engine (it asserts
    softmax_type vanilla or a2a; TransformerEngine #2541): GPT-OSS with CP takes a2a, unnamed included, and
    a written p2p or all_gather is a file error; without CP nothing changes."""
    p = tmp_path / "oss.yaml"
    p.write_text(OSS + "search: {cp: [2, 4], tp: [1, 2], pp: 4}\n")
    ex = api.solve(api.load(p)).plans[0].evaluation.execution
    assert ex.cp > 1 and ex.cp_comm.value == "a2a"
    written = OSS + "execution: {tp: 2, pp: 4, cp: 2, ep: 8, etp: 1, micro_batch: 1, cp_comm: CPC}\n"
    for cpc in ("p2p", "all_gather"):
        rc, _, err, _ = run_cli(tmp_path, capsys, written.replace("CPC", cpc), command="evaluate")
        assert rc == 2 and "execution.cp_comm" in err and "sinks" in err
    rc, _, err, _ = run_cli(tmp_path, capsys, written.replace("CPC", "a2a"), command="evaluate")
    assert rc == 0, err
    p.write_text(OSS + "search: {cp: [1, 2, 4], tp: 8, pp: 4}\n")  # tp 8: one K/V head per rank, no a2a
    assert api.solve(api.load(p)).plans[0].evaluation.execution.cp == 1


def test_sliding_windows_leave_the_ring(tmp_path, capsys):
    """Sliding windows run with all_gather or a2a only (Megatron-LM PR #1160, #2222)."""
    p = tmp_path / "swa.yaml"
    p.write_text(SWA + "search: {cp: 16, tp: 1, pp: 1}\n")  # a2a: 16 does not divide 8 K/V heads
    assert api.solve(api.load(p)).plans[0].evaluation.execution.cp_comm.value == "all_gather"
    written = SWA + "execution: {tp: 1, pp: 1, cp: 8, micro_batch: 1, cp_comm: CPC}\n"
    for cpc, rc_want in (("p2p", 2), ("a2a_p2p", 2), ("all_gather", 0), ("a2a", 0)):
        rc, _, err, _ = run_cli(tmp_path, capsys, written.replace("CPC", cpc), command="evaluate")
        assert rc == rc_want, (cpc, err)


def test_search_of_only_illegal_exchanges_fits_nothing(tmp_path, capsys):
    """An exchange the heads forbid is not offered in its place: 16 CP ranks with a2a only over 8 K/V heads
    leave no plan (exit 3), not an a2a plan the kernels would refuse."""
    body = (
        "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 16\n"
        "training: {global_batch: 1, seq_len: 65536, precision: bf16}\nsearch: {cp_comm: [a2a], cp: 16}\n"
    )
    rc, _, _, _ = run_cli(tmp_path, capsys, body)
    assert rc == 3


L8B_32 = (
    "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 32\n"
    "training: {global_batch: 2, seq_len: 65536, precision: bf16}\n"
)


@pytest.mark.parametrize(
    ("body", "said", "small"),
    [
        # a2a over 16 CP ranks, 8 K/V heads: the heads forbid it
        (L8B_32 + "execution: {tp: 1, pp: 1, cp: 16, micro_batch: 1, cp_comm: a2a}\n", "8 K/V heads", True),
        # cp not written, but 32 GPUs and 2 sequences at tp 1 leave only cp 16 or 32
        (L8B_32 + "execution: {tp: 1, pp: 1, micro_batch: 1, cp_comm: a2a}\n", "cp [16, 32]", True),
        # GPT-OSS's sinks: the ring cannot run them, whatever the heads
        (
            OSS + "execution: {tp: 1, pp: 4, cp: 2, ep: 8, etp: 1, micro_batch: 1, cp_comm: p2p}\n",
            "sinks",
            False,
        ),
    ],
)
def test_check_names_the_exchange_as_the_conflict(tmp_path, capsys, body, said, small):
    """`check` on a plan whose CP exchange cannot run: the conflict is the fixed exchange, said with its
    cause, and the first relaxation releases it (an 8B model on 32 H100 then fits: p2p or all_gather)."""
    rc, out, _, _ = run_cli(tmp_path, capsys, body, "--json", command="check")
    d = json.loads(out)
    assert rc == 3 and d["fits"] is False
    assert d["conflicts"][0]["group"] == "fixed.cp_comm" and said in d["conflicts"][0]["reason"]
    assert d["relaxations"][0]["value"] == "cp_comm"
    if small:
        assert d["relaxations"][0]["fits"] is True
