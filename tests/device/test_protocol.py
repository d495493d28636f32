"""One suite over every device (as RMM runs one suite over every memory resource): what the Device
protocol promises, checked on the CPU device and a simulated GPU; the CUDA device joins in tests/gpu/.

A device that holds no data (``holds_data`` False) must refuse data operations with a DeviceError that
names it, and still do everything planning needs: a pool of its capacity, streams, events, close().
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import vmem
from vmem.device import Device
from vmem.errors import DeviceError, OutOfDeviceMemory
from vmem.pool import PinnedHostPool

MiB = 1 << 20
DEVICES = {
    "cpu": lambda: vmem.device("cpu", memory="32MiB", pinned_memory="8MiB"),
    "sim": lambda: vmem.device("sim:titan-x", memory="32MiB"),
}


@pytest.fixture(params=sorted(DEVICES))
def dev(request):
    d = DEVICES[request.param]()
    yield d
    d.close()


def test_it_is_a_device_with_a_spec_and_a_pool_of_its_capacity(dev):
    assert isinstance(dev, Device)
    assert dev.kind in ("cpu", "sim", "cuda") and dev.name
    assert dev.pool.capacity == dev.spec.memory == 32 * MiB
    assert dev.spec.kind == dev.kind
    assert isinstance(dev.holds_data, bool) and dev.holds_data == (dev.kind != "sim")
    assert dev.xp is not None  # a simulated device, which holds no data, names NumPy (shapes and dtypes)
    assert not dev.closed


def test_the_pool_allocates_frees_and_refuses_beyond_capacity_unchanged(dev):
    cs = dev.compute_stream
    a = dev.pool.allocate(MiB, cs, "feature_maps")
    assert dev.pool.in_use == MiB and dev.pool.usage()["feature_maps"] == MiB
    before = dev.pool.snapshot()
    with pytest.raises(OutOfDeviceMemory):
        dev.pool.allocate(64 * MiB, cs, "workspace")
    assert dev.pool.snapshot() == before
    dev.pool.free(a, cs)
    dev.synchronize()
    assert dev.pool.in_use == 0


def test_streams_record_events_that_complete_after_a_host_wait(dev):
    for stream in (dev.compute_stream, dev.memory_stream):
        event = stream.record()
        event.synchronize()
        assert event.query()
        stream.wait(dev.compute_stream.record())
        stream.synchronize()
        assert stream.query()


def test_link_stats_count_both_directions(dev):
    stats = dev.link_stats()
    assert set(stats) == {"d2h", "h2d"} and all({"bytes", "seconds"} <= set(s) for s in stats.values())


def test_close_is_idempotent_and_leaves_no_thread(dev):
    before = {t for t in threading.enumerate() if t.name.startswith("vmem-")}
    dev.close()
    dev.close()
    assert dev.closed
    assert not [
        t.name for t in threading.enumerate() if t.name.startswith("vmem-") and t not in before and t.is_alive()
    ]


def test_data_operations(dev):
    """A device that holds data views blocks as arrays and copies both ways; one that does not refuses."""
    block = dev.pool.allocate(4096, None, "other")
    if not dev.holds_data:
        assert dev.pinned is None
        for call in (
            lambda: dev.view(block, (16,), np.float32),
            lambda: dev.reserve_pinned(4096),
            lambda: dev.copy_now(None, None, "d2h"),
            lambda: dev.copy_to_host(None, None),
            lambda: dev.copy_to_device(None, None),
        ):
            with pytest.raises(DeviceError, match=dev.name):
                call()
        dev.pool.free(block)
        return
    pinned = dev.reserve_pinned(8192)
    assert isinstance(pinned, PinnedHostPool) and pinned.capacity >= 8192
    host_block = pinned.allocate(4096)
    x = dev.view(block, (1024,), np.float32)
    h = dev.host_view(host_block, (1024,), np.float32)
    h[:] = np.arange(1024, dtype=np.float32)
    dev.copy_to_device(x, h)
    back = dev.host_view(pinned.allocate(4096), (1024,), np.float32)
    dev.copy_to_host(back, x)
    dev.synchronize()
    assert np.array_equal(back, np.arange(1024, dtype=np.float32))
    dev.copy_now(back, x, "d2h")
    assert dev.link_stats()["d2h"]["bytes"] >= 2 * 4096
    dev.pool.free(block)


class _LaterEvent:
    """An event whose copy is still running when its buffer is freed, and done by the next step."""

    def __init__(self):
        self.done = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.done = True


def test_reserving_pinned_memory_before_a_step_coalesces_the_last_steps_returns(dev):
    """A step's offloads fill the pinned pool exactly; the last step's buffers come back in another order,
    one of them only once its copy has completed. Before the next step they are one free block again, so
    the same sizes fit in the same order (else the first takes the middle and the second finds no room)."""
    if not dev.holds_data:
        pytest.skip("a simulated device holds no data")
    pinned = dev.reserve_pinned(4096)
    sizes = (pinned.capacity // 4, pinned.capacity - pinned.capacity // 4)
    first, second = (pinned.allocate(n) for n in sizes)
    pinned.free(second)
    event = _LaterEvent()
    pinned.free(first, event)  # its prefetch still running at the end of the backward
    event.done = True
    pinned = dev.reserve_pinned(sum(sizes))
    blocks = [pinned.allocate(n) for n in sizes]
    assert pinned.in_use == pinned.capacity
    for b in blocks:
        pinned.free(b)


def test_a_trainer_runs_only_where_data_is_held(dev):
    net = vmem.models.get("digits_cnn")
    if not dev.holds_data:
        with pytest.raises(DeviceError, match="cannot train"):
            vmem.Trainer(net, device=dev)
        return
    with vmem.Trainer(net, device=dev, seed=0) as trainer:
        report = trainer.step(np.zeros((4,) + net.input_shape, np.float32), np.zeros(4, int))
    assert np.isfinite(report.loss) and report.peak_bytes > 0
