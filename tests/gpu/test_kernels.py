"""The encoding kernels of native/kernels.cuh on the GPU (raw NVRTC build, no flush to zero) give the CPU
build's bytes, subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.codecs import native


def _values(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal(n), 0).astype(np.float32)
    special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-42, 1.4e-45, 6e-39, 65504.0, 7e4],
                       np.float32)  # subnormals: 1e-40, 1e-42, the smallest, 6e-39
    x[: special.size] = special
    x[::7] *= -1
    return x


@pytest.mark.skipif(not native.available(), reason="the CPU build of the kernels is not installed")
@pytest.mark.parametrize("n", [1, 31, 4099, 1 << 20])
def test_gpu_kernels_give_the_cpu_builds_bytes(cuda, n):
    cp = cuda.xp
    x = _values(n)
    bits = x.view(np.uint32)
    g = cp.asarray(x)
    gbits = g.view(cp.uint32)
    k, n64 = cuda.kernels, np.int64(n)
    # binarize: one thread per byte
    want = native.binarize_encode(x)
    got = cp.empty(want.size, cp.uint8)
    k.launch("binarize_encode", want.size, g, got, n64)
    assert np.array_equal(got.get(), want)
    # delayed precision reduction to fp16 and fp8: one thread per value
    for fmt, kernel, dtype in (("fp16", "dpr16_encode", cp.uint16), ("fp8", "dpr8_encode", cp.uint8)):
        want = native.dpr_encode(x, fmt)
        got = cp.empty(n, dtype)
        k.launch(kernel, n, gbits, got, n64)
        assert np.array_equal(got.get(), want), fmt
    # zero-value compression's mask and counts: one thread per 32 values
    groups = -(-n // 32)
    mask, count = cp.empty(groups, cp.uint32), cp.empty(groups, cp.uint32)
    k.launch("zvc_mask", groups, gbits, mask, count, n64)
    want_mask, _ = native.zvc_encode(x)
    assert np.array_equal(mask.get(), want_mask)
    assert int(count.get().sum()) == int(np.count_nonzero(bits))
    cuda.synchronize()
