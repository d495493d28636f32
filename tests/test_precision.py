"""Mixed precision: feature maps stored in fp16 or bf16 (weights, their gradients and optimizer state in
fp32), the CPU device computing in float32 and rounding each output once, fp16's loss scale."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.graph.program import Precision
from vmem.precision import activations_dtype, dtype

ml_dtypes = pytest.importorskip("ml_dtypes")


def _fuzz() -> np.ndarray:
    """float32 values at the edges of fp16 and bf16: halfway cases either way, subnormals, overflow."""
    rng = np.random.default_rng(0)
    f16 = rng.integers(0, 0x7C00, 4000, dtype=np.uint16).view(np.float16).astype(np.float32)
    nxt = np.nextafter(f16.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    halfway16 = (f16 + nxt) / 2  # exactly between two fp16 values (float32 holds it)
    bits = rng.integers(0, 0x7F80, 4000, dtype=np.uint32) << 16
    bf = bits.view(np.float32)
    halfway_bf = (bits | 0x8000).view(np.float32)  # exactly between two bf16 values
    tiny = rng.standard_normal(2000).astype(np.float32) * np.float32(1e-6)  # fp16 subnormals
    huge = np.float32([65504, 65519.99, 65520, 70000, 3.4e38, -1e6])  # around fp16's largest, and past it
    values = np.concatenate([f16, halfway16, bf, halfway_bf, tiny, huge, rng.standard_normal(4000).astype(np.float32)])
    return np.concatenate([values, -values])


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_storage_rounds_as_numpy_and_ml_dtypes_cast_bit_for_bit(precision):
    """The executor's one rounding per output (``stored[...] = float32 result``) is the library's cast."""
    x = _fuzz()
    target = dtype(activations_dtype(precision))
    stored = np.empty(x.shape, target)
    with np.errstate(over="ignore"):  # past fp16's largest value: inf, both ways
        stored[...] = x
        reference = x.astype(np.float16) if precision == "fp16" else x.astype(ml_dtypes.bfloat16)
    assert stored.view(np.uint16).tobytes() == reference.view(np.uint16).tobytes()
    back = np.empty(x.shape, np.float32)
    back[...] = stored  # widening is exact
    assert np.array_equal(back, reference.astype(np.float32), equal_nan=True)


def test_a_precision_names_its_dtypes_and_unknown_ones_are_refused():
    assert Precision.of("fp16") == Precision("float16", "float32", "float32", "float32", "float32")
    assert Precision.of("bf16").activations == "bfloat16" and Precision.of("fp32") == Precision.uniform("float32")
    assert [Precision.of(p).name for p in ("fp32", "fp16", "bf16")] == ["fp32", "fp16", "bf16"]
    with pytest.raises(ValueError, match="precision='fp8'.*fp32, fp16, bf16"):
        activations_dtype("fp8")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_every_feature_map_takes_half_the_bytes(precision):
    net = vmem.models.get("vgg_cifar")
    full, half = net.build(16), net.build(16, precision=precision)
    assert 2 * sum(t.nbytes for t in half.buffers()) == sum(t.nbytes for t in full.buffers())
    low = activations_dtype(precision)
    assert half.tensors[half.input].dtype == half.tensors[half.output].dtype == low  # the batch and logits too
    assert half.param_bytes == full.param_bytes  # weights stay fp32
    ids = vmem.models.get("nmt_small").build(4, precision=precision)
    assert ids.tensors[ids.input].dtype == "float32"  # token ids are kept exact


def test_half_logits_give_a_float32_loss_and_gradient_scaled_before_rounding():
    """The loss reads fp16 logits into float32 probabilities; d(logits) is made and scaled in float32 and
    rounded once, so a gradient below fp16's smallest subnormal survives a large loss scale."""
    loss = vmem.nn.SoftmaxCrossEntropy()
    logits = np.array([[0.0, -12.0, 5.0], [1.0, 1.0, -20.0]], np.float16)
    labels = np.array([2, 0])
    probs = np.empty(logits.shape, np.float32)
    value = loss.forward(np, logits, labels, probs)
    wide = logits.astype(np.float32)
    p = np.exp(wide - wide.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert value.dtype == np.float32 and value == pytest.approx(-np.log(p[[0, 1], [2, 0]]).mean(), rel=1e-6)
    loss.backward(np, probs, labels, probs)
    probs *= np.float32(65536.0)
    dlogits = np.empty(logits.shape, np.float16)
    dlogits[...] = probs
    assert np.float16(probs[0, 1] / 65536) == 0 and dlogits[0, 1] > 0  # unscaled, fp16 would flush it to zero


def _digits(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 8, 8)).astype(np.float32), rng.integers(0, 10, n)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("policy", ["baseline", "vdnn-all"])
def test_a_low_precision_step_runs_at_its_planned_peak_and_follows_fp32(precision, policy):
    x, y = _digits()
    losses, weights = {}, {}
    for p in ("fp32", precision):
        net = vmem.models.get("digits_cnn")
        with vmem.Trainer(net, device="cpu", memory="64MiB", policy=policy, precision=p, seed=0) as t:
            for _ in range(3):
                report = t.step(x, y)
                assert report.peak_bytes == t.plans[32].peak_bytes  # the staging copies are in the plan
            losses[p] = report.loss
            assert (report.loss_scale == 65536.0) == (p == "fp16")
        weights[p] = {k: v.copy() for k, v in net.params.items()}
    assert abs(losses[precision] - losses["fp32"]) < 0.05
    for k, w in weights["fp32"].items():
        assert weights[precision][k].dtype == np.float32  # master weights stay fp32
        np.testing.assert_allclose(weights[precision][k], w, rtol=0.05, atol=0.02)


