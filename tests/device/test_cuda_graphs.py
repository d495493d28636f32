"""CUDA graphs of training steps (``vmem.device("cuda:0", graphs="on")``) on the CuPy stand-in, which keeps
stream capture's rules: work on a capturing stream is recorded, not run, and runs at each launch; a
synchronization, a read to the host, an upload from pageable memory, a random draw, a captured event
queried or a stream left unjoined fail the capture. A step that repeats is captured once and then replayed
by one launch: the weights are the bits of the same steps without graphs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import vmem
from vmem import nn

from .test_cuda_standin import _resnet, _vgg


def _with_dropout() -> vmem.Sequential:
    """A classifier whose dropout draws its mask on the host (what a capture refuses)."""
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(8 * 8 * 8, 10),
        input_shape=(3, 8, 8),
    )


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)


def _train(
    cupy, make, graphs: str, policy: str, precision: str, memory: str, steps: int = 5, lrs=None, opt=None, between=None
) -> dict:
    x, y = _batch()
    net = make().init(seed=0)
    dev = vmem.device("cuda:0", memory=memory, graphs=graphs)
    seen = []
    opt = opt or vmem.optim.SGD(lr=0.01, momentum=0.9)
    with vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision, optimizer=opt) as trainer:
        for i in range(steps):
            if lrs is not None:
                opt.lr = lrs[i]
            if between is not None:
                between(i, dev)
            c = cupy._state.reset()
            report = trainer.step(x, y)
            seen.append(
                {
                    "graph": report.graph,
                    "loss": report.loss,
                    "peak": report.peak_bytes,
                    "launches": c.graph_launches,
                    "trace": list(c.trace),
                    "pool_allocations": list(c.capture_pool_allocations),
                    "timing": c.capture_timing_events,
                    "calls": sum(c.calls.values()),
                    "allocations": c.allocations,
                    "uploads": len(c.uploads),
                }
            )
        trainer.sync()
        reason = trainer.plan(len(x)).reason
    dev.close()
    return {"weights": {k: v.copy() for k, v in net.params.items()}, "steps": seen, "reason": reason}


CASES = [
    (_vgg, "baseline", "fp32", "4MiB"),
    (_vgg, "baseline", "bf16", "4MiB"),
    (_vgg, "vdnn-all:signs=host", "fp32", "4MiB"),
    (_vgg, "vdnn-all:split=on", "bf16", "4MiB"),
    (_vgg, "baseline:microbatch=on", "fp32", "200KiB"),
    (_vgg, "auto", "fp16", "4MiB"),
    (_resnet, "baseline", "fp32", "4MiB"),
    (_resnet, "vdnn-all", "bf16", "4MiB"),
]


@pytest.mark.parametrize(
    "make, policy, precision, memory", CASES, ids=[f"{m.__name__[1:]}-{p}-{q}" for m, p, q, _ in CASES]
)
def test_a_replayed_step_gives_the_bits_of_the_step_run_as_it_is(cupy, make, policy, precision, memory):
    """Five steps with graphs on and off: the same weights and losses bit for bit. The first step runs as it
    is, the second is captured, the rest are one launch of its graph each, with nothing else enqueued,
    allocated or uploaded by the host; the capture took no memory from CuPy's default pool and recorded no
    timing event."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    off = _train(cupy, make, "off", policy, precision, memory)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a step that could not be captured would warn
        on = _train(cupy, make, "on", policy, precision, memory)
    assert ("micro-batches of" in on["reason"]) == ("microbatch" in policy)
    assert [s["graph"] for s in on["steps"]] == ["", "captured", "replayed", "replayed", "replayed"]
    assert [s["loss"] for s in on["steps"]] == [s["loss"] for s in off["steps"]]
    for k, w in off["weights"].items():
        assert np.array_equal(on["weights"][k], w), k
    captured, replays = on["steps"][1], on["steps"][2:]
    assert captured["pool_allocations"] == [] and captured["timing"] == 0
    executors = captured["launches"]  # one graph per executor (micro-batches: one each)
    assert executors >= 1
    for s in replays:
        assert s["launches"] == executors and [e[0] for e in s["trace"]] == ["graph"] * executors
        assert s["calls"] == 0 and s["allocations"] == 0 and s["uploads"] == 0
    assert [s["peak"] for s in on["steps"]] == [s["peak"] for s in off["steps"]]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_replay_takes_each_steps_learning_rate_and_bias_correction(cupy, optimizer):
    """The fused update reads its scalars from device memory, copied there from the step's staging: a
    learning rate that changes every step (a schedule) and Adam's bias correction do not stop the replays,
    and each replayed step updates as the step run as it is does."""
    lrs = [0.01, 0.009, 0.008, 0.005, 0.004, 0.001]

    def make_opt():
        return vmem.optim.SGD(lr=0.01, momentum=0.9) if optimizer == "sgd" else vmem.optim.Adam(lr=0.01)

    off = _train(cupy, _vgg, "off", "vdnn-all", "fp32", "4MiB", steps=6, lrs=lrs, opt=make_opt())
    on = _train(cupy, _vgg, "on", "vdnn-all", "fp32", "4MiB", steps=6, lrs=lrs, opt=make_opt())
    assert [s["graph"] for s in on["steps"]] == ["", "captured"] + ["replayed"] * 4
    assert [s["loss"] for s in on["steps"]] == [s["loss"] for s in off["steps"]]
    for k, w in off["weights"].items():
        assert np.array_equal(on["weights"][k], w), k


