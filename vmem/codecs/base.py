"""The codec protocol: encode a tensor into a few arrays, decode it back, and predict the size."""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .._typing import Xp
    from .._typing import Array
    from numpy.typing import DTypeLike

__all__ = [
    "Codec",
    "Encoded",
    "stored_nbytes",
    "STORE_SLACK",
    "array_module",
    "address",
    "is_device_array",
    "shape_of",
    "is_half",
]

_ALIGN = 8  # each array of an encoding stored in one block starts at a multiple of this
STORE_SLACK = 4 * _ALIGN  # room for aligning up to four arrays


@dataclass
class Encoded:
    """An encoded tensor: the codec's arrays plus what decoding needs (shape, dtype, scalars)."""

    codec: str
    shape: tuple[int, ...]
    dtype: np.dtype
    arrays: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # small scalars decoding needs (not counted in nbytes)

    @property
    def nbytes(self) -> int:
        """Bytes of the encoded arrays: what crosses the bus or stays on the device."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def stored_nbytes(self) -> int:
        """Bytes :meth:`store` needs: each array at an aligned offset (at most ``nbytes + STORE_SLACK``)."""
        offset = end = 0
        for a in self.arrays.values():
            end = offset + a.nbytes
            offset = -(-end // _ALIGN) * _ALIGN
        return end

    def store(self, raw: Any, *, copy: Any = None) -> "Encoded":
        """The same encoding with its arrays moved into ``raw`` (a byte buffer: a pool block, a pinned
        buffer), each at an aligned offset; ``copy(dst, src)`` moves the bytes (default: a plain copy,
        on the current stream where they are on a GPU)."""
        arrays, offset = {}, 0
        for key, a in self.arrays.items():
            a = array_module(a).ascontiguousarray(a)
            end = offset + a.nbytes
            if end > raw.nbytes:
                raise ValueError(
                    f"{self.codec}: the encoding needs {self.nbytes} bytes (with alignment more), "
                    f"the buffer holds {raw.nbytes}"
                )
            dst = raw[offset:end].view(a.dtype).reshape(a.shape)
            if copy is None:
                dst[...] = a
            else:
                copy(raw[offset:end], a.reshape(-1).view(np.uint8))
            arrays[key] = dst
            offset = -(-end // _ALIGN) * _ALIGN
        return Encoded(self.codec, self.shape, self.dtype, arrays, dict(self.meta))

    def at(self, raw: Any) -> "Encoded":
        """The same encoding read from ``raw``, a byte buffer that holds (or will hold, once a copy lands)
        the bytes :meth:`store` wrote: each array viewed at the offset ``store`` gave it, nothing copied."""
        arrays, offset = {}, 0
        for key, a in self.arrays.items():
            end = offset + a.nbytes
            arrays[key] = raw[offset:end].view(a.dtype).reshape(a.shape)
            offset = -(-end // _ALIGN) * _ALIGN
        return Encoded(self.codec, self.shape, self.dtype, arrays, dict(self.meta))


class Codec(ABC):
    """Base of every codec. ``lossless``: decode(encode(x)) is bitwise x (``binarize`` is exact for what
    ReLU's backward needs, not for the values). ``bound``: the documented error bound of lossy codecs."""

    name: ClassVar[str] = "codec"
    lossless: ClassVar[bool] = True
    data_dependent: ClassVar[bool] = False  # whether the encoded size depends on the values (sparsity)
    #: encodes values in order, so a tensor can be sent in pieces (each piece encoded on its own)
    streams: ClassVar[bool] = True
    #: keeps only the sign (binarize): exact for ReLU's backward, not for values
    sign_only: ClassVar[bool] = False
    #: takes a per-channel range (lo, hi) when it encodes (fixed point)
    ranged: ClassVar[bool] = False
    #: runs on a CUDA device's arrays (its kernels launched on the GPU)
    gpu: ClassVar[bool] = False

    @abstractmethod
    def encode(self, x: Array) -> Encoded:
        """Encode ``x`` (NumPy; CuPy where the kernels run on the GPU)."""

    @abstractmethod
    def decode(self, enc: Encoded, out: Array | None = None) -> Array:
        """Decode into ``out`` (or a new array) of ``enc``'s shape and dtype."""

    @abstractmethod
    def encoded_nbytes(self, shape: tuple[int, ...], dtype: DTypeLike = "float32", density: float | None = None) -> int:
        """Encoded size, exact when it does not depend on the data, else from ``density`` (fraction of
        nonzeros; default 0.5)."""

    def applies(self, shape: tuple[int, ...]) -> bool:
        """Whether this codec can encode a tensor of ``shape`` (logical NCHW)."""
        return True

    def encode_stored(self, x: Array, lo: Array | None = None, hi: Array | None = None) -> Encoded:
        """Encode a tensor as the devices store feature maps: channels last, (N, H, W, C) or (N, F).
        ``lo``/``hi``: per-channel range, for ranged codecs only."""
        if lo is not None or hi is not None:
            raise ValueError(f"codec {self.spec!r}: takes no per-channel range (only ranged codecs do)")
        return self.encode(x)

    def encode_into(self, x: Array, raw: Array) -> Encoded | None:
        """The encoding of ``x`` (stored channels last) made in ``raw`` (a byte buffer: a pool block) as
        :meth:`Encoded.store` lays it out, with nothing else allocated; None where this codec makes its
        arrays first (then ``encode_stored(x).store(raw)``)."""
        return None

    def decode_stored(self, enc: Encoded, out: Array) -> None:
        """Decode into ``out``, stored as :meth:`encode_stored` read it."""
        self.decode(enc, out)

    @property
    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


def stored_nbytes(
    codec: Codec, shape: tuple[int, ...], density: float | None = None, dtype: DTypeLike = "float32"
) -> int:
    """Bytes of a buffer that holds ``codec``'s encoding of a tensor of ``shape`` (logical NCHW) and
    ``dtype`` with :meth:`Encoded.store`: the encoded size at ``density`` plus room for alignment."""
    return codec.encoded_nbytes(tuple(shape), dtype, density) + STORE_SLACK


def array_module(x: Array) -> Xp:
    """NumPy, or CuPy for a CuPy array (never imported here: only a CUDA device makes CuPy arrays)."""
    if type(x).__module__.split(".")[0] == "cupy":
        return sys.modules["cupy"]
    return np


def is_device_array(x: object) -> bool:
    """Whether ``x`` is a GPU's array (CuPy's, or another library's with ``__cuda_array_interface__``), not a
    host one."""
    return hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray)


