"""ruff's lint (pyflakes and pycodestyle's errors, as pyproject.toml selects) and its format check pass over
the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_lint_passes():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]' installs it)")
    done = subprocess.run(
        [ruff, "check", "--output-format", "concise", "vmem", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_leaves_the_tree_as_it_is():
    """The tree is formatted as ``ruff format`` would (pyproject.toml pins ruff's minor version)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (pip install -e '.[dev]' installs it)")
    done = subprocess.run(
        [ruff, "format", "--check", "vmem", "tests", "bench"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
