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
def test_every_map_between_input_and_logits_takes_half_the_bytes(precision):
    net = vmem.models.get("vgg_cifar")
    full, half = net.build(16), net.build(16, precision=precision)
    inner = lambda p: sum(t.nbytes for t in p.tensors if t.id not in (p.input, p.output))  # noqa: E731
    assert 2 * inner(half) == inner(full)
    assert half.tensors[half.input].dtype == half.tensors[half.output].dtype == "float32"  # the batch, the loss
    assert half.param_bytes == full.param_bytes  # weights stay fp32


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
    with vmem.Trainer(net, device="cpu", memory="16MiB", precision="fp16", seed=0) as t:
        logits = t.predict(x)
    stored = np.maximum(x, 0).astype(np.float16).astype(np.float32).reshape(4, 64)
    w, b = net.params["linear1.weight"], net.params["linear1.bias"]
    expected = stored @ w.T + b
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow is the point
def test_fp16_overflow_is_skipped_and_the_scale_backs_off_without_changing_anything():
    x, y = _digits()
    net = vmem.models.get("digits_cnn")
    scaler = vmem.optim.GradScaler(init_scale=3.0e38)  # any gradient times this overflows float32
    with vmem.Trainer(net, device="cpu", memory="64MiB", precision="fp16", scaler=scaler, seed=0) as t:
        before = {k: v.copy() for k, v in net.params.items()}
        report = t.step(x, y)
        assert report.skipped and np.isfinite(report.loss) and t.scaler.scale == pytest.approx(1.5e38, rel=1e-6)
        assert all(np.array_equal(net.params[k], v) for k, v in before.items())
        assert t.steps_done == 0
    with pytest.raises(ValueError, match="scaler= applies to precision='fp16'"):
        vmem.Trainer(vmem.models.get("digits_cnn"), precision="bf16", scaler=vmem.optim.GradScaler())
