"""The CPU device: real copies on the memory stream, throttling, poisoning, clean shutdown."""

from __future__ import annotations

import time

import numpy as np
import pytest

import vmem
from tests.conftest import stream_threads
from vmem.device import CpuDevice, Device
from vmem.errors import DeviceError, OutOfDeviceMemory


def test_device_factory_and_protocol():
    with vmem.device("cpu", memory="128MiB") as dev:
        assert isinstance(dev, Device)
        assert dev.spec.memory == 128 * 2**20 and dev.spec.kind == "cpu"
        assert dev.xp is np
        assert vmem.device(dev) is dev
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        vmem.device("tpu")
    from vmem.device.cuda import unavailable

    if unavailable() is not None:  # where there is a GPU, tests/gpu/ covers cuda:0
        with pytest.raises(DeviceError, match="cuda"):
            vmem.device("cuda:0")
    with pytest.raises(DeviceError, match="options are memory"):
        vmem.device("cpu", memroy="1GiB")
    with pytest.raises(ValueError, match=r"memory='12 gigs'"):
        vmem.device("cpu", memory="12 gigs")
    with pytest.raises(ValueError, match="pcie_gbps"):
        vmem.device("cpu", pcie_gbps=-1)


def test_offload_and_prefetch_round_trip_while_compute_writes_elsewhere(cpu):
    rng = np.random.default_rng(0)
    n = 1 << 20
    x_block = cpu.pool.allocate(4 * n, cpu.compute_stream, "feature_maps")
    y_block = cpu.pool.allocate(4 * n, cpu.compute_stream, "feature_maps")
    x = cpu.view(x_block, (n,), np.float32)
    y = cpu.view(y_block, (n,), np.float32)
    expected = rng.standard_normal(n).astype(np.float32)
    cpu.compute_stream.launch(np.copyto, x, expected)  # produce X on compute
    produced = cpu.compute_stream.record()
    for i in range(50):  # compute keeps writing elsewhere while the copies run
        cpu.compute_stream.launch(np.multiply, expected, float(i), out=y)

    host_block = cpu.pinned.allocate(4 * n)
    host = cpu.host_view(host_block, (n,), np.float32)
    mem = cpu.memory_stream
    mem.wait(produced)
    cpu.copy_to_host(host, x)  # offload on the memory stream
    offloaded = mem.record()
    cpu.compute_stream.wait(offloaded)
    cpu.pool.free(x_block, cpu.compute_stream)  # X released after the offload, in stream order
    z_block = cpu.pool.allocate(4 * n, cpu.memory_stream, "feature_maps")
    z = cpu.view(z_block, (n,), np.float32)
    cpu.copy_to_device(z, host)  # prefetch back
    cpu.pinned.free(host_block, mem.record())
    cpu.synchronize()
    assert z.tobytes() == expected.tobytes()
    assert np.array_equal(y, expected * 49)
    cpu.pool.free(y_block)
    cpu.pool.free(z_block)
    cpu.pool.reclaim(wait=True)
    assert cpu.pool.stats().in_use == 0 and len(cpu.pool.snapshot()["blocks"]) == 1
    cpu.pinned.reclaim(wait=True)
    assert cpu.pinned.stats().in_use == 0


def test_poisoning_catches_a_use_after_free():
    with vmem.device("cpu", memory="16MiB", poison=True) as dev:
        block = dev.pool.allocate(4096, dev.compute_stream, "feature_maps")
        x = dev.view(block, (1024,), np.float32)
        x[:] = 1.0
        stale = x  # a bug: the array outlives its block
        dev.pool.free(block, dev.compute_stream)
        out = np.empty(1024, np.float32)
        dev.compute_stream.launch(np.multiply, stale, 2.0, out=out)  # use after free, in stream order
        dev.synchronize()
        assert np.isnan(out).all()


def test_without_poisoning_the_same_bug_goes_unnoticed():
    with vmem.device("cpu", memory="16MiB") as dev:
        block = dev.pool.allocate(4096, dev.compute_stream, "feature_maps")
        x = dev.view(block, (1024,), np.float32)
        x[:] = 1.0
        dev.pool.free(block, dev.compute_stream)
        dev.synchronize()
        assert (x == 1.0).all()


def test_throttled_copies_never_beat_the_link():
    rate = 0.5  # GB/s
    with vmem.device("cpu", memory="16MiB", pcie_gbps=rate, pinned_memory="8MiB") as dev:
        n = 4 * 2**20
        block = dev.pool.allocate(n, category="feature_maps")
        host_block = dev.pinned.allocate(n)
        src = dev.view(block, (n,), np.uint8)
        dst = dev.host_view(host_block, (n,), np.uint8)
        src[:] = 7
        t0 = time.perf_counter()
        dev.copy_to_host(dst, src)
        dev.synchronize()
        seconds = time.perf_counter() - t0
        assert seconds >= n / (rate * 1e9)
        assert (dst == 7).all()
        assert dev.link_stats()["d2h"]["bytes"] == n


def test_pageable_copies_are_staged_and_synchronous(cpu):
    block = cpu.pool.allocate(3 << 20, category="feature_maps")
    src = cpu.view(block, (3 << 20,), np.uint8)
    src[:] = np.arange(3 << 20, dtype=np.uint64).astype(np.uint8)
    dst = np.empty(3 << 20, np.uint8)  # ordinary (pageable) host memory
    cpu.copy_to_host(dst, src)
    assert cpu.memory_stream.query()  # the host waited
    assert np.array_equal(dst, src)


def test_copies_check_their_arguments(cpu):
    block = cpu.pool.allocate(4096)
    view = cpu.view(block, (1024,), np.float32)
    with pytest.raises(ValueError, match="does not match"):
        cpu.copy_to_host(np.empty(10, np.float32), view)
    with pytest.raises(ValueError, match="not a view of this device"):
        cpu.copy_to_host(np.empty(1024, np.float32), np.ones(1024, np.float32))


def test_out_of_device_memory_through_the_device(cpu):
    with pytest.raises(OutOfDeviceMemory, match="memory="):
        cpu.pool.allocate(1 << 30, category="feature_maps")


def test_close_stops_every_thread():
    before = len(stream_threads())
    dev = CpuDevice(memory="8MiB")
    dev.compute_stream.launch(time.sleep, 0.01)
    assert len(stream_threads()) == before + 2
    dev.close()
    assert len(stream_threads()) == before
    dev.close()  # idempotent


def test_errors_in_device_work_surface_at_synchronize(cpu):
    cpu.memory_stream.launch(lambda: [][1])
    with pytest.raises(IndexError):
        cpu.synchronize()
    cpu.synchronize()


def test_poisoning_is_ordered_before_the_free_event():
    """A block freed on one stream and taken by another after the free's event must not be poisoned
    afterwards: the poison fill is enqueued before the event is recorded."""
    import threading

    with vmem.device("cpu", memory="1MiB", poison=True) as dev:
        gate = threading.Event()
        ms, cs = dev.memory_stream, dev.compute_stream
        block = dev.pool.allocate(dev.pool.capacity, ms, "feature_maps")
        ms.launch(gate.wait)  # the memory stream is busy: the poison fill cannot run yet
        dev.pool.free(block, ms)
        gate.set()
        again = dev.pool.allocate(dev.pool.capacity, cs, "feature_maps")  # waits for the free's event
        view = dev.view(again, (16,), np.float32)
        view[:] = 1.0  # the host writes after the allocation returned
        dev.synchronize()
        assert (view == 1.0).all()
