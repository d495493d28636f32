"""What of the CUDA device can be checked without a GPU: the one-line refusal, lazy imports, the cuDNN
declarations and descriptor shapes (where the cuDNN wheel is installed), the kernels' GPU build with the
device's exact options (where NVRTC is installed)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import vmem
from vmem.errors import DeviceError
from vmem.nn.base import physical


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu() -> bool:
    from vmem.device.cuda import unavailable

    return unavailable() is None


def test_asking_for_cuda_without_a_gpu_says_so_in_one_line():
    if _gpu():
        pytest.skip("a GPU is here")
    with pytest.raises(DeviceError) as info:
        vmem.device("cuda:0")
    message = str(info.value)
    assert "\n" not in message and "cuda:0" in message and "vmem[cuda]" in message


def test_without_cupy_the_message_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(DeviceError, match=r"CuPy is not installed.*vmem\[cuda\]"):
        vmem.device("cuda:0")


def test_a_bad_index_is_refused():
    with pytest.raises(DeviceError, match="cuda:<index>"):
        vmem.device("cuda:first")


def test_the_cuda_modules_import_no_gpu_library():
    code = (
        "import sys; import vmem.device.cuda.device, vmem.device.cuda.conv, vmem.device.cuda.streams, "
        "vmem.device.cuda.memory, vmem.device.cuda.kernels, vmem.device.cuda.nvml, vmem.device.cuda.cudnn; "
        "print(sorted(m for m in ('cupy', 'pynvml', 'cffi') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "cupy" not in out and "pynvml" not in out


needs_cudnn = pytest.mark.skipif(not _has("nvidia.cudnn"), reason="the cuDNN wheel is not installed (vmem[cuda])")


@needs_cudnn
def test_the_cudnn_declarations_load_from_the_wheel():
    from vmem.device.cuda import cudnn

    assert cudnn.version() >= 90000
    f = cudnn.ffi()
    for kind in ("Fwd", "BwdData", "BwdFilter"):  # the perf structs as docs/gpu.md gives them
        assert f.sizeof(f"cudnnConvolution{kind}AlgoPerf_t") == 48
        assert f.offsetof(f"cudnnConvolution{kind}AlgoPerf_t", "memory") == 16


@needs_cudnn
@pytest.mark.parametrize(
    "model",
    [
        "alexnet",
        "overfeat",
        "vgg16",
        "googlenet",
        "nin",
        "resnet50",
        "vgg_cifar",
        "resnet_cifar",
        "mini_googlenet",
        "digits_cnn",
    ],
)
def test_cudnn_computes_every_zoo_convolutions_output_shape(model):
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import Descs, _geometry

    program = vmem.models.get(model).build(2)
    convs = [op for op in program.ops if op.kind == "conv"]
    assert convs
    for op in convs:
        for layout in (cudnn.NHWC, cudnn.NCHW):  # vmem's layout, and the one the GPU probe compares it with
            d = Descs(_geometry(op.layer, physical(op.in_shapes[0]), physical(op.out_shape)), layout)
            assert d.y.shape == tuple(op.out_shape), op.name
            n, c, h, w = op.in_shapes[0]
            assert d.x.shape == (n, c, h, w) and d.w.shape[:2] == (op.out_shape[1], c)


def _graph_api_or_skip():
    """cuDNN's graph API loads its engine libraries when a descriptor is finalized; one of them needs the
    driver (libcuda), which a machine without a GPU lacks."""
    from vmem.device.cuda import cudnn, graph

    try:
        graph.Descriptor(graph._TENSOR).set(graph.A_TENSOR_UID, graph.T_INT64, [1])
        graph.ConvPass("forward", (1, 1, 3, 3, 1, (1, 1), (1, 1), (0, 0)))
    except cudnn.CudnnError as exc:
        if "SUBLIBRARY_LOADING_FAILED" in str(exc):
            pytest.skip(f"cuDNN's graph API cannot load its engines here (no CUDA driver): {exc}")
        raise


@needs_cudnn
@pytest.mark.parametrize("model", ["vgg16", "resnet50", "googlenet", "alexnet"])
def test_graph_api_describes_every_zoo_convolution_pass(model):
    from vmem.device.cuda import cudnn, graph
    from vmem.device.cuda.conv import _geometry

    _graph_api_or_skip()
    program = vmem.models.get(model).build(2)
    for op in (o for o in program.ops if o.kind == "conv"):
        geometry = _geometry(op.layer, physical(op.in_shapes[0]), physical(op.out_shape))
        for pass_ in ("forward", "backward_data", "backward_filter"):
            for layout in (cudnn.NHWC, cudnn.NCHW):
                conv = graph.ConvPass(pass_, geometry, layout)  # cuDNN finalizes it: the shapes agree
                n, c, h, w = op.in_shapes[0]
                assert conv.tensors["x"].get(graph.A_TENSOR_DIMS, graph.T_INT64, 4) == [n, c, h, w]
                assert conv.tensors["y"].get(graph.A_TENSOR_DIMS, graph.T_INT64, 4) == list(op.out_shape)


@needs_cudnn
def test_graph_api_refuses_an_inconsistent_convolution():
    from vmem.device.cuda import cudnn, graph

    _graph_api_or_skip()
    good = graph.ConvPass("forward", (2, 3, 8, 8, 4, (3, 3), (1, 1), (1, 1)))
    bad_y = graph._tensor(graph.UIDS["y"], (2, 4, 7, 7), graph._strides(2, 4, 7, 7, cudnn.NHWC), 16)  # not 8x8
    attrs = graph._OP_ATTRS["forward"]
    op = graph.Descriptor(graph._OP["forward"]).set(attrs["alpha"], graph.T_FLOAT, [1.0])
    op.set(attrs["beta"], graph.T_FLOAT, [0.0]).set(attrs["conv"], graph.T_BACKEND_DESCRIPTOR, [good.conv])
    op.set(attrs["x"], graph.T_BACKEND_DESCRIPTOR, [good.tensors["x"]])
    op.set(attrs["w"], graph.T_BACKEND_DESCRIPTOR, [good.tensors["w"]])
    op.set(attrs["y"], graph.T_BACKEND_DESCRIPTOR, [bad_y])
    with pytest.raises(cudnn.CudnnError, match="BAD_PARAM"):
        op.finalize()
    with pytest.raises(ValueError, match="unknown convolution pass"):
        graph.ConvPass("sideways", (2, 3, 8, 8, 4, (3, 3), (1, 1), (1, 1)))


@pytest.mark.skipif(not _has("cupy"), reason="CuPy's NVRTC is not installed (vmem[cuda])")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_kernels_compile_with_the_devices_exact_options(arch):
    from vmem.device.cuda import kernels

    assert "-ftz=false" in kernels.OPTIONS and "-fmad=false" in kernels.OPTIONS
    try:
        cubin = kernels.compile_cubin(arch)
    except DeviceError as exc:  # NVRTC's library itself missing (no nvidia-cuda-nvrtc wheel)
        if "libnvrtc" in str(exc) or "NVRTC" not in str(exc):
            pytest.skip(f"NVRTC is not usable here: {exc}")
        raise
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 10_000


def test_the_cpu_and_sim_catalogs():
    from vmem.device.hostconv import HostConv

    program = vmem.models.get("vgg_cifar").build(4)
    with vmem.device("cpu", memory="64MiB") as cpu:
        assert isinstance(cpu.conv_backend, HostConv)
        assert cpu.catalog(program) == program  # a program as built offers the host's algorithms
        sim = vmem.device("sim:titan-x").catalog(program)
        conv = next(op for op in sim.ops if op.kind == "conv")
        assert "implicit_gemm" in conv.algorithms["forward"] and "im2col" not in conv.algorithms["forward"]
        assert cpu.catalog(sim) == program  # and the CPU's catalog gives them back


def test_dropout_draws_its_mask_on_the_host_for_every_device():
    """The mask comes from the step's generator through xp.asarray: the same units on every device."""
    from vmem import nn
    from vmem.nn.base import Ctx

    layer = nn.Dropout(0.5)
    x = np.ones((4, 8), np.float32)
    masks = []
    for _ in range(2):
        y, aux = np.empty_like(x), {"mask": np.empty((4,), np.uint8)}
        layer.forward(Ctx(xp=np, aux=aux, train=True, rng=np.random.default_rng(3)), [x], y)
        masks.append(aux["mask"].copy())
    assert np.array_equal(*masks)


