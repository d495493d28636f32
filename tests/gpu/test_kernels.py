"""The encoding kernels of vmem/csrc/kernels.cuh on the GPU (raw NVRTC build, no flush to zero) give the CPU
build's bytes, subnormals included."""

from __future__ import annotations

import numpy as np
import pytest

from vmem.codecs import native


def _values(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal(n), 0).astype(np.float32)
    special = np.array(
        [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-42, 1.4e-45, 6e-39, 65504.0, 7e4], np.float32
    )  # subnormals: 1e-40, 1e-42, the smallest, 6e-39
    k = min(n, special.size)
    x[:k] = special[:k]
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


@pytest.mark.skipif(not native.available(), reason="the CPU build of the kernels is not installed")
@pytest.mark.parametrize("spec", ["zvc", "ssdc", "binarize", "fp16", "fp10", "fp8"])
@pytest.mark.parametrize("n", [1, 4099, 3 << 20])
def test_codecs_on_gpu_arrays_give_the_cpu_builds_bytes(cuda, spec, n):
    """A codec given a CuPy array runs the GPU build (on the current stream) and encodes, decodes and
    (binarize) backpropagates ReLU to the CPU build's bytes."""
    from vmem import codecs

    cp = cuda.xp
    codec = codecs.get(spec)
    x = _values(n)
    g = cp.asarray(x)
    cp.cuda.Stream.null.synchronize()  # a pageable upload may still be landing when asarray returns
    with cuda.memory_stream.stream:
        enc = codec.encode(g)
        want = codec.encode(x)
        assert set(enc.arrays) == set(want.arrays)
        for key, a in enc.arrays.items():
            assert isinstance(a, cp.ndarray), key
            assert np.array_equal(a.get().view(np.uint8), want.arrays[key].view(np.uint8)), key
        out = cp.full(x.shape, 7.0, cp.float32)
        codec.decode(enc, out)
        ref = codec.decode(want, np.empty_like(x))
        assert np.array_equal(out.get().view(np.uint32), ref.view(np.uint32))
        if spec == "binarize":
            dy = cp.asarray(_values(n)[::-1].copy())
            dx = cp.empty_like(dy)
            codecs.Binarize.relu_backward(enc, dy, dx)
            want_dx = np.empty_like(x)
            codecs.Binarize.relu_backward(want, dy.get(), want_dx)
            # the bytes of the dense product on the same GPU (what baseline computes), NaNs included, except
            # where dy or x is subnormal: CuPy's element-wise kernels flush subnormal operands to zero, in
            # products and in comparisons alike (it compiles them with -ftz=true); vmem's kernels keep them,
            # as the CPU does. In training the two should agree (reasoned, not measured): a ReLU output on the GPU
            # is never subnormal (CuPy's maximum compares with flushed operands), so Gist's mask is the dense one.
            dense = (dy * (g > 0).astype(cp.float32)).get()
            tiny = np.finfo(np.float32).tiny
            normal = (np.abs(dy.get()) >= tiny) & ((np.abs(x) >= tiny) | (x == 0))
            assert np.array_equal(dx.get()[normal].view(np.uint32), dense[normal].view(np.uint32))
            # and the CPU build's, except the payload of a NaN the product makes (inf * 0): IEEE leaves it to
            # the hardware (x86 gives 0x7fc00000, CUDA 0x7fffffff)
            got_dx = dx.get()
            assert np.array_equal(np.isnan(got_dx), np.isnan(want_dx))
            keep = ~np.isnan(want_dx)
            assert np.array_equal(got_dx[keep].view(np.uint32), want_dx[keep].view(np.uint32))
    cuda.synchronize()


def test_cpu_only_codecs_are_refused_on_the_gpu_by_name(cuda):
    import vmem
    from vmem.errors import DeviceError

    net = vmem.models.get("vgg_cifar", image_size=16)
    with pytest.raises(DeviceError, match="fixed:bits=8"):
        with vmem.Trainer(net, device=cuda, policy="vdnn-all:codec=fixed8", seed=0) as trainer:
            trainer.step(np.zeros((8,) + net.input_shape, np.float32), np.zeros(8, int))


@pytest.mark.skipif(not native.available(), reason="the CPU build of the kernels is not installed")
@pytest.mark.parametrize("spec", ["zvc", "ssdc", "binarize", "fp16"])
def test_transfers_in_several_pieces_round_trip_on_the_gpu(cuda, spec):
    """An offload through a codec larger than one piece (several encodings, copied while the next is
    encoded) comes back as the CPU build's decode of the same values, on the memory stream."""
    from vmem import codecs
    from vmem.codecs import transfer

    codec = codecs.get(spec)
    n = 2 * transfer.PIECE + 4099
    x = _values(n)
    host_pool = cuda.reserve_pinned(transfer.host_nbytes(codec, (n,)) + 4096)
    block = cuda.pool.allocate(n * 4, category="other")
    host_block = host_pool.allocate(transfer.host_nbytes(codec, (n,)))
    try:
        dev = cuda.view(block, (n,), np.float32)
        host = cuda.host_view(host_block, (host_block.nbytes,), np.uint8)
        ms = cuda.memory_stream
        box = {}
        ms.launch(lambda: dev.set(x))
        ms.launch(lambda: box.__setitem__("sent", transfer.send(cuda, codec, dev, host)))
        ms.launch(lambda: dev.fill(7.0))
        ms.launch(lambda: transfer.receive(cuda, codec, box["sent"], dev))
        ms.synchronize()
        assert len(box["sent"].parts) == 3
        want = np.empty_like(x)
        for lo in range(0, n, transfer.PIECE):
            hi = min(lo + transfer.PIECE, n)
            codec.decode(codec.encode(x[lo:hi]), want[lo:hi])
        assert np.array_equal(dev.get().view(np.uint32), want.view(np.uint32))
    finally:
        cuda.synchronize()
        cuda.pool.free(block)
        host_pool.free(host_block)
