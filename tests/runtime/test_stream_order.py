"""Writes that must follow the compute stream's order: the weights and optimizer state a Trainer uploads
(at the start, after ``load``) and the gradients' zero-fill go through the compute stream, never around it;
the loss reaches the host through a copy enqueued there, read once the step has run."""

from __future__ import annotations

import threading
import time

import numpy as np

import vmem
from vmem.runtime import DeviceParams
from vmem.schedule import Key, Kind
from vmem.schedule.lower import persistent_buffers

from .test_executor import FakeDevice, run_steps


def _params(dev, net):
    program = net.build(1)
    return DeviceParams(dev, persistent_buffers(program, ("momentum",)), net.param_specs(), "float32")


def _snapshot_after(stream, view, seconds: float) -> dict:
    """Enqueue on ``stream``: wait ``seconds``, then copy ``view``; the copy, once the stream gets there."""
    seen: dict = {}

    def late() -> None:
        time.sleep(seconds)
        seen["value"] = np.array(view)

    stream.launch(late)
    return seen


def test_an_upload_waits_for_the_work_already_on_the_compute_stream():
    net = vmem.models.get("digits_cnn")
    net.init(0)
    with vmem.device("cpu", memory="16MiB") as dev:
        params = _params(dev, net)
        params.upload(net.params)
        name = next(iter(net.params))
        view = params.views[Key(Kind.WEIGHT, name)]
        old = np.array(net.params[name])
        seen = _snapshot_after(dev.compute_stream, view, 0.2)  # a step still reading the weights
        params.upload({k: v + 1 for k, v in net.params.items()})
        dev.synchronize()
        assert np.array_equal(seen["value"], old)  # the step read the weights it was given
        assert np.array_equal(np.array(view), old + 1)
        params.release()


def test_loading_optimizer_state_waits_for_the_compute_stream_too():
    net = vmem.models.get("digits_cnn")
    net.init(0)
    with vmem.device("cpu", memory="16MiB") as dev:
        params = _params(dev, net)
        state = params.optimizer_state()
        name = next(iter(state))
        param, _, slot = name.rpartition(":")
        view = params.views[Key(Kind.OPT_STATE, param, slot)]
        seen = _snapshot_after(dev.compute_stream, view, 0.2)
        params.load_optimizer_state({k: np.full_like(v, 3.0) for k, v in state.items()})
        dev.synchronize()
        assert not seen["value"].any() and (np.array(view) == 3.0).all()  # zero-filled first, in order
        params.release()


class _AsyncFake(FakeDevice):
    """A device whose device-to-host copies land only when its streams are synchronized (as a GPU's
    asynchronous copies do): a value read on the host before then is stale."""

    asynchronous = True

    def __init__(self):
        super().__init__()
        self.later = []
        self.lock = threading.Lock()

    def copy_now(self, dst, src, direction):
        if direction == "d2h":
            with self.lock:
                self.later.append((dst, np.array(src)))
            self.moved[direction] += dst.nbytes
            return
        super().copy_now(dst, src, direction)

    def synchronize(self):
        with self.lock:
            for dst, value in self.later:
                np.copyto(dst, value)
            self.later.clear()


def test_the_loss_is_read_once_the_step_has_run():
    want = [r.loss for r in run_steps(FakeDevice(), "baseline", steps=2)[1]]
    got = [r.loss for r in run_steps(_AsyncFake(), "baseline", steps=2)[1]]
    assert np.isfinite(want).all() and got == want