class _FakePlan:
    """Stands in for graph.ExecutionPlan: fails for the configurations marked so, records what it ran."""

    ran: list = []

    def __init__(self, handle, config, owner=None):
        if config.index in (3,):  # cuDNN cannot build this one here
            from vmem.device.cuda import cudnn

            raise cudnn.CudnnError("cudnnBackendFinalize", cudnn.NOT_SUPPORTED, "not here")
        self.config, self.handle, self.workspace, self.owner = config, handle, 1000 * config.index, owner

    def execute(self, x, w, y, workspace=0, handle=None, b=None):
        _FakePlan.ran.append((self.config.index, workspace))


def _fake_pass(ranked, every):
    from vmem.device.cuda import graph

    def cfg(index, *notes):
        numerical = frozenset(n for n in notes if n in graph.NUMERICAL_NOTES)
        return graph.EngineConfig(None, index, numerical, frozenset(notes) - numerical)

    class FakePass:
        def __init__(self, pass_, geometry, layout=None, dtype="float32", fuse=()):
            self.pass_ = pass_

        def heuristics(self, handle, exact=True, admit=None):
            return [c for c in map(lambda c: cfg(*c), ranked) if admit is None or admit(c)]

        def engines(self, handle, exact=True, admit=None):
            return [c for c in map(lambda c: cfg(*c), every) if admit is None or admit(c)]

    return FakePass


