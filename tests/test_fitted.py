"""The model's fitted constants are data (optimizer/model/fitted.yaml, loaded by optimizer/model/fitted.py),
and the calibration scripts write YAML through a ruamel.yaml round trip (scripts/grid_fit.py), never by
rewriting text."""

from __future__ import annotations

import difflib
import io
import shutil
from dataclasses import fields

import pytest
import yaml
from helpers import ROOT, load_script

from optimizer.model import fitted


def _changed(before: list[str], after: list[str]) -> list[str]:
    """The lines removed (`-line`) and added (`+line`) between two versions of a file."""
    return [line[0] + line[2:] for line in difflib.ndiff(before, after) if line[:1] in "+-"]


def test_the_loaded_constants_are_the_yaml_and_the_model_reads_them():
    """Every field of `FITTED` is its entry's value in fitted.yaml (and every entry a field, with its
    provenance); the model's module constants are those values."""
    from optimizer.model import hardware, layer, step
    from optimizer.schema import Precision

    doc = yaml.safe_load(fitted.PATH.read_text())
    assert set(doc) == {f.name for f in fields(fitted.Fitted)}
    for f in fields(fitted.Fitted):
        want = doc[f.name]["value"]
        got = getattr(fitted.FITTED, f.name)
        assert (list(got) if isinstance(got, tuple) else got) == want, f.name
        assert all(doc[f.name][k] for k in fitted.ENTRY_KEYS), f.name
    assert fitted.load() == fitted.FITTED
    assert layer.MOE_HOST_FW_S == fitted.FITTED.moe_host_fw_s
    assert step.ALLOCATOR_SLACK == fitted.FITTED.allocator_slack_ratio
    assert hardware.BLOCK_SCALED_KERNEL == {Precision.MXFP8: fitted.FITTED.mxfp8_kernel_ratio}
    assert layer.EAGER_EXPERT_MEASURED == {
        "clamp": fitted.FITTED.eager_expert_clamp_ratio,
        "bias": fitted.FITTED.eager_expert_bias_ratio,
    }


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d.pop("moe_host_fw_s"), "entries"),
        (lambda d: d["moe_host_fw_s"].pop("data"), "needs the keys"),
        (lambda d: d["moe_host_fw_s"].update(unit="ms"), "is in 's'"),
        (lambda d: d["eager_expert_bias_ratio"].update(value=[1.0]), "is not a tuple"),
        (lambda d: d["allocator_slack_ratio"].update(value="0.1"), "is not a float"),
    ],
)
def test_the_loader_refuses_a_file_it_cannot_type(tmp_path, edit, match):
    doc = yaml.safe_load(fitted.PATH.read_text())
    edit(doc)
    path = tmp_path / "fitted.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=match):
        fitted.load(path)


def test_the_yaml_writer_changes_only_the_value(tmp_path, capsys):
    """grid_fit.set_fitted rewrites one entry's value (and, given, its data files) and nothing else: the
    header comments, the folded descriptions and the order stay byte for byte; an unknown entry is refused."""
    gf = load_script("grid_fit")
    path = tmp_path / "fitted.yaml"
    shutil.copy(fitted.PATH, path)
    before = path.read_text()
    assert gf.set_fitted("allocator_slack_ratio", 0.115, path=path) == 0
    after = path.read_text()
    changed = _changed(before.splitlines(), after.splitlines())
    assert changed == ["-  value: 0.105", "+  value: 0.115"]
    assert fitted.load(path).allocator_slack_ratio == 0.115
    assert fitted.load(path).moe_host_fw_s == fitted.FITTED.moe_host_fw_s
    assert gf.set_fitted("moe_host_fw_s", 0.0055, "a.yaml b.yaml", path=path) == 0
    assert fitted.load(path).moe_host_fw_s == 0.0055
    assert yaml.safe_load(path.read_text())["moe_host_fw_s"]["data"] == "a.yaml b.yaml"
    assert sum(a != b for a, b in zip(before.splitlines(), path.read_text().splitlines(), strict=False)) == 3
    assert gf.set_fitted("no_such_constant", 1.0, path=path) == 2
    assert "no no_such_constant entry" in capsys.readouterr().err


def test_every_shipped_yaml_the_scripts_write_round_trips_unchanged():
    """The round trip the scripts write with (grid_fit.round_trip) gives fitted.yaml and every system file
    back byte for byte, so a write changes only what it sets."""
    rt = load_script("grid_fit").round_trip()
    for path in [fitted.PATH, *sorted((ROOT / "problems" / "systems").glob("*.yaml"))]:
        text = path.read_text()
        out = io.StringIO()
        rt.dump(rt.load(text), out)
        assert out.getvalue() == text, path.name


def test_no_script_rewrites_python_source():
    """Fitted values are written as YAML data: no script edits a .py file with a regular expression."""
    for path in (ROOT / "scripts").glob("*.py"):
        text = path.read_text()
        assert "re.subn(" not in text and "set_constant" not in text, path.name


def test_calibrate_write_changes_only_the_fitted_lines_and_the_calibration_block(tmp_path, monkeypatch):
    """scripts/calibrate.py --write on a system file (a round trip): a fit of the NVLink efficiency rewrites
    that value with its provenance comment and the `calibration:` block; every other line, comments included,
    stays."""
    from optimizer.io.loader import find_in_library, read_yaml, validate_model
    from optimizer.schema import System

    lib = tmp_path / "lib"
    shutil.copytree(find_in_library("system", "h100-sxm-80gb").parent, lib / "systems")
    monkeypatch.setenv("PARAPLAN_LIBRARY", str(lib))
    cal = load_script("calibrate")
    path = lib / "systems" / "h100-sxm-80gb.yaml"
    loo = "  loo_mape_pct: 5.27  # leave-one-out over 8 runs: scripts/calibrate.py --loo --write-loo"
    path.write_text(path.read_text() + loo + "\n")  # a measured figure the partial fit must keep
    before = path.read_text().splitlines()
    cut = before.index("calibration:")
    nvlink = next(line for line in before if line.strip().startswith("efficiency:"))  # tier 0's
    cal.write(path, {"net0_eff": 0.81234}, ["r1"], "runs.yaml", None, {})
    after = path.read_text().splitlines()
    changed = _changed(before[:cut], after[: after.index("calibration:")])
    note = "calibrated by scripts/calibrate.py on 1 runs (see calibration.runs)"
    assert changed == ["-" + nvlink, f"+    efficiency: 0.8123  # {note}"]
    c = validate_model(System, read_yaml(path)).calibration
    assert c.runs[-1] == "r1" and c.fitted[-1] == "networks[0].efficiency" and c.loo_mape_pct == 5.27
    assert loo in path.read_text()


def test_every_data_file_of_the_model_is_installed():
    """The model's data files (fitted constants, bands) ship in the wheel: pyproject's package-data for
    optimizer.model names each YAML file beside the modules, so an installed paraplan reads the same."""
    import tomllib

    from helpers import ROOT

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = set(data["optimizer.model"])
    assert {p.name for p in (ROOT / "optimizer" / "model").glob("*.yaml")} <= shipped
