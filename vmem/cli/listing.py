"""``vmem models`` and ``vmem devices``: what the zoo holds and which devices there are."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..units import format_bytes
from .progress import Slow

__all__ = ["cmd_models", "cmd_devices"]


def cmd_models(args: argparse.Namespace) -> int:
    from .. import models

    rows: list[dict[str, Any]] = []
    with Slow(f"building the {len(models.names())} models of the zoo to count their parameters", quiet=args.json):
        for name in models.names():
            net = models.get(name)
            assert net.input_shape is not None  # every zoo model has one
            rows.append(
                {
                    "name": name,
                    "input_shape": list(net.input_shape),
                    "params": net.num_params(),
                    "description": models.info(name),
                }
            )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(r["name"]) for r in rows)
        for r in rows:
            shape = "x".join(map(str, r["input_shape"]))
            print(f"{r['name']:<{width}}  {shape:>11}  {r['params'] / 1e6:8.2f}M params  {r['description']}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from ..device import specs as gpu_specs
    from ..device.cuda import nvml

    rows: list[dict[str, Any]] = [{"name": "cpu", "kind": "cpu"}]
    for gpu in nvml.gpus():  # through NVML alone: listing GPUs imports no CuPy
        index = gpu["cuda_index"]
        rows.append(
            {"name": f"cuda:{index}" if index is not None else f"nvml:{gpu['nvml_index']}", "kind": "cuda", **gpu}
        )
    rows += [{**gpu_specs.get(n).to_dict(), "name": f"sim:{n}", "kind": "sim"} for n in gpu_specs.names()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("cpu  (the default: real numerics; memory= sets its capacity, pcie_gbps= throttles copies)")
    cuda = [r for r in rows if r["kind"] == "cuda"]
    if not cuda:
        print(f"cuda: none here: {nvml.why_not() or 'NVML lists no GPU'}")
    for r in sorted(cuda, key=lambda r: (r["cuda_index"] is None, r["cuda_index"] or 0, r["nvml_index"])):
        link = f", PCIe gen {r['pcie_gen']} x{r['pcie_width']}" if "pcie_gen" in r else ""
        print(
            f"{r['name']:<16} {format_bytes(r['total_bytes']):>11}  {r['gpu']} at {r['pci_bus_id']}: "
            f"{format_bytes(r['used_bytes'])} in use{link}"
        )
    if any(r["cuda_index"] is None for r in cuda):
        print(
            "  nvml:N: CUDA hides it (CUDA_VISIBLE_DEVICES), or numbers these different GPUs fastest first; "
            "set CUDA_DEVICE_ORDER=PCI_BUS_ID for cuda:N in this order"
        )
    for r in rows:
        if r["kind"] == "sim":
            print(
                f"{r['name']:<16} {format_bytes(r['memory']):>11}  {r['fp32_tflops']:5.1f} TFLOP/s  "
                f"{r['memory_gbps']:6.0f} GB/s  host link {r['h2d_gbps']:g} GB/s  (simulated: plans only)"
            )
    return 0
