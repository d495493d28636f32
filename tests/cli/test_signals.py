"""A first Ctrl-C or SIGTERM ends any command within about a second (exit 130 or 143, one line), whatever
it is doing: profiling, planning, loading; a training step in flight finishes first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _start(tmp_path, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, VMEM_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), VMEM_THREADS="1")
    cmd = [sys.executable, "-m", "vmem", *argv]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(stream, text: str, limit: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + limit
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came: {lines}")


@pytest.mark.parametrize(
    "signum, code, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_during_the_profile_ends_the_run_within_two_seconds(tmp_path, signum, code, word):
    """vgg_cifar at batch 512: its profile (every pass and algorithm of 22 layers) takes well over 20 s
    here (about 2 minutes on 2 cores); the signal comes 1 s into it. Nothing was trained, so nothing is
    saved and no file is written."""
    save = tmp_path / "ckpt.npz"
    argv = ("train", "--model", "vgg_cifar", "--dataset", "synthetic", "--batch", "512", "--save", str(save))
    proc = _start(tmp_path, *argv)
    try:
        _wait_for(proc.stderr, "profiling 22 layers")
        time.sleep(1.0)
        proc.send_signal(signum)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == code and took < 2.0, (took, err)
    assert err.strip().splitlines() == [
        f"vmem train: {word}{' (SIGTERM)' if code == 143 else ''} before anything was trained; nothing saved"
    ], err
    assert not save.exists() and not list((tmp_path / "cache").rglob("*.json"))  # no profile half-kept


def test_sigterm_ends_a_plan_at_once(tmp_path):
    """`vmem plan` of the NMT model under auto (planning takes tens of seconds): SIGTERM once it says it is
    planning ends it with 143 and one line, not Python's default death without a line."""
    argv = ("plan", "--model", "nmt", "--batch", "128", "--device", "sim:v100-16gb", "--memory", "auto:0.4")
    proc = _start(tmp_path, *argv, "--policy", "auto")
    try:
        _wait_for(proc.stderr, "planning nmt")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 143 and took < 2.0, (took, err)
    assert err.strip().splitlines() == ["vmem plan: terminated (SIGTERM)"], err
