"""The simulator's cost model: a roofline per op for a GPU spec sheet, with cuDNN's algorithm catalog.

The roofline takes the larger of compute time (effective FLOPs over peak times the algorithm's
efficiency, scaled down for layers too small to fill the GPU) and memory time (bytes over bandwidth),
plus a launch overhead. Its constants are calibrated so that the convnet-benchmarks models land near
their published Titan X times (bench/reproduce_vdnn.py prints the comparison).
"""

from __future__ import annotations


import numpy as np

from ..device.cudnn_catalog import (
    EFFICIENCY,
    TENSOR_CORE_ALGOS,
    effective_flops,
    geometry,
    with_cudnn_catalog,
    workspace,
)
from ..device.spec import DeviceSpec
from ..graph import OpInfo

__all__ = ["Roofline", "geometry", "with_cudnn_catalog"]  # the last two from vmem.device.cudnn_catalog

ELEMENTWISE_EFFICIENCY = 0.35  # fraction of memory bandwidth element-wise layers reach (calibrated)
#: fraction of memory bandwidth an encoding kernel reaches: one pass, reading the map and writing its
#: encoding (measured on an H100: the dpr16 and dpr8 kernels moved 0.57 and 0.49 of peak, binarize 0.88)
CODEC_EFFICIENCY = 0.55
GEMM_EFFICIENCY = 0.75  # fully connected layers
FILL = 16384  # output pixels x batch that fill a GPU; fewer leave units idle
CHANNEL_EXP = 0.6  # how much narrow GEMMs lose: (min(C*kh*kw, K) / 64) ** CHANNEL_EXP


def _bytes(op: OpInfo) -> int:
    """Bytes of the op's inputs, output and saved state, each in what it is stored in."""
    total = 0
    for shape, dtype in zip(list(op.in_shapes) + [op.out_shape], list(op.in_dtypes) + [op.out_dtype]):
        n = 1
        for d in shape:
            n *= d
        total += n * np.dtype(dtype).itemsize
    return total + sum(op.aux_nbytes.values())


class Roofline:
    """The simulator's cost model for a GPU spec sheet."""

    #: offloading through a codec can save time: the link moves the encoded bytes, the codec runs beside
    #: the copy engine (see vmem.policies.auto.codec_offloads)
    codec_offload = True

    def __init__(self, spec: DeviceSpec):
        if not (spec.fp32_tflops and spec.memory_gbps and spec.h2d_gbps and spec.d2h_gbps):
            raise ValueError(f"device {spec.name!r}: a spec sheet needs fp32_tflops, memory_gbps, h2d_gbps, d2h_gbps")
        self.spec = spec
        self.flops = spec.fp32_tflops * 1e12
        #: tensor-core peaks by the dtype an op computes on (fp16/bf16, where the GPU has the units)
        self.tensor_flops = {
            name: tflops * 1e12
            for name, tflops in (("float16", spec.fp16_tflops), ("bfloat16", spec.bf16_tflops))
            if tflops
        }
        self.bw = spec.memory_gbps * 1e9
        self.launch = (spec.launch_us or 5.0) * 1e-6
        self._memo: dict[tuple, float] = {}

    def op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float:
        """Seconds of one pass of ``op`` with ``algo`` (memoized: planning asks the same question often)."""
        key = (op.name, op.kind, op.in_shapes, op.out_shape, op.in_dtypes, op.out_dtype, pass_, algo)
        seconds = self._memo.get(key)
        if seconds is None:
            seconds = self._memo[key] = self._op_seconds(op, pass_, algo)
        return seconds

    def _op_seconds(self, op: OpInfo, pass_: str, algo: str | None) -> float:
        if op.kind == "conv":
            g = geometry(op)
            fill = (
                min(1.0, (g.n * g.ho * g.wo) / FILL) ** 0.5 * min(1.0, min(g.c * g.kh * g.kw, g.k) / 64) ** CHANNEL_EXP
            )
            if algo is None or algo in EFFICIENCY:
                model: str | None = algo or "implicit_precomp_gemm"
                ws = workspace(g, pass_, algo or "implicit_gemm", op.itemsize)
            else:  # a device's own name, with its catalog's workspace: a variant of a known algorithm
                # ("nchw.winograd": winograd on copies) does that one's arithmetic; others (cuDNN's graph
                # engines) the direct FLOPs
                base = algo.rsplit(".", 1)[-1]
                model = base if base in EFFICIENCY else None
                ws = (op.workspace or {}).get(pass_, {}).get(algo, 0)
            flops = effective_flops(g, model) if model else float(g.direct_flops)
            compute = flops / (self._peak(op, model) * EFFICIENCY.get(model or "", 0.6) * fill)
            traffic = (_bytes(op) + ws) / self.bw
            return self.launch + max(compute, traffic)
        factor = 1.0 if pass_ == "forward" else 2.0
        memory = factor * _bytes(op) / (self.bw * ELEMENTWISE_EFFICIENCY)
        if op.kind == "linear":
            compute = factor * op.flops / (self._peak(op, None) * GEMM_EFFICIENCY)
            weights = op.layer.in_features * op.layer.out_features * op.itemsize / self.bw  # type: ignore[attr-defined]
            return self.launch + max(compute, weights + memory)
        return self.launch + memory

    def _peak(self, op: OpInfo, algo: str | None) -> float:
        """Peak FLOP/s for ``op`` under ``algo``: the tensor cores' in fp16/bf16 where the GPU has them and
        the algorithm runs on them (None: a cuBLAS GEMM or a cuDNN graph engine; cuDNN's implicit
        precomputed GEMM, algo 1, non-fused Winograd), else the FP32 rate (pseudo-half computes in FP32)."""
        tensor = self.tensor_flops.get(op.dtype.name)
        return tensor if tensor and (algo is None or algo in TENSOR_CORE_ALGOS) else self.flops

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        gbps = self.spec.d2h_gbps if direction == "d2h" else self.spec.h2d_gbps
        return 10e-6 + nbytes / (gbps * 1e9)  # type: ignore[operator]

    def update_seconds(self, param_bytes: int) -> float:
        return self.launch + 5 * param_bytes / (self.bw * ELEMENTWISE_EFFICIENCY)

    def host_overheads(self) -> tuple[float, float, float]:
        """None beyond the launch in each op's time: a GPU runs while the host enqueues."""
        return 0.0, 0.0, 0.0

    def misc_seconds(self, kind: str, nbytes: int) -> float:
        if kind == "loss":
            return self.launch * 2
        if kind == "acc":  # two reads and a write
            return self.launch + 3 * nbytes / (self.bw * ELEMENTWISE_EFFICIENCY)
        return self.launch + nbytes / (self.bw * CODEC_EFFICIENCY)  # nbytes: the map and its encoding
