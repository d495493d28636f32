"""Tests in tests/gpu/ need a CUDA GPU and CuPy; they are skipped everywhere else.

Run them, with the GPU benchmarks, by the commands in tests/gpu/README.md (``bash tests/gpu/run.sh STAGE...``)."""

from __future__ import annotations

import pytest


def _has_gpu() -> bool:
    try:
        from vmem.device.cuda import unavailable

        return unavailable() is None
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy (pip install -e '.[cuda]')")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)


@pytest.fixture
def cuda():
    """A CUDA device with a 512 MiB arena, closed after the test."""
    import vmem

    dev = vmem.device("cuda:0", math="exact", memory="512MiB", pinned_memory="256MiB")
    yield dev
    dev.close()
