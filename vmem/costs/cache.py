"""Profiles kept on disk, as autotuners keep their results, so that a run repeats: the same command with the
same seed chooses the same algorithms and plan, and so gives the same weights, whatever the machine's load
when it ran.

A profile is keyed by everything it depends on: the program (every op, shape, algorithm and workspace),
the device (kind, name, capacity, link rate, architecture), the machine (processor model, cores,
architecture) and the versions of vmem and NumPy. It lives in ``$VMEM_CACHE_DIR/profiles`` (default
``$XDG_CACHE_HOME/vmem``, else ``~/.cache/vmem``) as one JSON file per key. Set ``VMEM_PROFILE_CACHE=0``
to measure afresh every time (nothing is read or written); delete the folder to forget what was measured.

A kept file is untrusted input (another user's, a damaged disk's, a planted one's):

- it is read only if it is a regular file (no link followed, no FIFO or device opened for long) of at most
  :data:`MAX_BYTES`, and used only if it holds the schema (:func:`parse`): finite, non-negative times,
  positive bandwidths (``null`` marks an algorithm not offered), printable notes of bounded length. Anything else is measured afresh, with a
  one-line warning, and the bad file replaced;
- folders are created 0700 and files written 0600 through a temporary made with ``O_EXCL | O_NOFOLLOW``;
- the first complete profile kept under a key wins: a process that measured at the same time as another
  (two first runs started together) keeps none of its own and uses the one kept, so that every run of
  the same command plans alike and trains to the same weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import secrets
import stat
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..graph import Program
from .measured import Profiled
from ..units import printable
from .model import host_costs

if TYPE_CHECKING:
    from ..device.base import Device

__all__ = ["folder", "key", "load", "store", "enabled", "parse", "CacheWarning"]

#: The largest kept profile read (a profile of the largest zoo network takes well under 1 MiB).
MAX_BYTES = 16 << 20
#: The longest note kept, in characters, and the most notes.
MAX_NOTE = 500
MAX_NOTES = 100


class CacheWarning(UserWarning):
    """A kept profile was not used (unreadable, or not a profile): it is measured afresh."""


def enabled() -> bool:
    return os.environ.get("VMEM_PROFILE_CACHE", "1").strip().lower() not in ("0", "no", "off", "false")


def folder() -> Path:
    """Where profiles are kept (see the module docstring)."""
    from .._files import cache_root

    return cache_root() / "profiles"


def _processor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: what a kept profile measures; a new number leaves the profiles kept before unread (2: ops at their
#: typical time, not their fastest; whether offloads through a codec can save time; 3: the host's part of
#: a step kept with it)
FORMAT = 3


def key(program: Program, device: Device, copy_gbps: float | None, repeats: int, seed: int) -> str:
    """A hex digest of everything a profile of ``program`` on ``device`` depends on."""
    from .. import __version__

    ops = [
        (
            op.name,
            op.kind,
            [list(s) for s in op.in_shapes],
            list(op.out_shape),
            list(op.in_dtypes),
            op.out_dtype,
            op.algorithms,
            op.workspace,
        )
        for op in program.ops
    ]
    what = {
        "program": [program.network, program.batch, dataclasses.asdict(program.precision), ops],
        # the spec (name, capacity, link, architecture) and the repr (options such as poison, the GPU's name)
        "device": [device.spec.to_dict(), repr(device)],
        "copy_gbps": copy_gbps,
        "repeats": repeats,
        "seed": seed,
        "machine": [platform.machine(), _processor(), os.cpu_count()],
        "versions": [__version__, np.__version__],
        "format": FORMAT,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


#: The longest time a kept profile may give one op, copy or update (far beyond any measurement; sums of
#: such figures stay finite).
MAX_SECONDS = 1e6
#: The range of bandwidths (GB/s) a kept profile may give.
GBPS = (1e-6, 1e6)


def _finite(value: Any, what: str, positive: bool = False, most: float = MAX_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what}: {type(value).__name__}, not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0) or number > most:
        raise ValueError(
            f"{what}: {number!r}, not a {'positive' if positive else 'non-negative'} number up to {most:g}"
        )
    return number


def _gbps(value: Any, what: str) -> float:
    number = _finite(value, what, positive=True, most=GBPS[1])
    if number < GBPS[0]:
        raise ValueError(f"{what}: {number!r} GB/s, below {GBPS[0]:g}")
    return number


def _text(value: Any, what: str, limit: int = MAX_NOTE) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{what}: not a string of at most {limit} characters")
    return value


def parse(data: Any) -> Profiled:
    """The profile ``data`` holds (a kept file's JSON), checked against the schema; ValueError naming the
    first field that breaks it. Notes come back printable (see :func:`vmem.units.printable`)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    for name in ("times", "d2h_gbps", "h2d_gbps", "update", "elementwise_gbps", "copies"):
        if name not in data:
            raise ValueError(f"no {name!r}")
    if not isinstance(data["times"], list) or not isinstance(data["copies"], list):
        raise ValueError("times and copies: not lists")
    times: dict[tuple[str, str, str | None], float] = {}
    for i, row in enumerate(data["times"]):
        if not isinstance(row, list) or len(row) != 4:
            raise ValueError(f"times[{i}]: not [op, pass, algorithm, seconds]")
        op, pass_, algo, seconds = row
        key_ = (_text(op, f"times[{i}] op", 200), _text(pass_, f"times[{i}] pass", 50))
        if algo is not None:
            _text(algo, f"times[{i}] algorithm", 100)
        # null: an algorithm the profile found unusable (not offered), as infinitely slow
        times[key_ + (algo,)] = math.inf if seconds is None else _finite(seconds, f"times[{i}] seconds")
    usable: dict[tuple[str, str], bool] = {}
    for (op, pass_, _), seconds in times.items():
        usable[(op, pass_)] = usable.get((op, pass_), False) or seconds != math.inf
    unusable = [f"{op} {pass_}" for (op, pass_), ok in usable.items() if not ok]
    if unusable:
        raise ValueError(f"times: no usable algorithm for {unusable[0]}")
    copies: dict[int, float] = {}
    for i, row in enumerate(data["copies"]):
        if not isinstance(row, list) or len(row) != 2 or isinstance(row[0], bool) or not isinstance(row[0], int):
            raise ValueError(f"copies[{i}]: not [bytes, seconds]")
        if not 0 < row[0] <= 1 << 60:
            raise ValueError(f"copies[{i}]: {row[0]} bytes")
        copies[row[0]] = _finite(row[1], f"copies[{i}] seconds")
    notes = data.get("notes", [])
    if not isinstance(notes, list) or len(notes) > MAX_NOTES:
        raise ValueError(f"notes: not a list of at most {MAX_NOTES}")
    dispatch = data.get("dispatch", [0.0, 0.0, 0.0])
    if not isinstance(dispatch, list) or len(dispatch) not in (2, 3):
        raise ValueError("dispatch: not a list of 2 or 3 figures")
    codec_offload = data.get("codec_offload", False)
    if not isinstance(codec_offload, bool):
        raise ValueError("codec_offload: not true or false")
    busy = data.get("busy_elsewhere")  # absent in profiles kept before it was measured
    busy = None if busy is None else _finite(busy, "busy_elsewhere", most=4096.0)
    return Profiled(
        times,
        _gbps(data["d2h_gbps"], "d2h_gbps"),
        _gbps(data["h2d_gbps"], "h2d_gbps"),
        _finite(data["update"], "update"),
        _gbps(data["elementwise_gbps"], "elementwise_gbps"),
        copies,
        [printable(_text(n, f"notes[{i}]")) for i, n in enumerate(notes)],
        tuple(_finite(v, f"dispatch[{i}]", most=1.0) for i, v in enumerate(dispatch)),
        codec_offload,
        busy,
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a figure a profile holds")


def _read(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file of at most MAX_BYTES (None where there is none);
    OSError or ValueError where something else is there. Never follows a link or waits on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if path.is_symlink():
            raise ValueError("a symbolic link, not a file") from None
        raise exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_BYTES:
            raise ValueError(f"{info.st_size} bytes, more than a profile's {MAX_BYTES}")
        chunks, left = [], MAX_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > MAX_BYTES:
            raise ValueError(f"more than a profile's {MAX_BYTES} bytes")
        return data
    finally:
        os.close(fd)


def _warn(path: Path, why: str) -> None:
    warnings.warn(
        f"the kept profile {printable(str(path))} is not used ({printable(why)}); measuring afresh",
        CacheWarning,
        stacklevel=4,
    )


def load(digest: str, warn: bool = True) -> Profiled | None:
    """The profile kept under ``digest``, or None (none kept, the cache off, or a file that is not a
    profile: then a :class:`CacheWarning` says why, unless ``warn`` is False)."""
    if not enabled():
        return None
    path = folder() / f"{digest}.json"
    try:
        data = _read(path)
        if data is None:
            return None
        return parse(json.loads(data.decode("utf-8"), parse_constant=_no_constant))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        if warn:
            _warn(path, str(exc) or type(exc).__name__)
        return None


def _make_folder(path: Path) -> None:
    """``path`` and its missing parents, created 0700 (profiles describe this machine)."""
    if not path.is_dir():
        if not path.parent.is_dir():
            _make_folder(path.parent)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path} is not a folder")


#: Why the last profile measured was not kept (None: it was, or none was measured): what a command says
_last_unkept: list[str | None] = [None]


def not_kept() -> str | None:
    """Why the profile measured last was not kept in the cache (None where it was)."""
    return _last_unkept[0]


def store(digest: str, profiled: Profiled) -> Profiled:
    """Keep ``profiled`` under ``digest`` unless a good profile is kept there already (then that one is
    returned: the first complete writer wins). A cache that cannot be written is skipped, and
    :func:`not_kept` says why."""
    if not enabled():
        return profiled
    path = folder() / f"{digest}.json"
    _last_unkept[0] = None
    try:
        _make_folder(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(profiled.to_dict(), f)
            try:
                os.link(tmp, path)  # atomic, and only where there is none: the first writer wins
            except FileExistsError:
                kept = load(digest, warn=False)
                if kept is not None:
                    return kept
                if path.is_symlink() or path.is_file():  # a bad or planted file: replaced, not written through
                    os.replace(tmp, path)
                else:
                    _last_unkept[0] = f"{path} is not a regular file"
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        where = printable(str(exc.filename or path))
        _last_unkept[0] = f"{exc.strerror}: {where}" if exc.strerror else printable(str(exc))
    return profiled


def profile(
    program: Program,
    *,
    device: Device,
    copy_gbps: float | None = None,
    repeats: int = 3,
    seed: int = 0,
    cache: bool = True,
    host_overheads: Callable[[], tuple[float, float, float]] | None = None,
) -> tuple[Profiled, bool]:
    """:func:`vmem.costs.profile`, kept: (the profile, whether it came from the cache). With ``cache``
    False (or ``VMEM_PROFILE_CACHE=0``) it measures and keeps nothing. ``host_overheads``: a function
    measuring the host's part of a step (``Profiled.dispatch``), called after a fresh profile and kept with
    it (a kept profile keeps its own, so that the run repeats). Where another process kept a profile
    under the same key while this one measured, that one is used (and the second says it came from the
    cache)."""
    from .measured import profile as measure

    def measured() -> Profiled:
        made = measure(program, copy_gbps=copy_gbps, repeats=repeats, seed=seed, device=device)
        if host_overheads is not None:
            made.dispatch = host_costs(host_overheads())
        return made

    if not cache or not enabled():
        return measured(), False
    digest = key(program, device, copy_gbps, repeats, seed)
    kept = load(digest)
    if kept is not None:
        return kept, True
    made = measured()
    used = store(digest, made)
    return used, used is not made
