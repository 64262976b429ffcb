"""The README's Python API example runs as written, and its functions agree with the CLI's answers."""

from __future__ import annotations

import contextlib
import io
import re

from helpers import ROOT


def readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(readme_example(), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("optimal ")
    assert "[parallelism]" in out.getvalue()
    assert lines[-1].startswith("False [")


def test_api_agrees_with_the_cli(monkeypatch, capsys):
    import json

    from optimizer import api
    from optimizer.cli import main

    monkeypatch.chdir(ROOT)
    r = api.solve(api.load("problems/default.yaml"))
    assert main(["solve", "problems/default.yaml", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["plans"][0]["objective_step_time_s"] == r.plans[0].objective_s
    assert api.rows(r)[0]["execution.tp"] == r.plans[0].evaluation.execution.tp
