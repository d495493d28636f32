"""Max pooling's 2x2 fast path matches the general path exactly, ties included (first position wins); the
argmax map is stored at 4 bits per output for windows of up to 16 positions."""

import pytest

import numpy as np

from vmem import nn
from vmem.nn import Ctx


def test_fast_2x2_path_matches_the_general_path_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, (4, 8, 6, 5)).astype(np.float32)  # many ties
    outs = []
    for fast in (True, False):
        layer = nn.MaxPool2d(2)
        if not fast:
            layer._tiles = lambda *a: False
        y = np.empty((4, 4, 3, 5), np.float32)
        am = np.empty(y.shape, np.uint8)
        layer._forward(np, x, y, am)
        outs.append((y, am))
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])
    x6 = x.reshape(4, 4, 2, 3, 2, 5).transpose(0, 1, 3, 5, 2, 4).reshape(4, 4, 3, 5, 4)
    assert np.array_equal(outs[0][1], np.argmax(x6, axis=-1))  # NumPy's argmax also takes the first maximum


@pytest.mark.parametrize(
    "k, shape, nbytes",
    [
        (2, (2, 3, 4, 6), 18),  # 36 outputs, 2 per byte
        (3, (1, 3, 9, 9), 14),  # 3x3/3: 27 outputs (odd): the last byte holds one
        (4, (1, 2, 8, 8), 4),  # 16 positions: still 4 bits
        (5, (1, 2, 10, 10), 8),  # 25 positions: 1 byte per output
    ],
)
def test_argmax_map_is_four_bits_per_output_up_to_16_positions(k, shape, nbytes):
    layer = nn.MaxPool2d(k)
    out = layer.output_shape([shape])
    (spec,) = layer.aux_specs([shape]).values()
    assert int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize == nbytes
    rng = np.random.default_rng(k)
    n, c, h, w = shape
    x = rng.integers(0, 4, (n, h, w, c)).astype(np.float32)  # ties
    y = np.empty((out[0], out[2], out[3], out[1]), np.float32)
    aux = {"argmax": np.zeros(spec.shape, spec.dtype)}
    layer.forward(Ctx(xp=np, aux=aux), [x], y)
    full = np.empty(y.shape, np.uint8)
    layer._forward(np, x, np.empty_like(y), full)  # the map before packing
    dy = rng.standard_normal(y.shape).astype(np.float32)
    dx = np.empty_like(x)
    layer.backward(Ctx(xp=np, aux=aux), dy, None, None, [dx])
    want = np.zeros_like(x)  # scatter each output's gradient to its maximum's position
    for idx in range(k * k):
        i, j = divmod(idx, k)
        want[:, i::k, j::k][:, : out[2], : out[3]] += dy * (full == idx)
    assert np.array_equal(dx, want)
