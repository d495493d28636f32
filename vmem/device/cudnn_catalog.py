"""cuDNN's convolution algorithms as the simulator sees them: applicability, workspace, arithmetic.

For each pass (forward, backward-data, backward-filter) the legacy API offers a handful of algorithms
(see docs/gpu.md for their enums). The simulator needs, per algorithm and layer shape: whether it
applies, how much workspace it asks for, how many FLOPs it actually performs (FFT and Winograd do fewer
multiplies than the direct method) and how efficiently it runs. Workspace sizes follow the structure of
each method (column buffers for GEMM, transformed tensors for FFT and non-fused Winograd); they are
models, not cuDNN's exact numbers, and the efficiencies are calibrated against the published Titan X
figures of convnet-benchmarks (see vmem.costs).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph import OpInfo, Program

__all__ = [
    "ALGORITHMS",
    "Geometry",
    "workspace",
    "effective_flops",
    "applies",
    "EFFICIENCY",
    "TENSOR_CORE_ALGOS",
    "geometry",
    "with_cudnn_catalog",
]

ALGORITHMS = {
    "forward": ["implicit_gemm", "implicit_precomp_gemm", "gemm", "fft", "fft_tiling", "winograd", "winograd_nonfused"],
    "backward_data": ["algo_0", "algo_1", "fft", "fft_tiling", "winograd", "winograd_nonfused"],
    "backward_filter": ["algo_0", "algo_1", "fft", "algo_3", "winograd_nonfused", "fft_tiling"],
}

#: Algorithms that run on tensor cores in fp16/bf16 (CUDNN_TENSOR_OP_MATH); the others compute in FP32.
TENSOR_CORE_ALGOS = frozenset({"implicit_precomp_gemm", "winograd_nonfused", "algo_1"})

#: Fraction of peak FP32 each algorithm sustains on a large, well-shaped layer.
EFFICIENCY = {
    "implicit_gemm": 0.50,
    "implicit_precomp_gemm": 0.72,
    "gemm": 0.62,
    "fft": 0.55,
    "fft_tiling": 0.55,
    "winograd": 0.55,
    "winograd_nonfused": 0.50,
    "algo_0": 0.45,
    "algo_1": 0.60,
    "algo_3": 0.62,
}


@dataclass(frozen=True)
class Geometry:
    n: int
    c: int
    h: int
    w: int
    k: int
    kh: int
    kw: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    ho: int
    wo: int
    groups: int = 1
    dilation: tuple[int, int] = (1, 1)

    @property
    def direct_flops(self) -> int:
        return 2 * self.n * self.k * self.ho * self.wo * (self.c // self.groups) * self.kh * self.kw


def _fft_size(n: int) -> int:
    """Smallest 2^a 3^b 5^c 7^d >= n (sizes cuFFT handles fast)."""
    m = n
    while True:
        r = m
        for p in (2, 3, 5, 7):
            while r % p == 0:
                r //= p
        if r == 1:
            return m
        m += 1


#: Algorithms a GPU generation's reference cuDNN lacks. The Titan X (Maxwell) figures vDNN and
#: convnet-benchmarks report were taken with cuDNN v4, before Winograd arrived (v5).
UNAVAILABLE = {"maxwell": {"winograd", "winograd_nonfused"}}


def applies(g: Geometry, algo: str, arch: str | None = None) -> bool:
    if algo in UNAVAILABLE.get(arch or "", ()):
        return False
    if g.groups > 1 or g.dilation != (1, 1):  # grouped, depthwise, dilated: the GEMM-style kernels only, as modelled
        return algo in ("implicit_gemm", "implicit_precomp_gemm", "algo_0", "algo_1")
    unit = g.stride == (1, 1)
    if algo in ("fft", "fft_tiling"):
        return unit and g.kh > 1 and g.kw > 1 and (g.h + 2 * g.pad[0] <= 256)
    if algo == "winograd":
        return unit and (g.kh, g.kw) == (3, 3)
    if algo == "winograd_nonfused":
        return unit and (g.kh, g.kw) in ((3, 3), (5, 5))
    return True


def workspace(g: Geometry, pass_: str, algo: str, itemsize: int = 4) -> int:
    """Modelled workspace bytes."""
    if algo in ("implicit_gemm", "algo_0", "algo_1"):
        return 0
    if algo == "implicit_precomp_gemm":
        return itemsize * g.kh * g.kw * (g.c // g.groups) * 2
    if algo == "gemm":  # one image's columns at a time
        return itemsize * g.c * g.kh * g.kw * g.ho * g.wo
    if algo == "algo_3":
        return itemsize * g.k * g.c * g.kh * g.kw  # partial filter gradients
    if algo == "fft":
        hf = _fft_size(g.h + 2 * g.pad[0] + g.kh - 1)
        wf = _fft_size(g.w + 2 * g.pad[1] + g.kw - 1)
        return 2 * itemsize * (g.n * g.c + g.n * g.k + g.c * g.k) * hf * (wf // 2 + 1)
    if algo == "fft_tiling":  # 32x32 tiles, each giving (33 - k) x (33 - k) outputs: counted over the output,
        # as effective_flops counts them (AlexNet conv2 at 128: about 0.2 GB)
        tiles = math.ceil(g.ho / (32 - g.kh + 1)) * math.ceil(g.wo / (32 - g.kw + 1))
        return 2 * itemsize * (g.n * (g.c + g.k) * min(tiles, 4) + g.c * g.k) * 32 * 17
    if algo == "winograd":
        return itemsize * 16 * g.c * g.k  # transformed filters
    if algo == "winograd_nonfused":
        m = 4 if g.kh == 3 else 2
        tile = (m + g.kh - 1) ** 2
        tiles = math.ceil(g.ho / m) * math.ceil(g.wo / m)
        return itemsize * tile * (g.n * g.c * tiles + g.n * g.k * tiles + g.c * g.k)
    raise ValueError(f"unknown cuDNN algorithm {algo!r}")


def effective_flops(g: Geometry, algo: str) -> float:
    """FLOPs the algorithm actually performs (the direct count for GEMM-style methods)."""
    direct = float(g.direct_flops)
    if algo == "winograd":  # F(2x2, 3x3): 16 multiplies per 4 outputs instead of 36
        return direct / 2.25 * 1.15  # transforms
    if algo == "winograd_nonfused":
        return direct / (4.0 if g.kh == 3 else 2.8) * 1.3
    if algo in ("fft", "fft_tiling"):
        hf = _fft_size(g.h + 2 * g.pad[0] + g.kh - 1) if algo == "fft" else 32
        wf = _fft_size(g.w + 2 * g.pad[1] + g.kw - 1) if algo == "fft" else 32
        tiles = 1 if algo == "fft" else math.ceil(g.ho / (32 - g.kh + 1)) * math.ceil(g.wo / (32 - g.kw + 1))
        spectrum = hf * (wf // 2 + 1) * tiles
        pointwise = 8.0 * g.n * g.c * g.k * spectrum  # complex multiply-add per frequency
        transforms = 5.0 * (g.n * g.c + g.n * g.k + g.c * g.k) * hf * wf * tiles * math.log2(hf * wf)
        return min(pointwise + transforms, direct * 4)
    return direct


def geometry(op: "OpInfo") -> Geometry:
    """A convolution op's geometry (logical NCHW shapes)."""
    layer = op.layer
    n, c, h, w = op.in_shapes[0]
    _, k, ho, wo = op.out_shape
    kh, kw = layer.kernel_size  # type: ignore[attr-defined]
    groups = getattr(layer, "groups", 1)
    dilation = tuple(getattr(layer, "dilation", (1, 1)))
    return Geometry(n, c, h, w, k, kh, kw, layer.stride, layer.padding, ho, wo, groups, dilation)  # type: ignore[attr-defined,arg-type]


def with_cudnn_catalog(program: "Program", arch: str | None = None) -> "Program":
    """A copy of ``program`` whose convolutions offer cuDNN's algorithms (as the simulator models them)."""
    ops = []
    for op in program.ops:
        if op.kind == "conv":
            g = geometry(op)
            algos = {p: [a for a in names if applies(g, a, arch)] for p, names in ALGORITHMS.items()}
            ws: dict[str, dict[str | None, int]] = {
                p: {a: workspace(g, p, a, op.itemsize) for a in algos[p]} for p in algos
            }
            op = dataclasses.replace(op, algorithms=algos, workspace=ws)
        ops.append(op)
    return dataclasses.replace(program, ops=ops)
