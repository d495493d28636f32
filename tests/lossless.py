"""Train one small network under several policies on one batch, for bitwise comparisons with baseline."""

from __future__ import annotations

import numpy as np

import vmem


def weights_under(make, policies, x, y, steps: int = 3, memory: str = "16MiB", precision: str = "fp32"):
    """``{policy: weights}`` after ``steps`` steps on (x, y) on a poisoned CPU device at ``precision``;
    every step's loss is finite and every step's peak is the plan's."""
    out = {}
    for policy in policies:
        net = make()
        dev = vmem.device("cpu", memory=memory, poison=True)
        with vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision) as trainer:
            for _ in range(steps):
                report = trainer.step(x, y)
                assert np.isfinite(report.loss) and report.peak_bytes == trainer.plans[len(x)].peak_bytes, policy
        dev.close()
        out[policy] = net.params
    return out


def all_equal(weights) -> bool:
    """Whether every policy's weights equal the first's, bit for bit."""
    first, *rest = weights.values()
    return all(np.array_equal(first[k], w[k]) for w in rest for k in first)
