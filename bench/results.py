"""Write bench/RESULTS.md from the benches' JSON in bench/results/: one current row per target.

Each bench writes its JSON with ``--json`` (``python bench/pool.py --json > bench/results/pool.json``); the GPU
run's stages write theirs under ``$OUT`` (``tests/gpu/run.sh``), copied here as ``gpu-*.json``. Each JSON
carries its verdicts, the machine, the date and the command that made it. History lives in git: a rerun
replaces its file and this table.

    python bench/results.py            # rewrite bench/RESULTS.md
    python bench/results.py --check    # exit 1 if bench/RESULTS.md is not what the JSON gives
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = HERE / "RESULTS.md"

HEADER = """# Benchmark results

One row per target, each from the latest JSON a bench wrote into `bench/results/` (see `bench/results.py`):
the figure, what the target wants, the machine it ran on, the date and the command that reproduces it.
Ratios are measured within one run. Written by `python bench/results.py`; do not edit by hand.
"""


def _machine(result: dict) -> str:
    gpus = result.get("gpu") or []
    if gpus:
        return str(gpus[0].get("gpu", "GPU"))
    m = result.get("machine", {})
    return f"{m.get('machine', '?')}, {m.get('cpus', '?')} CPUs, NumPy {m.get('numpy', '?')}"


def _figure(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.3f}"


def _verdicts(result: dict) -> list[dict]:
    """A result's verdicts: ``targets`` in the CPU benches' JSON, ``verdicts`` in bench/gpu.py's."""
    return list(result.get("verdicts") or result.get("targets") or [])


def render(results_dir: Path = RESULTS) -> str:
    """The Markdown table of every verdict in ``results_dir``'s JSON files, in file then verdict order."""
    rows, errors = [], []
    for path in sorted(results_dir.glob("*.json")):
        result = json.loads(path.read_text())
        verdicts = _verdicts(result) if isinstance(result, dict) else []
        if not verdicts:  # a record without targets (the GPU preflight's items, say)
            continue
        machine, date, command = _machine(result), result.get("date", "?"), result.get("command", "?")
        for v in verdicts:
            want = (">= " if v["at_least"] else "<= ") + f"{v['target']:g}"
            name = v["name"].replace("|", "\\|")  # a pipe in a name would end its cell
            rows.append(
                f"| {name} | {_figure(v['value'])} | {want} | {'met' if v['met'] else 'missed'} | "
                f"{machine} | {date} | `{command}` |"
            )
        for what, message in (result.get("errors") or {}).items():
            errors.append(f"- `{path.name}`, {what}: {message}")
    lines = [
        HEADER,
        "| target | figure | want | verdict | machine | date | command |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    if errors:
        lines += ["", "Errors the runs recorded:", "", *errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if bench/RESULTS.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.exists() else ""
        if current != text:
            print("bench/RESULTS.md is out of date: run python bench/results.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(HERE.parent)}: {text.count(chr(10)) - HEADER.count(chr(10)) - 3} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
