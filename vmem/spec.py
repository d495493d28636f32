"""Spec strings: ``"name:key=value,key=value"``, the one syntax policies, codecs and the command line share.

Neutral ground: policies and codecs both parse their specs here, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

__all__ = ["parse_spec", "parse_value", "format_spec", "with_options"]


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


def format_spec(name: str, options: dict[str, Any]) -> str:
    """The inverse of :func:`parse_spec`: ``("vdnn-all", {"algos": "memory"})`` -> ``"vdnn-all:algos=memory"``
    (booleans as ``true``/``false``)."""

    def text(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    rest = ",".join(f"{k}={text(v)}" for k, v in options.items())
    return f"{name}:{rest}" if rest else name


def with_options(spec: str, **options: Any) -> str:
    """``spec`` with ``options`` set (replaced where the spec has them, else added at the end):
    ``with_options("vdnn-all:sync=layer", sync="event")`` -> ``"vdnn-all:sync=event"``."""
    name, current = parse_spec(spec)
    return format_spec(name, {**current, **options})
