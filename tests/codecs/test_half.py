"""Codecs on fp16 and bf16 feature maps (mixed precision): exact byte counts, the kernels against the NumPy
references, and patch2 in the seed's format bit for bit against a restatement of the seed's GPU kernel."""

from __future__ import annotations

import numpy as np
import pytest

from vmem import codecs
from vmem.codecs import native

ml_dtypes = pytest.importorskip("ml_dtypes")
HALVES = {"fp16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}
VALUE_CODECS = ["zvc", "ssdc", "binarize", "fp16", "fp10", "fp8", "fixed8", "fixed4", "patch2"]
f32 = np.float32


def _relu_map(dtype, shape=(2, 3, 7, 10), seed=0):
    rng = np.random.default_rng(seed)
    x = np.maximum(rng.standard_normal(shape) * 3, 0)
    x.reshape(-1)[::17] = -0.0  # negative zeros are values
    x.reshape(-1)[5::23] = 2.0**-20  # subnormal in fp16
    return x.astype(dtype)


def _same_bytes(a, b) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("precision", HALVES)
@pytest.mark.parametrize("name", VALUE_CODECS)
def test_every_codec_takes_16_bit_maps_with_exact_byte_counts(name, precision):
    x = _relu_map(HALVES[precision])
    codec = codecs.get(name)
    enc = codec.encode(x)
    density = float(np.count_nonzero(x.view(np.uint16)) / x.size)
    assert enc.nbytes == codec.encoded_nbytes(x.shape, x.dtype, density)
    out = codec.decode(enc)
    assert out.dtype == x.dtype and out.shape == x.shape
    if name in ("zvc", "ssdc"):
        assert _same_bytes(out, x)  # lossless, bitwise (-0.0 and subnormals included)
    elif name == "binarize":
        assert np.array_equal(out.astype(np.float32), (x > 0).astype(np.float32))
    if native.available() and name != "patch2":  # the float32 kernels over widened values = the references
        ref = codec.encode(x, reference=True)
        assert all(_same_bytes(enc.arrays[k], ref.arrays[k]) for k in ref.arrays), name
        assert _same_bytes(out, codec.decode(ref, reference=True))


@pytest.mark.parametrize("precision", HALVES)
def test_the_encoded_map_is_the_lossless_map_when_the_plan_counts_it_in_half(precision):
    """Sizes follow the map's dtype: zvc's values and ssdc's take 2 bytes each, the formats do not change."""
    shape = (4, 8, 16, 16)
    n = int(np.prod(shape))
    dtype = HALVES[precision]
    assert codecs.get("zvc").encoded_nbytes(shape, dtype, 0.5) == 4 * n // 32 + 2 * n // 2
    assert codecs.get("ssdc").encoded_nbytes(shape, dtype, 0.5) == 4 * (n // 256 + 1) + 3 * n // 2
    assert codecs.get("fp8").encoded_nbytes(shape, dtype) == codecs.get("fp8").encoded_nbytes(shape, "float32")


@pytest.mark.parametrize("precision", HALVES)
def test_relu_backward_on_bits_equals_the_dense_rule_in_16_bits(precision):
    dtype = HALVES[precision]
    y = _relu_map(dtype)
    dy = np.random.default_rng(1).standard_normal(y.shape).astype(dtype)
    flat = dy.reshape(-1)
    flat[:6] = [np.nan, np.inf, -np.inf, -0.0, -1.5, 0.0]  # NaN, infinities and signed zeros keep their bytes
    enc = codecs.get("binarize").encode(y)
    dx = np.empty_like(dy)
    codecs.Binarize.relu_backward(enc, dy, dx)  # the 16-bit kernel (binarize_relu_backward_f16/bf16)
    expected = (dy.astype(np.float32) * (y.astype(np.float32) > 0)).astype(dtype)
    assert _same_bytes(dx, expected)
    codecs.Binarize.relu_backward(enc, dy, dy)  # in place on the gradient
    assert _same_bytes(dy, expected)


# -- patch2 in the seed's format: a restatement of its GPU kernel, one patch at a time ---------------------
def _seed_kernel_encode(x: np.ndarray) -> np.ndarray:
    """The seed's compression kernel (fp16 NCHW, one thread per 4x4 patch of a plane) restated in NumPy
    float32 scalars: the output tensor per plane is ceil(H/4) rows of ceil(W/4) patches, each four 16-bit
    words: min, max (in the input's dtype), codes 0-7, codes 8-15 (code i at bits 2i)."""
    n, c, h, w = x.shape
    ph, pw = -(-h // 4), -(-w // 4)
    out = np.zeros((n, c, ph, pw * 4), np.uint16)
    for img in range(n):
        for ch in range(c):
            plane = x[img, ch]
            for py in range(ph):
                for px in range(pw):
                    first = f32(plane[py * 4, px * 4])
                    x16 = [first] * 16  # past the edge: the patch's top-left value
                    for i in range(min(4, h - py * 4)):
                        for j in range(min(4, w - px * 4)):
                            x16[i * 4 + j] = f32(plane[py * 4 + i, px * 4 + j])
                    xmax = xmin = first
                    for v in x16:
                        xmax, xmin = np.fmax(xmax, v), np.fmin(xmin, v)
                    bottom = xmin * f32(7) / f32(6) - xmax / f32(6)
                    scale = f32(3.0 / max(float(xmax - xmin), 1e-6))  # max(float, double): in double
                    m = [0, 0]
                    for i, v in enumerate(x16):
                        code = min(max(int((v - bottom) * scale), 0), 3)
                        m[i // 8] |= code << (2 * (i % 8))
                    words = np.array([xmin, xmax], np.float32).astype(x.dtype).view(np.uint16)
                    out[img, ch, py, px * 4 : px * 4 + 4] = [words[0], words[1], m[0], m[1]]
    return out


def _seed_kernel_decode(y: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The seed's decompression kernel restated: levels min, max/3 + min*2/3, max*2/3 + min/3, max, each
    computed in float32 and rounded to the dtype."""
    n, c, h, w = shape
    out = np.zeros(shape, dtype)
    for img in range(n):
        for ch in range(c):
            for py in range(y.shape[2]):
                for px in range(y.shape[3] // 4):
                    words = y[img, ch, py, px * 4 : px * 4 + 4]
                    lo, hi = words[:2].view(dtype)
                    x0, x3 = f32(lo), f32(hi)
                    levels = [
                        lo,
                        np.array(x3 / f32(3) + x0 * f32(2) / f32(3), np.float32).astype(dtype)[()],
                        np.array(x3 * f32(2) / f32(3) + x0 / f32(3), np.float32).astype(dtype)[()],
                        hi,
                    ]
                    codes = int(words[2]) | (int(words[3]) << 16)
                    for i in range(min(4, h - py * 4)):
                        for j in range(min(4, w - px * 4)):
                            out[img, ch, py * 4 + i, px * 4 + j] = levels[(codes >> (2 * (4 * i + j))) & 3]
    return out


def _seed_layout(enc) -> np.ndarray:
    """vmem's arrays (per patch and channel in (image, patch row, patch column, channel) order) laid out
    as the seed's kernel writes them."""
    n, c, h, w = enc.shape
    ph, pw = -(-h // 4), -(-w // 4)
    words = np.stack(
        [
            enc.arrays["lo"].view(np.uint16),
            enc.arrays["hi"].view(np.uint16),
            (enc.arrays["codes"] & 0xFFFF).astype(np.uint16),
            (enc.arrays["codes"] >> 16).astype(np.uint16),
        ],
        axis=-1,
    )
    return words.reshape(n, ph, pw, c, 4).transpose(0, 3, 1, 2, 4).reshape(n, c, ph, pw * 4)


def _patch_cases(dtype) -> np.ndarray:
    """Random maps with edge patches (7x10), plus patches built to hit the kernel's corners: ties between
    levels (0..3 in steps of 0.5 over a range of 3), a constant patch, a patch of subnormals, negatives."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((2, 3, 7, 10)) * 2).astype(np.float32)
    x[0, 0, :4, :4] = np.array([0, 3, 1.5, 0.5, 2.5, 1, 2, 0.5, 3, 0, 1.5, 2.5, 0.5, 1, 2, 3]).reshape(4, 4)
    x[0, 1, :4, :4] = 0.75  # constant: max - min below 1e-6
    x[0, 2, :4, 4:8] = rng.uniform(0, 2.0**-16, (4, 4))
    x[1, 0, 4:, 8:] = -rng.uniform(1, 100, (3, 2))
    return x.astype(dtype)


@pytest.mark.parametrize("precision", HALVES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_patch2_on_16_bit_maps_is_the_seeds_kernel_bit_for_bit(precision, layout):
    dtype = HALVES[precision]
    x = _patch_cases(dtype)
    codec = codecs.get("patch2")
    if layout == "nchw":
        enc = codec.encode(x)
    else:
        enc = codec.encode_stored(np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
    seed = _seed_kernel_encode(x)
    assert _same_bytes(_seed_layout(enc), seed)
    expected = _seed_kernel_decode(seed, x.shape, dtype)
    if layout == "nchw":
        out = codec.decode(enc)
    else:
        stored = np.empty(x.transpose(0, 2, 3, 1).shape, dtype)
        codec.decode_stored(enc, stored)
        out = stored.transpose(0, 3, 1, 2)
    assert _same_bytes(np.ascontiguousarray(out), expected)
    # each value within a third of its patch's range of the original (two levels are a third apart)
    err = np.abs(out.astype(np.float32) - x.astype(np.float32))
    assert float(err.max()) <= float(np.abs(x.astype(np.float32)).max()) * 2 / 3


@pytest.mark.parametrize("precision", HALVES)
def test_patch2_is_a_quarter_of_a_16_bit_map_whose_sides_divide_by_4(precision):
    x = _relu_map(HALVES[precision], shape=(4, 16, 32, 32))
    enc = codecs.get("patch2").encode(x)
    assert x.nbytes / enc.nbytes == 4.0
    assert codecs.get("patch2").encoded_nbytes(x.shape, x.dtype) == enc.nbytes


def test_maps_the_kernels_do_not_serve_stay_exact_through_the_lossless_codecs():
    """Only float32 and 16-bit floats go through the float32 kernels: a float64 map is never narrowed."""
    x = np.array([1.0 + 1e-12, 0.0, -0.0, 3.0, 0.0], np.float64)
    for name in ("zvc", "ssdc"):
        codec = codecs.get(name)
        assert _same_bytes(codec.decode(codec.encode(x)), x), name


@pytest.mark.parametrize("precision", HALVES)
def test_binarize_reads_16_bit_maps_as_stored_and_writes_into_a_block(precision):
    """The 16-bit kernels (binarize_encode_f16/bf16) give numpy.packbits(v > 0) bit for bit, NaN, infinities,
    signed zeros and subnormals included, at a length that is no multiple of 8; ``encode_into`` makes the
    same bytes in a pool block as ``encode(...).store`` does."""
    dtype = HALVES[precision]
    v = np.random.default_rng(2).standard_normal(8 * 37 + 5).astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    v[:8] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, tiny, -tiny, 1.0]).astype(dtype)
    codec = codecs.get("binarize")
    bits = codec.encode(v).arrays["bits"]
    assert _same_bytes(bits, np.packbits(v > 0, bitorder="little"))
    raw = np.full(bits.nbytes + 16, 0xAB, np.uint8)
    made = codec.encode_into(v, raw)
    assert made is not None and _same_bytes(made.arrays["bits"], bits)
    assert np.shares_memory(made.arrays["bits"], raw) and (raw[bits.nbytes :] == 0xAB).all()
    stored = codec.encode(v).store(np.zeros_like(raw))
    assert _same_bytes(stored.arrays["bits"], made.arrays["bits"])
    assert codec.encode_into(v, raw[: bits.nbytes - 1]) is None  # a block too short: made the other way
