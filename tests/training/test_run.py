"""A run as a value: ``vmem.training.run(RunConfig(...))`` is ``vmem train`` (the same checkpoint bytes), its
``RunResult`` what ``vmem train --json`` prints, its config checked once and recorded in the checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vmem.cli import main
from vmem.training import RunConfig, RunResult, run
from vmem.training import checkpoint

ARGS = ["--epochs", "1", "--policy", "baseline", "--batch", "64", "--schedule", "constant"]


def test_run_writes_the_checkpoint_vmem_train_writes_and_its_result_is_the_json(tmp_path, capsys):
    assert main(["train", *ARGS, "--save", str(tmp_path / "cli.npz"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    config = RunConfig(epochs=1, policy="baseline", batch=64, schedule="constant", save=str(tmp_path / "api.npz"))
    result = run(config)
    assert (tmp_path / "api.npz").read_bytes() == (tmp_path / "cli.npz").read_bytes()
    assert isinstance(result, RunResult) and set(printed) == set(result.to_dict())
    for key in ("model", "policy", "batch", "epochs", "val_accuracy", "train_loss", "peak_bytes"):
        assert printed[key] == result.to_dict()[key], key
    assert {**printed["config"], "save": None} == {**result.config, "save": None}
    assert result.config == {**config.to_dict(), "optimizer": "sgd", "lr": 0.05}  # the model's defaults filled
    meta = checkpoint.check(tmp_path / "api.npz", "digits_vgg")
    kept = meta["settings"]["run"]
    assert kept["policy"] == "baseline" and "save" not in kept and RunConfig.from_dict(kept).batch == 64


def test_a_run_config_is_checked_when_made_and_round_trips():
    config = RunConfig(model="vgg_cifar", dataset="synthetic", memory="auto:0.4", precision="bf16")
    assert RunConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for bad, match in [
        (dict(dataset="imagenet"), "dataset='imagenet'"),
        (dict(batch=0), "batch=0 must be a positive int"),
        (dict(precision="fp8"), "precision='fp8'"),
        (dict(model=None), "give a zoo model"),
        (dict(lr=-1.0), "lr=-1.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            RunConfig(**bad)
    with pytest.raises(ValueError, match="no option 'epoch'"):
        RunConfig.from_dict({"epoch": 3})


def test_the_lines_of_a_result_are_vmem_trains_text(tmp_path, capsys):
    result = run(RunConfig(epochs=1, policy="baseline", batch=64, memory="auto:0.9"), progress=lambda line: None)
    assert main(["train", *ARGS, "--memory", "auto:0.9"]) == 0
    out = capsys.readouterr().out
    lines = result.lines()
    assert lines[0].startswith("done in ") and f"val accuracy {result.val_accuracy:.2%}" in out
    assert any(line.startswith("used ") for line in lines) and result.baseline_peak_bytes is not None
    assert np.isfinite(result.train_loss)
