"""A layer profiled at a smaller batch than the plan's (its buffers do not fit the budget's free memory at
the plan's batch) is sized for that batch from the layer itself: batch norm's per-channel statistics keep their
length where it equals the batch, a flat mask shrinks with the batch."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import vmem
from vmem import nn


def _user_cnn() -> vmem.Sequential:
    """A newcomer's own network, 32 channels trained at batch 32, with every layer kind that saves state."""
    return vmem.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(0.25),
        nn.Conv2d(32, 16, 3, padding=1),
        nn.GELU(),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
        input_shape=(1, 16, 16),
    )


def test_an_ops_saved_state_at_a_smaller_batch_is_sized_by_the_layer():
    from vmem.costs.measured import _at_batch
    from vmem.graph.program import build_program

    net = _user_cnn()
    program = build_program(net, 32, net.input_shape, "float32")
    for op in program.ops:
        sub = _at_batch(program, op, 8, SimpleNamespace(conv=None))  # type: ignore[arg-type]  # no catalog
        want = op.layer.aux_specs(tuple((8,) + tuple(s[1:]) for s in op.in_shapes))
        assert {k: a.shape for k, a in sub.aux.items()} == {k: a.shape for k, a in want.items()}, op.name
        if op.kind == "batchnorm":
            assert sub.aux["mean"].shape == (32,)


@pytest.mark.parametrize("memory", ["3.45MiB", "4MiB", "6MiB"])  # 3 MiB: micro-batches (planned in 50 s)
def test_a_users_cnn_with_batch_norm_trains_under_auto_in_a_small_budget(memory):
    train, _ = vmem.data.digits(image_size=16, channels=1)
    net = _user_cnn()
    with vmem.Trainer(net, memory=memory, policy="auto", seed=0) as trainer:
        small = vmem.data.Dataset(train.x[:64], train.y[:64], train.num_classes)
        history = trainer.fit(small, batch_size=32)
        assert np.isfinite(history.last.train_loss)
        assert history.last.peak_bytes <= vmem.parse_bytes(memory)