def _graph_conv(monkeypatch, ranked, every=(), deterministic=True):
    """A GraphConv on fakes: no GPU, no cuDNN handle; cuDNN's answers are ``ranked`` (its heuristics) and
    ``every`` (its engines), each an (index, *notes) tuple."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from vmem.device.cuda import cudnn, graph
    from vmem.device.cuda.graph_conv import GraphConv

    monkeypatch.setattr(graph, "ConvPass", _fake_pass(ranked, every))
    monkeypatch.setattr(graph, "ExecutionPlan", _FakePlan)
    _FakePlan.ran = []
    device = SimpleNamespace(deterministic=deterministic, compute_stream=SimpleNamespace(stream=nullcontext()))
    conv = GraphConv(device)
    monkeypatch.setattr(conv, "_handle", lambda: cudnn.ffi().cast("cudnnHandle_t", 1))
    return conv


@needs_cudnn
def test_graph_backend_offers_the_ranked_engines_it_can_build(monkeypatch):
    conv = _graph_conv(
        monkeypatch,
        ranked=[
            (5,),
            (3,),
            (5,),
            (7, "nondeterministic"),
            (8, "runtime_compilation"),
            (9,),
            (10,),
            (11,),
            (12,),
            (13,),
        ],
    )
    layer = vmem.nn.Conv2d(4, 8, 3, padding=1)
    names = conv.heuristic(layer, "forward", (2, 6, 6, 4), (2, 6, 6, 8))
    # cuDNN's order; e3 does not build, e7 is not deterministic, e8 compiles at run time; the same engine
    # with another knob choice gets a suffix; at most TOP of them
    assert names == ["e5", "e5.1", "e9", "e10", "e11", "e12"][: conv.TOP]
    assert conv.plans(layer, "forward", (2, 6, 6, 4), (2, 6, 6, 8)) is conv.plans(
        layer, "forward", (2, 6, 6, 4), (2, 6, 6, 8)
    )  # made once
    conv = _graph_conv(monkeypatch, ranked=[(7, "nondeterministic"), (9,)], deterministic=False)
    assert conv.heuristic(layer, "forward", (2, 6, 6, 4), (2, 6, 6, 8)) == ["e7", "e9"]


@needs_cudnn
def test_graph_plans_keep_their_operation_graph_alive(monkeypatch):
    import gc
    import weakref

    conv = _graph_conv(monkeypatch, ranked=[(5,), (9,)])
    layer = vmem.nn.Conv2d(4, 8, 3, padding=1)
    plans = conv.plans(layer, "forward", (2, 6, 6, 4), (2, 6, 6, 8))
    owners = {id(p.owner) for p in plans.values()}
    assert len(owners) == 1 and None not in {p.owner for p in plans.values()}
    alive = weakref.ref(next(iter(plans.values())).owner)
    gc.collect()
    assert alive() is not None


@needs_cudnn
def test_graph_backend_falls_back_to_every_engine_and_names_what_it_lacks(monkeypatch):
    from vmem.device.cuda import cudnn

    conv = _graph_conv(monkeypatch, ranked=[(3,)], every=[(3,), (4,)])
    layer = vmem.nn.Conv2d(4, 8, 3, padding=1)
    assert conv.heuristic(layer, "backward_data", (2, 6, 6, 4), (2, 6, 6, 8)) == ["e4"]
    net = vmem.graph.Sequential(
        vmem.nn.Conv2d(3, 4, 3, padding=1), vmem.nn.Flatten(), vmem.nn.Linear(4 * 36, 2), input_shape=(3, 6, 6)
    )
    program = conv.catalog(net.build(2))
    op = next(o for o in program.ops if o.kind == "conv")
    assert op.algorithms == {p: ["e4"] for p in cudnn.ALGOS}
    assert op.workspace == {p: {"e4": 4000} for p in cudnn.ALGOS}
    conv = _graph_conv(monkeypatch, ranked=[(3,)], every=[(3,)])
    with pytest.raises(cudnn.CudnnError, match="conv1.*no float32 engine \\(exact math\\)"):
        conv.catalog(net.build(2))


@needs_cudnn
def test_graph_backend_refuses_a_workspace_too_small_by_name(monkeypatch):
    from types import SimpleNamespace

    conv = _graph_conv(monkeypatch, ranked=[(2,)])
    layer = vmem.nn.Conv2d(4, 8, 3, padding=1)
    arr = SimpleNamespace(data=SimpleNamespace(ptr=1), shape=(2, 6, 6, 4), dtype=np.float32)
    out = SimpleNamespace(data=SimpleNamespace(ptr=2), shape=(2, 6, 6, 8), dtype=np.float32)
    small = SimpleNamespace(data=SimpleNamespace(ptr=3), nbytes=100)
    with pytest.raises(ValueError, match="layer .*forward engine e2 needs 2000 bytes"):
        conv.forward(layer, SimpleNamespace(algo="e2", workspace=small, relu=False), arr, arr, out)
    big = SimpleNamespace(data=SimpleNamespace(ptr=4), nbytes=4096)
    conv.forward(layer, SimpleNamespace(algo="e2", workspace=big, relu=False), arr, arr, out)
    assert _FakePlan.ran == [(2, 4)]


def _nchw_conv(monkeypatch):
    """The legacy backend with NCHW variants on a stand-in device, its cuDNN calls recorded (no GPU)."""
    from types import SimpleNamespace

    from vmem.device.cuda.conv import CudnnConv

    conv = CudnnConv(SimpleNamespace(nchw=True, deterministic=True))
    monkeypatch.setattr(CudnnConv, "_ptr", staticmethod(lambda a: 0))
    calls = []

    def call(pass_, d, algo, x, w, y, ws, ws_size):
        calls.append((pass_, d.layout, algo, x.copy(), w.copy(), y, ws_size))
        out = {"forward": y, "backward_filter": w, "backward_data": x}[pass_]
        out[...] = np.arange(out.size, dtype=np.float32).reshape(out.shape)  # a result in cuDNN's layout

    monkeypatch.setattr(conv, "_call", call)
    return conv, calls


@needs_cudnn
@pytest.mark.parametrize("pass_", ["forward", "backward_filter", "backward_data"])
def test_nchw_algorithms_run_on_transposed_copies(monkeypatch, pass_):
    from types import SimpleNamespace

    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import _staging_bytes

    conv, calls = _nchw_conv(monkeypatch)
    layer = vmem.nn.Conv2d(3, 5, 3, padding=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 3)).astype(np.float32)  # NHWC
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)  # KRSC
    y = rng.standard_normal((2, 4, 6, 5)).astype(np.float32)
    staged = _staging_bytes(4, x.shape, w.shape, y.shape)
    ws = np.zeros(staged + 1000, np.uint8)
    ctx = SimpleNamespace(algo="nchw.implicit_gemm" if pass_ == "forward" else "nchw.algo_1", workspace=ws, relu=False)
    before = {"x": x.copy(), "w": w.copy(), "y": y.copy()}
    if pass_ == "forward":
        conv.forward(layer, ctx, x, w, y)
    elif pass_ == "backward_filter":
        conv.backward(layer, ctx, y, x, w, None, w)  # dy = y, dw = w
    else:
        dx = np.zeros_like(x)
        ctx.algo = ("nchw.algo_1", "algo_1")  # backward-data on NCHW copies, backward-filter channels last
        conv.backward(layer, ctx, y, x, w, dx, np.zeros_like(w))
        x = dx
    ((name, layout, algo, xt, wt, yt, ws_size),) = [c for c in calls if c[0] == pass_]
    assert layout == cudnn.NCHW and not algo.startswith("nchw.") and ws_size == 1000
    reads = {"forward": "xw", "backward_filter": "xy", "backward_data": "wy"}[pass_]
    seen = {"x": xt, "w": wt, "y": yt}
    for role in reads:  # what cuDNN read: the channels-last inputs, transposed (filters KRSC -> KCRS)
        np.testing.assert_array_equal(seen[role], before[role].transpose(0, 3, 1, 2))
    written = {"forward": y, "backward_filter": w, "backward_data": x}[pass_]
    expect = np.arange(written.size, dtype=np.float32).reshape(_nchw(written.shape)).transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(written, expect)  # its result, back in channels last


def _nchw(shape):
    n, h, w, c = shape
    return (n, c, h, w)


@needs_cudnn
def test_nchw_algorithms_need_room_for_their_copies_and_are_ranked_beside_channels_last(monkeypatch):
    from types import SimpleNamespace

    from vmem.device.cuda import cudnn

    conv, _ = _nchw_conv(monkeypatch)
    layer = vmem.nn.Conv2d(3, 5, 3, padding=1)
    x, w, y = np.zeros((2, 4, 6, 3), np.float32), np.zeros((5, 3, 3, 3), np.float32), np.zeros((2, 4, 6, 5), np.float32)
    with pytest.raises(ValueError, match=r"layer .*forward nchw.winograd needs at least \d+ bytes"):
        conv.forward(
            layer, SimpleNamespace(algo="nchw.winograd", workspace=np.zeros(64, np.uint8), relu=False), x, w, y
        )
    monkeypatch.setattr(
        conv,
        "_ranked",
        lambda layer, pass_, xs, ys, layout, dtype: ["a", "b", "c"] if layout == cudnn.NHWC else ["p", "q"],
    )
    assert conv.heuristic(layer, "forward", x.shape, y.shape) == ["a", "nchw.p", "b", "nchw.q", "c"]
    assert conv.ranked_top == 6


@needs_cudnn
def test_the_catalog_offers_nchw_variants_with_their_copies_in_the_workspace(monkeypatch):
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import _staging_bytes

    conv, _ = _nchw_conv(monkeypatch)
    # cuDNN's answers: NHWC supports implicit GEMM only, NCHW winograd too; sizes 100 and 200
    supported = {cudnn.NHWC: {"implicit_gemm", "algo_1"}, cudnn.NCHW: {"implicit_gemm", "winograd", "algo_1"}}
    monkeypatch.setattr(
        conv,
        "workspace",
        lambda d, pass_, a: (100 if d.layout == cudnn.NHWC else 200) if a in supported[d.layout] else None,
    )
    net = vmem.graph.Sequential(
        vmem.nn.Conv2d(3, 4, 3, padding=1), vmem.nn.Flatten(), vmem.nn.Linear(4 * 36, 2), input_shape=(3, 6, 6)
    )
    op = next(o for o in conv.catalog(net.build(2)).ops if o.kind == "conv")
    staged = _staging_bytes(4, (2, 6, 6, 3), (4, 3, 3, 3), (2, 6, 6, 4))
    assert op.workspace["forward"] == {
        "implicit_gemm": 100,
        "nchw.implicit_gemm": staged + 200,
        "nchw.winograd": staged + 200,
    }
    assert op.algorithms["backward_data"] == ["algo_1", "nchw.algo_1", "nchw.winograd"]


@pytest.mark.parametrize(
    "capability, arch", [("90", "sm_90"), ("80", "sm_80"), ("120", "sm_120"), ((8, 6), "sm_86"), ("75", "sm_75")]
)
def test_compute_capability_as_cupy_gives_it_is_parsed(capability, arch):
    from vmem.device.cuda.kernels import arch_of

    assert arch_of(capability) == arch


def test_a_compute_capability_that_is_not_one_is_refused():
    from vmem.device.cuda.kernels import arch_of

    with pytest.raises(DeviceError, match="compute capability"):
        arch_of("sm9")


def test_graph_engines_whose_result_disagrees_are_left_out_of_a_profile():
    from vmem.device.cuda.graph_conv import agreeing

    assert agreeing({}) == set()
    assert agreeing({"e1": 5.0}) == {"e1"}
    assert agreeing({"e0": 0.0, "e3": 7.0}) == {"e3"}  # an engine that wrote zeros
    assert agreeing({"e0": 0.0, "e3": 7.0, "e50": 7.02, "e74": 6.99}) == {"e3", "e50", "e74"}
    assert agreeing({"e0": 0.0, "e1": 0.0}) == {"e0", "e1"}  # a zero gradient is zero everywhere


def test_the_cudnn_backends_are_convolution_backends():
    from vmem.device.base import ConvBackend
    from vmem.device.cuda.conv import CudnnConv
    from vmem.device.cuda.graph_conv import GraphConv

    for cls in (CudnnConv, GraphConv):
        missing = [
            m for m in ("catalog", "forward", "backward", "heuristic", "find", "ranked_top") if not hasattr(cls, m)
        ]
        assert not missing, (cls.__name__, missing)
    assert ConvBackend.__doc__  # the protocol both implement (vmem.device.base)


def _half_conv(monkeypatch, layer, x, y):
    """The legacy backend on a stand-in device with cuDNN's calls faked on NumPy arrays (no GPU): each pass
    writes a known result and records the dtypes and workspace it was handed; the bias's reduction sums dy."""
    from types import SimpleNamespace

    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import CudnnConv

    from vmem.codecs import native
    from vmem.device.cuda import conv as conv_module

    conv = CudnnConv(SimpleNamespace(nchw=False, deterministic=True))
    conv.descs(layer, x.shape, y.shape, cudnn.NHWC, np.dtype(x.dtype).name)  # made before cuDNN is faked
    monkeypatch.setattr(conv_module, "backend_of", lambda a: native.CPU)  # vmem's kernels: their CPU build
    monkeypatch.setattr(CudnnConv, "_ptr", staticmethod(lambda a: a))
    monkeypatch.setattr(conv, "_handle", lambda: 0)
    seen = {}

    def call(pass_, d, algo, x, w, y, ws, ws_size):
        seen[pass_] = (x.dtype, w.copy(), y.dtype, ws_size)
        out = {"forward": y, "backward_filter": w, "backward_data": x}[pass_]
        out[...] = (np.arange(out.size).reshape(out.shape) % 7 - 3) / 4

    def bias(handle, one, y_desc, dy, zero, b_desc, db):
        assert db.dtype == dy.dtype  # cuDNN reduces into the maps' type
        db[...] = dy.reshape(-1, dy.shape[-1]).astype(np.float32).sum(0)
        return cudnn.SUCCESS

    monkeypatch.setattr(conv, "_call", call)
    monkeypatch.setattr(cudnn, "lib", lambda: SimpleNamespace(cudnnConvolutionBackwardBias=bias))
    return conv, seen


