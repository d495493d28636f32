"""The host's part of a step on the CPU device, measured by a small network's steps (vmem.engine.probe)."""

from __future__ import annotations

import numpy as np

import vmem
from vmem.engine import probe


def test_the_probe_measures_the_host_on_the_cpu_device_and_gives_its_blocks_back():
    with vmem.device("cpu", memory="32MiB") as dev:
        before = dev.pool.stats()
        per_step, per_item, per_copy = probe.overheads(dev)
        after = dev.pool.stats()
        # microseconds, not milliseconds (what a copy takes from compute: tenths of one)
        assert 0 < per_step < 0.01 and 0 <= per_item < 0.01 and 0 <= per_copy < 0.01
        assert (after.in_use, after.count) == (before.in_use, before.count)
        assert probe.overheads(dev) == (per_step, per_item, per_copy)  # once per process and device


def test_a_device_that_runs_while_the_host_enqueues_has_no_host_part():
    assert probe.overheads(vmem.device("sim:titan-x", memory="1GiB")) == (0.0, 0.0, 0.0)


def test_a_profiled_plan_counts_the_host_and_the_report_says_how_long_it_enqueued():
    net = vmem.models.get("digits_cnn")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8,) + tuple(net.input_shape)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    with vmem.Trainer(net, memory="64MiB", policy="vdnn-all", profile=True, seed=0) as trainer:
        report = trainer.step(x, y)
        costs = trainer.session.costs[8]
        steps = len(trainer.session.executor(8, True).schedule.steps)
        plan = trainer.plans[8]
    per_step, _, _ = costs.host_overheads()
    assert per_step > 0 and report.dispatch_seconds > 0
    without = vmem.plan(net, 8, memory="64MiB", policy="vdnn-all", costs=_OpsOnly(costs))
    assert plan.step_seconds >= without.step_seconds + steps * per_step * 0.999


class _OpsOnly:
    """A profile's costs without the host's part."""

    def __init__(self, costs):
        self._costs = costs

    def __getattr__(self, name):
        return getattr(self._costs, name)

    def host_overheads(self):
        return 0.0, 0.0, 0.0
