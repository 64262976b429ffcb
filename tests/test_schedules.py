"""Pipeline schedules as a decision: zero-bubble 1F1B (ZB-H1, Qi et al. 2024) against 1F1B, hand-worked from
the model's own parts; CP-SAT, the MILP and the enumerator agree on it; only torchtitan offers it; the
torchtitan export names it; a default solve keeps 1F1B."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from optimizer import api
from optimizer.model.knobs import from_execution
from optimizer.model.step import evaluate

BASE = """name: zb
llm: llama3.1-8b
system: h100-sxm-80gb
num_gpus: 64
training: {{global_batch: 128, precision: bf16, tokens: 1.0e+11}}
stack: {stack}
execution: {{tp: 2, pp: 4, vpp: {vpp}, micro_batch: 1, schedule: {schedule}, zero: 1}}
search: {{schedule: [1f1b, zb], pp: [2, 4], tp: [1, 2], cp: 1}}
"""


def _problem(tmp_path, schedule="zb", vpp=2, stack="torchtitan"):
    p = tmp_path / f"{schedule}{vpp}{stack}.yaml"
    p.write_text(BASE.format(schedule=schedule, vpp=vpp, stack=stack))
    return p


def _three_solvers(problem, rtol: float) -> list:
    """The best plan by CP-SAT, the enumerator and the Pyomo MILP, which agree on the step time."""
    plans = [
        api.solve(problem).plans[0],
        api.solve(problem, method="enumerate").plans[0],
        api.solve(problem, backend="pyomo").plans[0],
    ]
    t = [x.evaluation.result["step_time"] for x in plans]
    assert np.allclose(t, t[0], rtol=rtol)
    return plans


def _terms(problem):
    k = from_execution(problem.execution, problem.system, problem.num_gpus)
    r = evaluate(problem, k)
    return r, r.terms


def test_zero_bubble_fills_the_bubble_with_weight_gradients(tmp_path, vpp=2):
    """1F1B's bubble is (pp-1)/vpp x Ls x (T_F + T_B + T_W) per micro-batch layer = Bf x layer_s; ZB-H1's is
    Bf x (T_F + T_B - T_W) = Bf x (layer_s - 2 T_W), T_W half the backward GEMMs: the difference is
    Bf x gemm_bw. Everything else (layers, exchanges, memory) is 1F1B's."""
    zb = api.load(_problem(tmp_path, "zb", vpp))
    ob = api.load(_problem(tmp_path, "1f1b", vpp))
    rz, tz = _terms(zb)
    ro, to = _terms(ob)
    ls = 32 / 4  # Llama 3.1 8B: 32 layers over pp 4
    bf = (4 - 1) / vpp * ls
    assert float(to.bubble_s[0]) == pytest.approx(bf * float(to.layer_s[0]), rel=1e-9)
    gemm_bw = float(tz.bubble_fill_s[0])
    assert float(tz.bubble_s[0]) == pytest.approx(bf * (float(tz.layer_s[0]) - gemm_bw), rel=1e-9)
    assert 0 < gemm_bw < float(to.layer_bw_s[0])
    assert float(to.bubble_s[0] - tz.bubble_s[0]) == pytest.approx(bf * gemm_bw, rel=1e-9)
    assert float(rz.step_time[0]) == pytest.approx(float(ro.step_time[0] - (to.bubble_s[0] - tz.bubble_s[0])))
    assert float(rz.hbm[0]) == pytest.approx(float(ro.hbm[0]))


def test_solvers_agree_and_choose_zero_bubble(tmp_path):
    """search.schedule [1f1b, zb] on torchtitan: CP-SAT, the Pyomo MILP and the enumerator find the same
    step time, and with a pipeline the zero-bubble schedule (never slower) is the one chosen."""
    p = api.load(_problem(tmp_path))
    plans = _three_solvers(p, rtol=1e-3)
    ex = plans[0].evaluation.execution
    assert ex.pp == 1 or ex.schedule.value == "zb"


