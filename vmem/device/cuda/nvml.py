"""NVML readings of a GPU: memory the driver sees in use, PCIe throughput and link (nvidia-ml-py).

Used by ``vmem devices`` (which imports no CuPy) and sampled into a CUDA step's timeline by a
:class:`Sampler`, off the step's critical path: NVML's PCIe throughput counters sample over 20 ms, so a
reading inside the step would cost it tens of milliseconds.

NVML numbers GPUs in PCI bus order; CUDA numbers them fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``,
and only those ``CUDA_VISIBLE_DEVICES`` lists. :func:`gpus` says which ``cuda:N`` each NVML GPU is, where that
can be told without CUDA (all GPUs alike, or PCI bus order asked for); a CUDA device reads its own GPU by
PCI bus id.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import Any, Callable

__all__ = ["available", "why_not", "reading", "gpus", "cuda_order", "Sampler"]


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@lru_cache(maxsize=16)
def _handle(index: int) -> Any:
    """NVML's handle of CUDA GPU ``index``, matched by PCI bus id (a CUDA device has CuPy loaded already)."""
    nv = _nvml()
    try:
        import cupy

        bus = cupy.cuda.Device(index).pci_bus_id
        return nv.nvmlDeviceGetHandleByPciBusId(bus.encode() if isinstance(bus, str) else bus)
    except Exception:  # noqa: BLE001 - fall back to NVML's own order
        return nv.nvmlDeviceGetHandleByIndex(index)


def _read(nv: Any, h: Any) -> dict[str, Any]:
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


def reading(index: int = 0) -> dict[str, Any]:
    """Memory (bytes: total, used, free) and PCIe (KB/s each way, generation, width) of CUDA GPU ``index``;
    empty without NVML. Takes tens of milliseconds (the PCIe counters)."""
    nv = _nvml()
    return {} if nv is None else _read(nv, _handle(index))


def cuda_order(rows: list[dict[str, Any]], environ: Any = None) -> dict[int, int]:
    """NVML index -> CUDA index of the GPUs CUDA will show, where that can be told without CUDA: with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, or when every GPU is the same model (CUDA's fastest-first order
    then keeps PCI bus order); then ``CUDA_VISIBLE_DEVICES`` (indices or UUID prefixes, up to the first
    entry that names none) picks and orders them. Empty where the order cannot be told."""
    env = os.environ if environ is None else environ
    by_bus = sorted(rows, key=lambda r: r["pci_bus_id"].lower())
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") != "PCI_BUS_ID" and len({r["gpu"] for r in rows}) > 1:
        return {}
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        chosen = by_bus
    else:
        chosen = []
        for entry in (e.strip() for e in visible.split(",")):
            match = None
            if entry.isdigit():
                match = by_bus[int(entry)] if int(entry) < len(by_bus) else None
            elif entry:
                found = [r for r in by_bus if r.get("uuid", "").startswith(entry)]
                match = found[0] if len(found) == 1 else None
            if match is None or match in chosen:
                break  # CUDA ignores the rest of the list
            chosen.append(match)
    return {r["nvml_index"]: i for i, r in enumerate(chosen)}


def gpus() -> list[dict[str, Any]]:
    """Every GPU NVML sees (no CuPy imported): name, PCI bus id, UUID, its readings, and ``cuda_index``
    (None where CUDA hides it or its number cannot be told: see :func:`cuda_order`)."""
    nv = _nvml()
    if nv is None:
        return []
    rows: list[dict[str, Any]] = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        row = {
            "nvml_index": i,
            "gpu": _text(nv.nvmlDeviceGetName(h)),
            "pci_bus_id": _text(nv.nvmlDeviceGetPciInfo(h).busId),
            "uuid": _text(nv.nvmlDeviceGetUUID(h)),
        }
        rows.append({**row, **_read(nv, h)})
    order = cuda_order(rows)
    for listed in rows:
        listed["cuda_index"] = order.get(listed["nvml_index"])
    return rows


class Sampler:
    """Reads ``read()`` every ``period`` seconds on a thread of its own (started by the first
    :meth:`latest`), so that nothing waits for NVML: :meth:`latest` returns the last reading at once
    (empty until the first has come). :meth:`close` stops and joins the thread."""

    def __init__(self, read: Callable[[], dict[str, Any]], period: float = 0.1, name: str = "vmem-nvml"):
        self._read, self.period, self.name = read, period, name
        self._last: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                value = self._read()
            except Exception:  # noqa: BLE001 - a reading that fails is skipped; the last one stands
                value = None
            if value is not None:
                self._last = value
            self._stop.wait(self.period)

    def latest(self) -> dict[str, Any]:
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return dict(self._last)

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
