"""Shared fixtures: every test must leave no stream thread behind."""

from __future__ import annotations

import gc
import threading

import pytest

from vmem.streams import THREAD_PREFIX


def stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


@pytest.fixture(autouse=True, scope="session")
def profile_cache_of_this_session(tmp_path_factory):
    """Profiles are kept in a folder of this test session's (never the user's cache); every subprocess a
    test starts inherits it."""
    import os

    before = os.environ.get("VMEM_CACHE_DIR")
    os.environ["VMEM_CACHE_DIR"] = str(tmp_path_factory.mktemp("vmem-cache"))
    yield
    if before is None:
        os.environ.pop("VMEM_CACHE_DIR", None)
    else:
        os.environ["VMEM_CACHE_DIR"] = before


@pytest.fixture(autouse=True, scope="session")
def pinned_core_budget():
    """Tests compare runs bit for bit, so every run uses the same BLAS thread count whatever the machine's
    load (vmem.threads.BUDGET would otherwise follow it; tests/test_threads.py tests that on its own
    budgets)."""
    from vmem import threads

    before = threads.BUDGET.fixed
    threads.BUDGET.fix(before or threads.BUDGET.cores)  # VMEM_THREADS, where set, or every core
    yield
    threads.BUDGET.fix(before)


@pytest.fixture(autouse=True)
def no_leaked_stream_threads():
    before = set(stream_threads())
    yield
    if not [t for t in stream_threads() if t not in before]:
        return  # the usual case, at no cost (a collection of the whole heap takes tens of milliseconds)
    gc.collect()  # streams that were dropped without close() stop through their finalizer
    leaked = [t for t in stream_threads() if t not in before]
    for t in leaked:
        t.join(timeout=5)
    leaked = [t.name for t in leaked if t.is_alive()]
    assert not leaked, f"stream threads left running: {leaked}"


@pytest.fixture
def cpu():
    """A small CPU device, closed after the test."""
    import vmem

    dev = vmem.device("cpu", memory="64MiB", pinned_memory="64MiB")
    yield dev
    dev.close()
