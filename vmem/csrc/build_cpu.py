"""cffi builder for the CPU build of vmem/csrc/kernels.cuh and vmem/csrc/winograd.c (module ``vmem._native``).

The launchers' C declarations are read from cpu_launch.c's LAUNCHER* lines, so they are declared once;
winograd.c's (CPU only: the CUDA device convolves through cuDNN) are in winograd.h.
"""

import re
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent


def declarations() -> str:
    src = (HERE / "cpu_launch.c").read_text()
    out = []
    for m in re.finditer(r"^LAUNCHER\w*\((\w+),.*?\bP\((.*?)\)", src, re.S | re.M):
        params = re.sub(r"\brestrict\s+", "", " ".join(m.group(2).split()))
        out.append(f"void vmem_{m.group(1)}(int64_t t0, int64_t t1, {params});")
    return "\n".join(out)


ffibuilder = FFI()
ffibuilder.cdef(declarations() + "\n" + (HERE / "winograd.h").read_text())
ffibuilder.set_source(
    "vmem._native",
    '#include "cpu_launch.c"\n#include "winograd.c"',
    include_dirs=[str(HERE)],
    extra_compile_args=["-O3", "-std=c99", "-fno-math-errno", "-fno-wrapv", "-ffp-contract=off", "-fsignaling-nans"],
    depends=[str(HERE / n) for n in ("shim.h", "kernels.cuh", "cpu_launch.c", "winograd.c", "winograd.h")],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(HERE.parents[1] / "build" / "native"), verbose=True)
