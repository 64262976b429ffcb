"""`optimizer.rules.layout`: the one place where a layout's legality lives, and the wrong answers it fixed.

Each of the four cases below gave a wrong answer while the rules lived in four places (validate, space,
the explanation model, the ZeRO rule): the space and the explanation disagreed on the embedding/loss
split, caps of the space could not be lifted, idle GPUs did not make every smaller layout legal, and a
missed step-time target was explained as memory.
"""

from __future__ import annotations

import numpy as np
import pytest

from formulations import rules
from optimizer.drivers.check import check
from optimizer.drivers.solve import solve
from optimizer.io.loader import load_problem_doc
from optimizer.prepare.space import compact_space
from optimizer.rules.layout import CAPS, Group, divisors, legal, placement, rule_masks

TINY14 = "{name: t14, hidden: 1024, ffn: 4096, layers: 14, heads: 16, seq_len: 1024, vocab: 32000}"


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_divisors_by_factorisation():
    assert divisors(1) == [1]
    assert divisors(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    assert divisors(2**40) == [2**i for i in range(41)]  # no scan up to the value
    big = 2**31 - 1  # a Mersenne prime
    assert divisors(big) == [1, big]
    for n in range(1, 400):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_embedding_loss_split_is_legal_in_space_and_explanation(tmp_path):
    """14 layers at pp 8, vpp 2: only 14 + 2 = 16 slots split 8*2 ways. The space holds such plans, and the
    explanation model (what `check` uses) agrees: no conflict (it used to name rules.interleave)."""
    path = write(
        tmp_path,
        f"llm: {TINY14}\nsystem: a100-sxm-80gb\nnum_gpus: 16\n"
        "training: {global_batch: 32}\nsearch: {pp: 8, vpp: 2}\n",
    )
    p, written = load_problem_doc(path)
    c = compact_space(p)
    assert c.size > 0
    assert {lay[6] for lay in c.layouts} == {1}  # all of them with the embedding/loss slots
    # pp = 8, vpp = 2 without the split cannot hold 14 layers; with it, it can
    assert not legal(p, tp=1, pp=8, dp=2, cp=1, vpp=2, micro_batch=1, pp_embedding_loss=0)
    assert legal(p, tp=1, pp=8, dp=2, cp=1, vpp=2, micro_batch=1, pp_embedding_loss=1)
    assert rules.conflict(p, {"pp": [8], "vpp": [2]}) is None
    r = check(p, written)
    assert r.fits and r.plan.plans[0].evaluation.execution.pp_embedding_loss


def test_default_cp_cap_is_named_and_search_lifts_it(tmp_path):
    """Llama 3.1 8B at 16K tokens: the default caps keep a dense model at cp <= 8 below 32K tokens;
    `search: {cp: 16}` lifts the cap (the space used to be empty), and with the cap in force `check`
    names it."""
    base = (
        "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 64\n"
        "training: {global_batch: 64, seq_len: 16384}\n"
    )
    p, _ = load_problem_doc(write(tmp_path, base + "search: {cp: 16}\n"))
    c = compact_space(p)
    assert c.size > 0 and {lay[2] for lay in c.layouts} == {16}
    plan = solve(p).plans[0].evaluation.execution
    assert plan.cp == 16
    # the cap: 8 for a dense model below 32K tokens, 32 otherwise
    assert CAPS.cp_limit(p) == 8
    p2, _ = load_problem_doc(write(tmp_path, base, "capped.yaml"))
    assert max(lay[2] for lay in compact_space(p2).layouts) <= 8
    # cp written in the execution is the user's own value: `check` fixes it, which lifts the cap too
    p3, written = load_problem_doc(
        write(tmp_path, base + "execution: {cp: 16, tp: 1, pp: 1}\n", "fixed.yaml")
    )
    r = check(p3, written)
    assert r.fits and r.plan.plans[0].evaluation.execution.cp == 16
    # on 16 GPUs with tp, pp and dp fixed to 1 only cp = 16 is left: the cap is the named conflict
    p4, written = load_problem_doc(
        write(
            tmp_path,
            base.replace("num_gpus: 64", "num_gpus: 16") + "search: {tp: 1, pp: 1, dp: 1}\n",
            "cap.yaml",
        )
    )
    assert compact_space(p4).size == 0
    r = check(p4, written)
    assert not r.fits
    assert "caps.cp" in {g for g, _ in r.conflicts}
    assert any("capped at 8" in t for _, t in r.conflicts)


IDLE = """
llm: llama3.1-70b
system: h100-sxm-80gb
num_gpus: {n}
training: {{global_batch: 640}}
options: {{allow_idle_gpus: true}}
objective: {{goal: tokens_per_gpu}}
"""


def test_idle_gpus_make_every_smaller_layout_legal(tmp_path):
    """With idle GPUs allowed, more GPUs can never make the optimum worse: every layout legal on 1000 GPUs
    is legal on 1500 (pp = 8 does not divide 1500 and used to drop out of the space, as in the
    Qwen3-235B case, which made 1500 GPUs worse than 1000)."""
    p1, _ = load_problem_doc(write(tmp_path, IDLE.format(n=1000), "a.yaml"))
    p2, _ = load_problem_doc(write(tmp_path, IDLE.format(n=1500), "b.yaml"))
    l1 = {lay for lay in compact_space(p1).layouts}
    l2 = {lay for lay in compact_space(p2).layouts}
    assert l1 <= l2
    assert any(lay[1] == 8 for lay in l2) and 1500 % 8 != 0
    r1, r2 = solve(p1), solve(p2)

    def gpu_seconds(r):  # the objective of tokens_per_gpu: GPUs used x step time
        ex = r.plans[0].evaluation.execution
        return ex.tp * ex.pp * ex.dp * ex.cp * r.plans[0].objective_s

    assert gpu_seconds(r2) <= gpu_seconds(r1) * (1 + 1e-9)


@pytest.mark.slow  # the Qwen3-235B space solved under a target: about 3 s
def test_missed_target_is_named_as_a_target(tmp_path):
    """A problem whose plans all fit in memory but none meets the step-time target: solve's reason and
    check's explanation name the target (it used to be explained as an HBM conflict)."""
    from optimizer.errors import Infeasible

    text = (
        "llm: gpt3-175b\nsystem: h100-sxm-80gb\nnum_gpus: 1024\ntraining: {global_batch: 1536}\n"
        "objective: {goal: step_time, max_step_time_s: 0.5}\n"
    )
    p, written = load_problem_doc(write(tmp_path, text))
    with pytest.raises(Infeasible) as e:
        solve(p)
    assert e.value.reason == "target"
    with pytest.raises(Infeasible) as e2:
        solve(p, "enumerate")
    assert e2.value.reason == "target"
    r = check(p, written)
    assert not r.fits
    groups = {g for g, _ in r.conflicts}
    assert groups == {"objective.target"}
    assert "0.5" in r.conflicts[0][1] and "memory" not in r.conflicts[0][1].lower()


def test_placement_and_must_fill_vectorised_equal_scalar():
    sizes = [4, 64, 4096]
    tp, cp, dp, pp = (np.array(x) for x in ([1, 2, 4, 8], [1, 1, 2, 2], [8, 2, 4, 16], [2, 4, 8, 1]))
    vec = placement(sizes, tp, cp, dp, pp)
    for i in range(4):
        one = placement(sizes, int(tp[i]), int(cp[i]), int(dp[i]), int(pp[i]))
        assert {k: int(v[i]) for k, v in vec.items()} == one
    # tp 8 does not fit a 4-GPU tier: next tier (64)
    assert placement(sizes, 8, 1, 1, 1)["tp"] == 1


def test_each_rule_group_binds_alone(tmp_path):
    """One tiny problem (12 layers, 16 heads, batch 32, 1024 tokens, 16 GPUs); per group a plan that
    breaks that group and no other."""
    path = write(
        tmp_path,
        "llm: {name: m, hidden: 1024, ffn: 4096, layers: 12, heads: 16, seq_len: 1024, "
        "vocab: 32000}\nsystem: a100-sxm-80gb\nnum_gpus: 16\ntraining: {global_batch: 32}\n",
    )
    p, _ = load_problem_doc(path)
    ok = dict(tp=2, pp=2, dp=4, cp=1, vpp=1, micro_batch=1)
    cases = {
        Group.GPUS: dict(dp=2),  # 2*2*2 = 8 of 16 GPUs
        Group.TP_SPLIT: dict(tp=16, pp=1, dp=1),  # 16 heads over tp 16: legal (control below)
        Group.LAYERS: dict(pp=8, dp=1),  # 12 layers over 8 stages
        Group.BATCH: dict(micro_batch=3),  # 4*3 does not divide 32
        Group.INTERLEAVE: dict(
            pp=4, vpp=3, dp=2, tp=2, micro_batch=16
        ),  # 1 micro-batch, not a multiple of pp 4
        Group.CONTEXT: dict(
            cp=4, dp=1, tp=2, pp=2, micro_batch=1
        ),  # 2*4 = 8 divides 1024: legal (control below)
    }
    for g in (Group.GPUS, Group.LAYERS, Group.BATCH, Group.INTERLEAVE):
        bad = [k for k, v in rule_masks(p, **(ok | cases[g])).items() if not bool(v)]
        assert bad == [g], (g, bad)
    assert all(bool(v) for v in rule_masks(p, **(ok | cases[Group.CONTEXT])).values())
    assert all(bool(v) for v in rule_masks(p, **(ok | cases[Group.TP_SPLIT])).values())
    # a 1000-token sequence does not split over 2*cp = 6 ranks (and 3*4 = 12 of 16 GPUs: rules.gpus too)
    p2, _ = load_problem_doc(
        write(tmp_path, path.read_text().replace("seq_len: 1024", "seq_len: 1000"), "q.yaml")
    )
    r = rule_masks(p2, **(ok | dict(cp=3, dp=1, tp=1, pp=4, micro_batch=1)))
    assert {k for k, v in r.items() if not bool(v)} == {Group.CONTEXT, Group.GPUS}
    r = rule_masks(p, **(ok | dict(tp=32, pp=1, dp=1, cp=1)))  # tp 32 > 16 heads, on 32 GPUs
    assert {k for k, v in r.items() if not bool(v)} == {Group.TP_SPLIT, Group.GPUS}
    # experts: a dense model has none
    r = rule_masks(p, **ok, ep=2)
    assert [k for k, v in r.items() if not bool(v)] == [Group.EXPERTS]


def test_groups_that_do_not_divide_a_domain_cross_it():
    """Consecutive ranks fill each domain in turn, so a group of g ranks stays inside one only when g divides
    the job's GPUs there: 3-GPU TP groups on 8-GPU nodes cross nodes (the third holds ranks 6-8) and run at
    the scale-out tier, unless the whole job fits in one node; on NVL72 racks used 64 GPUs each an EP group
    of 64 stays in its rack, and with all 72 used one of 32 crosses racks. Vectorised and scalar agree."""
    node, rack = [8, 65536], [72, 65536]
    assert placement(node, 3, 1, 8, 1)["tp"] == 1  # 24 GPUs
    assert placement(node, 3, 1, 2, 1)["tp"] == 0  # 6 GPUs: one node
    assert placement(node, 4, 1, 6, 1)["tp"] == 0
    assert placement(node, 2, 3, 4, 1) == {"tp": 0, "cp": 1, "dp": 1, "pp": 0, "ep": 0}  # 2x3 = 6 crosses
    assert placement(rack, 1, 1, 128, 1, ep=64, etp=1, used=[64, 65536])["ep"] == 0
    assert placement(rack, 1, 1, 288, 1, ep=32, etp=1, used=[72, 65536])["ep"] == 1
    assert placement(rack, 1, 1, 288, 1, ep=8, etp=1, used=[72, 65536])["ep"] == 0
    tp = np.array([3, 3, 4])
    assert placement(node, tp, 1, np.array([8, 2, 6]), 1)["tp"].tolist() == [1, 0, 0]


def test_a_spanning_ep_group_is_priced_on_the_scale_out_tier_and_named(tmp_path):
    """Qwen3-30B-A3B-like MoE on 288 GB200 GPUs packed 72 per rack: EP 32 groups cross racks, so their
    all-to-all runs on InfiniBand (slower than at 64 GPUs per rack, where they stay in one) and evaluate
    says why and what keeps them in one rack."""
    from optimizer import api
    from optimizer.drivers.evaluate import evaluate_execution

    text = """name: ep-racks
llm: {name: moe, hidden: 2048, ffn: 6144, layers: 8, heads: 32, kv_heads: 4, seq_len: 4096, vocab: 32000,
  moe: {experts: 128, top_k: 8, expert_ffn: 768}}
system: gb200-nvl72
num_gpus: 288
training: {global_batch: 576, precision: bf16}
execution: {tp: 1, pp: 1, ep: 32, micro_batch: 1, zero: 1}
"""
    p = api.load(write(tmp_path, text))
    fast, slow = p.system.networks
    full = p.model_copy(
        update={
            "system": p.system.model_copy(
                update={"networks": [fast.model_copy(update={"gpus_used": 72}), slow]}
            )
        }
    )
    ev64, ev72 = evaluate_execution(p), evaluate_execution(full)
    assert ev64.execution.placement["ep"] == "nvlink" and ev72.execution.placement["ep"] == "infiniband"
    assert ev72.result["ep_link"] > ev64.result["ep_link"]
    msg = next(w for w in ev72.warnings if w.startswith("EP group of 32"))
    assert "do not divide the 72 GPUs the job uses in each 'nvlink' domain" in msg
    assert not any(w.startswith("EP group") for w in ev64.warnings)
    written = {"tp": 1, "pp": 1, "ep": 32, "micro_batch": 1, "zero": 1}
    assert f"warning: {msg}" in api.text(check(full, written))  # check's plan says it too


def test_tables_built_for_more_gpus_answer_a_smaller_job_as_a_fresh_solve(tmp_path):
    """A group's tier follows the job's own GPUs (tp*cp*dp*pp), not the problem's count: tables built for 16
    H100s with idle GPUs allowed, restricted to a 6-GPU problem, give the fresh 6-GPU optimum (a 6-GPU job
    fits one 8-GPU node, so its expert groups stay on NVLink)."""
    from formulations.tables import build_all
    from optimizer import api

    text = """name: ep
llm: {{name: moe, hidden: 2048, ffn: 6144, layers: 8, heads: 32, kv_heads: 4, seq_len: 4096, vocab: 32000,
  moe: {{experts: 48, top_k: 8, expert_ffn: 768}}}}
system: h100-sxm-80gb
num_gpus: {n}
options: {{allow_idle_gpus: true}}
training: {{global_batch: 480, precision: bf16}}
search: {{tp: 1, pp: 1, cp: 1, ep: [2, 3, 6, 12, 24, 48], micro_batch: 1}}
"""
    big, small = (api.load(write(tmp_path, text.format(n=n), f"p{n}.yaml")) for n in (16, 6))
    Ts = build_all(big, compact_space(big))
    fresh, reused = api.solve(small).plans[0], api.solve(small, tables=Ts).plans[0]
    assert reused.objective_s == pytest.approx(fresh.objective_s, rel=1e-9)
    assert fresh.evaluation.execution.placement["ep"] == "nvlink"


def test_dp_overlap_flag_legality():
    """`dp_overlap_allowed`: with a data-parallel group either value; without one the moot flag is on (where
    offered), except in a pipelined layout of a stack that never overlaps a pipelined reduction
    (megatron-deepspeed), where it is off with or without a group."""
    from optimizer.rules.layout import dp_overlap_allowed

    def ok(on, no_group, piped, offered=True, overlaps=True):
        return bool(dp_overlap_allowed(on, no_group, piped, offered, overlaps))

    assert ok(True, False, False) and ok(False, False, False)  # a group: free
    assert ok(True, True, False) and not ok(False, True, False)  # no group: the moot flag on
    assert ok(False, True, False, offered=False)  # on not offered: off is the moot value
    assert ok(True, False, True) and ok(True, True, True)  # a pipelined stack that overlaps: as before
    for no_group in (False, True):  # DeepSpeed's pipeline engine: off, moot or not
        assert ok(False, no_group, True, overlaps=False) and not ok(True, no_group, True, overlaps=False)
    assert ok(True, False, False, overlaps=False)  # without a pipeline it may overlap
