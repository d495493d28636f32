"""The import graph keeps the design's boundaries (docs/architecture.md: layers know nothing of offload; policies are
pure; the executor only carries a schedule out; the pool knows nothing of networks).

Imports are read from the source (not from what happens to be loaded), followed transitively through
vmem's own modules, counting a subpackage's ``__init__`` when one of its modules is imported, as Python
does. A module's own imports count wherever they are, inside functions too; of the modules it reaches,
only what importing them runs (module-level imports). ``vmem/__init__.py`` (the public facade, which
imports everything) and imports under ``if TYPE_CHECKING:`` are not followed.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "vmem"


def _module_names() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _module_names()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
    if level == 0:
        return module
    base = current.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _with_parents(name: str) -> set[str]:
    """A module and the packages Python imports on the way to it (``vmem`` itself excluded)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1) if ".".join(parts[:i]) in MODULES}


@lru_cache(maxsize=None)
def direct_imports(name: str, deep: bool = False) -> frozenset[str]:
    """What ``name`` imports: at module level, or (``deep``) anywhere in it."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            skip.update(id(n) for child in node.body for n in ast.walk(child))
        if not deep and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, name, is_package)
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            if t.startswith("vmem.") and t in MODULES:
                found |= _with_parents(t)
    return frozenset(found - {name})


def reachable(name: str) -> set[str]:
    seen = set(direct_imports(name, deep=True))
    stack = list(seen)
    while stack:
        for m in direct_imports(stack.pop()):
            if m not in seen:
                seen.add(m)
                stack.append(m)
    return seen


def _under(prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in MODULES if any(m == p or m.startswith(p + ".") for p in prefixes))


RULES = [
    # (modules, what they must not reach, why)
    (
        ("vmem.nn",),
        (
            "vmem.policies",
            "vmem.schedule",
            "vmem.planning",
            "vmem.pool",
            "vmem.streams",
            "vmem.device",
            "vmem.runtime",
            "vmem.training",
            "vmem.costs",
            "vmem.codecs",
            "vmem.threads",
        ),
        "layers are pure math: the device runs their work (ctx.ops)",
    ),
    (
        ("vmem.policies",),
        ("vmem.pool", "vmem.streams", "vmem.runtime", "vmem.training", "vmem.schedule"),
        "policies are pure decisions: they know nothing of the lowering",
    ),
    (
        ("vmem.codecs",),
        ("vmem.policies", "vmem.schedule", "vmem.runtime", "vmem.training"),
        "codecs know nothing of policies",
    ),
    (
        ("vmem.pool", "vmem.streams"),
        (
            "vmem.nn",
            "vmem.graph",
            "vmem.models",
            "vmem.policies",
            "vmem.schedule",
            "vmem.runtime",
            "vmem.training",
            "vmem.codecs",
        ),
        "the pool and streams know nothing of networks",
    ),
    (
        ("vmem.runtime",),
        ("vmem.policies", "vmem.planning", "vmem.training"),
        "the executor only carries a schedule out",
    ),
    (
        ("vmem.schedule.steps", "vmem.schedule.pack", "vmem.schedule.replay"),
        ("vmem.policies",),
        "schedules are read without the policies",
    ),
    (("vmem.device.spec",), ("vmem.pool", "vmem.streams"), "DeviceSpec is plain data"),
    (
        ("vmem.graph",),
        ("vmem.device", "vmem.pool", "vmem.streams", "vmem.runtime"),
        "the program is device-neutral: a device's catalog gives its convolutions their algorithms",
    ),
]


@pytest.mark.parametrize("modules,forbidden,why", RULES, ids=[r[2] for r in RULES])
def test_import_boundaries(modules, forbidden, why):
    assert _under(modules), f"no modules under {modules}"
    bad = {}
    for m in _under(modules):
        hits = sorted(r for r in reachable(m) if any(r == f or r.startswith(f + ".") for f in forbidden))
        if hits:
            bad[m] = hits
    assert not bad, f"{why}: {bad}"


def test_the_graph_is_read_correctly():
    """The reader follows relative imports and package __init__s (a check that the check works)."""
    assert "vmem.pool" in reachable("vmem.device.cpu")
    assert "vmem.schedule" in direct_imports("vmem.runtime.executor")  # from ..schedule import Key
    assert "vmem.schedule.lower" not in reachable("vmem.runtime.executor")
    assert "vmem.policies.plan" not in reachable("vmem.schedule.lower")  # only under TYPE_CHECKING


def test_importing_vmem_imports_no_gpu_library():
    import subprocess
    import sys

    code = "import sys, vmem; vmem.plan(vmem.models.get('digits_cnn'), 4); print(sorted(m for m in ('cupy', 'pynvml', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nothing_outside_vmem_device_probes_a_device():
    """The Device protocol is complete: no hasattr/getattr on a device, no test of its kind or of its array
    module (``xp is np``) outside vmem/device (a device says what it can do: asynchronous, runs_codec,
    release_cached, and runs the layers' array work: ops)."""
    import re

    probe = re.compile(
        r"(hasattr|getattr)\((self\.)?(device|dev|_device)\b|\b(device|dev)\.kind\s*[=!]=|"
        r"\b(device|dev)\.xp\s+is\b|\bxp\s+is\s+(not\s+)?np\b"
    )
    root = ROOT
    found = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for path in root.rglob("*.py")
        if "device" not in path.relative_to(root).parts[:1]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_import_graph_has_no_cycle():
    """No two modules import each other, at module level or inside a function (a package's __init__ and
    its own modules aside): a cycle means two modules are one."""

    def ancestors(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    graph = {
        m: {t for t in direct_imports(m, deep=True) if t != m and t not in ancestors(m) and not t.startswith(m + ".")}
        for m in MODULES
    }
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in sorted(graph.get(m, ())):
            if seen.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t] if t in path else [m, t])
            elif t not in seen:
                visit(t, path + [t])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "module, forbidden",
    [
        ("vmem.training", ("vmem.schedule", "vmem.distributed.mpi", "vmem.distributed.nccl")),
        ("vmem.engine", ("vmem.schedule",)),
        ("vmem.cli", ("vmem.schedule", "vmem.runtime", "vmem.pool", "vmem.streams")),
    ],
)
def test_the_upper_floors_reach_the_middle_only_through_the_library(module, forbidden):
    """The training loop (its rank logic lives in vmem.distributed.data_parallel) and the engine under it (the
    Session, which plans through vmem.planning) import nothing of the lowering; the CLI's commands translate
    arguments into library calls: none imports the middle itself (what they import may)."""
    names = [m for m in MODULES if m == module or m.startswith(module + ".")]
    own = {m: sorted(d for d in direct_imports(m, deep=True) if any(d.startswith(f) for f in forbidden)) for m in names}
    assert not {m: d for m, d in own.items() if d}


