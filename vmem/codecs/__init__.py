"""Codecs for stashed feature maps: Gist's encodings, cDMA's zero-value compression, low-bit formats.

``vmem.codecs.get("zvc")`` (also ``"binarize"``, ``"ssdc"``, ``"dpr:format=fp8"``, ``"fixed:bits=4"``,
``"patch2"``, or keyword arguments: ``get("dpr", format="fp8")``; short names ``"fp16"``, ``"fp10"``,
``"fp8"``, ``"fixed8"``, ``"fixed4"`` fit inside a policy's spec string) returns a codec with ``encode``,
``decode``, ``encoded_nbytes`` and ``lossless``. Float32 tensors run the CPU build of the kernels in
vmem/csrc/ where it is installed; every codec also has its NumPy reference (``reference=True``).
"""

from __future__ import annotations

from typing import Any, TYPE_CHECKING

from ..spec import parse_spec
from .base import STORE_SLACK, Codec, Encoded, stored_nbytes
from .floats import DPR, FORMATS, quantize
from .quant import Fixed, Patch2
from .sparse import SSDC, ZVC, Binarize

if TYPE_CHECKING:
    from .._typing import Array

__all__ = [
    "get",
    "names",
    "register",
    "ALIASES",
    "stored_nbytes",
    "STORE_SLACK",
    "encode_channels_last",
    "decode_channels_last",
    "Codec",
    "Encoded",
    "ZVC",
    "SSDC",
    "Binarize",
    "DPR",
    "Fixed",
    "Patch2",
    "FORMATS",
    "quantize",
]

_CODECS: dict[str, type[Codec]] = {c.name: c for c in (ZVC, SSDC, Binarize, DPR, Fixed, Patch2)}
ALIASES = {
    "fp16": "dpr:format=fp16",
    "fp10": "dpr:format=fp10",
    "fp8": "dpr:format=fp8",
    "fixed8": "fixed:bits=8",
    "fixed4": "fixed:bits=4",
}


def encode_channels_last(codec: Codec, x: Array, lo: Array | None = None, hi: Array | None = None) -> Encoded:
    """Encode a tensor stored channels last (see :meth:`Codec.encode_stored`)."""
    return codec.encode_stored(x, lo, hi)


def decode_channels_last(codec: Codec, enc: Encoded, out: Array) -> None:
    """Decode into ``out``, stored channels last (see :meth:`Codec.decode_stored`)."""
    codec.decode_stored(enc, out)


def names() -> list[str]:
    """Every codec name ``get`` accepts (short names aside: :data:`ALIASES`)."""
    return sorted(_CODECS)


def register(cls: type[Codec]) -> type[Codec]:
    """Add a codec class (a :class:`Codec` subclass with a unique ``name``; usable as a decorator), as
    ``vmem.policies.register`` adds a policy: then ``codec=NAME`` in a policy's spec takes it."""
    if not (isinstance(cls, type) and issubclass(cls, Codec)):
        raise ValueError(f"register: {cls!r} is not a Codec subclass")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name or ":" in name or name in ALIASES:
        raise ValueError(f"register: codec {cls.__name__} needs a name of its own, not {name!r}")
    if name in _CODECS and _CODECS[name] is not cls:
        raise ValueError(f"codec {name!r} is already registered")
    _CODECS[name] = cls
    return cls


def get(spec: "str | Codec", **options: Any) -> Codec:
    """A codec by name, short name (``"fp8"``) or spec string (``"dpr:format=fp8"``), with options as
    keywords. A Codec passes through."""
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"codec={spec!r}: expected a codec name ({', '.join(names())}) or short name ({', '.join(ALIASES)})"
        )
    name, parsed = parse_spec(ALIASES.get(spec.strip(), spec), "codec")
    parsed.update(options)
    cls = _CODECS.get(name)
    if cls is None:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(names())} (short names: {', '.join(ALIASES)})")
    try:
        return cls(**parsed)
    except TypeError:
        raise ValueError(f"codec {name!r} does not take {sorted(parsed)}") from None
