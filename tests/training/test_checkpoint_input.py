"""A checkpoint is untrusted input, and the same state writes the same bytes: headers are checked before
anything is allocated, messages are vmem's (no numpy or pickle advice), links that loop are refused, and a
resumed run names every setting that differs from the checkpoint's."""

from __future__ import annotations

import io
import json
import os
import time
import zipfile

import numpy as np
import pytest

import vmem
from vmem.cli import main
from vmem.errors import CheckpointError
from vmem.training import checkpoint


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of one epoch of `vmem train --model digits_cnn` (as the command line writes it)."""
    path = tmp_path_factory.mktemp("ckpt") / "one.npz"
    assert main(["train", "--model", "digits_cnn", "--epochs", "1", "--save", str(path), "--json"]) == 0
    return path


def _members(path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _zip(path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _npy(a: np.ndarray, header_shape: tuple | None = None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, allow_pickle=True)
    data = buf.getvalue()
    if header_shape is not None:
        data = data.replace(repr(a.shape).encode(), repr(header_shape).encode().ljust(len(repr(a.shape))), 1)
    return data


def test_a_header_claiming_a_huge_array_is_refused_without_allocating(saved, tmp_path, capsys):
    members = _members(saved)
    name = next(n for n in members if n.startswith("param/"))
    members[name] = _npy(np.zeros(3, np.float32), header_shape=(10**9,))
    bad = tmp_path / "huge.npz"
    _zip(bad, members)
    t0 = time.monotonic()
    with vmem.Trainer(vmem.models.get("digits_cnn"), policy="baseline", memory="16MiB") as trainer:
        with pytest.raises(CheckpointError, match=r"its header says 4000000000 bytes of data, the file holds \d+\)"):
            trainer.load(bad)
    assert time.monotonic() - t0 < 10
    code = main(["train", "--model", "digits_cnn", "--resume", str(bad)])
    err = capsys.readouterr().err
    assert code == 1 and "header says" in err and "Traceback" not in err


def test_object_arrays_are_refused_in_vmems_words(saved, tmp_path):
    members = _members(saved)
    name = next(n for n in members if n.startswith("param/"))
    members[name] = _npy(np.array([{"x": 1}], dtype=object))
    bad = tmp_path / "objects.npz"
    _zip(bad, members)
    with pytest.raises(CheckpointError) as info:
        checkpoint.check(bad, "digits_cnn")
    assert "not numbers or text" in str(info.value) and "pickle" not in str(info.value).lower()


def test_the_same_state_writes_the_same_bytes(tmp_path):
    net = vmem.models.get("digits_cnn")
    with vmem.Trainer(net, policy="baseline", memory="16MiB", seed=0) as trainer:
        trainer.save(tmp_path / "a.npz")
        time.sleep(2.1)  # zip's clock ticks in 2 s: np.savez stamped the time of writing
        trainer.save(tmp_path / "b.npz")
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()


def test_a_symlink_loop_is_refused_and_left_alone(tmp_path, capsys):
    loop = tmp_path / "loop.npz"
    os.symlink(loop, loop)
    code = main(["train", "--model", "digits_cnn", "--epochs", "1", "--save", str(loop)])
    err = capsys.readouterr().err
    assert code == 1 and "leads back to itself" in err
    assert loop.is_symlink() and os.readlink(loop) == str(loop)


def _with_meta(saved, tmp_path, **changes):
    members = _members(saved)
    meta = json.loads(str(np.load(io.BytesIO(members["meta.npy"]))))
    meta.update(changes)
    members["meta.npy"] = _npy(np.array(json.dumps(meta)))
    path = tmp_path / "changed.npz"
    _zip(path, members)
    return path


def test_resume_names_every_setting_that_differs(saved, tmp_path, capsys):
    settings = dict(checkpoint.check(saved, "digits_cnn")["settings"])
    run = settings.pop("run")  # the run's whole config (vmem.training.RunConfig), beside the settings compared
    assert settings == {"seed": 0, "precision": "fp32", "policy": "auto", "lr": 0.05, "batch": 32, "math": "exact"}
    assert run["model"] == "digits_cnn" and run["batch"] == 32 and "save" not in run
    with pytest.warns(UserWarning) as told:  # the command prints it as "vmem train: warning: ..." (one line)
        code = main(
            [
                "train",
                "--model",
                "digits_cnn",
                "--epochs",
                "2",
                "--resume",
                str(saved),
                "--lr",
                "0.1",
                "--seed",
                "3",
                "--json",
            ]
        )
    assert code == 0
    (line,) = [str(w.message) for w in told if "--resume" in str(w.message)]
    assert line == f"--resume {saved} was trained with seed 0, lr 0.05; this run: seed 3, lr 0.1"


def test_a_mid_epoch_resume_with_another_batch_is_refused_unless_asked(saved, tmp_path, capsys):
    state = np.random.default_rng(0).bit_generator.state
    mid = _with_meta(saved, tmp_path, epochs_done=0, epoch_step=5, epoch_rng=state)
    code = main(["train", "--model", "digits_cnn", "--epochs", "1", "--resume", str(mid), "--batch", "16"])
    out, err = capsys.readouterr()
    assert code == 1 and "midway through an epoch at batch 32" in err and "--resume-anyway" in err
    assert "training" not in out  # refused before anything ran
    argv = ["train", "--model", "digits_cnn", "--epochs", "1", "--resume", str(mid), "--batch", "16"]
    with pytest.warns(UserWarning, match="batch 32; this run: batch 16"):
        code = main([*argv, "--resume-anyway", "--json"])
    assert code == 0


def test_resume_checks_come_before_profiling(tmp_path, capsys, monkeypatch):
    from vmem.training import Trainer

    monkeypatch.setattr(Trainer, "profile", lambda *a, **k: pytest.fail("profiled before the checks"))
    for given, why in ((tmp_path / "missing.npz", "no such file"), (tmp_path, "not a regular file")):
        assert main(["train", "--resume", str(given)]) == 1
        assert why in capsys.readouterr().err
