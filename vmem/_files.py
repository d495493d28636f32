"""Writing vmem's own output files (traces, plots, layer tables) safely: never through a symbolic link, never into
a FIFO, a device or a folder, and a file that is replaced is replaced whole (written beside it, then renamed
over it: a reader sees the old file or the new one, never half of one).

Checkpoints keep their own rules (:func:`vmem.training.checkpoint.target`: a link the user made to a checkpoint
is followed to the regular file it names), and so does the profile cache (:mod:`vmem.costs.cache`)."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["cache_root", "checked_output", "kind_of", "read_regular", "write_output"]


def cache_root() -> Path:
    """Where vmem keeps what it can make again (profiles, compiled kernels): ``$VMEM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vmem``, else ``~/.cache/vmem``."""
    base = os.environ.get("VMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vmem"
    )
    return Path(base)


def read_regular(path: str | os.PathLike, limit: int) -> bytes | None:
    """The bytes of ``path`` where it is a regular file of at most ``limit`` bytes (opened without following
    a link, never blocking on a FIFO); None otherwise (missing, a link, anything else, too long)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit + 1)[:limit]
    except OSError:
        return None
    finally:
        os.close(fd)


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, by its ``st_mode``, for a message ("a FIFO")."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def checked_output(path: str | os.PathLike, what: str) -> Path:
    """``path`` if vmem may write ``what`` there: nothing at it, or a regular file (replaced whole); a
    ValueError naming the path otherwise (a symbolic link, a FIFO, a device, a folder, a folder that does not
    exist or is not writable)."""
    p = Path(path)
    try:
        info = os.lstat(p)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise ValueError(f"{p}: is a symbolic link; vmem writes {what} only as a regular file (remove the link)")
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{p}: is {kind_of(info.st_mode)}; vmem writes {what} only as a regular file")
    folder = p.parent
    if not folder.is_dir():
        raise ValueError(f"{p}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{p}: the folder {folder} is not writable")
    return p


def write_output(path: str | os.PathLike, write: Callable[[IO[Any]], object], what: str, binary: bool = False) -> Path:
    """Write ``what`` to ``path`` through ``write(file)``: into a new file beside it (created exclusively, so
    nothing planted there is written through), then renamed over ``path`` (checked first:
    :func:`checked_output`). A failure leaves ``path`` as it was and no temporary behind."""
    p = checked_output(path, what)
    tmp = p.parent / f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.vmem-tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        checked_output(p, what)  # nothing planted at the name while it was written
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p
