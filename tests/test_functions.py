"""Functions one can read: none in ``vmem/`` longer than :data:`MOST` lines (its docstring and decorators
included), but the named exemptions, each with its reason. The list only shrinks: an exemption that no
longer needs to be one fails too, so that it is taken off."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOST = 100
#: (file, function) -> why it is longer: fewer than five, and none added without a reason
EXEMPT = {
    ("vmem/runtime/executor.py", "_run"): "one step's course: a CUDA graph replayed, captured or the schedule "
    "walked, the clock, the roll-back on failure and the report; its graph part to move to runtime.graphs",
}


def _lengths() -> dict[tuple[str, str], int]:
    out = {}
    for path in sorted((ROOT / "vmem").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                out[(rel, node.name)] = max(out.get((rel, node.name), 0), node.end_lineno - start + 1)
    return out


def test_no_function_is_longer_than_the_limit_but_the_named_exemptions():
    lengths = _lengths()
    long = {key: n for key, n in lengths.items() if n > MOST}
    assert set(long) <= set(EXEMPT), {key: n for key, n in long.items() if key not in EXEMPT}
    assert len(EXEMPT) < 5
    assert set(EXEMPT) <= set(long), f"no longer long, take off the list: {set(EXEMPT) - set(long)}"
