"""Codec round trips (hypothesis over shapes, sparsity, all zeros, no zeros), bounds, NaN and infinity."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmem import codecs

SPARSE = ["zvc", "ssdc"]
LOSSY = ["dpr:format=fp16", "dpr:format=fp10", "dpr:format=fp8", "fixed:bits=8", "fixed:bits=4", "patch2"]


@st.composite
def tensors(draw, rank4=True):
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=4, max_size=4))) if rank4 else (draw(st.integers(1, 700)),)
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["relu", "zeros", "dense", "very-sparse"]))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "zeros":
        x = np.zeros(shape, np.float32)
    elif kind == "very-sparse":
        x = np.where(rng.random(shape) < 0.05, x, 0).astype(np.float32)
    else:
        x[x == 0] = 1.0  # no zeros at all
    return x


@settings(max_examples=60, deadline=None)
@given(x=tensors())
def test_lossless_codecs_round_trip_bitwise_and_predict_their_size(x):
    density = float((x.view(np.uint32) != 0).mean())
    for spec in SPARSE:
        c = codecs.get(spec)
        enc = c.encode(x)
        assert c.decode(enc).tobytes() == x.tobytes()
        assert enc.nbytes == c.encoded_nbytes(x.shape, density=density)
    b = codecs.get("binarize")
    enc = b.encode(x)
    assert np.array_equal(b.decode(enc), (x > 0).astype(np.float32))
    assert enc.nbytes == b.encoded_nbytes(x.shape)


@settings(max_examples=60, deadline=None)
@given(x=tensors())
def test_lossy_codecs_stay_within_their_documented_bounds(x):
    x = x * 3
    for spec in LOSSY:
        c = codecs.get(spec)
        enc = c.encode(x)
        d = c.decode(enc)
        assert d.shape == x.shape and d.dtype == x.dtype
        assert enc.nbytes == c.encoded_nbytes(x.shape)
        err = np.abs(d - x)
        if spec.startswith("dpr"):
            fmt = codecs.get(spec)
            tiny = 2.0 ** -(2 ** (fmt.ebits - 1) - 2)  # smallest normal: below it values flush to zero
            assert np.all(err <= np.maximum(np.abs(x) * fmt.relative_bound, tiny) * (1 + 1e-6))
        elif spec.startswith("fixed"):
            span = x.max(axis=(0, 2, 3), keepdims=True) - x.min(axis=(0, 2, 3), keepdims=True)
            step = span / ((1 << c.bits) - 1)
            assert np.all(err <= step / 2 * (1 + 1e-4) + 1e-6)
        else:
            assert np.all(err <= (x.max() - x.min()) / 6 * (1 + 1e-4) + 1e-6)


def test_fp16_is_ieee_half_in_the_normal_range():
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100
    x = x[np.abs(x) > 1e-4]
    assert np.array_equal(codecs.quantize(x, "fp16"), x.astype(np.float16).astype(np.float32))


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-30, -1e-30, 1e9], np.float32)
    for spec in SPARSE:  # bitwise: NaN, infinities and -0.0 survive
        c = codecs.get(spec)
        assert c.decode(c.encode(x)).tobytes() == x.tobytes()
    assert codecs.get("binarize").decode(codecs.get("binarize").encode(x)).tolist() == [0, 1, 0, 0, 0, 1, 0, 1]
    for fmt, top in (("fp16", 65504.0), ("fp10", 63488.0), ("fp8", 240.0)):
        d = codecs.quantize(x, fmt)
        assert np.isnan(d[0])
        assert d[1] == top and d[2] == -top and d[7] == top  # clamped
        assert d[5] == 0 and np.signbit(d[6]) and d[6] == 0  # no denormals: signed zero
        assert np.signbit(d[3])
    f = codecs.get("fixed:bits=8")
    y = np.array([[1.0, np.nan, 3.0, np.inf]], np.float32).reshape(1, 1, 2, 2)
    d = f.decode(f.encode(y))
    assert d.reshape(-1).tolist() == [1.0, 1.0, 3.0, 1.0]  # non-finite values decode to the minimum


def test_codec_specs_and_errors():
    assert codecs.get("dpr", format="fp8").spec == "dpr:format=fp8"
    assert codecs.get("fixed:bits=4").bits == 4
    assert codecs.get("zvc").lossless and not codecs.get("patch2").lossless
    with pytest.raises(ValueError, match="format='fp9'"):
        codecs.get("dpr:format=fp9")
    with pytest.raises(ValueError, match="unknown codec 'lz4'"):
        codecs.get("lz4")
    with pytest.raises(TypeError, match="floating-point"):
        codecs.get("zvc").encode(np.arange(4))


def test_without_native_kernels_codecs_warn_once_and_use_numpy(monkeypatch):
    from vmem.codecs import native

    monkeypatch.setattr(native, "lib", None)
    monkeypatch.setattr(native, "_warned", False)
    x = np.maximum(np.random.default_rng(0).standard_normal(100).astype(np.float32), 0)
    with pytest.warns(RuntimeWarning, match="native kernels are not built"):
        enc = codecs.get("zvc").encode(x)
    assert codecs.get("zvc").decode(enc).tobytes() == x.tobytes()
