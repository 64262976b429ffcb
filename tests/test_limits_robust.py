"""Time limits, targets and what-if levers at their edges: each reported defect reproduced on an inline input,
with the exit code and report the CLI contract asks for (0 an answer, 2 bad input, 3 proven infeasible,
4 time limit before any plan)."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli


def run(tmp_path, capsys, body: str, *args, command="solve", name="p.yaml"):
    """`helpers.run_cli` without the file's path: (exit code, stdout, stderr)."""
    return run_cli(tmp_path, capsys, body, *args, command=command, name=name)[:3]


# A max_days target the optimum meets with less slack than the integer objective's rounding: 5e-5 s per step
# above the optimum of 14 GPUs (1e11 tokens of 14 x 2048), derived from the model's own optimum so that a
# model change moves the target with it and the edge stays tested.
AT_TARGET = """name: c031
llm: narayanan2021-3.6b
system: h200-sxm-141gb
num_gpus: NGPUS
training: {global_batch: 14, seq_len: 2048, precision: fp8, tokens: 100000000000.0}
options: {allow_idle_gpus: true}
OBJECTIVE"""
SLACK_S = 5e-5


def at_target_days(tmp_path, capsys) -> float:
    """max_days that sits SLACK_S per step above the 14-GPU optimum's step time."""
    body = AT_TARGET.replace("NGPUS", "14").replace("OBJECTIVE", "")
    rc, out, err = run(tmp_path, capsys, body, "--json", name="free.yaml")
    assert rc == 0, err
    steps = 1e11 / (14 * 2048)
    return (json.loads(out)["bound_step_time_s"] + SLACK_S) * steps / 86400.0


@pytest.mark.parametrize("goal", ["goal: fewest_gpus,", ""])
def test_target_met_at_the_optimum_solves(tmp_path, capsys, goal):
    days = at_target_days(tmp_path, capsys)
    body = AT_TARGET.replace("NGPUS", "16").replace(
        "OBJECTIVE", f"objective: {{{goal} max_days: {days:.7f}}}\n"
    )
    rc, out, err = run(tmp_path, capsys, body)
    assert rc == 0, err
    assert "optimal" in out.splitlines()[0]
    assert "14 used" in out


SMALL = """name: small
llm: llama3.1-8b
system: h100-sxm-80gb
num_gpus: 16
training: {global_batch: 64, precision: bf16, tokens: 1.0e+9}
"""


@pytest.mark.parametrize("band", ["1", "1.5", "-0.5", "0", "nan", "inf", "x"])
def test_whatif_band_is_a_fraction(tmp_path, capsys, band):
    rc, out, err = run(tmp_path, capsys, SMALL, f"--band={band}", command="whatif")
    assert rc == 2
    assert "--band" in err and band in err


def test_whatif_api_refuses_a_band_out_of_range():
    from optimizer.drivers.whatif import whatif

    with pytest.raises(ValueError, match="band"):
        whatif(None, band=float("nan"))


def test_whatif_reports_levers_when_the_robust_corner_has_no_plan(tmp_path, capsys):
    """The optimum meets the step-time target (3.049 s <= 3.1 s) but nothing does at the all-low corner:
    whatif answers every lever and says the robust corner has no plan (not exit 3)."""
    import json

    body = SMALL + "objective: {max_step_time_s: 3.1}\n"
    rc, out, err = run(tmp_path, capsys, body, "--json", command="whatif")
    assert rc == 0, err
    r = json.loads(out)
    assert len(r["levers"]) >= 3 and all(x["step_s"] is not None for x in r["levers"][:3])
    rb = r["robust"]
    assert rb["status"] == "infeasible" and rb["robust_plan"] is None and rb["regret_s"] is None
    assert "nothing fits" in rb["note"]


