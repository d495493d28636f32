"""After close(), no thread vmem started is alive, with or without codecs: the stream workers, the
codec kernels' workers and the link thread of transfers through a codec."""

from __future__ import annotations

import threading

import numpy as np

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
