"""A run that fits finishes: every batch it executes (training, evaluation, the last partial batch) is
planned before it starts, evaluation runs at the largest batch that fits beside the training state, and
bad arguments are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vmem
from vmem.cli import main


def test_the_newcomers_run_finishes_with_evaluation_in_a_batch_that_fits(capsys):
    code = main(["train", "--model", "vgg_cifar", "--batch", "32", "--memory", "100MiB", "--epochs", "1", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["val_accuracy"] > 0.15 and result["peak_bytes"] <= 100 << 20


def test_evaluate_and_predict_default_to_a_batch_that_fits_beside_the_training_state():
    train, val = vmem.data.digits(image_size=32, channels=3)
    with vmem.Trainer(vmem.models.get("vgg_cifar"), memory="100MiB", policy="vdnn-all", seed=0) as trainer:
        trainer.step(train.x[:32], train.y[:32])
        batch = trainer.eval_batch(len(val))
        assert 1 <= batch < 256  # at 256, evaluation does not fit beside the weights, gradients and momentum
        with pytest.raises(vmem.errors.OutOfDeviceMemory, match="leave batch_size out"):
            trainer.evaluate(val, batch_size=256)  # refused before it runs, not midway
        stats = trainer.device.pool.stats()
        result = trainer.evaluate(val)
        assert 0 <= result["accuracy"] <= 1 and np.isfinite(result["loss"])
        assert trainer.device.pool.stats().in_use == stats.in_use
        assert trainer.predict(val.x[:7]).shape == (7, 10)


def test_fit_says_when_it_evaluates_in_smaller_batches(capsys):
    train, val = vmem.data.digits(image_size=32, channels=3)
    with vmem.Trainer(
        vmem.models.get("vgg_cifar"),
        memory="100MiB",
        policy="vdnn-all",
        seed=0,
        optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9),
    ) as trainer:
        trainer.fit(vmem.data.Dataset(train.x[:96], train.y[:96], 10), epochs=1, val=val, batch_size=32)
    assert "evaluating in batches of" in capsys.readouterr().out


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda t, d: t.fit(d, batch_size=0), "batch_size=0 must be a positive int"),
        (lambda t, d: t.fit(d, epochs=True), "epochs=True must be a positive int"),
        (lambda t, d: t.predict(d.x, batch_size=-1), "batch_size=-1 must be a positive int"),
        (
            lambda t, d: t.evaluate(vmem.data.Dataset(d.x[:4], np.array([0, 1, 12, 2]), 10, "bad")),
            "labels must be integers from 0 to 9",
        ),
        (
            lambda t, d: t.evaluate(vmem.data.Dataset(d.x[:4], np.array([0, 1, -1, 2]), 10, "bad")),
            "labels must be integers from 0 to 9",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(call, message):
    train, _ = vmem.data.digits(image_size=8, channels=1)
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="16MiB") as trainer:
        with pytest.raises(ValueError, match=message):
            call(trainer, train)


def test_predict_on_no_samples_gives_no_logits():
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="16MiB") as trainer:
        out = trainer.predict(np.zeros((0, 1, 8, 8), np.float32))
    assert out.shape == (0, 10)


def _least_in(message: str) -> int:
    import re

    return int(re.search(r"needs at least [\d.]+ \w+ \((\d+) bytes", message).group(1))


@pytest.mark.parametrize("policy", ["vdnn-all", "vdnn-dyn"])
def test_the_smallest_budget_a_refusal_names_is_the_smallest_that_trains(policy):
    net = vmem.models.get("digits_cnn")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 32)

    def trains(memory: int) -> bool:
        with vmem.Trainer(vmem.models.get("digits_cnn"), memory=memory, policy=policy, seed=0) as trainer:
            try:
                trainer.step(x, y)
            except (vmem.errors.OutOfDeviceMemory, vmem.errors.PlanError) as exc:
                trains.last = str(exc)
                return False
            return True

    assert not trains(1 << 20)
    least = _least_in(trains.last)
    assert "the largest batch that fits in 1.00 MiB is" in trains.last
    assert trains(least) and not trains(least - 256)  # to the pool's alignment
    del net


def test_auto_never_picks_a_budget_that_cannot_train(capsys):
    code = main(
        ["train", "--model", "digits_cnn", "--epochs", "1", "--memory", "auto:0.1", "--policy", "vdnn-all", "--json"]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    result = json.loads(out.out)
    assert result["memory"] > 0.1 * result["baseline_peak_bytes"] and result["peak_bytes"] <= result["memory"]


def test_at_batch_one_a_refusal_suggests_no_smaller_batch(capsys):
    code = main(["train", "--model", "digits_vgg", "--batch", "1", "--memory", "64KiB"])
    err = capsys.readouterr().err
    assert code == 1 and "smaller batch" not in err and "Use a larger memory budget" in err


def test_train_offers_no_simulated_gpu_in_its_help(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "cuda:N" in out and "sim:" not in out