def test_whatif_gpu_lever_adds_whole_nodes_and_keeps_the_options(tmp_path):
    """+1% of 17 GPUs on 8-GPU nodes is 24 GPUs (not 16, fewer); the idle GPUs the lever allows are allowed
    in what it is valued against too (else the lever is credited with leaving GPUs idle)."""
    from optimizer.api import load
    from optimizer.drivers.whatif import levers

    path = tmp_path / "p.yaml"
    path.write_text(SMALL.replace("num_gpus: 16", "num_gpus: 17"), encoding="utf-8")
    problem = load(path)
    gpu = [x for x in levers(problem, 1.0) if x.name.startswith("GPUs")]
    assert [x.name for x in gpu] == ["GPUs +1% (24, idle GPUs allowed)"]
    assert gpu[0].problem.num_gpus == 24 and gpu[0].problem.options.allow_idle_gpus
    # valued against the problem's own 17 GPUs with idle GPUs allowed: like with like
    assert gpu[0].reference.num_gpus == 17 and gpu[0].reference.options.allow_idle_gpus
    assert [x.problem.num_gpus for x in levers(problem, 1e-12) if x.name.startswith("GPUs")] == [24]


@pytest.mark.slow
def test_whatif_ranks_levers_by_the_objective(tmp_path, capsys):
    """Goal fewest_gpus: each lever says the GPUs its plan uses and how many fewer than the base's."""
    import json

    body = (
        SMALL.replace("num_gpus: 16", "num_gpus: 64")
        + "objective: {goal: fewest_gpus, max_step_time_s: 3.5}\n"
    )
    rc, out, err = run(tmp_path, capsys, body, "--json", command="whatif")
    assert rc == 0, err
    levers = json.loads(out)["levers"]
    found = [x for x in levers if x["score_saved"] is not None]
    assert [x["score_saved"] for x in found] == sorted((x["score_saved"] for x in found), reverse=True)
    assert all(x["saved_gpus"] == 0 and x["score_saved"] >= -1e-9 for x in found)
    gpu = [x for x in found if x["name"].startswith("GPUs")]
    assert gpu and gpu[0]["name"] == "GPUs +20% (80, idle GPUs allowed)" and gpu[0]["gpus"] == 16


def _offer(tmp_path, name, system, usd, kw):
    from optimizer.api import load
    from optimizer.drivers.pipeline_mix import TypeOffer

    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"llm: {{base: narayanan2021-1.7b, layers: 8}}\nsystem: {system}\nnum_gpus: 4\n"
        "training: {global_batch: 16}\noptions: {memory_headroom_gib: 0, allow_idle_gpus: true}\n",
        encoding="utf-8",
    )
    return TypeOffer(name, load(path), 1, usd, kw)


def test_pipeline_mix_time_limit_is_not_none_fits(tmp_path):
    """A pipelined-mix search that stops at its time limit with nothing found raises TimeLimit (exit 4),
    not None (which procure reports as proven: nothing fits, exit 3)."""
    from optimizer.drivers.pipeline_mix import solve_pipeline_mix
    from optimizer.errors import TimeLimit

    offers = [
        _offer(tmp_path, "a100", "{base: a100-sxm-40gb, gpus_per_node: 4, hbm_gib: 4}", 1e4, 3.0),
        _offer(tmp_path, "h100", "{base: h100-sxm-80gb, gpus_per_node: 4, hbm_gib: 6}", 2.5e4, 5.0),
    ]
    with pytest.raises(TimeLimit, match="not a proof"):
        solve_pipeline_mix(offers, 2, time_limit_s=0.0)


PIPELINE_PROCURE = """name: llama70b-pipeline-mix-wins
llm: llama3.1-70b
catalog:
  name: one-node-each
  node_types:
    - {name: h200, system: h200-sxm-141gb, price_usd: 330000, power_kw: 10.2, max_nodes: 1}
    - {name: h100-80g, system: h100-sxm-80gb, price_usd: 280000, power_kw: 10.2, max_nodes: 1}
training: {global_batch: 64, precision: bf16, tokens: 10.0e+9}
procure: {goal: throughput, pricing: capex, budget_usd: 1.0e+6, max_types: 2, heterogeneous: all}
"""


def test_procure_time_limit_before_any_plan_exits_4(tmp_path, capsys):
    rc, out, err = run(tmp_path, capsys, PIPELINE_PROCURE, "--time-limit", "0.01", command="procure")
    assert rc == 4, (out, err)
    assert "time limit" in err and "not a proof" in err


