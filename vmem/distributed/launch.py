"""``vmem train --nproc N``: the same command on N ranks under MPICH's ``mpiexec`` (the ``mpi`` extra's
wheel), and what a launcher owes its ranks when it is stopped.

- Each rank's core budget is its share of the machine's cores (``VMEM_THREADS``).
- ``mpiexec`` runs in a session of its own, so that a terminal's Ctrl-C reaches the ranks once, through the
  launcher: a first SIGINT or SIGTERM is forwarded to ``mpiexec`` (which hands it to every rank: they stop
  after the same step and rank 0 saves), a second kills the job's whole process group at once.
- The shared-memory files MPICH maps in ``/dev/shm`` are noted by each rank as it joins
  (:func:`note_shared_memory`) and removed by the launcher once the job has ended, however it ended.
- A rank that fails is reported in one line (MPICH's banner is left out).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Sequence

__all__ = ["launch", "note_shared_memory", "SHM_LIST"]

#: The environment variable naming the file where ranks note the shared-memory files they map.
SHM_LIST = "VMEM_SHM_LIST"
_SHM = "/dev/shm/"

#: Lines of MPICH's launcher (hydra): its failure banner and its notes on forwarded signals, replaced by
#: vmem's own lines.
_HYDRA = re.compile(
    r"^(=+|=\s.*|YOUR APPLICATION TERMINATED.*|This typically refers to a problem.*|Please see the FAQ.*"
    r"|\[mpiexec@[^\]]*\] (Sending Ctrl-C|Press Ctrl-C).*|Abort\(\d+\) on node \d+ .*MPI_Abort.*)$"
)


def note_shared_memory() -> None:
    """On a rank started by :func:`launch`: append the ``/dev/shm`` files this process maps to the
    launcher's list (one path a line), for the launcher to remove if the job ends abnormally."""
    listing = os.environ.get(SHM_LIST)
    if not listing:
        return
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
        mine = sorted(p for p in paths if p.startswith(_SHM) and not p.endswith("(deleted)"))
        if mine:
            with open(listing, "a") as out:  # short appends of whole lines: one write each
                out.write("".join(f"{p}\n" for p in mine))
    except OSError:
        pass


def _remove_shared_memory(listing: str) -> list[str]:
    """Remove the regular files under ``/dev/shm`` the ranks noted in ``listing`` that are still there."""
    removed: list[str] = []
    try:
        with open(listing) as f:
            paths = {line.strip() for line in f}
    except OSError:
        return removed
    for path in sorted(paths):
        real = os.path.realpath(path)
        if not real.startswith(_SHM) or os.path.dirname(real) != _SHM.rstrip("/"):
            continue  # only files directly in /dev/shm, whatever a rank wrote
        try:
            if os.path.isfile(real) and not os.path.islink(path):
                os.unlink(real)
                removed.append(real)
        except OSError:
            pass
    return removed


def _mpiexec() -> str:
    here = os.path.dirname(sys.executable)
    found = shutil.which("mpiexec", path=here) or shutil.which("mpiexec")
    if found is None:
        raise ImportError("--nproc needs an MPI runtime (mpiexec) and mpi4py: pip install 'vmem[mpi]'")
    return found


def launch(argv: Sequence[str], nproc: int, threads: int, command: str = "vmem train") -> int:
    """Run ``python -m vmem *argv`` on ``nproc`` ranks, each with ``threads`` cores; relay their lines; the
    job's exit status (130 or 143 where a signal stopped it, 1 where a rank failed)."""
    mpiexec = _mpiexec()
    with tempfile.TemporaryDirectory(prefix="vmem-launch-") as private:  # 0700: the ranks' notes
        listing = os.path.join(private, "shm")
        env = dict(os.environ, VMEM_THREADS=str(threads), PYTHONUNBUFFERED="1", **{SHM_LIST: listing})
        cmd = [mpiexec, "-n", str(nproc), sys.executable, "-m", "vmem", *argv]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        failed: list[str] = []
        signalled: list[int] = []

        def relay(source: Any, sink: Any) -> None:  # the ranks' lines as they come, the launcher's banner left out
            for line in source:
                code = re.search(r"EXIT CODE:\s*(\d+)", line)
                if code:
                    n = int(code.group(1))
                    name = signal.Signals(n).name if n in (2, 6, 9, 11, 15) else None  # a signal that ended it
                    failed.append(f"exit status {n}" + (f": {name}?" if name else ""))
                if not _HYDRA.match(line.rstrip("\n")):
                    try:
                        sink.write(line)
                        sink.flush()
                    except (OSError, ValueError):
                        pass

        def forward(signum: int, frame: Any) -> None:
            signalled.append(signum)
            if len(signalled) == 1:  # the ranks stop after the same step; rank 0 saves and says so
                _signal(proc, signum)
            else:  # again: at once, every process of the job
                _kill_group(proc)

        relays = [
            threading.Thread(target=relay, args=(proc.stdout, sys.stdout), daemon=True),
            threading.Thread(target=relay, args=(proc.stderr, sys.stderr), daemon=True),
        ]
        for t in relays:
            t.start()
        main = threading.current_thread() is threading.main_thread()
        before = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            rc = proc.wait()
            for t in relays:
                t.join()
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)
            if proc.poll() is None:  # the launcher itself was stopped some other way: the job goes with it
                _kill_group(proc)
                proc.wait()
            _kill_group(proc)  # nothing of the job outlives it (a proxy left behind)
            _remove_shared_memory(listing)
    if signalled:
        return 143 if signalled[0] == signal.SIGTERM else 130
    if rc in (130, 143) and not failed:  # a rank was signalled on its own: the ranks stopped together
        return rc
    if rc != 0:
        print(
            f"{command}: a rank of {nproc} ended ({failed[0] if failed else f'exit status {rc}'}); mpiexec "
            "stopped the others",
            file=sys.stderr,
        )
        return 1
    return 0


def _signal(proc: subprocess.Popen, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except OSError:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass
