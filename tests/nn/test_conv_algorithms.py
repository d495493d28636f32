"""The CPU convolution algorithms agree within float32 rounding and differ in workspace."""

from __future__ import annotations

import numpy as np
import pytest

from vmem import nn
from vmem.nn import Ctx, physical
from vmem.nn import conv
from vmem.nn.conv import ALGORITHMS, PASSES


def run(layer, shape, algo, x, w, b, dy):
    ws = max(layer.workspace_bytes([shape], p, algo, 4) for p in PASSES)
    ctx = Ctx(xp=np, params={"weight": w, "bias": b},
              grads={"weight": np.empty_like(w), "bias": np.empty_like(b)},
              workspace=np.empty(ws, np.uint8) if ws else None, algo=algo)
    y = np.empty(physical(layer.output_shape([shape])), np.float32)
    layer.forward(ctx, [x], y)
    dx = np.empty_like(x)
    layer.backward(ctx, dy, [x], None, [dx])
    return y, dx, ctx.grads["weight"], ctx.grads["bias"]


@pytest.fixture(params=["whole", "chunked"])
def chunking(request, monkeypatch):
    """Run each case once as it is and once with tiny chunks, so that every chunked loop runs many times."""
    if request.param == "chunked":
        monkeypatch.setattr(conv, "_COL_VALUES", 64)
        monkeypatch.setattr(conv, "_COL_MIN_ROWS", 1)
        monkeypatch.setattr(conv, "_IMPLICIT_ROWS", 1)
    return request.param


@pytest.mark.parametrize("k, s, p, shape", [(3, 1, 1, (8, 16, 12, 12)), (5, 2, 2, (4, 8, 15, 13)),
                                           (11, 4, 2, (2, 3, 35, 35)), (1, 1, 0, (4, 32, 6, 6))])
def test_algorithms_agree_in_float32(k, s, p, shape, chunking):
    rng = np.random.default_rng(1)
    layer = nn.Conv2d(shape[1], 24, k, stride=s, padding=p)
    x = rng.standard_normal(physical(shape)).astype(np.float32)
    w = rng.standard_normal((24, k, k, shape[1])).astype(np.float32) * 0.1
    b = rng.standard_normal(24).astype(np.float32)
    dy = rng.standard_normal(physical(layer.output_shape([shape]))).astype(np.float32)
    results = [run(layer, shape, a, x, w, b, dy) for a in ALGORITHMS]
    for ref, other in zip(results[0], results[1]):
        scale = np.abs(ref).max()
        np.testing.assert_allclose(other, ref, rtol=0, atol=2e-5 * scale)


def test_implicit_needs_much_less_workspace_than_im2col():
    layer = nn.Conv2d(64, 64, 3, padding=1)
    shape = (64, 64, 32, 32)
    for p in PASSES:
        big = layer.workspace_bytes([shape], p, "im2col", 4)
        small = layer.workspace_bytes([shape], p, "implicit", 4)
        assert big >= 2 * small > 0
    # im2col: two lanes, each with a chunk of two images (2,048 rows of 576 columns) and their padded copy
    assert layer.workspace_bytes([shape], "forward", "im2col", 4) == 2 * 4 * (2048 * 576 + 2 * 34 * 34 * 64)
    # backward-filter adds lane 1's partial dW and, in each lane (16 chunks each), a product to add in
    assert layer.workspace_bytes([shape], "backward_filter", "im2col", 4) == \
        2 * 4 * (2048 * 576 + 2 * 34 * 34 * 64) + 3 * 4 * 64 * 576
    assert layer.workspace_bytes([shape], "forward", "implicit", 4) == 4 * (4 * 32 * 32) * (64 + 64)  # 4 images a step


def test_implicit_workspace_does_not_grow_with_the_batch():
    layer = nn.Conv2d(64, 64, 3, padding=1)
    sizes = {layer.workspace_bytes([(n, 64, 32, 32)], "forward", "implicit", 4) for n in (4, 64, 256)}
    assert len(sizes) == 1


def test_gemm_convolution_needs_no_workspace():
    layer = nn.Conv2d(64, 32, 1)
    assert all(layer.workspace_bytes([(8, 64, 7, 7)], p, a, 4) == 0 for p in PASSES for a in ALGORITHMS)


def test_unknown_algorithm_is_named():
    with pytest.raises(ValueError, match="'fft'"):
        nn.Conv2d(3, 4, 3).workspace_bytes([(1, 3, 8, 8)], "forward", "fft", 4)

