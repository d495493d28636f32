"""After close(), no thread vmem started is alive, with or without codecs: the stream workers, the
codec kernels' workers and the link thread of transfers through a codec."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import vmem
from vmem import codecs, threads


def vmem_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith(threads.PREFIX) and t.is_alive())


def train_through_a_codec(dev) -> None:
    net = vmem.models.get("vgg_cifar", image_size=16)
    with vmem.Trainer(net, device=dev, policy="vdnn-all:codec=zvc", seed=0) as trainer:
        rng = np.random.default_rng(0)
        trainer.step(rng.standard_normal((8, 3, 16, 16)).astype(np.float32), rng.integers(0, 10, 8))


def test_closing_the_device_joins_every_helper_thread():
    dev = vmem.device("cpu", memory="256MiB")
    x = np.maximum(np.random.default_rng(0).standard_normal(1 << 22), 0).astype(np.float32)
    codecs.get("zvc").encode(x)  # large enough to split over the kernel workers
    train_through_a_codec(dev)  # the link thread carries the encoded pieces
    running = vmem_threads()
    assert any("stream" in n for n in running)
    if codecs.native.available() and threads.cores() > 1:
        assert any("codec" in n for n in running)
    dev.close()
    assert vmem_threads() == []


def test_helpers_stay_while_another_device_is_open():
    first, second = vmem.device("cpu", memory="64MiB"), vmem.device("cpu", memory="64MiB")
    threads.LINK.submit(lambda: None).result()
    first.close()
    assert threads.LINK.running
    second.close()
    assert not threads.LINK.running and vmem_threads() == []


def test_a_dropped_device_releases_its_hold():
    import gc

    dev = vmem.device("cpu", memory="16MiB")
    threads.LINK.submit(lambda: None).result()
    del dev
    gc.collect()
    assert not threads.LINK.running


# -- the core budget -----------------------------------------------------------------------------------
class _Clock:
    """Stands in for the machine's readings: wall time, busy CPU seconds of the cores, our own CPU seconds."""

    def __init__(self, monkeypatch):
        self.now = self.busy = self.own = 0.0
        monkeypatch.setattr(threads.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(threads, "_busy_seconds", lambda cpus: self.busy)
        monkeypatch.setattr(threads, "_own_seconds", lambda: self.own)

    def advance(self, seconds: float, *, ours: float, others: float) -> None:
        """``seconds`` of wall time in which we kept ``ours`` cores busy and other processes ``others``."""
        self.now += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds


def test_budget_leaves_the_cores_other_processes_keep_busy(monkeypatch):
    clock = _Clock(monkeypatch)
    budget = threads.CoreBudget(4, interval=0.25)
    assert budget.sample() == 4  # nothing measured yet: every core
    clock.advance(1.0, ours=3.0, others=1.0)
    assert budget.sample() == 3 and budget.others == 1.0
    clock.advance(1.0, ours=1.0, others=2.6)
    assert budget.sample() == 1  # 4 - 2.6 rounds to 1
    clock.advance(0.1, ours=1.0, others=0.0)
    assert budget.sample() == 1  # too soon to measure again: the previous figure holds
    clock.advance(1.0, ours=2.0, others=0.0)
    assert budget.sample() == 4  # the competitors stopped
    clock.advance(1.0, ours=0.0, others=9.0)
    assert budget.sample() == 1  # never below one thread


def test_budget_ignores_flickers_of_load(monkeypatch):
    """On two cores the figure drops to 1 only for a clear competitor and comes back only once it has
    clearly gone: a VM's brief steal does not flip the step between its one- and two-lane forms."""
    clock = _Clock(monkeypatch)
    budget = threads.CoreBudget(2, interval=0.25)
    budget.sample()
    for others, want in [(0.6, 2), (0.7, 2), (0.9, 1), (0.6, 1), (0.3, 1), (0.1, 2), (0.5, 2), (1.0, 1)]:
        clock.advance(0.5, ours=1.0, others=others)
        assert budget.sample() == want, others
        assert budget.others == pytest.approx(others)


def test_busy_time_leaves_out_idle_iowait_and_a_hypervisors_steal():
    """Busy is what this machine's processes ran (user, nice, system, irq, softirq) on the CPUs asked about.
    A VM's steal is not: counted, a hypervisor taking a quarter of the time would drop the step to one lane
    and keep it there, leaving idle a core that the second lane would use."""
    stat = "\n".join(
        [
            "cpu  900 0 90 5000 10 0 9 4000 0 0",  # the aggregate line is not read
            "cpu0 100 2 30 1000 7 1 4 500 0 0",
            "cpu1 200 0 10 2000 3 0 6 3000 0 0",
            "cpu2 400 0 50 0 0 0 0 0 0 0",
            "intr 12345 0 0",
        ]
    )
    assert threads._busy_ticks(stat, {0, 1}) == (100 + 2 + 30 + 1 + 4) + (200 + 10 + 6)
    assert threads._busy_ticks(stat, None) == 137 + 216 + 450
    assert threads._busy_ticks(stat, {7}) is None
    assert threads._busy_ticks("cpu  1 2 3 4\nbtime 5", None) is None
    assert threads._busy_ticks("cpu0 1 2 3", None) is None  # a line too short to read is skipped


def test_budget_caps_blas_threads_for_the_block_and_restores_them():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = [i for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    if not blas:
        pytest.skip("NumPy links no BLAS threadpoolctl can see")
    before = [i["num_threads"] for i in blas]
    with threads.CoreBudget(fixed=1).limit() as n:
        assert n == 1
        assert all(i["num_threads"] == 1 for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
    assert [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"] == before


def test_codec_kernels_split_no_wider_than_the_budget(monkeypatch):
    monkeypatch.setattr(threads.BUDGET, "threads", 1)
    assert codecs.native._chunks(1 << 20) == [(0, 1 << 20)]
    monkeypatch.setattr(threads.BUDGET, "threads", 3)
    assert len(codecs.native._chunks(3 << 20)) == 3


def test_budget_from_the_environment(monkeypatch):
    monkeypatch.setenv("VMEM_THREADS", "2")
    assert threads.CoreBudget(8).sample() == 2
    monkeypatch.setenv("VMEM_THREADS", "many")
    with pytest.raises(ValueError, match="VMEM_THREADS"):
        threads.CoreBudget(8)
    monkeypatch.delenv("VMEM_THREADS")
    with pytest.raises(ValueError, match="at least 1"):
        threads.CoreBudget(8, fixed=0)


def test_a_step_runs_under_the_budget(monkeypatch):
    """The CPU device's step scope is the budget's limit: BLAS runs with the budget's threads in a step."""
    seen = []
    original = threads.CoreBudget.limit

    def spy(self):
        seen.append(self)
        return original(self)

    monkeypatch.setattr(threads.CoreBudget, "limit", spy)
    with vmem.device("cpu", memory="64MiB") as dev:
        net = vmem.models.get("digits_cnn")
        with vmem.Trainer(net, device=dev, seed=0) as trainer:
            rng = np.random.default_rng(0)
            trainer.step(rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8))
    assert threads.BUDGET in seen


def test_pinning_the_budget_makes_runs_comparable_bit_for_bit(monkeypatch):
    """BLAS products can differ in their last bits between thread counts; a pinned budget keeps every
    step at one count, and each step reports the count it ran under."""
    budget = threads.CoreBudget(2)
    budget.fix(1)
    assert budget.sample() == 1 and budget.threads == 1
    budget.fix(None)
    assert budget.fixed is None and budget.threads == 2
    with pytest.raises(ValueError, match="at least 1"):
        budget.fix(0)
    with vmem.device("cpu", memory="64MiB") as dev:
        with vmem.Trainer(vmem.models.get("digits_cnn"), device=dev, seed=0) as trainer:
            rng = np.random.default_rng(0)
            report = trainer.step(rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, 8))
    assert report.threads == threads.BUDGET.threads


def test_a_bad_environment_budget_warns_and_measures(monkeypatch):
    monkeypatch.setenv("VMEM_THREADS", "zero")
    with pytest.warns(RuntimeWarning, match="VMEM_THREADS"):
        budget = threads._process_budget()
    assert budget.fixed is None


def test_a_two_core_budget_runs_blas_single_threaded_and_gives_two_lanes():
    """On exactly two cores BLAS runs one thread and the layers two lanes side by side (vmem.nn.lanes);
    OpenBLAS takes a thread count only from the main thread, so the step scope sets it there."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = lambda: [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]  # noqa: E731
    before = blas()
    own = threads.CoreBudget(fixed=2)
    with own.limit() as n:
        assert n == 2 and own.lanes == 2
    assert own.lanes == 1
    budget = threads.BUDGET
    fixed = budget.fixed
    try:
        for n, lanes in ((1, 1), (2, 2), (3, 1)):
            budget.fix(n)
            with budget.limit():
                assert budget.lanes == lanes
                if blas():
                    assert set(blas()) == {1 if n <= 2 else 3}
            assert budget.lanes == 1
    finally:
        budget.fix(fixed)
    assert blas() == before


def test_the_budget_changes_the_speed_not_the_weights(monkeypatch):
    """One core or two: the same weights bit for bit after a few steps (on two, the lanes did run side by
    side), where BLAS's own threads used to round some products differently."""
    side_by_side = []
    submit = threads.LANE.submit
    monkeypatch.setattr(threads.LANE, "submit", lambda *a: side_by_side.append(1) or submit(*a))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    weights = {}
    fixed = threads.BUDGET.fixed
    try:
        for n in (1, 2):
            threads.BUDGET.fix(n)
            side_by_side.clear()
            net = vmem.models.get("vgg_cifar", image_size=16)
            with vmem.Trainer(
                net,
                memory="256MiB",
                policy="baseline:algos=performance",
                seed=0,
                optimizer=vmem.optim.SGD(lr=0.01, momentum=0.9),
            ) as trainer:
                for _ in range(3):
                    trainer.step(x, y)
            weights[n] = {k: v.copy() for k, v in net.params.items()}
            assert bool(side_by_side) == (n == 2)
    finally:
        threads.BUDGET.fix(fixed)
    assert weights[1].keys() == weights[2].keys()
    for k in weights[1]:
        np.testing.assert_array_equal(weights[1][k], weights[2][k], err_msg=k)


def test_the_cap_reaches_blas_libraries_loaded_later(monkeypatch):
    """A BLAS library loaded after the budget first capped BLAS (SciPy's own OpenBLAS, imported by the
    datasets) is capped too."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    budget = threads.CoreBudget(fixed=1)
    with budget.limit():
        pass
    seen = budget._controller
    monkeypatch.setitem(__import__("sys").modules, "vmem_test_new_module", object())  # an import happened
    with budget.limit():
        assert all(i["num_threads"] == 1 for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
    again = budget._controller
    assert again is not seen  # looked again after the import
    with budget.limit():
        pass
    assert budget._controller is again  # and not again without one


def test_more_threads_than_cores_in_the_environment_are_clamped_with_a_warning(monkeypatch):
    from vmem.threads import CoreBudget

    monkeypatch.setenv("VMEM_THREADS", "64")
    with pytest.warns(RuntimeWarning, match="VMEM_THREADS=64: this machine has 2 core"):
        budget = CoreBudget(ncores=2)
    assert budget.fixed == 2
