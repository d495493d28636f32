"""The vmem command: defaults, JSON output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from vmem import cli
from vmem.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_train_with_its_defaults_reaches_95_percent_in_half_the_baselines_memory(capsys):
    code, out, _ = run(capsys, "train", "--json")
    assert code == 0
    result = json.loads(out)
    for key in (
        "model",
        "dataset",
        "policy",
        "epochs",
        "train_loss",
        "val_accuracy",
        "step_seconds",
        "peak_bytes",
        "average_bytes",
        "offloaded_bytes",
        "baseline_peak_bytes",
        "memory",
        "chosen",
    ):
        assert key in result
    assert result["model"] == "digits_vgg" and result["dataset"] == "digits" and result["policy"] == "auto"
    assert result["val_accuracy"] >= 0.95
    needs = result["baseline_peak_bytes"]
    assert (
        result["memory"] >= needs * cli.options.AUTO_FRACTION
        and result["memory"] - needs * cli.options.AUTO_FRACTION < 1024
    )
    assert 0 < result["average_bytes"] <= result["peak_bytes"] <= 0.6 * needs
    assert result["chosen"] and result["reason"].startswith("auto: ")


def test_train_says_what_the_budget_saves_and_what_auto_chose(capsys):
    code, out, _ = run(capsys, "train", "--epochs", "1", "--memory", "auto:0.6")
    assert code == 0
    assert "60% of the" in out and "the baseline policy needs (--memory auto:0.6)" in out
    lines = [line for line in out.splitlines() if not line.startswith("profile: ")]  # then what the profile says
    assert "x the" in lines[-3 if "offloaded" in out else -2] and lines[-1].startswith("auto: ")
    assert " buffers" in lines[-1] and "starting plans fit" in lines[-1]


def test_a_warning_while_a_command_runs_is_one_line_of_its_own():
    """Planned for data far sparser than they are, gist's encodings wait in host memory: the trainer warns,
    and the command prints it as one line of its own, not as a source location."""
    argv = ["train", "--epochs", "1", "--model", "digits_cnn", "--policy", "gist:density=0.01", "--json"]
    done = subprocess.run([sys.executable, "-m", "vmem", *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("vmem train: warning: digits_cnn: step 1: the encoding of "), done.stderr
    assert len(done.stderr.splitlines()) == 1 and ".py:" not in done.stderr
    before = warnings.formatwarning
    with cli.progress.warnings_as_lines("plan"):
        assert warnings.formatwarning("x", RuntimeWarning, "f.py", 1) == "vmem plan: warning: x\n"
    assert warnings.formatwarning is before  # put back after the command


def test_a_named_policy_keeps_the_fixed_default_memory(capsys):
    code, out, _ = run(capsys, "train", "--epochs", "1", "--model", "digits_cnn", "--policy", "baseline", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["memory"] is None and result["baseline_peak_bytes"] is None


def test_train_prints_loss_accuracy_step_time_and_peak_memory(capsys):
    code, out, _ = run(
        capsys,
        "train",
        "--epochs",
        "1",
        "--dataset",
        "synthetic",
        "--model",
        "mini_googlenet",
        "--batch",
        "16",
        "--memory",
        "64MiB",
    )
    assert code == 0
    summary = next(line for line in out.splitlines() if line.startswith("done in"))
    for word in ("val accuracy", "train loss", "step time", "peak device memory"):
        assert word in summary


def test_in_a_tight_budget_train_profiles_and_trains_inside_it(capsys):
    code, out, err = run(capsys, "train", "--epochs", "1", "--memory", "auto:0.3", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["memory"] < 0.31 * result["baseline_peak_bytes"]
    assert 0 < result["peak_bytes"] <= result["memory"] and result["val_accuracy"] > 0.3


def test_in_a_tight_budget_plan_profiles_on_the_device_within_it(capsys):
    code, out, err = run(
        capsys,
        "plan",
        "--model",
        "digits_vgg",
        "--batch",
        "32",
        "--memory",
        "auto:0.3",
        "--policy",
        "vdnn-dyn",
        "--profile",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["fits"] and result["peak_bytes"] <= result["memory"] < 0.31 * result["baseline_peak_bytes"]
    assert result["step_seconds"] > 0  # measured times
    # profiled on the device: its 2 x 16 MiB element-wise probe was sized to the 1.66 MiB budget
    assert any(note.startswith("element-wise bandwidth: measured on") for note in result["profile_notes"])


def test_plan_with_a_budget_uses_auto_where_it_can_price_plans(capsys):
    sim = ["plan", "--model", "resnet_cifar", "--depth", "8", "--batch", "64", "--device", "sim:v100-16gb"]
    code, out, _ = run(capsys, *sim, "--memory", "auto:0.7", "--json")
    assert code == 0 and json.loads(out)["policy"] == "auto"
    code, out, _ = run(capsys, *sim, "--json")  # no budget: the baseline
    assert json.loads(out)["policy"].startswith("baseline")
    cpu = ["plan", "--model", "digits_cnn", "--batch", "8", "--memory", "auto:0.8"]
    code, out, _ = run(capsys, *cpu, "--json")  # on the CPU, auto would profile first: only when asked
    assert json.loads(out)["policy"].startswith("baseline")
    code, out, err = run(capsys, *cpu, "--policy", "auto")  # asked by name: it profiles, and says so
    assert "auto decides by measured time: profiling first" in err and "auto: " in out


def test_plan_json(capsys):
    code, out, _ = run(capsys, "plan", "--model", "vgg16", "--batch", "256", "--memory", "12GB", "--json")
    assert code == 1  # the plan does not fit: a failure, with its figures printed
    result = json.loads(out)
    for key in (
        "model",
        "batch",
        "device",
        "policy",
        "peak_bytes",
        "average_bytes",
        "offloaded_bytes",
        "step_seconds",
        "baseline_step_seconds",
        "by_category",
        "layers",
    ):
        assert key in result
    assert result["model"] == "vgg16" and result["batch"] == 256
    assert result["fits"] is False and result["peak_bytes"] > 12e9  # vDNN: VGG-16 at 256 needs about 28 GB
    assert len(result["layers"]) == 37


def test_a_slow_plan_says_what_it_is_doing_and_how_long_it_took(capsys, monkeypatch):
    import threading

    from vmem import cli

    monkeypatch.setattr(cli.progress, "SLOW_AFTER", 0.0)
    code, out, err = run(
        capsys, "plan", "--model", "vgg16", "--batch", "64", "--device", "sim:titan-x", "--policy", "vdnn-dyn"
    )
    assert code == 0 and "fits: yes" in out
    assert "planning vgg16 at batch 64 under vdnn-dyn on sim:titan-x..." in err and "done in" in err
    assert not [t for t in threading.enumerate() if t.name == "vmem-cli-progress"]
    code, out, err = run(capsys, "plan", "--model", "vgg16", "--batch", "64", "--device", "sim:titan-x", "--json")
    assert code == 0 and err == ""  # --json: stdout is the JSON and stderr stays quiet


def test_models_json(capsys):
    code, out, _ = run(capsys, "models", "--json")
    names = [m["name"] for m in json.loads(out)]
    assert "vgg16" in names and "resnet_cifar" in names and code == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--policy", "nope"], "unknown policy 'nope'"),
        (["train", "--memory", "lots"], "memory='lots'"),
        (["train", "--memory", "auto:2"], "auto takes a fraction"),
        (["train", "--memory", "auto:half"], "auto takes a fraction"),
        (["train", "--model", "vgg17"], "unknown model 'vgg17'"),
        (["train", "--policy", "baseline", "--memory", "1MiB"], "Out of device memory"),
        (["train", "--memory", "128KiB"], "needs at least 922.00 KiB (944128 bytes)"),
        (["plan", "--model", "vgg_cifar", "--batch", "8", "--memory", "auto:0"], "auto takes a fraction"),
        (["train", "--model", "nmt_small", "--dataset", "digits"], "--model nmt_small takes token sequences"),
        (["train", "--model", "digits_vgg", "--dataset", "reverse"], "use --dataset digits or synthetic"),
        (["bench", "bandwidth", "--codec", "zvc", "--density", "abc"], "--density 'abc': comma-separated fractions"),
        (["trace", "--out", "README.md"], "--out README.md: is a file"),
        (["train", "--policy", "vdnn-all:algos=memory", "--algos", "performance"], "disagree; give one"),
        (["plan", "--model", "vgg16", "--batch", "1000000000000"], "a batch this large cannot be planned"),
        (["train", "--policy", "baseline:algo=fast"], "has no option 'algo'"),
    ],
)
def test_bad_input_is_one_clear_line(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "command, option, value",
    [
        ("train", "--lr", "inf"),
        ("train", "--lr", "nan"),
        ("train", "--weight-decay", "inf"),
        ("train", "--momentum", "-inf"),
        ("train", "--seed", "-1"),
        ("trace", "--pcie-gbps", "0"),
        ("bench", "--pcie-gbps", "-2"),
    ],
)
def test_numbers_that_cannot_be_right_are_refused_by_the_parser(capsys, command, option, value):
    with pytest.raises(SystemExit) as info:
        main([command] + (["bandwidth"] if command == "bench" else []) + [f"{option}={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and option in err and any(w in err for w in ("finite", "at least", "more than"))


def test_help_for_every_command():
    for cmd in ([], ["train"], ["plan"], ["models"], ["devices"]):
        out = subprocess.run([sys.executable, "-m", "vmem", *cmd, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "usage: vmem" in out.stdout


def test_trace_writes_a_valid_chrome_trace_a_plot_and_a_table(capsys, tmp_path):
    code, out, _ = run(
        capsys,
        "trace",
        "--model",
        "mini_googlenet",
        "--image-size",
        "16",
        "--policy",
        "vdnn-all",
        "--batch",
        "8",
        "--steps",
        "2",
        "--memory",
        "64MiB",
        "--out",
        str(tmp_path),
        "--json",
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["offloaded_bytes"] > 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {1, 2}
    assert (tmp_path / "memory.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "layers.txt").read_text()
    assert "offload" in table and "fwd ms" in table


def test_bench_bandwidth_json(capsys):
    code, out, _ = run(
        capsys, "bench", "bandwidth", "--sizes", "64KiB,1MiB", "--rounds", "1", "--memory", "16MiB", "--json"
    )
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["bytes"] for r in rows] == [65536, 1 << 20]
    for r in rows:
        for key in ("d2h_pinned_gbps", "h2d_pinned_gbps", "d2h_pageable_gbps", "h2d_pageable_gbps"):
            assert r[key] > 0


def test_train_prints_the_offload_summary(capsys):
    code, out, _ = run(capsys, "train", "--epochs", "1", "--policy", "vdnn-all:sync=event")
    assert code == 0 and "offloaded" in out and "waited" in out


def test_devices_says_why_no_cuda_gpu_is_listed(capsys, monkeypatch):
    from vmem.device.cuda import nvml

    monkeypatch.setattr(nvml, "_load", lambda: (None, "NVML finds no NVIDIA driver or GPU (test)"))
    code, out, _ = run(capsys, "devices")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("cpu") and lines[1] == "cuda: none here: NVML finds no NVIDIA driver or GPU (test)"
    assert any(line.startswith("sim:h100-sxm") for line in lines)


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--model", "vgg_cifar", "--batch", "8", "--device", "cuda:0"],
        ["plan", "--model", "vgg_cifar", "--batch", "8", "--device", "cuda:0", "--profile"],
        ["plan", "--model", "vgg_cifar", "--batch", "8", "--device", "cuda:0", "--memory", "auto:0.5"],
        ["train", "--device", "cuda:0"],
    ],
)
def test_cuda_without_cupy_is_one_line_naming_the_extra(capsys, monkeypatch, argv):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    code, _, err = run(capsys, *argv)
    assert code == 1 and "Traceback" not in err
    assert err.count("\n") == 1 and "cuda:0" in err and "CuPy is not installed" in err and "vmem[cuda]" in err


def test_check_passes_in_this_checkout(capsys):
    code, out, _ = run(capsys, "check", "--no-compile", "--json")
    report = json.loads(out)
    assert code == 0 and report["ok"], report
    assert {c["name"] for c in report["checks"]} == {
        "imports",
        "package files",
        "cudnn declarations",
        "native CPU kernels",
    }


def test_an_onnx_model_plans_and_trains_from_the_command_line(capsys, tmp_path):
    pytest.importorskip("onnx")
    import vmem
    from vmem import nn

    path = tmp_path / "small.onnx"
    net = vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(8), nn.Flatten(), nn.Linear(8 * 2 * 2, 10),
        input_shape=(3, 16, 16), name="small",
    ).init(seed=0)  # fmt: skip
    vmem.onnx.save(net, path)
    code, out, _ = run(capsys, "plan", "--onnx", str(path), "--batch", "8", "--json")
    assert code == 0 and json.loads(out)["model"] == "small" and len(json.loads(out)["layers"]) == 5
    code, out, err = run(
        capsys,
        "train",
        "--onnx",
        str(path),
        "--epochs",
        "1",
        "--batch",
        "16",
        "--policy",
        "baseline",
        "--memory",
        "64MiB",
    )
    assert code == 0, err
    assert "val" in out and "acc" in out
    code, _, err = run(capsys, "plan", "--onnx", str(tmp_path / "missing.onnx"), "--batch", "8")
    assert code == 1 and "missing.onnx: no such ONNX file" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["plan", "--model", "vgg16", "--onnx", str(path), "--batch", "8"])
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all", "auto:microbatch=off", "auto"])
def test_the_largest_batch_is_what_planning_batch_by_batch_finds(policy, capsys):
    """``vmem plan --largest-batch`` on the CPU device: the batch it finds fits when planned on its own, the
    next does not (auto with a profile at each, as a Trainer makes; auto's micro-batches aside, as the search
    is for the whole step). It was 0 under auto, whose "needs costs" refusal was read as "does not fit"."""
    import vmem
    from vmem.errors import DoesNotFit
    from vmem.planning import profiles

    code = main(["plan", "--model", "digits_vgg", "--largest-batch", "--memory", "2MiB", "--policy", policy, "--json"])
    found = json.loads(capsys.readouterr().out)["largest_batch"]
    assert code == 0 and found > 1
    net = vmem.models.get("digits_vgg")
    whole = policy.replace("auto", "auto:microbatch=off") if policy == "auto" else policy
    with vmem.device("cpu", memory="2MiB") as dev:
        for batch, fits in ((found, True), (found + 1, False)):
            costs = profiles.measure(net, batch, dev)[0] if policy.startswith("auto") else None
            try:
                result = vmem.plan(net, batch, dev, whole, costs=costs)
                assert result.fits == fits, (batch, result.fits)
            except DoesNotFit:
                assert not fits, batch
