"""What a command says as it works: that a long step is still running, where its profile came from, how a
signal ended it, warnings as one line of the command's."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from typing import Any

from ..planning.profiles import profile_line
from ..training.callbacks import Terminated
from ..units import printable_lines

__all__ = ["SLOW_AFTER", "Slow", "profile_line", "stopped", "warnings_as_lines"]


#: Seconds after which a command that is still working says so on stderr.
SLOW_AFTER = 2.0


class Slow:
    """Says on stderr what is running if it is still running after ``after`` seconds, and then how long it
    took (a plan of a large network can take a while: a user should not face a silent terminal)."""

    def __init__(self, what: str, after: float | None = None, quiet: bool = False):
        import threading

        after = SLOW_AFTER if after is None else after
        self.what, self.t0, self.said = what, time.perf_counter(), False
        self._timer = None if quiet else threading.Timer(after, self._say)
        if self._timer is not None:
            self._timer.name = "vmem-cli-progress"
            self._timer.daemon = True
            self._timer.start()

    def _say(self) -> None:
        self.said = True
        print(f"{self.what}...", file=sys.stderr, flush=True)

    def __enter__(self) -> "Slow":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if self.said and exc[0] is None:
            print(f"done in {time.perf_counter() - self.t0:.1f} s", file=sys.stderr, flush=True)


def stopped(exc: BaseException, args: argparse.Namespace) -> str:
    """The one line a command stopped by a signal ends with: which signal, and what was saved."""
    what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
    save = getattr(args, "save", None)
    if not save:
        return what
    if args.saved:
        return f"{what}; what was trained so far is saved in {save}"
    if os.path.isfile(save):
        return f"{what}; the last checkpoint in {save} is kept"
    return f"{what} before anything was trained; nothing saved"


@contextlib.contextmanager
def warnings_as_lines(command: str) -> Any:
    """Warnings printed while a command runs read as one line of the command's (``vmem train: warning:
    ...``), not as a source file's line and location."""
    before = warnings.formatwarning

    def line(message: Any, category: Any, filename: str, lineno: int, text: str | None = None) -> str:
        return f"vmem {command}: warning: {printable_lines(str(message))}\n"  # a path's escapes as text

    warnings.formatwarning = line  # type: ignore[assignment]  # the same call, one line
    try:
        yield
    finally:
        warnings.formatwarning = before
