"""``cupy.cuda.runtime`` on the stand-in: one device, copies and fills on memory at real addresses."""

from __future__ import annotations

import ctypes

from .. import _state

#: what the stand-in reports as the device's memory (nothing is taken until an arena is made)
TOTAL = 16 << 30


class CUDARuntimeError(RuntimeError):
    pass


def getDeviceCount() -> int:
    return 1


def runtimeGetVersion() -> int:
    return 13000


def getDeviceProperties(index: int) -> dict:
    _check(index)
    return {"name": b"CuPy stand-in (CPU)", "major": 9, "minor": 0, "totalGlobalMem": TOTAL, "multiProcessorCount": 132}


def memGetInfo() -> tuple[int, int]:
    return TOTAL, TOTAL


def _check(index: int) -> None:
    if index != 0:
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")


_KINDS = {1: "host-to-device", 2: "device-to-host", 3: "device-to-device"}


def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    """Copy on ``stream`` (at once, the stand-in running every stream's work as it is enqueued; recorded
    where the stream captures), after checking that each side is where ``kind`` says: device memory inside
    one live allocation, host memory outside them. A capture takes copies between device and pinned memory
    only: a pageable host buffer is staged by the driver, which synchronizes."""
    if kind not in _KINDS:
        raise CUDARuntimeError(f"cudaErrorInvalidMemcpyDirection: kind {kind}")
    what = f"memcpyAsync ({_KINDS[kind]})"
    if kind in (1, 3):
        _state.device_region(dst, size, what)
    else:
        _state.host_side(dst, size, what)
    if kind in (2, 3):
        _state.device_region(src, size, what)
    else:
        _state.host_side(src, size, what)
    on = _stream(stream)
    cap = _state.capture_of(on)
    host = {1: src, 2: dst}.get(kind)
    if cap is not None and host is not None and not _state.pinned(host, size):
        _state._refuse(cap, f"cudaErrorStreamCaptureUnsupported: {what} of pageable host memory in a capture")
    _state.COUNTERS.copies += 1
    _state.submit(on, lambda: ctypes.memmove(dst, src, size), ("copy", dst, src, size, kind))


def memsetAsync(ptr: int, value: int, size: int, stream: int) -> None:
    _state.device_region(ptr, size, "memsetAsync")
    _state.COUNTERS.memsets += 1
    _state.submit(_stream(stream), lambda: ctypes.memset(ptr, value, size), ("memset", ptr, value, size))


def _stream(ptr: int):
    from .stream import stream_of

    return stream_of(ptr)


def deviceSynchronize() -> None:
    _state.refuse_in_capture("cudaDeviceSynchronize")
