"""Every finding of the hostile-input review, one test each: exit 2 with file:line:field and no
traceback for bad input, whatever the bytes; no hang; distinct exit codes; strict JSON."""

from __future__ import annotations

import json
import os
import time

import pytest

from optimizer.cli import main

BASE = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n"


def run(tmp_path, capsys, body: str | bytes, *args, command="solve", name="p.yaml"):
    path = tmp_path / name
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body, encoding="utf-8")
    t0 = time.perf_counter()
    try:
        rc = main([command, str(path), *args])
    except SystemExit as e:  # argparse
        rc = e.code
    dt = time.perf_counter() - t0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err, dt, str(path)


def assert_input_error(rc, err, path, line=None, field=None, words=""):
    assert rc == 2
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert lines, err
    want = f"error: {path}:" + (f"{line}:" if line else "")
    hit = [x for x in lines if x.startswith(want) and (field is None or f" {field}:" in x) and words in x]
    assert hit, (want, field, words, lines)


def test_precision_the_system_lacks(tmp_path, capsys):
    body = BASE.replace("training: {global_batch: 8}", "training: {global_batch: 8, precision: fp8}").replace(
        "system: h100-sxm-80gb", "system: v100-sxm-32gb"
    )
    rc, _, err, _, path = run(tmp_path, capsys, body)
    assert_input_error(rc, err, path, 4, "training.precision", "no fp8 matrix peak")


@pytest.mark.parametrize(
    "snippet, words",
    [
        ("x: !!python/object/apply:os.system ['echo pwned']\n", "unsupported YAML tag"),
        ("x: !!python/name:os.system\n", "unsupported YAML tag"),
        ("x: !custom {a: 1}\n", "unsupported YAML tag '!custom'"),
    ],
)
def test_hostile_tags_rejected_by_name(tmp_path, capsys, snippet, words):
    rc, _, err, _, path = run(tmp_path, capsys, BASE + snippet)
    assert_input_error(rc, err, path, 5, "x", words)


def test_binary_and_non_utf8(tmp_path, capsys):
    rc, _, err, _, path = run(tmp_path, capsys, BASE.encode() + b"\x00\x01binary")
    assert_input_error(rc, err, path, 5, None, "binary file")
    rc, _, err, _, path = run(tmp_path, capsys, BASE.encode() + b"name: caf\xe9\n", name="latin1.yaml")
    assert_input_error(rc, err, path, 5, None, "not UTF-8")
    rc, _, err, _, path = run(tmp_path, capsys, BASE + "name: a\x1db\n", name="ctrl.yaml")
    assert_input_error(rc, err, path, 5, None, "not allowed")


def test_deep_nesting_recursive_alias_and_alias_bomb(tmp_path, capsys):
    rc, _, err, dt, path = run(tmp_path, capsys, BASE + "x: " + "[" * 5000 + "]" * 5000 + "\n")
    assert_input_error(rc, err, path, 5, None, "nested too deeply")
    rc, _, err, dt, path = run(tmp_path, capsys, BASE + "x: &a [*a]\n", name="rec.yaml")
    assert_input_error(rc, err, path, 5, "x.0", "refers to itself")
    bomb = "a: &a [" + ",".join(["lol"] * 10) + "]\n"
    for x, y in zip("abcdefgh", "bcdefghi", strict=True):
        bomb += f"{y}: &{y} [" + ",".join([f"*{x}"] * 10) + "]\n"
    rc, _, err, dt, path = run(tmp_path, capsys, BASE + bomb, name="bomb.yaml")
    assert_input_error(rc, err, path, None, None, "values")
    assert dt < 10


def test_the_largest_counts_answer_without_scanning(tmp_path, capsys):
    """2^24 GPUs with idle GPUs allowed, the largest batch (2^20): answered fast (domains come from
    factorised divisors of the model's sizes, never from a loop up to a count)."""
    body = BASE.replace("num_gpus: 8", f"num_gpus: {2**24}").replace(
        "training: {global_batch: 8}",
        f"training: {{global_batch: {2**20}}}\noptions: {{allow_idle_gpus: true}}",
    )
    rc, out, err, dt, _ = run(tmp_path, capsys, body, "--json")
    assert rc in (0, 3, 4), err
    assert dt < 60


def test_huge_file(tmp_path, capsys):
    rc, _, err, dt, path = run(tmp_path, capsys, BASE + "# " + "x" * (50 * 2**20) + "\n")
    assert_input_error(rc, err, path, None, None, "file too large")
    assert dt < 10


@pytest.mark.parametrize(
    "value, words",
    [
        ("9" * 10000, "number with 10000 characters"),
        (str(2**40), "must be <= 16,777,216"),
        ("1.0e+9", "must be an integer"),
        ("'8'", "must be an integer"),
        ("true", "must be an integer"),
        ("-3", "must be > 0"),
    ],
)
def test_numbers_strict_and_bounded(tmp_path, capsys, value, words):
    rc, _, err, dt, path = run(tmp_path, capsys, BASE.replace("num_gpus: 8", f"num_gpus: {value}"))
    assert_input_error(rc, err, path, 3, "num_gpus", words)
    assert dt < 10


