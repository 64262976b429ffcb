"""`paraplan study` under faults: a point that crashes, an output that cannot be written, a journal cut by a
kill or left by an edited study, a bad axis value reported at the study's own line."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from optimizer.cli import main

BASE = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 16}\n"


def write(tmp_path, axes: str, command: str = "check", base: str = BASE):
    (tmp_path / "base.yaml").write_text(base)
    path = tmp_path / "s.yaml"
    path.write_text(f"name: t\ncommand: {command}\nbase: base.yaml\naxes:\n{axes}")
    return path


def rows(path):
    return list(csv.DictReader(open(path)))


def _crash_at_four_gpus(monkeypatch):
    import optimizer.drivers.check as check_mod

    real = check_mod.check

    def check(problem, *a, **k):
        if problem.num_gpus == 4:
            raise AttributeError("'str' object has no attribute 'value'")
        return real(problem, *a, **k)

    monkeypatch.setattr(check_mod, "check", check)


def test_a_point_that_crashes_is_an_error_row(tmp_path, monkeypatch, capsys):
    _crash_at_four_gpus(monkeypatch)
    s = write(tmp_path, "  num_gpus: [4, 8, 16]\n")
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}.csv"
        assert main(["study", str(s), "-o", str(out), "--workers", workers]) == 2
        r = rows(out)
        assert [x["status"] for x in r] == ["error", "fits", "fits"]
        assert "internal error: AttributeError" in r[0]["reason"]
        journal = out.with_suffix(".csv.journal.jsonl").read_text().splitlines()
        assert len(journal) == 3
    assert "Traceback" not in capsys.readouterr().err


def test_a_journal_cut_by_a_kill_resumes_without_solving_twice(tmp_path):
    s = write(tmp_path, "  num_gpus: [8, 16]\n")
    ref, cut = tmp_path / "ref.csv", tmp_path / "c.csv"
    assert main(["study", str(s), "-o", str(ref), "--workers", "1"]) == 0
    lines = (tmp_path / "ref.csv.journal.jsonl").read_text().splitlines()
    journal = tmp_path / "c.csv.journal.jsonl"
    journal.write_text("[]\n{}\n" + lines[0] + "\n" + lines[1][:60])  # not rows, a row, a cut line
    assert main(["study", str(s), "-o", str(cut), "--workers", "1"]) == 0
    assert cut.read_text() == ref.read_text()
    after = journal.read_text().splitlines()
    assert len(after) == 2 + 2  # the two non-rows kept, the cut line dropped, every point once
    assert main(["study", str(s), "-o", str(cut), "--workers", "1"]) == 0
    assert journal.read_text().splitlines() == after  # nothing solved again


def test_an_unwritable_output_is_refused_before_any_point(tmp_path, monkeypatch, capsys):
    import optimizer.drivers.study as study_mod

    def never(*a):
        raise AssertionError("a point ran")

    monkeypatch.setattr(study_mod, "run_point", never)
    s = write(tmp_path, "  num_gpus: [8, 16]\n")
    (tmp_path / "adir").mkdir()
    for out in ("/proc/x.csv", str(tmp_path / "nonexistent" / "x.csv"), str(tmp_path / "adir")):
        assert main(["study", str(s), "-o", out, "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert "--output" in err and "cannot write" in err and "Traceback" not in err
    assert not (tmp_path / "adir.journal.jsonl").exists()


def test_a_journal_is_not_reused_after_the_study_or_base_is_edited(tmp_path):
    s = write(tmp_path, "  num_gpus: [8, 16]\n")
    out = tmp_path / "t.csv"
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 0
    assert {x["system"] for x in rows(out)} == {"h100-sxm-80gb"}
    (tmp_path / "base.yaml").write_text(BASE.replace("h100-sxm-80gb", "a100-sxm-40gb"))
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 0
    assert {x["system"] for x in rows(out)} == {"a100-sxm-40gb"}
    s.write_text(s.read_text().replace("[8, 16]", "[16, 32]"))
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 0
    r = rows(out)
    assert [x["axis.num_gpus"] for x in r] == ["16", "32"] and [x["point"] for x in r] == ["0", "1"]
    journal = (tmp_path / "t.csv.journal.jsonl").read_text().splitlines()
    assert len(journal) == 5  # 16 GPUs on the a100 was reused at its new index; 32 solved
    assert all("key" in json.loads(line) for line in journal) and "key" not in r[0]


def test_a_bad_axis_path_or_value_is_reported_at_the_study_line(tmp_path):
    s = write(tmp_path, "  sytem.hbm_gib: [80]\n  num_gpus: [-8]\n  system.hbm_gib: [-5]\n", command="solve")
    s.write_text(s.read_text() + "mode: zip\n")
    out = tmp_path / "t.csv"
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 2
    reason = rows(out)[0]["reason"]
    assert f"{s}:5: sytem" in reason and "base.yaml" not in reason
    for axes, line in (("  num_gpus: [-8]\n", 5), ("  system.hbm_gib: [-5]\n", 5)):
        s = write(tmp_path, axes, command="solve")
        assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 2
        assert rows(out)[0]["reason"].startswith(f"{s}:{line}: "), rows(out)[0]["reason"]


def test_a_missing_base_file_is_reported_at_the_study_line(tmp_path, capsys):
    s = tmp_path / "s.yaml"
    s.write_text("name: t\nbase: nonexistent.yaml\naxes: {num_gpus: [8]}\n")
    assert main(["study", str(s), "-o", str(tmp_path / "t.csv")]) == 2
    assert f"{s}:2: base: nonexistent.yaml: no such file" in capsys.readouterr().err


def test_a_base_name_the_file_system_refuses_is_reported_at_the_study_line(tmp_path, capsys):
    """A base of 5,000 characters (found by the fuzzer: OSError 'File name too long' from a traceback)."""
    s = tmp_path / "s.yaml"
    s.write_text(f"name: t\nbase: {'x' * 5000}\naxes: {{num_gpus: [8]}}\n")
    assert main(["study", str(s), "-o", str(tmp_path / "t.csv")]) == 2
    err = capsys.readouterr().err
    assert (
        f"{s}:2: base: " in err and "not a file name (File name too long)" in err and "Traceback" not in err
    )


def test_pooled_points_are_submitted_a_window_at_a_time():
    from concurrent.futures import ThreadPoolExecutor

    from optimizer.drivers.study import run_pooled

    state = {"submitted": 0, "recorded": 0, "most": 0}
    rows_seen: list[int] = []

    with ThreadPoolExecutor(2) as ex:
        submit = ex.submit

        def counted(fn, t):
            state["submitted"] += 1
            state["most"] = max(state["most"], state["submitted"] - state["recorded"])
            return submit(fn, t)

        ex.submit = counted

        def record(row):
            state["recorded"] += 1
            rows_seen.append(row["point"])

        todo = [(i, {"num_gpus": i}) for i in range(200)]
        run_pooled(ex, lambda t: {"point": t[0], "status": "fits"}, todo, record, lambda: None, window=4)
    assert sorted(rows_seen) == list(range(200)) and state["most"] <= 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("start", ["fork", pytest.param("forkserver", marks=pytest.mark.slow)])
def test_pool_workers_end_when_the_parent_is_killed(tmp_path, start):

    script = (
        "import time\n"
        "from optimizer.drivers.pool import process_pool\n"
        "ex = process_pool(2)\n"
        "fs = [ex.submit(time.sleep, 60) for _ in range(2)]\n"
        "time.sleep(0.5)\n"
        "print(' '.join(str(p) for p in ex._processes), flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(
        os.environ,
        PARAPLAN_MP_START=start,
        PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    t0 = time.time()
    alive = pids
    while alive and time.time() - t0 < 5:
        time.sleep(0.1)
        alive = [p for p in pids if _alive(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive


def _alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def test_a_base_that_cannot_be_read_points_at_the_study_base_line(tmp_path, capsys):
    """A study whose base is a device (found by the fuzzer) is exit 2 naming the study's own file and the
    line of its `base:` field, not only the device."""
    s = tmp_path / "s.yaml"
    s.write_text("name: t\ncommand: solve\nbase: /dev/zero\naxes:\n  num_gpus: [8, 16]\n")
    assert main(["study", str(s), "-o", str(tmp_path / "o.csv"), "-q"]) == 2
    assert f"{s}:3: base: /dev/zero: cannot read" in capsys.readouterr().err
