"""NVML readings of a GPU: memory the driver sees in use, PCIe throughput and link (nvidia-ml-py).

Used by ``vmem devices`` and sampled into a CUDA step's timeline. NVML's device order is not CUDA's:
GPUs are matched by PCI bus id."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["available", "why_not", "reading", "gpus"]


@lru_cache(maxsize=1)
def _load() -> tuple[Any, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "NVML's bindings are not installed (the cuda extra: pip install 'vmem[cuda]')"
    try:
        pynvml.nvmlInit()
        return pynvml, None
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU: no readings
        return None, f"NVML finds no NVIDIA driver or GPU ({type(exc).__name__}: {exc})"


def _nvml() -> Any:
    return _load()[0]


def available() -> bool:
    return _nvml() is not None


def why_not() -> str | None:
    """Why NVML gives no readings here, in one line (None when it does)."""
    return _load()[1]


def _handle(index: int) -> Any:
    nv = _nvml()
    try:
        import cupy

        bus = cupy.cuda.Device(index).pci_bus_id
        return nv.nvmlDeviceGetHandleByPciBusId(bus.encode() if isinstance(bus, str) else bus)
    except Exception:  # noqa: BLE001 - fall back to NVML's own order
        return nv.nvmlDeviceGetHandleByIndex(index)


def reading(index: int = 0) -> dict[str, Any]:
    """Memory (bytes: total, used, free) and PCIe (KB/s each way, generation, width) of CUDA GPU ``index``;
    empty without NVML."""
    nv = _nvml()
    if nv is None:
        return {}
    h = _handle(index)
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    out: dict[str, Any] = {"total_bytes": int(mem.total), "used_bytes": int(mem.used), "free_bytes": int(mem.free)}
    try:
        out["pcie_tx_kbps"] = int(nv.nvmlDeviceGetPcieThroughput(h, 0))
        out["pcie_rx_kbps"] = int(nv.nvmlDeviceGetPcieThroughput(h, 1))
        out["pcie_gen"] = int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h))
        out["pcie_width"] = int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))
    except Exception:  # noqa: BLE001 - some readings are not supported on every GPU or VM
        pass
    return out


def gpus() -> list[dict[str, Any]]:
    """Every GPU NVML sees: name and memory."""
    nv = _nvml()
    if nv is None:
        return []
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        out.append({"nvml_index": i, "gpu": name.decode() if isinstance(name, bytes) else name,
                    "total_bytes": int(mem.total), "used_bytes": int(mem.used)})
    return out