UPTO_6144 = """name: gpt3-175b-upto6144xa100
llm: gpt3-175b
system: a100-sxm-80gb
num_gpus: 6144
training: {global_batch: 1536, tokens: 300.0e+9}
options: {allow_idle_gpus: true}
"""


def test_enumerate_honours_the_time_limit(tmp_path, capsys):
    """28 million candidates: the enumerator builds the space a part at a time and stops at the limit (exit
    4, nothing found yet), instead of materialising the whole space first (MemoryError or a hang)."""
    import time

    t0 = time.perf_counter()
    rc, out, err = run(tmp_path, capsys, UPTO_6144, "--method", "enumerate", "--time-limit", "0.01")
    assert rc == 4, err
    assert "28,006,584 candidates" in err and "not a proof" in err
    assert time.perf_counter() - t0 < 20


def test_enumerate_stopped_early_is_not_proven(tmp_path):
    import time

    from formulations.enumerate import enumerate_best
    from optimizer.api import load

    path = tmp_path / "p.yaml"
    path.write_text(SMALL, encoding="utf-8")
    r = enumerate_best(load(path), top=1, chunk=1000, deadline=time.perf_counter())
    assert not r.complete and r.n_evaluated == 0 and len(r.step_time_s) == 0
    full = enumerate_best(load(path), top=2, chunk=1000)
    assert full.complete and full.n_evaluated == full.n_candidates and len(full.step_time_s) == 2


MIXTRAL_384 = """name: c032
llm: mixtral-8x7b
system:
  base: h200-sxm-141gb
  offload: {capacity_gib: 512, bandwidth_gbps: 50}
num_gpus: 384
training: {global_batch: 2520, precision: fp8}
"""


def test_time_limit_bounds_the_tables_not_only_cp_sat(tmp_path, capsys):
    """The model's tables of this space take tens of seconds to fill: a time limit that passes while they
    are filled is exit 4 (not a proof), not an "optimal" answer long after the limit."""
    import time

    t0 = time.perf_counter()
    rc, out, err = run(tmp_path, capsys, MIXTRAL_384, "--time-limit", "0.01")
    assert rc == 4, (out, err)
    assert "within 0.01 s" in err and "tables" in err and "not a proof" in err
    assert time.perf_counter() - t0 < 10


MOE_PIPE = """name: mixtral-pipeline-mix
llm: mixtral-8x7b
catalog:
  name: two
  node_types:
    - {name: h200, system: h200-sxm-141gb, price_usd: 330000, power_kw: 10.2, max_nodes: 2}
    - {name: h100-80g, system: h100-sxm-80gb, price_usd: 280000, power_kw: 10.2, max_nodes: 2}
training: {global_batch: 64, precision: bf16, tokens: 10.0e+9}
procure: {goal: throughput, pricing: capex, budget_usd: 2.0e+6, max_types: 2, heterogeneous: pipeline}
"""


def test_pipeline_family_not_searched_is_said(tmp_path):
    """An MoE model: the pipelined-mix family is not searched, and a note says so (not a silent None that
    reads as "none fits within the limits")."""
    from optimizer.drivers.pipeline_mix import procure_pipeline
    from optimizer.drivers.purchase import TypeRow
    from optimizer.io.loader import load_procure

    path = tmp_path / "p.yaml"
    path.write_text(MOE_PIPE, encoding="utf-8")
    pp = load_procure(path)
    rows = [TypeRow(t, 2, "availability", None, 0, "infeasible") for t in pp.catalog.node_types]
    notes: list[str] = []
    assert procure_pipeline(pp, rows, notes=notes) is None
    assert notes == [
        "pipelined mixes not searched: the family covers dense models on megatron-core, not an MoE model"
    ]


