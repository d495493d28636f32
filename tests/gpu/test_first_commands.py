"""What a user runs first, on cuda:0: ``vmem train`` with its defaults (digits_vgg under vdnn-dyn in half the
baseline's memory, profiled on the GPU within that budget) and with a named policy, ``vmem plan --profile``,
``Trainer.fit``/``evaluate``/``save``/``load`` in the default arena, and the package installed from a wheel."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import vmem
from vmem.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _cli(capsys, *argv: str) -> dict:
    code = main([*argv, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err + out.out
    return json.loads(out.out)


def test_train_with_its_defaults_on_cuda(capsys):
    result = _cli(capsys, "train", "--device", "cuda:0", "--epochs", "2")
    assert result["device"] == "cuda:0" and result["policy"] == "auto"  # the default wherever a budget is given
    assert result["memory"] < result["baseline_peak_bytes"]  # half of what baseline needs with cuDNN's algorithms
    assert 0 < result["peak_bytes"] <= result["memory"]
    assert result["val_accuracy"] > 0.5 and result["chosen"]


def test_train_a_named_policy_on_cuda(capsys):
    result = _cli(
        capsys,
        "train",
        "--device",
        "cuda:0",
        "--model",
        "vgg_cifar",
        "--policy",
        "vdnn-all",
        "--dataset",
        "synthetic",
        "--epochs",
        "1",
        "--memory",
        "256MiB",
        "--lr",
        "0.001",
    )
    assert result["offloaded_bytes"] > 0 and result["peak_bytes"] <= 256 << 20


def test_plan_profiles_on_cuda_within_the_budget(capsys):
    result = _cli(
        capsys,
        "plan",
        "--device",
        "cuda:0",
        "--model",
        "vgg_cifar",
        "--batch",
        "32",
        "--memory",
        "auto:0.5",
        "--policy",
        "vdnn-dyn",
        "--profile",
    )
    assert result["fits"] and result["peak_bytes"] <= result["memory"] and result["step_seconds"] > 0


def test_plan_on_cuda_without_a_profile_takes_no_gpu_memory_to_speak_of(capsys):
    import cupy

    free_before = cupy.cuda.runtime.memGetInfo()[0]
    result = _cli(capsys, "plan", "--device", "cuda:0", "--model", "vgg16", "--batch", "64")
    assert result["peak_bytes"] > 1 << 30
    assert cupy.cuda.runtime.memGetInfo()[0] > free_before - (1 << 30)  # cuDNN's own libraries aside: no arena


def test_fit_evaluate_save_load_in_the_default_arena(tmp_path):
    train, val = vmem.data.digits(image_size=16, channels=1)
    net = vmem.models.get("digits_cnn", image_size=16)
    path = tmp_path / "ckpt.npz"
    with vmem.Trainer(net, device="cuda:0", policy="vdnn-all", seed=0) as first:
        assert first.device.pool.capacity > 1 << 30  # the default: the GPU's free memory less the reserve
        history = first.fit(train, epochs=2, val=val, batch_size=32, progress=False)
        assert history.last.val_accuracy > 0.5
        before = first.evaluate(val, batch_size=64)
        first.save(path)
        weights = {k: v.copy() for k, v in net.params.items()}
    del first
    gc.collect()  # the first arena (nearly the whole GPU) goes back before the second is taken
    other = vmem.models.get("digits_cnn", image_size=16)
    with vmem.Trainer(other, device="cuda:0", policy="baseline", seed=1) as second:
        second.load(path)
        assert all(np.array_equal(weights[k], other.params[k]) for k in weights)
        after = second.evaluate(val, batch_size=64)
    assert abs(after["accuracy"] - before["accuracy"]) < 1e-6


def test_the_installed_wheel_runs_on_the_gpu(tmp_path):
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
        cwd=tmp_path,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            *map(str, wheel_dir.glob("vmem-*.whl")),
        ],
        check=True,
        cwd=tmp_path,
    )
    paths = [str(site)] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT
    ]  # the carried wheels, not the checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    code = (
        f"import vmem, numpy as np; assert vmem.__file__.startswith({str(site)!r}), vmem.__file__; "
        "net = vmem.models.get('vgg_cifar', image_size=16); "
        "t = vmem.Trainer(net, device='cuda:0', memory='256MiB', policy='vdnn-all:codec=zvc'); "
        "x = np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32); "
        "r = t.step(x, np.arange(8) % 10); t.close(); print(r.loss)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert np.isfinite(float(done.stdout.split()[-1]))
    check = subprocess.run(
        [sys.executable, "-m", "vmem.selfcheck", "--require-native"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
