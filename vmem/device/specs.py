"""GPU spec sheets for the simulator, and a way to add your own.

Figures are vendor peaks (FP32 without tensor cores; FP16 and BF16 dense tensor-core throughput with
FP32 accumulation, where the GPU has such units; memory bandwidth) and achieved pinned cudaMemcpyAsync
bandwidth over the host link (about 80% of PCIe peak). Memory sizes are the cards' advertised sizes in
GiB, except the H200's 141 GB. The interconnect between the GPUs of a data-parallel run: NVLink for the SXM
data-centre cards (the bus bandwidth NCCL's all-reduce achieves, about 80% of the links' peak each way),
PCIe for the others.
"""

from __future__ import annotations

import json
import os
from dataclasses import fields, replace
from typing import Any

from ..units import parse_bytes
from .spec import DeviceSpec

__all__ = ["SPECS", "get", "names", "register", "load"]

GiB = 1 << 30


def _gpu(
    name: str,
    memory: int,
    tflops: float,
    gbps: float,
    link: float,
    arch: str,
    launch_us: float = 5.0,
    half: tuple[float | None, float | None] = (None, None),
    nvlink: float | None = None,
) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        kind="sim",
        memory=memory,
        pcie_gbps=link,
        fp32_tflops=tflops,
        memory_gbps=gbps,
        h2d_gbps=link,
        d2h_gbps=link,
        launch_us=launch_us,
        arch=arch,
        fp16_tflops=half[0],
        bf16_tflops=half[1],
        interconnect="nvlink" if nvlink else "pcie",
        interconnect_gbps=nvlink or link,
        interconnect_us=3.0 if nvlink else 10.0,
    )


SPECS: dict[str, DeviceSpec] = {
    s.name: s
    for s in (
        _gpu("titan-x", 12 * GiB, 6.6, 336.5, 12.8, "maxwell"),  # GTX Titan X (Maxwell), PCIe 3 x16
        _gpu("gtx-1080ti", 11 * GiB, 11.3, 484.0, 12.8, "pascal"),
        _gpu("rtx-2080ti", 11 * GiB, 13.4, 616.0, 12.8, "turing", half=(53.8, None)),  # no BF16 units
        # SXM2, host link PCIe 3; NVLink 2 (150 GB/s each way, ~130 achieved as an all-reduce's bus bandwidth)
        _gpu("v100-16gb", 16 * GiB, 15.7, 900.0, 12.8, "volta", half=(125.0, None), nvlink=130.0),
        # PCIe 4 to the host; NVLink 3 (300 GB/s each way, ~230 achieved)
        _gpu("a100-40gb", 40 * GiB, 19.5, 1555.0, 25.0, "ampere", 4.0, (312.0, 312.0), nvlink=230.0),
        _gpu("a100-80gb", 80 * GiB, 19.5, 2039.0, 25.0, "ampere", 4.0, (312.0, 312.0), nvlink=230.0),
        # PCIe 5 to the host; NVLink 4 (450 GB/s each way, ~360 achieved)
        _gpu("h100-sxm", 80 * GiB, 67.0, 3350.0, 50.0, "hopper", 3.0, (989.0, 989.0), nvlink=360.0),
        _gpu("h200", 141 * 10**9, 67.0, 4800.0, 50.0, "hopper", 3.0, (989.0, 989.0), nvlink=360.0),
    )
}


def names() -> list[str]:
    return sorted(SPECS)


def get(name: str) -> DeviceSpec:
    if name not in SPECS:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(names())} (add one with vmem.device.specs.register)")
    return SPECS[name]


def register(name: str, *, base: str | None = None, **values: Any) -> DeviceSpec:
    """Add a spec sheet (or derive one from ``base`` with some values changed); returns it.

    ``memory`` takes bytes or a size string; the other fields are those of :class:`DeviceSpec`."""
    allowed = {f.name for f in fields(DeviceSpec)} - {"name", "kind"}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise ValueError(f"spec {name!r}: unknown field(s) {unknown}; fields are {sorted(allowed)}")
    if "memory" in values:
        values["memory"] = parse_bytes(values["memory"], name="memory")
    if base is not None:
        spec = replace(get(base), name=name, **values)
    else:
        missing = [f for f in ("memory", "fp32_tflops", "memory_gbps", "h2d_gbps", "d2h_gbps") if f not in values]
        if missing:
            raise ValueError(f"spec {name!r}: missing {missing} (or give base= an existing GPU)")
        values.setdefault("launch_us", 5.0)
        values.setdefault("arch", "volta")
        values.setdefault("pcie_gbps", values["h2d_gbps"])
        spec = DeviceSpec(name=name, kind="sim", **values)
    SPECS[name] = spec
    return spec


def load(path: str | os.PathLike) -> list[DeviceSpec]:
    """Register the spec sheets of a JSON file: ``{"name": {"memory": "24GB", "fp32_tflops": ..., ...}}``."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read GPU specs ({exc})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping GPU names to their fields")
    return [register(name, **values) for name, values in data.items()]
