"""A failed checkpoint load changes nothing: every entry is checked before anything is replaced, and the
error names the file and the entry."""

from __future__ import annotations

import json

import numpy as np
import pytest

import vmem
from vmem import nn
from vmem.errors import CheckpointError


def net():
    return vmem.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 8 * 8, 10),
        input_shape=(3, 8, 8),
        name="tiny",
    )


def state(trainer):
    trainer.sync()
    return (
        {k: v.copy() for k, v in trainer.net.params.items()},
        trainer.session.device_params().optimizer_state(),
        trainer.steps_done,
        json.dumps(trainer.rng.bit_generator.state),
    )


def same(a, b):
    return (
        all(np.array_equal(a[0][k], b[0][k]) for k in a[0])
        and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
        and a[2:] == b[2:]
    )


@pytest.fixture
def trained(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.Trainer(net(), policy="baseline", memory="32MiB", seed=0) as trainer:
        trainer.step(x, y)
        good = tmp_path / "good.npz"
        trainer.save(good)
        trainer.step(x, y)  # the trainer moves on: a wrong load would show
        yield trainer, good


def rewrite(good, path, change):
    with np.load(good, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    meta = json.loads(str(data["meta"]))
    change(data, meta)
    data["meta"] = np.array(json.dumps(meta))
    np.savez(path, **data)
    return path


def drop_steps(data, meta):
    del meta["steps"]


def text_steps(data, meta):
    meta["steps"] = "seven"


def int_optimizer_state(data, meta):
    key = next(k for k in data if k.startswith("opt/"))
    data[key] = data[key].astype(np.int32)


def nan_weight(data, meta):
    key = next(k for k in data if k.startswith("param/"))
    data[key] = data[key].copy()
    data[key].flat[0] = np.nan


@pytest.mark.parametrize(
    "change,entry",
    [(drop_steps, "steps"), (text_steps, "steps"), (int_optimizer_state, "opt/"), (nan_weight, "param/")],
    ids=["no-steps", "text-steps", "int-optimizer-state", "nan-weight"],
)
def test_a_bad_entry_is_refused_and_nothing_changes(trained, tmp_path, change, entry):
    trainer, good = trained
    before = state(trainer)
    bad = rewrite(good, tmp_path / "bad.npz", change)
    with pytest.raises(CheckpointError) as info:
        trainer.load(bad)
    assert "bad.npz" in str(info.value) and entry in str(info.value)
    assert same(before, state(trainer))
    trainer.load(good)  # and a good one still loads
    assert trainer.steps_done == 1


def test_an_npy_file_is_not_a_checkpoint(trained, tmp_path):
    trainer, _ = trained
    before = state(trainer)
    path = tmp_path / "array.npy"
    np.save(path, np.zeros(3))
    with pytest.raises(CheckpointError, match="array.npy"):
        trainer.load(path)
    assert same(before, state(trainer))