def test_only_torchtitan_offers_zero_bubble(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", "evaluate", str(_problem(tmp_path, stack="megatron-core"))],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "execution.schedule: zb is not offered by stack megatron-core" in r.stderr


def test_torchtitan_export_names_the_schedule(tmp_path):
    p = api.load(_problem(tmp_path))
    text = api.emit("torchtitan", p, p.execution)
    assert 'pipeline_parallel_schedule = "InterleavedZeroBubble"' in text


def test_a_default_solve_keeps_1f1b(tmp_path):
    """Without search.schedule the schedule stays at 1F1B on every stack (zero-bubble is opened by name)."""
    path = tmp_path / "d.yaml"
    path.write_text(
        BASE.format(schedule="1f1b", vpp=1, stack="torchtitan").replace("schedule: [1f1b, zb], ", "")
    )
    ex = api.solve(api.load(path)).plans[0].evaluation.execution
    assert ex.schedule.value == "1f1b"


def test_zero_bubble_needs_two_stages_per_rank(tmp_path):
    """PyTorch's InterleavedZeroBubble runs 2+ stages per rank: a written zb with vpp 1 is refused at its
    line, and a solve never answers zb with vpp 1 (with one stage per rank the model runs it as 1F1B, and
    the plan is written as 1F1B)."""
    r = subprocess.run(
        [sys.executable, "-m", "optimizer.cli", "evaluate", str(_problem(tmp_path, "zb", vpp=1))],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "execution.schedule: zb runs interleaved" in r.stderr, r.stderr
    p = api.load(_problem(tmp_path, "1f1b", vpp=1))
    for plan in api.solve(p, top=5, distinct=False).plans:
        ex = plan.evaluation.execution
        assert not (ex.schedule.value == "zb" and ex.vpp == 1)


DPV = """name: dpv
llm: llama3.1-70b
system: {system}
num_gpus: 64
training: {{global_batch: {batch}, seq_len: 8192, precision: bf16, tokens: 1.0e+11}}
stack: {stack}
execution: {{tp: 8, pp: 8, vpp: {vpp}, micro_batch: 1, schedule: {schedule}, zero: 1, recompute: none}}
search:
  schedule: [1f1b, zb, dualpipev]
  vpp: [1, 2]
  tp: 8
  pp: 8
  micro_batch: 1
  recompute: none
  zero: 1
  cp: 1
"""


def _dpv(tmp_path, schedule="dualpipev", vpp=2, system="h100-sxm-80gb", batch=64, stack="torchtitan"):
    p = tmp_path / f"dpv-{schedule}{vpp}{system}{batch}{stack}.yaml"
    p.write_text(DPV.format(schedule=schedule, vpp=vpp, system=system, batch=batch, stack=stack))
    return p


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *map(str, args)], capture_output=True, text=True
    )


def test_dualpipev_bubble_and_memory_by_hand(tmp_path):
    """DualPipeV on d = 8 ranks of two chunks (Llama 3.1 70B, 80 layers: Ls = 10, chunks of 5): its bubble
    is (d-1) x 5 x (T_F&B + T_B - 3 T_W) per micro-batch layer (DeepSeek-V3 report, Table 2), T_F&B the layer
    time, T_B its backward, 3 T_W 1.5 x the backward GEMMs (zero-bubble's fill is 2 T_W); the first rank keeps
    2d+1 = 17 chunks of activations (1F1B: 8 stages = 16 chunks) and the loss's logits. Everything else is
    interleaved 1F1B's at vpp 2."""
    rd, td = _terms(api.load(_dpv(tmp_path)))
    ri, ti = _terms(api.load(_dpv(tmp_path, "1f1b")))
    _, tz = _terms(api.load(_dpv(tmp_path, "zb")))
    r1, t1 = _terms(api.load(_dpv(tmp_path, "1f1b", vpp=1)))
    bf, gemm_bw = 7 * 5, float(tz.bubble_fill_s[0])
    fill = 1.5 * gemm_bw - float(td.layer_bw_s[0])
    assert float(td.bubble_fill_s[0]) == pytest.approx(fill, rel=1e-9)
    assert float(td.bubble_s[0]) == pytest.approx(bf * (float(td.layer_s[0]) - fill), rel=1e-9)
    assert float(ti.bubble_s[0]) == pytest.approx(bf * float(ti.layer_s[0]), rel=1e-9)
    assert float(rd.bubble[0] - ri.bubble[0]) == pytest.approx(-bf * fill, rel=1e-6)
    # the first rank holds the last stage too: the embedding's V x h / tp parameters more than 1F1B's
    # heaviest stage (the last: the same layers, the output layer and the final norm), 16-bit
    extra = 128256 * 8192 / 8 * 2.0
    assert float(rd.weights[0] - r1.weights[0]) == pytest.approx(extra, rel=1e-9)
    stored, logits = float(t1.act_stored_bytes[0]), float(t1.logits_bytes[0])
    assert float(rd.activations[0] - r1.activations[0]) == pytest.approx(5 * stored + logits, rel=1e-9)
    assert float(ri.activations[0]) > float(rd.activations[0])  # interleaving keeps (3d-1) chunks = 23


