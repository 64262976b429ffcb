"""The tree's own hygiene, run with the suite: ruff's rules (`[tool.ruff.lint]` in pyproject.toml:
pycodestyle, pyflakes, isort, bugbear, pyupgrade) hold on every Python file, the code is as `ruff format`
writes it, and the documentation site builds with `mkdocs build --strict` (no broken link, every page in the
nav)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: pip install '.[test]'")
    return [exe]


def test_ruff_lint_is_clean():
    r = subprocess.run([*_ruff(), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_ruff_format_is_applied():
    r = subprocess.run(
        [*_ruff(), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]


def test_docs_build_strict(tmp_path):
    """mkdocs comes with the test extra (through the docs extra); the material theme's notice about MkDocs 2
    is turned off, it is not a warning of the build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
