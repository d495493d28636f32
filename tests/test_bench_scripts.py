"""Every benchmark script starts as ``python bench/NAME.py`` from the checkout (no name of the bench folder
shadows a standard-library module, and no script edits ``sys.path``) and has ``--help``."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_no_bench_script_shadows_the_standard_library():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    shadows = [
        p.name
        for p in BENCH.glob("*.py")
        if (stdlib / p.name).exists() or (stdlib / p.stem).is_dir() or p.stem in sys.builtin_module_names
    ]
    assert not shadows


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_script_has_help_and_leaves_the_path_alone(script):
    assert "sys.path[" not in script.read_text() and "sys.path.insert" not in script.read_text()
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def _vmem_imports(path: Path) -> list[tuple[str, str]]:
    import ast

    return [
        (node.module, alias.name)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vmem"
        for alias in node.names
    ]


def test_every_name_a_bench_script_imports_from_vmem_exists():
    """Imports inside functions that run only on a GPU are checked here, where no GPU runs them."""
    import importlib

    missing = [
        f"{p.name}: from {module} import {name}"
        for p in sorted(BENCH.glob("*.py"))
        for module, name in _vmem_imports(p)
        if not hasattr(importlib.import_module(module), name) and importlib.util.find_spec(f"{module}.{name}") is None
    ]
    assert not missing


def test_results_md_is_what_the_benches_json_gives():
    """bench/RESULTS.md is written from bench/results/*.json by bench/results.py, never by hand."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "results.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_every_result_names_its_machine_date_and_command():
    import json

    for path in sorted((BENCH / "results").glob("*.json")):
        result = json.loads(path.read_text())
        assert (
            (result.get("verdicts") is not None or result.get("targets"))
            and result.get("date")
            and result.get("command")
        ), path.name
        assert result.get("machine") or result.get("gpu"), path.name