def test_dualpipev_is_chosen_where_interleaving_does_not_fit(tmp_path):
    """On 80 GB H100s interleaved schedules (77 GiB) do not fit and DualPipeV (66 GiB) beats 1F1B at vpp 1:
    CP-SAT, the Pyomo MILP and the enumerator all answer DualPipeV. On 141 GB H200s the interleaved
    zero-bubble schedule fits and wins."""
    p = api.load(_dpv(tmp_path))
    plans = _three_solvers(p, rtol=1e-6)
    assert {(x.evaluation.execution.schedule.value, x.evaluation.execution.vpp) for x in plans} == {
        ("dualpipev", 2)
    }
    ex = api.solve(api.load(_dpv(tmp_path, system="h200-sxm-141gb"))).plans[0].evaluation.execution
    assert (ex.schedule.value, ex.vpp) == ("zb", 2)


def test_dualpipev_needs_two_stages_per_rank_and_a_micro_batch_per_stage(tmp_path):
    """PyTorch's ScheduleDualPipeV runs exactly two stages per rank and at least one micro-batch per stage
    (2 x pp): a written dualpipev breaking either is refused at its field (exit 2), and the space holds
    DualPipeV rows only where it runs: at vpp 2 with 32 micro-batches it adds one row per other setting, at
    8 micro-batches (batch 8, pp 8) none, so the space is 1F1B's alone."""
    from optimizer.prepare.space import compact_space

    r = _cli("evaluate", _dpv(tmp_path, vpp=4))
    assert r.returncode == 2 and "dualpipev runs two stages per rank in a V" in r.stderr, r.stderr
    r = _cli("evaluate", _dpv(tmp_path, batch=8))
    assert r.returncode == 2 and "dualpipev needs at least 2*pp = 16 micro-batches" in r.stderr, r.stderr

    def size(batch, schedules):
        path = _dpv(tmp_path, schedule="1f1b", vpp=1, batch=batch)
        path.write_text(path.read_text().replace("[1f1b, zb, dualpipev]", schedules))
        return compact_space(api.load(path)).size

    assert size(8, "[1f1b, dualpipev]") == size(8, "[1f1b]")
    assert size(32, "[1f1b, dualpipev]") == size(32, "[1f1b]") + size(32, "[1f1b]") // 2  # vpp 1 and 2


def test_only_torchtitan_offers_dualpipev_and_its_export_names_it(tmp_path):
    """Megatron-Core has no DualPipeV (exit 2 naming the field); torchtitan's export names PyTorch's schedule
    and says its split backward refuses compiled stage modules."""
    r = _cli("evaluate", _dpv(tmp_path, stack="megatron-core"))
    assert (
        r.returncode == 2
        and "execution.schedule: dualpipev is not offered by stack megatron-core" in r.stderr
    )
    p = api.load(_dpv(tmp_path))
    text = api.emit("torchtitan", p, p.execution)
    assert 'pipeline_parallel_schedule = "DualPipeV"' in text
    assert "refuses compiled stage modules" in text


