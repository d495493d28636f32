"""Observers of the training loop: the cosine schedule and the divergence warning."""

from __future__ import annotations

import math

import numpy as np
import pytest

import vmem
from vmem.training import Callback, CosineSchedule, LossWatch


def data(n=64, seed=0):
    train, _ = vmem.data.digits(seed=seed)
    return train


def test_the_cosine_schedule_decays_each_epoch_and_restores_the_rate():
    seen = []

    class Record(Callback):
        def on_epoch_start(self, trainer, epoch, epochs, batches):
            seen.append(trainer.optimizer.lr)

    opt = vmem.optim.SGD(lr=0.1, momentum=0.9)
    with vmem.Trainer(
        vmem.models.get("digits_cnn"), policy="baseline", memory="16MiB", optimizer=opt, seed=0
    ) as trainer:
        trainer.fit(data(), epochs=4, batch_size=256, progress=False, callbacks=[CosineSchedule(), Record()])
    want = [0.1 * 0.5 * (1 + math.cos(math.pi * e / 4)) for e in range(4)]
    assert seen == pytest.approx(want) and opt.lr == 0.1


def test_a_non_finite_loss_warns_once():
    watch = LossWatch()

    class Trainer:
        steps_done = 3

    class Report:
        loss = float("nan")

    with pytest.warns(RuntimeWarning, match="diverging"):
        watch.on_step(Trainer(), Report())
    watch.on_step(Trainer(), Report())  # once is enough
    assert watch.warned


def test_fit_refuses_zero_epochs():
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="16MiB", seed=0) as trainer:
        with pytest.raises(ValueError, match="epochs"):
            trainer.fit(data(), epochs=0, progress=False)
        assert np.isfinite(trainer.rng.random())


def test_the_progress_bar_shows_on_a_terminal_that_reports_no_size():
    """A pseudo-terminal of 0 x 0 (as `script` makes one) hid tqdm's bar: the bar gets 80 x 24 there."""
    import os
    import pty
    import subprocess
    import sys

    pytest.importorskip("tqdm")
    code = (
        "from vmem.training.callbacks import ProgressBar\n"
        "bar = ProgressBar(); bar.on_epoch_start(None, 1, 1, 3)\n"
        "assert bar.bar is not None\n"
        "for _ in range(3): bar.bar.update(1)\n"
        "bar.bar.refresh(); bar.on_epoch_end(None, None, 1)\n"
    )
    leader, follower = pty.openpty()  # a terminal of 0 columns and 0 rows
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    assert b"epoch 1/1" in out and b"3/3" in out
