"""``CudaDevice`` run whole on the CPU, unchanged, on a stand-in for CuPy 14 (``tests/standin``) that keeps
CuPy's contracts and refuses what CuPy refuses: whole training steps, profiles and plans, in fp32, fp16 and
bf16, under the named policies and ``auto``, against the CPU device's steps. A CuPy rule vmem's code breaks
fails here, not on a GPU (the GPU check found three such on 2026-11-28: a half-precision random draw, a
module path, a cuDNN call on BFLOAT16)."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn


def test_the_standin_refuses_what_cupy_refuses(cupy):
    a = cupy.ones(4, np.float32)
    with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
        a + np.ones(4, np.float32)  # a host array where a device array belongs
    with pytest.raises(TypeError, match="Unsupported type"):
        cupy.multiply(a, np.float32(2), out=np.empty(4, np.float32))
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    with pytest.raises(TypeError, match="Unsupported dtype float16 for standard_normal"):
        cupy.random.default_rng(0).standard_normal(size=4, dtype=np.float16)
    from vmem.device.cuda.kernels import Module

    relu = Module("sm_90").function("relu_f32")
    y = cupy.empty(4, np.float32)
    with pytest.raises(TypeError, match="grid and block must be tuples"):
        relu([1], (256,), (a, y, np.int64(4)))
    with pytest.raises(TypeError, match=r"int32 \(4 bytes\): the driver reads 8"):
        relu((1,), (256,), (a, y, np.int32(4)))  # an int64 parameter given 4 bytes reads 4 more
    with pytest.raises(TypeError, match="a pointer parameter given ndarray"):
        relu((1,), (256,), (np.ones(4, np.float32), y, np.int64(4)))
    relu((1,), (256,), (a - 2, y, 4))  # a Python int is passed as int64, as CuPy does
    assert y.get().tolist() == [0, 0, 0, 0]
    from cupy.cuda.runtime import CUDARuntimeError

    host = np.zeros(8, np.float32)
    with pytest.raises(CUDARuntimeError, match="not device memory"):
        cupy.cuda.runtime.memcpyAsync(a.data.ptr, host.ctypes.data, 32, 1, 0)  # 32 bytes into 16
    assert cupy._state.COUNTERS.implicit_reads == []
    bool(a[0] > 0)
    assert [kind for kind, _ in cupy._state.COUNTERS.implicit_reads] == ["bool"]


def test_the_standin_takes_what_cupy_takes(cupy):
    """What CuPy does that NumPy does too, the stand-in does: ``astype`` casts unsafely by default (float ids
    to int64), and ``add.at`` scatters with repeats (CuPy's ``ufunc.at``, an Embedding's gradient)."""
    ids = cupy.asarray(np.array([1.0, 0.0, 1.0], np.float32))
    assert ids.astype(int).get().tolist() == [1, 0, 1]
    grad = cupy.zeros((3, 2), np.float32)
    cupy.add.at(grad, ids.astype(int), cupy.ones((3, 2), np.float32))
    assert grad.get().tolist() == [[1, 1], [2, 2], [0, 0]]
    with pytest.raises(TypeError, match="Unsupported type"):
        cupy.add.at(np.zeros(3, np.float32), ids.astype(int), 1.0)


def test_cudnn_on_the_standin_refuses_what_cudnn_refuses(cupy):
    """vmem's cuDNN declarations and descriptors (through cffi, as on a GPU) over the stand-in's library:
    the math type each FP32 mode sets; BackwardBias over BFLOAT16 maps refused (NOT_SUPPORTED, as on the
    H200); a workspace smaller than the algorithm's refused; an output descriptor that is not the
    convolution's output refused."""
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import Descs

    geometry = (2, 3, 8, 8, 4, (3, 3), (1, 1), (1, 1))
    assert cudnn.describe(*(lambda d: (d.x, d.w, d.conv))(Descs(geometry, math="exact")))["math_type"] == cudnn.FMA_MATH
    tf32 = Descs(geometry, math="tf32")
    assert cudnn.describe(tf32.x, tf32.w, tf32.conv)["math_type"] == cudnn.DEFAULT_MATH
    bf16 = Descs(geometry, dtype="bfloat16")
    assert cudnn.describe(bf16.x, bf16.w, bf16.conv)["x_type"] == cudnn.BFLOAT16
    lib, f = cudnn.lib(), cudnn.ffi()
    handle = cudnn.Handle(cupy.cuda.get_current_stream().ptr)
    dy, db = cupy.zeros((2, 8, 8, 4), np.float32), cupy.zeros(4, np.float32)
    ptr = lambda a: f.cast("void *", a.data.ptr)  # noqa: E731
    one, zero = f.new("float *", 1.0), f.new("float *", 0.0)
    status = lib.cudnnConvolutionBackwardBias(handle.ptr, one, bf16.y.ptr, ptr(dy), zero, bf16.bias.ptr, ptr(db))
    assert status == cudnn.NOT_SUPPORTED
    fp32 = Descs(geometry, math="exact")
    x, w, y = (
        cupy.ones((2, 8, 8, 3), np.float32),
        cupy.ones((4, 3, 3, 3), np.float32),
        cupy.zeros((2, 8, 8, 4), np.float32),
    )
    need = f.new("size_t *")
    im2col = cudnn.ALGOS["forward"].index("gemm")
    assert (
        lib.cudnnGetConvolutionForwardWorkspaceSize(
            handle.ptr, fp32.x.ptr, fp32.w.ptr, fp32.conv.ptr, fp32.y.ptr, im2col, need
        )
        == 0
    )
    ws = cupy.zeros(max(int(need[0]) - 1, 1), np.uint8)
    args = (handle.ptr, one, fp32.x.ptr, ptr(x), fp32.w.ptr, ptr(w), fp32.conv.ptr, im2col, ptr(ws))
    assert lib.cudnnConvolutionForward(*args, int(need[0]) - 1, zero, fp32.y.ptr, ptr(y)) == cudnn.BAD_PARAM
    wrong = cudnn.TensorDesc(2, 4, 6, 6)
    assert lib.cudnnConvolutionForward(*args, int(need[0]) - 1, zero, wrong.ptr, ptr(y)) == cudnn.BAD_PARAM
    handle.close()


