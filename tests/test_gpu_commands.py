"""The GPU run's commands (tests/gpu/README.md) fit their limits: each command's stages, with what a dry run
of it takes besides the GPU work, inside the 10 minutes one command may take: the check inside 7
minutes, and the four longer commands inside 30 with the machine's start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What one command on the GPU machine may take, less a margin for copying the tree and the logs.
COMMAND_S = 600 - 30
#: What the GPU check may take (7 minutes), its sections' kill grace (10 s each of three) included.
CHECK_S = 7 * 60
#: What a whole run of the longer stages may take (30 minutes: a lease longer than the check's), less a
#: machine's start.
RUN_S = 30 * 60 - 120


def _children_cpu() -> float:
    """CPU seconds of the finished child processes (and theirs) so far."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _commands() -> list[list[str]]:
    text = (ROOT / "tests" / "gpu" / "README.md").read_text()
    return [line.split()[2:] for line in text.splitlines() if line.strip().startswith("bash tests/gpu/run.sh")]


def _limits() -> dict[str, int]:
    text = (ROOT / "tests" / "gpu" / "run.sh").read_text()
    table = re.search(r"declare -A LIMIT=\((.*?)\)\n", text, re.S)
    assert table, "run.sh declares no LIMIT table"
    return {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", table.group(1))}


def test_the_documented_commands_cover_every_stage_once():
    stages = [s for command in _commands() for s in command]
    assert _commands()[0] == ["check"] and len(_commands()) == 5
    assert sorted(stages) == sorted(_limits())


@pytest.mark.parametrize("command", _commands(), ids=lambda c: "+".join(c))
def test_each_command_fits_its_limit_in_a_dry_run(command, tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "VMEM_GPU_DRY_RUN": "1", "PYTHON": sys.executable}
    t0, used = time.perf_counter(), _children_cpu()
    done = subprocess.run(
        ["bash", "tests/gpu/run.sh", *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_S
    )
    # what the stages take besides the GPU work on a machine doing nothing else (the GPU machine): their wall
    # time, or their CPU time where this machine is busy (the suite's other workers) and the wall time longer
    overhead = min(time.perf_counter() - t0, _children_cpu() - used)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (tmp_path / "stages.log").read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == command
    assert all(": exit 0 in" in line for line in lines), lines
    limits = _limits()
    if command == ["check"]:  # its sections: 3 of them, each killed at most 10 s after its share
        assert limits["check"] + 3 * 10 + overhead <= CHECK_S, overhead
        check = json.loads((tmp_path / "check.json").read_text())
        assert [s["section"] for s in check["sections"]] == ["preflight", "smoke", "bench"]
        assert check["dry_run"] and all(s["exit"] == 0 for s in check["sections"])
        assert sum(s["limit"] for s in check["sections"]) == limits["check"]
        bench = json.loads((tmp_path / "check-bench.json").read_text())  # every section's path ran
        assert {"pytorch amp_bf16", "vmem bf16", "vmem exact", "vmem largest batches fp32"} <= set(bench["errors"])
        assert "half_memory" in bench["skipped"]  # no bf16 baseline to halve without a GPU
    assert sum(limits[s] for s in command) + overhead <= COMMAND_S, (command, overhead)


def test_the_whole_run_fits_30_minutes():
    limits = _limits()
    assert sum(limits[s] for command in _commands()[1:] for s in command) <= RUN_S - 4 * 30
