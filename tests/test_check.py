"""`paraplan check`: fits / does not fit / why / what would make it fit, with answers derived by hand."""

from __future__ import annotations

import json

import pytest
from helpers import ROOT, library_system

from optimizer.cli import main
from optimizer.drivers.check import check
from optimizer.drivers.solve import solve
from optimizer.io.loader import load_problem_doc

GIB = 2.0**30

# 1.3B-class model: 24 layers of 12*h^2 + embeddings. Parameters computed by the model's own count below.
BASE = """
name: small
llm: {{name: m13, hidden: 2048, ffn: 8192, layers: 24, heads: 16, seq_len: 2048, vocab: 50304}}
system: {{base: a100-sxm-80gb, hbm_gib: {hbm}}}
num_gpus: {gpus}
training: {{global_batch: {batch}, grad_precision: bf16}}
options: {{memory_headroom_gib: 0}}
{extra}
"""


def run(tmp_path, hbm=80, gpus=8, batch=16, extra=""):
    path = tmp_path / "p.yaml"
    path.write_text(BASE.format(hbm=hbm, gpus=gpus, batch=batch, extra=extra))
    return path, check(*load_problem_doc(path))


def params(tmp_path) -> float:
    from optimizer.model.params import count

    path = tmp_path / "params.yaml"
    path.write_text(BASE.format(hbm=80, gpus=8, batch=16, extra=""))
    return float(count(load_problem_doc(path)[0].llm).total)


def test_fits_reports_the_fastest_plan_and_its_margin(tmp_path):
    path, r = run(tmp_path)
    assert r.fits
    best = solve(load_problem_doc(path)[0], "enumerate").plans[0]
    assert r.plan.plans[0].objective_s == pytest.approx(best.objective_s, rel=1e-3)
    from optimizer.report.check import result_dict

    d = result_dict(r)["memory"]["hbm"]
    used = r.plan.plans[0].evaluation.result["hbm"] / GIB
    assert d["capacity_gib"] == 80 and d["margin_gib"] == pytest.approx(80 - used, abs=1e-3)
    assert d["margin_pct"] == pytest.approx(100 * (80 - used) / 80, abs=0.01)


def test_sixteen_bytes_per_parameter_without_sharding(tmp_path):
    """Mixed-precision Adam (bf16 weights 2 + bf16 grads 2 + fp32 master, m, v 12 = 16 B/param), no TP, PP
    or ZeRO: every GPU holds 16 P bytes. With 16 GiB of HBM that cannot fit; the smallest HBM that fits is
    16 P plus activations and reserve; releasing ZeRO (sharding over 8 GPUs) makes it fit."""
    P = params(tmp_path)
    need_state_gib = 16 * P / GIB
    assert 18 < need_state_gib < 23  # a 1.3B-class model
    _, r = run(tmp_path, hbm=16, extra="execution: {tp: 1, pp: 1, zero: 0}")
    assert not r.fits
    # the minimal conflict: HBM with tp, pp and ZeRO fixed (release any one and something fits)
    assert sorted(g for g, _ in r.conflicts) == ["fixed.pp", "fixed.tp", "fixed.zero", "memory.hbm"]
    assert (
        need_state_gib < r.min_hbm_gib < need_state_gib + 6
    )  # + activations (mb 1, full recompute) + reserve
    kinds = {x.kind: x for x in r.relaxations}
    assert kinds["hbm"].fits and kinds["hbm"].value >= r.min_hbm_gib
    released = {x.value for x in r.relaxations if x.kind == "release" and x.fits}
    assert "zero" in released and "tp" in released
    assert kinds["offload"].fits  # optimizer state in host memory leaves 2 + 2 B/param on the GPU


def test_smallest_hbm_is_exact(tmp_path):
    """The reported smallest HBM fits (solve succeeds) and 0.2 GiB less does not."""
    _, r = run(tmp_path, hbm=16, extra="execution: {tp: 1, pp: 1, zero: 0}")
    hbm = next(x for x in r.relaxations if x.kind == "hbm").value
    _, r_ok = run(tmp_path, hbm=hbm, extra="execution: {tp: 1, pp: 1, zero: 0}")
    assert r_ok.fits
    _, r_no = run(tmp_path, hbm=hbm - 0.2, extra="execution: {tp: 1, pp: 1, zero: 0}")
    assert not r_no.fits


