"""The CPU build of the CUDA kernels equals the NumPy references byte for byte; the kernels compile for
sm_80 and sm_90 with nvcc or NVRTC, whichever is installed (no GPU needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmem import codecs
from vmem.codecs import native

NATIVE = Path(__file__).resolve().parents[2] / "vmem" / "csrc"
pytestmark = pytest.mark.skipif(native.lib is None, reason="native kernels not built (no C compiler at install)")


@st.composite
def arrays(draw):
    n = draw(st.integers(0, 3000))
    kind = draw(st.sampled_from(["relu", "zeros", "dense", "special"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    x = (rng.standard_normal(n) * draw(st.sampled_from([1e-6, 1.0, 300.0]))).astype(np.float32)
    if kind == "relu":
        x = np.maximum(x, 0)
    elif kind == "zeros":
        x[:] = 0
    elif kind == "special" and n:
        x[rng.integers(0, n, max(1, n // 10))] = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0], np.float32))
    return x


KERNEL_CODECS = (
    "zvc",
    "ssdc",
    "binarize",
    "dpr:format=fp16",
    "dpr:format=fp10",
    "dpr:format=fp8",
    "fixed:bits=8",
    "fixed:bits=4",
)


def _same(c, x, **kw):
    fast, ref = c.encode(x, **kw), c.encode(x, reference=True, **kw)
    assert fast.arrays.keys() == ref.arrays.keys()
    for k in ref.arrays:
        assert fast.arrays[k].tobytes() == ref.arrays[k].tobytes(), (c.spec, k)
    assert c.decode(fast).tobytes() == c.decode(ref, reference=True).tobytes(), c.spec


@settings(max_examples=150, deadline=None)
@given(x=arrays())
def test_cpu_kernels_equal_the_numpy_references_byte_for_byte(x):
    for spec in KERNEL_CODECS:
        c = codecs.get(spec)
        if spec.startswith("fixed"):  # per channel: (N, C), channels last (N, 1, C), first
            for channels in (3, 4):  # 4 bits: bytes that span two rows (3), whole bytes per row (4)
                y = np.resize(x, -(-x.size // channels) * channels) if x.size else np.zeros(0, np.float32)
                _same(c, y.reshape(-1, channels))
                _same(c, y.reshape(-1, 1, channels), axis=-1)
                _same(c, y.reshape(-1, channels, 1), axis=1)  # channels first
        else:
            _same(c, x)


@settings(max_examples=80, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 13), st.integers(1, 13)), data=st.data())
def test_patch2_kernels_equal_the_reference_in_both_layouts(shape, data):
    """Whole 4x4 patches and the partial ones at the edges; NaN, infinities and -0.0 among the values."""
    x = data.draw(arrays().filter(lambda a: a.size >= 1))
    x = np.resize(x, shape).astype(np.float32)
    c = codecs.get("patch2")
    _same(c, x)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    fast, ref = c.encode(nhwc, channels_last=True), c.encode(nhwc, channels_last=True, reference=True)
    for k in ref.arrays:
        assert fast.arrays[k].tobytes() == ref.arrays[k].tobytes(), k
        assert fast.arrays[k].tobytes() == c.encode(x, reference=True).arrays[k].tobytes(), k  # same encoding
    a, b = c.decode(fast, channels_last=True), c.decode(ref, channels_last=True, reference=True)
    assert a.shape == nhwc.shape and a.tobytes() == b.tobytes()
    assert a.transpose(0, 3, 1, 2).tobytes() == c.decode(fast).tobytes()  # either layout, the same values


@settings(max_examples=60, deadline=None)
@given(x=arrays())
def test_relu_backward_on_binarized_output_equals_dense_backward_bytes(x):
    rng = np.random.default_rng(x.size)
    dy = rng.standard_normal(x.size).astype(np.float32)
    dy[: x.size // 7] *= -1e-30  # tiny and negative: signed zeros in the product
    enc = codecs.get("binarize").encode(x)
    want = np.multiply(dy, x > 0)
    for reference in (False, True):
        dx = np.empty_like(dy)
        codecs.Binarize.relu_backward(enc, dy, dx, reference=reference)
        assert dx.tobytes() == want.tobytes()
    codecs.Binarize.relu_backward(enc, dy, dy)  # in place
    assert dy.tobytes() == want.tobytes()


def _nvrtc_cubin(arch):
    """The kernels compiled by CuPy's NVRTC for ``arch``, or None where NVRTC is not usable here."""
    try:
        from vmem.device.cuda import kernels

        return kernels.compile_cubin(arch)
    except Exception as exc:  # CuPy or NVRTC's library missing; a compile error is raised with its log
        if "could not compile" in str(exc):
            raise
        return None


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_for_the_gpu(tmp_path, arch):
    """nvcc where it is installed, else NVRTC: skipped only where neither is."""
    if shutil.which("nvcc") is not None:
        src = tmp_path / "kernels.cu"
        src.write_text((NATIVE / "kernels.cuh").read_text())
        cmd = ["nvcc", "-cubin", f"-arch={arch}", "-o", str(tmp_path / "k.cubin"), str(src)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        cubin = (tmp_path / "k.cubin").read_bytes()
    else:
        cubin = _nvrtc_cubin(arch)
        if cubin is None:
            pytest.skip("neither nvcc nor NVRTC is installed")
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 10_000


#: the codecs' kernels, which may divide 64-bit values (the layers' kernels never do)
_CODEC_KERNELS = ("fixed_", "fixed4_", "fixed8_", "patch2_", "zvc_", "ssdc_", "dpr", "binarize_")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_no_64_bit_division_in_the_layer_kernels(tmp_path):
    """A 64-bit integer division is a long software sequence on the GPU: the layers' kernels (ReLU, bias,
    column sums, max pooling, the update, the finite check) divide in 32 bits, and where an index does not
    fit 32 bits through a double's quotient corrected (vmem_div64), in the sm_90 PTX nvcc makes."""
    import re

    src = tmp_path / "kernels.cu"
    src.write_text((NATIVE / "kernels.cuh").read_text())
    out = subprocess.run(
        ["nvcc", "-ptx", "-arch=sm_90", "-o", str(tmp_path / "k.ptx"), str(src)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "k.ptx").read_text()
    entries = re.split(r"\n(?=\.visible \.entry|\.func)", ptx)
    found, layer = [], 0
    for body in entries:
        m = re.match(r"\.(?:visible \.entry|func)\s+(?:\([^)]*\)\s*)?(\w+)", body)
        if m is None or m.group(1).startswith(_CODEC_KERNELS):
            continue
        layer += 1
        if re.search(r"\b(div|rem)\.[su]64\b", body):
            found.append(m.group(1))
    assert layer >= 20 and not found, found


def test_the_gpus_64_bit_quotient_through_doubles_is_exact():
    """vmem_div64's rule (kernels.cuh), with Python's floats (IEEE doubles, divided rounding to nearest as
    div.rn.f64) and truncation as C's cast: the quotient of every pair tried, up to 2^53, is a // b."""
    rng = np.random.default_rng(0)

    def div64(a: int, b: int) -> int:
        q = int(float(a) / float(b))
        if q * b > a:
            q -= 1
        elif (q + 1) * b <= a:
            q += 1
        return q

    pairs = [(int(a), int(b)) for a, b in zip(rng.integers(0, 1 << 53, 20000), rng.integers(1, 1 << 40, 20000))]
    pairs += [
        (k * b - e, b) for b in (3, 7, 224, 50176, (1 << 31) - 1, 3 << 40) for k in (1, 2, 1 << 20) for e in (0, 1)
    ]
    pairs += [((1 << 53) - 1, 1), ((1 << 53) - 1, 3), ((1 << 53) - 2, (1 << 26) + 1)]
    assert all(div64(a, b) == a // b for a, b in pairs if a >= 0)


def test_the_kernels_split_over_threads_give_the_same_bytes(monkeypatch):
    monkeypatch.setattr(native, "_PARALLEL_MIN", 64)
    x = np.maximum(np.random.default_rng(1).standard_normal(40_007).astype(np.float32), 0) * 7
    assert len(native._chunks(x.size)) > 1 or (native.os.cpu_count() or 1) == 1
    for spec in KERNEL_CODECS:
        _same(codecs.get(spec), x[:40_005].reshape(-1, 5) if spec.startswith("fixed") else x)
    _same(codecs.get("patch2"), x[: 2 * 7 * 45 * 63].reshape(2, 7, 45, 63))  # rows split over threads
    for spec in ("fixed:bits=8", "fixed:bits=4"):
        _same(codecs.get(spec), x[:40_000].reshape(-1, 8), axis=-1)


class _GpuLike(native._Cpu):
    """The CPU build driven as the GPU drives its kernels: one fp10 kernel over every word (no split into
    whole words), launches from thread 0 only (the scan is the same generic one on both)."""

    split_full = False

    def launch(self, kernel, threads, *args, first=0, cols=1):
        assert first == 0, kernel
        super().launch(kernel, threads, *args, cols=cols)


@settings(max_examples=40, deadline=None)
@given(arrays())
def test_the_gpu_launch_sequence_gives_the_cpu_builds_bytes(x):
    """The launches a GPU backend makes (the same wrappers, another Backend) encode and decode as the CPU's."""
    gpu = _GpuLike()
    assert native.backend(x) is native.CPU
    for fmt in ("fp16", "fp10", "fp8"):
        codes = native.dpr_encode(x, fmt, gpu)
        assert np.array_equal(codes, native.dpr_encode(x, fmt))
        out, want = np.empty_like(x), np.empty_like(x)
        native.dpr_decode(codes, fmt, out, gpu)
        native.dpr_decode(codes, fmt, want)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), fmt
    mask, values = native.zvc_encode(x, gpu)
    want_mask, want_values = native.zvc_encode(x)
    assert np.array_equal(mask, want_mask) and np.array_equal(values.view(np.uint32), want_values.view(np.uint32))
    out = np.full_like(x, 7.0)
    native.zvc_decode(mask, values, out, gpu)
    assert np.array_equal(out.view(np.uint32), x.view(np.uint32))
    row_ptr, cols, vals = native.ssdc_encode(x, 256, gpu)
    assert all(
        np.array_equal(a.view(np.uint8), b.view(np.uint8))
        for a, b in zip((row_ptr, cols, vals), native.ssdc_encode(x, 256))
    )
    out = np.full_like(x, 7.0)
    native.ssdc_decode(row_ptr, cols, vals, out, gpu)
    assert np.array_equal(out.view(np.uint32), x.view(np.uint32))
    bits = native.binarize_encode(x, gpu)
    assert np.array_equal(bits, native.binarize_encode(x))
    out = np.empty_like(x)
    native.binarize_decode(bits, out, gpu)
    assert np.array_equal(out, (x > 0).astype(np.float32))


def test_only_numpy_and_registered_gpu_arrays_have_a_backend():
    assert native.backend(np.zeros(3, np.float32)) is native.CPU
    assert native.backend([1.0, 2.0]) is None
    assert all(codecs.get(name).gpu for name in ("zvc", "ssdc", "binarize", "fp16", "fp10", "fp8"))
    assert not codecs.get("fixed8").gpu and not codecs.get("patch2").gpu
