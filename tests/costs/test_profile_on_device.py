"""Profiling through a device (the path a GPU takes: arrays in the device's pool, random data drawn by the
device's generator, work on its compute stream), run here on the CPU device."""

from __future__ import annotations

import numpy as np
import pytest

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

    ranked_top = 3

    def catalog(self, program):
        return program

    def heuristic(self, layer, pass_, x_shape, y_shape, dtype="float32"):
        return []  # no ranking of its own: a profile times every algorithm through find

    def find(self, layer, pass_, x, w, y, ws):
        self.calls.append(("find", pass_))
        return [(name, t, 0) for name, t in sorted(self.times[pass_].items(), key=lambda kv: kv[1])]

    def forward(self, layer, ctx, x, w, y, b=None):
        self.calls.append(("forward", ctx.algo))
        y[...] = 0

    def backward(self, layer, ctx, dy, x, w, dx, dw, db=None):
        if db is not None:
            db[...] = 0
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

    ranked_top = 1  # only the best of its ranking is timed

    def heuristic(self, layer, pass_, x_shape, y_shape, dtype="float32"):
        self.calls.append(("heuristic", pass_))
        return sorted(self.times[pass_], key=self.times[pass_].get)


def test_a_backend_with_heuristics_has_only_its_best_ranked_algorithms_timed(monkeypatch):
    """Only the backend's ``ranked_top`` algorithms of its ranking run (the others, some of them seconds long
    on a large batch, are not offered); cuDNN's search is not called."""
    prof, fake, program = _profile_with(_RankedConv, monkeypatch)
    conv = next(op for op in program.ops if op.kind == "conv")
    names = conv.algorithms
    assert not any(c[0] == "find" for c in fake.calls)
    for pass_, algos in names.items():
        got = {a: prof.times[(conv.name, pass_, a)] for a in algos}
        assert np.isfinite(got[algos[-1]]) and all(got[a] == float("inf") for a in algos[:-1]), (pass_, got)
    used = {c[1] for c in fake.calls if c[0] in ("forward", "backward")}
    assert used == {names["forward"][-1], (names["backward_data"][-1], names["backward_filter"][-1])}


def _peak_during(dev, fn):
    """``fn()``'s result and the most the device's pool held while it ran (the pool's own statistic)."""
    dev.pool.reset_peak()
    result = fn()
    return result, dev.pool.peak


def test_in_a_tight_budget_the_profile_stays_inside_it_and_says_what_it_measured_at_a_smaller_batch():
    net = vmem.models.get("digits_vgg")
    program = net.build(32, net.input_shape, "float32")
    with vmem.device("cpu", memory="1MiB") as dev:
        prof, peak = _peak_during(dev, lambda: profile(dev.catalog(program), device=dev, copy_gbps=10.0, repeats=1))
        assert peak <= dev.pool.capacity
        stats = dev.pool.stats()
        assert stats.in_use == 0 and stats.count == 0
    smaller = [n for n in prof.notes if "measured at batch" in n]
    assert smaller, prof.notes  # some layers' buffers do not fit at batch 32 in 1 MiB
    name = smaller[0].split(":")[0]
    assert all(np.isfinite(t) and t > 0 for (op, _, _), t in prof.times.items() if op == name)
    assert any("element-wise bandwidth" in n for n in prof.notes)  # its 2 x 16 MiB probe is sized down