@pytest.mark.parametrize(
    "where, value, line, field, words",
    [
        ("execution", "{tp: '8'}", 5, "execution.tp", "must be an integer"),
        ("execution", "{tp: 9223372036854775807}", 5, "execution.tp", "must be <="),
        ("execution", "{zero: 5}", 5, "execution.zero", "must be <= 3"),
        ("training", "{global_batch: 8, tokens: .inf}", 4, "training.tokens", "finite"),
        (
            "llm",
            "{base: llama3.1-8b, moe: {experts: 8, top_k: 2, expert_ffn: 1024, capacity_factor: 1.0e+30}}",
            1,
            "llm.moe.capacity_factor",
            "must be <= 64",
        ),
    ],
)
def test_odd_types_and_overflows(tmp_path, capsys, where, value, line, field, words):
    if where == "llm":
        body = BASE.replace("llm: llama3.1-8b", f"llm: {value}")
    elif where == "training":
        body = BASE.replace("training: {global_batch: 8}", f"training: {value}")
    else:
        body = BASE + f"{where}: {value}\n"
    rc, _, err, _, path = run(tmp_path, capsys, body)
    assert_input_error(rc, err, path, line, field, words)


@pytest.mark.parametrize("name", ["a/../../etc/passwd", "x" * 5000, "nul\\0name", "..", "h100 sxm"])
def test_library_names_that_are_not_file_names(tmp_path, capsys, name):
    rc, _, err, _, path = run(tmp_path, capsys, BASE.replace("system: h100-sxm-80gb", f'system: "{name}"'))
    assert_input_error(rc, err, path, 2, "system")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--top", "0"], "outside 1..1000"),
        (["--top", "-1"], "outside 1..1000"),
        (["--top", "100000"], "outside 1..1000"),
        (["--time-limit", "nan"], "outside"),
    ],
)
def test_flag_bounds(tmp_path, capsys, args, words):
    rc, _, err, _, _ = run(tmp_path, capsys, BASE, *args)
    assert rc == 2 and words in err


def test_sat_params_checked(tmp_path, capsys):
    rc, _, err, _, _ = run(tmp_path, capsys, BASE, "--sat-params", '{"no_such_param": 1}')
    assert rc == 2 and "error: --sat-params: no_such_param: unknown CP-SAT parameter" in err
    rc, _, err, _, _ = run(tmp_path, capsys, BASE, "--sat-params", "[1, 2]")
    assert rc == 2 and "JSON object" in err


def test_plot_checked_before_any_work(tmp_path, capsys, monkeypatch):
    """An unwritable --plot path is refused before anything is solved (the solve is never called)."""
    import optimizer.drivers.procure as procure_mod

    def never(*a, **k):
        raise AssertionError("procure solved before --plot was checked")

    monkeypatch.setattr(procure_mod, "procure", never)
    body = (
        "llm: {name: t, hidden: 1024, ffn: 4096, layers: 8, heads: 8, seq_len: 1024, vocab: 32000}\n"
        "training: {global_batch: 16, tokens: 1.0e+9}\nprocure: {goal: throughput, budget_usd: 1.0e+6}\n"
        "catalog: {name: c, node_types: [{name: h, system: h100-sxm-80gb, price_usd: 300000}]}\n"
    )
    rc, _, err, _, _ = run(
        tmp_path, capsys, body, "--plot", str(tmp_path / "nope" / "f.png"), command="procure"
    )
    assert rc == 2 and "does not exist" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (a place nobody can write)")
def test_unwritable_plot_file_is_refused_before_the_solve(tmp_path, capsys, monkeypatch):
    """A --plot file in a folder that exists but cannot be written (/proc) is refused with exit 2 naming
    --plot, before the solve (it used to die in savefig with a traceback after the work)."""
    import optimizer.drivers.solve as solve_mod

    def never(*a, **k):
        raise AssertionError("solved before --plot was checked")

    monkeypatch.setattr(solve_mod, "solve", never)
    rc, _, err, _, _ = run(tmp_path, capsys, BASE, "--plot", "/proc/paraplan-x.png")
    assert rc == 2 and "--plot: cannot write /proc/paraplan-x.png" in err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (a place nobody can write)")
