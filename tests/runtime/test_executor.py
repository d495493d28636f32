"""The executor on a fake device: a pool over a host arena and synchronous virtual streams, nothing else.

It checks that the executor needs only what the Device protocol declares (the fake implements nothing
more), carries a schedule out exactly as on the CPU device (bitwise), and rolls a failed step back."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest

import vmem
from vmem import threads
from vmem.errors import DeviceError
from vmem.device.hostconv import HostConv
from vmem.nn.ops import HostOps
from vmem.optim import SGD
from vmem.pool import DevicePool, HostArena, PinnedHostPool
from vmem.runtime import DeviceParams, Executor
from vmem.schedule.lower import lower
from vmem.schedule.steps import Update
from vmem.streams import VirtualStream
from vmem.device.spec import DeviceSpec


class FakeDevice:
    """The Device protocol and nothing more; work runs at once on the calling thread."""

    kind = "cpu"
    holds_data = True
    xp = np
    conv_backend = HostConv()  # the CPU device's convolutions
    ops = HostOps()  # the CPU device's pieces, run in turn: the same bits
    asynchronous = False
    graphs = False
    nchw_inputs = False

    def __init__(self, memory: int = 64 << 20):
        self.name = "fake"
        self.spec = DeviceSpec(name="fake", kind="cpu", memory=memory)
        self.pool = DevicePool(memory, 256, HostArena, name="fake")
        self.compute_stream = VirtualStream("compute", execute=True)
        self.memory_stream = VirtualStream("memory", execute=True)
        self.pinned = PinnedHostPool(16 << 20, 256, name="fake pinned")
        self.moved = {"d2h": 0, "h2d": 0}
        self.closed = False

    def catalog(self, program):
        return program

    def reserve_pinned(self, nbytes):
        assert nbytes <= self.pinned.capacity
        return self.pinned

    def view(self, block, shape, dtype):
        return self.pool.view(block, shape, dtype)

    def host_view(self, block, shape, dtype):
        return self.pinned.view(block, shape, dtype)

    def copy_to_host(self, dst, src, stream=None):
        self.copy_now(dst, src, "d2h")

    def copy_to_device(self, dst, src, stream=None):
        self.copy_now(dst, src, "h2d")

    def copy_now(self, dst, src, direction):
        np.copyto(dst, src, casting="no")
        self.moved[direction] += dst.nbytes

    def runs_codec(self, codec):
        return True

    def device_array(self, x):
        return None

    def release_cached(self):
        pass

    def readings(self):
        return {"used_bytes": self.pool.in_use}  # stands for NVML's

    def link_stats(self):
        return {d: {"bytes": b, "seconds": 0.0} for d, b in self.moved.items()}

    def synchronize(self):
        pass

    def step_scope(self):
        return threads.BUDGET.limit()  # the same BLAS threads as the CPU device: comparable bit for bit

    def dispatch_scope(self):
        return contextlib.nullcontext()

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_steps(device, policy: str, steps: int = 3, buckets: int = 1, nan: bool = False):
    net = vmem.models.get("vgg_cifar", image_size=16)
    net.init(0)
    program = net.build(4)
    # the leanest algorithms: decided here without the planner, which would downgrade the fastest to fit
    plan = vmem.policies.get(policy, algos="memory").decide(program, device.spec)
    schedule = lower(program, plan, ("momentum",), device.pool.alignment)
    if buckets > 1:  # the one update split into buckets of parameters, each its own step
        names = [f"{op.name}.{k}" for op, k, s in program.owned_params() if s.trainable]
        parts = [tuple(names[i::buckets]) for i in range(buckets)]
        at = next(i for i, st in enumerate(schedule.steps) if type(st) is Update)
        steps_ = schedule.steps[:at] + [Update(p) for p in parts] + schedule.steps[at + 1 :]
        schedule = dataclasses.replace(schedule, steps=steps_)
    specs = {f"{op.name}.{k}": s for op in program.ops for k, s in op.params.items()}
    params = DeviceParams(device, schedule.persistent, specs, "float32")
    params.upload(net.params)
    ex = Executor(device, schedule, params, vmem.nn.SoftmaxCrossEntropy(), SGD(lr=0.05, momentum=0.9))
    rng = np.random.default_rng(0)
    reports = []
    for step in range(1, steps + 1):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        if nan:
            x[0, 0, 0, 0] = np.nan
        reports.append(ex.run(x, rng.integers(0, 10, 4), train=True, rng=np.random.default_rng(step), step=step)[0])
    weights = params.download()
    params.release()
    return weights, reports, ex


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all", "vdnn-all:codec=zvc", "gist"])
def test_a_fake_device_gives_the_cpu_devices_weights_bitwise(policy):
    fake = FakeDevice()
    got, reports, _ = run_steps(fake, policy)
    with vmem.device("cpu", memory="64MiB") as cpu:
        want, _, _ = run_steps(cpu, policy)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert fake.pool.in_use == 0 and fake.pinned.in_use == 0
    if policy.startswith("vdnn"):
        assert reports[-1].offloaded_bytes > 0 and fake.moved["d2h"] > 0


class _UploadWatcher(FakeDevice):
    """Records, for each host-to-device copy in a step (after the first reserve_pinned: the weights'
    upload before it is a one-off pageable copy), whether its source lies in the pinned arena."""

    def __init__(self):
        super().__init__()
        self.uploads = []
        self.stepping = False

    def reserve_pinned(self, nbytes):
        self.stepping = True
        return super().reserve_pinned(nbytes)

    def copy_to_device(self, dst, src, stream=None):
        if not self.stepping:
            super().copy_to_device(dst, src, stream)
            return
        lo = self.pinned.arena.buffer.__array_interface__["data"][0]
        start = src.__array_interface__["data"][0]
        self.uploads.append((lo <= start and start + src.nbytes <= lo + self.pinned.capacity, src.shape))
        super().copy_to_device(dst, src, stream)


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all"])
def test_the_batch_is_uploaded_from_pinned_memory(policy):
    """A copy from pageable memory waits for all earlier work (CUDA's rule): a layer-wise schedule uploads
    the labels just before the loss, so the batch is staged in pinned memory when the step starts, and
    the pinned pool is empty again after the step."""
    fake = _UploadWatcher()
    run_steps(fake, policy, steps=2)
    assert fake.uploads and all(pinned for pinned, _ in fake.uploads), fake.uploads
    assert {shape for _, shape in fake.uploads} == {(4,), (4, 16, 16, 3)}  # labels and input
    assert fake.pinned.in_use == 0


def test_a_failed_step_leaves_the_pool_and_the_pinned_pool_as_they_were():
    fake = FakeDevice()
    net = vmem.models.get("vgg_cifar", image_size=16)
    net.init(0)
    program = net.build(4)
    schedule = lower(program, vmem.policies.get("vdnn-all").decide(program, fake.spec))
    specs = {f"{op.name}.{k}": s for op in program.ops for k, s in op.params.items()}
    params = DeviceParams(fake, schedule.persistent, specs, "float32")
    ex = Executor(fake, schedule, params, vmem.nn.SoftmaxCrossEntropy(), SGD(lr=0.05))
    before, pinned_before = fake.pool.snapshot(), fake.pinned.in_use
    layer = program.ops[5].layer

    def broken(*args):
        raise RuntimeError("a layer failed")

    layer.forward = broken
    with pytest.raises(RuntimeError, match="a layer failed"):
        ex.run(np.zeros((4, 3, 16, 16), np.float32), np.zeros(4, int), train=True, rng=np.random.default_rng(0))
    fake.pool.reclaim(wait=True)
    assert fake.pool.snapshot() == before and fake.pinned.in_use == pinned_before


def test_the_executor_refuses_a_device_that_holds_no_data():
    program = vmem.models.get("digits_cnn").build(2)
    sim = vmem.device("sim:titan-x")
    schedule = lower(program, vmem.policies.get("baseline").decide(program, sim.spec))
    with pytest.raises(DeviceError, match="holds no data"):
        Executor(sim, schedule, params=None)


def test_the_devices_readings_are_sampled_into_the_timeline():
    fake = FakeDevice()
    _, reports, _ = run_steps(fake, "baseline", steps=1)
    samples = reports[-1].timeline.samples
    assert len(samples) == 2 and samples[0][0] <= samples[1][0]
    assert all("used_bytes" in readings for _, readings in samples)
    trace = reports[-1].timeline.chrome_trace()
    assert any(e.get("name") == "device readings" for e in trace["traceEvents"])


def test_spans_timed_by_events_on_an_asynchronous_device():
    """Where work runs after launch returns (a GPU), spans are timed by events on the streams and a
    stream waits for another without the host. The CPU device's streams have the same events: with
    ``asynchronous`` set, the step gives the same weights, a span for every op, in stream order, within
    the step, and its waits."""
    results = {}
    for asynchronous in (False, True):
        with vmem.device("cpu", memory="64MiB") as dev:
            dev.asynchronous = asynchronous
            weights, reports, _ = run_steps(dev, "vdnn-all", steps=2)
        results[asynchronous] = (weights, reports)
    (want, plain), (got, evented) = results[False], results[True]
    assert all(np.array_equal(want[k], got[k]) for k in want)
    for a, b in zip(plain, evented):
        assert a.peak_bytes == b.peak_bytes and a.offloaded_bytes == b.offloaded_bytes
        names = lambda r, stream: sorted(s.name for s in r.timeline.spans if s.stream == stream)  # noqa: E731
        assert names(a, "compute") == names(b, "compute") and names(a, "memory") == names(b, "memory")
        origin, end = b.timeline.origin, b.timeline.origin + b.seconds
        compute = b.timeline.by_stream("compute")
        assert all(origin <= s.start <= s.end <= end for s in b.timeline.spans)
        assert all(later.start >= earlier.end for earlier, later in zip(compute, compute[1:]))  # in order
        assert any(s.kind == "wait" for s in compute) and b.timeline.waiting == []
        assert min(s.in_use for s in compute) <= b.average_bytes <= max(s.in_use for s in compute)


def test_updating_the_parameters_in_buckets_gives_the_same_weights_bit_for_bit():
    with vmem.device("cpu", memory="64MiB") as cpu:
        whole, _, _ = run_steps(cpu, "vdnn-all")
        split, reports, _ = run_steps(cpu, "vdnn-all", buckets=3)
    assert all(np.array_equal(whole[k], split[k]) for k in whole)
    assert not any(r.skipped for r in reports)


def test_a_step_that_is_not_finite_updates_no_bucket():
    net = vmem.models.get("vgg_cifar", image_size=16)
    net.init(0)
    with vmem.device("cpu", memory="64MiB") as cpu:
        weights, reports, _ = run_steps(cpu, "vdnn-all", steps=1, buckets=3, nan=True)
    assert reports[0].skipped
    assert all(np.array_equal(weights[k], net.params[k]) for k in weights)
