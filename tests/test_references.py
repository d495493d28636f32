"""Nothing in the repository refers to a file it does not contain: every path of the repository's own
folders, and every Markdown file, that the code, the tests, the benchmarks and the docs name exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: a file inside one of the repository's own folders, or a Markdown file named on its own (an upstream
#: project's file is named with its project: "CuPy (tests/...)" is not ours)
PATH = re.compile(
    r"(?<![\w/.(-])((?:vmem|tests|bench|docs|\.ci)/[\w/.-]*\.(?:py|md|sh|h|cuh|c|json|toml|txt)"
    r"|[\w-]+\.md)\b"
)


def _files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in out if f.endswith((".py", ".md", ".sh", ".toml", ".h", ".cuh", ".c", ".cfg", "run"))]


def test_every_file_the_repository_names_exists():
    missing = []
    names = {f.name for f in _files()}  # a Markdown file named on its own may sit in any folder
    for path in _files():
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref in PATH.findall(line):
                ref = ref.rstrip(".")
                target = ROOT / ref
                if "*" in ref or "NAME" in ref:  # a pattern, a placeholder
                    continue
                if not (
                    target.exists()
                    or (ROOT / ref.split("/", 1)[-1]).exists()
                    or (path.parent / ref).exists()
                    or ("/" not in ref and ref in names)
                ):
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {ref}")
    assert not missing, "\n".join(missing)
