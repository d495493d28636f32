"""``Trainer.fit`` on a GPU (the CuPy stand-in): each batch's input gathered straight into pinned host memory on a
worker thread while the step before it runs (the executor's input ring), uploaded from there with no copy on
the host; the weights are those of the same run staging every batch, and nothing is left behind."""

from __future__ import annotations

import threading

import numpy as np

import vmem
from vmem.runtime.executor import Executor
from vmem.training import batches

from .test_cuda_standin import _vgg


def _fit(cupy, monkeypatch, ring: bool, graphs: str = "off") -> tuple[dict, list[bool], int]:
    rng = np.random.default_rng(0)
    train = vmem.data.Dataset(rng.standard_normal((40, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 40), 10)
    from_ring: list[bool] = []
    stage = Executor._stage

    def spy(self, r):
        stage(self, r)
        from_ring.append(
            bool(self._ring) and any(v.ctypes.data == r.batch[self._inputs[0][1]].ctypes.data for _, v in self._ring)
        )

    with monkeypatch.context() as patch:
        if not ring:
            patch.setattr(batches, "input_ring", lambda ex, train, part: None)
        patch.setattr(Executor, "_stage", spy)
        net = _vgg().init(seed=0)
        with vmem.device("cuda:0", memory="4MiB", math="exact", graphs=graphs) as dev:
            with vmem.Trainer(net, device=dev, policy="baseline", seed=0) as trainer:
                trainer.fit(train, epochs=2, batch_size=8, progress=False)
                in_use = dev.pinned.stats().in_use if dev.pinned is not None else 0
    return {k: v.copy() for k, v in net.params.items()}, from_ring, in_use


def test_fit_uploads_each_input_from_the_ring_and_trains_as_staging_does(cupy, monkeypatch):
    threads = threading.active_count()
    staged, plain, _ = _fit(cupy, monkeypatch, ring=False)
    assert not any(plain)
    ringed, from_ring, in_use = _fit(cupy, monkeypatch, ring=True)
    assert from_ring == [True] * 10  # five batches an epoch, each uploaded from where it was gathered
    assert in_use == 0  # the ring is given back at each epoch's end (before evaluation)
    assert threading.active_count() == threads  # the gathering thread ends with its epoch
    for k in staged:
        assert staged[k].tobytes() == ringed[k].tobytes(), k


def test_steps_replayed_as_graphs_stage_their_input(cupy, monkeypatch):
    """A graph bakes its upload's address: with graphs on, the ring is not used and each batch is staged."""
    _, from_ring, _ = _fit(cupy, monkeypatch, ring=True, graphs="on")
    assert from_ring and not any(from_ring)
