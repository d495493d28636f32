"""Profiling through a device (the path a GPU takes: arrays in the device's pool, random data drawn by the
device's generator, work on its compute stream), run here on the CPU device."""

from __future__ import annotations

import numpy as np

import vmem
from vmem.costs import profile


def test_a_profile_through_the_device_measures_every_pass_and_leaves_the_pool_empty():
    net = vmem.models.get("vgg_cifar", image_size=16)
    program = net.build(4, net.input_shape, "float32")
    with vmem.device("cpu", memory="128MiB") as dev:
        program = dev.catalog(program)
        prof = profile(program, device=dev, copy_gbps=10.0, repeats=1)
        stats = dev.pool.stats()
        assert stats.in_use == 0 and stats.count == 0 and stats.allocations == stats.frees > 0
    for op in program.ops:
        if op.kind == "conv":
            for pass_, algos in op.algorithms.items():
                for algo in algos:
                    t = prof.times[(op.name, pass_, algo)]
                    assert np.isfinite(t) and t >= 0, (op.name, pass_, algo)
            assert prof.times[(op.name, "forward", op.algorithms["forward"][0])] > 0
        else:
            assert (op.name, "forward", None) in prof.times and (op.name, "backward", None) in prof.times
    assert prof.times[("loss", "forward", None)] > 0 and prof.elementwise_gbps > 0


class _FoundConv:
    """A convolution backend that, like cuDNN, times its algorithms itself (``find``); its passes only
    touch their outputs. Records the calls."""

    def __init__(self, times: dict[str, dict[str, float]]):
        self.times = times
        self.calls: list[tuple[str, object]] = []

    def find(self, layer, pass_, x, w, y, ws):
        self.calls.append(("find", pass_))
        return [(name, t, 0) for name, t in sorted(self.times[pass_].items(), key=lambda kv: kv[1])]

    def forward(self, layer, ctx, x, w, y):
        self.calls.append(("forward", ctx.algo))
        y[...] = 0

    def backward(self, layer, ctx, dy, x, w, dx, dw):
        self.calls.append(("backward", ctx.algo))
        dw[...] = 0
        if dx is not None:
            dx[...] = 0


def _profile_with(backend, monkeypatch):
    """The profile of a small network through the CPU device with ``backend`` as its convolutions, which
    gives every pass's algorithms, in catalog order, times 1 + i from the last (the last is fastest)."""
    net = vmem.models.get("vgg_cifar", image_size=16)
    with vmem.device("cpu", memory="128MiB") as dev:
        program = dev.catalog(net.build(2, net.input_shape, "float32"))
        names = next(op for op in program.ops if op.kind == "conv").algorithms
        fake = backend({p: {a: 1.0 + i for i, a in enumerate(reversed(algos))} for p, algos in names.items()})
        monkeypatch.setattr(type(dev), "conv_backend", property(lambda self: fake), raising=False)
        return profile(program, device=dev, copy_gbps=10.0, repeats=1), fake, program


def test_a_backend_that_times_its_own_algorithms_is_asked_once_per_pass(monkeypatch):
    """cuDNN's search ranks the algorithms; the fastest of each pass is then timed as the layer runs it,
    and the others keep their distance from it."""
    prof, fake, program = _profile_with(_FoundConv, monkeypatch)
    convs = [op for op in program.ops if op.kind == "conv"]
    conv, names, slow = convs[0], convs[0].algorithms, fake.times
    assert sum(1 for c in fake.calls if c[0] == "find") == 3 * len(convs)
    for pass_, algos in names.items():
        fastest = algos[-1]  # the fake gives the last the shortest time
        got = {a: prof.times[(conv.name, pass_, a)] for a in algos}
        assert min(got, key=got.get) == fastest
        for a in algos:  # cuDNN's distances kept: (1 + i) - 1 apart from the fastest
            assert abs((got[a] - got[fastest]) - (slow[pass_][a] - slow[pass_][fastest])) < 1e-9
    assert ("forward", names["forward"][-1]) in fake.calls
    assert ("backward", (names["backward_data"][-1], names["backward_filter"][-1])) in fake.calls


class _RankedConv(_FoundConv):
    """Like cuDNN, also ranks its algorithms without running them (``heuristic``)."""

    def heuristic(self, layer, pass_, x_shape, y_shape):
        self.calls.append(("heuristic", pass_))
        return sorted(self.times[pass_], key=self.times[pass_].get)


def test_a_backend_with_heuristics_has_only_its_best_ranked_algorithms_timed(monkeypatch):
    """Only the TOP algorithms of cuDNN's ranking run (the others, some of them seconds long on a large
    batch, are not offered); cuDNN's search is not called."""
    from vmem.costs import measured

    monkeypatch.setattr(measured, "TOP", 1)
    prof, fake, program = _profile_with(_RankedConv, monkeypatch)
    conv = next(op for op in program.ops if op.kind == "conv")
    names = conv.algorithms
    assert not any(c[0] == "find" for c in fake.calls)
    for pass_, algos in names.items():
        got = {a: prof.times[(conv.name, pass_, a)] for a in algos}
        assert np.isfinite(got[algos[-1]]) and all(got[a] == float("inf") for a in algos[:-1]), (pass_, got)
    used = {c[1] for c in fake.calls if c[0] in ("forward", "backward")}
    assert used == {names["forward"][-1], (names["backward_data"][-1], names["backward_filter"][-1])}
