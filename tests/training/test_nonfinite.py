"""A step whose loss or gradients are not finite changes nothing (weights, optimizer state, batch norm's
running statistics, the step count), says so, and several in a row stop training with an error naming the
first op whose output was not finite."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import NonFiniteError


def _net():
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
        input_shape=(3, 8, 8),
        name="bn_net",
    )


def _state(trainer):
    trainer.sync()
    params = trainer.session.device_params()
    return ({k: v.copy() for k, v in trainer.net.params.items()}, params.optimizer_state())


def _same(a, b):
    return all(np.array_equal(a[i][k], b[i][k]) for i in (0, 1) for k in a[i])


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all", "gist"])
def test_a_nan_batch_leaves_everything_bitwise_unchanged(policy):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.Trainer(_net(), memory="32MiB", policy=policy, seed=0) as trainer:
        trainer.step(x, y)
        before, steps = _state(trainer), trainer.steps_done
        bad = x.copy()
        bad[3, 1, 2, 2] = np.nan
        with pytest.warns(RuntimeWarning, match="not finite; the step was skipped"):
            report = trainer.step(bad, y)
        assert report.skipped and trainer.steps_done == steps
        assert _same(before, _state(trainer))  # running mean and variance included
        good = trainer.step(x, y)
        assert not good.skipped and np.isfinite(good.loss) and trainer.steps_done == steps + 1


def test_a_finite_batch_that_overflows_inside_the_network_is_caught_too():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.Trainer(_net(), policy="baseline", memory="32MiB", seed=0) as trainer:
        trainer.step(x, y)
        before = _state(trainer)
        big = np.clip(x, -1, 1) * np.float32(3e38)  # finite, but the convolution's sums overflow
        assert np.isfinite(big).all()
        with pytest.warns(RuntimeWarning):
            report = trainer.step(big, y)
        assert report.skipped and _same(before, _state(trainer))


def test_steps_that_stay_non_finite_stop_training_naming_the_first_op():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    x[0, 0, 0, 0] = np.inf
    with vmem.Trainer(_net(), policy="baseline", memory="32MiB", seed=0, nonfinite_limit=3) as trainer:
        with pytest.warns(RuntimeWarning):
            trainer.step(x, y)
            trainer.step(x, y)
            with pytest.raises(
                NonFiniteError,
                match=r"3 steps in a row.*first output that is not finite: conv1 "
                r"\(forward\)",
            ):
                trainer.step(x, y)
        assert trainer.steps_done == 0


def test_the_limit_is_checked():
    with pytest.raises(ValueError, match="nonfinite_limit"):
        vmem.Trainer(_net(), policy="baseline", memory="32MiB", nonfinite_limit=0)


def test_a_batch_whose_variance_overflows_is_skipped_though_its_loss_is_finite():
    """Inputs scaled by 1e19: batch norm normalizes them (the loss stays finite) but their variance overflows
    float32, which would make running_var infinite and every later evaluation and save wrong."""
    x = np.random.default_rng(0).standard_normal((8, 3, 8, 8)).astype(np.float32)
    y = np.arange(8) % 10
    with vmem.Trainer(_net(), seed=0) as trainer:
        trainer.step(x, y)
        before = _state(trainer)
        with pytest.warns(RuntimeWarning, match="running statistic is not finite; the step was skipped"):
            report = trainer.step(x * 1e19, y)
        assert np.isfinite(report.loss) and report.skipped
        after = _state(trainer)
        assert all(np.array_equal(before[0][k], after[0][k]) for k in before[0])
        assert np.isfinite(after[0]["batchnorm1.running_var"]).all()


def test_a_constant_the_model_holds_does_not_count_as_state_gone_wrong():
    """A non-trainable constant (``init="value"``: an attention mask imported with -inf by design) is not what
    the finite check sums: only state a forward updates (batch norm's running statistics) is."""
    from vmem.nn.arith import ConstantOp

    net = vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
        ConstantOp("add", np.array([0.0] * 5 + [-np.inf] * 5, np.float32)),  # classes 5 to 9 masked out
        input_shape=(3, 8, 8),
        name="masked",
    )
    x = np.random.default_rng(0).standard_normal((8, 3, 8, 8)).astype(np.float32)
    with vmem.Trainer(net, seed=0) as trainer:
        report = trainer.step(x, np.arange(8) % 5)
        assert np.isfinite(report.loss) and not report.skipped
