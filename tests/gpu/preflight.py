"""The GPU run's preflight: is everything there, and how long do the first calls take?

Prints one line per item and writes them as JSON (``--json-out``): the driver and GPU, the versions of
CuPy, cuDNN, cffi, NVML's bindings and PyTorch, one NVML reading (timed: the step no longer waits for
it, but the timeline's samples do), the encoding kernels' first NVRTC compile and load (timed), one cuDNN
handle, and ``vmem check``. Without a GPU every GPU item says why it was skipped, and it exits 0: that
is the dry run ``tests/test_gpu_commands.py`` times.

    python tests/gpu/preflight.py [--json-out PATH]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _item(name: str, fn: Callable[[], Any], rows: list[dict[str, Any]], needs_gpu: str | None = None) -> None:
    t0 = time.perf_counter()
    if needs_gpu:
        rows.append({"item": name, "status": "skipped", "detail": needs_gpu, "seconds": 0.0})
    else:
        try:
            rows.append({"item": name, "status": "ok", "detail": fn(), "seconds": time.perf_counter() - t0})
        except Exception as exc:  # noqa: BLE001 - each item reports its own failure
            rows.append(
                {
                    "item": name,
                    "status": "failed",
                    "detail": f"{type(exc).__name__}: {exc}",
                    "seconds": time.perf_counter() - t0,
                }
            )
    r = rows[-1]
    print(f"{r['item']:<22} {r['status']:<8} {r['seconds']:7.3f} s  {r['detail']}", flush=True)


def _version(module: str) -> str:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001
        return f"not importable ({type(exc).__name__}: {exc})"
    return str(getattr(mod, "__version__", "?"))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--json-out", help="write the items as JSON here")
    args = parser.parse_args()
    from vmem.device.cuda import unavailable

    no_gpu = unavailable()
    rows: list[dict[str, Any]] = []
    _item(
        "versions",
        lambda: {m: _version(m) for m in ("numpy", "cupy", "cffi", "pycparser", "ml_dtypes", "pynvml", "torch")},
        rows,
    )

    def driver() -> str:
        import cupy

        from vmem.device.cuda.kernels import arch_of

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        return (
            f"{name}, {arch_of(cupy.cuda.Device(0).compute_capability)}, driver "
            f"{cupy.cuda.runtime.driverGetVersion()}, runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
            f"{cupy.cuda.runtime.getDeviceCount()} GPU(s)"
        )

    _item("driver and GPU", driver, rows, no_gpu)

    def cudnn() -> str:
        from vmem.device.cuda import cudnn as c

        return f"cuDNN {c.version()} from {c._library_path()}"

    _item("cuDNN", cudnn, rows, no_gpu)

    def nvml_reading() -> dict[str, Any]:
        from vmem.device.cuda import nvml

        nvml.reading(0)  # NVML's initialization, once
        t0 = time.perf_counter()
        reading = nvml.reading(0)
        return {"seconds_per_reading": time.perf_counter() - t0, **reading}

    _item("NVML reading", nvml_reading, rows, no_gpu)

    def kernels() -> str:
        import cupy

        from vmem.device.cuda.kernels import arch_of, compile_cubin

        arch = arch_of(cupy.cuda.Device(0).compute_capability)
        t0 = time.perf_counter()
        cubin = compile_cubin(arch)
        compiled = time.perf_counter() - t0
        module = cupy.cuda.function.Module()
        module.load(cubin)
        return f"{len(cubin):,}-byte cubin for {arch}: compiled in {compiled:.2f} s, then loaded"

    _item("kernels compile", kernels, rows, no_gpu)

    def handle() -> str:
        import vmem

        with vmem.device("cuda:0", memory="64MiB") as dev:
            dev.conv_backend._handle()
            return repr(dev)

    _item("device and cuDNN", handle, rows, no_gpu)

    def check() -> str:
        from vmem import selfcheck

        failed = [f"{c.name}: {c.detail}" for c in selfcheck.run_checks(require_native=True) if c.failed]
        if failed:
            raise RuntimeError("; ".join(failed))
        return "ok"

    _item("vmem check", check, rows)
    if args.json_out:
        record = {
            "gpu": no_gpu is None,
            "items": rows,
            "verdicts": [],  # no targets: what the machine is (bench/results.py lists only verdicts)
            "machine": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
            "date": time.strftime("%Y-%m-%d"),
            "command": "python tests/gpu/preflight.py",
        }
        Path(args.json_out).write_text(json.dumps(record, indent=2, default=str))
    return 1 if any(r["status"] == "failed" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