def test_global_batch_cannot_be_split(tmp_path):
    """Batch 12 on 8 GPUs with tp = pp = cp = 1: dp = 8 does not divide 12. Hand answer: the nearest batches
    that fit are the multiples of 8 around 12 (8 and 16); releasing tp or pp fits (dp = 4 divides 12)."""
    _, r = run(tmp_path, batch=12, extra="execution: {tp: 1, pp: 1, cp: 1}")
    assert not r.fits
    groups = {g for g, _ in r.conflicts}
    assert {"rules.batch", "rules.gpus"} <= groups and groups <= {
        "rules.batch",
        "rules.gpus",
        "fixed.tp",
        "fixed.pp",
        "fixed.cp",
    }
    assert any("global batch 12 cannot be split: no dp in [8]" in e for e in r.explanation)
    gb = {x.value for x in r.relaxations if x.kind == "global_batch"}
    assert gb == {8, 16}
    released = {x.value for x in r.relaxations if x.kind == "release" and x.fits}
    assert {"tp", "pp"} <= released


def test_fewest_gpus_when_memory_is_short(tmp_path):
    """ZeRO-3 fixed with tp = pp = cp = 1: the state per GPU is 16 P / n. On 2 GPUs that is ~9.7 GiB > 8 GiB;
    GPU counts are tried in whole 8-GPU nodes, and on 8 GPUs the state is ~2.4 GiB (+ two gathered layers,
    activations and the 1.5 GiB reserve), so the hand answer is one node: 8 GPUs."""
    P = params(tmp_path)
    assert 16 * P / 2 / GIB > 8 and 16 * P / 8 / GIB + 1.5 < 5
    _, r = run(tmp_path, hbm=8, gpus=2, batch=64, extra="execution: {tp: 1, pp: 1, cp: 1, zero: 3}")
    assert not r.fits
    g = next(x for x in r.relaxations if x.kind == "gpus")
    assert g.fits and g.value == 8


def test_sequence_length_relaxation(tmp_path):
    """Activations grow with the sequence: at 128K tokens with tp = pp = cp = 1 on 16 GiB nothing fits; a
    shorter sequence does, and the reported one is the largest multiple of 128 that fits."""
    path = tmp_path / "p.yaml"

    def at(seq: int):
        path.write_text(
            BASE.format(hbm=16, gpus=8, batch=8, extra="execution: {tp: 1, pp: 1, cp: 1, zero: 1}").replace(
                "grad_precision: bf16}", f"grad_precision: bf16, seq_len: {seq}}}"
            )
        )
        return check(*load_problem_doc(path))

    r = at(131072)
    assert not r.fits
    s = next(x for x in r.relaxations if x.kind == "seq_len")
    assert s.fits and s.value % 128 == 0 and s.value < 131072
    assert at(s.value).fits
    assert not at(s.value + 128).fits


