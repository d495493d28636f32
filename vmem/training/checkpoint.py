"""Checkpoints: weights, optimizer state, step count and random state in one .npz, written atomically and
read back with every check made before anything changes."""

from __future__ import annotations

import glob
import json
import os
import secrets
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, TYPE_CHECKING

import numpy as np

from .._files import kind_of
from ..errors import CheckpointError

if TYPE_CHECKING:
    from ..optim import Optimizer

__all__ = ["write", "read", "check", "target", "SaveLock", "SavedState", "FORMAT", "VERSION"]

FORMAT = "vmem-checkpoint"
VERSION = 1


@dataclass
class SavedState:
    """A checkpoint read and checked against a network and optimizer: nothing has been applied yet."""

    params: dict[str, np.ndarray]
    optimizer_state: dict[str, np.ndarray]
    steps: int
    rng: np.random.Generator
    #: where in the run it was written: epochs finished, batches done in the next, and the generator's
    #: state at that epoch's start (None at an epoch's end); absent from older checkpoints: 0, 0, None
    epochs_done: int = 0
    epoch_step: int = 0
    epoch_rng: dict | None = None
    #: the training precision it was written at ("fp32" in older checkpoints) and, for fp16, the loss
    #: scaler's state (:meth:`vmem.optim.GradScaler.state_dict`)
    precision: str = "fp32"
    scaler: dict | None = None


def target(
    path: str | os.PathLike, what: str = "a checkpoint", example: str = "ckpt.npz", error: type = CheckpointError
) -> Path:
    """Where a save to ``path`` writes: the file a symbolic link points to (a link is followed, never
    replaced). ``error`` (CheckpointError) if that exists and is not a regular file (a folder, a FIFO, a
    device, a socket: nothing but a regular file is ever overwritten), or if its folder does not exist or is
    not writable. Checked before training starts, and again at each save. ``what`` and ``example`` name
    the file in the message."""
    given = Path(path)
    real = Path(os.path.realpath(given))  # follows links, also dangling ones (then the link's target is made)
    if real.is_symlink():  # realpath stops at a link it cannot resolve: a loop
        raise error(f"{given}: is a symbolic link that leads back to itself; {what} is written only to a regular file")
    shown = str(given) + (f" (a link to {real})" if given.is_symlink() else "")
    if real.exists():
        mode = os.stat(real).st_mode
        if not stat.S_ISREG(mode):
            raise error(
                f"{shown}: is {kind_of(mode)}; {what} is written only to a regular file "
                f"(e.g. {given / example if stat.S_ISDIR(mode) else example})"
            )
    if not real.parent.is_dir():
        raise error(f"{shown}: the folder {real.parent} does not exist")
    if not os.access(real.parent, os.W_OK):
        raise error(f"{shown}: the folder {real.parent} is not writable")
    return real


#: Temporaries are ``.<name>.<pid>.<random>.vmem-tmp`` next to the file they become.
_TMP = ".vmem-tmp"


def _sweep(real: Path) -> None:
    """Remove temporaries of saves to ``real`` whose process is gone (a save killed midway)."""
    for tmp in real.parent.glob(f".{glob.escape(real.name)}.*{_TMP}"):
        try:
            pid = int(tmp.name[len(real.name) + 2 :].split(".")[0])
        except ValueError:
            continue
        if pid == os.getpid() or not _alive(pid):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform or file system without folder handles
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(
    path: str | os.PathLike, params: dict[str, np.ndarray], optimizer_state: dict[str, np.ndarray], meta: dict[str, Any]
) -> None:
    """Write a checkpoint to ``path`` so that nothing is lost whatever happens.

    Refused before anything is written (CheckpointError): a path that is not a regular file (see
    :func:`target`), and weights or optimizer state that hold NaN or infinite values (the last good
    checkpoint stays). The .npz is written to a temporary of its own next to the target (with the umask's
    permissions), flushed to the disk, moved over the target in one step, and the folder synced; a failure
    (a full disk) removes the temporary, leaves the old file as it was and raises CheckpointError in one
    line. Temporaries that a killed save left are swept at the next save."""
    real = target(path)
    for kind, arrays in (("param", params), ("opt", optimizer_state)):
        for key, a in arrays.items():
            if not np.isfinite(a).all():
                raise CheckpointError(
                    f"{path}: not saved: '{kind}/{key}' holds NaN or infinite values (training "
                    "diverged); the last checkpoint there is unchanged"
                )
    arrays = {f"param/{k}": v for k, v in params.items()}
    arrays.update({f"opt/{k}": v for k, v in optimizer_state.items()})
    arrays["meta"] = np.array(json.dumps({"format": FORMAT, "version": VERSION, **meta}, sort_keys=True))
    replace(real, path, lambda f: _savez(f, arrays))


#: The time stamp of every member of a checkpoint's archive (zip's earliest), so that the same state always
#: gives the same bytes (``np.savez`` stamps the time of writing).
_EPOCH = (1980, 1, 1, 0, 0, 0)
#: The longest .npy header read (numpy's own default limit).
_MAX_HEADER = 10000


