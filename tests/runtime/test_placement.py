"""A step's blocks land where the plan's replay put them: the same offsets, sizes and categories in the same
order, whatever the streams' timing and whatever the data (an encoding denser than planned keeps its planned
block and waits in host memory), so a plan that fits in its replay fits when it runs."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import vmem
from vmem.device.sim import SimDevice
from vmem.pool import PoolHook
from vmem.schedule.replay import replay


class Placements(PoolHook):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, str]] = []

    def on_allocate(self, block) -> None:
        self.seen.append((block.offset, block.size, block.category))


POLICIES = [
    "vdnn-all:sync=event",
    "vdnn-conv:codec=zvc,sync=event",
    "gist",
    "gist:density=0.01",  # every ssdc encoding larger than its block
    "echo",
]


@pytest.mark.parametrize("policy", POLICIES)
def test_every_block_of_a_step_is_where_the_replay_put_it(policy):
    net = vmem.models.get("vgg_cifar", image_size=16)
    batch = 8
    needs = vmem.plan(net, batch, "cpu", policy).peak_bytes
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch,) + net.input_shape).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with vmem.device("cpu", memory=needs + 4096) as dev:  # a tight budget: the planned places matter
        with vmem.Trainer(net, device=dev, policy=policy, seed=0) as trainer:
            schedule = trainer.session.executor(batch, True).schedule
            sim = SimDevice(dev.spec, alignment=dev.pool.alignment)
            planned = Placements()
            sim.pool.add_hook(planned)
            replay(schedule, sim)
            expected = planned.seen[len(schedule.persistent) :]
            ran = Placements()
            dev.pool.add_hook(ran)
            with pytest.warns(RuntimeWarning) if "0.01" in policy else contextlib.nullcontext():
                for _ in range(3):
                    ran.seen.clear()
                    report = trainer.step(x, y)
                    assert ran.seen == expected
                    assert report.peak_bytes == trainer.plans[batch].peak_bytes
            dev.pool.remove_hook(ran)
