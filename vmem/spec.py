"""Spec strings: ``"name:key=value,key=value"``, the one syntax policies, codecs and the command line share.

Neutral ground: policies and codecs both parse their specs here, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

__all__ = ["parse_spec", "parse_value"]


def parse_value(text: str) -> Any:
    """``"true"``/``"false"`` (also yes/no, on/off) become booleans, numbers become int or float, the rest
    stays a string."""
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str, what: str = "policy") -> tuple[str, dict[str, Any]]:
    """``"vdnn-all:algos=memory,codec=zvc"`` -> ``("vdnn-all", {"algos": "memory", "codec": "zvc"})``.

    ``what`` names the option in error messages (``policy=``, ``codec=``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"{what}={spec!r}: expected a {what} name such as 'baseline', optionally with ':key=value,...'"
        )
    name, _, rest = spec.strip().partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"{what}={spec!r}: option {item!r} must be key=value")
        options[key.strip()] = parse_value(value.strip())
    return name.strip(), options
