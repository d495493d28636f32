"""The same command with the same seed gives the same weights, and the same checkpoint bytes: profiles are
kept on disk (keyed by program, device and machine) and reused, so a profile-driven policy chooses the same
algorithms every time (the first complete profile kept wins where two runs measured at once); the checkpoint
records the plan the run used."""

from __future__ import annotations

import json

import numpy as np

import vmem
from vmem.costs import cache


def _arrays(path):
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def test_a_kept_profile_is_reused_and_can_be_turned_off(monkeypatch):
    net = vmem.models.get("digits_cnn")
    program = net.build(8)
    with vmem.device("cpu", memory="16MiB") as dev:
        first, kept = cache.profile(dev.catalog(program), device=dev, copy_gbps=4.0)
        again, kept_again = cache.profile(dev.catalog(program), device=dev, copy_gbps=4.0)
        assert not kept and kept_again and again.times == first.times and again.copies == first.copies
        with vmem.device("cpu", memory="32MiB") as bigger:  # another device: another profile
            _, kept_bigger = cache.profile(bigger.catalog(program), device=bigger, copy_gbps=4.0)
        assert not kept_bigger
        monkeypatch.setenv("VMEM_PROFILE_CACHE", "0")
        _, kept_off = cache.profile(dev.catalog(program), device=dev, copy_gbps=4.0)
        assert not kept_off


def test_concurrent_first_runs_and_later_ones_write_one_checkpoint(tmp_path):
    """Two first runs started together (both profile: the first complete profile kept wins, the other
    uses it) and a later run: three checkpoints with one sha256, as a user checking reproducibility with a
    hash would see them."""
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, VMEM_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(root), VMEM_THREADS="1")
    env.pop("VMEM_PROFILE_CACHE", None)

    def start(i: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "vmem", "train", "--model", "digits_cnn", "--epochs", "1"]
        cmd += ["--save", str(tmp_path / f"run{i}.npz"), "--json"]
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    firsts = [start(0), start(1)]  # both find no profile kept: both measure
    outputs = [p.communicate(timeout=300) for p in firsts]
    later = start(2)  # started once a profile is kept: it uses it
    outputs.append(later.communicate(timeout=300))
    kept = [json.loads(out)["profile_kept"] for out, _ in outputs]
    assert kept[2] is True, outputs
    digests = {hashlib.sha256((tmp_path / f"run{i}.npz").read_bytes()).hexdigest() for i in range(3)}
    assert len(digests) == 1, [err for _, err in outputs]
    with np.load(tmp_path / "run0.npz", allow_pickle=False) as f:  # the checkpoint records the plan used
        plan = json.loads(str(f["meta"]))["plans"]["32"]
    assert plan["policy"].startswith("auto") and plan["algos"] and "reason" not in plan
