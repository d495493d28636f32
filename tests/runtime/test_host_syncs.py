"""A training step makes the host wait for the device only after it: the finite check is a device flag the
fused update reads, not a value the host reads midway. Counted on a fake device whose arrays count every
read of a value by the host (on a GPU, each is a synchronization): none between the step's first forward and
the end of its update, for every optimizer with a fused kernel; the fallback (an optimizer without one)
reads the flag once, and the count sees it."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from tests.runtime.test_executor import FakeDevice
from vmem.codecs import native
from vmem.optim import SGD, Adam, Optimizer
from vmem.runtime import DeviceParams, Executor
from vmem.runtime.update import Updates
from vmem.schedule.lower import lower

pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built")


class Counted(np.ndarray):
    """A device array: reading a value of it on the host is counted (a GPU would synchronize there)."""

    reads: list[str] = []

    def _read(self, how: str) -> None:
        Counted.reads.append(how)

    def __bool__(self):
        self._read("bool")
        return super().__bool__()

    def __float__(self):
        self._read("float")
        return super().__float__()

    def __int__(self):
        self._read("int")
        return super().__int__()

    def __index__(self):
        self._read("index")
        return super().__index__()

    def item(self, *args):
        self._read("item")
        return super().item(*args)

    def tolist(self):
        self._read("tolist")
        return super().tolist()


class CountingDevice(FakeDevice):
    """The fake device with counted arrays; ``reads_inside`` collects, per step, the host reads made before
    the step's first synchronization (while its schedule runs)."""

    def __init__(self):
        super().__init__(memory=128 << 20)
        self.synced = True
        self.reads_inside: list[list[str]] = []

    def view(self, block, shape, dtype):
        return super().view(block, shape, dtype).view(Counted)

    def begin(self):
        Counted.reads = []
        self.synced = False

    def synchronize(self):
        if not self.synced:
            self.reads_inside.append(list(Counted.reads))
            self.synced = True


class NoKernel(Optimizer):
    """Plain SGD without a fused kernel: the executor falls back to reading the flag on the host."""

    def update(self, xp, param, grad, state, step):
        param -= self.lr * grad


def _steps(optimizer, nan_at: int | None = None, steps: int = 3):
    dev = CountingDevice()
    net = vmem.models.get("vgg_cifar", image_size=16)
    net.init(0)
    program = net.build(4)
    plan = vmem.policies.get("vdnn-all", algos="memory").decide(program, dev.spec)
    schedule = lower(program, plan, optimizer.slots, dev.pool.alignment)
    specs = {f"{op.name}.{k}": s for op in program.ops for k, s in op.params.items()}
    params = DeviceParams(dev, schedule.persistent, specs, "float32")
    params.upload(net.params)
    ex = Executor(dev, schedule, params, vmem.nn.SoftmaxCrossEntropy(), optimizer)
    rng = np.random.default_rng(0)
    reports = []
    for step in range(1, steps + 1):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        if step == nan_at:
            x[0, 0, 0, 0] = np.nan
        dev.begin()
        reports.append(ex.run(x, rng.integers(0, 10, 4), train=True, rng=np.random.default_rng(step), step=step)[0])
    weights = params.download()
    params.release()
    return dev, reports, weights


@pytest.mark.parametrize(
    "make", [lambda: SGD(lr=0.05, momentum=0.9, weight_decay=1e-4), lambda: Adam(lr=1e-3)], ids=["sgd", "adam"]
)
def test_no_host_read_inside_a_step_with_a_fused_update(make):
    dev, reports, _ = _steps(make(), nan_at=2)
    assert len(dev.reads_inside) == 3 and all(reads == [] for reads in dev.reads_inside), dev.reads_inside
    assert [r.skipped for r in reports] == [False, True, False]  # the non-finite step is still skipped


def test_the_fallback_reads_the_flag_once_and_the_count_sees_it(monkeypatch):
    finite = Updates.finite
    monkeypatch.setattr(Updates, "finite", lambda self, r: finite(self, r).view(Counted))  # the flag counted
    dev, reports, _ = _steps(NoKernel(lr=0.05))
    assert all(reads == ["item"] for reads in dev.reads_inside), dev.reads_inside


def test_the_fused_update_gives_the_weights_of_the_per_parameter_update(monkeypatch):
    """Bitwise, over three steps with a skipped one among them (SGD with momentum, weight decay and
    Nesterov; Adam with weight decay)."""
    for make in (lambda: SGD(lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=True), lambda: Adam(weight_decay=0.01)):
        _, fused_reports, fused = _steps(make(), nan_at=2)
        with monkeypatch.context() as m:
            m.setattr(Updates, "fused", lambda self, step: None)  # the optimizer's own NumPy update
            _, plain_reports, plain = _steps(make(), nan_at=2)
        assert [r.skipped for r in fused_reports] == [r.skipped for r in plain_reports] == [False, True, False]
        assert fused.keys() == plain.keys()
        for k in fused:
            assert fused[k].tobytes() == plain[k].tobytes(), k
