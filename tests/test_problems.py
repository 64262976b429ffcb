"""Every shipped file under problems/ loads through the loader of its kind without an error: library llms and
systems (their schemas), catalogs (through a procurement problem that names the file), problems (`api.load`),
check problems (`load_problem_doc`: the knobs they write need not obey the execution rules; saying why not is
`check`'s job), procurement problems (`load_procure`), fleets (`load_fleet`), studies (`load_study`, and the
problems of 32 of its points, first and last included),
runs (`load_runs`), Hugging Face configs (as a problem's `llm:`). The single problems are also checked
(`api.check`, which proves the fixed knobs fit or finds why not), and the solve problems that write an
execution evaluated (`api.evaluate`); their solved optima are tests/golden's (test_golden.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import api
from optimizer.drivers.study import load_study, point_problem, points
from optimizer.io.loader import (
    load_fleet,
    load_multisite,
    load_problem_doc,
    load_procure,
    read_yaml,
    validate_model,
)
from optimizer.io.runs import load_facts, load_runs
from optimizer.schema import LLM, System

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "problems"
SINGLE = [
    PROBLEMS / "default.yaml",
    *sorted((PROBLEMS / "studies" / "check").glob("*.yaml")),
    *sorted((PROBLEMS / "studies" / "solve").glob("*.yaml")),
]
KINDS = {  # folder under problems/ (or a file): the kind of every YAML in it
    "llms": "llm",
    "systems": "system",
    "catalogs": "catalog",
    "runs": "runs",
    "runs/facts": "run-facts",
    "fleet": "fleet",
    "studies/calculon": "study",
    "studies/check": "check",
    "studies/solve": "problem",
    "studies/procure": "procure",
    "studies/goodput": "problem",
    "studies/multisite": "sites",
    "default.yaml": "problem",
}


def kind_of(path: Path) -> str:
    rel = path.relative_to(PROBLEMS).as_posix()
    for prefix, kind in sorted(KINDS.items(), key=lambda kv: -len(kv[0])):
        if rel == prefix or rel.startswith(prefix + "/"):
            return kind
    raise AssertionError(f"problems/{rel}: no loader known for this folder (add it to KINDS)")


YAMLS = sorted(PROBLEMS.rglob("*.yaml"))


def _id(p: Path) -> str:
    return p.relative_to(PROBLEMS).as_posix()


def test_every_yaml_has_a_kind():
    assert YAMLS and all(kind_of(p) for p in YAMLS)


@pytest.mark.parametrize("path", YAMLS, ids=_id)
def test_loads(path, tmp_path):
    kind = kind_of(path)
    if kind in ("llm", "system"):
        obj = validate_model(LLM if kind == "llm" else System, read_yaml(path))
        assert obj.name
    elif kind == "catalog":
        p = tmp_path / "procure.yaml"
        p.write_text(
            f"llm: llama3.1-8b\ncatalog: {path}\ntraining: {{global_batch: 64}}\n"
            "procure: {budget_usd: 1.0e+6}\n"
        )
        assert load_procure(p).catalog.node_types
    elif kind == "problem":
        assert api.load(path).num_gpus >= 1
    elif kind == "check":
        problem, written = load_problem_doc(path)
        assert problem.num_gpus >= 1 and (written is None or isinstance(written, dict))
    elif kind == "procure":
        assert load_procure(path).catalog.node_types
    elif kind == "sites":
        assert load_multisite(path).sites
    elif kind == "fleet":
        assert load_fleet(path)
    elif kind == "study":
        study, base, near = load_study(path)
        pts = points(study)
        sample = pts[:: -(-len(pts) // 32)] + pts[-1:]
        assert pts and all(point_problem(base, near, axes).num_gpus >= 1 for axes in sample)
    elif kind == "runs":
        assert load_runs(str(path)).data
    elif kind == "run-facts":
        assert load_facts(path)[1]


@pytest.mark.parametrize("config", sorted(PROBLEMS.glob("hf/*/config.json")), ids=lambda p: p.parent.name)
def test_hf_config_loads(config, tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text(f"llm: {config}\nsystem: h100-sxm-80gb\nnum_gpus: 8\ntraining: {{global_batch: 8}}\n")
    assert api.load(p).llm.layers >= 1


@pytest.mark.parametrize("path", SINGLE, ids=_id)
def test_single_problem_checks(path):
    r = api.check(path)
    assert isinstance(r.fits, bool)
    if not r.fits:
        assert r.conflicts or r.relaxations


@pytest.mark.parametrize(
    "path", [p for p in SINGLE if kind_of(p) == "problem" and "execution" in read_yaml(p).data], ids=_id
)
def test_written_execution_evaluates(path):
    ev = api.evaluate(api.load(path))
    assert ev.result is not None
