"""Tests in tests/gpu/ need a CUDA GPU and CuPy; they are skipped everywhere else."""

import pytest


def _has_gpu() -> bool:
    try:
        import cupy
    except Exception:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy (pip install -e '.[cuda]')")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
