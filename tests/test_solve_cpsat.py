"""CP-SAT (`--method cpsat`) against the exhaustive oracle (its stored optima; enumerated afresh in the slow
set), and each constraint group on tiny problems."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from helpers import load_script
from oracle_cases import CASES, SMALL

from formulations.bounds import presolve
from formulations.pairs import pair_columns
from formulations.tables import build_tables
from optimizer.drivers.solve import solve
from optimizer.errors import Infeasible
from optimizer.io.loader import load_problem
from optimizer.model.capacity import feasible
from optimizer.model.step import evaluate
from optimizer.prepare.objective import gpus_used
from optimizer.prepare.space import build_space, compact_space
from optimizer.rules.layout import zero_allowed


def load_text(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_problem(path)


ORACLE_OPTIMA = load_script(
    "regen_oracle"
)  # scripts/regen_oracle.py: the stored optima and how they are made


@functools.cache
def cpsat_of_case(name: str):
    """The problem of an oracle case and CP-SAT's solve of it (shared by the fast and the slow test)."""
    with tempfile.TemporaryDirectory() as tmp:
        p = load_text(Path(tmp), name, CASES[name])
    return p, solve(p, "cpsat", time_limit_s=120)


def assert_cpsat_reaches(name: str, optimum: dict):
    """CP-SAT's plan is proven optimal and its objective equals the enumerated optimum within 0.1%, on the
    same space (other goals: the same number of GPUs, a zero gap)."""
    p, c = cpsat_of_case(name)
    assert c.method == "cpsat" and c.status == "optimal"
    assert optimum["goal"] == p.objective.goal.value
    assert c.plans[0].objective_s == pytest.approx(optimum["objective_s"], rel=1e-3)
    if p.objective.goal.value == "step_time":  # other goals bound their score, not the step time
        assert c.bound_s == pytest.approx(c.plans[0].objective_s, rel=1e-3)
    else:
        assert c.gap == pytest.approx(0.0, abs=1e-9)
        assert gpus_used(c.plans[0].evaluation.execution) == optimum["gpus_used"]
    assert c.candidates == optimum["candidates"]  # the same space


