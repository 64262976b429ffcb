"""The command line: `evaluate --json`, `schema`, `validate --json`."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from helpers import ROOT

from optimizer.cli import main
from optimizer.io.loader import load_problem

DEFAULT = str(ROOT / "problems" / "default.yaml")


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    """Error messages show paths relative to the working directory when inside it: run from the repo root
    (tmp_path lies outside it, so paths of files written there are shown as given)."""
    monkeypatch.chdir(ROOT)


def _run_json(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)  # one JSON object, nothing else on stdout


# ------------------------------------------------------------------------------ evaluate
def test_evaluate_json_parts_sum_to_totals(capsys):
    d = _run_json(capsys, ["evaluate", DEFAULT, "--json"])
    assert isinstance(d, dict)
    parts = d["time_s"]
    assert set(parts) == {
        "fw",
        "bw",
        "recompute",
        "head",
        "optimizer",
        "tp_exposed",
        "cp_exposed",
        "ep_exposed",
        "pp_exposed",
        "dp_exposed",
        "bubble",
        "offload_exposed",
        "overlap_slowdown",
        "fsdp_copies",
        "host_wait",
    }
    assert all(v >= 0 for v in parts.values())
    assert d["step_time_s"] > 0
    assert sum(parts.values()) == pytest.approx(d["step_time_s"], rel=1e-9)
    mem = d["memory_gib"]
    total = mem["weights"] + mem["grads"] + mem["optim_state"] + mem["activations"] + mem["reserved"]
    assert total == pytest.approx(mem["total"], rel=1e-9)
    # fits is the comparison of the total with the capacity (default problem has no headroom option)
    assert d["fits"] == (mem["total"] <= mem["capacity"])
    # throughput is consistent with the step time: tokens/s = samples/s * seq_len
    seq_len = load_problem(DEFAULT).seq_len
    assert d["tokens_per_s"] == pytest.approx(d["samples_per_s"] * seq_len, rel=1e-12)
    assert d["samples_per_s"] == pytest.approx(
        load_problem(DEFAULT).training.global_batch / d["step_time_s"], rel=1e-12
    )
    ex = d["execution"]
    # dp resolved from num_gpus / (tp*pp*cp)
    assert ex["tp"] * ex["pp"] * ex["dp"] * ex["cp"] == d["num_gpus"]


def test_evaluate_text_output(capsys):
    assert main(["evaluate", DEFAULT]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "total HBM" in out


# ------------------------------------------------------------------------------ schema
def test_schema_is_json_with_problem_properties(capsys):
    d = _run_json(capsys, ["schema"])
    props = d["properties"]
    for key in ("llm", "system", "training", "num_gpus", "execution"):
        assert key in props
    assert set(d["required"]) >= {"llm", "system", "num_gpus", "training"}


# ------------------------------------------------------------------------------ validate
RUN_KEYS = {
    "id",
    "status",
    "reason",
    "predicted_step_time_s",
    "target_step_time_s",
    "error_pct",
    "predicted_peak_memory_gib",
    "target_peak_memory_gib",
    "fits",
    "assumptions",
}
SUMMARY_KEYS = {
    "n_runs",
    "n_scored",
    "mape_pct",
    "max_abs_error_pct",
    "memory_mape_pct",
    "n_not_fitting",
    "by_stack",
    "precision_order",
}


def _records(calibration_file, *ids):
    runs = yaml.safe_load(calibration_file.read_text(encoding="utf-8"))
    by_id = {r["id"]: r for r in runs}
    return [copy.deepcopy(by_id[i]) for i in ids]


def test_validate_json_shape(tmp_path, capsys, calibration_file):
    [ok] = _records(calibration_file, "korthikanti2022-22b-full-recompute")
    tpu = copy.deepcopy(ok)
    tpu["id"] = "on-tpu"
    tpu["hardware"]["gpu"] = "tpu-v4"
    broken = copy.deepcopy(ok)
    broken["id"] = "no-model"
    del broken["model"]
    typo = copy.deepcopy(ok)
    typo["id"] = "typo"
    typo["parallel"]["micro_bach"] = 1
    # a record the schema rejects is bad input: exit 2, file:line:field, nothing scored
    for bad, field in ((broken, "2.model"), (typo, "2.parallel.micro_bach")):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump([ok, tpu, bad], sort_keys=False), encoding="utf-8")
        assert main(["validate", str(path), "--json"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "bad.yaml:" in err and f": {field}: " in err and "Traceback" not in err

    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([ok, tpu], sort_keys=False), encoding="utf-8")
    d = _run_json(capsys, ["validate", str(path), "--json"])
    assert set(d) == {"runs", "summary"}
    rows = d["runs"]
    assert [r["id"] for r in rows] == [ok["id"], "on-tpu"]
    for r in rows:
        assert RUN_KEYS <= set(r)
        assert isinstance(r["assumptions"], list)
    r_ok, r_tpu = rows

    assert r_ok["status"] == "ok" and r_ok["reason"] is None
    # the run states step_time_s = 1.42 s: that is the target
    assert r_ok["target_step_time_s"] == pytest.approx(1.42)
    pred = r_ok["predicted_step_time_s"]
    assert pred > 0
    assert r_ok["error_pct"] == pytest.approx(100 * (pred - 1.42) / 1.42, rel=1e-12)
    assert r_ok["predicted_peak_memory_gib"] > 0
    assert r_ok["target_peak_memory_gib"] is None  # the record has no peak memory
    assert isinstance(r_ok["fits"], bool)

    assert r_tpu["status"] == "skipped"
    assert "tpu-v4" in r_tpu["reason"]
    assert r_tpu["predicted_step_time_s"] is None and r_tpu["error_pct"] is None

    s = d["summary"]
    assert set(s) == SUMMARY_KEYS
    assert s["n_runs"] == 2
    assert s["n_scored"] == 1
    assert s["mape_pct"] == pytest.approx(abs(r_ok["error_pct"]), rel=1e-12)
    assert s["max_abs_error_pct"] == pytest.approx(abs(r_ok["error_pct"]), rel=1e-12)
    assert s["memory_mape_pct"] is None
    assert s["n_not_fitting"] == (0 if r_ok["fits"] else 1)
    assert s["by_stack"] == {
        "megatron-core": {
            "n": 1,
            "mape_pct": pytest.approx(abs(r_ok["error_pct"])),
            "mean_signed_error_pct": pytest.approx(r_ok["error_pct"]),
        }
    }
    assert s["precision_order"] == {"n_groups": 0, "n_ordered": 0, "groups": []}  # one precision only


def test_validate_target_rules_and_memory(tmp_path, capsys, calibration_file):
    ok, mem = _records(
        calibration_file, "korthikanti2022-22b-full-recompute", "tt-llama3.1-8b-fsdp-8gpu-eager"
    )
    # a throughput-only record: target = global_batch*seq_len/(tokens_per_s_per_gpu*num_gpus)
    # = 4*2048/(1000*8) = 1.024 s
    tps = copy.deepcopy(ok)
    tps["id"] = "throughput-only"
    tps["measured"]["step_time_s"] = None
    tps["measured"]["tokens_per_s_per_gpu"] = 1000.0
    assert (tps["parallel"]["global_batch"], tps["model"]["seq_len"], tps["hardware"]["num_gpus"]) == (
        4,
        2048,
        8,
    )
    path = tmp_path / "runs.yaml"
    path.write_text(yaml.safe_dump([ok, tps, mem], sort_keys=False), encoding="utf-8")

    d = _run_json(capsys, ["validate", str(path), "--json"])
    r_ok, r_tps, r_mem = d["runs"]
    assert r_tps["status"] == "ok"
    assert r_tps["target_step_time_s"] == pytest.approx(1.024, rel=1e-12)
    # same configuration as r_ok: same prediction
    assert r_tps["predicted_step_time_s"] == pytest.approx(r_ok["predicted_step_time_s"], rel=1e-12)
    # the torchtitan record states derived_step_time_s and peak memory 82.4 GiB
    assert r_mem["status"] == "ok"
    assert r_mem["target_step_time_s"] == pytest.approx(mem["measured"]["derived_step_time_s"])
    assert r_mem["target_peak_memory_gib"] == pytest.approx(82.4)
    errs = [r["error_pct"] for r in d["runs"]]
    for r in d["runs"]:
        assert r["error_pct"] == pytest.approx(
            100 * (r["predicted_step_time_s"] - r["target_step_time_s"]) / r["target_step_time_s"], rel=1e-12
        )
    s = d["summary"]
    assert s["n_runs"] == s["n_scored"] == 3
    assert s["mape_pct"] == pytest.approx(sum(abs(e) for e in errs) / 3, rel=1e-12)
    assert s["max_abs_error_pct"] == pytest.approx(max(abs(e) for e in errs), rel=1e-12)
    # only one record has a memory target
    assert s["memory_mape_pct"] == pytest.approx(
        abs(100 * (r_mem["predicted_peak_memory_gib"] - 82.4) / 82.4), rel=1e-12
    )
    assert s["n_not_fitting"] == sum(1 for r in d["runs"] if r["fits"] is False)


def test_validate_rejects_a_non_list(tmp_path, capsys):
    path = tmp_path / "runs.yaml"
    path.write_text("id: not-a-list\n", encoding="utf-8")
    assert main(["validate", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:1: ")
    assert "Traceback" not in err


def test_emit_megatron_with_embedding_loss_slots_is_one_bash_command(tmp_path, capsys):
    """126 layers at pp 8, vpp 2 need the embedding/loss slots: Megatron's account-for flags with the model's
    own --num-layers; notes (ZeRO-3) are comment lines outside the continued command, which bash parses."""
    import subprocess

    path = tmp_path / "p.yaml"
    path.write_text(
        "llm: llama3.1-405b\nsystem: h100-sxm-80gb\nnum_gpus: 1024\ntraining: {global_batch: 512}\n"
        "search: {tp: 8, pp: 8, vpp: 2, cp: 1, pp_embedding_loss: true, zero: 3}\n"
    )
    assert main(["solve", str(path), "--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    block = out.split("Megatron-LM command:\n", 1)[1].split("\n\n", 1)[0]
    comments = [x for x in block.splitlines() if x.startswith("#")]
    command = [x for x in block.splitlines() if not x.startswith("#")]
    assert any("ZeRO-3" in c for c in comments)
    assert all(x.endswith("\\") for x in command[:-1]) and not command[-1].endswith("\\")
    assert not any("#" in x for x in command)
    cmd = " ".join(command)
    assert "--num-layers 126" in cmd and "--num-virtual-stages-per-pipeline-rank 2" in cmd
    assert (
        "--account-for-embedding-in-pipeline-split" in cmd and "--account-for-loss-in-pipeline-split" in cmd
    )
    script = tmp_path / "run.sh"
    script.write_text(block + "\n")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_output_file_json_csv_text(tmp_path, capsys):
    import csv

    prob = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n"
    path = tmp_path / "p.yaml"
    path.write_text(prob)
    out = tmp_path / "plans.csv"
    assert main(["solve", str(path), "--top", "3", "--output", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["plan"] for r in rows] == ["1", "2", "3"]
    assert float(rows[0]["step_time_s"]) <= float(rows[1]["step_time_s"]) <= float(rows[2]["step_time_s"])
    assert {"execution.tp", "time_s.bubble", "memory_gib.activations", "mfu", "hfu"} <= set(rows[0])
    js = tmp_path / "plans.json"
    assert main(["solve", str(path), "-o", str(js)]) == 0
    assert json.loads(js.read_text())["status"] == "optimal"
    txt = tmp_path / "plans.txt"
    assert main(["solve", str(path), "-o", str(txt)]) == 0
    assert "paraplan solve" in txt.read_text()
    capsys.readouterr()
    assert main(["solve", str(path), "-o", str(tmp_path / "no" / "x.csv")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_solve_plot_breakdown(tmp_path, capsys, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captured = []
    monkeypatch.setattr(plt, "close", lambda fig: captured.append(fig))
    path = tmp_path / "p.yaml"
    path.write_text("llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n")
    png = tmp_path / "b.png"
    assert main(["solve", str(path), "--top", "3", "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000
    at, am = captured[0].axes
    assert len(at.get_yticklabels()) == 3
    assert {"forward", "backward"} <= {t.get_text() for t in at.get_legend().get_texts()}
    assert {"weights", "activations"} <= {t.get_text() for t in am.get_legend().get_texts()}


def test_help_of_every_command_prints_and_exits_0(capsys):
    """`--help` of the program and of each sub-command renders (argparse formats help strings with %, so a
    bare '%' in one crashes only when help is asked for)."""
    from optimizer.cli import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        parser.parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"][0].choices
    assert "whatif" in subs and "+X% of each resource" in out
    for name in subs:
        with pytest.raises(SystemExit) as e:
            parser.parse_args([name, "--help"])
        assert e.value.code == 0, name
        assert f"usage: paraplan {name}" in capsys.readouterr().out


def test_validate_reports_the_precision_order():
    """`validate` compares, per (model, GPU, GPU count, sequence, global batch) scored in several precisions,
    the order of their measured step times (the same tokens each) with the model's and prints the count and
    each group it misorders.
    Hand-made rows: group A (two precisions) ordered as measured, group B not; a group with one precision
    twice (two micro-batch sizes, say) is no precision comparison."""
    from optimizer.drivers.validate import _summarise
    from optimizer.report.text import render_validation

    def row(rid, group, prec, target, pred):
        return {
            "id": rid,
            "status": "ok",
            "reason": None,
            "predicted_step_time_s": pred,
            "target_step_time_s": target,
            "error_pct": 100 * (pred - target) / target,
            "predicted_peak_memory_gib": 1.0,
            "target_peak_memory_gib": None,
            "fits": True,
            "assumptions": [],
            "stack": "megatron-core",
            "precision": prec,
            "precision_group": group,
        }

    a, b = ["m-a", "gb200-nvl72", 64, 8192, 128], ["m-b", "gb300-nvl72", 256, 8192, 512]
    rows = [
        row("a1", a, "fp8", 1.0, 1.1),
        row("a2", a, "mxfp8", 1.25, 1.3),
        row("b1", b, "fp8", 1.0, 1.2),
        row("b2", b, "mxfp8", 1.1, 1.15),
        row("c1", ["m-c", "h100-sxm-80gb", 8, 2048, 64], "fp8", 1.0, 1.0),  # one precision: no group
        *(
            row(f"d{i}", ["m-d", "a100-sxm-80gb", 8, 2048, 64], p, 1.0 + i / 10, 1.0)  # bf16 twice: none
            for i, p in enumerate(("bf16", "bf16", "fp8"))
        ),
    ]
    v = _summarise(rows).as_dict()
    po = v["summary"]["precision_order"]
    assert po["n_groups"] == 2 and po["n_ordered"] == 1
    assert po["groups"][0] == {
        "group": a,
        "measured": ["fp8", "mxfp8"],
        "predicted": ["fp8", "mxfp8"],
        "ordered": True,
    }
    assert po["groups"][1]["predicted"] == ["mxfp8", "fp8"] and not po["groups"][1]["ordered"]
    text = render_validation(v)
    assert (
        "precision order: 1 of 2 groups (model, GPU, GPUs, sequence, global batch) ordered as measured"
        in text
    )
    assert "m-b gb300-nvl72 256 8192 512: measured fp8 > mxfp8, model mxfp8 > fp8" in text
    assert "m-a gb200" not in text and "m-d" not in text