def test_two_captures_of_a_step_record_the_same_work_at_the_same_addresses(cupy):
    """A block taken from the top of the device pool between two steps, away from where the plan places the
    step's buffers, makes the next step a new capture: its work (kernels and their arguments, copies, fills,
    cuDNN calls, and the events that order the streams: each recorded and waited for at the same points)
    is the first capture's, at the same addresses, and neither capture allocates from the array module."""
    held = []

    def between(i, dev):
        if i == 3:
            held.append(dev.pool.allocate(4096, dev.compute_stream, "other", high=True))

    on = _train(cupy, _vgg, "on", "vdnn-all", "fp32", "4MiB", steps=6, between=between)
    assert [s["graph"] for s in on["steps"]] == ["", "captured", "replayed", "captured", "replayed", "replayed"]

    def work(trace):  # an event is a graph edge: named by its first use in the capture, not by its handle
        names: dict = {}
        return [(e[0], e[1], names.setdefault(e[2], len(names))) if e[0] in ("record", "wait") else e for e in trace]

    first, second = (work([e for e in on["steps"][i]["trace"] if e[0] != "graph"]) for i in (1, 3))
    assert {e[0] for e in first} >= {"kernel", "copy", "cudnn", "record", "wait"}
    assert first == second


def test_a_step_the_capture_refuses_runs_as_it_is_and_says_why(cupy):
    """Dropout draws its mask on the host and uploads it: the capture refuses the upload, the step runs as
    it is (the same weights as with graphs off), and the trainer warns once, naming the cause."""
    make = _with_dropout
    off = _train(cupy, make, "off", "baseline", "fp32", "4MiB", steps=4)
    with pytest.warns(RuntimeWarning, match="without a CUDA graph: its capture failed.*pageable host memory"):
        on = _train(cupy, make, "on", "baseline", "fp32", "4MiB", steps=4)
    assert [s["graph"] for s in on["steps"]] == [""] * 4
    for k, w in off["weights"].items():
        assert np.array_equal(on["weights"][k], w), k


def test_a_graph_is_not_replayed_over_blocks_that_are_someone_elses(cupy):
    """A block taken from the device pool between two steps may lie where the graph writes: the graph is
    dropped and the next step captured anew around the block, which no launch writes."""
    x, y = _batch()
    dev = vmem.device("cuda:0", memory="4MiB", graphs="on")
    with vmem.Trainer(_vgg().init(seed=0), device=dev, policy="baseline", seed=0) as trainer:
        graphs = [trainer.step(x, y).graph for _ in range(4)]
        block = dev.pool.allocate(4096, dev.compute_stream, "other")
        view = dev.view(block, (1024,), np.float32)
        view.fill(7.0)
        graphs += [trainer.step(x, y).graph for _ in range(3)]
        assert np.all(view.get() == 7.0)
        dev.pool.free(block, dev.compute_stream)
    dev.close()
    assert graphs == ["", "captured", "replayed", "replayed", "captured", "replayed", "replayed"]


def test_graphs_are_the_cuda_devices_and_need_its_own_temporaries(cupy):
    with pytest.raises(vmem.errors.DeviceError, match="graphs='on' needs temporaries='reserve'"):
        vmem.device("cuda:0", memory="4MiB", graphs="on", temporaries="pool")
    with pytest.raises(vmem.errors.DeviceError, match="graphs='sometimes'; use 'on' or 'off'"):
        vmem.device("cuda:0", memory="4MiB", graphs="sometimes")
    with pytest.raises(vmem.errors.DeviceError, match="CUDA graphs are the CUDA device's"):
        vmem.device("cpu", memory="4MiB").capture()


