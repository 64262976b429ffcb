"""Loading problem files: file:line:field errors, exit code 2 without traceback, references and overrides."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT, library_llm, library_system

from optimizer.cli import main
from optimizer.errors import ProblemError, ProblemErrors
from optimizer.io.loader import load_problem, parse_yaml


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    """Error messages show paths relative to the working directory when inside it: run from the repo root
    (tmp_path lies outside it, so paths of files written there are shown as given)."""
    monkeypatch.chdir(ROOT)


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return str(p)


def _errors(capsys, path: str) -> list[str]:
    """Run `paraplan evaluate PATH`; it must exit 2 and print one 'error: ...' line per problem."""
    rc = main(["evaluate", path])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("error: ") for line in lines)
    return [line[len("error: ") :] for line in lines]


VALID = """
    llm: llama3.1-8b
    system: h100-sxm-80gb
    num_gpus: 8
    training:
      global_batch: 8
    """


def test_unknown_key(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: h100-sxm-80gb
        num_gpus: 8
        training:
          global_batch: 8
          batch_sise: 4
        """,
    )
    # 'batch_sise' is on line 6
    assert _errors(capsys, path) == [f"{path}:6: training.batch_sise: unknown key 'batch_sise'"]


def test_unknown_top_level_key(tmp_path, capsys):
    path = _write(tmp_path, VALID.rstrip() + "\n    nmu_gpus: 3\n")
    errs = _errors(capsys, path)
    assert errs == [f"{path}:6: nmu_gpus: unknown key 'nmu_gpus'"]


def test_a_renamed_key_names_its_new_name(tmp_path, capsys):
    path = _write(tmp_path, VALID.rstrip() + "\n    execution: {ep_dispatcher: flex}\n")
    errs = _errors(capsys, path)
    assert errs == [
        f"{path}:6: execution.ep_dispatcher: unknown key 'ep_dispatcher' (renamed: write 'moe_dispatcher')"
    ]


def test_negative_hbm_override_points_at_the_problem_file(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: {base: h100-sxm-80gb, hbm_gib: -1}
        num_gpus: 8
        training:
          global_batch: 8
        """,
    )
    # the override is on line 2 of the problem file (not in the library's system file)
    assert _errors(capsys, path) == [f"{path}:2: system.hbm_gib: must be > 0"]


def test_negative_hbm_override_block_style(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system:
          base: h100-sxm-80gb
          hbm_gib: -1
        num_gpus: 8
        training:
          global_batch: 8
        """,
    )
    assert _errors(capsys, path) == [f"{path}:4: system.hbm_gib: must be > 0"]


def test_unknown_llm_name(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        num_gpus: 8
        llm: llama9-1t
        system: h100-sxm-80gb
        training:
          global_batch: 8
        """,
    )
    errs = _errors(capsys, path)
    assert len(errs) == 1
    assert errs[0].startswith(f"{path}:2: llm: unknown llm 'llama9-1t'")
    assert "llama3.1-8b" in errs[0]  # lists the known names


def test_yaml_syntax_error(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        num_gpus: 8
        system: h100: sxm
        """,
    )
    errs = _errors(capsys, path)
    assert len(errs) == 1
    assert errs[0].startswith(f"{path}:3: YAML syntax:")


def test_missing_file(tmp_path, capsys):
    path = str(tmp_path / "does-not-exist.yaml")
    assert _errors(capsys, path) == [f"{path}: no such file"]


def test_layers_not_divisible_by_pp(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: h100-sxm-80gb
        num_gpus: 6
        training:
          global_batch: 8
        execution:
          pp: 3
        """,
    )
    # 32 layers over pp*vpp = 3: execution.pp on line 7; dp = 6/3 = 2 divides the batch 8
    assert _errors(capsys, path) == [f"{path}:7: execution.pp: layers (32) not divisible by pp*vpp (3*1)"]


def test_global_batch_not_divisible_by_dp_micro_batch(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: h100-sxm-80gb
        num_gpus: 8
        training:
          global_batch: 12
        execution:
          micro_batch: 1
        """,
    )
    # dp = 8, 12 % (8*1) != 0; training.global_batch is on line 5
    assert _errors(capsys, path) == [
        f"{path}:5: training.global_batch: global batch 12 not divisible by dp*micro_batch = 8*1"
    ]


def test_heads_not_divisible_by_tp(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: h100-sxm-80gb
        num_gpus: 6
        training:
          global_batch: 6
        execution:
          pp: 1
          tp: 3
        """,
    )
    # 32 heads, tp = 3 (line 8); dp = 2. kv_heads 8 and ffn 14336 are not divisible by 3 either.
    errs = _errors(capsys, path)
    assert f"{path}:8: execution.tp: heads (32) not divisible by tp (3)" in errs
    assert all(e.startswith(f"{path}:8: execution.tp: ") for e in errs)


def test_duplicate_key_is_an_error(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: h100-sxm-80gb
        num_gpus: 8
        training:
          global_batch: 8
          global_batch: 16
        """,
    )
    # the second occurrence (line 6) is reported
    assert _errors(capsys, path) == [f"{path}:6: training.global_batch: duplicate key"]