def _vgg() -> vmem.Sequential:
    return vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 2 * 2, 10),
        input_shape=(3, 8, 8),
    )


def _resnet() -> vmem.Network:
    return vmem.models.get("resnet_cifar", depth=8, image_size=8)


def _steps(make, device: str, policy: str, precision: str, cupy, steps: int = 3, memory: str = "4MiB") -> tuple:
    """Three steps (``steps``) on ``device``; a CUDA device computes FP32 exactly (``math="exact"``: the
    stand-in's cuDNN rounds a convolution's inputs to TF32 as tensor cores do in the default mode)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    net = make().init(seed=0)
    launches, uploads = [], []
    dev = vmem.device(device, memory=memory, **({"math": "exact"} if device.startswith("cuda") else {}))
    with dev, vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision) as trainer:
        losses = []
        for _ in range(steps):
            before, sent = dict(cupy._state.COUNTERS.launches), len(cupy._state.COUNTERS.uploads)
            losses.append(trainer.step(x, y).loss)
            after = cupy._state.COUNTERS.launches
            launches.append({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
            uploads.append(cupy._state.COUNTERS.uploads[sent:])
        trainer.sync()
        reason = trainer.plan(len(x)).reason
        return {k: v.copy() for k, v in net.params.items()}, losses, launches, reason, uploads


#: the largest difference from the CPU device's weights after three steps: in FP32, cuDNN's algorithms (the
#: stand-in's compute with the CPU device's, chosen from cuDNN's list: another may add in another order)
#: and the ResNet's batch norm sums (float64; the CPU device's lanes add in another order, so a sum may
#: round to the neighbouring float32); in half precision, maps convolved as cuDNN does (half weights, each
#: output rounded once) where the CPU device stages them through FP32 with FP32 weights; in TF32, the inputs
#: of every convolution rounded to 10 mantissa bits where the CPU device computes exactly
BOUND = {"fp32": 1e-6, "tf32": 1e-2, "half": 1e-2}


CASES = [
    (make, precision, policy, "4MiB")
    for make in (_vgg, _resnet)
    for precision in ("fp32", "fp16", "bf16")
    for policy in ("baseline", "vdnn-all:codec=zvc,signs=host", "auto")
] + [  # the split backward, and micro-batches (VGG-like at batch 8 in 200 KiB: 2 of 4 on the stand-in)
    (_vgg, precision, policy, memory)
    for precision in ("fp32", "bf16")
    for policy, memory in (("vdnn-all:split=on", "4MiB"), ("baseline:microbatch=on", "200KiB"))
]


@pytest.mark.parametrize(
    "make, precision, policy, memory", CASES, ids=[f"{m.__name__[1:]}-{p}-{q}-{b}" for m, p, q, b in CASES]
)
def test_cuda_device_trains_as_the_cpu_device_does(cupy, make, precision, policy, memory):
    """Three steps on ``CudaDevice`` over the stand-in against the CPU device's: the same weights (within
    :data:`BOUND`), every kernel through its CPU build with the GPU's arguments, no value read to the host
    behind the code's back and no host array uploaded in a step after the first. ``auto`` profiles on the device (the
    half-precision profile draws its inputs in FP32: a draw in half is refused) and plans."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    want, want_losses, _, _, _ = _steps(make, "cpu", policy, precision, cupy, memory=memory)
    cupy._state.reset()
    got, losses, launches, reason, uploads = _steps(make, "cuda:0", policy, precision, cupy, memory=memory)
    assert ("micro-batches of" in reason) == ("microbatch" in policy), reason
    counters = cupy._state.COUNTERS
    assert counters.implicit_reads == []  # bool/int/float of a device value: a hidden synchronization
    assert uploads[1:] == [[], []]  # the first step sets up (the finite check's tables); then nothing
    bound = BOUND["fp32"] if precision == "fp32" else BOUND["half"]
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    assert worst <= bound, f"weights differ by {worst} (bound {bound})"
    assert np.allclose(losses, want_losses, rtol=0, atol=10 * bound + 1e-6)
    assert launches[1] == launches[2] and launches[1]  # each step launches the same kernels


