"""A save loses nothing: only regular files are written (a link's target, never the link), a failed or
refused save leaves the last good checkpoint byte for byte, temporaries never outlive their save (a killed
save's are swept), files get the umask's permissions, two runs cannot save to one path, and a run that is
sent SIGTERM saves and exits with 143."""

from __future__ import annotations

import errno
import io
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

import vmem
from vmem.cli import main
from vmem.errors import CheckpointError
from vmem.training import Checkpoint, checkpoint

from .test_checkpoints import net


@pytest.fixture
def trainer():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 3, 8, 8)).astype(np.float32), rng.integers(0, 10, 8)
    with vmem.Trainer(net(), policy="baseline", memory="32MiB", seed=0) as t:
        t.step(x, y)
        t.batch = (x, y)
        yield t


def _temporaries(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".vmem-tmp"))


def test_a_save_through_a_link_writes_its_target_and_keeps_the_link(trainer, tmp_path):
    real = tmp_path / "runs" / "ckpt.npz"
    real.parent.mkdir()
    link = tmp_path / "latest.npz"
    link.symlink_to(real)
    trainer.save(link)
    assert link.is_symlink() and os.readlink(link) == str(real) and real.is_file()
    trainer.load(link)


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_path_that_is_not_a_regular_file_is_refused_and_left_as_it_was(trainer, tmp_path, kind):
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        check = stat.S_ISFIFO
    elif kind == "device":
        path, check = os.devnull, stat.S_ISCHR
    else:
        path, check = tmp_path, stat.S_ISDIR
    with pytest.raises(CheckpointError, match=f"is a {kind if kind != 'fifo' else 'FIFO'}"):
        trainer.save(path)
    assert check(os.stat(path).st_mode)
    assert not _temporaries(tmp_path)


def test_the_command_refuses_a_fifo_before_training(capsys, tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    t0 = time.perf_counter()
    code = main(["train", "--model", "digits_cnn", "--epochs", "1", "--save", str(path)])
    err = capsys.readouterr().err
    assert code == 1 and "is a FIFO" in err and err.count("\n") == 1
    assert stat.S_ISFIFO(os.stat(path).st_mode) and time.perf_counter() - t0 < 5  # no training


def test_diverged_weights_are_not_saved_and_the_last_good_checkpoint_stays(trainer, tmp_path):
    path = tmp_path / "ckpt.npz"
    trainer.save(path)
    good = path.read_bytes()
    trainer.optimizer.lr = float("inf")
    trainer.step(*trainer.batch)
    trainer.step(*trainer.batch)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        trainer.save(path)
    assert path.read_bytes() == good and not _temporaries(tmp_path)


def test_a_full_disk_is_one_line_and_the_old_file_stays(trainer, tmp_path, monkeypatch):
    path = tmp_path / "ckpt.npz"
    trainer.save(path)
    good = path.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", full)
    with pytest.raises(CheckpointError) as info:
        trainer.save(path)
    assert "No space left on device" in str(info.value) and "\n" not in str(info.value)
    assert path.read_bytes() == good and not _temporaries(tmp_path)


def test_a_killed_saves_temporary_is_swept_by_the_next_save(trainer, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f".ckpt.npz.{gone.pid}.0badcafe.vmem-tmp"
    orphan.write_bytes(b"half a checkpoint")
    other = tmp_path / f".other.npz.{gone.pid}.0badcafe.vmem-tmp"  # another file's: not ours to remove
    other.write_bytes(b"x")
    trainer.save(tmp_path / "ckpt.npz")
    assert not orphan.exists() and other.exists()


def test_a_checkpoint_gets_the_umasks_permissions(trainer, tmp_path):
    old = os.umask(0o022)
    try:
        trainer.save(tmp_path / "ckpt.npz")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "ckpt.npz").st_mode) == 0o644


def test_two_runs_cannot_save_to_one_path(tmp_path):
    path = tmp_path / "ckpt.npz"
    with checkpoint.SaveLock(path):
        code = (
            "import sys; from vmem.training.checkpoint import SaveLock; from vmem.errors import CheckpointError\n"
            "try:\n    SaveLock(sys.argv[1])\nexcept CheckpointError as e:\n    print(e)"
        )
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True).stdout
        assert f"another run (process {os.getpid()})" in out
    with checkpoint.SaveLock(path):  # released: the next run may save there
        pass
    assert not list(tmp_path.iterdir())


def test_a_failed_save_at_the_end_of_an_epoch_lets_training_go_on(trainer, tmp_path, monkeypatch, capsys):
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise CheckpointError(
                "ckpt.npz: could not save (No space left on device); the last checkpoint there is unchanged"
            )

    monkeypatch.setattr(checkpoint, "write", failing)
    train, _ = vmem.data.synthetic(n=20, input_shape=(3, 8, 8), seed=0)
    saver = Checkpoint(tmp_path / "ckpt.npz")
    trainer.fit(train, epochs=1, batch_size=8, progress=False, callbacks=[saver])
    assert saver.failed and "No space left" in capsys.readouterr().err
    trainer.fit(train, epochs=1, batch_size=8, progress=False, callbacks=[saver])
    assert saver.failed is None and len(calls) == 2


def test_sigterm_saves_and_exits_143(tmp_path):
    path = tmp_path / "ckpt.npz"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vmem",
            "train",
            "--model",
            "digits_cnn",
            "--epochs",
            "200",
            "--policy",
            "baseline",
            "--save",
            str(path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not path.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    model = vmem.models.get("digits_cnn")
    with vmem.Trainer(model, policy="baseline", memory="64MiB") as t:
        t.load(path)
        assert t.steps_done > 0
    assert not _temporaries(tmp_path)


def test_a_save_is_flushed_to_the_disk_with_its_folder(trainer, tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    trainer.save(tmp_path / "ckpt.npz")
    assert synced == [False, True]  # the file, then its folder (after the rename)


@pytest.mark.parametrize("kind", ["link", "dangling link", "fifo", "folder"])
def test_a_planted_save_lock_is_refused_and_nothing_it_names_is_touched(tmp_path, kind):
    """What a stranger plants at the lock's name (``.NAME.vmem-lock``) is never opened through: a link to a
    file would have been truncated, a dangling one would have made a file where it points."""
    path, victim = tmp_path / "ckpt.npz", tmp_path / "victim.txt"
    victim.write_text("precious")
    lock = tmp_path / ".ckpt.npz.vmem-lock"
    if kind == "link":
        lock.symlink_to(victim)
    elif kind == "dangling link":
        lock.symlink_to(tmp_path / "made-by-vmem")
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    with pytest.raises(CheckpointError, match=r"save lock .* (symbolic link|not a regular file|not openable)"):
        checkpoint.SaveLock(path)
    assert victim.read_text() == "precious" and not (tmp_path / "made-by-vmem").exists()


def test_a_compressed_member_that_would_grow_past_its_bound_is_refused_before_it_is_read(tmp_path):
    """A small file whose deflated member says it holds 64 MiB of zeros (a crafted "zip bomb") is refused
    from the archive's directory, before a byte is inflated (it reached 4.3 GB of memory)."""
    import zipfile

    path = tmp_path / "bomb.npz"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 24,)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("param/w.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            zeros = bytes(1 << 22)
            for _ in range(16):
                member.write(zeros)
    assert path.stat().st_size < 2 << 20
    with pytest.raises(CheckpointError, match=r"bomb.npz: .*entry 'param/w'.*more than 16x"):
        checkpoint.check(path, "net")