#: What the CLI's translators may import of vmem: the floors a user meets and the leaf modules every floor uses
CLI_MAY_IMPORT = (
    "vmem.cli",
    "vmem.training",
    "vmem.planning",
    "vmem.distributed",
    "vmem.models",
    "vmem.device",
    "vmem.data",
    "vmem.errors",
    "vmem.units",
    "vmem._files",  # the safe writes of its outputs
    "vmem.threads",
    "vmem.optim",
    "vmem.onnx",  # a model from a file (--onnx)
    "vmem.codecs",  # the encodings by name (--codec)
    "vmem.benchmarks",  # vmem bench's library
    "vmem.selfcheck",  # vmem check's
)


def test_the_cli_imports_only_the_floors_a_user_meets():
    """Each command parses, calls one library function and prints: it imports the training loop, planning,
    the process groups, the zoo, devices and data (and the leaf modules), never the policies, the costs or
    the middle directly."""
    names = [m for m in MODULES if m == "vmem.cli" or m.startswith("vmem.cli.")]
    bad = {
        m: sorted(
            d for d in direct_imports(m, deep=True) if not any(d == a or d.startswith(a + ".") for a in CLI_MAY_IMPORT)
        )
        for m in names
    }
    assert not {m: d for m, d in bad.items() if d}


#: files longer than 500 lines, each because one job needs it (its docstring says why)
LONG_FILES = {"vmem/runtime/executor.py"}


def test_files_stay_short_and_the_trainer_is_only_the_loop():
    """No file in vmem is over 500 lines but those one job needs; the Trainer class is at most 350."""
    import re

    long = {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py") if len(p.read_text().splitlines()) > 500}
    assert long <= LONG_FILES, sorted(long - LONG_FILES)
    text = (ROOT / "training" / "trainer.py").read_text().splitlines()
    start = next(i for i, line in enumerate(text) if line.startswith("class Trainer"))
    end = next((i for i in range(start + 1, len(text)) if re.match(r"^(class|def) ", text[i])), len(text))
    assert end - start <= 350
