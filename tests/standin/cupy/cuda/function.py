"""``cupy.cuda.function`` on the stand-in: a loaded module's kernels run as their CPU build (the same source,
vmem/csrc/kernels.cuh), each argument checked as the driver reads it.

CuPy passes every argument by pointer (``cuLaunchKernel``'s kernelParams) and the driver copies as many
bytes as the kernel's parameter declares: a CuPy array becomes its device pointer, a Python int an int64, a
Python float a double, a NumPy scalar its own bytes. So an integer wider than its parameter passes (its
low bytes are read: the value must fit), a narrower one reads past its end, and a float must be exactly the
parameter's type. The stand-in refuses what would read the wrong bytes on a GPU.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np

from .. import _state


class CUDADriverError(RuntimeError):
    pass


_INT = {
    "int8_t": 1,
    "uint8_t": 1,
    "int16_t": 2,
    "uint16_t": 2,
    "int": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "unsigned int": 4,
    "int64_t": 8,
    "uint64_t": 8,
    "long": 8,
    "long long": 8,
    "size_t": 8,
}
_FLOAT = {"float": np.float32, "double": np.float64}


@lru_cache(maxsize=1)
def _launchers() -> tuple[Any, Any, dict]:
    from vmem._native import ffi, lib  # the CPU build
    from vmem._resources import source_file

    text = source_file("cpu_launch.c").read_text()
    cols: dict[str, tuple[str, list[str]]] = {}
    for m in re.finditer(r"^LAUNCHER2(_WHOLE)?\(\s*(\w+),\s*([^,]+?),", text, re.M):
        whole, name, expr = m.group(1), m.group(2), m.group(3)
        rest = text[m.end() :]
        if whole:  # skip the ``whole`` expression: up to the P( that opens the parameters
            rest = rest[rest.index("P(") :]
        params = rest[rest.index("P(") + 2 :]
        depth, end = 1, 0
        for end, ch in enumerate(params):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        names = [re.findall(r"\w+", p)[-1] for p in params[:end].split(",")]
        cols[name] = (expr.strip(), names)
    return ffi, lib, cols


class Function:
    def __init__(self, name: str):
        ffi, lib, cols = _launchers()
        self.name = name
        self._fn = getattr(lib, f"vmem_{name}", None)
        if self._fn is None:
            raise CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found: {name}")
        self._ffi = ffi
        self._params = [t.cname for t in ffi.typeof(self._fn).args[2:]]
        self._cols = cols.get(name)

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0, stream: Any = None) -> None:
        if not isinstance(grid, tuple) or not isinstance(block, tuple):
            raise TypeError("grid and block must be tuples")
        if not isinstance(args, tuple):
            raise TypeError("args must be a tuple")
        if len(args) != len(self._params):
            raise CUDADriverError(f"{self.name}: {len(args)} arguments for {len(self._params)} parameters")
        threads = int(np.prod(grid)) * int(np.prod(block))
        if int(np.prod(block)) > 1024:
            raise CUDADriverError(f"{self.name}: CUDA_ERROR_INVALID_VALUE: {np.prod(block)} threads a block")
        c_args = [self._arg(i, a) for i, a in enumerate(args)]
        last = threads
        if self._cols is not None:  # a 2-D kernel: its CPU launcher takes rows; the GPU grid is rows x cols
            expr, names = self._cols
            values = dict(zip(names, (int(a) if isinstance(a, (int, np.integer)) else 0 for a in args)))
            cols = int(eval(expr.replace("/", "//"), {}, values))  # noqa: S307 - an expression from cpu_launch.c
            last = -(-threads // max(cols, 1))
        counts = _state.COUNTERS.launches
        counts[self.name] = counts.get(self.name, 0) + 1
        entry = (
            "kernel",
            self.name,
            tuple(int(self._ffi.cast("intptr_t", a)) if isinstance(a, self._ffi.CData) else a for a in c_args),
        )
        fn = self._fn
        if stream is None:
            _state.submit_current(lambda: fn(0, last, *c_args), entry)
        else:
            _state.submit(stream, lambda: fn(0, last, *c_args), entry)

    def _arg(self, i: int, a: Any) -> Any:
        from .. import ndarray

        ctype = self._params[i]
        where = f"{self.name}: argument {i} ({ctype})"
        if ctype.endswith("*"):
            if not isinstance(a, ndarray):
                raise TypeError(f"{where}: a pointer parameter given {type(a).__name__}, not a CuPy array")
            return self._ffi.cast(ctype, a.data.ptr)
        if isinstance(a, ndarray) or isinstance(a, np.ndarray):
            raise TypeError(f"{where}: an array given for a value parameter")
        if isinstance(a, bool):
            a = np.bool_(a)
        elif isinstance(a, int):
            a = np.int64(a)  # as CuPy passes a Python int
        elif isinstance(a, float):
            a = np.float64(a)
        if not isinstance(a, np.generic):
            raise TypeError(f"Unsupported type {type(a)}")
        if ctype in _FLOAT:
            if a.dtype != np.dtype(_FLOAT[ctype]):
                raise TypeError(f"{where}: given {a.dtype}; the driver would read its bytes as {ctype}")
            return float(a)
        size = _INT.get(ctype)
        if size is None:
            raise TypeError(f"{where}: the stand-in does not know parameter type {ctype}")
        if a.dtype.kind not in "iub":
            raise TypeError(f"{where}: given {a.dtype}")
        if a.dtype.itemsize < size:
            raise TypeError(f"{where}: given {a.dtype} ({a.dtype.itemsize} bytes): the driver reads {size}")
        lo, hi = (
            (0, 1 << (8 * size))
            if ctype.startswith("u") or ctype == "size_t"
            else (-(1 << (8 * size - 1)), 1 << (8 * size - 1))
        )
        if not lo <= int(a) < hi:
            raise TypeError(f"{where}: {int(a)} does not fit the parameter's {size} bytes")
        return int(a)


class Module:
    def __init__(self) -> None:
        self._loaded = False

    def load(self, cubin: bytes) -> None:
        if not isinstance(cubin, bytes) or not cubin.startswith(b"standin-cubin"):
            raise CUDADriverError("CUDA_ERROR_INVALID_IMAGE: not a cubin the stand-in built")
        if b"-arch=sm_90" not in cubin:
            raise CUDADriverError("CUDA_ERROR_NO_BINARY_FOR_GPU: the stand-in's device is sm_90")
        self._loaded = True

    def load_file(self, path: str) -> None:
        with open(path, "rb") as f:
            self.load(f.read())

    def get_function(self, name: str) -> Function:
        if not self._loaded:
            raise CUDADriverError("CUDA_ERROR_INVALID_HANDLE: no module loaded")
        return Function(name)