def test_the_stored_map_is_the_float32_result_rounded_once():
    """ReLU's output stored in fp16, read by a Linear computing in float32: the logits are the float32
    Linear of float16(relu(x)), halfway cases and subnormals included."""
    net = vmem.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(64, 3), input_shape=(1, 8, 8))
    net.init(0)
    values = _fuzz()
    x = values[np.abs(values) < 60000][: 4 * 64].reshape(4, 1, 8, 8)  # no overflow here
    with vmem.Trainer(net, device="cpu", policy="baseline", memory="16MiB", precision="fp16", seed=0) as t:
        logits = t.predict(x)
    stored = np.maximum(x.astype(np.float16), 0).astype(np.float32).reshape(4, 64)  # the input is staged in fp16
    w, b = net.params["linear1.weight"], net.params["linear1.bias"]
    expected = (stored @ w.T + b).astype(np.float16).astype(np.float32)  # the logits rounded once
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=2e-3, atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_fp16_overflow_is_skipped_and_the_scale_backs_off_without_changing_anything():
    x, y = _digits()
    net = vmem.models.get("digits_cnn")
    scaler = vmem.optim.GradScaler(init_scale=3.0e38)  # any gradient times this overflows float32
    with vmem.Trainer(
        net, device="cpu", policy="baseline", memory="64MiB", precision="fp16", scaler=scaler, seed=0
    ) as t:
        before = {k: v.copy() for k, v in net.params.items()}
        report = t.step(x, y)
        assert report.skipped and np.isfinite(report.loss) and t.scaler.scale == pytest.approx(1.5e38, rel=1e-6)
        assert all(np.array_equal(net.params[k], v) for k, v in before.items())
        assert t.steps_done == 0
    with pytest.raises(ValueError, match="scaler= applies to precision='fp16'"):
        vmem.Trainer(vmem.models.get("digits_cnn"), precision="bf16", scaler=vmem.optim.GradScaler())


LOSSLESS = ("layerwise", "vdnn-all", "vdnn-conv", "vdnn-all:codec=zvc", "vdnn-all:codec=ssdc", "gist", "chen", "echo")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_lossless_policies_give_the_baselines_weights_bit_for_bit_at_each_precision(precision):
    """Offload, Gist's lossless encodings (binarize, ssdc) and recomputation on 16-bit maps change nothing."""
    from tests.lossless import all_equal, weights_under

    x, y = _digits(16)
    make = lambda: vmem.models.get("digits_cnn")  # noqa: E731
    weights = weights_under(make, ("baseline",) + LOSSLESS, x, y, precision=precision, memory="32MiB")
    assert all_equal(weights)