def test_cli_exit_codes_and_json(tmp_path, capsys):
    path, _ = run(tmp_path)
    assert main(["check", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["fits"] and d["memory"]["hbm"]["margin_gib"] > 0
    path, _ = run(tmp_path, hbm=16, extra="execution: {tp: 1, pp: 1, zero: 0}")
    assert main(["check", str(path), "--json"]) == 3
    d = json.loads(capsys.readouterr().out)
    assert not d["fits"] and d["conflicts"][0]["group"] == "memory.hbm" and d["relaxations"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("llm: gpt3-175b\nsystem: h100-sxm-80gb\nnum_gpus: 0\ntraining: {global_batch: 8}\n")
    assert main(["check", str(bad)]) == 2
    assert "num_gpus" in capsys.readouterr().err


MOE = """
llm: {name: moe, hidden: 1024, ffn: 2048, layers: 8, heads: 16, seq_len: 2048, vocab: 32000, mlp: swiglu,
      moe: {experts: 8, top_k: 2, expert_ffn: 2048}}
system: a100-sxm-80gb
num_gpus: 16
training: {global_batch: 64}
"""


@pytest.mark.parametrize("where", ["execution: {ep: 3}", "search: {ep: 16}"])
def test_expert_parallel_degree_that_cannot_split_the_experts(tmp_path, where):
    """ep = 3 or 16 cannot divide 8 experts: the conflict is rules.experts with the fixed ep, and releasing
    ep fits (whether it was fixed in the execution or in search)."""
    path = tmp_path / "moe.yaml"
    path.write_text(MOE + where + "\n")
    r = check(*load_problem_doc(path))
    assert not r.fits
    assert {g for g, _ in r.conflicts} == {"rules.experts", "fixed.ep"}
    assert any(x.kind == "release" and x.value == "ep" and x.fits for x in r.relaxations)


def test_fits_reports_the_knobs_it_freed(tmp_path, capsys):
    """The file fixes tp and pp only: the fastest plan that fits moves other knobs (dp, micro-batch, ZeRO...);
    every one moved from its default is reported with its default, and none of the fixed ones."""
    path, r = run(tmp_path, extra="execution: {tp: 2, pp: 2}")
    assert r.fits
    ex = r.plan.plans[0].evaluation.execution
    assert ex.tp == 2 and ex.pp == 2
    assert "tp" not in r.freed and "pp" not in r.freed and "dp" not in r.freed
    from optimizer.schema import Execution

    default = Execution()
    for k in ("micro_batch", "zero", "recompute", "sequence_parallel", "cp", "vpp"):
        chosen = getattr(ex, k)
        chosen = chosen.value if hasattr(chosen, "value") else chosen
        dflt = getattr(default, k)
        dflt = dflt.value if hasattr(dflt, "value") else dflt
        assert (k in r.freed) == (chosen != dflt)
        if k in r.freed:
            assert r.freed[k] == (chosen, dflt)
    assert r.freed  # the 1.3B model on 8 GPUs is not fastest at every default
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "left free, chosen by the solver" in out
    for k, (c, d) in r.freed.items():
        assert f"{k}={c} [{d}]" in out


def test_smallest_hbm_fits_with_the_default_headroom(tmp_path):
    """The default headroom is a share of the HBM (the memory model's stated error), so it grows with the HBM
    suggested: the smallest HBM is the use x (1 + the error), and it fits; the use plus the headroom of the
    GPU the problem has (what was suggested before) does not."""
    from optimizer.model.capacity import MEMORY_ERROR_PCT

    path = tmp_path / "p.yaml"
    body = BASE.format(hbm=16, gpus=8, batch=16, extra="execution: {tp: 1, pp: 1, zero: 0}")
    path.write_text(body.replace("options: {memory_headroom_gib: 0}\n", ""))
    r = check(*load_problem_doc(path))
    assert not r.fits
    hbm = next(x for x in r.relaxations if x.kind == "hbm")
    assert hbm.fits, hbm
    need = r.min_hbm_gib / (1 + MEMORY_ERROR_PCT / 100)
    old = need + 16 * (1 - 1 / (1 + MEMORY_ERROR_PCT / 100))  # use + this 16 GiB GPU's headroom
    path.write_text(
        body.replace("hbm_gib: 16", f"hbm_gib: {old:.1f}").replace("options: {memory_headroom_gib: 0}\n", "")
    )
    assert not check(*load_problem_doc(path)).fits


def _applied(doc: dict, r) -> dict | None:
    """The problem file `doc` with the suggestion `r` applied as a user would write it (fixed knobs of
    `execution` become `search` values, as `check` reads them; None: not a change a file states)."""
    import copy

    d = copy.deepcopy(doc)
    search = dict(d.pop("execution", {}) or {}) | dict(d.get("search") or {})
    sysname = d["system"]
    if r.kind == "hbm":
        d["system"] = {"base": sysname, "hbm_gib": r.value}
    elif r.kind == "gpus":
        d["num_gpus"] = r.value
    elif r.kind in ("global_batch", "seq_len"):
        d["training"] = dict(d["training"]) | {r.kind: r.value}
    elif r.kind == "release":
        search.pop(r.value, None)
    elif r.kind == "offload":
        sysd = library_system(sysname).offload
        d["system"] = {
            "base": sysname,
            "offload": {"capacity_gib": r.value, "bandwidth_gbps": sysd.bandwidth_gbps or 64},
        }
        for k in ("weight_offload", "activation_offload", "optimizer_offload"):
            search.pop(k, None)
    else:
        return None
    d["search"] = search
    return d


@pytest.mark.parametrize("name", ["gpt3-175b-64xa100-40gb", "batch-1000-on-1024xh100"])
def test_every_suggestion_of_the_shipped_checks_fits_when_applied(tmp_path, name, capsys):
    """Each suggestion `check` prints as fitting, written into the problem file as a user would and solved
    by `paraplan solve`, fits (exit 0) at the step time printed."""
    import json

    import yaml

    src = ROOT / "problems" / "studies" / "check" / f"{name}.yaml"
    doc = yaml.safe_load(src.read_text())
    r = check(*load_problem_doc(src))
    shown = [x for x in r.relaxations if x.fits]
    assert not r.fits and shown
    for i, x in enumerate(shown):
        d = _applied(doc, x)
        assert d is not None, x
        path = tmp_path / f"{i}.yaml"
        path.write_text(yaml.safe_dump(d))
        assert main(["solve", str(path), "--json"]) == 0, x
        got = json.loads(capsys.readouterr().out)["plans"][0]["step_time_s"]
        assert got == pytest.approx(x.step_time_s, rel=1e-3), x


def test_an_uneven_split_whose_vpp_does_not_divide_its_stage_is_named(tmp_path):
    """25 layers (no embedding/loss slots) at pp 2 unevenly: the busiest stage holds 13, which vpp 2 does not
    divide, so the solver has no such split: `check` names the layer rule with the fixed vpp and finds that
    releasing vpp fits; vpp 13 would divide it."""
    extra = (
        "execution: {pp: 2, vpp: 2, pp_uneven: true, pp_embedding_loss: false}\n"
        "search: {pp_embedding_loss: false}"
    )
    path = tmp_path / "u.yaml"
    path.write_text(BASE.format(hbm=80, gpus=8, batch=16, extra=extra).replace("layers: 24", "layers: 25"))
    r = check(*load_problem_doc(path))
    assert not r.fits
    groups = {g for g, _ in r.conflicts}
    assert "rules.layers" in groups and "fixed.vpp" in groups
    assert "vpp" in {x.value for x in r.relaxations if x.kind == "release" and x.fits}


def test_layers_the_fixed_pipeline_does_not_divide_suggest_an_uneven_split(tmp_path):
    """25 layers at a fixed pp 4 (no embedding/loss slots: 27 does not divide either): the layer rule and
    the fixed pp conflict; releasing pp fits, and so does allowing uneven splits (7 layers on the busiest
    stage), at a step time of its own."""
    extra = "execution: {pp: 4}\nsearch: {pp_embedding_loss: false}"
    path = tmp_path / "u.yaml"
    path.write_text(BASE.format(hbm=80, gpus=8, batch=16, extra=extra).replace("layers: 24", "layers: 25"))
    r = check(*load_problem_doc(path))
    assert not r.fits and {"rules.layers", "fixed.pp"} <= {g for g, _ in r.conflicts}
    uneven = [x for x in r.relaxations if x.kind == "uneven"]
    assert len(uneven) == 1 and uneven[0].fits and uneven[0].step_time_s > 0
    # written off in the execution: the same solve, offered as releasing it
    path.write_text(path.read_text().replace("{pp: 4}", "{pp: 4, pp_uneven: false}"))
    r = check(*load_problem_doc(path))
    assert [x.change.split(" (")[0] for x in r.relaxations if x.kind == "uneven"] == ["release pp_uneven"]
    path.write_text(path.read_text().replace(", pp_uneven: false}", "}"))
    path.write_text(path.read_text().replace("search: {", "search: {pp_uneven: [false, true], "))
    r = check(*load_problem_doc(path))
    ex = r.plan.plans[0].evaluation.execution
    assert r.fits and ex.pp == 4 and ex.pp_uneven
    assert r.plan.plans[0].evaluation.result["step_time"] == pytest.approx(uneven[0].step_time_s, rel=1e-6)
