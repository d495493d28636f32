"""Math modes: how a device computes FP32 convolutions ("tf32" or "exact"), recorded in its spec, plans,
timelines and checkpoints; the cuDNN types each precision and mode hands cuDNN, checked in descriptors built
through cffi without a GPU where the cuDNN wheel is installed."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import vmem
from vmem.device.cuda import cudnn


@pytest.mark.parametrize(
    "dtype, math, want",
    [
        ("float32", "exact", (cudnn.FLOAT, cudnn.FLOAT, cudnn.FMA_MATH)),
        ("float32", "tf32", (cudnn.FLOAT, cudnn.FLOAT, cudnn.DEFAULT_MATH)),
        ("float16", "exact", (cudnn.HALF, cudnn.FLOAT, cudnn.TENSOR_OP_MATH)),
        ("float16", "tf32", (cudnn.HALF, cudnn.FLOAT, cudnn.TENSOR_OP_MATH)),
        ("bfloat16", "tf32", (cudnn.BFLOAT16, cudnn.FLOAT, cudnn.TENSOR_OP_MATH)),
        ("float64", "tf32", (cudnn.DOUBLE, cudnn.DOUBLE, cudnn.FMA_MATH)),
    ],
)
def test_each_precision_and_mode_has_its_cudnn_types(dtype, math, want):
    """Exact FP32 is FMA math (cuDNN's default allows TF32 on Ampere and later); half precision is
    pseudo-half: half data, FP32 compute, tensor-op math."""
    assert cudnn.conv_types(dtype, math) == want
    assert (cudnn.FLOAT, cudnn.HALF, cudnn.BFLOAT16, cudnn.DEFAULT_MATH, cudnn.TENSOR_OP_MATH, cudnn.FMA_MATH) == (
        0,
        2,
        9,
        0,
        1,
        3,
    )  # cuDNN 9's enum values


def test_unknown_types_and_modes_are_refused():
    with pytest.raises(ValueError, match="int8"):
        cudnn.conv_types("int8", "tf32")
    with pytest.raises(ValueError, match="math='fast'"):
        cudnn.conv_types("float32", "fast")


needs_cudnn = pytest.mark.skipif(
    importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.cudnn") is None,
    reason="the cuDNN wheel is not installed (vmem[cuda])",
)


@needs_cudnn
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("math", ["tf32", "exact"])
def test_descriptors_hold_the_types_each_precision_and_mode_passes(dtype, math):
    """Built through cffi (no GPU needed) and read back from cuDNN itself."""
    from vmem.device.cuda.conv import Descs

    geometry = (8, 64, 32, 32, 128, (3, 3), (1, 1), (1, 1), 1, (1, 1))
    d = Descs(geometry, cudnn.NHWC, dtype, math)
    data, compute, math_type = cudnn.conv_types(dtype, math)
    held = cudnn.describe(d.x, d.w, d.conv)
    assert held == {
        "x_type": data,
        "w_type": data,
        "w_format": cudnn.NHWC,
        "compute_type": compute,
        "math_type": math_type,
    }
    assert cudnn.conv_output_shape(d.x, d.w, d.conv) == (8, 128, 32, 32)


def test_the_cpu_device_computes_exact_fp32_only():
    with vmem.device("cpu", memory="8MiB", math="exact") as dev:
        assert dev.spec.math == "exact"
    with pytest.raises(ValueError, match=r"cpu: math='tf32'; use 'exact' \(it computes in exact FP32 only\)"):
        vmem.device("cpu", math="tf32")


def test_a_simulated_gpu_records_its_mode_in_its_plans():
    net = vmem.models.get("vgg_cifar")
    for math in ("tf32", "exact"):
        dev = vmem.device("sim:h100-sxm", math=math)
        result = vmem.plan(net, 64, device=dev, policy="vdnn-all")
        assert dev.spec.math == math and result.plan.math == math and result.to_dict()["math"] == math
    with pytest.raises(vmem.errors.DeviceError, match="math='fp8'"):
        vmem.device("sim:h100-sxm", math="fp8")


def test_the_mode_is_in_the_timeline_and_the_checkpoint(tmp_path):
    net = vmem.models.get("digits_cnn")
    with vmem.Trainer(net, policy="baseline", memory="16MiB", seed=0) as trainer:
        x = np.random.default_rng(0).standard_normal((4,) + net.input_shape).astype(np.float32)
        report = trainer.step(x, np.arange(4) % 10)
        assert report.timeline.math == "exact" and report.timeline.chrome_trace()["otherData"] == {"math": "exact"}
        assert trainer.settings["math"] == "exact"
        trainer.save(tmp_path / "c.npz")
    from vmem.training import checkpoint

    meta = checkpoint.check(tmp_path / "c.npz", net.name)
    assert meta["settings"]["math"] == "exact" and all(p["math"] == "exact" for p in meta["plans"].values())
