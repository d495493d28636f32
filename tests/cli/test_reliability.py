"""Bad input on the command line and to the Trainer gets a clear error, before any work, and loses nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vmem
from vmem.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv", [("--batch", "0"), ("--epochs", "0"), ("--epochs", "-1"), ("--lr", "-0.1"), ("--batch", "many")]
)
def test_numeric_options_are_checked_by_the_parser(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(["train", *argv])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and "training" not in out and argv[0] in err


def test_an_unwritable_save_path_is_refused_before_training(capsys, tmp_path):
    code, out, err = run(capsys, "train", "--save", str(tmp_path / "missing" / "ckpt.npz"))
    assert code == 1 and "does not exist" in err and "training" not in out


def test_save_writes_a_checkpoint_after_every_epoch(capsys, tmp_path, monkeypatch):
    from vmem.training import Checkpoint

    saved = []
    real = Checkpoint.on_epoch_end

    def spy(self, trainer, stats, epochs):
        real(self, trainer, stats, epochs)
        saved.append(stats.epoch)

    monkeypatch.setattr(Checkpoint, "on_epoch_end", spy)
    path = tmp_path / "ckpt.npz"
    code, _, _ = run(capsys, "train", "--epochs", "2", "--save", str(path), "--json")
    assert code == 0 and saved == [1, 2] and path.exists()


def test_ctrl_c_prints_one_line_exits_130_and_saves(capsys, tmp_path, monkeypatch):
    calls = []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        raise KeyboardInterrupt

    monkeypatch.setattr(vmem.Trainer, "fit", interrupted)
    path = tmp_path / "ckpt.npz"
    code, out, err = run(capsys, "train", "--save", str(path))
    assert code == 130 and calls and err.strip().count("\n") == 0 and "interrupted" in err
    assert path.exists()


def test_errors_under_json_are_json_objects(capsys):
    code, out, err = run(capsys, "plan", "--model", "vgg_cifar", "--batch", "8", "--policy", "nope", "--json")
    assert code == 1
    obj = json.loads(out)
    assert obj["command"] == "plan" and "nope" in obj["error"]


def test_a_closed_trainer_refuses_to_train():
    net = vmem.models.get("digits_cnn")
    trainer = vmem.Trainer(net, policy="baseline", memory="16MiB", seed=0)
    trainer.close()
    with pytest.raises(RuntimeError, match="closed"):
        trainer.step(np.zeros((4,) + net.input_shape, np.float32), np.zeros(4, int))


@pytest.mark.parametrize("labels", [[0, 1, 2, 10], [0, -1, 2, 3], [0.5, 1, 2, 3]], ids=["too-big", "negative", "float"])
def test_labels_are_checked_against_the_classes(labels):
    net = vmem.models.get("digits_cnn")
    with vmem.Trainer(net, policy="baseline", memory="16MiB", seed=0) as trainer:
        with pytest.raises(ValueError, match="labels must be integers from 0 to 9"):
            trainer.step(np.zeros((4,) + net.input_shape, np.float32), np.array(labels))
        assert trainer.steps_done == 0


def test_autos_explanation_counts_no_more_fitting_plans_than_it_tried():
    """It said "15 of 11 starting plans fit": plans alike were counted once as tried, each time as fitting."""
    import re

    net = vmem.models.get("vgg_cifar")
    for memory in ("120MiB", "200MiB", "400MiB", "2GiB"):
        reason = vmem.plan(net, 64, device="sim:titan-x", memory=memory, policy="auto").reason
        fit, tried = map(int, re.match(r"auto: (\d+) of (\d+) starting plans fit", reason).groups())
        assert 1 <= fit <= tried, reason


def test_a_plan_that_does_not_fit_never_says_it_fits(capsys):
    argv = ["plan", "--model", "vgg_cifar", "--batch", "128", "--device", "sim:titan-x", "--memory", "20MiB"]
    code, out, _ = run(capsys, *argv, "--policy", "vdnn-all")
    assert code == 1 and "fits: NO" in out and "it fits" not in out
    assert "the least-workspace algorithms (no faster ones fit)" in out


def test_a_loss_that_rises_from_the_first_step_warns_of_divergence():
    """--lr 1e6 ended at 10% accuracy and loss 1.2e6 without a word: its first epoch was never compared."""
    from vmem.training import LossWatch

    watch = LossWatch()

    class Trainer:
        steps_done = 1

    class Report:
        loss = 2.3

    class Epoch:
        epoch, train_loss = 1, 1.2e6

    watch.on_step(Trainer(), Report())
    with pytest.warns(
        RuntimeWarning, match=r"rose to 1\.2e\+06 in epoch 1 \(the first step's: 2\.3\): training is diverging"
    ):
        watch.on_epoch_end(Trainer(), Epoch(), 1)
    quiet = LossWatch()
    quiet.on_step(Trainer(), Report())
    Epoch.train_loss = 0.9  # an ordinary first epoch: below its first step's loss
    quiet.on_epoch_end(Trainer(), Epoch(), 1)
    assert not quiet.warned


def test_a_trainer_on_a_closed_device_is_refused_at_once():
    dev = vmem.device("cpu", memory="16MiB")
    dev.close()
    with pytest.raises(vmem.errors.DeviceError, match="cpu.* is closed"):
        vmem.Trainer(vmem.models.get("digits_cnn"), device=dev, policy="baseline")


def test_bench_bandwidth_keeps_stdout_for_its_table(capsys):
    code, out, err = run(capsys, "bench", "bandwidth", "--sizes", "64KiB,128KiB", "--rounds", "1")
    assert code == 0 and "MiB done" in err and "MiB done" not in out
    assert out.splitlines()[0].startswith("host-device copy bandwidth") and len(out.splitlines()) == 4


@pytest.mark.parametrize(
    "argv, says",
    [
        (("train", "--batch", "100000"), "--batch 100000 is more than the 1438 training samples of digits"),
        (("train", "--batch", "100000000"), "--batch 100000000 is more than the 1438 training samples"),
        (("train", "--nproc", "3"), "--batch 32 does not split into 3 equal shards"),
        (("train", "--nproc", "64"), "--batch 32 does not split into 64 equal shards"),
        (("train", "--memory", "1TB"), "--memory 1TB is more than this machine's"),
        (("train", "--memory", "18446744073709551616B"), "is more than this machine's"),
        (
            ("plan", "--model", "vgg16", "--batch", "32", "--device", "sim:titan-x", "--memory", "1TB"),
            "--memory 1TB is more than sim:titan-x's 12.00 GiB; give at most that, or --oversubscribe",
        ),
        (
            (
                "plan",
                "--model",
                "vgg16",
                "--batch",
                "32",
                "--device",
                "sim:titan-x",
                "--memory",
                "18446744073709551616B",
                "--oversubscribe",
            ),
            "more than the 1.00 EiB a plan can take",
        ),
    ],
)
def test_cheap_checks_come_before_any_work(capsys, monkeypatch, argv, says):
    """Refused in constant time (batch 10^8 took 230 s), before profiling, planning or launching a rank."""
    import time

    from vmem import planning
    from vmem.distributed import launch
    from vmem.training import Trainer

    for where, name in ((Trainer, "profile"), (Trainer, "__init__"), (planning, "plan"), (launch, "launch")):
        monkeypatch.setattr(where, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran before the checks"))
    t0 = time.monotonic()
    code, out, err = run(capsys, *argv)
    assert code == 1 and says in err and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 10


def test_nproc_beyond_the_cores_is_refused_before_launching(capsys, monkeypatch):
    from vmem.distributed import launch

    monkeypatch.setattr(launch, "launch", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr("vmem.threads.cores", lambda: 2)
    code, _, err = run(capsys, "train", "--nproc", "4", "--batch", "32")
    assert code == 1 and "--nproc 4: this machine has 2 cores for its ranks; give at most 2" in err


def test_a_kept_profile_is_said_to_be_used(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("VMEM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("VMEM_PROFILE_CACHE", raising=False)
    lines = []
    for _ in range(2):
        code, out, _ = run(capsys, "train", "--model", "digits_cnn", "--epochs", "1")
        assert code == 0
        lines += [line for line in out.splitlines() if line.startswith("profile: ") and "kept" in line]
    assert lines[0].startswith("profile: measured in ") and lines[0].endswith("for the next run")
    assert lines[1] == f"profile: the one kept in {tmp_path / 'profiles'} (VMEM_PROFILE_CACHE=0 measures afresh)"


def test_the_largest_batch_is_searched_by_plans_alone(capsys):
    """`vmem plan --largest-batch` (and vmem.largest_batch): VGG-16 in 8 GiB of a simulated H100 plans
    164 under vdnn-all and 269 under auto (177 before its floor kept ReLU signs as bits, prefetched at the
    reader and split the convolutions' backward, 265 before the bits a split holds waited on the host); the
    largest whole batch (micro-batches aside); each answer fits and the next batch does not."""
    net = vmem.models.get("vgg16")
    for policy, want in (("vdnn-all", 164), ("auto", 269)):
        code, out, _ = run(
            capsys,
            "plan",
            "--model",
            "vgg16",
            "--device",
            "sim:h100-sxm",
            "--memory",
            "8GiB",
            "--largest-batch",
            "--policy",
            policy,
            "--json",
        )
        result = json.loads(out)
        assert code == 0 and result["largest_batch"] == want, result
        assert (want, True) in map(tuple, result["tries"]) and (want + 1, False) in map(tuple, result["tries"])
    assert vmem.largest_batch(net, "sim:h100-sxm", memory="8GiB", policy="vdnn-all", most=100) == 100
    assert vmem.largest_batch(net, "sim:h100-sxm", memory="64MiB", policy="vdnn-all") == 0
    code, _, err = run(capsys, "plan", "--model", "vgg16", "--device", "sim:h100-sxm")
    assert code == 1 and "--batch is required" in err


@pytest.mark.parametrize("name", ["trace.json", "layers.txt", "memory.png"])
@pytest.mark.parametrize("kind", ["link", "fifo", "folder"])
def test_trace_refuses_what_was_planted_at_its_outputs_before_training(capsys, tmp_path, name, kind):
    """``vmem trace --out DIR`` never writes through a link in DIR, never blocks on a FIFO named as its
    output, never writes into a folder: refused at the start, naming the file, the planted thing untouched."""
    import os

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    planted = tmp_path / name
    if kind == "link":
        planted.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.mkdir()
    code, _, err = run(capsys, "trace", "--model", "digits_vgg", "--steps", "1", "--batch", "8", "--out", str(tmp_path))
    assert code != 0 and name in err and ("symbolic link" in err or "FIFO" in err or "folder" in err)
    assert victim.read_text() == "precious"


def test_trace_replaces_its_old_outputs_whole(capsys, tmp_path):
    for name in ("trace.json", "layers.txt"):
        (tmp_path / name).write_text("old")
    code, _, _ = run(capsys, "trace", "--model", "digits_vgg", "--steps", "1", "--batch", "8", "--out", str(tmp_path))
    assert code == 0
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert "old" not in (tmp_path / "layers.txt").read_text()
    assert not list(tmp_path.glob("*.vmem-tmp"))


@pytest.mark.parametrize("value", ["-5MiB", "0", "0GiB"])
def test_a_size_that_is_not_positive_is_called_so(capsys, value):
    code, _, err = run(capsys, "train", f"--memory={value}")
    assert code != 0 and "a size must be positive" in err


def test_a_copy_larger_than_the_machine_is_refused_before_anything_is_allocated(capsys):
    code, _, err = run(capsys, "bench", "bandwidth", "--sizes", "100TiB")
    assert code != 0 and "--sizes: a copy of 100.00 TiB needs about" in err and "Unable to allocate" not in err


@pytest.mark.parametrize(
    "change, message",
    [(("--optimizer", "adam"), "optimizer is 'SGD', this trainer's is 'Adam'"), (("--image-size", "24"), "has shape")],
)
def test_a_resume_another_run_cannot_continue_is_refused_before_any_profiling(capsys, tmp_path, change, message):
    save = str(tmp_path / "ck.npz")
    code, _, _ = run(capsys, "train", "--epochs", "1", "--save", save, "--dataset", "synthetic", "--batch", "64")
    assert code == 0
    code, _, err = run(
        capsys, "train", "--epochs", "2", "--resume", save, "--dataset", "synthetic", "--batch", "64", *change
    )
    assert code != 0 and message in err and "profil" not in err


def test_a_path_with_terminal_escapes_is_echoed_as_text(capsys, tmp_path):
    """A file name that carries a terminal escape (ESC [ 31 m) is shown escaped in an error, never sent raw."""
    code, _, err = run(capsys, "train", "--resume", str(tmp_path / "evil\x1b[31mname.npz"))
    assert code != 0 and "\x1b" not in err and "\\x1b[31m" in err
