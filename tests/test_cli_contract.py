"""The command line's contract: the flags of every command (a deliberate table: changing the CLI surface is
a test edit), shared flags before or after the command, `--output` by suffix on every command, `study`'s exit
code, and the CLI calling only `optimizer.api` (plus errors, progress, schema)."""

from __future__ import annotations

import ast
import json

import pytest
from helpers import ROOT

from optimizer.cli import DEFAULTS, build_parser, main, parse

SMALL = "llm: llama3.1-8b\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {global_batch: 8}\n"
SHARED = ["--json", "--output", "--quiet", "-o", "-q"]
FLAGS = {
    "paraplan": ["--help", "--json", "--output", "--quiet", "--time-limit", "--version", "-h", "-o", "-q"],
    "evaluate": ["--emit", "--emit-file", "--help", "--json", "--output", "--quiet", "-h", "-o", "-q"],
    "validate": ["--help", "--json", "--output", "--quiet", "-h", "-o", "-q"],
    "solve": [
        "--backend",
        "--distinct",
        "--emit",
        "--emit-file",
        "--help",
        "--json",
        "--method",
        "--output",
        "--plot",
        "--quiet",
        "--sat-params",
        "--solver",
        "--time-limit",
        "--top",
        "--write-lp",
        "--write-mps",
        "-h",
        "-o",
        "-q",
    ],
    "check": [
        "--emit",
        "--emit-file",
        "--help",
        "--json",
        "--offload-gbps",
        "--offload-gib",
        "--output",
        "--quiet",
        "-h",
        "-o",
        "-q",
    ],
    "procure": [
        "--emit",
        "--emit-file",
        "--help",
        "--json",
        "--output",
        "--pareto",
        "--plot",
        "--quiet",
        "--time-limit",
        "-h",
        "-o",
        "-q",
    ],
    "fleet": ["--help", "--json", "--output", "--plot", "--quiet", "--time-limit", "-h", "-o", "-q"],
    "study": ["--help", "--json", "--output", "--plot", "--quiet", "--ray", "--workers", "-h", "-o", "-q"],
    "whatif": [
        "--band",
        "--emit",
        "--emit-file",
        "--help",
        "--json",
        "--output",
        "--pct",
        "--plot",
        "--quiet",
        "--time-limit",
        "--top",
        "-h",
        "-o",
        "-q",
    ],
    "schema": ["--help", "--kind", "--output", "--quiet", "-h", "-o", "-q"],
}


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _flags(parser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings)


def test_the_flag_set_of_every_command():
    ap = build_parser()
    subs = [a for a in ap._actions if isinstance(a, type(ap._subparsers._group_actions[0]))][0].choices
    assert {"paraplan": _flags(ap)} | {name: _flags(p) for name, p in subs.items()} == FLAGS
    for name in subs:  # every command takes the shared flags but --time-limit (where no solve is timed)
        assert set(SHARED) <= set(FLAGS[name]) or name == "schema", name


def test_shared_flags_before_or_after_the_command(capsys):
    problem = str(ROOT / "problems" / "default.yaml")
    assert main(["--json", "evaluate", problem]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["evaluate", problem, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == before
    # a value given before the command is not overwritten by the command's default, and defaults hold
    assert parse(["--time-limit", "5", "-q", "solve", "p.yaml"]).time_limit == 5.0
    assert parse(["solve", "p.yaml", "--time-limit", "7"]).time_limit == 7.0
    args = parse(["solve", "p.yaml"])
    assert {k: getattr(args, k) for k in DEFAULTS} == DEFAULTS
    with pytest.raises(SystemExit) as e:  # a shared flag the command does not take is a bad flag
        parse(["--time-limit", "5", "check", "p.yaml"])
    assert e.value.code == 2


def test_output_before_the_command_and_schema_to_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["-o", str(out), "schema", "--kind", "llm"]) == 0
    assert "properties" in json.loads(out.read_text())
    assert main(["schema", "-o", str(tmp_path / "s.csv")]) == 2  # a schema has no rows
    assert "no rows" in capsys.readouterr().err


def test_check_output_json_csv_text(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(SMALL)
    js = tmp_path / "x.json"
    assert main(["check", str(path), "-o", str(js), "--emit", "megatron"]) == 0
    d = json.loads(js.read_text())
    assert d["fits"] is True and d["plan"]["step_time_s"] > 0
    assert "--tensor-model-parallel-size" in d["emit"]["text"]
    assert capsys.readouterr().out == ""  # the answer went to the file
    csv = tmp_path / "x.csv"
    assert main(["-o", str(csv), "check", str(path)]) == 0
    head, first = csv.read_text().splitlines()[:2]
    assert "execution.tp" in head.split(",") and first
    txt = tmp_path / "x.txt"
    assert main(["check", str(path), "--output", str(txt)]) == 0
    assert txt.read_text().startswith("paraplan check:")


def test_study_exits_two_when_a_point_failed(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(SMALL)
    s = tmp_path / "s.yaml"
    s.write_text("name: t\nbase: base.yaml\naxes:\n  num_gpus: [8, -1]\n")
    out = tmp_path / "t.json"
    assert main(["study", str(s), "-o", str(out), "--workers", "1"]) == 2  # a point is an invalid problem
    d = json.loads(out.read_text())
    assert d["counts"] == {"optimal": 1, "error": 1}
    assert [r["status"] for r in d["rows"]] == ["optimal", "error"]
    s.write_text("name: t\nbase: base.yaml\naxes:\n  num_gpus: [8, 16]\n")
    capsys.readouterr()
    assert main(["--json", "study", str(s), "-o", str(tmp_path / "ok.csv"), "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["counts"] == {"optimal": 2}


def test_cli_imports_only_the_api_errors_progress_and_schema():
    allowed = {"optimizer", "optimizer.api", "optimizer.errors", "optimizer.progress", "optimizer.schema"}
    tree = ast.parse((ROOT / "optimizer" / "cli.py").read_text())
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            used |= {base} | {f"{base}.{a.name}" for a in node.names if base == "optimizer"}
    ours = {m for m in used if m.split(".")[0] in ("optimizer", "formulations")}
    assert ours - allowed - {"optimizer.__version__"} == set(), ours


def test_emit_file_holds_the_config_alone(tmp_path, capsys):
    """`--emit torchtitan --emit-file job.toml` writes the torchtitan config and nothing else (the report
    still prints); the file equals --json's `.emit.text`; --emit-file without --emit is a usage error."""
    path = tmp_path / "p.yaml"
    path.write_text(SMALL + "stack: torchtitan\n")
    job = tmp_path / "job.toml"
    assert main(["solve", str(path), "--emit", "torchtitan", "--emit-file", str(job), "-q"]) == 0
    out, err = capsys.readouterr()
    assert f"wrote {job} (torchtitan)" in err and "paraplan solve" in out
    assert main(["solve", str(path), "--emit", "torchtitan", "--json", "-q"]) == 0
    assert job.read_text() == json.loads(capsys.readouterr().out)["emit"]["text"].rstrip("\n") + "\n"
    import tomllib

    assert "parallelism" in tomllib.loads(job.read_text())
    with pytest.raises(SystemExit) as e:
        main(["solve", str(path), "--emit-file", str(job)])
    assert e.value.code == 2
