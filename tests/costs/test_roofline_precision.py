"""The simulator's roofline in half precision: tensor-core peaks for the algorithms that use them, the FP32
rate elsewhere (cuDNN's pseudo-half), and every byte at its dtype."""

from __future__ import annotations

import pytest

import vmem
from vmem.costs import Roofline, with_cudnn_catalog
from vmem.device import specs


def _conv(precision: str, batch: int = 64):
    nn = vmem.nn
    net = vmem.Sequential(
        nn.Conv2d(256, 256, 3, padding=1), nn.Flatten(), nn.Linear(256 * 28 * 28, 10), input_shape=(256, 28, 28)
    )
    program = with_cudnn_catalog(net.build(batch, precision=precision), "volta")
    return program.ops[0]


@pytest.mark.parametrize("gpu", ["v100-16gb", "a100-40gb", "h100-sxm"])
def test_a_compute_bound_convolution_runs_on_tensor_cores_in_fp16(gpu):
    model = Roofline(specs.get(gpu))
    full, half = _conv("fp32"), _conv("fp16")
    tc = model.op_seconds(half, "forward", "implicit_precomp_gemm")
    fp32 = model.op_seconds(full, "forward", "implicit_precomp_gemm")
    assert tc < fp32 / 2  # several times the FP32 peak
    # FFT does not run on tensor cores: no faster than in fp32 (half the bytes at most)
    assert model.op_seconds(half, "forward", "fft") >= model.op_seconds(full, "forward", "fft") / 2
    # workspace sized at 2 bytes a value
    assert half.workspace["forward"]["gemm"] * 2 == full.workspace["forward"]["gemm"]


def test_a_gpu_without_tensor_cores_computes_half_at_its_fp32_rate():
    spec = specs.get("titan-x")
    assert spec.fp16_tflops is None and spec.bf16_tflops is None
    model = Roofline(spec)
    full, half = _conv("fp32"), _conv("fp16")
    assert model.op_seconds(half, "forward", "implicit_precomp_gemm") == pytest.approx(
        model.op_seconds(full, "forward", "implicit_precomp_gemm"), rel=0.05
    )


def test_bf16_uses_its_own_peak():
    assert specs.get("v100-16gb").bf16_tflops is None  # Volta has no bf16 units
    assert specs.get("a100-40gb").bf16_tflops == specs.get("a100-40gb").fp16_tflops == 312.0
    v100, a100 = Roofline(specs.get("v100-16gb")), Roofline(specs.get("a100-40gb"))
    bf16 = _conv("bf16")
    assert (
        v100.op_seconds(bf16, "forward", "implicit_precomp_gemm")
        > a100.op_seconds(bf16, "forward", "implicit_precomp_gemm") * 4
    )
