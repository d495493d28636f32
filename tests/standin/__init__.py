"""A stand-in for CuPy on the CPU (tests only): :func:`install` makes ``import cupy`` find it, and cuDNN's
library the stand-in's (``cudnn.py``: vmem's own declarations over functions that compute with the CPU
device's convolutions); see ``cupy/__init__.py`` for the contracts it keeps."""

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

    from vmem.device.cuda import cudnn

    from . import cudnn as standin_cudnn

    library = standin_cudnn.Lib()
    monkeypatch.setattr(cudnn, "_load", lambda: (library.ffi, library))
    cupy._saved_modules = saved
    cupy._cudnn = library
    return cupy


def uninstall(cupy) -> None:
    saved = getattr(cupy, "_saved_modules", {})
    _drop()
    sys.modules.update(saved)
    _clear_caches()