def _known(shape):
    return (np.arange(int(np.prod(shape))).reshape(shape) % 7 - 3) / 4


@needs_cudnn
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_half_convolutions_read_half_weights_and_widen_their_gradients(monkeypatch, half):
    """fp16/bf16 maps go to cuDNN as stored: the FP32 weights through a half copy at the start of the
    workspace (cuDNN given the rest), the weights' gradient written in half there, then widened into its
    FP32 buffer; the bias's summed in FP32 by vmem's kernels."""
    from types import SimpleNamespace

    from vmem.device.cuda.conv import _weight_copy_bytes
    from vmem.precision import dtype

    h = dtype(half)
    layer = vmem.nn.Conv2d(3, 5, 3, padding=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 3)).astype(h)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = np.zeros((2, 4, 6, 5), h)
    conv, seen = _half_conv(monkeypatch, layer, x, y)
    forward_copies = _weight_copy_bytes("forward", h, w.shape, 5)
    assert forward_copies == 512  # 135 half values, aligned to 256 bytes
    ws = np.zeros(forward_copies + 1000, np.uint8)
    conv.forward(layer, SimpleNamespace(algo="implicit_gemm", workspace=ws, relu=False), x, w, y, b)
    x_type, w_seen, y_type, ws_size = seen["forward"]
    assert (x_type, w_seen.dtype, y_type, ws_size) == (h, h, h, 1000)
    assert w_seen.tobytes() == w.astype(h).tobytes()
    want = _known(y.shape).astype(h).astype(np.float32) + b
    assert y.tobytes() == want.astype(h).tobytes()  # the bias added in place, rounded once

    dy = rng.standard_normal(y.shape).astype(h)
    dx = np.zeros_like(x)
    dw, db = np.full(w.shape, np.nan, np.float32), np.full(5, np.nan, np.float32)
    from vmem.codecs import native

    backward_copies = _weight_copy_bytes("backward_filter", h, w.shape, 5)
    assert backward_copies == 2 * 512 + 4 * 5 * native.COLUMN_GROUPS  # and the bias gradient's FP32 partial sums
    ws = np.zeros(backward_copies + 800, np.uint8)
    conv.backward(layer, SimpleNamespace(algo=("algo_1", "algo_0"), workspace=ws), dy, x, w, dx, dw, db)
    assert seen["backward_filter"][3] == seen["backward_data"][3] == 800
    assert seen["backward_data"][1].tobytes() == w.astype(h).tobytes()
    assert dw.tobytes() == _known(w.shape).astype(h).astype(np.float32).tobytes()
    # the bias's gradient summed in FP32 from the half map by vmem's column kernels (never rounded to half)
    np.testing.assert_allclose(db, dy.astype(np.float64).reshape(-1, 5).sum(0), rtol=1e-6)
    with pytest.raises(ValueError, match="cannot hold its copies"):
        conv.forward(layer, SimpleNamespace(algo=None, workspace=np.zeros(100, np.uint8), relu=False), x, w, y, b)


