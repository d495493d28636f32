"""Checkpoints: weights, optimizer state, step count and random state in one .npz, written atomically and
read back with every check made before anything changes."""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CheckpointError

__all__ = ["write", "read", "Checkpoint", "FORMAT", "VERSION"]

FORMAT = "vmem-checkpoint"
VERSION = 1


@dataclass
class Checkpoint:
    """A checkpoint read and checked against a network and optimizer: nothing has been applied yet."""

    params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    steps: int
    rng: np.random.Generator


def write(path: str | os.PathLike, params: dict[str, np.ndarray], optimizer_state: dict[str, np.ndarray],
          meta: dict[str, Any]) -> None:
    """Write an .npz next to ``path``, then move it into place (a crash leaves the old file whole)."""
    arrays = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"opt/{k}": v for k, v in optimizer_state.items()})
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, "version": VERSION, **meta}))
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise CheckpointError(f"{path}: not a vmem checkpoint (a single array, not an .npz archive)")
    try:
        with archive as f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({type(exc).__name__}: {exc})") from exc
    try:
        meta = json.loads(str(data.pop("meta")))
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a vmem checkpoint (no readable metadata)") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a vmem checkpoint of version {VERSION}")
    return data, meta


def _check_arrays(path: str | os.PathLike, kind: str, arrays: dict[str, np.ndarray]) -> None:
    """Every array floating point and finite (a NaN or an infinity would train on silently)."""
    for key, a in arrays.items():
        if a.dtype.kind != "f":
            raise CheckpointError(f"{path}: entry '{kind}/{key}' has dtype {a.dtype}, expected floating point")
        if not np.isfinite(a).all():
            raise CheckpointError(f"{path}: entry '{kind}/{key}' holds NaN or infinite values")


def _steps(path: str | os.PathLike, meta: dict[str, Any]) -> int:
    steps = meta.get("steps")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise CheckpointError(f"{path}: entry 'meta.steps' is {steps!r}, expected the number of steps done")
    return steps


def read(path: str | os.PathLike, network: str, optimizer: Any, specs: dict[str, Any]) -> Checkpoint:
    """Read ``path`` and check every entry against the network's name and parameter ``specs`` and the
    optimizer: keys, shapes, dtypes, finiteness, the step count, the random state. Raises CheckpointError
    naming the file and the entry; the parameters' names and shapes are checked again by the network."""
    data, meta = _load(path)
    if meta.get("network") != network:
        raise CheckpointError(f"{path}: the checkpoint is of network {meta.get('network')!r}, not {network!r}")
    opt = meta.get("optimizer", {})
    if opt.get("type") != type(optimizer).__name__:
        raise CheckpointError(f"{path}: the checkpoint's optimizer is {opt.get('type')!r}, "
                              f"this trainer's is {type(optimizer).__name__!r}")
    params = {k[len("param/"):]: v for k, v in data.items() if k.startswith("param/")}
    opt_state = {k[len("opt/"):]: v for k, v in data.items() if k.startswith("opt/")}
    expected_opt = {f"{k}:{slot}": s.shape for k, s in specs.items() if s.trainable for slot in optimizer.slots}
    if set(opt_state) != set(expected_opt):
        raise CheckpointError(f"{path}: optimizer state does not match ({len(opt_state)} arrays, "
                              f"expected {len(expected_opt)})")
    for key, shape in expected_opt.items():
        if opt_state[key].shape != tuple(shape):
            raise CheckpointError(f"{path}: optimizer state {key} has shape {opt_state[key].shape}, "
                                  f"expected {tuple(shape)}")
    _check_arrays(path, "param", params)
    _check_arrays(path, "opt", opt_state)
    steps = _steps(path, meta)
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = meta["rng"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: entry 'meta.rng' (the random state) is unreadable") from exc
    return Checkpoint(params, opt_state, steps, rng)
