"""Linear layers over fp16/bf16 maps on the CUDA device (the CuPy stand-in, whose cuBLAS keeps gemmEx's
column-major contract): half operands multiplied with FP32 accumulation, the FP32 weights read through a half
copy in the op's workspace, the weights' gradient written in FP32, the bias's summed in FP32."""

from __future__ import annotations

import numpy as np
import pytest

import vmem
from vmem import nn


ml_dtypes = pytest.importorskip("ml_dtypes")
HALF = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("out", ["half", "float32"])
def test_gemm_is_a_row_major_product_rounded_once(cupy, trans_a, trans_b, out):
    """``blas.gemm`` asks cuBLAS (column-major) for a row-major ``op(a) @ op(b)``: the product of the half
    values in FP32, rounded once into the result's type."""
    from vmem.device.cuda import blas

    rng = np.random.default_rng(0)
    h = ml_dtypes.bfloat16
    a = rng.standard_normal((5, 3) if trans_a else (3, 5)).astype(h)
    b = rng.standard_normal((4, 5) if trans_b else (5, 4)).astype(h)
    want = (a.T if trans_a else a).astype(np.float32) @ (b.T if trans_b else b).astype(np.float32)
    c = cupy.zeros((3, 4), h if out == "half" else np.float32)
    blas.gemm(cupy.asarray(a), cupy.asarray(b), c, trans_a=trans_a, trans_b=trans_b)
    assert c.get().tobytes() == want.astype(c.dtype).tobytes()
    assert cupy.cuda.cublas.calls[-1][2] == blas.COMPUTE_32F
    with pytest.raises(ValueError, match="op\\(a\\)"):
        blas.gemm(cupy.asarray(a), cupy.asarray(b), cupy.zeros((4, 4), np.float32), trans_a, trans_b)
    with pytest.raises(TypeError, match="one type"):
        blas.gemm(cupy.asarray(a), cupy.asarray(b.astype(np.float16)), c, trans_a, trans_b)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_half_linear_layer_is_cublas_with_fp32_accumulation(cupy, precision):
    """Forward and backward of a linear layer over half maps through the GPU's ops: y rounded once from the
    product of x and the weights' half copy, then the bias added (rounded once more, as vmem's bias kernel
    does); dW in FP32 from the half operands; db in FP32; dx rounded once. The weights are read through the
    copy at the workspace's start; the workspace holds exactly what :func:`linear_copies` counts."""
    from vmem.device.kernel_ops import KernelOps, linear_copies

    h = HALF[precision]
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((6, 8)).astype(h), rng.standard_normal((6, 5)).astype(h)
    w, b = rng.standard_normal((5, 8)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    device = vmem.device("cuda:0", memory="8MiB")  # registers vmem's kernels for the GPU's arrays
    ops = KernelOps(cupy)
    y = cupy.zeros((6, 5), h)
    ws = cupy.zeros(linear_copies("forward", h, w.shape, 5), np.uint8)
    ops.linear(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), y, ws)
    wh = w.astype(h).astype(np.float32)
    product = (x.astype(np.float32) @ wh.T).astype(h)
    assert y.get().tobytes() == (product.astype(np.float32) + b).astype(h).tobytes()
    assert ws.get()[: w.size * 2].view(h).reshape(w.shape).tobytes() == w.astype(h).tobytes()

    dx, dw, db = cupy.zeros((6, 8), h), cupy.zeros((5, 8), np.float32), cupy.zeros(5, np.float32)
    ws = cupy.zeros(linear_copies("backward_data", h, w.shape, 5), np.uint8)
    ops.linear_backward(cupy.asarray(dy), cupy.asarray(x), cupy.asarray(w), dx, dw, db, ws)
    assert dw.get().tobytes() == (dy.astype(np.float32).T @ x.astype(np.float32)).tobytes()
    np.testing.assert_allclose(db.get(), dy.astype(np.float64).sum(0), rtol=1e-6)
    assert dx.get().tobytes() == (dy.astype(np.float32) @ wh).astype(h).tobytes()
    with pytest.raises(ValueError, match="cannot hold"):
        ops.linear(cupy.asarray(x), cupy.asarray(w), None, y, cupy.zeros(10, np.uint8))
    device.close()


def test_the_plan_counts_the_half_copies_and_the_step_peaks_where_planned(cupy):
    """The CUDA device's catalog grows a half linear layer's workspace by its copies; a bf16 step on the
    stand-in peaks where the plan says, and every linear product runs on cuBLAS (none on the FP32 path)."""
    net = vmem.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 32),
        nn.ReLU(),
        nn.Linear(32, 10),
        input_shape=(3, 8, 8),
    ).init(seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.device("cuda:0", memory="8MiB", math="exact") as dev:
        program = dev.catalog(net.build(8, precision="bf16"))
        fc = {op.name: op for op in program.ops if op.kind == "linear"}
        assert not any(op.staged for op in fc.values())
        first = next(iter(fc.values()))
        assert first.workspace["forward"][None] >= 8 * 8 * 8 * 32 * 2  # its weights' bf16 copy
        with vmem.Trainer(net, device=dev, policy="baseline", seed=0, precision="bf16") as trainer:
            cupy.cuda.cublas.calls.clear()
            report = trainer.step(x, y)
            assert report.peak_bytes == trainer.plans[8].peak_bytes
            assert cupy._state.COUNTERS.calls.get("matmul", 0) == 0
            assert {(a, c) for a, c, _ in cupy.cuda.cublas.calls} == {(14, 14), (14, 0)}  # bf16 -> bf16, -> FP32
