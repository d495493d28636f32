"""A step that fits under none of a policy's plans, run as micro-batches (``microbatch=on``; auto's default):
the weights equal the whole batch's within float rounding, the measured peak is the plan's, and the planner
takes the fewest micro-batches that fit."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.planning.microbatch import per_sample, slice_sizes

#: a micro-batched step's weights against the whole batch's after 5 steps (FP32): the gradients are summed
#: micro-batch by micro-batch, each loss gradient weighed by its share, so only rounding differs
TOLERANCE = 1e-5


def _net() -> vmem.Sequential:
    return vmem.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 10),
        input_shape=(3, 16, 16),
        name="micronet",
    )


def _batches(n: int, steps: int = 5):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((n, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, n)) for _ in range(steps)]


def _train(policy: str, memory: str, batch: int = 48):
    net = _net()
    reports = []
    with vmem.Trainer(net, device="cpu", memory=memory, policy=policy, seed=0) as trainer:
        for x, y in _batches(batch):
            reports.append(trainer.step(x, y))
        plan = trainer.plans[batch]
    return net.params, reports, plan


def test_slices_are_equal_then_the_rest():
    assert slice_sizes(10, 4) == (4, 4, 2) and slice_sizes(8, 4) == (4, 4) and slice_sizes(5, 5) == (5,)
    with pytest.raises(ValueError):
        slice_sizes(4, 0)


def test_only_networks_that_treat_each_sample_alone_are_micro_batched():
    assert per_sample(_net().build(2))
    assert not per_sample(vmem.models.get("resnet18", num_classes=10, image_size=32).build(2))  # batch norm


def test_a_micro_batched_step_trains_as_the_whole_batch_does_in_less_memory():
    whole, _, big = _train("vdnn-all:algos=memory", "256MiB")
    assert big.microbatch == 1
    budget = int(big.peak_bytes * 0.7)  # below vdnn-all's leanest plan of the whole batch
    with pytest.raises(vmem.errors.VmemError):
        _train("vdnn-all:algos=memory", f"{budget}B")
    split, reports, plan = _train("vdnn-all:algos=memory,microbatch=on", f"{budget}B")
    assert plan.microbatch >= 2 and plan.fits and plan.peak_bytes <= budget
    assert all(r.peak_bytes == plan.peak_bytes for r in reports)  # measured as planned, every step
    assert all(np.isfinite(r.loss) and not r.skipped for r in reports)
    for k in whole:
        scale = np.abs(whole[k]).max() or 1.0
        assert np.abs(split[k] - whole[k]).max() <= TOLERANCE * scale, k


def test_split_convolutions_add_their_weight_gradients_in_later_micro_batches():
    """A split backward's filter half writes into the temporary a later micro-batch adds from; its data half
    makes no weight gradient."""
    whole, _, big = _train("vdnn-all:algos=memory,split=on", "256MiB")
    budget = int(big.peak_bytes * 0.7)
    split, reports, plan = _train("vdnn-all:algos=memory,split=on,microbatch=on", f"{budget}B")
    assert plan.microbatch >= 2 and all(r.peak_bytes == plan.peak_bytes for r in reports)
    assert all(np.abs(split[k] - whole[k]).max() <= TOLERANCE * (np.abs(whole[k]).max() or 1.0) for k in whole)


def test_vmem_plan_says_how_many_micro_batches(capsys):
    import json

    from vmem.cli import main

    code = main(
        ["plan", "--model", "vgg16", "--batch", "512", "--device", "sim:h100-sxm", "--memory", "8GiB", "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["fits"] and out["microbatch"] == 2 and out["baseline_step_seconds"] > 0
    assert out["step_seconds"] > out["baseline_step_seconds"]  # two micro-batches, each through the link
