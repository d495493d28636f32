"""Transfers through a codec (cDMA in software): encode on the way to the host, decode on the way back.

Only the encoded bytes cross the link (the device's ``copy_now`` throttles to its link rate), so a
sparse feature map moves in less time than its size at the link rate. Both functions run on the
device's memory stream, in the task that moves the data, so they add no synchronization.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Codec, Encoded

__all__ = ["send", "receive"]


def send(device: Any, codec: Codec, src: Any, host: np.ndarray) -> Encoded:
    """Encode ``src`` (stored channels last) and copy the encoding into ``host`` (pinned bytes) over the
    link. Returns the encoding, its arrays in ``host``; ``.nbytes`` is what crossed the link."""
    from . import encode_channels_last

    enc = encode_channels_last(codec, src)
    return enc.store(host, copy=lambda dst, a: device.copy_now(dst, a, "d2h"))


def receive(device: Any, codec: Codec, enc: Encoded, dst: Any) -> None:
    """Copy an encoding back over the link and decode it into ``dst`` (stored channels last)."""
    from . import decode_channels_last

    arrays = {}
    for key, a in enc.arrays.items():
        staged = np.empty(a.nbytes, np.uint8)
        device.copy_now(staged, np.ascontiguousarray(a).reshape(-1).view(np.uint8), "h2d")
        arrays[key] = staged.view(a.dtype).reshape(a.shape)
    decode_channels_last(codec, Encoded(enc.codec, enc.shape, enc.dtype, arrays, enc.meta), dst)