@pytest.mark.parametrize("name", list(CASES))
def test_cpsat_matches_stored_enumeration(name):
    """The optimum of CP-SAT equals the exhaustive oracle's (stored in tests/golden/oracle_optima.json by
    scripts/regen_oracle.py) within 0.1%, proven, on every oracle case."""
    stored = ORACLE_OPTIMA.load()
    assert name in stored, "run scripts/regen_oracle.py"
    assert_cpsat_reaches(name, stored[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_cpsat_matches_fresh_enumeration(name):
    """The enumerator walks the whole space afresh: its optimum equals the stored one (a model change that
    forgets scripts/regen_oracle.py fails here), and CP-SAT reaches it."""
    fresh = ORACLE_OPTIMA.enumerate_case(name, CASES[name])
    assert ORACLE_OPTIMA.differences({name: ORACLE_OPTIMA.load().get(name)}, {name: fresh}) == []
    assert_cpsat_reaches(name, fresh)


def test_stored_optima_cover_exactly_the_cases():
    assert sorted(ORACLE_OPTIMA.load()) == sorted(CASES)


def test_top_k_matches_enumeration(tmp_path):
    p = load_text(tmp_path, "dense", SMALL["dense-8gpu"])
    e = solve(p, "enumerate", top=5)
    c = solve(p, "cpsat", top=5)
    assert [pl.objective_s for pl in c.plans] == pytest.approx([pl.objective_s for pl in e.plans], rel=1e-3)
    keys = {pl.evaluation.execution.model_dump_json() for pl in c.plans}
    assert len(keys) == 5  # distinct plans


def test_bounds_never_exceed_the_pairs_objective(tmp_path):
    """The presolve's lower bound of a pair is <= the model's step time of every candidate using it."""
    p = load_text(tmp_path, "fixed", SMALL["fixed-knobs"])
    T = build_tables(p, compact_space(p))
    pre = presolve(T, top=10**9)  # the incumbent prunes nothing: every pair that fits is kept
    P = pre.pairs
    space = build_space(p).knobs
    r = evaluate(p, space)
    ok = feasible(p, space, r)
    axes = ("tp", "pp", "cp", "dp", "ep", "etp", "pp_embedding_loss")
    lay = {tuple(int(x) for x in key): i for i, key in enumerate(zip(*[T.lay[a] for a in axes], strict=True))}
    lb = {}
    for j in range(len(P)):
        key = (
            int(P.li[j]),
            T.v_vals[P.vi[j]],
            T.mb_vals[P.mi[j]],
            T.rec_vals[P.ri[j]],
            T.sp_vals[P.si[j]],
            T.ov_vals[P.oi[j]],
        )
        lb[key] = (P.lb[j] / 1e9, P.slb[j] / 1e9)  # the column bound and the refined (exact) one
    checked = 0
    for i in np.nonzero(ok)[0]:
        li = lay[tuple(int(getattr(space, a)[i]) for a in axes)]
        key = (
            li,
            int(space.vpp[i]),
            int(space.micro_batch[i]),
            int(space.recompute[i]),
            int(space.sequence_parallel[i]),
            int(space.tp_overlap[i]),
        )
        assert key in lb, "a fitting candidate's pair was dropped as unable to fit"
        assert lb[key][0] <= r.step_time[i] * (1 + 1e-6)
        assert lb[key][1] <= r.step_time[i] * (1 + 1e-6)  # step-time goal: the score is the step time
        checked += 1
    assert checked > 100


def test_pair_columns_compose_like_the_model(tmp_path):
    """The per-pair pipeline terms equal the model's pipeline time of the same candidates."""
    p = load_text(tmp_path, "dense", SMALL["dense-8gpu"])
    T = build_tables(p, compact_space(p))
    P = presolve(T, top=10**9).pairs
    cols = pair_columns(T, P.li, P.vi, P.mi, P.ri, P.si, P.oi)
    from formulations.bounds import knobs_of_pairs

    k = knobs_of_pairs(T, P, np.zeros(len(P), dtype=int), np.zeros(len(P), dtype=int))
    r = evaluate(p, k)
    # the report's parts: every layer pass, the LM head, the bubble and the exposed p2p
    model_pipe = (r.terms.pipe_layers_s + r.head + r.bubble + r.pp_exposed) * 1e9
    # per-micro-batch columns are whole ns, multiplied by up to n_mb*mb: a few hundred ns of rounding
    assert np.allclose(cols["pipeline_s"], model_pipe, rtol=1e-6, atol=256)
    assert np.allclose(cols["pipeline_s"], r.terms.pipeline_s * 1e9, rtol=1e-6, atol=256)


@pytest.mark.parametrize(
    "name", ["open-kernels-schedule-16gpu", "offload-13b-8gpu-24gib", "mtp-custom-layout-16gpu"]
)
def test_variant_columns_equal_the_model(tmp_path, name):
    """Every variant (kernels, schedule, offload flags) and every custom layout with MTP modules: the pair
    columns are the model's pipeline time (offload streaming included), HBM and offload memory, for every
    ZeRO stage."""
    from formulations.bounds import knobs_of_pairs
    from formulations.tables import KIB, TIME_UNIT, build_all

    p = load_text(tmp_path, name, SMALL[name])
    Ts = build_all(p, compact_space(p))
    pre = presolve(Ts, top=10**9)
    P, cols = pre.pairs, pre.cols
    if name.startswith("mtp"):  # custom layouts with and without embedding/loss slots
        assert {0, 1} <= set(Ts[0].L["un"][P.li].tolist())
    else:
        assert len(Ts) > 4 and len(set(P.var.tolist())) >= 4  # pairs of several variants survive
    for zi, z in enumerate(Ts[0].z_vals):
        legal = zero_allowed(z, cols["dpg1"])
        k = knobs_of_pairs(Ts, P, np.full(len(P), zi), np.zeros(len(P), dtype=int))
        r = evaluate(p, k)
        pipe = r.terms.pipeline_s * TIME_UNIT
        assert np.allclose(cols["pipeline_s"][legal], pipe[legal], rtol=1e-6, atol=256)
        hbm = (cols["act"] + cols[f"state_hbm_bytes_z{z}"]) * KIB
        assert np.all(hbm[legal] >= r.hbm[legal] - 1) and np.allclose(
            hbm[legal], r.hbm[legal], rtol=1e-6, atol=8e4
        )
        off = (cols[f"state_offload_bytes_z{z}"] + cols["offact"]) * KIB
        assert np.allclose(off[legal], r.offload_mem[legal], rtol=1e-6, atol=8e4)
    if name.startswith("offload"):
        assert np.any(cols["offact"] > 0) and np.any(cols["offload_exposed_s"] > 0)


def test_offload_is_decided_and_its_capacity_binds(tmp_path):
    """13B parameters on 8 GPUs of 24 GiB: nothing fits without offload; CP-SAT picks the offload flags
    (as the oracle does), and with too little offload memory nothing fits."""
    text = SMALL["offload-13b-8gpu-24gib"]
    p = load_text(tmp_path, "off", text)
    c = solve(p, "cpsat")
    ex = c.plans[0].evaluation.execution
    assert c.method == "cpsat" and (ex.optimizer_offload or ex.weight_offload)
    assert c.plans[0].evaluation.result["offload_mem"] <= 256 * 2**30
    with pytest.raises(Infeasible):
        solve(
            load_text(
                tmp_path, "none", text.replace("offload: {capacity_gib: 256", "offload: {capacity_gib: 0")
            ),
            "cpsat",
        )
    need = c.plans[0].evaluation.result["offload_mem"] / 2**30
    small = load_text(tmp_path, "small", text.replace("capacity_gib: 256", f"capacity_gib: {need * 0.9:.3f}"))
    e2, c2 = solve(small, "enumerate"), solve(small, "cpsat")
    assert c2.plans[0].objective_s == pytest.approx(e2.plans[0].objective_s, rel=1e-3)
    assert c2.plans[0].evaluation.result["offload_mem"] <= need * 0.9 * 2**30
    assert c2.plans[0].objective_s > c.plans[0].objective_s  # the capacity binds: a slower plan


# ---------------------------------------------------------------- constraint groups on tiny problems
TINY = """
llm: {{name: tiny, hidden: 1024, ffn: 4096, layers: 8, heads: {heads}, seq_len: 1024, vocab: 32000}}
system: {{base: a100-sxm-80gb, hbm_gib: {hbm}}}
num_gpus: {gpus}
training: {{global_batch: {batch}}}
{extra}
"""


def tiny(tmp_path, heads=16, hbm=80, gpus=8, batch=16, extra=""):
    return load_text(tmp_path, "tiny", TINY.format(heads=heads, hbm=hbm, gpus=gpus, batch=batch, extra=extra))


def test_memory_hbm_infeasible_and_feasible(tmp_path):
    with pytest.raises(Infeasible, match="nothing fits"):
        solve(tiny(tmp_path, hbm=0.05))
    r = solve(tiny(tmp_path, hbm=80))
    assert r.plans[0].evaluation.fits


def test_memory_headroom_is_capacity(tmp_path):
    """The smallest HBM any plan needs (by enumeration) is the edge: a headroom just under what is left
    is feasible, just over it is not."""
    p = tiny(tmp_path)
    space = build_space(p).knobs
    need_gib = float(evaluate(p, space).hbm.min()) / 2**30
    spare = 80 - need_gib
    assert solve(tiny(tmp_path, extra=f"options: {{memory_headroom_gib: {spare - 0.01}}}")).plans
    with pytest.raises(Infeasible):
        solve(tiny(tmp_path, extra=f"options: {{memory_headroom_gib: {spare + 0.01}}}"))


def test_tp_divides_heads(tmp_path):
    p = tiny(tmp_path, heads=8, gpus=12, batch=12, extra="search: {pp: 1, cp: 1}")
    assert set(np.unique(build_space(p).knobs.tp)) == {1, 2, 4}  # 3, 6, 12 divide 12 GPUs, not 8 heads
    r = solve(p)
    ex = r.plans[0].evaluation.execution
    assert 8 % ex.tp == 0 and ex.tp * ex.dp == 12


def test_batch_divisibility_forces_the_split(tmp_path):
    # batch 7 on 8 GPUs with tp, pp fixed at 1: no dp in {8} divides 7 -> nothing is legal
    with pytest.raises(Infeasible):
        solve(tiny(tmp_path, batch=7, extra="search: {tp: 1, pp: 1, cp: 1}"))
    # with tp free the plan must use tp*pp = 8 (dp = 1) since only dp = 1 or 7 divides 7
    ex = solve(tiny(tmp_path, batch=7, extra="search: {cp: 1}")).plans[0].evaluation.execution
    assert 7 % (ex.dp * ex.micro_batch) == 0 and ex.dp == 1


def test_idle_gpus_allowed_or_not(tmp_path):
    with pytest.raises(Infeasible):  # 7 GPUs, 8 layers, 16 heads, batch 16: only 7-way dp, which fails
        solve(tiny(tmp_path, gpus=7, extra="search: {cp: 1}"))
    r = solve(tiny(tmp_path, gpus=7, extra="options: {allow_idle_gpus: true}\nsearch: {cp: 1}"))
    ex = r.plans[0].evaluation.execution
    assert ex.tp * ex.pp * ex.dp * ex.cp <= 7


def test_interleaving_needs_micro_batches(tmp_path):
    r = solve(tiny(tmp_path, extra="search: {pp: 2, vpp: 2, tp: 1, cp: 1}"))
    ex = r.plans[0].evaluation.execution
    assert (16 // (ex.dp * ex.micro_batch)) % ex.pp == 0


def test_tier_must_fill(tmp_path):
    """A node tier of 4 GPUs that must be filled: the axes placed on it must tile it (tp = 3 may not sit on
    a 4-GPU node); without the rule tp = 3 is legal."""
    text = """
llm: {{name: t, hidden: 1536, ffn: 6144, layers: 8, heads: 24, seq_len: 1024, vocab: 32000}}
system:
  base: a100-sxm-80gb
  gpus_per_node: 4
  networks:
    - {{name: nvlink, size: 4, bandwidth_gbps: 300, latency_us: 2, efficiency: 0.8, must_fill: {fill}}}
    - {{name: ib, size: 1024, bandwidth_gbps: 25, latency_us: 5, efficiency: 0.8}}
num_gpus: 12
training: {{global_batch: 24}}
search: {{cp: 1, pp: 1}}
"""
    free = build_space(load_text(tmp_path, "free", text.format(fill="false"))).knobs
    assert {1, 2, 3, 4, 6, 12} == set(int(x) for x in np.unique(free.tp))
    p = load_text(tmp_path, "fill", text.format(fill="true"))
    k = build_space(p).knobs
    assert 3 not in set(int(x) for x in np.unique(k.tp))
    assert {1, 2, 4} <= set(int(x) for x in np.unique(k.tp))
    ex = solve(p).plans[0].evaluation.execution
    assert ex.tp != 3


# ---------------------------------------------------------------- other objectives
IDLE = """
llm: narayanan2021-1.7b
system: a100-sxm-40gb
num_gpus: 64
training: {{global_batch: 64, tokens: 1.0e+9}}
options: {{allow_idle_gpus: true}}
search: {{cp: 1}}
objective: {objective}
"""


@pytest.mark.parametrize(
    "objective",
    [
        "{goal: tokens_per_gpu}",
        "{goal: fewest_gpus, max_step_time_s: 2.0}",
        "{goal: fewest_gpus, max_days: 0.05}",
    ],
)
def test_other_objectives_match_enumeration(tmp_path, objective):
    from optimizer.prepare.objective import score

    p = load_text(tmp_path, "idle", IDLE.format(objective=objective))
    e = solve(p, "enumerate")
    c = solve(p, "cpsat")
    assert c.status == "optimal"

    def sc(r):
        ex = r.plans[0].evaluation.execution
        return float(score(p, ex.tp * ex.pp * ex.dp * ex.cp, r.plans[0].objective_s))

    assert sc(c) == pytest.approx(sc(e), rel=1e-3)
    if "fewest" in objective:
        assert c.plans[0].objective_s <= p.step_time_target_s() * (1 + 1e-6)


def test_fewest_gpus_uses_fewer_gpus_for_a_looser_target(tmp_path):
    def gpus(t):
        p = load_text(tmp_path, "idle", IDLE.format(objective=f"{{goal: fewest_gpus, max_step_time_s: {t}}}"))
        ex = solve(p, "cpsat").plans[0].evaluation.execution
        return ex.tp * ex.pp * ex.dp * ex.cp

    assert gpus(8.0) < gpus(1.0)


def test_tokens_per_gpu_prefers_efficiency_over_speed(tmp_path):
    p = load_text(tmp_path, "idle", IDLE.format(objective="{goal: tokens_per_gpu}"))
    fast = solve(load_text(tmp_path, "fast", IDLE.format(objective="{goal: step_time}")), "cpsat").plans[0]
    eff = solve(p, "cpsat").plans[0]

    def n(pl):
        return pl.evaluation.execution.tp * pl.evaluation.execution.pp * pl.evaluation.execution.dp

    assert eff.objective_s >= fast.objective_s * (1 - 1e-9)
    assert n(eff) * eff.objective_s <= n(fast) * fast.objective_s * (1 + 1e-9)


def test_embedding_loss_slots_open_pipelines_the_layers_do_not_divide(tmp_path):
    """14 layers: pp = 8 is legal only with the embedding and the loss as layer slots (16 = 8 x 2)."""
    p = load_text(tmp_path, "el", SMALL["embedding-loss-slots-16gpu"].replace("pp: [4, 8]", "pp: 8"))
    ex = solve(p).plans[0].evaluation.execution
    assert ex.pp == 8 and ex.pp_embedding_loss


def test_moe_plan_splits_experts_legally(tmp_path):
    p = load_text(tmp_path, "moe", SMALL["moe-ep-etp-16gpu"])
    ex = solve(p).plans[0].evaluation.execution
    etp = ex.etp or ex.tp
    assert 16 % ex.ep == 0 and ex.tp % etp == 0 and (ex.tp * ex.cp * ex.dp) % (ex.ep * etp) == 0
    assert ex.tp == 1 or ex.sequence_parallel  # Megatron-Core: MoE with TP needs SP


def test_precision_is_a_decision_when_search_opens_it(tmp_path):
    """search.precision [bf16, fp8, nvfp4] on H100: one proven solve per precision the system has a peak for
    (no NVFP4 on Hopper), the fastest wins and equals solving that precision alone."""
    base = (
        "llm: llama3.1-70b\nsystem: {sys}\nnum_gpus: 64\ntraining: {{global_batch: 128, precision: {prec}}}\n"
        "{search}"
    )
    p = load_text(
        tmp_path,
        "open",
        base.format(sys="h100-sxm-80gb", prec="bf16", search="search: {precision: [bf16, fp8, nvfp4]}\n"),
    )
    r = solve(p)
    alone = {
        pr: solve(load_text(tmp_path, pr, base.format(sys="h100-sxm-80gb", prec=pr, search="")))
        for pr in ("bf16", "fp8")
    }
    best = min(alone, key=lambda k: alone[k].plans[0].objective_s)
    assert r.plans[0].evaluation.problem.training.precision.value == best
    assert r.plans[0].objective_s == pytest.approx(alone[best].plans[0].objective_s, rel=1e-9)
    assert r.status == "optimal" and any("nvfp4" in n and "no nvfp4" in n for n in r.notes)
    a100 = load_text(
        tmp_path,
        "a100",
        base.format(sys="a100-sxm-80gb", prec="bf16", search="search: {precision: [bf16, fp8]}\n"),
    )
    r2 = solve(a100)
    assert r2.plans[0].evaluation.problem.training.precision.value == "bf16"


def _layout(plan) -> tuple:
    ex = plan.evaluation.execution
    return (ex.tp, ex.pp, ex.cp, ex.dp, ex.ep, ex.etp)


@pytest.mark.parametrize("backend", ["cpsat", "pyomo"])
def test_top_k_distinct_layouts_match_enumeration(tmp_path, backend):
    """`distinct=True`: the best plan of each of the K best layouts (parallel degrees). The enumerator, the
    CP-SAT loop (forbidding every pair of a found layout) and the Pyomo MILP (a cut over its binaries) give
    the same objectives; the first is the overall optimum, and plain top-K plans share layouts here."""
    p = load_text(tmp_path, "dense", SMALL["dense-8gpu"])
    e = solve(p, "enumerate", top=4, distinct=True)
    c = solve(p, "cpsat", top=4, distinct=True, backend=backend)
    assert [pl.objective_s for pl in c.plans] == pytest.approx([pl.objective_s for pl in e.plans], rel=1e-3)
    assert len({_layout(pl) for pl in c.plans}) == len(c.plans) == 4
    assert [_layout(pl) for pl in c.plans] == [_layout(pl) for pl in e.plans]
    plain = solve(p, "cpsat", top=4)
    assert plain.plans[0].objective_s == pytest.approx(c.plans[0].objective_s, rel=1e-6)
    assert len({_layout(pl) for pl in plain.plans}) < 4


def test_cli_top_gives_distinct_layouts_by_default(tmp_path, capsys):
    """`paraplan solve --top 3` answers three layouts; `--distinct plan` the three best plans."""
    import json

    from optimizer.cli import main

    path = tmp_path / "d.yaml"
    path.write_text(SMALL["dense-8gpu"])
    assert main(["solve", str(path), "--top", "3", "--json", "-q"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    lay = {tuple(pl["execution"][k] for k in ("tp", "pp", "cp", "dp")) for pl in plans}
    assert len(plans) == 3 and len(lay) == 3
    assert main(["solve", str(path), "--top", "3", "--distinct", "plan", "--json", "-q"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert len({tuple(pl["execution"][k] for k in ("tp", "pp", "cp", "dp")) for pl in plans}) < 3


def test_verify_is_one_sided_for_a_solve_the_time_limit_stopped(tmp_path):
    """A plan whose solve was proven is checked both ways (0.1%); one a time limit stopped may carry a
    solver objective above the model's (its exposure terms are bounded from below only: the fuzzer found a
    procure under --time-limit 0.01 at +0.35%), never below it."""
    from optimizer.drivers.evaluate import evaluate_execution
    from optimizer.drivers.solve import verify
    from optimizer.errors import VerificationError

    p = load_text(tmp_path, "dense", SMALL["dense-8gpu"])
    ev = solve(p, "cpsat").plans[0].evaluation
    t = ev.result["step_time"]
    verify(p, ev, t * 1.0035, exact=False)
    with pytest.raises(VerificationError):
        verify(p, ev, t * 1.0035, exact=True)
    with pytest.raises(VerificationError):
        verify(p, ev, t * 0.99, exact=False)
    assert evaluate_execution(p, ev.execution).result["step_time"] == pytest.approx(t)


@pytest.mark.parametrize("name", ["moe-ep-etp-16gpu", "dense-8gpu"])
def test_pairs_are_exactly_the_space(tmp_path, name):
    """The (triple, block setting) pairs are the space's candidates: each pair's recompute, SP and TP overlap
    are values its layout allows (MoE with TP only with SP), and with the ZeRO and DP-overlap values of each
    layout they count the space."""
    from formulations.bounds import expand

    p = load_text(tmp_path, name, SMALL[name])
    c = compact_space(p)
    T = build_tables(p, c)
    P = expand(T, np.asarray(T.legal_lvm).reshape(-1, 3))
    per = [dict(o) for o in c.other]
    for li, ri, si, oi in zip(P.li, P.ri, P.si, P.oi, strict=True):
        assert T.rec_vals[ri] in per[li]["recompute"]
        assert T.sp_vals[si] in per[li]["sequence_parallel"]
        assert T.ov_vals[oi] in per[li]["tp_overlap"]
    n_zd = np.array([len(d["zero"]) * len(d["dp_overlap"]) for d in per])
    assert int(n_zd[P.li].sum()) == c.size
    if name.startswith("moe"):
        assert np.any(T.lay["tp"][P.li] > 1)
        assert np.all(np.array(T.sp_vals)[P.si][T.lay["tp"][P.li] > 1] == 1)


def test_unread_block_rows_are_not_evaluated(tmp_path):
    """Block rows no legal triple reads are left at 0 (not evaluated); every row a pair reads has a time."""
    from formulations.bounds import expand
    from formulations.pairs import block_index

    p = load_text(tmp_path, "moe", SMALL["moe-ep-etp-16gpu"])
    T = build_tables(p, compact_space(p))
    P = expand(T, np.asarray(T.legal_lvm).reshape(-1, 3))
    read = np.unique(block_index(T, P.li, P.mi, P.ri, P.si, P.oi))
    assert np.all(T.BETA["layer_s"][read] > 0)
    unread = np.setdiff1d(np.arange(len(T.BETA["layer_s"])), read)
    assert len(unread) > 0 and np.all(T.BETA["layer_s"][unread] == 0)


def test_cp_sat_imports_without_pandas():
    """CP-SAT loads without pandas (its start-up cost), and pandas still loads for real afterwards."""
    import subprocess
    import sys

    code = (
        "import sys, formulations.cp_sat as c; assert 'pandas' not in sys.modules; "
        "m = c.cp_model.CpModel(); x = m.NewIntVar(0, 3, 'x'); m.Maximize(x); s = c.cp_model.CpSolver(); "
        "assert s.Solve(m) == c.cp_model.OPTIMAL and s.Value(x) == 3; "
        "import importlib.util; spec = importlib.util.find_spec('pandas'); "
        "print('no pandas' if spec is None else __import__('pandas').DataFrame.__name__)"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() in ("DataFrame", "no pandas")
