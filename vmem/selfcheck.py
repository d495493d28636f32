"""``vmem check``: is this installation whole? Runs anywhere, GPU or not, from a wheel or a checkout.

It imports every module of the package (none may import CuPy, cuDNN or NVML at import time), finds the
files the package reads at run time (:mod:`vmem._resources`), parses the cuDNN declarations with cffi (no
GPU or cuDNN needed), says whether the CPU build of the kernels (``vmem._native``) loaded, and compiles
the kernels' CUDA source where a compiler is present: NVRTC through CuPy, else ``nvcc``. Each check is one
line; the exit status is 1 if any required check failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import pkgutil
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["Check", "run_checks", "main", "RUNTIME_FILES"]

#: Files the installed package reads at run time (in vmem/csrc).
RUNTIME_FILES = ("cudnn.h", "kernels.cuh")
#: The GPU architecture the kernels' source is compiled for where a compiler is present.
ARCH = "sm_80"


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``status`` is ``ok``, ``failed`` or ``skipped`` (with why)."""

    name: str
    status: str
    detail: str
    seconds: float

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _modules() -> str:
    import vmem

    names = ["vmem"]
    for info in pkgutil.walk_packages(vmem.__path__, "vmem."):
        if not info.name.endswith(".__main__"):  # `python -m vmem`: it runs the command line
            names.append(info.name)
    heavy = {"cupy", "pynvml", "cupy_backends"}
    before = set(sys.modules)
    for name in names:
        importlib.import_module(name)
    loaded = sorted(heavy & {m.split(".")[0] for m in set(sys.modules) - before})
    if loaded:
        raise RuntimeError(f"importing vmem's modules imported {', '.join(loaded)}: only a CUDA device may")
    return f"{len(names)} modules from {Path(vmem.__file__).parent}"


def _files() -> str:
    from ._resources import source_file

    sizes = [f"{name} ({source_file(name).stat().st_size:,} bytes)" for name in RUNTIME_FILES]
    return ", ".join(sizes)


def _cudnn_declarations() -> str:
    import cffi

    from ._resources import source_file

    ffi = cffi.FFI()
    ffi.cdef(source_file("cudnn.h").read_text())
    ffi.new("cudnnConvolutionFwdAlgoPerf_t[8]")  # the declared structs have a size
    return "cffi parsed cudnn.h"


def _native() -> str:
    from .codecs import native

    if native.lib is None:
        raise RuntimeError("vmem._native is not built (no C compiler at install?): codecs and Winograd use NumPy")
    spec = importlib.util.find_spec("vmem._native")
    return f"vmem._native from {spec.origin if spec else '?'}"


def _kernels_compile() -> str | None:
    """Compile kernels.cuh for :data:`ARCH` by NVRTC (CuPy's) or nvcc; None when neither is here."""
    from ._resources import source_file

    try:
        from cupy.cuda import nvrtc  # noqa: F401
    except Exception:  # noqa: BLE001 - no CuPy here: try nvcc
        nvrtc = None
    if nvrtc is not None:
        from .device.cuda.kernels import compile_cubin

        return f"NVRTC: {len(compile_cubin(ARCH)):,}-byte cubin for {ARCH}"
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.cubin"
        src.write_text(source_file("kernels.cuh").read_text())
        done = subprocess.run(
            [nvcc, "-cubin", f"-arch={ARCH}", "-o", str(out), str(src)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            raise RuntimeError(f"nvcc could not compile kernels.cuh: {done.stderr.strip()[-2000:]}")
        return f"nvcc: {out.stat().st_size:,}-byte cubin for {ARCH}"


def _run(name: str, fn: Callable[[], str | None], required: bool) -> Check:
    t0 = time.perf_counter()
    try:
        detail = fn()
        status = "ok" if detail is not None else "skipped"
        detail = detail if detail is not None else "neither NVRTC (CuPy) nor nvcc is installed"
    except Exception as exc:  # noqa: BLE001 - each check reports its own failure
        status, detail = ("failed" if required else "skipped"), f"{type(exc).__name__}: {exc}"
    return Check(name, status, detail, time.perf_counter() - t0)


def run_checks(require_native: bool = False, compile_kernels: bool = True) -> list[Check]:
    """Every check, in order (see the module docstring)."""
    checks = [
        _run("imports", _modules, True),
        _run("package files", _files, True),
        _run("cudnn declarations", _cudnn_declarations, True),
        _run("native CPU kernels", _native, require_native),
    ]
    if compile_kernels:
        checks.append(_run("kernels compile", _kernels_compile, True))
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmem check", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--require-native",
        action="store_true",
        help="fail if the CPU build of the kernels did not load (it is optional otherwise)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip compiling the kernels' CUDA source")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    checks = run_checks(args.require_native, not args.no_compile)
    ok = not any(c.failed for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.name:<{width}}  {c.status:<7}  {c.detail} ({c.seconds:.1f} s)")
        print("vmem check: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
