"""Fixtures of the device tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def cupy(monkeypatch):
    """The stand-in for CuPy (tests/standin) where ``import cupy`` looks, with fresh counters."""
    from ..standin import install, uninstall

    cp = install(monkeypatch)
    cp._state.reset()
    yield cp
    uninstall(cp)
