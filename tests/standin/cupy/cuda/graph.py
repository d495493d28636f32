"""``cupy.cuda.graph`` on the stand-in: the graph a stream capture returns (see :mod:`.stream`)."""

from __future__ import annotations

from .stream import Graph

__all__ = ["Graph"]
