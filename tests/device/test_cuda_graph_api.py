"""cuDNN's graph API (``vmem.device("cuda:0", conv_api="graph")``) on the CuPy stand-in, whose cuDNN keeps the
backend API's descriptors, engines, plans and variant packs (tests/standin/cudnn_graph.py): FP32 in both math
modes, fp16 and bf16 as stored, a convolution followed by an in-place ReLU run as one fused graph
(convolution + bias + ReLU), and what happens where cuDNN builds no plan for it."""

from __future__ import annotations

import numpy as np
import pytest

import vmem

from .test_cuda_standin import BOUND, _resnet, _vgg


def _train(cupy, make, precision: str, policy: str, math: str, device: str = "cuda:0", steps: int = 3, **options):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    net = make().init(seed=0)
    extra = {"math": math, "conv_api": "graph", **options} if device.startswith("cuda") else {}
    launches = []
    with vmem.device(device, memory="4MiB", **extra) as dev:
        with vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision) as trainer:
            for _ in range(steps):
                before = dict(cupy._state.COUNTERS.launches)
                trainer.step(x, y)
                after = cupy._state.COUNTERS.launches
                launches.append({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
            trainer.sync()
            algos = trainer.plan(len(x)).plan.algos
    return {k: v.copy() for k, v in net.params.items()}, algos, launches


CASES = [
    (_vgg, p, q, m)
    for p, m in (("fp32", "exact"), ("fp32", "tf32"), ("bf16", "tf32"), ("fp16", "tf32"))
    for q in ("baseline", "auto")
] + [
    (_resnet, "fp32", "vdnn-all:codec=zvc,signs=host", "exact"),
    (_resnet, "bf16", "vdnn-all:codec=zvc,signs=host", "tf32"),
]


@pytest.mark.parametrize(
    "make, precision, policy, math", CASES, ids=[f"{m.__name__[1:]}-{p}-{q}-{t}" for m, p, q, t in CASES]
)
def test_the_graph_api_trains_as_the_cpu_device_does(cupy, make, precision, policy, math):
    """Three steps through cuDNN's graph API against the CPU device's, within the legacy API's bounds. Exact
    FP32 never runs an engine with tensor cores (cuDNN ranks one first); TF32 and half precision run them.
    Every VGG convolution runs its forward as one fused graph (its ReLU in place after it): a plan names a
    fused algorithm for each, and the ReLU's own kernel never runs. No value is read to the host in a step."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    want, _, _ = _train(cupy, make, precision, policy, math, device="cpu")
    cupy._state.reset()
    cupy._cudnn.graph_runs.clear()
    got, algos, launches = _train(cupy, make, precision, policy, math)
    assert cupy._state.COUNTERS.implicit_reads == []
    assert launches[1] == launches[2] and launches[1]
    runs = cupy._cudnn.graph_runs
    assert runs and not cupy._cudnn.maths  # every convolution through the graph API, none through the legacy one
    tensor_cores = {"tensor_core" in engine[1] for _, engine, _ in runs}
    assert tensor_cores == {False} if (precision, math) == ("fp32", "exact") else True in tensor_cores
    bound = BOUND["tf32"] if (precision, math) == ("fp32", "tf32") else BOUND["fp32" if precision == "fp32" else "half"]
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    assert worst <= bound, f"weights differ by {worst} (bound {bound})"
    if make is _vgg:
        convs = [name for name in algos if name.startswith("conv")]
        assert convs and all(algos[c]["forward"].startswith("fused.") for c in convs), algos
        assert sum(fused for _, _, fused in runs) >= 3 * len(convs)  # each step's forwards
        relu_forwards = [k for k in launches[2] if "relu" in k and "backward" not in k]
        assert relu_forwards == [], relu_forwards  # neither the ReLU's kernel nor the bias+ReLU one
    else:  # a ResNet's convolutions feed batch norm: nothing to fuse
        assert not any(fused for _, _, fused in runs)


def test_exact_fp32_fused_and_unfused_forwards_give_the_same_bits(cupy, monkeypatch):
    """In exact FP32 the fused graph (the convolution's result in FP32, the bias added, the ReLU) computes what
    the convolution followed by vmem's bias+ReLU kernel computes: where cuDNN builds no plan for the fused graph,
    the convolution's own engines run with the kernel after them, and the weights are the same bits."""
    from tests.standin import cudnn_graph

    fused, _, _ = _train(cupy, _vgg, "fp32", "baseline", "exact")
    monkeypatch.setattr(cudnn_graph, "FUSED", {})  # no engine for a fused graph
    monkeypatch.setattr(cudnn_graph, "RANKING", {"plain": cudnn_graph.RANKING["plain"], "fused": ()})
    cupy._cudnn.graph_runs.clear()
    plain, algos, launches = _train(cupy, _vgg, "fp32", "baseline", "exact")
    assert not any(f for _, _, f in cupy._cudnn.graph_runs)
    assert not any(a["forward"].startswith("fused.") for name, a in algos.items() if name.startswith("conv"))
    assert any("bias_relu" in k for k in launches[2]), launches[2]
    for k in fused:
        assert fused[k].tobytes() == plain[k].tobytes(), k


def test_graphs_replay_the_graph_apis_steps_bit_for_bit(cupy):
    """A training step through the graph API (fused forwards included) captured as a CUDA graph and replayed
    gives the bits of the same steps run as they are."""
    pytest.importorskip("ml_dtypes")
    off, _, _ = _train(cupy, _vgg, "bf16", "baseline", "tf32", steps=4)
    on, _, _ = _train(cupy, _vgg, "bf16", "baseline", "tf32", steps=4, graphs="on")
    for k in off:
        assert off[k].tobytes() == on[k].tobytes(), k


def test_engines_are_admitted_by_the_data_and_the_math():
    """Exact FP32 takes no engine with tensor cores or inputs converted down; TF32 and half precision take
    those, but none that reduces in less than FP32."""
    from vmem.device.cuda.graph import EngineConfig, admits

    def cfg(*notes):
        return EngineConfig(None, 0, frozenset(notes), frozenset())

    plain, tc, down, reduced = cfg(), cfg("tensor_core"), cfg("down_convert_inputs"), cfg("reduced_precision_reduction")
    assert [admits(c, "float32", "exact") for c in (plain, tc, down, reduced)] == [True, False, False, False]
    for dtype, math in (("float32", "tf32"), ("bfloat16", "tf32"), ("float16", "exact")):
        assert [admits(c, dtype, math) for c in (plain, tc, down, reduced)] == [True, True, True, False]


def test_the_standins_graph_api_refuses_what_cudnn_refuses(cupy):
    """An attribute of the wrong type, a fused pass's run without its bias, an operation graph made without a
    handle, and a fusion asked of a backward pass are refused, each with its reason."""
    from vmem.device.cuda import cudnn, graph

    geometry = (2, 3, 8, 8, 4, (3, 3), (1, 1), (1, 1))
    with pytest.raises(cudnn.CudnnError, match="BAD_PARAM"):
        graph.Descriptor(17).set(graph.A_TENSOR_DATA_TYPE, graph.T_INT64, [0])
    with pytest.raises(ValueError, match="backward_data pass fuses none"):
        graph.ConvPass("backward_data", geometry, fuse={"relu"})
    fused = graph.ConvPass("forward", geometry, dtype="bfloat16", fuse={"bias", "relu"})
    assert fused.roles == ("x", "w", "y", "b")
    with pytest.raises(cudnn.CudnnError, match="BAD_PARAM"):
        fused.graph(cudnn.ffi().NULL)  # an operation graph lives on a handle
    handle = cudnn.Handle(cupy.cuda.get_current_stream().ptr)
    configs = fused.heuristics(handle.ptr, admit=lambda c: True)
    assert [c.index for c in configs] == [10, 11] and all("runtime_compilation" in c.behavior for c in configs)
    x, w, y = (cupy.zeros(s, np.float32) for s in ((2, 8, 8, 3), (4, 3, 3, 3), (2, 8, 8, 4)))
    with pytest.raises(ValueError, match="binds x, w, y, b"):
        graph.ExecutionPlan(handle.ptr, configs[0], fused).execute(x.data.ptr, w.data.ptr, y.data.ptr)
    gone = graph.ConvPass("forward", geometry).heuristics(handle.ptr)  # its pass (and operation graph) dropped
    with pytest.raises(cudnn.CudnnError, match="BAD_PARAM"):
        graph.ExecutionPlan(handle.ptr, gone[0])  # a plan must keep its operation graph alive (owner=)
    handle.close()
