"""Byte sizes: parse strings like ``"512MiB"`` and format byte counts for people."""

from __future__ import annotations

import re

__all__ = ["parse_bytes", "format_bytes", "printable", "printable_lines", "UNITS"]

#: The units :func:`parse_bytes` accepts, with their size in bytes.
UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]+)\s*$")


def parse_bytes(value: int | str, *, name: str = "memory") -> int:
    """Return a positive byte count from an int or a string such as ``"512MiB"`` or ``"12GB"``.

    Units are exactly those of :data:`UNITS` (case-sensitive: ``MB`` is 10**6 bytes, ``MiB`` 2**20);
    anything else is rejected with a ``ValueError`` naming the option ``name``.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected a byte count or a size such as '512MiB'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{name}={value!r}: a size must be positive")
        return value
    if not isinstance(value, str):
        raise ValueError(
            f"{name}={value!r}: expected a byte count or a size such as '512MiB', not {type(value).__name__}"
        )
    match = _PATTERN.match(value)
    units = ", ".join(UNITS)
    if match is None and re.fullmatch(r"\s*(-\s*[0-9.]+|0+(\.0*)?)\s*[A-Za-z]*\s*", value):
        raise ValueError(f"{name}={value!r}: a size must be positive, e.g. '512MiB' or '12GB'")
    if match is None:
        raise ValueError(f"{name}={value!r}: expected a number followed by a unit ({units}), e.g. '512MiB' or '12GB'")
    number, unit = match.groups()
    if unit not in UNITS:
        raise ValueError(f"{name}={value!r}: unknown unit {unit!r}; use one of {units}")
    nbytes = int(float(number) * UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"{name}={value!r}: a size must be positive")
    return nbytes


def format_bytes(nbytes: int | float) -> str:
    """Format a byte count with binary units: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    value = float(nbytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            return f"{sign}{value:.0f} B" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def printable_lines(text: str) -> str:
    """:func:`printable` line by line: the line breaks a message means kept, every other control character
    escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))


def printable(text: str) -> str:
    """``text`` with every character that is not printable (terminal escapes, control characters)
    written as Python would escape it, so that what a file says never drives the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