def test_an_op_measured_at_a_smaller_batch_takes_about_its_scaled_time():
    net = vmem.models.get("digits_cnn")
    program = net.build(64, net.input_shape, "float32")
    with vmem.device("cpu", memory="64MiB") as roomy:
        full = profile(roomy.catalog(program), device=roomy, copy_gbps=10.0, repeats=3)
    op = max((o for o in program.ops if o.kind == "conv"), key=lambda o: program.tensors[o.output].nbytes)
    need = 4 * program.tensors[op.output].nbytes  # x, y, dy, dx at least
    with vmem.device("cpu", memory=max(need // 2, 1 << 16)) as tight:
        half = profile(tight.catalog(program), device=tight, copy_gbps=10.0, repeats=3)
    assert any(n.startswith(f"{op.name}: measured at batch") for n in half.notes), half.notes
    algo = op.algorithms["forward"][0]
    ratio = half.times[(op.name, "forward", algo)] / full.times[(op.name, "forward", algo)]
    assert 0.2 < ratio < 5  # the same order: scaled, not the smaller batch's raw time


def test_an_op_that_fits_at_no_batch_is_estimated_and_named():
    net = vmem.Sequential(vmem.nn.Linear(64, 4096), vmem.nn.ReLU(), vmem.nn.Linear(4096, 10), input_shape=(64,))
    net.init(0)
    program = net.build(8, net.input_shape, "float32")
    with vmem.device("cpu", memory="512KiB") as dev:  # the first Linear's weight alone is 1 MiB
        prof = profile(dev.catalog(program), device=dev, copy_gbps=10.0, repeats=1)
    estimated = [n.split(":")[0] for n in prof.notes if "not measured" in n and "batch 1" in n]
    assert estimated == [program.ops[0].name], prof.notes
    first = program.ops[0]
    assert prof.times[(first.name, "forward", None)] > 0 and prof.times[(first.name, "backward", None)] > 0
    per_flop = prof.times[(first.name, "forward", None)] / first.flops
    measured = [prof.times[(op.name, "forward", None)] / op.flops for op in program.ops[1:] if op.flops]
    assert min(measured) <= per_flop <= max(measured)  # at the others' time per FLOP


class _FailingConv(_RankedConv):
    """Ranks like cuDNN, but its second-ranked algorithm of every pass fails when run (as an algorithm
    cuDNN offers but cannot run on this GPU)."""

    ranked_top = 3

    def _fails(self, pass_, algo):
        return algo == sorted(self.times[pass_], key=self.times[pass_].get)[1]

    def forward(self, layer, ctx, x, w, y, b=None):
        if self._fails("forward", ctx.algo):
            raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED")
        super().forward(layer, ctx, x, w, y, b)

    def backward(self, layer, ctx, dy, x, w, dx, dw, db=None):
        data, filt = ctx.algo
        if self._fails("backward_filter", filt) or (dx is not None and self._fails("backward_data", data)):
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")
        super().backward(layer, ctx, dy, x, w, dx, dw, db)


def test_an_algorithm_that_fails_is_skipped_and_named_not_the_whole_layer(monkeypatch):
    prof, fake, program = _profile_with(_FailingConv, monkeypatch)
    assert not any(c[0] == "find" for c in fake.calls)  # no fall back to cuDNN's search
    conv = next(op for op in program.ops if op.kind == "conv")
    for pass_, algos in conv.algorithms.items():
        ranked = sorted(fake.times[pass_], key=fake.times[pass_].get)
        assert prof.times[(conv.name, pass_, ranked[1])] == float("inf")
        assert np.isfinite(prof.times[(conv.name, pass_, ranked[0])])
        assert any(n.startswith(f"{conv.name}: {pass_} algorithm {ranked[1]} failed") for n in prof.notes)


class _CappedFind(_FoundConv):
    def find(self, layer, pass_, x, w, y, ws):
        self.calls.append(("workspace", 0 if ws is None else ws.nbytes))
        return super().find(layer, pass_, x, w, y, ws)


def test_cudnns_search_gets_a_capped_workspace(monkeypatch):
    from vmem.costs import timing

    monkeypatch.setattr(timing, "FIND_WORKSPACE", 4096)
    _, fake, _ = _profile_with(_CappedFind, monkeypatch)
    sizes = [n for kind, n in fake.calls if kind == "workspace"]
    assert sizes and max(sizes) == 4096  # the layers ask for more: given the cap


def test_a_first_run_that_compiled_a_kernel_is_timed_again_on_a_gpu(monkeypatch):
    """On a GPU a first launch may compile its kernel (CuPy's element-wise kernels, tenths of a second):
    a first run of 20 ms or more is run once more and the shorter kept; one of seconds is not repeated."""
    import time as _time
    from types import SimpleNamespace

    from vmem.costs import timing

    class Stream:
        def launch(self, fn):
            fn()

        def synchronize(self):
            pass

    monkeypatch.setattr(timing, "_COMPILE", 0.2)  # seconds, in vmem: shorter here to keep the test short
    runner = object.__new__(timing._Runner)
    runner.streamed = True
    runner.device = SimpleNamespace(compute_stream=Stream())
    calls = []

    def op(first: float, later: float):
        def fn():
            _time.sleep(first if not calls else later)
            calls.append(1)

        return fn

    assert runner.seconds(op(0.1, 0.001), repeats=3) < 0.05 and len(calls) == 2
    calls.clear()
    runner.seconds(op(0.25, 0.001), repeats=3)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_gpu_profile_draws_half_inputs_in_float32_as_cupys_generator_requires(dtype):
    """CuPy's Generator.standard_normal takes float32 and float64 only (TypeError otherwise, seen on an H200
    on 2026-11-28): a profile on a GPU draws half-precision inputs in FP32 and casts them, scaled as asked."""
    from types import SimpleNamespace

    from vmem.costs import timing

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        import ml_dtypes

        dt = np.dtype(ml_dtypes.bfloat16)
    else:
        dt = np.dtype(dtype)

    class StrictGenerator:  # CuPy 14's contract (cupy/random/_generator_api.pyx)
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def standard_normal(self, size=None, dtype=np.float64, out=None):
            if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
                raise TypeError(f"Unsupported dtype {np.dtype(dtype).name} for standard_normal")
            assert out is not None and out.dtype == np.dtype(dtype)
            out[...] = self.rng.standard_normal(out.shape, dtype=np.dtype(dtype))
            return out

    xp = SimpleNamespace(
        random=SimpleNamespace(default_rng=StrictGenerator), multiply=np.multiply, add=np.add, float32=np.float32
    )

    class Stream:
        def launch(self, fn, *args):
            fn(*args)

    device = SimpleNamespace(
        compute_stream=Stream(),
        pool=SimpleNamespace(allocate=lambda nbytes, stream, category: nbytes),
        view=lambda block, shape, dtype: np.empty(shape, dtype),
    )
    runner = object.__new__(timing._Runner)
    runner.streamed, runner.device, runner.xp, runner._gen, runner._blocks = True, device, xp, None, []
    runner.call = lambda fn: fn()
    monkey = timing._DRAW_CHUNK
    try:
        timing._DRAW_CHUNK = 1000  # several chunks, the last one short
        out = runner.normal(np.random.default_rng(0), (7, 5, 61), dt, scale=2.0, shift=1.0)
    finally:
        timing._DRAW_CHUNK = monkey
    values = out.astype(np.float64)
    assert out.dtype == dt and np.isfinite(values).all()
    assert abs(values.mean() - 1.0) < 0.2 and abs(values.std() - 2.0) < 0.2


def test_a_search_that_lists_an_algorithm_twice_keeps_its_faster_entry():
    """cuDNN's Find lists an algorithm once per math type it ran in, fastest first: the profile keeps the
    faster (a dict over the results kept the last, the slower)."""
    from vmem.costs.timing import fastest

    found = [("implicit_gemm", 0.001, 0), ("algo_1", 0.002, 0), ("implicit_gemm", 0.004, 0)]
    assert fastest(found) == {"implicit_gemm": 0.001, "algo_1": 0.002}
