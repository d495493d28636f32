"""The GPU's layer ops (vmem.device.kernel_ops.KernelOps: ReLU through vmem's kernels, in place, no copy of
an overlapping input) give the NumPy path's bytes: run here on the kernels' CPU build, in fp32, fp16 and
bf16, in place and not."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.codecs import native
from vmem.device.kernel_ops import KernelOps
from vmem.nn.ops import ArrayOps, HostOps

ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built")
DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


def _data(dtype, seed):
    x = (np.random.default_rng(seed).standard_normal((4, 5, 6, 7)) * 2).astype(np.float32).astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40], np.float32).astype(dtype)
    x.reshape(-1)[: specials.size] = specials
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_relu_forward_and_backward_give_the_numpy_paths_bytes(dtype):
    ops = KernelOps(np)
    x = _data(dtype, 0)
    # the reference computes in FP32, as the CPU device computes half precision (NumPy's own float16
    # maximum keeps -0 where its float32 one gives +0)
    wide = np.empty(x.shape, np.float32)
    HostOps().relu(x.astype(np.float32), wide)
    want = wide.astype(dtype)
    if dtype is np.float32:  # the generic path too
        got = np.empty_like(x)
        ArrayOps(np).relu(x, got)
        assert got.tobytes() == want.tobytes()
    y = np.empty_like(x)
    ops.relu(x, y)
    assert y.tobytes() == want.tobytes()
    ops.relu(x, x)  # in place: the same buffer in and out
    assert x.tobytes() == want.tobytes()
    dy = _data(dtype, 1)
    dx_wide = np.empty(dy.shape, np.float32)
    HostOps().relu_backward(want.astype(np.float32), dy.astype(np.float32), dx_wide)
    dx_want = dx_wide.astype(dtype)
    ops.relu_backward(want, dy, dy)  # in place on the gradient
    assert dy.tobytes() == dx_want.tobytes()


def test_arrays_the_kernels_do_not_take_go_the_array_modules_way():
    ops = KernelOps(np)
    x = np.linspace(-2, 2, 24).reshape(4, 6)
    y = np.empty_like(x)
    ops.relu(x, y)  # float64: no kernel
    assert np.array_equal(y, np.maximum(x, 0))
    strided = np.linspace(-2, 2, 48, dtype=np.float32).reshape(4, 12)[:, ::2]
    out = np.empty(strided.shape, np.float32)
    ops.relu(strided, out)  # not contiguous: no kernel
    assert np.array_equal(out, np.maximum(strided, 0))
