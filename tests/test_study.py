"""`paraplan study`: points over axes, each row the solve of that point; resumable (a killed study re-run
gives the same table); local workers and Ray agree."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT

from optimizer.cli import main
from optimizer.drivers.solve import solve
from optimizer.io.loader import load_problem

BASE = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 16}\n"


def write(tmp_path, axes: str, mode: str = "cross", n: int = 1):
    (tmp_path / "base.yaml").write_text(BASE)
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\nbase: base.yaml\naxes:\n{axes}mode: {mode}\n")
    return path


def rows(path):
    return list(csv.DictReader(open(path)))


def test_points_cross_and_each_row_is_its_solve(tmp_path):
    s = write(tmp_path, "  num_gpus: {from: 8, to: 16, step: 8}\n  system.hbm_gib: [40, 80]\n")
    out = tmp_path / "t.csv"
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 0
    r = rows(out)
    assert [(x["axis.num_gpus"], x["axis.system.hbm_gib"]) for x in r] == [
        ("8", "40"),
        ("8", "80"),
        ("16", "40"),
        ("16", "80"),
    ]
    for x in r:  # the point's own solve, written as a file
        p = tmp_path / "one.yaml"
        p.write_text(
            BASE.replace("num_gpus: 8", f"num_gpus: {x['axis.num_gpus']}").replace(
                "system: h100-sxm-80gb",
                f"system: {{base: h100-sxm-80gb, hbm_gib: {x['axis.system.hbm_gib']}}}",
            )
        )
        assert float(x["step_time_s"]) == pytest.approx(
            solve(load_problem(p)).plans[0].evaluation.result["step_time"], rel=1e-12
        )


def test_bad_point_is_an_error_row_and_exit_two(tmp_path, capsys):
    s = write(tmp_path, "  num_gpus: [8, -1]\n")
    out = tmp_path / "t.csv"
    assert (
        main(["study", str(s), "-o", str(out), "--workers", "1"]) == 2
    )  # a failed point: the table is written
    r = rows(out)
    assert r[0]["status"] == "optimal" and r[1]["status"] == "error" and "num_gpus" in r[1]["reason"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: base.yaml\naxes: {num_gpus: [8]}\nmode: diagonal\n")
    assert main(["study", str(bad)]) == 2
    assert f"{bad}:3: mode" in capsys.readouterr().err


@pytest.mark.slow
def test_killed_study_resumes_to_the_same_table(tmp_path):
    s = write(tmp_path, "  training.global_batch: {from: 8, to: 256, step: 8}\n")
    full = tmp_path / "full.csv"
    assert main(["study", str(s), "-o", str(full), "--workers", "1"]) == 0
    part = tmp_path / "part.csv"
    journal = tmp_path / "part.csv.journal.jsonl"
    cmd = [sys.executable, "-m", "optimizer.cli", "study", str(s), "-o", str(part), "--workers", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < 60 and (not journal.exists() or len(journal.read_text().splitlines()) < 5):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(journal.read_text().splitlines())
    assert 5 <= done < 32 and not part.exists()
    assert main(["study", str(s), "-o", str(part), "--workers", "1"]) == 0
    assert part.read_text() == full.read_text()
    assert len(journal.read_text().splitlines()) == 32  # no point solved twice


def test_local_workers_equal_one_process(tmp_path):
    s = write(tmp_path, "  num_gpus: [8, 16, 24, 32]\n")
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["study", str(s), "-o", str(a), "--workers", "1"]) == 0
    assert main(["study", str(s), "-o", str(b), "--workers", "2"]) == 0
    assert a.read_text() == b.read_text()


def test_ray_local_cluster_equals_local(tmp_path):
    pytest.importorskip("ray")
    s = write(tmp_path, "  num_gpus: [8, 16]\n")
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["study", str(s), "-o", str(a), "--workers", "1"]) == 0
    assert main(["study", str(s), "-o", str(b), "--ray", "--workers", "2"]) == 0
    assert a.read_text() == b.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["study1-megatron-1t-splits", "study4-offload"])
def test_shipped_calculon_studies_run_and_plot(tmp_path, name):
    out = tmp_path / f"{name}.csv"
    assert (
        main(
            [
                "study",
                str(ROOT / "problems/studies/calculon" / f"{name}.yaml"),
                "-o",
                str(out),
                "--plot",
                str(tmp_path / "plots"),
                "--workers",
                "2",
            ]
        )
        == 0
    )
    r = rows(out)
    assert r and all(x["status"] in ("optimal", "infeasible") for x in r)
    assert (tmp_path / "plots" / "heatmap.png").stat().st_size > 1000


def test_study_names_its_best_point_and_what_it_resumed(tmp_path, capsys):
    """The report names the fastest point (its axes and step), and a re-run says how many rows it read
    from the journal instead of solving them (JSON: `resumed`, `best_point`)."""
    import json

    s = write(tmp_path, "  num_gpus: [8, 16]\n")
    out = tmp_path / "o.csv"
    assert main(["study", str(s), "-o", str(out), "--workers", "1", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    steps = {int(r["point"]): float(r["step_time_s"]) for r in rows(out)}
    assert first["resumed"] == 0 and first["best_point"] == min(steps, key=steps.get)
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "resumed: 2 of them read from" in text and ".journal.jsonl" in text
    best = min(steps, key=steps.get)
    assert f"best: point {best} (num_gpus=" in text


def test_study_plots_read_well():
    """A line plot over a sweep spanning 10x or more is on log axes (the cliffs at large sizes stay
    visible), axes carry readable labels instead of field paths, and the legend sits outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    from types import SimpleNamespace

    import matplotlib.pyplot as plt

    from optimizer.report.plots import _study_line, axis_label

    study = SimpleNamespace(name="s", axes={"num_gpus": None}, mode=SimpleNamespace(value="cross"))
    ok = [
        {"axis.num_gpus": n, "step_time_s": 800.0 / n, "mfu": 0.4, "point": i}
        for i, n in enumerate((8, 64, 512, 4096))
    ]
    fig = _study_line(plt, ok, study, ["num_gpus"])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_xlabel() == "GPUs"
    fig.canvas.draw()
    leg = ax.get_legend().get_window_extent()
    assert leg.y1 <= ax.get_window_extent().y0  # below the axes, covering no data
    plt.close(fig)
    narrow = [dict(r, **{"axis.num_gpus": 64 + i, "step_time_s": 1.0 + i}) for i, r in enumerate(ok)]
    fig = _study_line(plt, narrow, study, ["num_gpus"])
    assert fig.axes[0].get_xscale() == "linear" and fig.axes[0].get_yscale() == "linear"
    plt.close(fig)
    assert axis_label("search.tp") == "tensor parallel (tp)"
    assert axis_label("system.offload.bandwidth_gbps") == "offload bandwidth, GB/s"
