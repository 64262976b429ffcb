"""scripts/calibrate.py --transfer: copies only what the source fitted, labels what it copied, and writes the
target's calibration block (it used to copy H100's prior HBM table labelled as fitted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from optimizer.loader import read_yaml, validate_model
from optimizer.schema import System

ROOT = Path(__file__).resolve().parents[1]


def test_transfer_copies_only_fitted_tables(tmp_path):
    lib = tmp_path / "systems"
    lib.mkdir()
    src = (ROOT / "problems/systems/h100-sxm-80gb.yaml").read_text()
    lib.joinpath("h100-sxm-80gb.yaml").write_text(src)
    # a target whose HBM line claims a transfer of a table the source holds as a prior (the old bug)
    tgt = (ROOT / "problems/systems/h200-sxm-141gb.yaml").read_text()
    tgt = tgt.replace("# prior, not calibrated (to be calibrated)\nmatrix_tflops",
                      "# transferred from h100-sxm-80gb (same GPU die)\nmatrix_tflops", 1)
    lib.joinpath("h200-sxm-141gb.yaml").write_text(tgt)
    env = dict(os.environ, PARAPLAN_LIBRARY=str(tmp_path))
    out = subprocess.run([sys.executable, str(ROOT / "scripts/calibrate.py"), "unused.yaml", "--gpu", "h100-sxm-80gb",
                          "--transfer", "h200-sxm-141gb"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    src_sys = validate_model(System, read_yaml(lib / "h100-sxm-80gb.yaml"))
    assert "hbm_efficiency" not in src_sys.calibration.fitted  # the source's HBM table is a prior
    text = (lib / "h200-sxm-141gb.yaml").read_text()
    hbm_line = next(line for line in text.splitlines() if line.startswith("hbm_efficiency:"))
    assert "transferred" not in hbm_line and "prior" in hbm_line
    got = validate_model(System, read_yaml(lib / "h200-sxm-141gb.yaml"))
    assert got.calibration.transferred_from == "h100-sxm-80gb"
    assert got.calibration.transferred == [k for k in ("matrix_efficiency", "matrix_efficiency_scale", "hbm_efficiency")
                                           if k in src_sys.calibration.fitted]
    assert got.calibration.runs == [] and got.calibration.fitted == []
    assert got.matrix_efficiency == src_sys.matrix_efficiency  # the fitted table itself is copied
    assert got.hbm_bandwidth_gbps == 4800  # datasheet values stay the target's
