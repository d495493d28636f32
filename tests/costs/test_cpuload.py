"""A profile knows when other processes used the machine while it measured (``/proc/stat`` less this process's
own CPU time): it is marked, says so in its notes, keeps the figure with it, and a plan made from it says so."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.costs import cpuload


def test_busy_elsewhere_is_the_machines_busy_time_less_this_processs(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  300 20 80 9000 40 5 5 10 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    tick = os.sysconf("SC_CLK_TCK")
    assert cpuload._busy_seconds(str(stat)) == pytest.approx((300 + 20 + 80 + 5 + 5 + 10) / tick)  # idle, iowait out
    assert cpuload._busy_seconds(str(tmp_path / "none")) is None
    stat.write_text("intr 1 2 3\n")
    assert cpuload.sample(str(stat)) is None  # not Linux's format: nothing known
    a, b = cpuload.Sample(10.0, 100.0, 4.0), cpuload.Sample(12.0, 103.5, 5.5)
    assert cpuload.busy_elsewhere(a, b) == pytest.approx((3.5 - 1.5) / 2)  # two seconds, one core's worth
    assert cpuload.busy_elsewhere(a, cpuload.Sample(12.0, 101.0, 6.0)) == 0.0  # never below nothing
    assert cpuload.busy_elsewhere(a, cpuload.Sample(10.01, 101.0, 4.0)) is None  # too close to tell
    assert cpuload.busy_elsewhere(None, b) is None


def _net() -> vmem.Sequential:
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10), input_shape=(3, 8, 8)
    )


@pytest.mark.skipif(cpuload.sample() is None, reason="no /proc/stat: the machine's load is not known here")
def test_a_profile_beside_a_busy_process_says_so_and_so_does_its_plan(monkeypatch):
    monkeypatch.setenv("VMEM_PROFILE_CACHE", "0")  # measured here, not read back
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 60\nwhile time.time() < end: pass"]
    )
    try:
        time.sleep(0.3)  # the spinner holds its core before the profile starts
        with vmem.Trainer(_net(), policy="baseline", profile=True, seed=0, memory="64MiB") as trainer:
            costs = trainer.profile(8)
            plan = trainer.plan(8)
    finally:
        spinner.kill()
        spinner.wait()
    assert costs.busy_elsewhere is not None and costs.busy_elsewhere >= cpuload.DISTURBED, costs.busy_elsewhere
    assert costs.disturbed and any("other processes used" in n for n in costs.notes)
    assert "other processes used" in plan.plan.notes["profile"]
    back = vmem.costs.cache.parse(costs.to_dict())  # kept with the profile on disk
    assert back.busy_elsewhere == pytest.approx(costs.busy_elsewhere) and back.disturbed


def test_a_kept_profile_without_the_figure_reads_as_unknown():
    from vmem.costs.measured import Profiled

    old = Profiled({("loss", "forward", None): 0.001}, 5.0, 5.0).to_dict()
    old.pop("busy_elsewhere")
    back = vmem.costs.cache.parse(old)
    assert back.busy_elsewhere is None and not back.disturbed
    with pytest.raises(ValueError, match="busy_elsewhere"):
        vmem.costs.cache.parse({**old, "busy_elsewhere": -1})
    assert np.isfinite(vmem.costs.cache.parse({**old, "busy_elsewhere": 0.5}).busy_elsewhere)
