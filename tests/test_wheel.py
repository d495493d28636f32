"""The wheel holds everything the installed package reads at run time: built from this checkout, installed
into a fresh environment, and checked (``vmem check``) from a folder outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, (
        f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)], cwd=out)
    (found,) = out.glob("vmem-*.whl")
    return found


def test_the_wheel_ships_the_files_read_at_run_time(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("cudnn.h", "kernels.cuh"):
        assert f"vmem/csrc/{name}" in names
    assert any(n.startswith("vmem/_native") for n in names), "the CPU kernels are not built into the wheel"


def test_the_installed_wheel_passes_its_check_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], cwd=tmp_path)
    python = env_dir / "bin" / "python"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    # the dependencies (numpy, cffi, threadpoolctl) from this environment: a path line, so that this
    # environment's own .pth files (the checkout's editable install among them) are not read
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip()
    )
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    report = json.loads(
        _run([str(python), "-m", "vmem.selfcheck", "--require-native", "--json"], cwd=tmp_path, env=env)
    )
    assert report["ok"], report
    checks = {c["name"]: c for c in report["checks"]}
    assert str(site) in checks["imports"]["detail"], "vmem was imported from the checkout, not the wheel"
    assert checks["package files"]["status"] == "ok"
    assert checks["cudnn declarations"]["status"] == "ok"
    # a user's first command, from the installed package
    out = _run(
        [str(env_dir / "bin" / "vmem"), "plan", "--model", "digits_cnn", "--batch", "8", "--json"],
        cwd=tmp_path,
        env=env,
    )
    assert json.loads(out)["fits"] is True
