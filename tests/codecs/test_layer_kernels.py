"""The layers' in-place kernels (vmem/csrc/kernels.cuh: bias + ReLU, ReLU's backward, max pooling with its
argmax in one pass and its backward in one pass, with the backward of a ReLU before it or not), built for the CPU, equal their NumPy references bit for bit
in fp32, fp16 and bf16, the same buffer in and out. (The CUDA build of the same source compiles for sm_80 and
sm_90: tests/codecs/test_native.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from vmem.codecs import native, step

ml_dtypes = pytest.importorskip("ml_dtypes")
pytestmark = pytest.mark.skipif(not native.available(), reason="the native kernels are not built")
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)]
IDS = ["fp32", "fp16", "bf16"]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _specials(dtype) -> np.ndarray:
    """Values whose handling differs between careless implementations: signed zeros, infinities, NaN with
    and without payloads, the smallest and largest of the type, subnormals."""
    info = ml_dtypes.finfo(dtype) if dtype == DTYPES[2] else np.finfo(dtype)
    values = [
        0.0,
        -0.0,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        float(info.max),
        -float(info.max),
        float(info.tiny),
        -float(info.tiny),
        float(info.smallest_subnormal),
        -float(info.smallest_subnormal),
        1.0,
        -1.0,
    ]
    out = np.array(values, np.float32).astype(dtype)
    payload = np.array([0x7F800001, 0xFFC00123, 0x7FA00000], np.uint32).view(np.float32)  # NaNs with payloads
    return np.concatenate([out, payload.astype(dtype) if dtype != DTYPES[0] else payload])


def _data(dtype, shape, seed=0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32).astype(dtype)
    flat = x.reshape(-1)
    s = _specials(dtype)
    flat[: s.size] = s
    return x


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bias_relu_in_place(dtype):
    y = _data(dtype, (3, 5, 7, 33))
    b = (np.random.default_rng(1).standard_normal(33) * 2).astype(np.float32)
    b[:4] = [np.nan, -0.0, 1e38, -1e-42]
    want = np.maximum(y.astype(np.float32) + b, 0).astype(dtype)
    native.bias_relu(y, b)  # y is written in place
    assert _bits(y) == _bits(want)


@pytest.mark.parametrize("dtype", DTYPES[1:], ids=IDS[1:])
def test_half_rounding_as_numpy_and_ml_dtypes_round(dtype):
    """Every conversion from FP32 the half kernels make: y = 0, so the result is the bias rounded (ties to
    even, subnormals, overflow to infinity, NaN payloads), over FP32 values around each half value."""
    halves = np.arange(0, 0x7F80 if dtype == DTYPES[2] else 0x7C00, 7, dtype=np.uint16).view(dtype)
    base = halves.astype(np.float32).view(np.uint32)
    around = np.concatenate([base, base + 1, base - 1, base + 0x1000, base + 0x8000, base + 0x7FFF, base + 0x2000])
    b = around.view(np.float32)
    b = np.concatenate([b, np.array([65520.0, 65519.99, 3.4e38, np.inf], np.float32), _specials(np.float32)[4:6]])
    b = b[np.isnan(b) | (b >= 0)]  # ReLU keeps these as they are
    y = np.zeros((1, b.size), dtype)
    native.bias_relu(y, b)
    assert _bits(y) == _bits(b.astype(dtype).reshape(1, -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_relu_backward_in_place_on_the_gradient(dtype):
    y = _data(dtype, (4, 6, 6, 16), seed=2)
    dy = _data(dtype, (4, 6, 6, 16), seed=3)
    dy.reshape(-1)[-5:] = np.array([np.nan, -0.0, 0.0, -1e-30, np.inf], np.float32).astype(dtype)
    want = (dy.astype(np.float32) * (y.astype(np.float32) > 0)).astype(dtype)
    if dtype == DTYPES[0]:
        assert _bits(want) == _bits(np.multiply(dy, y > 0))  # what vmem.nn.ReLU computes
    native.relu_backward(y, dy, dy)  # dx is dy
    assert _bits(dy) == _bits(want)


def _pool_reference(x: np.ndarray, kernel, stride):
    n, h, w, c = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    windows = np.stack(
        [x[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw, :] for i in range(kh) for j in range(kw)],
        axis=-1,
    )
    arg = np.argmax(windows.astype(np.float32), axis=-1)  # the first maximum; a NaN is the maximum
    y = np.take_along_axis(windows, arg[..., None], axis=-1)[..., 0]
    return y, arg.astype(np.uint8)


def _packed(codes):
    """4-bit codes two to a byte, the even one low (as MaxPool2d keeps its argmax map)."""
    flat = codes.reshape(-1)
    out = np.zeros(-(-flat.size // 2), np.uint8)
    out[:] = flat[0::2]
    out[: flat[1::2].size] |= flat[1::2] << 4
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("packed", [False, True], ids=["bytes", "nibbles"])
@pytest.mark.parametrize(
    "kernel, stride, shape",
    [((2, 2), (2, 2), (2, 8, 10, 24)), ((3, 3), (3, 3), (2, 7, 11, 24)), ((2, 3), (3, 3), (1, 9, 9, 5))],
)
def test_max_pooling_forward_and_backward_in_one_pass(dtype, packed, kernel, stride, shape):
    x = _data(dtype, shape, seed=4)
    x[0, 0, 0, :4] = x[0, 0, 1, :4] = np.float32(5).astype(dtype)  # a tie: the first position wins
    y_want, arg_want = _pool_reference(x, kernel, stride)
    y = np.empty(y_want.shape, dtype)
    arg = np.empty(-(-y.size // 2) if packed else y_want.shape, np.uint8)  # an odd count in the last case
    native.maxpool_forward(x, y, arg, kernel, stride, packed=packed)
    assert _bits(y) == _bits(y_want)
    assert np.array_equal(arg, _packed(arg_want) if packed else arg_want)
    dy = _data(dtype, y.shape, seed=5)
    dx_want = np.zeros(x.shape, dtype)
    i, j = arg_want // kernel[1], arg_want % kernel[1]
    nn, oh, ow, cc = np.indices(y.shape)
    dx_want[nn, oh * stride[0] + i, ow * stride[1] + j, cc] = dy
    dx = np.full(x.shape, np.nan, dtype)  # every value written: none is left from before
    native.maxpool_backward(dy, arg, dx, kernel, stride, packed=packed)
    assert _bits(dx) == _bits(dx_want)
    # with the ReLU before the pool: its backward in the same pass, bit for bit as ReLU's over the pool's dx
    relu = np.maximum(x, np.zeros((), dtype))  # NaN and -0 pass to the mask test as the ReLU left them
    relu[0, 1, 0, :3] = np.array([0.0, -0.0, np.nan], np.float32).astype(dtype)
    want = np.multiply(dx_want, relu > 0)  # vmem.nn.ReLU's backward: -0 where dy < 0 is masked, NaN stays NaN
    fused = np.full(x.shape, np.nan, dtype)
    native.maxpool_backward(dy, arg, fused, kernel, stride, packed=packed, relu=relu)
    assert _bits(fused) == _bits(want)
    with pytest.raises(ValueError, match="is not dx's"):
        native.maxpool_backward(dy, arg, fused, kernel, stride, packed=packed, relu=relu[:, :1])


def test_overlapping_windows_are_refused_for_the_one_pass_backward():
    with pytest.raises(ValueError, match="leave"):  # a window past the input (ceil mode) is not the kernel's
        native.maxpool_forward(
            np.zeros((1, 5, 5, 1), np.float32),
            np.zeros((1, 3, 3, 1), np.float32),
            np.zeros(9, np.uint8),
            (2, 2),
            (2, 2),
        )
    with pytest.raises(ValueError, match="4 bits"):
        native.maxpool_forward(
            np.zeros((1, 5, 5, 1), np.float32),
            np.zeros((1, 1, 1, 1), np.float32),
            np.zeros(1, np.uint8),
            (5, 5),
            (5, 5),
            packed=True,
        )
    with pytest.raises(ValueError, match="overlap"):
        native.maxpool_backward(
            np.zeros((1, 2, 2, 1), np.float32),
            np.zeros((1, 2, 2, 1), np.uint8),
            np.zeros((1, 5, 5, 1), np.float32),
            (3, 3),
            (2, 2),
        )
    with pytest.raises(TypeError, match="float64"):
        native.relu_backward(np.zeros(3), np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 1, 1, 3), (5000, 3), (3, 40, 40, 17)])
def test_column_sum_in_fp32_in_a_fixed_order(dtype, shape):
    """A convolution's bias gradient where cuDNN refuses the type: each group of rows summed in row order,
    then the groups in order, in FP32, as NumPy sums a 2-D array's rows (one after another)."""
    x = (np.random.default_rng(2).standard_normal(shape) * 3).astype(np.float32).astype(dtype)
    c = shape[-1]
    rows = x.size // c
    groups, per = native.column_groups(rows)
    assert groups <= native.COLUMN_GROUPS and (groups - 1) * per < rows <= groups * per
    out = np.full(c, np.nan, np.float32)
    partial = np.full(native.COLUMN_GROUPS * c, np.nan, np.float32)
    native.column_sum(x, out, partial)
    x2 = x.reshape(rows, c).astype(np.float32)
    ref = np.stack([x2[g * per : (g + 1) * per].sum(axis=0) for g in range(groups)]).sum(axis=0)
    assert _bits(out) == _bits(ref)
    assert np.allclose(out, x2.astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_bias_add_in_place_rounds_once_as_numpy(dtype):
    y = _data(dtype, (3, 5, 7, 33))
    b = (np.random.default_rng(3).standard_normal(33) * 2).astype(np.float32)
    b[:4] = [np.nan, -0.0, 1e38, -1e-42]
    ref = y.copy()
    ref += b  # NumPy: computed in FP32, cast back to y's type
    native.bias_add(y, b)
    assert _bits(y) == _bits(ref)


@pytest.mark.parametrize("special", [None, np.nan, np.inf, -np.inf])
def test_the_multi_tensor_finite_check_equals_numpy(special):
    """One launch over tensors of many sizes (empty ones and a large one split over cores among them): the
    flag is cleared exactly where NumPy finds a value that is not finite, wherever it lies (first and last
    value of each tensor)."""
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(n).astype(np.float32) for n in (1, 0, 7, 300_001, 2, 33)]
    where = [(i, j) for i, t in enumerate(tensors) for j in {0, t.size - 1} if t.size]
    for i, j in where if special is not None else [(0, 0)]:
        if special is not None:
            kept = tensors[i][j]
            tensors[i][j] = special
        ptrs = np.array([t.ctypes.data for t in tensors], np.uint64)
        offsets = np.concatenate([[0], np.cumsum([t.size for t in tensors])]).astype(np.int64)
        ok = np.ones(1, np.uint8)
        step.finite_multi(ptrs, offsets, int(offsets[-1]), ok)
        assert bool(ok[0]) == all(np.isfinite(t).all() for t in tensors)
        if special is not None:
            tensors[i][j] = kept


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_the_four_a_thread_relu_kernels_give_the_one_a_thread_bytes(dtype):
    """relu4_* and relu_backward4_* (the GPU's: one 16-byte float32 or 8-byte half load a thread), built for
    the CPU, equal the one-value kernels and NumPy bit for bit, in place and not, specials included."""
    kind = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}[np.dtype(dtype).name]
    x = _data(dtype, (4, 5, 6, 8), seed=4)
    x.reshape(-1)[: len(_specials(dtype))] = _specials(dtype)
    bits = (lambda a: a) if dtype == DTYPES[0] else (lambda a: a.view(np.uint16))
    want = np.where((x.astype(np.float32) > 0) | np.isnan(x.astype(np.float32)), x, np.zeros_like(x))
    groups = x.size // 4
    y = np.empty_like(x)
    native.launch(f"relu4_{kind}", groups, bits(x), bits(y), np.int64(groups))
    assert _bits(y) == _bits(want)
    inplace = x.copy()
    native.launch(f"relu4_{kind}", groups, bits(inplace), bits(inplace), np.int64(groups))
    assert _bits(inplace) == _bits(want)
    dy = _data(dtype, x.shape, seed=5)
    grad = (dy.astype(np.float32) * (want.astype(np.float32) > 0)).astype(dtype)
    native.launch(f"relu_backward4_{kind}", groups, bits(want), bits(dy), bits(dy), np.int64(groups))
    assert _bits(dy) == _bits(grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_a_float32_nchw_batch_becomes_a_channels_last_map_as_numpy_casts_it(dtype):
    """The input kernel (a batch copied to the GPU as it is, float32 NCHW) gives NumPy's transpose and cast
    (ml_dtypes' for bfloat16) bit for bit, specials included; a shape that is not its transpose is refused."""
    x = _data(np.float32, (3, 5, 7, 6))
    y = np.empty((3, 7, 6, 5), dtype)
    step.nchw_to_nhwc(x, y)
    assert _bits(y) == _bits(np.ascontiguousarray(x.transpose(0, 2, 3, 1)).astype(dtype))
    with pytest.raises(ValueError, match="nchw_to_nhwc"):
        step.nchw_to_nhwc(x, np.empty((3, 5, 7, 6), dtype))