def test_report_says_a_family_was_not_searched_rather_than_none_fits(tmp_path, capsys):
    """The report's pipelined-mix line says the family was not searched and why (not "none fits"), and a
    NOTHING FITS answer says that it is no proof over the family it did not search."""
    rc, out, err = run(tmp_path, capsys, MOE_PIPE, command="procure")
    assert rc == 0, (out, err)
    assert "pipelined mix: none fits" not in out
    assert (
        "pipelined mix: the family covers dense models on megatron-core, not an MoE model (not searched)"
        in out
    )
    tiny = MOE_PIPE.replace("max_nodes: 2}", "max_nodes: 1}").replace("mixtral-8x7b", "mixtral-8x22b")
    rc, out, err = run(tmp_path, capsys, tiny, "--json", command="procure")
    assert rc == 3, (out, err)
    assert json.loads(out)["not_searched"] == [
        "pipelined mixes not searched: the family covers dense models on megatron-core, not an MoE model"
    ]


@pytest.mark.slow
def test_procure_pipeline_meets_the_deadline(tmp_path, capsys):
    """Goal cost with deadline_days 5: the only pipelined mix needs 7.4 days; it is no answer (it was BEST,
    exit 0), and a note says why."""
    body = PIPELINE_PROCURE.replace("goal: throughput", "goal: cost").replace(
        "heterogeneous: all}", "heterogeneous: all, deadline_days: 5.0}"
    )
    rc, out, err = run(tmp_path, capsys, body, command="procure")
    assert rc == 3, (out, err)
    assert "over the deadline of 5 days" in out


def test_tables_are_filled_in_chunks_that_check_the_time_limit(tmp_path, monkeypatch):
    """The model fills the tables in chunks of RUN_CHUNK_ROWS rows: the tables are the same whatever the
    chunk (the model is row-wise), and a deadline that passes during the fill stops it at the next chunk
    (at most one chunk past it), not after the whole grid."""
    import numpy as np
    from oracle_cases import SMALL
    from test_solve_cpsat import load_text

    import formulations.tables as tables
    from optimizer.prepare.space import compact_space

    p = load_text(tmp_path, "dense", SMALL["dense-8gpu"])
    whole = tables.build_all(p, compact_space(p))
    monkeypatch.setattr(tables, "RUN_CHUNK_ROWS", 7)  # many small chunks, not a divisor of the rows
    chunked = tables.build_all(p, compact_space(p))
    for a, b in zip(whole, chunked, strict=True):
        for name in ("L", "LV", "LM", "BETA"):
            da, db = getattr(a, name), getattr(b, name)
            assert da.keys() == db.keys() and len(da) > 0
            assert all(np.array_equal(np.asarray(da[k]), np.asarray(db[k])) for k in da), name
    calls = []
    real = tables.evaluate

    def counting(*a, **k):
        calls.append(1)
        if len(calls) == 3:  # the clock passes the deadline during the third chunk
            monkeypatch.setattr(tables.time, "perf_counter", lambda: float("inf"))
        return real(*a, **k)

    monkeypatch.setattr(tables, "evaluate", counting)
    with pytest.raises(tables.TimeLimit):
        tables.build_all(p, compact_space(p), deadline=1e18)
    assert len(calls) == 3


def test_whatif_says_when_added_gpus_make_no_faster_layout(tmp_path):
    """A GPU lever whose best plan still uses the base's GPUs (no faster layout on the added ones) says so,
    instead of a bare 'saves 0.0%'; a lever that saves time does not."""
    from types import SimpleNamespace

    from optimizer.api import load
    from optimizer.drivers.whatif import LeverValue
    from optimizer.report.whatif import render

    path = tmp_path / "p.yaml"
    path.write_text(SMALL, encoding="utf-8")
    robust = SimpleNamespace(robust_plan=None, band=0.1, nominal_worst_s=1.2, status="infeasible", note="-")
    r = SimpleNamespace(
        base_step_s=1.0,
        pct=10.0,
        robust=robust,
        levers=[
            LeverValue("GPUs +10% (24, idle GPUs allowed)", 1.0, 0.0, 0.0, 16, 0, 0.0),
            LeverValue("HBM capacity +10%", 0.9, 0.1, 10.0, 16, 0, 0.1),
        ],
    )
    text = render(load(path), r)
    gpu_line = next(line for line in text.splitlines() if "GPUs +10%" in line)
    assert "still uses 16 GPUs: no layout on the added ones is faster" in gpu_line
    assert "still uses" not in next(line for line in text.splitlines() if "HBM capacity" in line)