def address(x: Array) -> int:
    """Where ``x``'s data starts: its device pointer for a GPU array, else its host one."""
    interface = getattr(x, "__cuda_array_interface__", None) or x.__array_interface__
    return int(interface["data"][0])


def shape_of(x: Array) -> tuple[int, ...]:
    """``x``'s shape (an array's own, never through ``np.shape``, which CuPy arrays do not take)."""
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def is_half(dtype: DTypeLike) -> bool:
    """Whether ``dtype`` is a 16-bit float (float16, or ``ml_dtypes.bfloat16``): what mixed precision stores."""
    if isinstance(dtype, str) and dtype == "bfloat16":  # named before ml_dtypes is imported
        return True
    d = np.dtype(dtype)
    return d.itemsize == 2 and (d.kind == "f" or d.name == "bfloat16")


def flat(x: Array) -> Array:
    xp = array_module(x)
    x = xp.asarray(x)
    if x.dtype.kind != "f" and not is_half(x.dtype):
        raise TypeError(f"codecs take floating-point tensors, not {x.dtype}")
    return xp.ascontiguousarray(x).reshape(-1)


def kernel_dtype(dtype: DTypeLike) -> bool:
    """Whether the float32 kernels serve ``dtype``: float32, or a 16-bit float they read widened (exact)."""
    return dtype == np.float32 or is_half(dtype)


def widened(v: Array) -> Array:
    """A 16-bit float array as float32 (exact), for the float32 kernels; a float32 array as it is."""
    return v if v.dtype == np.float32 else v.astype(np.float32)


def narrowed_into(out: Array, fn: Any) -> None:
    """Run ``fn(dst)``, a float32 kernel writing ``dst``, into ``out``: directly where ``out`` is float32,
    else through a float32 copy rounded into ``out`` (exact where the values came from ``out``'s dtype)."""
    if out.dtype == np.float32:
        fn(out)
        return
    tmp = array_module(out).empty(out.shape, np.float32)
    fn(tmp)
    out[...] = tmp


def bits_of(x: np.ndarray) -> np.ndarray:
    """The raw bit patterns of a float array (so that -0.0 and NaN count as nonzero)."""
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def output(enc: Encoded, out: Array) -> Array:
    if out is None:
        return np.empty(enc.shape, enc.dtype)
    if tuple(out.shape) != tuple(enc.shape) or out.dtype != enc.dtype:
        raise ValueError(f"decode: out is {out.shape} {out.dtype}, the tensor is {enc.shape} {enc.dtype}")
    return out
