"""A run stopped midway (Ctrl-C, SIGTERM: between two steps) and resumed from its checkpoint ends with bitwise
the weights of the run that was never stopped: same batches, same random draws, same learning rates."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.cli import main
from vmem.training import Callback, CosineSchedule


def _net():
    return vmem.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
        input_shape=(1, 8, 8),
        name="resumable",
    )


class _StopAt(Callback):
    def __init__(self, steps: int):
        self.steps, self.seen = steps, 0

    def on_step(self, trainer, report):
        self.seen += 1
        if self.seen == self.steps:
            raise KeyboardInterrupt


def _trainer():
    return vmem.Trainer(
        _net(), memory="32MiB", policy="vdnn-all", seed=3, optimizer=vmem.optim.SGD(lr=0.05, momentum=0.9)
    )


@pytest.mark.parametrize("stop_after", [7, 44, 45])  # midway through epoch 1; the last step of 1; into epoch 2
def test_resumed_midway_equals_never_stopped(tmp_path, stop_after):
    train, val = vmem.data.digits(image_size=8, channels=1)
    with _trainer() as t:
        t.fit(train, epochs=3, val=val, batch_size=32, progress=False, callbacks=[CosineSchedule()])
        want = {k: v.copy() for k, v in t.net.params.items()}
    path = tmp_path / "ckpt.npz"
    with _trainer() as t:
        with pytest.raises(KeyboardInterrupt):
            t.fit(
                train,
                epochs=3,
                val=val,
                batch_size=32,
                progress=False,
                callbacks=[CosineSchedule(), _StopAt(stop_after)],
            )
        t.save(path)
    with _trainer() as t:
        t.load(path)
        assert t.steps_done == stop_after
        t.fit(
            train,
            epochs=3,
            val=val,
            batch_size=32,
            progress=False,
            callbacks=[CosineSchedule()],
            initial_epoch=t.epochs_done,
        )
        got = t.net.params
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_the_command_stopped_by_sigterm_and_resumed_equals_the_run_never_stopped(tmp_path, capsys, monkeypatch):
    common = ["train", "--model", "digits_cnn", "--epochs", "2", "--policy", "vdnn-all", "--memory", "16MiB"]
    assert main(common + ["--save", str(tmp_path / "whole.npz")]) == 0
    calls = []
    step = vmem.Trainer.step

    def step_then_term(self, x, y):
        report = step(self, x, y)
        calls.append(1)
        if len(calls) == 30:  # midway through epoch 1 (44 steps of 32)
            os.kill(os.getpid(), signal.SIGTERM)
        return report

    monkeypatch.setattr(vmem.Trainer, "step", step_then_term)
    path = tmp_path / "stopped.npz"
    assert main(common + ["--save", str(path)]) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    monkeypatch.setattr(vmem.Trainer, "step", step)
    assert main(common + ["--save", str(path), "--resume", str(path)]) == 0
    with np.load(tmp_path / "whole.npz") as a, np.load(path) as b:
        arrays = [k for k in a.files if k != "meta"]
        assert arrays and all(np.array_equal(a[k], b[k]) for k in arrays)
