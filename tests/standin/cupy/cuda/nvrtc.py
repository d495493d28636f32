"""``cupy.cuda.nvrtc`` on the stand-in: a "cubin" that names the source it was built from and its options
(the kernels then run as their CPU build of the same source)."""

from __future__ import annotations

import hashlib


class NVRTCError(RuntimeError):
    pass


class _Program:
    def __init__(self, src: str, name: str):
        self.src, self.name, self.options = src, name, ()


def createProgram(src: str, name: str, headers: list, include_names: list) -> _Program:
    if not isinstance(src, str):
        raise TypeError("createProgram takes the source as str")
    return _Program(src, name)


COMPILED: list = []  # the options of each compilation, in order


def getVersion() -> tuple[int, int]:
    return (13, 0)


def compileProgram(prog: _Program, options: tuple) -> None:
    COMPILED.append(tuple(options))
    if not any(str(o).startswith("-arch=sm_") for o in options):
        raise NVRTCError("NVRTC_ERROR_INVALID_OPTION: no -arch=sm_XY (a cubin needs one)")
    prog.options = tuple(options)


def getCUBIN(prog: _Program) -> bytes:
    digest = hashlib.sha256(prog.src.encode()).hexdigest()
    return f"standin-cubin {digest} {' '.join(prog.options)}".encode()


def getProgramLog(prog: _Program) -> str:
    return ""


def destroyProgram(prog: _Program) -> None:
    pass
