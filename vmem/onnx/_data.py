"""Reading an ONNX model and its tensors as untrusted input.

- A model given as a path is read from that regular file; its external data (tensors whose values live in
  other files, ``location=`` relative to the model) only from its own folder. A model given as bytes or an
  ``onnx.ModelProto`` has no folder: it reads no file unless the caller names one (``base_dir=``).
- An external file's path is resolved (links followed) and must stay inside that folder and be a regular
  file (no FIFO, device or link leading out); its offset and length must lie within it; the bytes read are
  exactly what the tensor's shape and type need.
- Every tensor's stored values are checked against its shape before they are used, so that a short or
  foreign tensor is refused naming the model and the tensor, not by numpy's reshape.

Every failure is an :class:`~vmem.errors.OnnxError` naming the model (its path, ``<bytes>`` or
``<ModelProto 'name'>``), the tensor and what was expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType

import os
import stat
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import OnnxError

__all__ = ["read", "arrays", "array"]

#: The largest model file read whole (protobuf itself stops at 2 GiB; larger models keep external data).
MAX_MODEL_BYTES = 2 << 30


def read(onnx: ModuleType, model: Any, base_dir: str | os.PathLike | None = None) -> tuple[Any, str]:
    """(the ModelProto with every tensor's values in it, the name errors give the model). ``base_dir``:
    the folder external data may be read from (a path model's own folder where None; for bytes and a
    ModelProto, no folder: external data is refused)."""
    folder: Path | None = None if base_dir is None else Path(os.fspath(base_dir))
    if isinstance(model, onnx.ModelProto):
        source = f"<ModelProto {model.graph.name!r}>" if model.graph.name else "<ModelProto>"
        proto = onnx.ModelProto()
        proto.CopyFrom(model)  # the caller's model is left as it was
    elif isinstance(model, (bytes, bytearray, memoryview)):
        source = "<bytes>"
        proto = _parse(onnx, bytes(model), source)
    else:
        path = Path(os.fspath(model))
        source = str(path)
        proto = _parse(onnx, _read_model_file(path), source)
        folder = path.parent if folder is None else folder
    if folder is not None and not folder.is_dir():
        raise OnnxError(f"{source}: base_dir {str(folder)!r} is not a folder")
    for tensor in _tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            _load_external(onnx, tensor, folder, source)
    for node in proto.graph.node:  # constants held in nodes, checked as initializers are (by arrays())
        for attr in node.attribute:
            for tensor in ([attr.t] if attr.HasField("t") else []) + list(attr.tensors):
                array(onnx, tensor, source, f"the {attr.name!r} of node {node.name or node.op_type!r}:")
    return proto, source


def _read_model_file(path: Path) -> bytes:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such ONNX file") from None
    except OSError as exc:
        raise OnnxError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise OnnxError(f"{path}: not a regular file (an ONNX model is a .onnx file)")
    if info.st_size == 0:
        raise OnnxError(f"{path}: not a readable ONNX model (the file is empty)")
    if info.st_size > MAX_MODEL_BYTES:
        raise OnnxError(
            f"{path}: {info.st_size} bytes, more than a model file holds; keep its weights as external data"
        )
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OnnxError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _parse(onnx: ModuleType, data: bytes, source: str) -> Any:
    if not data:
        raise OnnxError(f"{source}: not a readable ONNX model (no bytes)")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and kin: a foreign or truncated file
        raise OnnxError(f"{source}: not a readable ONNX model (it does not parse: {exc})") from None
    if not proto.HasField("graph"):
        raise OnnxError(f"{source}: not a readable ONNX model (it holds no graph)")
    return proto


def _tensors(proto: Any) -> Iterator[Any]:
    """Every tensor the model stores: initializers, and the values of Constant-like nodes' attributes."""
    yield from proto.graph.initializer
    for node in proto.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors


def _load_external(onnx: ModuleType, tensor: Any, folder: Path | None, source: str) -> None:
    """Read ``tensor``'s external values into it, from ``folder`` only (see the module docstring)."""
    entries = {e.key: e.value for e in tensor.external_data}
    where = f"{source}: initializer {tensor.name!r}"
    location = entries.get("location", "")
    if folder is None:
        raise OnnxError(
            f"{where} keeps its values in an external file ({location!r}); a model given as bytes or a "
            "ModelProto reads no file: pass base_dir= naming the folder that holds it"
        )
    if not location or os.path.isabs(location):
        raise OnnxError(f"{where}: its external file {location!r} is not a path relative to the model's folder")
    root = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, real]) != root:
        raise OnnxError(f"{where}: its external file {location!r} lies outside the model's folder {root}")
    try:
        offset = int(entries.get("offset", 0) or 0)
        length = None if entries.get("length") in (None, "") else int(entries["length"])
    except ValueError:
        raise OnnxError(f"{where}: its external offset or length is not a number") from None
    need = _nbytes(onnx, tensor, where)
    if offset < 0 or (length is not None and length != need):
        raise OnnxError(
            f"{where}: its external data is {length} bytes at offset {offset}; its shape "
            f"{list(tensor.dims)} needs {need}"
        )
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise OnnxError(f"{where}: cannot read its external file {location!r} ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OnnxError(f"{where}: its external file {location!r} is not a regular file")
        if offset + need > info.st_size:
            raise OnnxError(
                f"{where}: its external file {location!r} holds {info.st_size} bytes; the tensor needs {need} "
                f"at offset {offset}"
            )
        data = os.pread(fd, need, offset) if need else b""
    finally:
        os.close(fd)
    if len(data) != need:
        raise OnnxError(f"{where}: its external file {location!r} was cut short")
    tensor.raw_data = data
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


def _nbytes(onnx: ModuleType, tensor: Any, where: str) -> int:
    """The bytes ``tensor``'s shape and type take as raw data."""
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except Exception:  # noqa: BLE001 - an unknown or undefined data type
        raise OnnxError(f"{where}: data type {tensor.data_type} is not one vmem reads") from None
    if dtype.hasobject:
        raise OnnxError(f"{where}: holds strings, not numbers")
    if any(d < 0 for d in tensor.dims):
        raise OnnxError(f"{where}: shape {list(tensor.dims)} has a negative dimension")
    count = _count(tensor)
    packed = {getattr(onnx.TensorProto, n, None) for n in ("INT4", "UINT4", "FLOAT4E2M1")} - {None}
    if tensor.data_type in packed:  # two values a byte
        return (count + 1) // 2
    return count * dtype.itemsize


def _count(tensor: Any) -> int:
    return int(np.prod(list(tensor.dims), dtype=object)) if tensor.dims else 1


#: the typed fields a tensor may keep its values in instead of raw_data
_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def array(onnx: ModuleType, tensor: Any, source: str, what: str = "initializer") -> np.ndarray:
    """``tensor``'s values as an array, its stored values checked against its shape first."""
    where = f"{source}: {what} {tensor.name!r}" if tensor.name else f"{source}: {what.rstrip(':')}"
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        raise OnnxError(f"{where}: its values are in an external file that was not read")
    if tensor.HasField("raw_data"):
        need = _nbytes(onnx, tensor, where)
        if len(tensor.raw_data) != need:
            raise OnnxError(
                f"{where}: holds {len(tensor.raw_data)} bytes; its shape {list(tensor.dims)} and type need {need}"
            )
    else:
        _nbytes(onnx, tensor, where)  # the type is one vmem reads
        count = _count(tensor)
        held = max(len(getattr(tensor, f)) for f in _FIELDS)
        if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            held //= 2  # a real and an imaginary part a value
        if held != count:
            raise OnnxError(f"{where}: holds {held} values; its shape {list(tensor.dims)} needs {count}")
    try:
        return onnx.numpy_helper.to_array(tensor)
    except Exception as exc:  # noqa: BLE001 - whatever onnx's reader says, named here
        raise OnnxError(f"{where}: cannot be read ({exc})") from None


def arrays(onnx: ModuleType, proto: Any, source: str) -> dict[str, np.ndarray]:
    """The model's initializers by name, each checked (see :func:`array`)."""
    return {t.name: array(onnx, t, source) for t in proto.graph.initializer}
