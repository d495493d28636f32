"""The encoding kernels of vmem/csrc/kernels.cuh built for the GPU: raw NVRTC to a cubin, loaded as a module.

CuPy's RawModule appends ``-ftz=true`` after the caller's options and turns ``__fmul_rn``/``__fadd_rn`` into
flush-to-zero instructions, so subnormal values would differ from the CPU build (docs/gpu.md). vmem
therefore compiles with NVRTC itself, with :data:`OPTIONS` (no flush to zero, IEEE division and square
root, no contraction into fused multiply-adds) for the exact architecture of the device (a cubin: a PTX
of a newer NVRTC may not load on an older driver), and loads the cubin. :func:`compile_cubin` needs no
GPU, so the options the device uses are checked on any machine with the NVRTC wheel.

A cubin is kept in ``<cache>/kernels`` (:func:`vmem._files.cache_root`), named by the hash of the source,
the options, the architecture and NVRTC's version, so that a process loads what an earlier one compiled
instead of compiling again (seconds a process); ``VMEM_KERNEL_CACHE=0`` turns it off. A kept file that does
not load is compiled again and replaced.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ..._files import cache_root, read_regular, write_output
from ..._resources import CSRC, source_file
from ...codecs.native import Backend
from ...errors import DeviceError

if TYPE_CHECKING:
    from ..._typing import GpuArray
    from ...streams.base import Stream

__all__ = [
    "OPTIONS",
    "SOURCE",
    "arch_of",
    "compile_cubin",
    "cubin_path",
    "Module",
    "GpuBackend",
    "backend_for_device",
    "backend_of",
]

SOURCE = CSRC / "kernels.cuh"
#: NVRTC options of every build; ``-arch=sm_XY`` is added for the device.
OPTIONS = ("-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=false")


def compile_cubin(arch: str, source: str | None = None) -> bytes:
    """Compile the kernels for ``arch`` (``"sm_90"``) with :data:`OPTIONS`; raises DeviceError with NVRTC's
    log if they do not compile."""
    try:
        from cupy.cuda import nvrtc
    except ImportError as exc:
        raise DeviceError("compiling the GPU kernels needs CuPy's NVRTC: pip install 'vmem[cuda]'") from exc
    src = source_file(SOURCE.name).read_text() if source is None else source
    options = OPTIONS + (f"-arch={arch}",)
    prog = nvrtc.createProgram(src, "kernels.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as exc:
            raise DeviceError(
                f"NVRTC could not compile {SOURCE.name} for {arch}: {exc}\n{nvrtc.getProgramLog(prog)}"
            ) from exc
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


_CUBIN_LIMIT = 64 << 20  # a kept cubin longer than this is not one vmem wrote


def cubin_path(arch: str, source: str) -> Path:
    """Where the cubin of ``source`` for ``arch`` is kept (see the module docstring)."""
    try:
        from cupy.cuda import nvrtc

        version = ".".join(str(v) for v in nvrtc.getVersion())
    except Exception:  # noqa: BLE001 - an NVRTC without getVersion: its version stays out of the name
        version = "?"
    what = "\0".join((source, " ".join(OPTIONS), arch, version))
    return cache_root() / "kernels" / f"kernels-{arch}-{hashlib.sha256(what.encode()).hexdigest()[:32]}.cubin"


def _caching() -> bool:
    return os.environ.get("VMEM_KERNEL_CACHE", "1").strip().lower() not in ("0", "no", "off", "false")


@lru_cache(maxsize=4)
def _module(arch: str) -> Any:
    import cupy

    module = cupy.cuda.function.Module()
    if not _caching():
        module.load(compile_cubin(arch))
        return module
    source = source_file(SOURCE.name).read_text()
    path = cubin_path(arch, source)
    kept = read_regular(path, _CUBIN_LIMIT)
    if kept is not None:
        try:
            module.load(kept)
            return module
        except Exception:  # noqa: BLE001 - a damaged file: compiled again below, and replaced
            module = cupy.cuda.function.Module()
    cubin = compile_cubin(arch, source)
    module.load(cubin)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output(path, lambda f: f.write(cubin), "a compiled kernel", binary=True)
    except (OSError, ValueError):
        pass  # a cache that cannot be written is no cache: the next process compiles again
    return module


class Module:
    """The kernels on one GPU: ``module.launch(name, threads, *args, stream=s)`` runs kernel ``name`` with
    one GPU thread per thread of its grid (the same grid the CPU launcher splits over cores)."""

    BLOCK = 256

    def __init__(self, arch: str):
        self.arch = arch
        self._module = _module(arch)
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._module.get_function(name)
        return fn

    def launch(self, name: str, threads: int, *args: Any, stream: Stream | None = None) -> None:
        if threads <= 0:
            return
        blocks = -(-threads // self.BLOCK)
        self.function(name)((blocks,), (self.BLOCK,), args, stream=stream)


class GpuBackend(Backend):
    """The kernels on one GPU behind :class:`vmem.codecs.native.Backend`: CuPy arrays, launches on the
    current stream (the stream whose work is running: the memory stream for offload codecs, the compute
    stream for encodings kept on the device), scans with ``cupy.cumsum``. A 2-D grid of ``threads`` rows of
    ``cols`` is one flat grid of ``threads * cols`` GPU threads (the kernels divide their index)."""

    name = "gpu"
    split_full = False  # one kernel per word: the GPU has no masked-vector cost to avoid
    wide_loads = True  # ReLU four values a thread: one 16-byte (8-byte for half) load each

    def __init__(self, module: Module):
        import cupy

        self.xp = cupy
        self.module = module

    def launch(self, kernel: str, threads: int, *args: Any, first: int = 0, cols: int = 1) -> None:
        if first:
            raise ValueError(f"{kernel}: a GPU grid starts at thread 0 (first={first})")
        self.module.launch(kernel, threads * cols, *args, stream=self.xp.cuda.get_current_stream())


@lru_cache(maxsize=8)
def backend_for_device(device_id: int) -> GpuBackend:
    """The backend of GPU ``device_id`` (its kernels built for its architecture on first use)."""
    import cupy

    return GpuBackend(Module(arch_of(cupy.cuda.Device(device_id).compute_capability)))


def arch_of(capability: Any) -> str:
    """``sm_XY`` of a compute capability as CuPy gives it (the string ``"90"``, ``"120"`` for 12.0) or as
    a (major, minor) pair."""
    if isinstance(capability, (tuple, list)):
        major, minor = (int(v) for v in capability)
        return f"sm_{major}{minor}"
    text = str(capability).strip()
    if not text.isdigit() or len(text) < 2:
        raise DeviceError(f"unexpected compute capability {capability!r}")
    return f"sm_{int(text)}"


def backend_of(x: GpuArray) -> GpuBackend:
    """The backend of the GPU a CuPy array lives on (what the CUDA device registers with the codecs)."""
    return backend_for_device(int(x.device.id))
