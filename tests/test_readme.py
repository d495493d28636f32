"""The README's examples work as written: its Python example runs (in a fresh process, in a folder of its
own) and trains to a sensible accuracy; every `vmem` command in its shell blocks parses and runs (a training
command for one epoch: its options otherwise as written); every option its command synopsis names exists."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vmem.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language`` ("" for those without one), in order."""
    blocks, current, lang = [], None, None
    for line in README.splitlines():
        if line.startswith("```"):
            if current is None:
                current, lang = [], line[3:].strip()
            else:
                if lang == language:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _commands() -> list[str]:
    lines = [line.split("#")[0].strip() for block in _blocks("bash") for line in block.splitlines()]
    return [line for line in lines if line.startswith("vmem ")]


@pytest.mark.slow
def test_the_python_example_runs_as_written_and_trains(tmp_path):
    example = _blocks("python")[0]
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.findall(r"^(\d+\.\d)%$", done.stdout, re.M)[-1])
    assert accuracy >= 85, done.stdout[-2000:]
    assert (tmp_path / "ckpt.npz").is_file()


def test_the_onnx_example_runs_as_written(tmp_path):
    """The second example: a model exported, imported, planned, trained a step and exported again, which
    onnxruntime runs with the network's outputs."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    (example,) = _blocks("python")[1:]
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.match(r"\d+ \[\('conv1\.weight', 'conv1\.weight'\)", done.stdout), done.stdout
    chosen = done.stdout.splitlines()[1]  # what auto chose: a policy spec (it printed None without policy="auto")
    import vmem.policies

    assert chosen != "None" and vmem.policies.get(chosen).spec.split(":")[0] in vmem.policies.names(), done.stdout
    import numpy as np

    import vmem

    net = vmem.onnx.load(tmp_path / "trained.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with vmem.Trainer(net) as trainer:
        mine = trainer.predict(x)
    theirs = ort.InferenceSession(str(tmp_path / "trained.onnx")).run(None, {"input": x})[0]
    np.testing.assert_allclose(theirs, mine, rtol=1e-3, atol=1e-5)


def test_the_readme_has_commands_to_run():
    assert "vmem train" in _commands() and len(_commands()) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("command", _commands())
def test_each_command_runs(command, capsys, tmp_path, monkeypatch):
    argv = shlex.split(command)[1:]
    build_parser().parse_args(argv)
    if argv[0] == "train":
        argv = argv + ["--epochs", "1"]
    if argv[0] == "bench":
        argv = argv + ["--sizes", "4MiB", "--rounds", "1", "--density", "0.1,0.9"]  # its smallest run
    monkeypatch.chdir(tmp_path)
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    assert "Traceback" not in out.err


def test_every_option_the_synopsis_names_exists():
    (synopsis,) = [b for b in _blocks("") if b.lstrip().startswith("vmem train")]
    parser = build_parser()
    commands = {a.dest: a for a in parser._subparsers._group_actions}  # noqa: SLF001 - argparse's own
    choices = next(iter(commands.values())).choices
    command = None
    for line in synopsis.splitlines():
        words = line.split("#")[0].split()
        if words[:1] == ["vmem"]:
            command = words[1]
        for option in re.findall(r"(--[a-z][a-z-]*)", " ".join(words)):
            known = {o for a in choices[command]._actions for o in a.option_strings}
            assert option in known, (command, option)