@needs_cudnn
@pytest.mark.parametrize("precision, data", [("fp16", 2), ("bf16", 9)])
def test_the_cuda_catalog_computes_half_convolutions_as_stored_with_their_copies_counted(monkeypatch, precision, data):
    """Over half storage the CUDA device's catalog leaves convolutions, ReLU, max pooling and copies
    unstaged, sizes each convolution's workspace for half descriptors (HALF or BFLOAT16 data, FLOAT compute,
    tensor-op math) plus its weights' half copies; the linear layer computes as stored too (cuBLAS)."""
    from types import SimpleNamespace

    from vmem.codecs import native
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import CudnnConv
    from vmem.device.staging import CUDA_NATIVE, with_float32_compute

    pytest.importorskip("ml_dtypes")
    conv = CudnnConv(SimpleNamespace(nchw=False, deterministic=True, spec=SimpleNamespace(math="exact")))
    types_seen = set()

    def workspace(d, pass_, algo):
        types_seen.add(tuple(cudnn.describe(d.x, d.w, d.conv)[k] for k in ("x_type", "compute_type", "math_type")))
        return 100

    monkeypatch.setattr(conv, "workspace", workspace)
    net = vmem.Sequential(
        vmem.nn.Conv2d(3, 4, 3, padding=1),
        vmem.nn.ReLU(),
        vmem.nn.MaxPool2d(2),
        vmem.nn.Flatten(),
        vmem.nn.Linear(4 * 9, 2),
        input_shape=(3, 6, 6),
    )
    program = with_float32_compute(net.build(2, precision=precision), conv.catalog, CUDA_NATIVE)
    by_kind = {op.kind: op for op in program.ops}
    assert {k for k, op in by_kind.items() if op.staged} == set()  # the linear layer too: cuBLAS in half
    assert types_seen == {(data, cudnn.FLOAT, cudnn.TENSOR_OP_MATH)}
    ws = by_kind["conv"].workspace
    assert set(ws["forward"].values()) == {100 + 256}  # 108 half weights, aligned
    partial = -(-4 * native.COLUMN_GROUPS * 4 // 256) * 256  # the bias gradient's FP32 partial sums
    assert set(ws["backward_data"].values()) == set(ws["backward_filter"].values()) == {100 + 2 * 256 + partial}
