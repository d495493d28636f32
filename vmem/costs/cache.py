"""Profiles kept on disk, as autotuners keep their results, so that a run repeats: the same command with the
same seed chooses the same algorithms and plan, and so gives the same weights, whatever the machine's load
when it ran.

A profile is keyed by everything it depends on: the program (every op, shape, algorithm and workspace),
the device (kind, name, capacity, link rate, architecture), the machine (processor model, cores,
architecture) and the versions of vmem and NumPy. It lives in ``$VMEM_CACHE_DIR/profiles`` (default
``$XDG_CACHE_HOME/vmem``, else ``~/.cache/vmem``) as one JSON file per key, written atomically. Set
``VMEM_PROFILE_CACHE=0`` to measure afresh every time (nothing is read or written); delete the folder to
forget what was measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from ..graph import Program
from .measured import Profiled

__all__ = ["folder", "key", "load", "store", "enabled"]


def enabled() -> bool:
    return os.environ.get("VMEM_PROFILE_CACHE", "1").strip().lower() not in ("0", "no", "off", "false")


def folder() -> Path:
    """Where profiles are kept (see the module docstring)."""
    base = os.environ.get("VMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vmem"
    )
    return Path(base) / "profiles"


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
#: typical time, not their fastest; whether offloads through a codec can save time)
FORMAT = 2


def key(program: Program, device: Any, copy_gbps: float | None, repeats: int, seed: int) -> str:
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
        "device": None if device is None else [device.spec.to_dict(), repr(device)],
        "copy_gbps": copy_gbps,
        "repeats": repeats,
        "seed": seed,
        "machine": [platform.machine(), _processor(), os.cpu_count()],
        "versions": [__version__, np.__version__],
        "format": FORMAT,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:32]


def load(digest: str) -> Profiled | None:
    """The profile kept under ``digest``, or None (none kept, unreadable, or the cache is off)."""
    if not enabled():
        return None
    path = folder() / f"{digest}.json"
    try:
        return Profiled.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(digest: str, profiled: Profiled) -> None:
    """Keep ``profiled`` under ``digest`` (atomically; a cache that cannot be written is skipped)."""
    if not enabled():
        return
    path = folder() / f"{digest}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(profiled.to_dict()))
        os.replace(tmp, path)
    except OSError:
        pass


def profile(
    program: Program,
    *,
    device: Any = None,
    copy_gbps: float | None = None,
    repeats: int = 3,
    seed: int = 0,
    cache: bool = True,
) -> tuple[Profiled, bool]:
    """:func:`vmem.costs.profile`, kept: (the profile, whether it came from the cache). With ``cache``
    False (or ``VMEM_PROFILE_CACHE=0``) it measures and keeps nothing."""
    from .measured import profile as measure

    if not cache:
        return measure(program, copy_gbps=copy_gbps, repeats=repeats, seed=seed, device=device), False
    digest = key(program, device, copy_gbps, repeats, seed)
    kept = load(digest)
    if kept is not None:
        return kept, True
    made = measure(program, copy_gbps=copy_gbps, repeats=repeats, seed=seed, device=device)
    store(digest, made)
    return made, False