def _savez(f: BinaryIO, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` as an .npz (one .npy member each, stored uncompressed, in the given order) whose bytes
    depend on the arrays alone."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, a in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(a), allow_pickle=False)


#: The most a compressed member may grow as it is read (float arrays compress far less; a "zip bomb" more)
_MAX_RATIO = 16


def _check_member(info: zipfile.ZipInfo, name: str, archive_bytes: int) -> None:
    """A member's sizes bounded before it is read (they come from the archive's own directory, which a
    crafted file sets at will): stored as vmem writes them, or deflated to no more than :data:`_MAX_RATIO`
    times its compressed bytes, which the file must hold."""
    if info.compress_size > archive_bytes:
        raise ValueError(
            f"entry {name!r}: its directory claims {info.compress_size} bytes, the file has {archive_bytes}"
        )
    if info.compress_type == zipfile.ZIP_STORED:
        if info.file_size != info.compress_size:
            raise ValueError(f"entry {name!r}: stored, yet {info.file_size} bytes from {info.compress_size}")
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        if info.file_size > _MAX_RATIO * info.compress_size + (1 << 20):
            raise ValueError(
                f"entry {name!r}: {info.compress_size:,} compressed bytes said to hold {info.file_size:,} "
                f"(more than {_MAX_RATIO}x: not an array vmem wrote)"
            )
    else:
        raise ValueError(f"entry {name!r}: compressed with method {info.compress_type} (vmem stores its arrays)")


def _loadz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of an .npz, each header checked before anything is allocated: a plain dtype (no Python
    objects), and as many bytes as the member holds (a header that claims more is refused, not allocated).
    ValueError (or zipfile's, OSError) naming the entry otherwise."""
    out: dict[str, np.ndarray] = {}
    size = os.path.getsize(path)
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            _check_member(info, name, size)
            with archive.open(info) as member:
                try:
                    version = np.lib.format.read_magic(member)
                    if version == (1, 0):
                        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member, max_header_size=_MAX_HEADER)
                    elif version in ((2, 0), (3, 0)):
                        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member, max_header_size=_MAX_HEADER)
                    else:
                        raise ValueError(f"npy format {version}")
                except ValueError as exc:
                    raise ValueError(f"entry {name!r}: not an array ({exc})") from None
                if dtype.hasobject or dtype.kind not in "biufU":
                    raise ValueError(f"entry {name!r}: dtype {dtype}, not numbers or text")
                count = int(np.prod(shape, dtype=object))
                nbytes = count * dtype.itemsize
                held = info.file_size - member.tell()
                if nbytes != held:
                    raise ValueError(f"entry {name!r}: its header says {nbytes} bytes of data, the file holds {held}")
                data = member.read(nbytes)
                if len(data) != nbytes:
                    raise ValueError(f"entry {name!r}: cut short")
                a = np.frombuffer(data, dtype=dtype, count=count)
                out[name] = a.reshape(shape, order="F" if fortran else "C").copy()
    return out


def replace(
    real: Path,
    path: str | os.PathLike,
    fill: Callable[[BinaryIO], None],
    error: type = CheckpointError,
    what: str = "checkpoint",
) -> None:
    """Write ``real`` (a :func:`target`) by ``fill(file)`` so that nothing is lost whatever happens: into a
    temporary of its own next to it (with the umask's permissions), flushed to the disk, moved over it in
    one step, the folder synced. A failure (a full disk) removes the temporary, leaves the old file as it
    was and raises ``error`` in one line naming ``path``; temporaries a killed save left are swept first."""
    _sweep(real)
    tmp = real.parent / f".{real.name}.{os.getpid()}.{secrets.token_hex(4)}{_TMP}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask decides, as for any file
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise error(f"{path}: could not save ({exc.strerror or exc}); the last {what} there is unchanged") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(real.parent)


class SaveLock:
    """An advisory lock on a checkpoint path for a whole run (``fcntl.flock`` on ``.<name>.vmem-lock`` next
    to the file), so that two runs cannot save to one path: the second is refused at its start, naming the
    first's process id. Released (and the lock file removed) by :meth:`release` or at exit."""

    def __init__(self, path: str | os.PathLike):
        real = target(path)
        self.path = real.parent / f".{real.name}.vmem-lock"
        self._fd: int | None = None
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX: no advisory locks
            return
        # never through a link planted at the lock's name (it would truncate the file it names), nor a FIFO
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            kind = "a symbolic link" if self.path.is_symlink() else f"not openable ({exc.strerror})"
            raise CheckpointError(
                f"{path}: the save lock {self.path} is {kind}; vmem keeps it as a regular file (remove it)"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise CheckpointError(f"{path}: the save lock {self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise CheckpointError(
                f"{path}: another run (process {holder}) is saving to it; give each run its own --save path"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        import fcntl

        self.path.unlink(missing_ok=True)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "SaveLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _load(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    _check_readable(path)
    try:
        data = _loadz(path)
    except zipfile.BadZipFile:
        raise CheckpointError(f"{path}: not a vmem checkpoint (not an .npz archive)") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.LargeZipFile, NotImplementedError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise CheckpointError(f"{path}: cannot read the checkpoint ({why})") from None
    try:
        meta = json.loads(str(data.pop("meta")))
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a vmem checkpoint (no readable metadata)") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{path}: not a vmem checkpoint of version {VERSION}")
    return data, meta


def _check_readable(path: str | os.PathLike) -> None:
    """A checkpoint to read exists and is a regular, readable file (a FIFO is never opened)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CheckpointError(f"{path}: cannot read the checkpoint (no such file)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None
    if not stat.S_ISREG(mode):
        raise CheckpointError(f"{path}: cannot read the checkpoint (not a regular file: a checkpoint is an .npz file)")
    if not os.access(path, os.R_OK):
        raise CheckpointError(f"{path}: cannot read the checkpoint (permission denied)")


def check(path: str | os.PathLike, network: str) -> dict[str, Any]:
    """The metadata of the checkpoint at ``path`` (its settings under ``"settings"``), checked to be a
    readable vmem checkpoint of ``network``: what ``vmem train --resume`` checks before any work."""
    _, meta = _load(path)
    if meta.get("network") != network:
        raise CheckpointError(f"{path}: the checkpoint is of network {meta.get('network')!r}, not {network!r}")
    return meta


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


def read(path: str | os.PathLike, network: str, optimizer: Optimizer, specs: dict[str, Any]) -> SavedState:
    """Read ``path`` and check every entry against the network's name and parameter ``specs`` and the
    optimizer: keys, shapes, dtypes, finiteness, the step count, the random state. Raises CheckpointError
    naming the file and the entry; the parameters' names and shapes are checked again by the network."""
    data, meta = _load(path)
    if meta.get("network") != network:
        raise CheckpointError(f"{path}: the checkpoint is of network {meta.get('network')!r}, not {network!r}")
    opt = meta.get("optimizer", {})
    if opt.get("type") != type(optimizer).__name__:
        raise CheckpointError(
            f"{path}: the checkpoint's optimizer is {opt.get('type')!r}, this trainer's is {type(optimizer).__name__!r}"
        )
    params = {k[len("param/") :]: v for k, v in data.items() if k.startswith("param/")}
    opt_state = {k[len("opt/") :]: v for k, v in data.items() if k.startswith("opt/")}
    expected_opt = {f"{k}:{slot}": s.shape for k, s in specs.items() if s.trainable for slot in optimizer.slots}
    if set(opt_state) != set(expected_opt):
        raise CheckpointError(
            f"{path}: optimizer state does not match ({len(opt_state)} arrays, expected {len(expected_opt)})"
        )
    for key, shape in expected_opt.items():
        if opt_state[key].shape != tuple(shape):
            raise CheckpointError(
                f"{path}: optimizer state {key} has shape {opt_state[key].shape}, expected {tuple(shape)}"
            )
    _check_arrays(path, "param", params)
    _check_arrays(path, "opt", opt_state)
    steps = _steps(path, meta)
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = meta["rng"]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: entry 'meta.rng' (the random state) is unreadable") from exc
    position = []
    for name in ("epochs_done", "epoch_step"):
        value = meta.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{path}: entry 'meta.{name}' is {value!r}, expected a count")
        position.append(value)
    epoch_rng = meta.get("epoch_rng")
    if epoch_rng is not None:
        try:
            np.random.default_rng().bit_generator.state = epoch_rng
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: entry 'meta.epoch_rng' (the epoch's random state) is unreadable") from exc
    if position[1] and epoch_rng is None:
        raise CheckpointError(
            f"{path}: entry 'meta.epoch_step' is {position[1]} but the epoch's random state is missing"
        )
    precision = meta.get("precision", "fp32")
    if precision not in ("fp32", "fp16", "bf16"):
        raise CheckpointError(f"{path}: entry 'meta.precision' is {precision!r}, expected fp32, fp16 or bf16")
    scaler = meta.get("scaler")
    if scaler is not None:
        fields = scaler if isinstance(scaler, dict) else {}
        scale, tracker = fields.get("scale"), fields.get("growth_tracker")
        scale_ok = isinstance(scale, (int, float)) and type(scale) is not bool and np.isfinite(scale) and scale > 0
        if not scale_ok or not isinstance(tracker, int) or type(tracker) is bool or tracker < 0:
            raise CheckpointError(
                f"{path}: entry 'meta.scaler' is {scaler!r}, expected the loss scaler's scale and growth_tracker"
            )
    return SavedState(params, opt_state, steps, rng, position[0], position[1], epoch_rng, precision, scaler)


def settings(meta: dict[str, Any]) -> dict[str, Any]:
    """The run settings a checkpoint's metadata keeps: names to numbers, text or None (anything else in
    that entry is left out)."""
    kept = meta.get("settings")
    if not isinstance(kept, dict):
        return {}
    plain = (str, int, float, bool, type(None))
    return {k: v for k, v in kept.items() if isinstance(k, str) and isinstance(v, plain)}