def test_the_kernels_get_their_arguments_as_the_gpu_reads_them(cupy):
    """Every kernel a VGG-like step in bf16 launches (bias and ReLU in one, ReLU's backward four values a
    thread, max pooling with the backward of the ReLU before it, column sums, the fused update) passes the
    stand-in's checks: pointers for pointers, integers at least as wide as their parameters and in range,
    floats of exactly their type."""
    pytest.importorskip("ml_dtypes")
    _, _, launches, _, _ = _steps(_vgg, "cuda:0", "baseline", "bf16", cupy, steps=2)
    names = set(launches[0])
    want = {"bias_relu_bf16", "relu_backward4_bf16", "maxpool_forward_bf16", "maxpool_relu_backward_bf16"}
    assert want | {"sgd_update"} <= names, names
    # every pool follows a ReLU: one pass for both backwards; the one ReLU before a convolution on its own
    assert "maxpool_backward_16" not in names and launches[0]["relu_backward4_bf16"] == 1
    # each ReLU runs in its convolution's bias kernel; its backward four values a thread, with no tail
    assert not names & {"relu_bf16", "relu4_bf16", "relu_backward_bf16"}, names
    assert launches[0]["bias_add_bf16"] == 1  # the linear layer's bias, added in its bf16 output
    assert launches[1]["finite_multi"] == 1  # the finite check: one kernel over every gradient, not two each
    assert cupy._state.COUNTERS.calls["isfinite"] == 2  # the loss's, once a step


def test_the_kernels_are_compiled_once_and_kept(cupy, monkeypatch, tmp_path):
    """The cubin is kept by the hash of source, options, architecture and NVRTC's version: a second
    process (the module cache cleared) loads it without compiling; a damaged one is compiled again and
    replaced; nothing is written through a link planted at its name."""
    from cupy.cuda import nvrtc

    from vmem.device.cuda import kernels

    monkeypatch.setenv("VMEM_CACHE_DIR", str(tmp_path))
    source = kernels.source_file(kernels.SOURCE.name).read_text()
    path = kernels.cubin_path("sm_90", source)
    assert path.parent == tmp_path / "kernels" and "sm_90" in path.name
    start = len(nvrtc.COMPILED)
    kernels._module.cache_clear()
    kernels._module("sm_90")
    assert len(nvrtc.COMPILED) == start + 1 and path.is_file()
    kernels._module.cache_clear()
    kernels._module("sm_90").get_function("relu_f32")
    assert len(nvrtc.COMPILED) == start + 1  # loaded, not compiled
    path.write_bytes(b"not a cubin")
    kernels._module.cache_clear()
    kernels._module("sm_90")
    assert len(nvrtc.COMPILED) == start + 2 and path.read_bytes().startswith(b"standin-cubin")
    path.unlink()
    target = tmp_path / "elsewhere"
    path.symlink_to(target)
    kernels._module.cache_clear()
    kernels._module("sm_90")
    assert not target.exists() and path.is_symlink()  # compiled, and the link left alone
    monkeypatch.setenv("VMEM_KERNEL_CACHE", "0")
    kernels._module.cache_clear()
    kernels._module("sm_90")
    assert len(nvrtc.COMPILED) == start + 4


