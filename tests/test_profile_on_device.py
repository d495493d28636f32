"""Profiling through a device (the path a GPU takes: arrays in the device's pool, random data drawn by the
device's generator, work on its compute stream), run here on the CPU device."""

from __future__ import annotations

import numpy as np

import vmem
from vmem.costs import profile


def test_a_profile_through_the_device_measures_every_pass_and_leaves_the_pool_empty():
    net = vmem.models.get("vgg_cifar", image_size=16)
    program = net.build(4, net.input_shape, "float32")
    with vmem.device("cpu", memory="128MiB") as dev:
        program = dev.catalog(program)
        prof = profile(program, device=dev, copy_gbps=10.0, repeats=1)
        stats = dev.pool.stats()
        assert stats.in_use == 0 and stats.count == 0 and stats.allocations == stats.frees > 0
    for op in program.ops:
        if op.kind == "conv":
            for pass_, algos in op.algorithms.items():
                for algo in algos:
                    t = prof.times[(op.name, pass_, algo)]
                    assert np.isfinite(t) and t >= 0, (op.name, pass_, algo)
            assert prof.times[(op.name, "forward", op.algorithms["forward"][0])] > 0
        else:
            assert (op.name, "forward", None) in prof.times and (op.name, "backward", None) in prof.times
    assert prof.times[("loss", "forward", None)] > 0 and prof.elementwise_gbps > 0