def test_the_standin_keeps_stream_captures_rules(cupy):
    """Work on a capturing stream is recorded, not run, and runs at each launch; what CUDA refuses in a
    capture is refused (and invalidates it)."""
    from cupy.cuda.runtime import CUDARuntimeError

    s, t = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    a = cupy.zeros(4, np.float32)
    with s:
        s.begin_capture()
        a += 1  # recorded
        graph = s.end_capture()
    assert a.get().tolist() == [0, 0, 0, 0]  # nothing ran
    graph.launch(s)
    graph.launch(s)
    assert a.get().tolist() == [2, 2, 2, 2]

    def invalid(work, match):
        with s:
            s.begin_capture()
            with pytest.raises(CUDARuntimeError, match=match):
                work()
            with pytest.raises(CUDARuntimeError, match="cudaErrorStreamCaptureInvalidated"):
                s.end_capture()
        assert not s.is_capturing()

    invalid(lambda: a.get(), "read of a device array to the host")
    invalid(lambda: bool(a[0] > 0), r"read of a device value to the host \(bool\)")
    invalid(lambda: cupy.asarray(np.ones(4, np.float32)), "pageable host memory")
    invalid(lambda: s.synchronize(), "synchronize of a capturing stream")
    invalid(lambda: cupy.random.default_rng(0).random(4, dtype=np.float32), "random draw")
    host = np.zeros(4, np.float32)
    invalid(lambda: cupy.cuda.runtime.memcpyAsync(host.ctypes.data, a.data.ptr, 16, 2, s.ptr), "pageable")
    # a stream forked into the capture must be joined back
    with s:
        s.begin_capture()
        t.wait_event(s.record(cupy.cuda.Event(disable_timing=True)))
        with t:
            a += 1
        with pytest.raises(CUDARuntimeError, match="cudaErrorStreamCaptureUnjoined"):
            s.end_capture()
    # an event recorded in a capture cannot be queried, waited for or timed
    with s:
        s.begin_capture()
        ev = s.record(cupy.cuda.Event(disable_timing=False))
        s.end_capture()
    with pytest.raises(CUDARuntimeError, match="cudaErrorCapturedEvent"):
        ev.synchronize()
    with pytest.raises(CUDARuntimeError, match="cudaErrorCapturedEvent"):
        cupy.cuda.get_elapsed_time(ev, ev)
    assert cupy._state.COUNTERS.capture_timing_events == 1


@pytest.mark.parametrize(
    "make, policy, precision, memory", CASES, ids=[f"{m.__name__[1:]}-{p}-{q}" for m, p, q, _ in CASES]
)
def test_a_captured_step_allocates_nothing_from_the_array_module(cupy, make, policy, precision, memory):
    """The capture and every replay ask CuPy's allocator for nothing: the loss computes in its work arrays,
    the finite flag, batch norm's kept statistics and the column sums' float64 totals are made with the
    executor, batch norm's deviations in its output and its input's gradient, average pooling divides by
    a number, Gist's bits are made in their block and read by 16-bit kernels
    (``cupy._state.COUNTERS.allocated_at`` names each allocation's caller)."""
    if precision in ("bf16", "fp16"):
        pytest.importorskip("ml_dtypes")
    seen = []
    original = cupy._state.reset

    def reset():
        seen.append(original())
        return seen[-1]

    cupy._state.reset = reset
    try:
        on = _train(cupy, make, "on", policy, precision, memory, steps=3)
    finally:
        cupy._state.reset = original
    assert [s["graph"] for s in on["steps"]] == ["", "captured", "replayed"]
    assert seen[1].allocated_at == [] and seen[2].allocations == 0


def _tokens_train(cupy, graphs: str, precision: str, steps: int = 4) -> dict:
    """A small transformer (embeddings, attention, layer norm, a per-token head) on the CUDA device."""
    net = vmem.models.get("transformer", layers=1, seq_len=8, dim=16, heads=2, ffn=32, vocab=50).init(seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 50, (4, 8)), rng.integers(0, 50, (4, 8))
    dev = vmem.device("cuda:0", memory="4MiB", graphs=graphs)
    graph = []
    with vmem.Trainer(net, device=dev, policy="baseline", seed=0, precision=precision) as trainer:
        for _ in range(steps):
            graph.append(trainer.step(x, y).graph)
        trainer.sync()
    dev.close()
    return {"weights": {k: v.copy() for k, v in net.params.items()}, "graph": graph}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_transformer_replays_its_step_with_the_bits_of_the_step_run_as_it_is(cupy, precision):
    """Embeddings (their gradient scattered with ``add.at``), attention and layer norm: captured once, then
    replayed, the weights those of the same steps without graphs, bit for bit."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    on, off = _tokens_train(cupy, "on", precision), _tokens_train(cupy, "off", precision)
    assert on["graph"] == ["", "captured", "replayed", "replayed"] and set(off["graph"]) == {""}
    for k, w in off["weights"].items():
        assert np.array_equal(on["weights"][k], w), k