def test_a_checkpoint_keeps_the_precision_and_the_loss_scale(tmp_path):
    from vmem.errors import CheckpointError
    from vmem.training import checkpoint

    x, y = _digits()
    path = tmp_path / "half.npz"
    scaler = vmem.optim.GradScaler(init_scale=1024.0, growth_interval=2)
    with vmem.Trainer(
        vmem.models.get("digits_cnn"), policy="baseline", memory="64MiB", precision="fp16", scaler=scaler, seed=0
    ) as t:
        for _ in range(3):
            t.step(x, y)
        state = t.scaler.state_dict()
        assert state["scale"] == 2048.0 and state["growth_tracker"] == 1
        t.save(path)
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="64MiB", precision="fp16", seed=0) as t:
        t.load(path)
        assert t.scaler.state_dict() == state  # goes on at the scale it had reached
    data, meta = checkpoint._load(path)
    assert meta["precision"] == "fp16"
    meta["scaler"] = {"scale": float("inf"), "growth_tracker": 0}
    bad = tmp_path / "bad.npz"
    np.savez(bad, meta=np.array(__import__("json").dumps(meta)), **data)
    with pytest.raises(CheckpointError, match="bad.npz: entry 'meta.scaler'"):
        with vmem.Trainer(
            vmem.models.get("digits_cnn"), policy="baseline", memory="64MiB", precision="fp16", seed=0
        ) as t:
            t.load(bad)


def test_the_timeline_marks_the_loss_scale_and_a_skipped_step():
    x, y = _digits()
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="64MiB", precision="fp16", seed=0) as t:
        trace = t.step(x, y).timeline.chrome_trace()
    marks = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert [m["args"] for m in marks] == [{"loss_scale": 65536.0, "skipped": False}]
    assert marks[0]["name"] == "step: loss_scale 65536, skipped False"


def _native_cpu(memory):
    """The CPU device computing half-precision maps as the CUDA device does (the kinds of
    ``staging.CUDA_NATIVE`` as they are stored, through the GPU's layer ops built for the CPU) except its
    convolutions and linear layers, which only cuDNN and cuBLAS compute in half: the host's stay staged."""
    from vmem.device.cpu import CpuDevice
    from vmem.device.hostconv import with_host_catalog
    from vmem.device.kernel_ops import KernelOps
    from vmem.device.lanes import LaneOps
    from vmem.device.staging import CUDA_NATIVE, with_float32_compute

    class NativeOps(KernelOps, LaneOps):  # the kernels' ReLU and max pooling; the rest as the CPU's lanes
        pass

    class NativeCpu(CpuDevice):
        def catalog(self, program):
            return with_float32_compute(program, with_host_catalog, CUDA_NATIVE - {"conv", "linear"})

    dev = NativeCpu(memory, poison=True)
    dev.ops = NativeOps(dev.budget)
    return dev


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("policy", ["baseline", "vdnn-all"])
def test_maps_computed_as_stored_give_the_staged_ways_weights_bit_for_bit(precision, policy):
    """The executor's way for ops a device computes over half storage without float32 copies (the CUDA
    device's ReLU, max pooling and copies), run on the CPU: the weights of the all-staged CPU device, bit for
    bit (ReLU and max pooling select; their half results equal the float32 ones rounded once), in a plan
    whose native ops have no staging copies."""
    x, y = _digits(16)
    weights, staged = {}, {}
    for native in (False, True):
        net = vmem.models.get("digits_cnn")
        dev = _native_cpu("32MiB") if native else vmem.device("cpu", memory="32MiB", poison=True)
        with vmem.Trainer(net, device=dev, policy=policy, seed=0, precision=precision) as t:
            for _ in range(3):
                report = t.step(x, y)
                assert np.isfinite(report.loss) and report.peak_bytes == t.plans[16].peak_bytes
        program = dev.catalog(net.build(16, precision=precision))
        staged[native] = {op.kind for op in program.ops if op.staged}
        dev.close()
        weights[native] = {k: v.copy() for k, v in net.params.items()}
    assert staged[False] == {"conv", "relu", "maxpool", "flatten", "linear"}
    assert staged[True] == {"conv", "linear"}
    for k, w in weights[False].items():
        assert weights[True][k].tobytes() == w.tobytes(), k
