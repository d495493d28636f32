"""Transfers through a codec (cDMA in software): encode on the way to the host, decode on the way back.

Only the encoded bytes cross the link (the device's ``copy_now`` throttles to its link rate), so a
sparse feature map moves in less time than its size at the link rate. Codecs that encode values in
order (zvc, ssdc, dpr, binarize) work in pieces of about 4 MiB, pipelined as a DMA engine with a
compressor would: while one piece crosses the link, the next is encoded (or the previous decoded).
Codecs that do not stream (per-channel and per-patch: fixed, patch2) encode the whole tensor first. Both functions run on
the device's memory stream, in the task that moves the data, so they add no synchronization.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, TYPE_CHECKING

import numpy as np

from ..threads import LINK
from .base import STORE_SLACK, Codec, Encoded, array_module

if TYPE_CHECKING:
    from .._typing import Array
    from numpy.typing import DTypeLike
    from ..device.base import Device

__all__ = ["send", "receive", "host_nbytes", "Pieces"]

PIECE = 3 << 20  # values per piece (12 MiB of float32): a multiple of every codec's group (3, 8, 32, 256)


class Pieces:
    """An encoding sent in pieces: each piece's encoding (arrays in pinned memory), in order."""

    __slots__ = ("parts", "shape", "whole")

    def __init__(self, parts: list[Encoded], shape: tuple[int, ...], whole: bool):
        self.parts, self.shape, self.whole = parts, shape, whole

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def host_nbytes(codec: Codec, shape: tuple[int, ...], dtype: DTypeLike = "float32") -> int:
    """Pinned bytes that hold any encoding of a tensor of ``shape`` (logical NCHW) and ``dtype`` sent in
    pieces: the worst case (every value nonzero) plus room for each piece's alignment and headers."""
    from .base import stored_nbytes

    n = int(np.prod(shape))
    pieces = len(_ranges(n, not codec.streams))
    return stored_nbytes(codec, shape, 1.0, dtype) + pieces * (STORE_SLACK + 8)


def _ranges(n: int, whole: bool) -> list[tuple[int, int]]:
    if whole or n <= PIECE:
        return [(0, n)]
    return [(lo, min(lo + PIECE, n)) for lo in range(0, n, PIECE)]


def _submit(inline: bool, fn: Any, *args: Any) -> Future:
    """Run ``fn`` on the link thread, or here (``inline``: on a GPU, where the copies are asynchronous on
    the caller's stream already, and a thread of their own would put them on another stream)."""
    if not inline:
        return LINK.submit(fn, *args)
    done: Future = Future()
    done.set_result(fn(*args))
    return done


def send(device: Device, codec: Codec, src: Array, host: np.ndarray, ranges: tuple[Any, Any] | None = None) -> Pieces:
    """Encode ``src`` (stored channels last) and copy the encoding into ``host`` (pinned bytes) over the
    link, piece by piece, encoding the next piece while the previous one crosses. ``ranges``: per-channel
    ``(lo, hi)`` for ``fixed``. ``.nbytes`` of the result is what crossed the link."""
    whole = not codec.streams
    inline = bool(device.asynchronous)  # a GPU enqueues its copies: nothing to overlap on a thread
    flat = src.reshape(-1)
    parts: list[Encoded] = []
    offset = 0
    pending = None
    for lo, hi in _ranges(flat.size, whole):
        enc = codec.encode_stored(src, *(ranges or ())) if whole else codec.encode(flat[lo:hi])
        if pending is not None:
            pending.result()  # the link carries one piece at a time
        room = host[offset:]
        stored = enc.store(room, copy=lambda dst, a: None)  # place the arrays; the link copies them below
        pairs = [
            (
                stored.arrays[k].reshape(-1).view(np.uint8),
                array_module(a).ascontiguousarray(a).reshape(-1).view(np.uint8),
            )
            for k, a in enc.arrays.items()
        ]

        def copy(ps: list[tuple[Array, Array]] = pairs) -> None:
            for d, s in ps:
                device.copy_now(d, s, "d2h")

        pending = _submit(inline, copy)
        parts.append(stored)
        offset += enc.nbytes + STORE_SLACK
    if pending is not None:
        pending.result()
    return Pieces(parts, tuple(src.shape), whole)


def receive(device: Device, codec: Codec, sent: Pieces, dst: Array) -> None:
    """Copy an encoding back over the link and decode it into ``dst`` (stored channels last), decoding
    each piece while the next one crosses. The staging arrays are made here, on the caller's thread (on
    a GPU: through the device's allocator, which only the stream's own thread routes to its pool)."""
    xp = array_module(dst)

    def staged(part: Encoded) -> dict[str, Any]:
        return {key: xp.empty(a.nbytes, np.uint8) for key, a in part.arrays.items()}

    def fetch(part: Encoded, into: dict[str, Any]) -> Encoded:
        arrays = {}
        for key, a in part.arrays.items():
            device.copy_now(into[key], a.reshape(-1).view(np.uint8), "h2d")
            arrays[key] = into[key].view(a.dtype).reshape(a.shape)
        return Encoded(part.codec, part.shape, part.dtype, arrays, part.meta)

    flat = dst.reshape(-1)
    ranges = _ranges(flat.size, sent.whole)
    parts = sent.parts
    inline = bool(device.asynchronous)  # a GPU enqueues its copies: nothing to overlap on a thread
    pending = _submit(inline, fetch, parts[0], staged(parts[0])) if parts else None
    for i, (lo, hi) in enumerate(ranges):
        assert pending is not None  # a range a part: one is in flight for each
        part = pending.result()
        pending = _submit(inline, fetch, parts[i + 1], staged(parts[i + 1])) if i + 1 < len(parts) else None
        if sent.whole:
            codec.decode_stored(part, dst)
        else:
            codec.decode(part, flat[lo:hi])