def test_zbv_bubble_and_memory_by_hand(tmp_path):
    """ZB-V on d = 8 ranks of two 5-layer chunks: bubble (d-1) x 5 x (T_F + T_B - 2 T_W) per micro-batch layer
    with T_B the input gradient, = the layer time less 3 T_W = 1.5 x the backward GEMMs (Qi et al. 2024,
    Sec. 6); 1F1B's activations (8 stages) plus the logits, the first rank holding the last stage too."""
    rv, tv = _terms(api.load(_dpv(tmp_path, "zbv")))
    _, tz = _terms(api.load(_dpv(tmp_path, "zb")))
    r1, t1 = _terms(api.load(_dpv(tmp_path, "1f1b", vpp=1)))
    fill = min(1.5 * float(tz.bubble_fill_s[0]), float(tv.layer_s[0]))
    assert float(tv.bubble_fill_s[0]) == pytest.approx(fill, rel=1e-9)
    assert float(tv.bubble_s[0]) == pytest.approx(7 * 5 * (float(tv.layer_s[0]) - fill), rel=1e-9)
    logits = float(t1.logits_bytes[0])
    assert float(rv.activations[0] - r1.activations[0]) == pytest.approx(logits, rel=1e-9)
    assert float(rv.weights[0] - r1.weights[0]) == pytest.approx(128256 * 8192 / 8 * 2.0, rel=1e-9)


def test_zbv_is_chosen_among_every_schedule_and_solvers_agree(tmp_path):
    """With 1F1B, zero-bubble, DualPipeV and ZB-V offered on the 80 GB case, ZB-V (63 GiB, 9.39 s) beats
    DualPipeV (66 GiB, 9.69 s) and 1F1B (10.20 s) while interleaving does not fit: CP-SAT, the MILP and the
    enumerator agree; the torchtitan export names ZBVZeroBubble; a written zbv needs vpp 2 and 2 x pp
    micro-batches."""
    path = _dpv(tmp_path)
    path.write_text(path.read_text().replace("[1f1b, zb, dualpipev]", "[1f1b, zb, dualpipev, zbv]"))
    p = api.load(path)
    plans = _three_solvers(p, rtol=1e-6)
    assert {x.evaluation.execution.schedule.value for x in plans} == {"zbv"}
    ex = plans[0].evaluation.execution
    assert 'pipeline_parallel_schedule = "ZBVZeroBubble"' in api.emit("torchtitan", p, ex)
    r = _cli("evaluate", _dpv(tmp_path, "zbv", vpp=4))
    assert r.returncode == 2 and "zbv runs two stages per rank in a V" in r.stderr, r.stderr
    r = _cli("evaluate", _dpv(tmp_path, "zbv", batch=8))
    assert r.returncode == 2 and "zbv needs at least 2*pp = 16 micro-batches" in r.stderr, r.stderr


def test_v_schedules_are_moot_without_a_pipeline_and_named_by_check(tmp_path):
    """Without a pipeline the schedule is moot: a search naming only dualpipev still plans pp 1. With a
    batch of 8 (at most 8 micro-batches) and pp in [2, 4, 8], DualPipeV runs nowhere: check names the
    schedule as the conflict and releasing it fits. Candidates that run as the same plan (zero-bubble at one
    stage per rank is 1F1B) are listed once."""
    path = _dpv(tmp_path)
    text = path.read_text()
    path.write_text(
        text.replace("schedule: [1f1b, zb, dualpipev]", "schedule: dualpipev")
        .replace("pp: 8\n", "pp: 1\n")
        .replace("  zero: 1\n", "  zero: 3\n")
    )
    ex = api.solve(api.load(path)).plans[0].evaluation.execution
    assert ex.pp == 1
    path.write_text(
        text.replace("schedule: [1f1b, zb, dualpipev]", "schedule: dualpipev")
        .replace("pp: 8\n", "pp: [2, 4, 8]\n")
        .replace("global_batch: 64", "global_batch: 8")
    )
    r = _cli("check", path)
    assert r.returncode == 3 and "fixed.schedule" in r.stdout and "release schedule" in r.stdout, r.stdout
    assert "runs two stages per rank (vpp 2) with at least 2 x pp micro-batches" in r.stdout
    path.write_text(
        text.replace("schedule: [1f1b, zb, dualpipev]", "schedule: [1f1b, zb]").replace(
            "vpp: [1, 2]", "vpp: [1]"
        )
    )
    plans = api.solve(api.load(path), top=3, distinct=False).plans
    keys = [p.evaluation.execution.model_dump_json() for p in plans]
    assert len(keys) == len(set(keys))
