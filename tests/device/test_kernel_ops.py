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


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    "pool, shape",
    [
        ((2, 2, 0), (3, 8, 6, 5)),  # 2x2/2: the layer's reduction path on the host
        ((3, 3, 0), (1, 10, 11, 3)),  # 3x3/3 with a remainder: 27 outputs, the last byte holds one
        ((2, 3, 0), (2, 9, 9, 4)),  # windows apart (stride over the window): the gaps get +0
        ((5, 5, 0), (1, 10, 10, 2)),  # 25 positions: a byte per output
        ((3, 2, 0), (1, 7, 7, 3)),  # overlapping windows: the layer's own passes on both
        ((2, 2, 1), (1, 6, 6, 3)),  # padding: likewise
    ],
)
def test_max_pooling_through_the_kernels_gives_the_layers_bytes(dtype, pool, shape):
    """MaxPool2d on KernelOps (one pass each way where the geometry allows) against HostOps: the same output,
    packed argmax map and gradient, bit for bit, ties included."""
    from vmem import nn
    from vmem.nn import Ctx

    k, s, p = pool
    n, h, w, c = shape
    rng = np.random.default_rng(k * 10 + s)
    x = rng.integers(-3, 4, shape).astype(np.float32).astype(dtype)  # ties in most windows
    x.reshape(-1)[1::7] = (rng.standard_normal(x.size)[1::7] * 3).astype(np.float32).astype(dtype)
    layer = nn.MaxPool2d(k, s, p)
    logical = (n, c, h, w)
    o = layer.output_shape([logical])
    y_shape = (o[0], o[2], o[3], o[1])
    (spec,) = layer.aux_specs([logical]).values()
    dy = rng.standard_normal(y_shape).astype(np.float32).astype(dtype)
    got = []
    for ops in (HostOps(), KernelOps(np)):
        aux = {"argmax": np.full(spec.shape, 0xEE, spec.dtype)}
        y = np.full(y_shape, np.nan, dtype)
        layer.forward(Ctx(xp=np, aux=aux, ops=ops), [x], y)
        dx = np.full(shape, np.nan, dtype)
        layer.backward(Ctx(xp=np, aux=aux, ops=ops), dy, None, None, [dx])
        got.append((y.tobytes(), aux["argmax"].tobytes(), dx.tobytes()))
    assert got[0] == got[1]


def test_the_kernels_pool_in_one_pass_where_the_geometry_allows(monkeypatch):
    from vmem import nn

    calls = []
    monkeypatch.setattr(native, "maxpool_forward", lambda *a, **k: calls.append("forward"))
    ops = KernelOps(np)
    x = np.zeros((1, 4, 4, 2), np.float32)
    for layer, one_pass in ((nn.MaxPool2d(2), True), (nn.MaxPool2d(3, 2), False), (nn.MaxPool2d(2, 2, 1), False)):
        y_shape = layer.output_shape([(1, 2, 4, 4)])
        assert layer._one_pass(x.shape, (1, y_shape[2], y_shape[3], 2)) is one_pass
    assert ops.maxpool_forward(x, np.zeros((1, 2, 2, 2), np.float32), np.zeros(4, np.uint8), (2, 2), (2, 2), True)
    assert calls == ["forward"]
    assert not ops.maxpool_forward(
        x.astype(np.float64), np.zeros((1, 2, 2, 2)), np.zeros(4, np.uint8), (2, 2), (2, 2), True
    )
