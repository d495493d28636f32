"""Shared output for the benchmarks: a plain table, a verdict per target, optional JSON."""

from __future__ import annotations

import json
import platform
import sys
from typing import Any, Sequence


#: Where the JSON goes. Run as ``python bench/NAME.py --json``, a bench prints its human-readable report
#: on stderr, so that stdout carries the JSON object alone (``... --json > result.json``).
_JSON_OUT = sys.stdout
if "--json" in sys.argv[1:]:
    sys.stdout = sys.stderr


def machine() -> dict[str, Any]:
    import os

    import numpy as np

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def verdict(name: str, value: float, target: float, *, at_least: bool = True, unit: str = "") -> dict[str, Any]:
    ok = value >= target if at_least else value <= target
    sign = ">=" if at_least else "<="
    print(f"target {name}: {value:,.3f}{unit} (want {sign} {target:g}{unit}) -> {'MET' if ok else 'MISSED'}")
    return {"name": name, "value": value, "target": target, "at_least": at_least, "met": ok}


def emit(result: dict[str, Any], as_json: bool) -> int:
    """Print ``result`` as JSON on stdout (``as_json``), with the machine, the date (UTC) and the command that
    made it (bench/results.py builds bench/RESULTS.md from these)."""
    import datetime
    from pathlib import Path

    result["machine"] = {**machine(), **result.get("machine", {})}
    result["date"] = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    args = [a for a in sys.argv[1:] if a != "--json"]
    result["command"] = " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *args])
    if as_json:
        json.dump(result, _JSON_OUT, indent=2)
        print(file=_JSON_OUT)
        _JSON_OUT.flush()
    return 0