@pytest.mark.parametrize("idle", [False, True])
def test_fewest_gpus_without_idle_gpus_says_the_answer_is_num_gpus(tmp_path, capsys, idle):
    """Without allow_idle_gpus every plan uses all num_gpus GPUs: the fewest-GPUs answer says so (it read
    as 64 GPUs needed where 16 would do); with it, no such note."""
    body = (
        "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 64\ntraining: {global_batch: 64}\n"
        "objective: {goal: fewest_gpus, max_step_time_s: 3.5}\n"
        f"options: {{allow_idle_gpus: {str(idle).lower()}}}\n"
    )
    rc, out, err = run(tmp_path, capsys, body)
    assert rc == 0, (out, err)
    assert ("allow_idle_gpus is false" in out) is (not idle)
    assert ("64 GPUs" in out) is (not idle)


def test_global_batch_is_bounded_where_step_times_stay_in_64_bits(tmp_path, capsys):
    """A global batch of 10,240,000 overflowed the solver's integer step times (exit 5, "invalid CP-SAT
    model"); the schema bounds it at 2^20 (a located exit 2)."""
    body = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 10240000}\n"
    rc, out, err = run(tmp_path, capsys, body)
    assert rc == 2 and "p.yaml:4: training.global_batch: must be <= 1,048,576" in err, err


def test_a_model_overflowing_64_bits_is_bad_input_not_a_bug():
    """Magnitudes that pass every field's bound but overflow CP-SAT's domains together are bad input (exit
    2, naming the quantity), not a formulation bug (exit 5); any other invalid model is a bug."""
    from formulations.model import invalid_model

    e = invalid_model("var #36 domain do not fall in [-kint64max / 2, kint64max / 2]. name: pair.ovl3")
    assert e.exit_code == 2 and "overflow CP-SAT's 64-bit integers" in str(e)
    assert invalid_model("constraint #3 refers to var #99").exit_code == 5


# the same two node types, a dense model, one type per purchase
TWO_TYPES = MOE_PIPE.replace("mixtral-8x7b", "llama3.1-8b").replace(
    ", max_types: 2, heterogeneous: pipeline", ""
)


@pytest.mark.parametrize("solved_before", [1, 0])
def test_procure_time_limit_bounds_every_phase(tmp_path, monkeypatch, solved_before):
    """A clock that jumps past the limit after `solved_before` node types: the types not reached say so
    (status time_limit, "not solved within the time limit"), the answer is feasible (not optimal); with none
    solved it is exit 4, never exit 3 "nothing fits"."""
    import optimizer.drivers.procure as drv
    from optimizer.drivers.procure import procure
    from optimizer.errors import TimeLimit
    from optimizer.io.loader import load_procure
    from optimizer.report.procure import render

    monkeypatch.setenv("PARAPLAN_WORKERS", "1")  # one process: the patched clock is the one that is read
    real = drv.time.time
    jumped = {"n": 0, "calls": 0}

    class Clock:
        perf_counter = staticmethod(drv.time.perf_counter)

        @staticmethod
        def time():  # the first read sets the deadline; later ones jump once `solved_before` types solved
            jumped["calls"] += 1
            late = jumped["calls"] > 1 and jumped["n"] >= solved_before
            return real() + (1000.0 if late else 0.0)

    real_best = drv.best_of_type

    def counting(*a, **k):
        out = real_best(*a, **k)
        jumped["n"] += 1
        return out

    monkeypatch.setattr(drv, "time", Clock)
    monkeypatch.setattr(drv, "best_of_type", counting)
    path = tmp_path / "p.yaml"
    path.write_text(TWO_TYPES)
    pp = load_procure(path)
    if solved_before == 0:
        with pytest.raises(TimeLimit, match="not a proof that nothing fits"):
            procure(pp, time_limit_s=60.0)
        return
    r = procure(pp, time_limit_s=60.0)
    assert r.status == "feasible" and r.best is not None
    assert [x.status for x in r.rows].count("time_limit") == 1
    assert "not solved within the time limit" in render(r)