@pytest.mark.parametrize("policy", ["baseline", "vdnn-all", "vdnn-all:signs=host", "auto"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_consecutive_steps_issue_the_same_work_at_the_same_addresses(cupy, policy, precision):
    """What a CUDA graph of a step would capture (vmem's kernels with their arguments, copies and fills
    through the runtime, pointers as addresses) is the same in the second step as in the third: the plan
    places every buffer where it placed it before (a captured step can be replayed). Not yet so for an
    offload through a codec: its encoded buffer is CuPy's, made each step (zvc's and ssdc's sizes depend on
    the data besides)."""
    if precision == "bf16":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    traces = []
    with vmem.Trainer(
        _vgg().init(seed=0), device="cuda:0", policy=policy, memory="4MiB", precision=precision
    ) as trainer:
        for _ in range(3):
            start = len(cupy._state.COUNTERS.trace)
            trainer.step(x, y)
            traces.append(cupy._state.COUNTERS.trace[start:])
    kinds = {entry[0] for entry in traces[1]}
    assert "kernel" in kinds and "copy" in kinds
    assert traces[1] == traces[2]


class _TorchLike:
    """Another library's CUDA tensor: nothing but ``__cuda_array_interface__`` (as a PyTorch CUDA tensor)."""

    def __init__(self, array):
        self._array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


def test_a_step_takes_the_batch_where_it_is_on_the_device(cupy):
    """``Trainer.step`` takes device arrays (CuPy's, or another library's through
    ``__cuda_array_interface__``), NCHW in FP32 or half: the same weights as from the host batch, the
    input transposed and cast on the device (no host copy of it: one device-to-device kernel), the labels
    read once to be checked."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    results = {}
    for kind in ("host", "cupy", "interface", "fp16"):
        net = _vgg().init(seed=0)
        exact = vmem.device("cuda:0", memory="4MiB", math="exact")  # TF32 would round the FP32 batch as half does
        with exact, vmem.Trainer(net, device=exact, policy="baseline", seed=0) as trainer:
            for _ in range(2):
                if kind == "host":
                    xb, yb = x, y
                else:
                    dev_x = cupy.asarray(x.astype(np.float16) if kind == "fp16" else x)
                    xb, yb = (dev_x if kind != "interface" else _TorchLike(dev_x)), cupy.asarray(y)
                copies = cupy._state.COUNTERS.copies
                trainer.step(xb, yb)
                copies = cupy._state.COUNTERS.copies - copies
            trainer.sync()
            results[kind] = ({k: v.copy() for k, v in net.params.items()}, copies)
    for kind in ("cupy", "interface"):
        assert all(np.array_equal(results[kind][0][k], results["host"][0][k]) for k in results["host"][0])
        assert results[kind][1] == results["host"][1] - 1  # the input's host-to-device copy gone
    worst = max(float(np.abs(results["fp16"][0][k] - results["host"][0][k]).max()) for k in results["host"][0])
    assert 0 < worst < 1e-2  # the batch rounded to half before it came
    with vmem.Trainer(_vgg(), device="cuda:0", policy="baseline", memory="4MiB") as trainer:
        with pytest.raises(vmem.errors.ShapeError, match="has shape"):
            trainer.step(cupy.asarray(x[:, :2]), y)


@pytest.mark.parametrize("policy", ["vdnn-all", "auto"])
@pytest.mark.parametrize("math", ["tf32", "exact"])
def test_both_fp32_math_modes_train_on_the_standin(cupy, math, policy, monkeypatch):
    """The device's FP32 math mode decides the math type of every convolution cuDNN runs (set on the
    descriptor before each call; the stand-in rounds the inputs to TF32 where it is DEFAULT or TENSOR_OP,
    as tensor cores do): exact runs in FMA math only, however cuDNN ranks its tensor-op entries (first),
    and trains within :data:`BOUND` of the CPU device; TF32 runs tensor-op entries, and its weights move
    off the CPU device's by TF32's rounding, within ``BOUND["tf32"]``. ``auto`` profiles (algorithm, math
    type) pairs and plans with them."""
    monkeypatch.setenv("VMEM_PROFILE_CACHE", "0")  # profiled here: a kept profile would run only the plan's pairs
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    weights = []
    for name, options in (("cpu", {}), ("cuda:0", {"math": math})):
        net = _vgg().init(seed=0)
        with vmem.device(name, memory="4MiB", **options) as device:
            with vmem.Trainer(net, device=device, policy=policy, seed=0) as trainer:
                trainer.step(x, y)
                mark = len(cupy._cudnn.maths)  # the profile and the first step before it
                for _ in range(2):
                    trainer.step(x, y)
                trainer.sync()
                algos = trainer.plan(len(x)).plan.algos
            assert device.spec.math == ("exact" if name == "cpu" else math)
        weights.append(net.params)
    from vmem.device.cuda import cudnn

    ran = {m for _, _, m in cupy._cudnn.maths}
    worst = max(float(np.abs(weights[0][k] - weights[1][k]).max()) for k in weights[0])
    first = _vgg().build(len(x)).ops[0].name  # its input is the batch: its backward-data pass never runs
    chosen = [
        (p, *cudnn.unpair(a))
        for name, passes in algos.items()
        for p, a in (passes or {}).items()
        if (name, p) != (first, "backward_data")
    ]
    own = cudnn.FMA_MATH if math == "exact" else cudnn.DEFAULT_MATH
    if chosen:  # each planned pair runs in its own math type: set on the descriptor before the call
        want = {(p, cudnn.ALGOS[p].index(a), own if m is None else m) for p, a, m in chosen}
        assert set(cupy._cudnn.maths[mark:]) == want
    if math == "exact":
        assert ran == {cudnn.FMA_MATH}, ran  # no TF32, though the stand-in ranks tensor-op entries first
        assert worst <= BOUND["fp32"]
        assert all(m is None for _, _, m in chosen)
    else:
        assert ran & {cudnn.DEFAULT_MATH, cudnn.TENSOR_OP_MATH}, ran  # tensor-op entries ran (profiled, at least)
        assert worst <= BOUND["tf32"]
        if policy == "vdnn-all":  # cuDNN's default algorithms in the descriptor's math: TF32
            assert worst > BOUND["fp32"]


def test_a_host_batch_is_copied_as_it_is_and_transposed_on_the_gpu(cupy):
    """A float32 NCHW batch in host memory goes to the GPU as it is (one copy of its bytes from pinned
    staging: the host neither transposes nor casts it) and one kernel makes the network's channels-last input
    in its storage type there; the weights are those of the CPU device's steps."""
    pytest.importorskip("ml_dtypes")
    want, _, _, _, _ = _steps(_vgg, "cpu", "baseline", "bf16", cupy, steps=2)
    cupy._state.reset()
    got, _, launches, _, _ = _steps(_vgg, "cuda:0", "baseline", "bf16", cupy, steps=2)
    assert launches[1].get("nchw_to_nhwc_bf16") == 1
    nchw = 8 * 3 * 8 * 8 * 4  # the batch's bytes as the caller holds them
    assert any(e[0] == "copy" and e[3] == nchw and e[4] == 1 for e in cupy._state.COUNTERS.trace)
    worst = max(float(np.max(np.abs(got[k] - want[k]))) for k in want)
    assert worst <= BOUND["half"]


@pytest.mark.parametrize("math, dtype", [("exact", "float32"), ("tf32", "float32"), ("tf32", "float16")])
def test_cudnn_results_are_algorithm_and_math_type_pairs(cupy, math, dtype):
    """cuDNN's ranking and search list an algorithm once per math type (tensor-op entries first on the
    stand-in) in as many entries as ``Get*AlgorithmMaxCount`` says: vmem names each pair (its own math type
    plain, another ``@fma``/``@tensor_op``), keeps only the math types the device's mode allows (FMA alone
    for exact FP32), drops the entries cuDNN marks non-deterministic on a deterministic device, keeps a
    pair's faster entry, and offers in its catalog every pair it may rank, with its workspace."""
    from vmem.costs.timing import fastest
    from vmem.device.cuda import cudnn
    from vmem.device.cuda.conv import CudnnConv

    if dtype == "float16":
        pytest.importorskip("ml_dtypes")
    layer = nn.Conv2d(3, 4, 3, padding=1)
    shapes = ((2, 8, 8, 3), (2, 8, 8, 4))
    for deterministic in (False, True):
        with vmem.device("cuda:0", memory="4MiB", math=math, deterministic=deterministic) as dev:
            conv = dev.conv_backend
            assert isinstance(conv, CudnnConv)
            ranked = {p: conv.heuristic(layer, p, *shapes, dtype) for p in cudnn.ALGOS}
            x = cupy.asarray(np.ones(shapes[0], dtype))
            w = cupy.asarray(np.ones((4, 3, 3, 3), dtype))
            y = cupy.zeros(shapes[1], dtype)
            ws = cupy.zeros(1 << 16, np.uint8)
            with dev.compute_stream.stream:  # a search runs the convolutions: on the handle's stream
                found = conv.find(layer, "forward", x, w, y, ws)
            program = conv.catalog(vmem.Sequential(layer, input_shape=(3, 8, 8)).build(2))
        pairs = [cudnn.unpair(a) for names in ranked.values() for a in names]
        maths = {m for _, m in pairs}
        if math == "exact":
            assert maths == {None}  # FMA, the descriptor's own: no tensor-op entry survives
        else:
            own = conv.descs(layer, *shapes, dtype=dtype).conv.own
            assert cudnn.FMA_MATH in maths and len(maths) >= 2  # tensor-op (or its own) and FMA
            assert ranked["forward"][0] == cudnn.pair("implicit_gemm", cudnn.TENSOR_OP_MATH, own)
        nondet = {
            a for p, names in ranked.items() for a in names if cudnn.unpair(a)[0] in cudnn.NONDETERMINISTIC.get(p, ())
        }
        assert bool(nondet) != deterministic  # read from each result's determinism
        assert len(fastest(found)) == len({r[0] for r in found})
        assert all("@" not in n for n, _, _ in found) == (math == "exact")
        offered = program.ops[0].algorithms
        assert all(a in offered[p] for p, names in ranked.items() for a in names)
        assert all(cudnn.unpair(a)[1] is None for a in offered["forward"]) == (math == "exact")


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_steps_after_the_first_make_no_events(cupy, graphs):
    """Events come from the device's pool: each span's two timing events, and the streams' ordering
    events, are recorded again once dropped, so a step after the first makes no ``cupy.cuda.Event``;
    captured steps time nothing."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.device("cuda:0", memory="4MiB", math="exact", graphs=graphs) as device:
        with vmem.Trainer(_vgg().init(seed=0), device=device, policy="vdnn-all", seed=0) as trainer:
            for _ in range(2):
                trainer.step(x, y)
            trainer.sync()
            made = device.events.made
            assert made > 0 and device.events.free(True) + device.events.free(False) > 0
            for _ in range(3):
                trainer.step(x, y)
            trainer.sync()
            assert device.events.made == made
    assert cupy._state.COUNTERS.capture_timing_events == 0


def test_where_cudnns_heuristics_rank_nothing_its_search_times_every_pass(cupy, monkeypatch):
    """The profile's second strategy (``Find*Ex``, then the fastest timed as the layer runs it, the others
    given cuDNN's time plus the same overhead) where the heuristics rank no algorithm: every convolution pass
    gets finite times, and the run trains at its planned peak."""
    from vmem.costs import timing
    from vmem.device.cuda.conv import CudnnConv

    monkeypatch.setenv("VMEM_PROFILE_CACHE", "0")
    monkeypatch.setattr(CudnnConv, "heuristic", lambda self, *a, **k: [])
    found = []
    search = timing._profile_conv_found
    monkeypatch.setattr(timing, "_profile_conv_found", lambda case: (search(case), found.append(case.op.name))[0])
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 4)
    net = _vgg().init(seed=0)
    with vmem.device("cuda:0", memory="4MiB") as dev, vmem.Trainer(net, device=dev, policy="auto", seed=0) as t:
        costs = t.profile(4)
        report = t.step(x, y)
        plan = t.plan(4)
    convs = [op for op in net.build(4).ops if op.kind == "conv"]
    assert sorted(found) == sorted(op.name for op in convs)
    for op in convs:
        for pass_ in ("forward", "backward_filter", "backward_data"):
            assert any(np.isfinite(v) for (n, p, _), v in costs.times.items() if n == op.name and p == pass_)
    assert report.peak_bytes == plan.peak_bytes
