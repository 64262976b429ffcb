import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import CALIBRATION  # noqa: E402


@pytest.fixture(scope="session")
def calibration_file() -> Path:
    """The shared calibration runs file; tests that need it skip when it is absent."""
    if not CALIBRATION.is_file():
        pytest.skip(f"calibration data not present at {CALIBRATION}")
    return CALIBRATION