def test_duplicate_key_in_parse_yaml():
    with pytest.raises(ProblemError) as ei:
        parse_yaml("a: 1\nb: 2\na: 3\n", "x.yaml")
    assert str(ei.value) == "x.yaml:3: a: duplicate key"


def test_load_problem_raises_problem_errors(tmp_path):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: {base: h100-sxm-80gb, hbm_gib: 0}
        num_gpus: 8
        training:
          global_batch: 8
        """,
    )
    with pytest.raises(ProblemErrors) as ei:
        load_problem(path)
    [e] = ei.value.errors
    assert (e.path, e.line, e.field, e.message) == (path, 2, "system.hbm_gib", "must be > 0")


def test_subprocess_exit_code_two_without_traceback(tmp_path):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system: {base: h100-sxm-80gb, hbm_gib: -1}
        num_gpus: 8
        training:
          global_batch: 8
        """,
    )
    exe = shutil.which("paraplan")
    cmd = [exe] if exe else [sys.executable, "-m", "optimizer.cli"]
    proc = subprocess.run(cmd + ["evaluate", path], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{path}:2: system.hbm_gib: must be > 0" in proc.stderr


# ------------------------------------------------------------------------------ valid problems
def test_valid_inline_problem_loads(tmp_path):
    path = _write(
        tmp_path,
        """
        name: inline
        llm:
          name: tiny
          hidden: 64
          ffn: 256
          layers: 4
          heads: 4
          seq_len: 128
          vocab: 1000
        system: a100-sxm-80gb
        num_gpus: 8
        training:
          global_batch: 16
        execution:
          tp: 2
          pp: 2
        """,
        name="ok.yaml",
    )
    p = load_problem(path)
    assert p.name == "inline"
    assert (p.llm.hidden, p.llm.ffn, p.llm.layers, p.llm.heads, p.llm.seq_len, p.llm.vocab) == (
        64,
        256,
        4,
        4,
        128,
        1000,
    )
    assert p.llm.kv == 4 and p.llm.dhead == 16  # defaults: kv_heads = heads, head_dim = hidden/heads
    assert p.system == library_system("a100-sxm-80gb")
    assert (p.num_gpus, p.training.global_batch, p.execution.tp, p.execution.pp) == (8, 16, 2, 2)
    assert p.execution.dp is None  # resolved later: 8 / (2*2) = 2


def test_library_references_resolve(tmp_path):
    p = load_problem(_write(tmp_path, VALID, name="ok.yaml"))
    assert p.llm == library_llm("llama3.1-8b")
    assert p.system == library_system("h100-sxm-80gb")


def test_system_base_overrides_apply(tmp_path):
    path = _write(
        tmp_path,
        """
        llm: llama3.1-8b
        system:
          base: a100-sxm-80gb
          hbm_gib: 40
          reserved_gib: 2.5
          name: a100-half
        num_gpus: 8
        training:
          global_batch: 8
        """,
        name="ok.yaml",
    )
    p = load_problem(path)
    base = library_system("a100-sxm-80gb")
    assert p.system.hbm_gib == 40
    assert p.system.reserved_gib == 2.5
    assert p.system.name == "a100-half"
    # everything not overridden comes from the base file
    assert p.system.networks == base.networks
    assert p.system.matrix_tflops == base.matrix_tflops
    assert p.system.model_dump(exclude={"hbm_gib", "reserved_gib", "name"}) == base.model_dump(
        exclude={"hbm_gib", "reserved_gib", "name"}
    )


def test_default_problem_loads():
    p = load_problem(ROOT / "problems" / "default.yaml")
    assert p.llm == library_llm(p.llm.name)
    assert p.system == library_system(p.system.name)


@pytest.mark.parametrize(
    "search, line, field, words",
    [
        ("search:\n  tpp: 4\n", 7, "search.tpp", "unknown key 'tpp'"),
        ("search:\n  vpp: {maxx: 4}\n", 7, "search.vpp.maxx", "unknown key 'maxx'"),
        (
            "search:\n  tp: '8'\n",
            7,
            "search.tp",
            "must be an integer; or must be a list; or must be a mapping",
        ),
        (
            "search:\n  recompute: [none, partial]\n",
            7,
            "search.recompute",
            "must be one of none, selective or full",
        ),
    ],
)
def test_search_errors_carry_file_line_field(tmp_path, capsys, search, line, field, words):
    """`search` is a typed schema: its errors name the file, the line and the field like every other field
    (they used to print `<problem>`), for solve as for evaluate."""
    path = _write(tmp_path, textwrap.dedent(VALID).lstrip("\n") + search)
    rc = main(["solve", path])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "<problem>" not in err
    assert f"error: {path}:{line}: {field}: {words}" in err.splitlines()


def test_typed_search_restricts_the_space(tmp_path):
    from optimizer.prepare.space import knob_domains

    p = load_problem(
        _write(
            tmp_path,
            textwrap.dedent(VALID).lstrip("\n")
            + "search:\n  tp: [2, 4]\n  vpp: {max: 2}\n  recompute: full\n"
            "  sequence_parallel: true\n",
            name="ok.yaml",
        )
    )
    dom = knob_domains(p)
    assert dom["tp"] == [2, 4] and max(dom["vpp"]) <= 2 and dom["sequence_parallel"] == [True]
    assert [r.value for r in dom["recompute"]] == ["full"]
