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
