"""Codecs for stashed feature maps: Gist's encodings, cDMA's zero-value compression, low-bit formats.

``vmem.codecs.get("zvc")`` (also ``"binarize"``, ``"ssdc"``, ``"dpr:format=fp8"``, ``"fixed:bits=4"``,
``"patch2"``, or keyword arguments: ``get("dpr", format="fp8")``) returns a codec with ``encode``,
``decode``, ``encoded_nbytes`` and ``lossless``. These are the NumPy reference implementations.
"""

from __future__ import annotations

from typing import Any

from .base import Codec, Encoded
from .floats import DPR, FORMATS, quantize
from .quant import Fixed, Patch2
from .sparse import SSDC, ZVC, Binarize

__all__ = ["get", "names", "Codec", "Encoded", "ZVC", "SSDC", "Binarize", "DPR", "Fixed", "Patch2", "FORMATS",
           "quantize"]

_CODECS: dict[str, type[Codec]] = {c.name: c for c in (ZVC, SSDC, Binarize, DPR, Fixed, Patch2)}


def names() -> list[str]:
    return sorted(_CODECS)


def get(spec: str, **options: Any) -> Codec:
    """A codec by name or spec string (``"dpr:format=fp8"``), with options as keywords."""
    from ..policies.base import parse_spec

    name, parsed = parse_spec(spec)
    parsed.update(options)
    cls = _CODECS.get(name)
    if cls is None:
        raise ValueError(f"unknown codec {name!r}; available: {', '.join(names())}")
    try:
        return cls(**parsed)
    except TypeError:
        raise ValueError(f"codec {name!r} does not take {sorted(parsed)}") from None
