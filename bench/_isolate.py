"""bench/gpu.py's runs in processes of their own: each under a time limit, its output echoed as it comes,
a stalled one stopped after every thread's stack is printed, its result sent back as one marked JSON line
(a fresh CUDA context each: vmem's arena never sits beside PyTorch's cache)."""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

_T0 = time.perf_counter()


def say(message: str) -> None:
    """Progress, with the seconds since the start (a run cut short still says where it was)."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {message}", flush=True)


# -- runs in a process of their own -------------------------------------------------------------------
_RESULT = "@@result "


class ChildFailed(RuntimeError):
    """A run in its own process failed, or stalled and was stopped."""


def isolated(script: str, task: str, timeout: float, **kwargs) -> dict:
    """Run ``task`` (a key of the ``script``'s tasks, given to :func:`child_main` there) with ``kwargs`` in a
    new process and return its result. Its output is echoed, indented, as it comes. Past ``timeout`` seconds
    it is stopped (after printing every thread's stack, 10 s before) and :class:`ChildFailed` says it
    stalled."""
    dump = max(timeout - 10, 1)
    cmd = [
        sys.executable,
        str(Path(script).resolve()),
        "--child",
        task,
        "--child-args",
        json.dumps(kwargs),
        "--stall-dump",
        str(dump),
    ]
    say(f"{task} {kwargs} (in its own process, at most {timeout:.0f} s)")
    # its own process group: stopping it stops whatever it started, and frees the pipe read below
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
    )
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        _kill(proc)

    timer = threading.Timer(timeout, stop)
    timer.start()
    result = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(_RESULT):
                result = json.loads(line[len(_RESULT) :])
            else:
                print("    | " + line, end="", flush=True)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:  # interrupted here: take the run down too
            _kill(proc)
            proc.wait()
    if stopped.is_set():
        raise ChildFailed(f"{task}: stalled, stopped after {timeout:.0f} s (stacks above)")
    if result is None:
        raise ChildFailed(f"{task}: exited with status {proc.returncode} and no result")
    if "error" in result:
        raise ChildFailed(f"{task}: {result['error']}")
    return result


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def child_main(tasks: dict, task: str, kwargs: dict, stall_dump: float) -> int:
    """The child's side of :func:`isolated`: run the task, print its result as one marked JSON line."""
    logging.basicConfig(format="    profile: %(message)s")
    logging.getLogger("vmem.profile").setLevel(logging.INFO)
    if stall_dump > 0:
        faulthandler.dump_traceback_later(stall_dump, repeat=True)
    try:
        result = tasks[task](**kwargs)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which goes on
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(_RESULT + json.dumps(result, default=str), flush=True)
    return 0
