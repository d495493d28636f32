"""Data-parallel training over MPI (``mpiexec -n 2``, MPICH's wheel: no system package): two ranks on half
batches give weights bitwise equal to one process adding the two shards' gradients in rank order, and close to
full-batch training; a killed rank ends the run within seconds; checkpoints cross world sizes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import vmem
from tests.distributed import dp_worker
from vmem.distributed import ThreadGroup

pytest.importorskip("mpi4py")
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
if MPIEXEC is None:
    pytest.skip("no mpiexec (pip install 'vmem[mpi]')", allow_module_level=True)
#: every MPI job on one worker, one after another: each test checks that its job left no shared-memory file
pytestmark = pytest.mark.xdist_group("mpi")
ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, VMEM_THREADS="1", PYTHONPATH=str(ROOT))


def _mpi(n: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", "tests.distributed.dp_worker", *args]
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def _weights(out: Path, rank: int) -> dict[str, np.ndarray]:
    with np.load(f"{out}.rank{rank}.npz") as f:
        return dict(f)


def _threads(
    size: int, first: int = 0, last: int = dp_worker.STEPS, resume: str | None = None, bn: bool = False
) -> dict:
    """The same run as ``size`` ranks that are threads of this process (one process adding the ranks'
    gradients in rank order)."""

    def rank(group: ThreadGroup) -> dict:
        net = dp_worker.model(bn)
        with vmem.Trainer(net, group=group, sync_batch_norm=bn) as trainer:
            if resume:
                trainer.load(resume)
            dp_worker.train(trainer, group.rank, group.size, first, last)
        return net.params

    return dp_worker.on_ranks(size, rank)[0]


def _full_batch(
    first: int = 0, last: int = dp_worker.STEPS, resume: str | None = None, save: str | None = None, bn: bool = False
):
    net = dp_worker.model(bn)
    xs, ys = dp_worker.batches()
    with vmem.Trainer(net) as trainer:
        if resume:
            trainer.load(resume)
        for i in range(first, last):
            trainer.step(xs[i], ys[i])
        if save:
            trainer.save(save)
    return net.params


@pytest.mark.parametrize(
    "bn, sharded", [(False, False), (True, False), (False, True)], ids=["plain", "sync-bn", "sharded-optimizer"]
)
def test_two_ranks_equal_one_process_adding_their_shards_in_rank_order(tmp_path, bn, sharded):
    """20 steps; with batch norm synchronized over the ranks (its running statistics too); with the
    optimizer's state sharded over them (the same weights)."""
    run = _mpi(2, str(tmp_path / "w"), *(["--bn"] if bn else []), *(["--shard"] if sharded else []))
    assert run.returncode == 0, run.stderr
    rank0, rank1 = _weights(tmp_path / "w", 0), _weights(tmp_path / "w", 1)
    reference = _threads(2, bn=bn)
    full = _full_batch(bn=bn)
    assert rank0.keys() == full.keys()
    for name in rank0:
        np.testing.assert_array_equal(rank0[name], rank1[name], err_msg=name)  # every rank holds the same
        np.testing.assert_array_equal(rank0[name], reference[name], err_msg=name)  # bitwise
        np.testing.assert_allclose(rank0[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_killed_rank_ends_the_run_within_seconds(tmp_path):
    shm_before = _shm()
    start = time.monotonic()
    run = _mpi(2, str(tmp_path / "w"), "--die-at", "3", timeout=60)
    assert run.returncode != 0 and time.monotonic() - start < 10
    assert not Path(f"{tmp_path / 'w'}.rank0.npz").exists()  # rank 0 did not go on alone
    for name in _left(shm_before, wait=1.0):  # what MPICH leaves when a rank dies, under plain mpiexec
        (Path("/dev/shm") / name).unlink(missing_ok=True)  # (vmem's launcher removes it: tested below)


def _shm() -> set[str]:
    """MPICH's shared-memory files in /dev/shm that no running process maps: left behind (another test's
    process, on another worker, may be using one of its own while a test looks)."""
    files = {p.name for p in Path("/dev/shm").glob("mpich*")} if Path("/dev/shm").is_dir() else set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:  # the process ended, or is not ours to read
            continue
        files = {f for f in files if f"/dev/shm/{f}" not in text}
    return files


def _left(before: set[str], wait: float = 5.0) -> set[str]:
    """The shared-memory files left since ``before``, once the job's cleanup has had ``wait`` seconds (on a
    busy machine its processes unlink them a little after the launcher returns)."""
    end = time.monotonic() + wait
    while (left := _shm() - before) and time.monotonic() < end:
        time.sleep(0.2)
    return left


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still in the process table (zombies included)."""
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def _training_job(tmp_path: Path, save: Path) -> subprocess.Popen:
    """`vmem train --nproc 2 --save SAVE`, returned once its first epoch has ended: it is training, and a
    signal now waits for the step in flight."""
    cmd = [sys.executable, "-m", "vmem", "train", "--nproc", "2", "--dataset", "synthetic", "--epochs", "20"]
    cmd += ["--save", str(save)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if "on 2 ranks" not in first:
        proc.kill()
        raise AssertionError(first + proc.communicate()[1])
    for line in proc.stdout:
        if line.startswith("epoch 1/"):
            return proc
    proc.kill()
    raise AssertionError("the job ended before its first epoch did: " + proc.communicate()[1])


def test_sigterm_to_the_launcher_stops_every_rank_after_the_same_step(tmp_path):
    """SIGTERM to `vmem train --nproc 2` (what `timeout` and batch schedulers send): forwarded to the ranks,
    which stop after the same step; rank 0 saves and says so in one line; exit 143; no rank, proxy or
    shared-memory file is left."""
    save = tmp_path / "ckpt.npz"
    shm_before = _shm()
    proc = _training_job(tmp_path, save)
    try:
        job = [p for p, _ in _descendants(proc.pid)]
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - signalled < 10, err
    assert proc.returncode == 143 and save.is_file(), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == f"vmem train: terminated (SIGTERM); what was trained so far is saved in {save}", err
    assert sum("stopping after this step" in line for line in lines) == 1, err  # one line for the ranks
    time.sleep(0.5)
    assert not _alive(job), [(p, c) for p, c in _descendants(1) if p in job]
    assert not _left(shm_before)


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of every process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                cmd = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            out.append((child, cmd))
            todo.append(child)
    return out


def test_vmem_train_nproc_reports_a_killed_rank_in_one_line(tmp_path):
    shm_before = _shm()
    cmd = [sys.executable, "-m", "vmem", "train", "--nproc", "2", "--dataset", "synthetic", "--epochs", "20"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # rank 0 has started training: every rank is up
        assert "on 2 ranks" in first, first
        ranks = [p for p, c in _descendants(proc.pid) if c.split()[0] == sys.executable and "--nproc" not in c]
        assert len(ranks) == 2, _descendants(proc.pid)
        os.kill(ranks[-1], signal.SIGKILL)
        killed = time.monotonic()
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1 and time.monotonic() - killed < 10
    assert not _alive(ranks) and not _left(shm_before)  # nothing left behind
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["vmem train: a rank of 2 ended (exit status 9: SIGKILL?); mpiexec stopped the others"], err
    assert not any("BAD TERMINATION" in line for line in lines)  # the launcher's banner, replaced


def test_a_checkpoint_crosses_world_sizes(tmp_path):
    """Written by 2 ranks (the optimizer's state sharded between them), resumed by 1; written by 1, resumed
    by 2: both end near 20 full-batch steps."""
    half = str(tmp_path / "two.npz")
    assert _mpi(2, str(tmp_path / "a"), "--last", "10", "--save", half, "--shard").returncode == 0
    on_one = _full_batch(first=10, resume=half)
    one = str(tmp_path / "one.npz")
    _full_batch(last=10, save=one)
    run = _mpi(2, str(tmp_path / "b"), "--first", "10", "--resume", one)
    assert run.returncode == 0, run.stderr
    on_two = _weights(tmp_path / "b", 0)
    full = _full_batch()
    for name in full:
        np.testing.assert_allclose(on_one[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(on_two[name], full[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    """Ctrl-C reaching rank 1 alone: the ranks agree after the step, all stop, rank 0 writes the checkpoint
    (every rank takes part in it), and the run ends within seconds, not at a collective's timeout."""
    save = tmp_path / "ckpt.npz"
    proc = _training_job(tmp_path, save)
    try:
        ranks = [p for p, c in _descendants(proc.pid) if c.split()[0] == sys.executable and "--nproc" not in c]
        os.kill(max(ranks), signal.SIGINT)  # the later-started rank: rank 1
        signalled = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - signalled < 10, err
    assert proc.returncode == 130 and save.is_file(), err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == f"vmem train: interrupted; what was trained so far is saved in {save}", err  # rank 0 alone


def test_run_on_two_ranks_writes_the_checkpoint_vmem_train_nproc_2_writes(tmp_path):
    """``vmem.training.run`` on an MPI job's ranks (its group from ``vmem.distributed.init()``) is ``vmem train
    --nproc 2`` with the same options: the same checkpoint bytes."""
    common = ["--epochs", "1", "--policy", "baseline", "--batch", "64", "--schedule", "constant"]
    cli = [sys.executable, "-m", "vmem", "train", "--nproc", "2", *common, "--save", str(tmp_path / "cli.npz")]
    done = subprocess.run(cli, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    script = (
        "import vmem\n"
        "from vmem.training import RunConfig, run\n"
        "config = RunConfig(epochs=1, policy='baseline', batch=64, schedule='constant', nproc=2, "
        f"save={str(tmp_path / 'api.npz')!r})\n"
        "run(config, group=vmem.distributed.init())\n"
    )
    from vmem.threads import cores

    api = [MPIEXEC, "-n", "2", sys.executable, "-c", script]
    env = dict(ENV, VMEM_THREADS=str(max(1, cores() // 2)))  # each rank's cores, as the launcher gives them
    done = subprocess.run(api, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "api.npz").read_bytes() == (tmp_path / "cli.npz").read_bytes()
