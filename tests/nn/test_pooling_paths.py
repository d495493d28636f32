"""Max pooling's 2x2 fast path matches the general path exactly, ties included (first position wins)."""

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
        layer.forward(Ctx(xp=np, aux={"argmax": am}), [x], y)
        outs.append((y, am))
    assert np.array_equal(outs[0][0], outs[1][0])
    assert np.array_equal(outs[0][1], outs[1][1])
    x6 = x.reshape(4, 4, 2, 3, 2, 5).transpose(0, 1, 3, 5, 2, 4).reshape(4, 4, 3, 5, 4)
    assert np.array_equal(outs[0][1], np.argmax(x6, axis=-1))  # NumPy's argmax also takes the first maximum
