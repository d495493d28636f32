"""A stand-in for CuPy on the CPU (tests only): :func:`install` makes ``import cupy`` find it, with cuDNN's
convolutions replaced by the CPU device's (see ``cupy/__init__.py`` for the contracts it keeps)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _drop() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in ("cupy", "cupyx")]:
        del sys.modules[name]


def _clear_caches() -> None:
    from vmem.codecs import native
    from vmem.device.cuda import kernels

    kernels._module.cache_clear()
    kernels.backend_for_device.cache_clear()
    native._gpu = None


def install(monkeypatch):
    """Put the stand-in where ``import cupy`` looks (undone by ``monkeypatch`` and :func:`uninstall`);
    returns the stand-in's module."""
    saved = {m: sys.modules[m] for m in list(sys.modules) if m.split(".")[0] in ("cupy", "cupyx")}
    _drop()
    monkeypatch.syspath_prepend(str(HERE))
    _clear_caches()
    import cupy

    from vmem.device.cuda.device import CudaDevice

    from .conv import StandinConv

    monkeypatch.setattr(CudaDevice, "conv_backend", property(lambda self: StandinConv.of(self)))
    cupy._saved_modules = saved
    return cupy


def uninstall(cupy) -> None:
    saved = getattr(cupy, "_saved_modules", {})
    _drop()
    sys.modules.update(saved)
    _clear_caches()
