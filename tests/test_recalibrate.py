"""One command refits every system file and model-wide constant; the shipped files are its fixed point."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from helpers import ROOT, load_script

from optimizer.model.fitted import FITTED

SHARED_RUNS = ROOT.parent / "shared" / "calibration"


def test_clock_power_exponent_is_the_fit_of_the_shipped_capped_parts():
    """fitted.yaml's exponent is scripts/fit_clock_power.py's least-squares fit over the system files that
    fit a clock_scale below their rated power (H100 96GB at 500 W, HGX B200 and B300), and each of them is
    predicted within 12% by the exponent of the others (measured: B200 +2.8%, B300 -10.7%, H100 96GB
    +10.8%; a rough prior, replaced by the fit wherever a part has runs)."""
    fcp = load_script("fit_clock_power")
    parts = fcp.capped_parts()
    assert {p[0] for p in parts} == {"h100-sxm-96gb", "b200-sxm-180gb", "b300-sxm-270gb"}
    assert FITTED.clock_power_exponent == round(fcp.exponent(parts), 2)
    for i, (_, x, y) in enumerate(parts):
        k = fcp.exponent(parts[:i] + parts[i + 1 :])
        assert abs(math.exp(k * x) / math.exp(y) - 1) < 0.12
    assert fcp.exponent([("a", math.log(0.5), 0.5 * math.log(0.5))]) == pytest.approx(0.5)


@pytest.mark.slow  # one full round of the calibration sequence on a copy: about 80 s
@pytest.mark.skipif(not SHARED_RUNS.is_dir(), reason="needs ../shared/calibration")
def test_the_shipped_files_are_a_fixed_point_of_the_calibration():
    """`scripts/recalibrate.py --check` recalibrates a copy of the project (the sequence, then the constants,
    rounds until nothing moves) and finds no system file or constant that would change."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "recalibrate.py"), "--check", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "fixed point" in out.stdout
