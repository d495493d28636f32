"""The CUDA device (``vmem.device("cuda:0")``). Nothing here imports CuPy, cuDNN or NVML until a CUDA device
is asked for; :func:`unavailable` says in one line why one cannot be had."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...device.base import Device

from typing import Any

from ...errors import DeviceError

__all__ = ["open_device", "unavailable", "EXTRA"]

#: How to install what the CUDA device needs.
EXTRA = "pip install 'vmem[cuda]' (CuPy, cuDNN and NVML wheels for CUDA 13)"


def unavailable() -> str | None:
    """Why no CUDA device can be made here (None when one can)."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed; on a machine with an NVIDIA GPU: {EXTRA}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - CUDARuntimeError without a driver or a GPU
        return f"no CUDA GPU is available ({type(exc).__name__}: {str(exc).strip() or 'no driver'}); {EXTRA} on a machine with one"
    return None if count > 0 else f"no CUDA GPU is available (the driver reports none); {EXTRA} on a machine with one"


def open_device(name: str, index: str, **options: Any) -> Device:
    """``cuda:<index>`` with ``options`` (see :class:`~vmem.device.cuda.device.CudaDevice`)."""
    try:
        i = int(index or 0)
    except ValueError:
        raise DeviceError(f"device {name!r}: expected cuda:<index>, e.g. cuda:0") from None
    reason = unavailable()
    if reason is not None:
        raise DeviceError(f"device {name!r}: {reason}")
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if not 0 <= i < count:
        raise DeviceError(f"device {name!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    from .device import CudaDevice

    try:
        return CudaDevice(i, **options)
    except TypeError as exc:
        raise DeviceError(
            f"device {name!r}: {exc}; options are memory, reserve, pinned_memory, poison, alignment, math, "
            "deterministic, temporaries, conv_api, nchw, graphs"
        ) from None