def test_unwritable_study_plot_folder_is_refused_before_any_point(tmp_path, capsys):
    """study --plot FOLDER that cannot be made is refused with exit 2 before any point runs, and no table or
    journal is written."""
    (tmp_path / "base.yaml").write_text(BASE, encoding="utf-8")
    study = tmp_path / "st.yaml"
    study.write_text("name: s\nbase: base.yaml\naxes: {num_gpus: [8]}\n", encoding="utf-8")
    out = tmp_path / "st.csv"
    rc = main(["study", str(study), "-o", str(out), "--plot", "/proc/paraplan-plots", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "--plot: cannot write into /proc/paraplan-plots" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "st.csv.journal.jsonl").exists()


def test_enumerate_refuses_a_space_too_large_for_memory(tmp_path, capsys, monkeypatch):
    import optimizer.drivers.solve as solve_mod

    monkeypatch.setattr(solve_mod, "ENUMERATE_MAX", 1000)
    rc, _, err, _, _ = run(tmp_path, capsys, BASE, "--method", "enumerate")
    assert rc == 2 and "use cpsat" in err


def test_every_size_one_solves(tmp_path, capsys):
    """A model of every size 1 has sub-ns steps: the 0.1% check allows one solver time unit (it exited 4)."""
    body = (
        "llm: {name: one, hidden: 1, ffn: 1, layers: 1, heads: 1, seq_len: 1, vocab: 1}\n"
        "system: h100-sxm-80gb\n"
        "num_gpus: 1\ntraining: {global_batch: 1}\n"
    )
    rc, out, err, _, _ = run(tmp_path, capsys, body, "--json")
    assert rc == 0, err
    assert json.loads(out)["status"] == "optimal"


def test_json_when_nothing_fits_and_strict_json(tmp_path, capsys):
    body = BASE.replace("system: h100-sxm-80gb", "system: {base: h100-sxm-80gb, hbm_gib: 1}")
    rc, out, err, _, _ = run(tmp_path, capsys, body, "--json")
    assert rc == 3
    d = json.loads(out)
    assert d["status"] == "infeasible" and d["reason"] == "memory" and d["plans"] == []
    rc, out, _, _, _ = run(tmp_path, capsys, BASE, "--json", name="ok.yaml")
    assert rc == 0 and "Infinity" not in out and "NaN" not in out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_fewest_gpus_for_a_days_target_answers_quickly(tmp_path, capsys):
    """Fewest GPUs for a 30-day target on up to 4096 GPUs: it used to be silent for 60 s and then exit 3
    ("no plan found within 60 s") although plans exist."""
    body = (
        "llm: llama3.1-70b\nsystem: h100-sxm-80gb\nnum_gpus: 4096\n"
        "training: {global_batch: 1024, tokens: 1.0e+12}\noptions: {allow_idle_gpus: true}\n"
        "objective: {goal: fewest_gpus, max_days: 30}\n"
    )
    rc, out, err, dt, _ = run(tmp_path, capsys, body, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert d["status"] == "optimal"
    days = d["plans"][0]["time_to_train_s"] / 86400 if d["plans"][0].get("time_to_train_s") else None
    assert days is None or days <= 30 + 1e-6
    assert dt < 30


def test_validate_typo_key_exits_two(tmp_path, capsys):
    import yaml
    from helpers import CALIBRATION

    if not CALIBRATION.exists():
        pytest.skip("../shared/calibration absent")
    runs = yaml.safe_load(CALIBRATION.read_text())[:1]
    runs[0]["measured"]["step_tme_s"] = 1.0
    rc, out, err, _, path = run(tmp_path, capsys, yaml.safe_dump(runs, sort_keys=False), command="validate")
    assert_input_error(rc, err, path, None, "0.measured.step_tme_s", "unknown key")


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    from optimizer import __version__

    assert capsys.readouterr().out.strip() == f"paraplan {__version__}"


@pytest.mark.parametrize("kind", ["problem", "procure", "catalog", "system", "llm", "run", "fleet"])
def test_schema_kinds(capsys, kind):
    assert main(["schema", "--kind", kind]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["additionalProperties"] is False and d["properties"]


def test_progress_on_a_terminal_only_and_quiet(monkeypatch, capsys):
    """A bar with ETA on stderr when it is a terminal; nothing on a pipe or with --quiet."""
    import io
    import sys

    from optimizer import progress

    class TTY(io.StringIO):
        def isatty(self):
            return True

    for quiet, tty, drawn in ((False, True, True), (True, True, False), (False, False, False)):
        err = TTY() if tty else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setattr(progress, "QUIET", quiet)
        with progress.progress("work", 3) as step:
            step()
            progress.tick()
            step()
        assert ("ETA" in err.getvalue() and "work" in err.getvalue()) == drawn
    monkeypatch.setattr(progress, "QUIET", False)
    assert main(["schema", "--quiet"]) == 0 and progress.QUIET
    progress.QUIET = False


def test_margin_warning_follows_the_memory_models_error(tmp_path):
    """A plan whose HBM margin is below the memory model's stated error (MEMORY_ERROR_PCT of its use) gets a
    warning naming the headroom to set; one with a wide margin does not."""
    from optimizer.io.loader import load_problem
    from optimizer.model.capacity import MEMORY_ERROR_PCT, memory_margin_warning

    path = tmp_path / "p.yaml"
    path.write_text(BASE)
    p = load_problem(path)
    gib = 2.0**30
    tight = 80 * gib / (1 + MEMORY_ERROR_PCT / 100) + 0.5 * gib  # margin just under the error
    loose = 80 * gib / (1 + MEMORY_ERROR_PCT / 100) - 0.5 * gib
    w = memory_margin_warning(tight, p)
    assert w and "memory_headroom_gib" in w and f"{MEMORY_ERROR_PCT:g}%" in w
    assert memory_margin_warning(loose, p) is None
